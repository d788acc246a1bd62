//! The segment scanner (queue log recovery and the tail reader): arbitrary bytes as a segment
//! never panic it, and damage to a written log never makes it return a message not written
//! there (see `storage::fuzz_checks`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    storage::fuzz_checks::segment_bytes(data);
    storage::fuzz_checks::segment_damage(data);
});
