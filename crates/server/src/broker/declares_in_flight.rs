//! Durable queues whose declaration is in flight: in their vhost's topology, so every channel
//! routes to them, while their definition is submitted to the definitions store but not known
//! to be on disk. A confirm of a persistent message routed into one waits for that definition
//! too: the log's fdatasync alone would let a power cut take the definition, the next start
//! remove the log as an orphan, and the confirmed message with it (found by the simulator's
//! publishes into a queue whose declare is in flight, `crates/simulator`).
//!
//! The publish path pays one atomic load per message ([`DeclaresInFlight::any`]), which is
//! false but for the moments between a durable queue's declaration and the fdatasync that
//! stores it. The set is bounded by the queues themselves: one entry per durable queue declared
//! and not yet known durable, pruned by every successful wait for a definitions change.

use crate::queue_type::Queue;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use storage::definitions::DefinitionsTicket;

/// The queues declared whose definition may not be on disk yet, with the ticket of each.
#[derive(Default)]
pub struct DeclaresInFlight {
    /// The entries of `queues`, read without the lock by the publish path.
    count: AtomicUsize,
    /// By the queue's address; the handle held keeps that address the queue's until it goes.
    queues: Mutex<HashMap<usize, (Queue, DefinitionsTicket)>>,
}

impl DeclaresInFlight {
    /// `queue` was put into its topology, its definition submitted as `ticket`. Called under
    /// the topology's write lock, so a channel that routes to the queue (under the read lock)
    /// sees the entry.
    pub fn add(&self, queue: &Queue, ticket: DefinitionsTicket) {
        let mut queues = self.queues.lock();
        queues.insert(queue.address() as usize, (queue.clone(), ticket));
        self.count.store(queues.len(), Ordering::Release);
    }

    /// Whether any declaration is in flight: the publish path's one check when there is none.
    #[inline]
    pub fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    /// The ticket of `queue`'s definition, while it is not known durable.
    pub fn ticket_of(&self, queue: &Queue) -> Option<DefinitionsTicket> {
        let queues = self.queues.lock();
        let (held, ticket) = queues.get(&(queue.address() as usize))?;
        (held.same(queue) && !ticket.is_durable()).then(|| ticket.clone())
    }

    /// Forgets every queue whose definition is durable (after a wait for the definitions).
    pub fn forget_durable(&self) {
        let mut queues = self.queues.lock();
        queues.retain(|_, (_, ticket)| !ticket.is_durable());
        self.count.store(queues.len(), Ordering::Release);
    }

    /// Forgets `queue` (its definition is on disk: a later commit stored a failed one's changes).
    pub fn forget(&self, queue: &Queue) {
        let mut queues = self.queues.lock();
        queues.remove(&(queue.address() as usize));
        self.count.store(queues.len(), Ordering::Release);
    }
}
