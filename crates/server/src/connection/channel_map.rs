//! A connection's open channels by number, hashed without SipHash.
//!
//! Every frame of a connection looks its channel up (a publish's three frames and every ack), so
//! the lookup is on the per-message path. SipHash of the number cost about 120 instructions a
//! lookup, 9 % of the broker's instructions per message in the baseline callgrind profile
//! (bench/results/hotpath-budget.md). A connection's channel numbers are bounded by its
//! channel_max (at most 65,535 keys, chosen by its own client, who could only slow itself down),
//! so a multiplicative hash is enough.

use super::channel::Channel;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A connection's channels by number.
pub type ChannelMap = HashMap<u16, Channel, BuildHasherDefault<ChannelNumberHasher>>;

/// 2^64 divided by the golden ratio, odd: multiplying by it mixes the number into the high bits,
/// which the table's probing uses as well as the low ones.
const FIBONACCI_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// Hashes a channel number with one multiplication.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChannelNumberHasher(u64);

impl Hasher for ChannelNumberHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(FIBONACCI_MULTIPLIER);
        }
    }

    fn write_u16(&mut self, number: u16) {
        self.0 = (self.0 ^ u64::from(number)).wrapping_mul(FIBONACCI_MULTIPLIER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn neighbouring_channel_numbers_differ_in_their_high_bits() {
        let hash = |number: u16| BuildHasherDefault::<ChannelNumberHasher>::default().hash_one(number);
        // hashbrown takes its 7-bit tag from the top of the hash: consecutive channels must not share it.
        let tags: std::collections::HashSet<u64> = (1..=64u16).map(|number| hash(number) >> 57).collect();
        assert!(tags.len() > 32, "only {} distinct tags for 64 channels", tags.len());
    }
}
