//! x-expires (and the `expires` policy key): a queue left unused for that long (no consumer, no
//! basic.get, no redeclare) is deleted, as RabbitMQ deletes it.
//!
//! One task serves every queue: a min-heap of deadlines, one entry per idle queue with an expiry,
//! so no tick ever walks the queues. An entry only says "look at this queue then": the queue's own
//! clock decides (it may have been used since, which moves its deadline; the entry is then pushed
//! again), so using a queue costs no heap operation. A queue whose last consumer leaves pushes
//! itself again.
//!
//! Bound: at most one entry per queue (a queue remembers whether it has one), so the heap is
//! bounded by the number of queues the broker holds.

use crate::broker::Broker;
use crate::queue_runtime::{ExpiryCheck, QueueRuntime};
use crate::queue_type::{Queue, WeakQueue};
use crate::quorum::QuorumQueue;
use parking_lot::Mutex;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// A queue to look at once its deadline passes.
#[derive(Debug)]
struct Entry {
    deadline_ms: u64,
    queue: WeakQueue,
}

impl From<Weak<QueueRuntime>> for WeakQueue {
    fn from(queue: Weak<QueueRuntime>) -> WeakQueue {
        WeakQueue::Classic(queue)
    }
}

impl From<Weak<QuorumQueue>> for WeakQueue {
    fn from(queue: Weak<QuorumQueue>) -> WeakQueue {
        WeakQueue::Quorum(queue)
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.deadline_ms == other.deadline_ms
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed, so the standard max-heap gives the earliest deadline first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.deadline_ms.cmp(&self.deadline_ms)
    }
}

/// The deadlines of idle queues with an expiry, and the wake-up of the task that deletes them.
#[derive(Debug, Default)]
pub struct ExpiryTimers {
    heap: Mutex<BinaryHeap<Entry>>,
    wake: tokio::sync::Notify,
}

impl ExpiryTimers {
    /// Asks the task to look at `queue` at `deadline_ms` (milliseconds since the epoch).
    pub fn schedule(&self, deadline_ms: u64, queue: WeakQueue) {
        let mut heap = self.heap.lock();
        let earliest = heap.peek().is_none_or(|first| deadline_ms < first.deadline_ms);
        heap.push(Entry { deadline_ms, queue });
        drop(heap);
        if earliest {
            // A stored permit: a wake-up between the task's look at the heap and its wait is kept.
            self.wake.notify_one();
        }
    }

    fn next_deadline_ms(&self) -> Option<u64> {
        self.heap.lock().peek().map(|entry| entry.deadline_ms)
    }

    fn take_due(&self, now_ms: u64) -> Vec<WeakQueue> {
        let mut heap = self.heap.lock();
        let mut due = Vec::new();
        while heap.peek().is_some_and(|entry| entry.deadline_ms <= now_ms) {
            if let Some(entry) = heap.pop() {
                due.push(entry.queue);
            }
        }
        due
    }
}

/// Deletes expired queues until the process ends.
pub async fn run(broker: Arc<Broker>) {
    let timers = broker.expiry_timers.clone();
    loop {
        match timers.next_deadline_ms() {
            None => timers.wake.notified().await,
            Some(deadline_ms) => {
                let wait_ms = deadline_ms.saturating_sub(crate::queue_runtime::now_ms());
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                    _ = timers.wake.notified() => {}
                }
            }
        }
        let now_ms = crate::queue_runtime::now_ms();
        for weak in timers.take_due(now_ms) {
            let Some(queue) = weak.upgrade() else { continue };
            let check = match &queue {
                Queue::Classic(queue) => queue.check_expiry(now_ms),
                Queue::Quorum(queue) => queue.check_expiry(now_ms),
                Queue::Stream(_) | Queue::Remote(_) => ExpiryCheck::InUse,
            };
            match check {
                ExpiryCheck::Expired => delete_expired(&broker, queue),
                // Never at or before now: an entry due again at once would spin this task.
                ExpiryCheck::Later(deadline_ms) => timers.schedule(deadline_ms.max(now_ms + 1), weak),
                ExpiryCheck::InUse => {}
            }
        }
    }
}

/// Deletes an expired queue, if the topology still holds this very queue under its name.
fn delete_expired(broker: &Broker, handle: Queue) {
    let (vhost, name) = match &handle {
        Queue::Classic(queue) => (queue.vhost.clone(), queue.name().clone()),
        Queue::Quorum(queue) => (queue.vhost.clone(), queue.name().clone()),
        Queue::Stream(_) | Queue::Remote(_) => return,
    };
    let Some(topology) = broker.vhost(&vhost) else { return };
    let current = topology.read().queue(&name).is_some_and(|entry| entry.handle.same(&handle));
    if current {
        tracing::info!(queue = %name, vhost = %vhost, "deleting an unused queue: its x-expires passed");
        broker.remove_queue(&vhost, &name);
    }
}
