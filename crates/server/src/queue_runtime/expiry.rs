//! One queue's x-expires clock: when it was last used, and that time kept on disk for a durable
//! queue, so a restarted broker deletes it when it would have without the restart (RabbitMQ starts
//! a full period again at every start).
//!
//! On disk (`queue-expiry/<queue key>` in the data directory, replaced atomically): `in-use` while
//! consumers are attached, or the time it became idle, in milliseconds since the epoch. Writing
//! on every basic.get would cost a sync each; instead the stored time is set
//! [`STORED_AHEAD_MS`] ahead of the use, and a use up to that time needs no write. A crash then
//! deletes a queue at most that much late, never early. Writes happen under the queue's lock: only
//! queues with an expiry write, at most once per [`STORED_AHEAD_MS`] plus once per consumer
//! arriving or leaving.

use crate::queue_expiry::ExpiryTimers;
use crate::queue_type::WeakQueue;
use std::path::PathBuf;
use std::sync::Arc;

/// How far ahead of a use the stored idle time is put (see the module comment).
pub const STORED_AHEAD_MS: u64 = 1000;

/// What is written while consumers hold the queue.
const IN_USE: &[u8] = b"in-use";

/// What the expiry task finds when it looks at a queue.
#[derive(Debug, PartialEq, Eq)]
pub enum ExpiryCheck {
    /// Unused for its whole expiry: delete it.
    Expired,
    /// Used since: look again then.
    Later(u64),
    /// Consumers hold it, or it has no expiry now: it schedules itself again when idle.
    InUse,
}

/// A queue's last use and expiry.
#[derive(Debug)]
pub struct ExpiryClock {
    timers: Arc<ExpiryTimers>,
    /// Where a durable queue keeps its last use.
    file: Option<PathBuf>,
    /// The x-expires argument, and the expiry in force (the lower of it and the policy's).
    argument_ms: Option<u64>,
    expires_ms: Option<u64>,
    last_used_ms: u64,
    /// The idle time last written (ahead of the use), or `None` after `in-use` was written.
    stored_idle_ms: Option<u64>,
    /// Whether the expiry task has an entry for this queue.
    scheduled: bool,
}

impl ExpiryClock {
    /// A clock for a queue declared or recovered now; `file` for a durable queue.
    pub fn new(timers: Arc<ExpiryTimers>, file: Option<PathBuf>, argument_ms: Option<u64>, now_ms: u64) -> ExpiryClock {
        ExpiryClock { timers, file, argument_ms, expires_ms: argument_ms, last_used_ms: now_ms, stored_idle_ms: None, scheduled: false }
    }

    /// The last use a recovered durable queue stored, if any: `in-use` means consumers held it
    /// when the broker stopped (crashed), so its idle time starts now.
    pub fn recover_last_use(&mut self, now_ms: u64) {
        let Some(file) = &self.file else { return };
        let Ok(stored) = std::fs::read(file) else { return };
        if stored == IN_USE {
            return;
        }
        match std::str::from_utf8(&stored).ok().and_then(|text| text.trim().parse::<u64>().ok()) {
            Some(idle_since_ms) => {
                self.last_used_ms = idle_since_ms.min(now_ms.saturating_add(STORED_AHEAD_MS));
                self.stored_idle_ms = Some(idle_since_ms);
            }
            None => tracing::warn!(file = %file.display(), "a queue's stored last use is unreadable; its expiry starts now"),
        }
    }

    /// Sets the policy's expiry; the lower of it and the argument applies, as in RabbitMQ.
    pub fn set_policy_ms(&mut self, policy_ms: Option<u64>) {
        self.expires_ms = match (self.argument_ms, policy_ms) {
            (Some(argument), Some(policy)) => Some(argument.min(policy)),
            (argument, policy) => argument.or(policy),
        };
    }

    /// A redeclare or a basic.get.
    pub fn used(&mut self, now_ms: u64, idle: bool) {
        self.last_used_ms = self.last_used_ms.max(now_ms);
        if idle && self.expires_ms.is_some() && self.stored_idle_ms.is_none_or(|stored| stored < now_ms) {
            self.store_idle(now_ms);
        }
    }

    /// The first consumer arrived.
    pub fn consumed(&mut self) {
        if self.expires_ms.is_none() {
            return;
        }
        if let Some(file) = &self.file {
            if let Err(error) = storage::write_atomically(file, IN_USE) {
                tracing::error!(%error, "storing that a queue is in use failed");
            }
        }
        self.stored_idle_ms = None;
    }

    /// The queue became idle (its last consumer left, it was declared or an expiry was set):
    /// from now on it expires, and the expiry task is told.
    pub fn idle(&mut self, now_ms: u64, queue: impl Into<WeakQueue>) {
        let Some(expires_ms) = self.expires_ms else { return };
        self.last_used_ms = self.last_used_ms.max(now_ms);
        if self.stored_idle_ms.is_none_or(|stored| stored < now_ms) {
            self.store_idle(now_ms);
        }
        self.schedule(self.last_used_ms.saturating_add(expires_ms), queue);
    }

