//! Heartbeats on an idle connection, at the cost of one wakeup per half interval.
//!
//! RabbitMQ sends a heartbeat every half interval T/2 to a client that is otherwise silent
//! (measured with 3.10.8: T = 2 s gives one every second) and closes a client silent for two
//! intervals. Clients send theirs every T/2 as well. Done naively that is two wakeups per T/2 per
//! connection (the client's heartbeat arriving, our timer firing), each at its own instant, plus a
//! timer registered and cancelled at every socket read: for 19,000 idle connections with T = 10 s,
//! 7,600 wakeups a second spread evenly, each waking a parked worker thread.
//!
//! Instead:
//! - **Piggyback**: when a read arrives and the writer has been silent for at least
//!   [`PIGGYBACK_SILENCE_FRACTION`] of T, the reader queues a heartbeat right away, from the
//!   wakeup it already had: the client's heartbeat and ours then share one wakeup, and ours
//!   carries the TCP acknowledgement of theirs (no separate ACK packet). A client heartbeating
//!   every T/2 gets one back every T/2, as from RabbitMQ.
//! - **Fallback timer**: the writer sends one itself only after [`SILENCE_MAX_FRACTION`] of T of
//!   silence (a client that sends nothing, or nothing often enough), so with a heartbeating client
//!   its timer is pushed back by each write and never fires.
//! - **Coarse deadlines**: timer deadlines are rounded up to a grain of T/[`GRAIN_DIVISOR`], so the
//!   timers of many connections fall due in the same runtime turn, and a deadline pushed back by a
//!   read or a write moves only when it crosses a grain (a comparison otherwise).
//!
//! The reader's deadline for a silent client is two intervals after its last read, plus at most one
//! grain: a silent client is closed after 2 T to 2.125 T (RabbitMQ: about 3 T).

use crate::metrics::latency::clock_ns;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// One heartbeat frame (type 8, channel 0, empty payload, frame end).
pub const HEARTBEAT_FRAME: &[u8] = &[amqp_codec::constants::FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, amqp_codec::constants::FRAME_END];
/// The reader queues a heartbeat when the writer has been silent this long (a fraction of T).
pub const PIGGYBACK_SILENCE_FRACTION: (u64, u64) = (1, 4);
/// The writer sends a heartbeat of its own after this long a silence (a fraction of T).
pub const SILENCE_MAX_FRACTION: (u64, u64) = (3, 4);
/// Deadlines are rounded up to a multiple of T divided by this.
pub const GRAIN_DIVISOR: u64 = 8;
/// Missed intervals after which a silent client is closed.
pub const MISSED_INTERVALS_MAX: u64 = 2;

fn fraction_of_interval_ns(interval_s: u32, (numerator, denominator): (u64, u64)) -> u64 {
    u64::from(interval_s) * 1_000_000_000 * numerator / denominator
}

/// Whether a read at `now_ns` should queue a heartbeat, the writer's last write being at
/// `last_write_ns` (both [`clock_ns`] readings); never without heartbeats.
pub fn piggyback_due(interval_s: u32, now_ns: u64, last_write_ns: u64) -> bool {
    interval_s > 0 && now_ns.saturating_sub(last_write_ns) >= fraction_of_interval_ns(interval_s, PIGGYBACK_SILENCE_FRACTION)
}

/// `at_ns` (a [`clock_ns`] reading) plus `after_ns`, rounded up to the interval's grain, as a tokio
/// instant.
pub fn coarse_deadline(interval_s: u32, at_ns: u64, after_ns: u64) -> Instant {
    let grain_ns = u64::from(interval_s.max(1)) * 1_000_000_000 / GRAIN_DIVISOR;
    aligned_deadline(at_ns, after_ns, grain_ns)
}

/// `at_ns` plus `after_ns`, rounded up to a multiple of `grain_ns` (on the [`clock_ns`] clock, the
/// same for every connection), as a tokio instant.
pub fn aligned_deadline(at_ns: u64, after_ns: u64, grain_ns: u64) -> Instant {
    let grain_ns = grain_ns.max(1);
    let deadline_ns = at_ns.saturating_add(after_ns).div_ceil(grain_ns).saturating_mul(grain_ns);
    instant_of_clock_ns(deadline_ns)
}

