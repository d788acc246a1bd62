//! When each queue that dead-letters next has a message to expire: the dead-letter worker wakes
//! at the earliest of these deadlines and visits only the queues that are due, so an idle queue
//! costs nothing between deadlines (there is no periodic sweep of every queue).
//!
//! A queue tells its deadline (the time its head expires) after each command, under its own
//! lock, and only when it is earlier than the one it already holds here: a later head costs no
//! operation here (the earlier entry fires, the queue finds nothing due and tells its new
//! deadline). Lock order: a queue's lock, then this one; the worker takes due entries and
//! releases this lock before it takes any queue's lock.
//!
//! Bound: one entry per queue (a queue keeps the key of its entry and replaces it), so the map is
//! bounded by the number of queues the broker holds.

use crate::queue_runtime::QueueRuntime;
use crate::quorum::QuorumQueue;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Weak;

/// A queue's place in the deadlines: its deadline in milliseconds since the epoch, and a
/// sequence number that makes the key unique.
pub type DeadlineKey = (u64, u64);

/// A queue with a deadline.
#[derive(Debug, Clone)]
pub enum DeadlineQueue {
    /// A classic queue: the worker expires its head and takes its dead letters.
    Classic(Weak<QueueRuntime>),
    /// A quorum queue: its leader proposes an expire.
    Quorum(Weak<QuorumQueue>),
}

/// The deadlines of the queues that dead-letter.
#[derive(Debug, Default)]
pub struct ExpiryDeadlines {
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    by_deadline: BTreeMap<DeadlineKey, DeadlineQueue>,
    next_sequence: u64,
}

impl ExpiryDeadlines {
    /// Puts `queue` at `deadline_ms`, replacing its entry `previous` (if it still holds it).
    /// Returns the new key, and whether it is now the earliest (the worker must be woken).
    pub fn schedule(&self, previous: Option<DeadlineKey>, deadline_ms: u64, queue: DeadlineQueue) -> (DeadlineKey, bool) {
        let mut entries = self.entries.lock();
        if let Some(previous) = previous {
            entries.by_deadline.remove(&previous);
        }
        let key = (deadline_ms, entries.next_sequence);
        entries.next_sequence += 1;
        entries.by_deadline.insert(key, queue);
        let earliest = entries.by_deadline.first_key_value().is_some_and(|(first, _)| *first == key);
        (key, earliest)
    }

    /// Removes a queue's entry (it no longer has anything to expire, or it is deleted).
    pub fn cancel(&self, key: DeadlineKey) {
        self.entries.lock().by_deadline.remove(&key);
    }

    /// The earliest deadline, in milliseconds since the epoch.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.entries.lock().by_deadline.first_key_value().map(|((deadline_ms, _), _)| *deadline_ms)
    }

    /// Takes the entries due by `now_ms`, earliest first, at most `count_max` of them (the rest
    /// stay for the next round, so one round holds the worker for a bounded time).
    pub fn take_due(&self, now_ms: u64, count_max: usize) -> Vec<(DeadlineKey, DeadlineQueue)> {
        let mut entries = self.entries.lock();
        let mut due = Vec::new();
        while due.len() < count_max {
            match entries.by_deadline.first_entry() {
                Some(entry) if entry.key().0 <= now_ms => due.push(entry.remove_entry()),
                _ => break,
            }
        }
        due
    }

    /// How many queues have a deadline.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.lock().by_deadline.len()
    }

    /// Whether no queue has a deadline.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nobody() -> DeadlineQueue {
        DeadlineQueue::Classic(Weak::new())
    }

    #[test]
    fn a_queue_holds_one_entry_and_due_ones_come_earliest_first() {
        let deadlines = ExpiryDeadlines::default();
        let (first, earliest) = deadlines.schedule(None, 500, nobody());
        assert!(earliest);
        let (second, earliest) = deadlines.schedule(None, 300, nobody());
        assert!(earliest, "an earlier deadline wakes the worker");
        let (_, earliest) = deadlines.schedule(None, 900, nobody());
        assert!(!earliest, "a later one does not");
        let (moved, earliest) = deadlines.schedule(Some(first), 100, nobody());
        assert!(earliest);
        assert_eq!(deadlines.len(), 3, "rescheduling replaces the queue's entry");
        assert_eq!(deadlines.next_deadline_ms(), Some(100));
        let due: Vec<DeadlineKey> = deadlines.take_due(400, 10).into_iter().map(|(key, _)| key).collect();
        assert_eq!(due, vec![moved, second]);
        assert!(deadlines.take_due(400, 10).is_empty());
        assert_eq!(deadlines.take_due(10_000, 0).len(), 0, "at most count_max per round");
        assert_eq!(deadlines.take_due(10_000, 10).len(), 1);
        assert!(deadlines.is_empty());
    }
}