    /// Schedules an idle queue at its deadline from its last use (recovered, or a policy changed
    /// its expiry), without counting this as a use.
    pub fn schedule_deadline(&mut self, queue: impl Into<WeakQueue>) {
        if let Some(expires_ms) = self.expires_ms {
            self.schedule(self.last_used_ms.saturating_add(expires_ms), queue);
        }
    }

    fn schedule(&mut self, deadline_ms: u64, queue: impl Into<WeakQueue>) {
        if !self.scheduled {
            self.scheduled = true;
            self.timers.schedule(deadline_ms, queue.into());
        }
    }

    /// The expiry in force, if any.
    pub fn expires_ms(&self) -> Option<u64> {
        self.expires_ms
    }

    /// The expiry task was told to look again later (see [`ExpiryCheck::Later`]) although the
    /// queue expired: a quorum queue on a node that does not lead it.
    pub fn postponed(&mut self) {
        self.scheduled = true;
    }

    /// What the expiry task finds at `now_ms`; `idle` when no consumer holds the queue.
    pub fn check(&mut self, now_ms: u64, idle: bool) -> ExpiryCheck {
        let deadline_ms = match (idle, self.expires_ms) {
            (true, Some(expires_ms)) => self.last_used_ms.saturating_add(expires_ms),
            _ => {
                self.scheduled = false;
                return ExpiryCheck::InUse;
            }
        };
        if deadline_ms <= now_ms {
            self.scheduled = false;
            ExpiryCheck::Expired
        } else {
            ExpiryCheck::Later(deadline_ms)
        }
    }

    /// Forgets the stored last use (the queue was deleted).
    pub fn remove_file(&self) {
        if let Some(file) = &self.file {
            let _ = std::fs::remove_file(file);
        }
    }

    fn store_idle(&mut self, now_ms: u64) {
        let ahead_ms = now_ms.saturating_add(STORED_AHEAD_MS);
        if let Some(file) = &self.file {
            if let Err(error) = storage::write_atomically(file, ahead_ms.to_string().as_bytes()) {
                tracing::error!(%error, "storing a queue's last use failed");
                return;
            }
        }
        self.stored_idle_ms = Some(ahead_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(argument_ms: Option<u64>, file: Option<PathBuf>, now_ms: u64) -> ExpiryClock {
        ExpiryClock::new(Arc::default(), file, argument_ms, now_ms)
    }

    #[test]
    fn an_idle_queue_expires_its_expiry_after_its_last_use() {
        let mut expiry = clock(Some(1000), None, 0);
        assert_eq!(expiry.check(999, true), ExpiryCheck::Later(1000));
        assert_eq!(expiry.check(1000, true), ExpiryCheck::Expired);
        let mut used = clock(Some(1000), None, 0);
        used.used(800, true);
        assert_eq!(used.check(1000, true), ExpiryCheck::Later(1800));
        assert_eq!(used.check(5000, false), ExpiryCheck::InUse, "a queue with consumers never expires");
        assert_eq!(clock(None, None, 0).check(u64::MAX, true), ExpiryCheck::InUse, "no expiry, no deletion");
    }

    #[test]
    fn the_lower_of_argument_and_policy_applies() {
        let mut expiry = clock(Some(5000), None, 0);
        expiry.set_policy_ms(Some(2000));
        assert_eq!(expiry.check(2000, true), ExpiryCheck::Expired);
        expiry.set_policy_ms(Some(9000));
        assert_eq!(expiry.check(2000, true), ExpiryCheck::Later(5000));
        let mut policy_only = clock(None, None, 0);
        policy_only.set_policy_ms(Some(300));
        assert_eq!(policy_only.check(300, true), ExpiryCheck::Expired);
    }

    #[test]
    fn a_restart_keeps_the_stored_last_use_ahead_and_in_use_starts_afresh() {
        let directory = std::env::temp_dir().join(format!("lepus-expiry-test-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&directory).expect("temporary directory");
        let file = directory.join("queue");
        let mut before = clock(Some(10_000), Some(file.clone()), 0);
        before.used(4000, true);
        // Stored ahead of the use: a crash now deletes the queue at most STORED_AHEAD_MS late.
        let mut after = clock(Some(10_000), Some(file.clone()), 60_000);
        after.recover_last_use(60_000);
        assert_eq!(after.check(60_000, true), ExpiryCheck::Expired, "unused for 56 s with a 10 s expiry");
        let mut soon = clock(Some(10_000), Some(file.clone()), 5000);
        soon.recover_last_use(5000);
        assert_eq!(soon.check(5000, true), ExpiryCheck::Later(4000 + STORED_AHEAD_MS + 10_000));
        before.consumed();
        let mut held = clock(Some(10_000), Some(file.clone()), 60_000);
        held.recover_last_use(60_000);
        assert_eq!(held.check(60_000, true), ExpiryCheck::Later(70_000), "in use at the stop: the clock starts at the start");
        let _ = std::fs::remove_dir_all(&directory);
    }
}