/// The instant a [`clock_ns`] reading stands for: the same reading always gives the same instant,
/// so a deadline set again to the same grain compares equal.
fn instant_of_clock_ns(at_ns: u64) -> Instant {
    static BASE: std::sync::OnceLock<(std::time::Instant, u64)> = std::sync::OnceLock::new();
    let (base, base_ns) = *BASE.get_or_init(|| (std::time::Instant::now(), clock_ns()));
    let instant = match at_ns.checked_sub(base_ns) {
        Some(after_ns) => base + Duration::from_nanos(after_ns),
        None => base.checked_sub(Duration::from_nanos(base_ns - at_ns)).unwrap_or(base),
    };
    Instant::from_std(instant)
}

/// When the reader gives up on a client whose last read was at `last_read_ns`.
pub fn missed_heartbeats_deadline(interval_s: u32, last_read_ns: u64) -> Instant {
    coarse_deadline(interval_s, last_read_ns, MISSED_INTERVALS_MAX * u64::from(interval_s) * 1_000_000_000)
}

/// A timer whose deadline moves often and fires rarely: moving it to the deadline it already has
/// costs a comparison.
pub struct CoarseTimer {
    sleep: Pin<Box<Sleep>>,
    armed: bool,
}

impl Default for CoarseTimer {
    fn default() -> CoarseTimer {
        CoarseTimer { sleep: Box::pin(tokio::time::sleep_until(Instant::now())), armed: false }
    }
}

impl CoarseTimer {
    /// Fires at `deadline`, or never with `None`.
    pub fn set(&mut self, deadline: Option<Instant>) {
        match deadline {
            Some(deadline) if !self.armed || self.sleep.deadline() != deadline => {
                self.sleep.as_mut().reset(deadline);
                self.armed = true;
            }
            Some(_) => {}
            None => self.armed = false,
        }
    }

    /// Resolves at the deadline; never while unset. It stays unset after firing until `set`.
    pub async fn fired(&mut self) {
        if !self.armed {
            return std::future::pending().await;
        }
        self.sleep.as_mut().await;
        self.armed = false;
    }
}

/// The writer's side: when it last wrote (shared with the reader, which piggybacks on it), and
/// its fallback timer.
pub struct HeartbeatClock {
    /// The negotiated interval, in seconds (0 = no heartbeats).
    interval_s: u32,
    last_write_ns: Arc<AtomicU64>,
    timer: CoarseTimer,
}

impl HeartbeatClock {
    /// A clock that publishes its writes' times in `last_write_ns`.
    pub fn new(last_write_ns: Arc<AtomicU64>) -> HeartbeatClock {
        HeartbeatClock { interval_s: 0, last_write_ns, timer: CoarseTimer::default() }
    }

    /// Something was written; `interval_s` is the negotiated interval now (tune-ok is read before
    /// the writer writes connection.open-ok, so the clock starts with the connection's first reply).
    pub fn wrote(&mut self, interval_s: u32) {
        let now_ns = clock_ns();
        self.last_write_ns.store(now_ns, Ordering::Relaxed);
        self.interval_s = interval_s;
        let deadline =
            (interval_s > 0).then(|| coarse_deadline(interval_s, now_ns, fraction_of_interval_ns(interval_s, SILENCE_MAX_FRACTION)));
        self.timer.set(deadline);
    }

    /// Resolves when the writer has been silent long enough to send a heartbeat itself; never
    /// without heartbeats.
    pub async fn silent_too_long(&mut self) {
        self.timer.fired().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_queues_a_heartbeat_only_after_a_quarter_interval_of_silence() {
        let second = 1_000_000_000;
        assert!(!piggyback_due(0, 100 * second, 0), "no heartbeats negotiated");
        assert!(!piggyback_due(10, 12 * second, 10 * second), "written 2 s ago of 10 s");
        assert!(piggyback_due(10, 12 * second + second / 2, 10 * second), "2.5 s of silence is a quarter");
        assert!(piggyback_due(10, 15 * second, 10 * second));
    }

    #[test]
    fn deadlines_round_up_to_an_eighth_of_the_interval() {
        let now_ns = clock_ns();
        let start = Instant::now();
        let deadline = coarse_deadline(8, now_ns, 3_000_000_000);
        let after = deadline - start;
        assert!(after >= Duration::from_millis(2990) && after <= Duration::from_secs(4), "{after:?}");
        assert_eq!(coarse_deadline(8, now_ns + 1, 3_000_000_000), deadline, "the same grain is the same instant");
        let silent = missed_heartbeats_deadline(8, now_ns) - start;
        assert!(silent >= Duration::from_millis(15990) && silent <= Duration::from_secs(17), "{silent:?}");
    }
}
