//! The queue-type seam: what the channel, the broker, management and metrics may ask of a queue,
//! whatever its type. Shaped after RabbitMQ's `rabbit_queue_type` behaviour: every type states its
//! capabilities (the arguments it takes, whether it may be exclusive, transient, auto-delete, read
//! with basic.get, consumed under a global QoS), and a queue is a [`Queue`] that publishes, hands
//! out deliveries to consumers' sinks, settles them by delivery, and lists its figures. The caller
//! never asks which type it holds.
//!
//! Classic queues (`classic.rs`, over [`crate::queue_runtime::QueueRuntime`]) are the one type
//! Lepus runs. Quorum and stream queues have their capabilities here already and are refused with
//! 540 at declaration; each plugs in as a variant of [`Queue`] and of [`ConfirmTicket`].
//!
//! [`Queue`] is an enum rather than a trait object so that publish, deliver and ack, which run
//! about a million times a second, dispatch statically (a match the compiler removes while there
//! is one variant) and a handle stays one pointer wide.

mod capabilities;
mod classic;
mod quorum;
mod stream;

pub use crate::queue_runtime::{ConsumerRemoval, ConsumerView, GetAnswer, QueueSnapshot, GET_PAGE_IN_ROUNDS_MAX};
pub use capabilities::{capabilities, check_server_named, QueueTypeCapabilities};
pub use classic::{is_queue_file_name, queue_file_name};
pub use classic::{ClassicStorage, ClassicStorageError, LazyRecovery, RecoveredLog, EXPIRY_DIRECTORY};
pub use quorum::QuorumStorage;
pub use storage::syncer::{Confirm as PendingConfirm, ConfirmSink};
pub use stream::{StreamReplicaSetup, StreamStorage};

use crate::policy::Policy;
use crate::queue_runtime::QueueRuntime;
use crate::quorum::{CommitSlot, QuorumQueue};
use crate::shared::{ChannelShared, ConsumerHandle};
use amqp_codec::ShortStr;
use broker_core::vhost::QueueDefinition;
use broker_core::{AmqpError, Message};
use std::sync::{Arc, Weak};
use storage::syncer::{SharedLog, Syncer};

/// A queue of any type, as the topology, the channels and the ledgers of deliveries hold it.
#[derive(Debug, Clone)]
pub enum Queue {
    /// A classic queue: one node, messages in memory and (durable, persistent ones) in its log.
    Classic(Arc<QueueRuntime>),
    /// A quorum queue: replicated through a Raft shard, its messages on a majority of the nodes.
    Quorum(Arc<QuorumQueue>),
    /// A stream queue: a replayable log that consumers read from an offset of their choice.
    Stream(Arc<crate::stream::StreamQueue>),
    /// A classic queue of another cluster node (see `cluster/remote_queue.rs`).
    Remote(Arc<crate::cluster::RemoteQueue>),
}

/// A queue that does not keep it alive: a connection whose writer was full remembers the queues
/// to wake when it drains, and must not keep a deleted queue in memory.
#[derive(Debug, Clone)]
pub enum WeakQueue {
    /// A classic queue.
    Classic(Weak<QueueRuntime>),
    /// A quorum queue.
    Quorum(Weak<QuorumQueue>),
    /// A stream queue.
    Stream(Weak<crate::stream::StreamQueue>),
}

/// What a confirm (and tx.commit) of a message accepted by one queue waits for.
#[derive(Debug)]
pub enum ConfirmTicket {
    /// Nothing: the message is transient, or the queue keeps no log.
    Immediate,
    /// A classic queue wrote the message to this log: confirmed once the log is fdatasynced.
    LogSynced(SharedLog),
    /// A quorum queue proposed the message: confirmed once the enqueue is committed (fdatasynced
    /// by a majority of its shard's members and applied), nacked if the queue refused it then.
    Committed(Arc<CommitSlot>),
    /// A stream queue appended the message to this stream: confirmed once the group commit has
    /// written, fdatasynced and committed it.
    StreamCommitted(storage::syncer::SharedStream),
}

