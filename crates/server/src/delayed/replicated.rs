//! The cluster's delay store: on a clustered node, messages `x-delayed-message` exchanges hold back
//! go to the replicated state of one internal quorum queue (`replication::state_machine::delayed`)
//! instead of the node's own store on disk, so the loss of a node loses none of them: confirmed
//! once a majority holds them, routed at their due time by the node that took the publish (its
//! classic queues get them as on a single node), or by the store's shard leader once they are
//! [`ORPHAN_GRACE_MS`](crate::quorum::shard::delayed::ORPHAN_GRACE_MS) overdue (their node is
//! down), and forgotten once every queue they were routed to holds them (at least once).
//!
//! Their bodies are in every member's memory, as quorum queues' messages are, bounded by
//! `replication::command::DELAYED_BYTES_MAX` (a publish past it is nacked); a single node keeps
//! its pending messages on disk with no bound but the disk.

use crate::broker::Broker;
use crate::queue_runtime::ExpiryClock;
use crate::queue_type::ConfirmTickets;
use crate::quorum::queue::QuorumQueue;
use crate::quorum::shard::delayed::DueDelayed;
use amqp_codec::{FieldTable, ShortStr};
use broker_core::vhost::{QueueDefinition, QueueType};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};

/// The internal queue's name; its vhost is "" (no vhost's): never listed, never a client's.
pub const STORE_QUEUE_NAME: &str = "lepus.delayed-messages";

/// Batches of due messages waiting for the firing thread; past it the shard hands them over on a
/// later round.
const DUE_BATCHES_WAITING_MAX: usize = 64;

/// Where this node holds delayed messages: the store's queue, and this node's Raft id (the
/// origin it records, so it routes its own messages itself).
#[derive(Debug)]
pub struct ReplicatedDelays {
    pub(super) queue: Arc<QuorumQueue>,
    pub(super) node: u64,
    /// How many messages the store holds (as this node applied it).
    pub(super) held: Arc<AtomicU64>,
}

/// Makes the cluster's delay store this node's: its queue (found by name in its shard, or declared
/// there), the shard told to fire due messages to a thread of this node, which routes them.
pub fn start(broker: &Arc<Broker>) {
    let definition = QueueDefinition {
        name: ShortStr::from(STORE_QUEUE_NAME),
        durable: true,
        exclusive_owner: None,
        auto_delete: false,
        arguments: FieldTable::default(),
        queue_type: QueueType::Quorum,
    };
    let no_expiry = ExpiryClock::new(Arc::default(), None, None, 0);
    let queue = QuorumQueue::recover(definition, "", &broker.quorum, no_expiry, 0);
    let (to_firing, due) = std::sync::mpsc::sync_channel::<DueDelayed>(DUE_BATCHES_WAITING_MAX);
    let weak: Weak<Broker> = Arc::downgrade(broker);
    let spawned = std::thread::Builder::new().name("lepus-delayed-cluster".to_string()).spawn(move || {
        for batch in due {
            let Some(broker) = weak.upgrade() else { return };
            fire(&broker, batch);
        }
    });
    if let Err(error) = spawned {
        tracing::error!(%error, "the cluster's delayed-message thread could not start: this node keeps delayed messages itself");
        return;
    }
    let held = Arc::new(AtomicU64::new(0));
    queue.fire_delayed_through(to_firing, held.clone());
    broker.delayed.replicate_through(ReplicatedDelays { queue, node: broker.quorum.node_id(), held });
}

/// Routes due messages of the store, and releases them once their queues hold them.
fn fire(broker: &Broker, due: DueDelayed) {
    let Some(store) = broker.delayed.replicated() else { return };
    let mut tickets = ConfirmTickets::default();
    let mut queues = Vec::new();
    let mut ids = Vec::with_capacity(due.len());
    let mut declared = true;
    for (id, body) in due {
        ids.push(id);
        let stored = match crate::quorum::envelope::decode(&body) {
            Ok(stored) => stored,
            Err(error) => {
                tracing::error!(%error, id, "a held delayed message does not decode; released");
                continue;
            }
        };
        match broker.delayed.route_stored(broker, broker_core::Message::clone(&stored), &mut queues, &mut tickets) {
            Some(safe) => declared &= safe,
            None => tracing::error!(id, "a held delayed message has no delay envelope; released"),
        }
    }
    let queue = store.queue.clone();
    let count = ids.len();
    super::timer::release_when_safe(broker, tickets, declared, count, move || queue.release_delayed(&ids));
}
