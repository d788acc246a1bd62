//! The cluster's replicated delay store: messages `x-delayed-message` exchanges hold back, kept in
//! the replicated state of one internal queue so that a node's loss loses none of them (a single
//! node keeps its own on disk, `server::delayed`). Every member holds the same entries; which node
//! routes a due entry is the server's choice (its origin, or the leader once it is overdue), and
//! an entry leaves only when a [`QueueCommand::ReleaseDelayed`](crate::command::QueueCommand)
//! says its queues hold it: a node that dies between routing and release leaves it here to be
//! routed again (at least once).

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

/// One held message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayedEntry {
    /// When it is due (ms since the epoch).
    pub due_ms: u64,
    /// The node that took its publish.
    pub origin: u64,
    /// The message, as the broker stores it.
    pub body: Bytes,
}

/// A queue's held messages, by id and by due time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelayedEntries {
    entries: BTreeMap<u64, DelayedEntry>,
    /// (due time, id), earliest first.
    by_due: BTreeSet<(u64, u64)>,
    bytes: u64,
}

impl DelayedEntries {
    /// Holds `entry` under `id` (ids are never reused: the holding command's own id).
    pub(crate) fn hold(&mut self, id: u64, entry: DelayedEntry) {
        self.release(id);
        self.bytes += entry.body.len() as u64;
        self.by_due.insert((entry.due_ms, id));
        self.entries.insert(id, entry);
    }

    /// Forgets the entry `id`; false when it was not held.
    pub(crate) fn release(&mut self, id: u64) -> bool {
        match self.entries.remove(&id) {
            Some(entry) => {
                self.by_due.remove(&(entry.due_ms, id));
                self.bytes -= entry.body.len() as u64;
                true
            }
            None => false,
        }
    }

    /// The entries in due order (earliest first), with their ids.
    pub fn in_due_order(&self) -> impl Iterator<Item = (u64, &DelayedEntry)> + '_ {
        self.by_due.iter().filter_map(|(_, id)| self.entries.get(id).map(|entry| (*id, entry)))
    }

    /// Whether the entry `id` is held.
    pub fn contains(&self, id: u64) -> bool {
        self.entries.contains_key(&id)
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Their bodies' bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The entries by id (what a snapshot keeps).
    pub(crate) fn by_id(&self) -> impl Iterator<Item = (u64, &DelayedEntry)> + '_ {
        self.entries.iter().map(|(id, entry)| (*id, entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(due_ms: u64, body: &'static str) -> DelayedEntry {
        DelayedEntry { due_ms, origin: 1, body: Bytes::from_static(body.as_bytes()) }
    }

    #[test]
    fn entries_come_in_due_order_and_a_release_forgets_one() {
        let mut entries = DelayedEntries::default();
        entries.hold(10, entry(300, "late"));
        entries.hold(11, entry(100, "early"));
        entries.hold(12, entry(100, "early too"));
        assert_eq!(entries.bytes(), 4 + 5 + 9);
        let order: Vec<u64> = entries.in_due_order().map(|(id, _)| id).collect();
        assert_eq!(order, [11, 12, 10]);
        assert!(entries.release(11));
        assert!(!entries.release(11), "released once");
        assert_eq!(entries.in_due_order().map(|(id, _)| id).collect::<Vec<_>>(), [12, 10]);
        assert_eq!(entries.bytes(), 4 + 9);
    }
}