/// What a queue did with a published message.
#[derive(Debug)]
pub enum PublishOutcome {
    /// The queue took it; a confirm waits for the ticket.
    Accepted(ConfirmTicket),
    /// The queue refused it (x-max-length with x-overflow reject-publish): a confirm is a nack.
    Rejected,
    /// The queue is gone or dropped the message at once, keeping and writing nothing; it counts
    /// as routed and is confirmed at once (RabbitMQ confirms a message its queue dropped).
    Dropped,
}

/// How a consumer (or basic.get) finished with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// basic.ack (or no-ack): the message is done.
    Ack,
    /// basic.reject, basic.nack or basic.recover with requeue: back to its place, redelivered
    /// (a quorum queue puts it at the back, as RabbitMQ 3.10's do).
    Requeue,
    /// The delivery's channel went away: back to its place, redelivered (quorum queues too).
    Return,
    /// basic.reject or basic.nack without requeue: the message is dead-lettered (reason
    /// `rejected`) when its queue has a dead-letter exchange, else dropped.
    Reject,
}

impl Settlement {
    /// The settlement a `requeue` flag asks for: none is an ack.
    pub fn from_requeue(requeue: Option<bool>) -> Settlement {
        match requeue {
            None => Settlement::Ack,
            Some(true) => Settlement::Requeue,
            Some(false) => Settlement::Reject,
        }
    }
}

/// The tickets of many publishes, waited for together: one group commit for a socket read's
/// worth of publishes, or for a transaction. Adding a ticket allocates only when it names a log
/// the batch has not seen (a batch holds each log once).
#[derive(Debug, Default)]
pub struct ConfirmTickets {
    logs: Vec<SharedLog>,
    /// Quorum commits, each with the delivery tag of its publish (0 outside confirm mode).
    slots: crate::quorum::tickets::Slots,
    /// The delivery tag of the publish whose tickets are being added.
    message_tag: u64,
    streams: Vec<storage::syncer::SharedStream>,
}

impl ConfirmTickets {
    /// Adds a ticket; returns whether it must be waited for (false for [`ConfirmTicket::Immediate`]).
    pub fn add(&mut self, ticket: ConfirmTicket) -> bool {
        match ticket {
            ConfirmTicket::Immediate => false,
            ConfirmTicket::LogSynced(log) => {
                if !self.logs.iter().any(|known| Arc::ptr_eq(known, &log)) {
                    self.logs.push(log);
                }
                true
            }
            ConfirmTicket::Committed(slot) => {
                self.slots.push((self.message_tag, slot));
                true
            }
            ConfirmTicket::StreamCommitted(stream) => {
                if !self.streams.iter().any(|known| Arc::ptr_eq(known, &stream)) {
                    self.streams.push(stream);
                }
                true
            }
        }
    }

    /// Names the publish whose tickets come next by its delivery tag, so a quorum queue's refusal
    /// nacks that publish's confirm only.
    pub fn set_message_tag(&mut self, delivery_tag: u64) {
        self.message_tag = delivery_tag;
    }

    /// Whether there is nothing to wait for.
    pub fn is_empty(&self) -> bool {
        self.logs.is_empty() && self.slots.is_empty() && self.streams.is_empty()
    }

    /// Sends `confirms` (in order, each acked or nacked) once every ticket is settled, in one group
    /// commit. Without confirms, the tickets are still made durable (a publish outside confirm
    /// mode is written and synced in the same group commit, only nobody is told).
    pub fn confirm_when_settled(self, syncer: &Syncer, confirms: Vec<PendingConfirm>) {
        if !self.slots.is_empty() {
            crate::quorum::ConfirmGate::new().confirm(syncer, self.slots, self.logs, self.streams, confirms);
            return;
        }
        if !self.streams.is_empty() {
            if confirms.is_empty() {
                syncer.sync_with_streams(self.logs, self.streams, None);
            } else {
                syncer.confirm_with_streams(self.logs, self.streams, confirms);
            }
            return;
        }
        if confirms.is_empty() {
            syncer.sync(self.logs, None);
        } else {
            syncer.confirm(self.logs, confirms);
        }
    }

