//! The cluster's replicated delay store, seen from one shard's thread: on the shard that holds the
//! store's internal queue, each round hands the held messages that are due to this node's firing
//! thread (`crate::delayed::replicated`), which routes them and proposes their release.
//!
//! Who routes an entry: the node that took its publish (its `origin`), at its due time, so its
//! classic queues on that node get it as a single node's store gives it; and the shard's leader
//! once an entry is [`ORPHAN_GRACE_MS`] overdue (its origin is down, or lost it between routing
//! and release). An entry fired and not released after [`REFIRE_AFTER_MS`] is fired again. Both
//! make duplicates possible, never a loss: the store forgets an entry only on its release.

use super::ShardWorker;
use crate::quorum::queue::QuorumQueue;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;

/// How overdue a held message is when the shard's leader routes it in its origin's place.
pub const ORPHAN_GRACE_MS: u64 = 5_000;

/// How long a fired message may wait for its release before it is fired again.
pub const REFIRE_AFTER_MS: u64 = 30_000;

/// The most due messages one round hands over; the rest wait for the next round.
pub const FIRE_BATCH_MAX: usize = 1024;

/// The most held messages one round looks at (due ones of other nodes are skipped over).
const SCAN_MAX: usize = 16_384;

/// Due messages for the firing thread: (entry id, stored message).
pub(crate) type DueDelayed = Vec<(u64, Bytes)>;

/// The store's queue and where its due messages go, with what this node has fired.
pub(crate) struct DelayedHook {
    pub(crate) queue: Arc<QuorumQueue>,
    pub(crate) fire: SyncSender<DueDelayed>,
    /// Entries fired and not released yet, with when (ms since the epoch).
    pub(crate) firing: HashMap<u64, u64>,
    /// How many messages the store holds, as this node last applied it (for the metrics).
    pub(crate) held: Arc<AtomicU64>,
}

impl ShardWorker {
    /// Hands this node's due held messages to its firing thread; when the next one is due (ms
    /// since the epoch), so the loop wakes for it.
    pub(super) fn fire_due_delayed(&mut self) -> Option<u64> {
        let node_id = self.config.node_id;
        let leading = self.node.is_leader();
        let hook = self.delayed.as_mut()?;
        let id = hook.queue.id();
        if id == 0 {
            return None;
        }
        let entries = self.node.machine().delayed(id)?;
        hook.held.store(entries.len() as u64, Ordering::Relaxed);
        // A restarted node replaying its log would fire what was released later in it.
        if !self.node.caught_up() {
            return None;
        }
        let now_ms = crate::queue_runtime::now_ms();
        hook.firing.retain(|fired, at_ms| entries.contains(*fired) && now_ms < at_ms.saturating_add(REFIRE_AFTER_MS));
        let mut due: DueDelayed = Vec::new();
        let mut next_ms = None;
        for (entry_id, entry) in entries.in_due_order().take(SCAN_MAX) {
            if entry.due_ms > now_ms {
                next_ms = Some(entry.due_ms);
                break;
            }
            let ours = entry.origin == node_id;
            if hook.firing.contains_key(&entry_id) || !(ours || leading) {
                continue;
            }
            if !ours && entry.due_ms.saturating_add(ORPHAN_GRACE_MS) > now_ms {
                continue;
            }
            due.push((entry_id, entry.body.clone()));
            if due.len() >= FIRE_BATCH_MAX {
                next_ms = Some(now_ms);
                break;
            }
        }
        if due.is_empty() {
            return next_ms;
        }
        let ids: Vec<u64> = due.iter().map(|(entry_id, _)| *entry_id).collect();
        match hook.fire.try_send(due) {
            Ok(()) => hook.firing.extend(ids.into_iter().map(|entry_id| (entry_id, now_ms))),
            // The thread is behind: these stay unfired, looked at again a moment later (not at
            // once: the loop would spin until the thread caught up).
            Err(TrySendError::Full(_)) => return Some(now_ms + 1),
            Err(TrySendError::Disconnected(_)) => self.delayed = None,
        }
        next_ms
    }
}
