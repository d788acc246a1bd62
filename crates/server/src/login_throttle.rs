//! Rate limiting of failed logins, per client address, for AMQP and the management API alike.
//!
//! A source gets a few failures per window answered at once (a user who mistypes a password is
//! not punished). Past that, each further failure is answered only after a delay, and the delays
//! of one source are served one after another, so many parallel connections from one address
//! guess no faster than one connection. When a source's queue of delayed answers is longer than
//! [`LOGIN_FAILURE_BACKLOG_MAX_MS`], its logins are refused without checking the password at all
//! until the backlog shrinks: the guessing rate per address is bounded whatever the client does.
//! Successful logins do not reset the count, so one known account cannot be used to keep
//! guessing another's password.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Failures per source and window answered without delay.
pub const LOGIN_FAILURES_FREE: u32 = 5;
/// The window over which failures are counted, in milliseconds.
pub const LOGIN_FAILURE_WINDOW_MS: u64 = 60_000;
/// How long each failure past the free ones waits before it is answered, in milliseconds.
pub const LOGIN_FAILURE_DELAY_MS: u64 = 1_000;
/// How far ahead a source's delayed answers may be queued before its logins are refused
/// unchecked, in milliseconds.
pub const LOGIN_FAILURE_BACKLOG_MAX_MS: u64 = 10_000;
/// The most addresses tracked; when full, sources whose window ended are forgotten first, then
/// the oldest.
pub const LOGIN_THROTTLE_SOURCES_MAX: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Source {
    window_started: Instant,
    failures: u32,
    /// When the last delayed answer for this source is due.
    answers_due: Instant,
}

/// What to do with a login attempt before its password is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Check the password.
    Check,
    /// Refuse without checking: this source has too many delayed failures queued.
    RefuseUnchecked,
}

/// Failed logins by client address.
#[derive(Debug, Default)]
pub struct LoginThrottle {
    sources: Mutex<HashMap<IpAddr, Source>>,
}

impl LoginThrottle {
    /// Whether a login from `peer` may be checked now.
    pub fn admit(&self, peer: IpAddr, now: Instant) -> Admission {
        let sources = self.sources.lock();
        match sources.get(&peer) {
            Some(source) if source.answers_due.saturating_duration_since(now) > Duration::from_millis(LOGIN_FAILURE_BACKLOG_MAX_MS) => {
                Admission::RefuseUnchecked
            }
            _ => Admission::Check,
        }
    }

    /// Records a failed login from `peer`; returns how long to wait before answering it.
    pub fn record_failure(&self, peer: IpAddr, now: Instant) -> Duration {
        let mut sources = self.sources.lock();
        if !sources.contains_key(&peer) && sources.len() >= LOGIN_THROTTLE_SOURCES_MAX {
            evict(&mut sources, now);
        }
        let source = sources.entry(peer).or_insert(Source { window_started: now, failures: 0, answers_due: now });
        if now.saturating_duration_since(source.window_started) > Duration::from_millis(LOGIN_FAILURE_WINDOW_MS) {
            source.window_started = now;
            source.failures = 0;
        }
        source.failures = source.failures.saturating_add(1);
        if source.failures <= LOGIN_FAILURES_FREE {
            return Duration::ZERO;
        }
        source.answers_due = source.answers_due.max(now) + Duration::from_millis(LOGIN_FAILURE_DELAY_MS);
        source.answers_due.saturating_duration_since(now)
    }

    /// How many sources are tracked.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.sources.lock().len()
    }
}

fn evict(sources: &mut HashMap<IpAddr, Source>, now: Instant) {
    let window = Duration::from_millis(LOGIN_FAILURE_WINDOW_MS);
    sources.retain(|_, source| now.saturating_duration_since(source.window_started) <= window || source.answers_due > now);
    if sources.len() >= LOGIN_THROTTLE_SOURCES_MAX {
        if let Some(oldest) = sources.iter().min_by_key(|(_, source)| source.window_started).map(|(address, _)| *address) {
            sources.remove(&oldest);
        }
    }
    assert!(sources.len() < LOGIN_THROTTLE_SOURCES_MAX, "eviction makes room");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_past_the_free_ones_wait_in_turn_then_are_refused_unchecked() {
        let throttle = LoginThrottle::default();
        let peer: IpAddr = [10, 0, 0, 1].into();
        let now = Instant::now();
        for _ in 0..LOGIN_FAILURES_FREE {
            assert_eq!(throttle.record_failure(peer, now), Duration::ZERO);
        }
        // Parallel failures at the same instant are answered one delay apart.
        assert_eq!(throttle.record_failure(peer, now), Duration::from_millis(LOGIN_FAILURE_DELAY_MS));
        assert_eq!(throttle.record_failure(peer, now), Duration::from_millis(2 * LOGIN_FAILURE_DELAY_MS));
        let backlog_failures = LOGIN_FAILURE_BACKLOG_MAX_MS / LOGIN_FAILURE_DELAY_MS;
        for _ in 2..backlog_failures {
            throttle.record_failure(peer, now);
        }
        assert_eq!(throttle.admit(peer, now), Admission::Check, "a backlog of exactly the maximum is admitted");
        throttle.record_failure(peer, now);
        assert_eq!(throttle.admit(peer, now), Admission::RefuseUnchecked);
        assert_eq!(throttle.admit([10, 0, 0, 2].into(), now), Admission::Check, "other sources are not affected");
        let later = now + Duration::from_millis(LOGIN_FAILURE_BACKLOG_MAX_MS);
        assert_eq!(throttle.admit(peer, later), Admission::Check, "admitted again once the backlog drains");
        let next_window = now + Duration::from_millis(LOGIN_FAILURE_WINDOW_MS + LOGIN_FAILURE_BACKLOG_MAX_MS + 1);
        assert_eq!(throttle.record_failure(peer, next_window), Duration::ZERO, "a new window starts free");
    }

    #[test]
    fn the_table_of_sources_stays_bounded() {
        let throttle = LoginThrottle::default();
        let now = Instant::now();
        for index in 0..(LOGIN_THROTTLE_SOURCES_MAX as u32 + 100) {
            throttle.record_failure(IpAddr::from(index.to_be_bytes()), now);
        }
        assert!(throttle.tracked() <= LOGIN_THROTTLE_SOURCES_MAX);
    }
}