    /// Calls `settled` with true once every ticket is settled, false if one failed (tx.commit, the
    /// management API's publish).
    pub fn when_settled(self, syncer: &Syncer, settled: Box<dyn FnOnce(bool) + Send>) {
        if !self.slots.is_empty() {
            crate::quorum::ConfirmGate::new().when_settled(syncer, self.slots, self.logs, self.streams, settled);
            return;
        }
        if !self.streams.is_empty() {
            syncer.sync_with_streams(self.logs, self.streams, Some(settled));
            return;
        }
        syncer.sync(self.logs, Some(settled));
    }

    /// [`ConfirmTickets::confirm_when_settled`] for a channel: its confirms leave in the order
    /// they came, so while earlier ones wait for a quorum commit, these wait behind them.
    pub fn confirm_in_order(self, channel: &ChannelShared, syncer: &Syncer, confirms: Vec<PendingConfirm>) {
        if self.slots.is_empty() && !channel.quorum_confirms.is_busy() {
            self.confirm_when_settled(syncer, confirms);
            return;
        }
        channel.quorum_confirms.confirm(syncer, self.slots, self.logs, self.streams, confirms);
    }

    /// [`ConfirmTickets::when_settled`] for a channel's tx.commit: commit-oks leave in order.
    pub fn when_settled_in_order(self, channel: &ChannelShared, syncer: &Syncer, settled: Box<dyn FnOnce(bool) + Send>) {
        if self.slots.is_empty() && !channel.quorum_confirms.is_busy() {
            self.when_settled(syncer, settled);
            return;
        }
        channel.quorum_confirms.when_settled(syncer, self.slots, self.logs, self.streams, settled);
    }
}

impl From<Arc<QueueRuntime>> for Queue {
    fn from(queue: Arc<QueueRuntime>) -> Queue {
        Queue::Classic(queue)
    }
}

impl From<&Arc<QueueRuntime>> for WeakQueue {
    fn from(queue: &Arc<QueueRuntime>) -> WeakQueue {
        WeakQueue::Classic(Arc::downgrade(queue))
    }
}

impl WeakQueue {
    /// The queue, if it still exists.
    pub fn upgrade(&self) -> Option<Queue> {
        match self {
            WeakQueue::Classic(queue) => queue.upgrade().map(Queue::Classic),
            WeakQueue::Quorum(queue) => queue.upgrade().map(Queue::Quorum),
            WeakQueue::Stream(queue) => queue.upgrade().map(Queue::Stream),
        }
    }

    /// Whether both name the same queue.
    pub fn same(&self, other: &WeakQueue) -> bool {
        match (self, other) {
            (WeakQueue::Classic(a), WeakQueue::Classic(b)) => Weak::ptr_eq(a, b),
            (WeakQueue::Quorum(a), WeakQueue::Quorum(b)) => Weak::ptr_eq(a, b),
            (WeakQueue::Stream(a), WeakQueue::Stream(b)) => Weak::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &ShortStr {
        match self {
            Queue::Classic(queue) => queue.name(),
            Queue::Quorum(queue) => queue.name(),
            Queue::Stream(queue) => queue.name(),
            Queue::Remote(queue) => queue.name(),
        }
    }

    /// What it was declared as.
    pub fn definition(&self) -> &QueueDefinition {
        match self {
            Queue::Classic(queue) => &queue.definition,
            Queue::Quorum(queue) => &queue.definition,
            Queue::Stream(queue) => &queue.definition,
            Queue::Remote(queue) => &queue.definition,
        }
    }

    /// What its type allows.
    pub fn capabilities(&self) -> &'static QueueTypeCapabilities {
        capabilities(self.definition().queue_type)
    }

    /// Whether both handles are the same queue.
    pub fn same(&self, other: &Queue) -> bool {
        match (self, other) {
            (Queue::Classic(a), Queue::Classic(b)) => Arc::ptr_eq(a, b),
            (Queue::Quorum(a), Queue::Quorum(b)) => Arc::ptr_eq(a, b),
            (Queue::Stream(a), Queue::Stream(b)) => Arc::ptr_eq(a, b),
            (Queue::Remote(a), Queue::Remote(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// An address that tells queues apart (for sets of queues without taking a reference).
    pub fn address(&self) -> *const () {
        match self {
            Queue::Classic(queue) => Arc::as_ptr(queue).cast(),
            Queue::Quorum(queue) => Arc::as_ptr(queue).cast(),
            Queue::Stream(queue) => Arc::as_ptr(queue).cast(),
            Queue::Remote(queue) => Arc::as_ptr(queue).cast(),
        }
    }

    /// Enqueues a message and delivers what it can.
    #[inline]
    pub fn publish(&self, message: Arc<Message>) -> PublishOutcome {
        match self {
            Queue::Classic(queue) => classic::publish(queue, message),
            Queue::Quorum(queue) => queue.publish(message),
            Queue::Stream(queue) => stream::publish(queue, &message),
            Queue::Remote(queue) => {
                queue.refuse_publish();
                PublishOutcome::Rejected
            }
        }
    }

    /// Delivers what consumers can take now (after a consumer's prefetch or its writer freed up).
    pub fn dispatch(&self) {
        match self {
            Queue::Classic(queue) => queue.dispatch(),
            Queue::Quorum(queue) => queue.dispatch(),
            Queue::Stream(queue) => queue.wake_consumers(),
            Queue::Remote(_) => {}
        }
    }

    /// Settles deliveries of this queue: acked, put back to be delivered again, or rejected
    /// (dead-lettered). `deliveries` are the ids the queue gave them (the `position` of a
    /// [`crate::shared::Unacked`]).
    #[inline]
    pub fn settle(&self, deliveries: &[u64], settlement: Settlement) {
        match self {
            Queue::Classic(queue) => queue.finish_deliveries(deliveries, settlement),
            Queue::Quorum(queue) => queue.settle(deliveries, settlement),
            // Acks move a stream consumer's credit only; a stream has nothing to requeue or
            // dead-letter (nack and reject are refused before they get here).
            Queue::Stream(queue) => queue.settle(deliveries.len()),
            Queue::Remote(_) => {}
        }
    }

    /// basic.get: the first ready message as get-ok, tracked on the channel's ledger unless
    /// `no_ack`; or get-empty; or, when the ready messages are still on disk, ask again after
    /// [`Queue::wait_for_page_in`].
    pub fn get(&self, channel: &Arc<ChannelShared>, no_ack: bool) -> GetAnswer {
        match self {
            Queue::Classic(queue) => queue.get(channel, no_ack),
            Queue::Quorum(queue) => queue.get(channel, no_ack),
            // Refused by the type's capabilities before it gets here.
            Queue::Stream(_) => GetAnswer::Empty,
            Queue::Remote(_) => GetAnswer::Empty,
        }
    }

    /// Waits, without blocking the thread, until the messages a basic.get found on disk were
    /// read (or a while passed); returns at once when no read is under way.
    pub async fn wait_for_page_in(&self) {
        match self {
            Queue::Classic(queue) => queue.wait_for_page_in().await,
            Queue::Quorum(queue) => queue.wait_for_answer().await,
            Queue::Stream(_) => {}
            Queue::Remote(_) => {}
        }
    }

    /// basic.consume: adds a consumer, whose channel is its delivery sink. `accepted` runs once the
    /// queue took it and before its first delivery (it sends consume-ok).
    pub fn consume(&self, consumer: Arc<ConsumerHandle>, exclusive: bool, accepted: impl FnOnce()) -> Result<(), AmqpError> {
        match self {
            Queue::Classic(queue) => queue.add_consumer(consumer, exclusive, accepted),
            Queue::Quorum(queue) => queue.consume(consumer, exclusive, accepted),
            Queue::Stream(queue) => queue.add_consumer(consumer, storage::stream::OffsetSpec::Next, accepted),
            Queue::Remote(queue) => Err(queue.refusal()),
        }
    }

    /// basic.consume with the consumer's `x-stream-offset` (which only stream queues read).
    pub fn consume_from(
        &self,
        consumer: Arc<ConsumerHandle>,
        exclusive: bool,
        offset: storage::stream::OffsetSpec,
        accepted: impl FnOnce(),
    ) -> Result<(), AmqpError> {
        match self {
            Queue::Stream(queue) => queue.add_consumer(consumer, offset, accepted),
            _ => self.consume(consumer, exclusive, accepted),
        }
    }

    /// The stream queue this is, if it is one (the channel refuses what streams cannot do).
    pub fn as_stream(&self) -> Option<&Arc<crate::stream::StreamQueue>> {
        match self {
            Queue::Stream(queue) => Some(queue),
            _ => None,
        }
    }

    /// basic.cancel, or the consumer's channel closed.
    pub fn cancel(&self, consumer: &Arc<ConsumerHandle>) -> ConsumerRemoval {
        match self {
            Queue::Classic(queue) => queue.remove_consumer(consumer),
            Queue::Quorum(queue) => queue.cancel(consumer),
            Queue::Stream(queue) => queue.remove_consumer(consumer),
            Queue::Remote(_) => ConsumerRemoval::NotFound,
        }
    }

    /// queue.declare of an existing queue (also passive): renews its x-expires lease.
    pub fn mark_used(&self) {
        match self {
            Queue::Classic(queue) => queue.mark_used(),
            Queue::Quorum(queue) => queue.redeclared(),
            Queue::Stream(_) => {}
            Queue::Remote(_) => {}
        }
    }

    /// Ready messages and active consumers (declare-ok, delete's if-empty and if-unused).
    pub fn counts(&self) -> (u32, u32) {
        match self {
            Queue::Classic(queue) => queue.counts(),
            Queue::Quorum(queue) => queue.counts(),
            // RabbitMQ 3.10.8 answers a stream's declare-ok with no consumers, whatever it has.
            Queue::Stream(queue) => (queue.message_count().min(u64::from(u32::MAX)) as u32, 0),
            Queue::Remote(_) => (0, 0),
        }
    }

    /// Drops the ready messages; returns how many.
    pub fn purge(&self) -> u32 {
        match self {
            Queue::Classic(queue) => queue.purge(),
            Queue::Quorum(queue) => queue.purge(),
            // Refused before it gets here (540, as RabbitMQ).
            Queue::Stream(_) => 0,
            Queue::Remote(_) => 0,
        }
    }

    /// Deletes the queue's messages (and its log) and hands back its ready count and its
    /// consumers, to tell of the cancel.
    pub fn delete(&self) -> (u32, Vec<Arc<ConsumerHandle>>) {
        match self {
            Queue::Classic(queue) => queue.delete(),
            Queue::Quorum(queue) => queue.delete(),
            Queue::Stream(queue) => queue.delete(),
            Queue::Remote(_) => (0, Vec::new()),
        }
    }

    /// Applies the policy that now matches the queue (or none).
    pub fn apply_policy(&self, policy: Option<Arc<Policy>>) {
        match self {
            Queue::Classic(queue) => queue.apply_policy(policy),
            Queue::Quorum(queue) => queue.apply_policy(policy),
            Queue::Stream(queue) => queue.apply_policy(policy),
            Queue::Remote(queue) => *queue.policy.lock() = policy,
        }
    }

    /// Its own consumer timeout (x-consumer-timeout or the policy's), if it has one.
    pub fn consumer_timeout_ms(&self) -> Option<u64> {
        match self {
            Queue::Classic(queue) => queue.consumer_timeout_ms(),
            Queue::Quorum(queue) => queue.consumer_timeout_ms(),
            Queue::Stream(_) => None,
            Queue::Remote(_) => None,
        }
    }

    /// The policy that applies to it.
    pub fn policy(&self) -> Option<Arc<Policy>> {
        match self {
            Queue::Classic(queue) => queue.policy(),
            Queue::Quorum(queue) => queue.policy(),
            Queue::Stream(queue) => queue.policy(),
            Queue::Remote(queue) => queue.policy.lock().clone(),
        }
    }

    /// Its counts and totals, for management and metrics.
    pub fn snapshot(&self) -> QueueSnapshot {
        match self {
            Queue::Classic(queue) => queue.snapshot(),
            Queue::Quorum(queue) => queue.snapshot(),
            Queue::Stream(queue) => queue.snapshot(),
            Queue::Remote(_) => QueueSnapshot::default(),
        }
    }

    /// Its counts and totals when they may have changed since the management sampler last took
    /// them (see `management/rates.rs`); `None` for a classic queue no command touched since.
    /// Other queue types are sampled every time.
    pub fn sample_if_changed(&self) -> Option<QueueSnapshot> {
        match self {
            Queue::Classic(queue) => queue.sample_if_changed(),
            Queue::Quorum(queue) => queue.sample_if_changed(),
            _ => Some(self.snapshot()),
        }
    }

    /// Whether [`Queue::sample_if_changed`] may find something, without taking any lock.
    pub fn changed_since_sample(&self) -> bool {
        match self {
            Queue::Classic(queue) => queue.changed_since_sample(),
            Queue::Quorum(queue) => queue.changed_since_sample(),
            _ => true,
        }
    }

    /// A quorum queue's held dead letters, for management.
    pub fn held_dead_letters(&self) -> Option<crate::quorum::HeldDeadLetterFigures> {
        match self {
            Queue::Quorum(queue) => Some(queue.held_dead_letters()),
            _ => None,
        }
    }

    /// Where a replicated queue's replicas are (leader, members, online), for management.
    pub fn replicas(&self) -> Option<crate::quorum::ReplicaInfo> {
        match self {
            Queue::Classic(_) => None,
            Queue::Quorum(queue) => queue.replicas(),
            Queue::Stream(_) | Queue::Remote(_) => None,
        }
    }

    /// Its active consumers, for management.
    pub fn consumer_views(&self) -> Vec<ConsumerView> {
        match self {
            Queue::Classic(queue) => queue.consumer_views(),
            Queue::Quorum(queue) => queue.consumer_views(),
            Queue::Stream(queue) => queue.consumer_views(),
            Queue::Remote(_) => Vec::new(),
        }
    }

    /// The node holding the queue, when another node of the cluster does.
    pub fn home_node(&self) -> Option<&str> {
        match self {
            Queue::Remote(queue) => Some(&queue.home_name),
            _ => None,
        }
    }

    /// Refuses an operation that needs the queue's messages on this node (basic.get, purge) when
    /// they are on another node's.
    pub fn check_local(&self) -> Result<(), AmqpError> {
        match self {
            Queue::Remote(queue) => Err(queue.refusal()),
            _ => Ok(()),
        }
    }

    /// The log holding its durable state, which a graceful shutdown writes and syncs.
    pub fn durable_log(&self) -> Option<&SharedLog> {
        match self {
            Queue::Classic(queue) => queue.log(),
            Queue::Quorum(_) => None,
            Queue::Stream(_) => None,
            Queue::Remote(_) => None,
        }
    }

    /// The log of its deduplication cache, when it deduplicates and the cache persists: a
    /// confirm waits for it too, and a graceful shutdown syncs it.
    pub fn deduplication_log(&self) -> Option<SharedLog> {
        match self {
            Queue::Classic(queue) => queue.deduplication().and_then(|cache| cache.log().cloned()),
            Queue::Stream(_) | Queue::Quorum(_) | Queue::Remote(_) => None,
        }
    }
}

#[cfg(test)]
mod tests;
