//! One quorum queue on this node: what the channels, the broker and management call (through
//! `queue_type::Queue::Quorum`), turned into replicated commands for the queue's shard, and the
//! node's own part of the delivery plan: its consumers, their held deliveries, its basic.gets.
//!
//! The queue's messages live in the shard's state machine (on every member); this node keeps
//! its local consumers and the figures the shard thread publishes after each commit.

use super::shard::{Completion, ShardHandle, ShardInput, Submission, Waiter};
use super::tickets::CommitSlot;
use super::{block_outside_runtime, envelope};
use crate::dead_letter::deadlines::{DeadlineKey, DeadlineQueue};
use crate::dead_letter::{DeadLetter, DeadLetterBatch, DeadLetterSource};
use crate::policy::Policy;
use crate::queue_runtime::{ConsumerRemoval, ConsumerView, ExpiryCheck, ExpiryClock, GetAnswer, QueueLimits, QueueSnapshot, QueueStats};
use crate::queue_type::{ConfirmTicket, PublishOutcome, Settlement};
use crate::shared::{ChannelShared, ConsumerHandle, Outbound, OUTBOUND_DELIVERIES_MAX};
use amqp_codec::ShortStr;
use broker_core::exchange::deduplication::DeduplicationSettings;
use broker_core::vhost::QueueDefinition;
use broker_core::{AmqpError, Message};
use bytes::Bytes;
use parking_lot::Mutex;
use queue_core::{DeadLetterReason, Reply};
use replication::command::{QueueCommand, QueueId};
use replication::state_machine::CommandResult;
use replication::state_machine::{HeldDeadLetters, QueueStateMachine};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The credit a consumer without a prefetch limit gets from a quorum queue: RabbitMQ's quorum
/// queues give such consumers a credit of 2000 too, so the plan never hands a whole backlog to one.
pub const UNLIMITED_PREFETCH_CREDIT: u32 = 2000;

/// How long a declare, consume, purge or delete waits for its commit before it is answered with
/// an error (a shard without a leader: no majority of the cluster is up).
pub const COMMIT_WAIT_MAX: Duration = Duration::from_secs(30);

/// How long one round of a basic.get waits for its answer.
pub const GET_WAIT_MAX: Duration = Duration::from_secs(5);

/// Why a quorum queue refused.
#[derive(Debug, thiserror::Error)]
pub enum QuorumQueueError {
    /// The command was not committed in time (no leader, no majority).
    #[error("timeout waiting for the quorum queue's shard to commit")]
    Timeout,
}

/// A message the plan handed to a local consumer that cannot take it yet (channel flow, a full
/// writer, consume-ok not sent yet): it waits here, in plan order.
#[derive(Debug)]
struct HeldDelivery {
    position: u64,
    redelivered: bool,
    delivery_count: u32,
    body: Bytes,
}

#[derive(Debug)]
struct LocalConsumer {
    handle: Arc<ConsumerHandle>,
    /// consume-ok was sent: deliveries may follow.
    accepted: bool,
    held: VecDeque<HeldDelivery>,
}

/// A basic.get's state per channel: asked, then answered.
#[derive(Debug)]
enum GetState {
    Asked,
    Answered(Option<Outbound>),
}

#[derive(Debug, Default)]
struct Local {
    next_consumer: u64,
    consumers: BTreeMap<u64, LocalConsumer>,
    /// basic.gets by the address of their channel.
    gets: HashMap<usize, GetState>,
    /// Positions the plan handed to this node's consumers (held, sent, or acked by the client)
    /// whose settle, requeue or reject the shard has not taken yet. A node that installed a
    /// snapshot performs the plan's deliveries it skipped: those it finds checked out to its
    /// consumers and not here (`QuorumQueue::was_handed`).
    handed: HashSet<u64>,
}

/// The queue's counts as of the last commit this node applied.
#[derive(Debug, Default)]
struct Figures {
    ready: AtomicU64,
    unacked: AtomicU64,
    consumers: AtomicU64,
    published: AtomicU64,
    delivered: AtomicU64,
    acked: AtomicU64,
    requeued: AtomicU64,
    ready_bytes: AtomicU64,
    unacked_bytes: AtomicU64,
    dead_letters_held: AtomicU64,
    dead_letter_bytes_held: AtomicU64,
    /// With x-single-active-consumer, this node's name for the consumer getting the messages,
    /// plus one; 0 when there is none or it is another node's.
    single_active_consumer: AtomicU64,
    /// Whether a commit changed them since the management sampler last read them.
    changed_since_sample: AtomicBool,
}

/// What became of a delivery the plan made to one of this node's consumers.
pub(crate) enum LocalDelivery {
    /// Sent (or held for later).
    Taken,
    /// Sent to a consumer without acks: the shard settles it.
    SettleNow,
    /// Its channel closed meanwhile: it goes back to the queue.
    Requeue,
}

/// What a dispatch sent but could not leave with its consumer: positions to settle now (sent to
/// a consumer without acks) and positions to give back (the channel closed meanwhile).
#[derive(Debug, Default)]
pub(crate) struct Dispatched {
    pub settle: Vec<u64>,
    pub requeue: Vec<u64>,
}

/// The id of a queue whose declaration was superseded: no machine's (ids are assigned from the
/// entry index up, far below it).
pub(crate) const SUPERSEDED_QUEUE_ID: QueueId = u64::MAX;

/// A redeclare proposes a `Touch` at most once per this fraction of the queue's x-expires.
const TOUCHES_PER_LEASE: u64 = 10;

/// A quorum queue on this node.
pub struct QuorumQueue {
    /// Fixed properties.
    pub definition: QueueDefinition,
    /// The vhost's name.
    pub vhost: String,
    /// vhost, 0, name: the key the shard's machine knows the queue by.
    name_key: Bytes,
    shard: Arc<ShardHandle>,
    host: Weak<super::QuorumHost>,
    /// The machine's id for it (0 until its declaration is committed or found;
    /// [`SUPERSEDED_QUEUE_ID`] when its declaration came after a later one of its name).
    id: AtomicU64,
    /// Which declaration of its name it is: in a cluster, the metadata log index of its
    /// declaration (0: unordered, a single node's).
    incarnation: u64,
    figures: Figures,
    local: Mutex<Local>,
    limits: Mutex<QueueLimits>,
    deleted: AtomicBool,
    dead_letter_source: Arc<DeadLetterSource>,
    /// Woken when a basic.get was answered.
    answered: tokio::sync::Notify,
    self_reference: Weak<QuorumQueue>,
    /// When the head expires, as the last commit this node applied left it (0: never).
    head_expires_at_ms: AtomicU64,
    /// Where the queue tells when its head expires, and the deadline the worker holds for it.
    dead_letters: Option<crate::dead_letter::DeadLetterSender>,
    expiry_deadline: Mutex<crate::dead_letter::ExpiryDeadline>,
    /// x-expires: the last use, and when the queue is deleted unused. A use is a consumer
    /// anywhere in the cluster (the replicated count), or a basic.get or redeclare on this node.
    expiry: Mutex<ExpiryClock>,
    /// When this node last proposed a `Touch` (a redeclare), in ms since the epoch.
    touched_at_ms: AtomicU64,
    /// Held by whoever takes deliveries off the local consumers' `held` and sends them, so two
    /// threads (the shard's, a connection's) never send one consumer's deliveries out of order.
    dispatching: Mutex<()>,
    /// Held dead letters this node published as the shard's leader and has not settled yet, by
    /// position, with when they were published (published again after the retry interval).
    dead_letters_in_flight: Mutex<HashMap<u64, u64>>,
    /// With x-message-deduplication, how its messages' keys are read (the cache itself is in the
    /// replicated state, `replication::state_machine::deduplication`).
    deduplication: Option<DeduplicationSettings>,
}

impl std::fmt::Debug for QuorumQueue {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("QuorumQueue").field("name", &self.definition.name).field("id", &self.id()).finish()
    }
}

/// The key a queue is known by in its shard.
pub(crate) fn name_key(vhost: &str, name: &ShortStr) -> Bytes {
    let mut key = Vec::with_capacity(vhost.len() + 1 + name.len());
    key.extend_from_slice(vhost.as_bytes());
    key.push(0);
    key.extend_from_slice(name.as_bytes());
    Bytes::from(key)
}

/// The limits a quorum queue replicates. RabbitMQ 3.10.8's quorum queues treat x-overflow
/// reject-publish-dlx as drop-head (measured: the oldest messages are dead-lettered, every publish
/// confirmed).
fn replicated_limits(limits: &QueueLimits) -> queue_core::Limits {
    let mut core = limits.core_limits();
    if limits.overflow == Some(broker_core::vhost::Overflow::RejectPublishDeadLetter) {
        core.overflow = queue_core::Overflow::DropHead;
    }
    core.dead_letter_at_least_once = core.dead_letters && limits.dead_letter_at_least_once;
    core
}

/// At least once needs reject-publish (a queue that drops its head to take a publish cannot
/// keep what it drops): otherwise RabbitMQ falls back to at most once and logs it; so does this.
fn log_strategy_fallback(limits: &queue_core::Limits, queue: &ShortStr, vhost: &str) {
    if limits.dead_letter_at_least_once && !replication::state_machine::holds_dead_letters(limits) {
        tracing::warn!(
            "Falling back to dead-letter-strategy at-most-once for queue '{}' in vhost '{vhost}' because configured \
             dead-letter-strategy at-least-once is incompatible with effective queue overflow behaviour drop-head",
            queue
        );
    }
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    crate::queue_runtime::now_ms()
}

impl QuorumQueue {
    fn new(definition: QueueDefinition, vhost: &str, host: &super::QuorumHost, expiry: ExpiryClock, incarnation: u64) -> Arc<QuorumQueue> {
        let name_key = name_key(vhost, &definition.name);
        let shard = host.shard_for(&name_key).clone();
        let dead_letters = host.dead_letters().cloned();
        let host = host.self_reference();
        let limits = QueueLimits::new(&definition.arguments, None);
        let deduplication = broker_core::exchange::deduplication::settings(&definition.arguments, false);
        Arc::new_cyclic(|self_reference: &Weak<QuorumQueue>| QuorumQueue {
            dead_letter_source: Arc::new(DeadLetterSource {
                vhost: vhost.to_string(),
                queue: definition.name.clone(),
                log: None,
                quorum: Some(self_reference.clone()),
            }),
            definition,
            vhost: vhost.to_string(),
            name_key,
            shard,
            host,
            id: AtomicU64::new(0),
            incarnation,
            // Sampled once when made, as every queue is (the sampler counts on it).
            figures: Figures { changed_since_sample: AtomicBool::new(true), ..Figures::default() },
            local: Mutex::new(Local::default()),
            limits: Mutex::new(limits),
            deleted: AtomicBool::new(false),
            answered: tokio::sync::Notify::new(),
            self_reference: self_reference.clone(),
            head_expires_at_ms: AtomicU64::new(0),
            dead_letters,
            expiry_deadline: Mutex::new(crate::dead_letter::ExpiryDeadline::default()),
            expiry: Mutex::new(expiry),
            touched_at_ms: AtomicU64::new(0),
            dispatching: Mutex::new(()),
            dead_letters_in_flight: Mutex::new(HashMap::new()),
            deduplication,
        })
    }

    /// A newly declared queue: its declaration is proposed now; commands sent before it is
    /// committed wait for it in the shard (one proposer's commands are applied in order).
    pub fn declare(
        definition: QueueDefinition,
        vhost: &str,
        host: &super::QuorumHost,
        expiry: ExpiryClock,
        incarnation: u64,
    ) -> Arc<QuorumQueue> {
        let queue = QuorumQueue::new(definition, vhost, host, expiry, incarnation);
        queue.submit(queue.declaration(), Waiter::Nothing);
        queue
    }

    /// A queue found in the definitions at start: the shard finds it by name once its log is
    /// applied (declaring it afresh if the shard lost it).
    pub fn recover(
        definition: QueueDefinition,
        vhost: &str,
        host: &super::QuorumHost,
        expiry: ExpiryClock,
        incarnation: u64,
    ) -> Arc<QuorumQueue> {
        let queue = QuorumQueue::new(definition, vhost, host, expiry, incarnation);
        queue.shard.send(ShardInput::Recovered(queue.clone()));
        queue
    }

    /// Its declaration, as the shard's machine takes it.
    pub(crate) fn declaration(&self) -> QueueCommand {
        let limits = replicated_limits(&self.limits.lock());
        log_strategy_fallback(&limits, &self.definition.name, &self.vhost);
        let single_active_consumer = crate::queue_runtime::single_active_consumer(&self.definition.arguments);
        QueueCommand::Declare { name: self.name_key.clone(), incarnation: self.incarnation, limits, single_active_consumer }
    }

    /// Whether the machine's queue of its name, of incarnation `incarnation`, is this one.
    pub(crate) fn is_incarnation(&self, incarnation: u64) -> bool {
        self.incarnation == 0 || incarnation == 0 || self.incarnation == incarnation
    }

    /// The key its shard knows it by.
    pub(crate) fn name_key(&self) -> &Bytes {
        &self.name_key
    }

    /// The queue's name.
    pub fn name(&self) -> &ShortStr {
        &self.definition.name
    }

    /// The machine's id (0: not known yet).
    pub fn id(&self) -> QueueId {
        self.id.load(Ordering::Acquire)
    }

    pub(crate) fn set_id(&self, id: QueueId) {
        self.id.store(id, Ordering::Release);
    }

    /// Its declaration came after a later one of its name (the cluster deleted it meanwhile):
    /// what it is sent from now on names no queue, and is answered as a deleted queue's is.
    pub(crate) fn mark_superseded(&self) {
        self.id.store(SUPERSEDED_QUEUE_ID, Ordering::Release);
    }

    /// Whether this node leads the queue's shard.
    pub fn leads(&self) -> bool {
        self.shard.figures.is_leader.load(Ordering::Relaxed)
    }

    /// Where its replicas are, for management.
    pub fn replicas(&self) -> Option<super::ReplicaInfo> {
        self.host.upgrade().map(|host| host.replica_info(&self.shard))
    }

    fn strong(&self) -> Arc<QuorumQueue> {
        self.self_reference.upgrade().expect("a queue's methods run while a handle holds it")
    }

    fn submit(&self, command: QueueCommand, waiter: Waiter) {
        self.shard.submit(Submission { queue: self.strong(), command, waiter });
    }

    /// Sends `command` and blocks (off the async workers' backs) until it is committed.
    fn commit_and_wait(&self, command: QueueCommand) -> Result<CommandResult, QuorumQueueError> {
        let completion = Completion::new();
        self.submit(command, Waiter::Completion(completion.clone()));
        block_outside_runtime(|| completion.wait(COMMIT_WAIT_MAX)).ok_or(QuorumQueueError::Timeout)
    }

    /// Enqueues a message: confirmed once the enqueue is committed.
    pub fn publish(&self, message: Arc<Message>) -> PublishOutcome {
        if self.deleted.load(Ordering::Acquire) {
            return PublishOutcome::Dropped;
        }
        let persistent = message.is_persistent();
        let own_ttl_ms = crate::queue_runtime::own_ttl_ms(&message);
        let body = envelope::encode(&message);
        let deduplication = self
            .deduplication
            .as_ref()
            .and_then(|settings| crate::dedup::key_of(settings, &message).map(|key| key.into_replicated(settings.cache_size)));
        let slot = CommitSlot::new();
        self.submit(QueueCommand::Enqueue { persistent, own_ttl_ms, body, deduplication }, Waiter::Publish(slot.clone()));
        PublishOutcome::Accepted(ConfirmTicket::Committed(slot))
    }

    /// Holds a delayed message in the cluster's delay store (this queue is the store's): confirmed
    /// once committed, nacked when the store is full.
    pub fn hold_delayed(&self, due_ms: u64, origin: u64, body: Bytes) -> ConfirmTicket {
        let slot = CommitSlot::new();
        self.submit(QueueCommand::HoldDelayed { due_ms, origin, body }, Waiter::Publish(slot.clone()));
        ConfirmTicket::Committed(slot)
    }

    /// Forgets delayed messages routed into queues that hold them.
    pub fn release_delayed(&self, ids: &[u64]) {
        let queue = self.strong();
        let submissions = ids
            .iter()
            .map(|&id| Submission { queue: queue.clone(), command: QueueCommand::ReleaseDelayed { id }, waiter: Waiter::Nothing })
            .collect();
        self.shard.send(ShardInput::SubmitMany(submissions));
    }

    /// Makes this queue's shard fire the due messages of the delay store this queue holds;
    /// `held` counts what the store holds, as this node applied it.
    pub(crate) fn fire_delayed_through(&self, fire: std::sync::mpsc::SyncSender<super::shard::delayed::DueDelayed>, held: Arc<AtomicU64>) {
        let hook = super::shard::delayed::DelayedHook { queue: self.strong(), fire, firing: HashMap::new(), held };
        self.shard.send(ShardInput::Delayed(hook));
    }

    /// Settles, requeues or rejects deliveries (replicated; nothing waits for the commit).
    pub fn settle(&self, positions: &[u64], settlement: Settlement) {
        let queue = self.strong();
        let submissions = positions
            .iter()
            .map(|&position| {
                let command = match settlement {
                    Settlement::Ack => QueueCommand::Settle { position },
                    Settlement::Requeue => QueueCommand::RequeueToTail { position },
                    Settlement::Return => QueueCommand::Requeue { position },
                    Settlement::Reject => QueueCommand::Reject { position },
                };
                Submission { queue: queue.clone(), command, waiter: Waiter::Nothing }
            })
            .collect();
        self.shard.send(ShardInput::SubmitMany(submissions));
    }

    /// basic.consume: the consumer is added once its command is committed; `accepted` (consume-ok)
    /// runs before any delivery to it. RabbitMQ 3.10.8's quorum queues take an exclusive consume
    /// and ignore its exclusivity (measured: a second consumer is accepted either way); so does this.
    pub fn consume(&self, consumer: Arc<ConsumerHandle>, _exclusive: bool, accepted: impl FnOnce()) -> Result<(), AmqpError> {
        let prefetch = match (consumer.no_ack, consumer.prefetch) {
            (true, _) | (false, 0) => UNLIMITED_PREFETCH_CREDIT,
            (false, prefetch) => prefetch,
        };
        let priority = consumer.priority;
        let local = {
            let mut local = self.local.lock();
            local.next_consumer += 1;
            let id = local.next_consumer;
            local.consumers.insert(id, LocalConsumer { handle: consumer, accepted: false, held: VecDeque::new() });
            id
        };
        let result = self.commit_and_wait(QueueCommand::AddConsumer { consumer: local, priority, prefetch });
        match result {
            Ok(CommandResult::Core(Reply::Ok)) => {
                accepted();
                let mut local_state = self.local.lock();
                if let Some(entry) = local_state.consumers.get_mut(&local) {
                    entry.accepted = true;
                }
                drop(local_state);
                self.dispatch();
                Ok(())
            }
            other => {
                self.local.lock().consumers.remove(&local);
                // The add may still be committed later: cancel it too.
                self.submit(QueueCommand::CancelConsumer { consumer: local }, Waiter::Nothing);
                Err(match other {
                    Ok(CommandResult::NoSuchQueue) => AmqpError::no_queue(&self.name().to_string_lossy(), &self.vhost),
                    _ => AmqpError::internal(format!("timeout waiting for the quorum queue '{}' to add the consumer", self.name())),
                })
            }
        }
    }

    /// basic.cancel, or the consumer's channel closed. Messages the plan handed it that it never
    /// got go back to the queue.
    pub fn cancel(&self, consumer: &Arc<ConsumerHandle>) -> ConsumerRemoval {
        let removed = {
            let mut local = self.local.lock();
            let found = local.consumers.iter().find(|(_, entry)| Arc::ptr_eq(&entry.handle, consumer)).map(|(id, _)| *id);
            found.and_then(|id| local.consumers.remove(&id).map(|entry| (id, entry)))
        };
        let Some((id, entry)) = removed else {
            return ConsumerRemoval::NotFound;
        };
        let queue = self.strong();
        let mut submissions =
            vec![Submission { queue: queue.clone(), command: QueueCommand::CancelConsumer { consumer: id }, waiter: Waiter::Nothing }];
        submissions.extend(entry.held.into_iter().map(|held| Submission {
            queue: queue.clone(),
            command: QueueCommand::Requeue { position: held.position },
            waiter: Waiter::Nothing,
        }));
        self.shard.send(ShardInput::SubmitMany(submissions));
        ConsumerRemoval::Removed
    }

    /// basic.get: proposed, then answered by the shard's thread (which puts the delivery on the
    /// channel's ledger); the connection waits with [`QuorumQueue::wait_for_answer`] and asks again.
    pub fn get(&self, channel: &Arc<ChannelShared>, no_ack: bool) -> GetAnswer {
        let key = Arc::as_ptr(channel) as usize;
        let mut local = self.local.lock();
        match local.gets.remove(&key) {
            Some(GetState::Answered(Some(get_ok))) => return GetAnswer::Message(get_ok),
            Some(GetState::Answered(None)) => return GetAnswer::Empty,
            Some(GetState::Asked) => {
                local.gets.insert(key, GetState::Asked);
                return GetAnswer::PageInPending;
            }
            None => {}
        }
        local.gets.insert(key, GetState::Asked);
        let idle = local.consumers.is_empty() && self.figures.consumers.load(Ordering::Relaxed) == 0;
        drop(local);
        // A basic.get is a use (once per get, not per retry while it waits for its answer).
        self.expiry.lock().used(now_ms(), idle);
        let request = GetRequest { queue: self.self_reference.clone(), channel: channel.clone(), no_ack };
        self.submit(QueueCommand::Get { no_ack }, Waiter::Get(request));
        GetAnswer::PageInPending
    }

    /// Waits until a basic.get of this queue was answered (or a while passed).
    pub async fn wait_for_answer(&self) {
        let answered = self.answered.notified();
        tokio::pin!(answered);
        answered.as_mut().enable();
        if !self.local.lock().gets.values().any(|state| matches!(state, GetState::Asked)) {
            return;
        }
        let _ = tokio::time::timeout(GET_WAIT_MAX, answered).await;
    }

    /// The shard's answer to a basic.get: the message goes on the channel's ledger (unless
    /// no-ack) and the get-ok waits for the connection; `None` when the channel is gone and the
    /// message must go back.
    pub(crate) fn answer_get(&self, request: &GetRequest, result: &CommandResult) -> Option<u64> {
        let key = Arc::as_ptr(&request.channel) as usize;
        let (answer, give_back) = match result {
            CommandResult::Got { position, redelivered, delivery_count, message_count, body } => {
                match self.get_ok(request, *position, *redelivered, *delivery_count, *message_count, body) {
                    Some(get_ok) => (Some(get_ok), None),
                    None => (None, (!request.no_ack).then_some(*position)),
                }
            }
            _ => (None, None),
        };
        self.local.lock().gets.insert(key, GetState::Answered(answer));
        self.answered.notify_waiters();
        give_back
    }

    fn get_ok(
        &self,
        request: &GetRequest,
        position: u64,
        redelivered: bool,
        delivery_count: u32,
        message_count: u64,
        body: &Bytes,
    ) -> Option<Outbound> {
        // basic.get's message always carries x-delivery-count, 0 included (RabbitMQ 3.10.8, measured).
        let message = self.message(body, Some(delivery_count))?;
        let channel = &request.channel;
        let mut ledger = channel.ledger.lock();
        if !ledger.open {
            return None;
        }
        ledger.last_tag += 1;
        let delivery_tag = ledger.last_tag;
        ledger.counters.count_delivery(true, request.no_ack, redelivered);
        if !request.no_ack {
            ledger.track(delivery_tag, crate::queue_type::Queue::Quorum(self.strong()), position, None);
        }
        let message_count = message_count.min(u64::from(u32::MAX)) as u32;
        Some(Outbound::GetOk { channel: channel.id, delivery_tag, redelivered, message_count, message })
    }

    /// The replicated message, with the `x-delivery-count` header when `delivery_count` says.
    fn message(&self, body: &Bytes, delivery_count: Option<u32>) -> Option<Arc<Message>> {
        match envelope::decode(body) {
            Ok(message) if delivery_count.is_some() => {
                Some(crate::dead_letter::message::with_delivery_count(&message, delivery_count.unwrap_or(0)))
            }
            Ok(message) => Some(message),
            Err(error) => {
                tracing::error!(queue = %self.name(), %error, "a replicated message does not decode; it is dropped");
                None
            }
        }
    }
}

/// A basic.get waiting for its commit.
pub(crate) struct GetRequest {
    queue: Weak<QuorumQueue>,
    channel: Arc<ChannelShared>,
    no_ack: bool,
}

impl GetRequest {
    /// The get will not be answered by a commit: it is answered get-empty.
    pub(crate) fn fail(self) {
        if let Some(queue) = self.queue.upgrade() {
            queue.answer_get(&self, &CommandResult::NoSuchQueue);
        }
    }

    /// The queue it reads.
    pub(crate) fn queue(&self) -> Option<Arc<QuorumQueue>> {
        self.queue.upgrade()
    }
}

impl QuorumQueue {
    /// The plan hands a message to local consumer `consumer`: it joins the consumer's `held`
    /// deliveries, which are sent now if the consumer can take them (`None`: held for later), or
    /// the consumer is gone (`Err`: the shard requeues it and cancels the consumer).
    ///
    /// Every delivery goes through `held` and only [`QuorumQueue::dispatch_now`] sends: a delivery
    /// sent straight from here could overtake one a connection's dispatch had just taken off
    /// `held` and not sent yet, and a publisher's messages would reach the consumer out of order.
    pub(crate) fn deliver_local(
        &self,
        consumer: u64,
        position: u64,
        redelivered: bool,
        delivery_count: u32,
        body: Bytes,
    ) -> Result<Option<Dispatched>, u64> {
        {
            let mut local = self.local.lock();
            let local = &mut *local;
            let Some(entry) = local.consumers.get_mut(&consumer) else {
                return Err(consumer);
            };
            local.handed.insert(position);
            entry.held.push_back(HeldDelivery { position, redelivered, delivery_count, body });
            if !entry.accepted {
                return Ok(None);
            }
            if !can_send(&entry.handle) {
                entry.handle.channel.connection.note_stalled(crate::queue_type::WeakQueue::Quorum(self.self_reference.clone()));
                // The writer may have drained between the check and the note, and found no queue
                // to wake then: look once more, or the held deliveries wait for the next message.
                if !can_send(&entry.handle) {
                    return Ok(None);
                }
            }
        }
        Ok(Some(self.dispatch_now()))
    }

    /// The shard took the settle, requeue or reject of `position`: from now on the batcher holds
    /// it until its commit.
    pub(crate) fn forget_handed(&self, position: u64) {
        self.local.lock().handed.remove(&position);
    }

    /// Whether the plan's delivery of `position` reached this node's consumers and was not
    /// settled through the shard yet.
    pub(crate) fn was_handed(&self, position: u64) -> bool {
        self.local.lock().handed.contains(&position)
    }

    fn send(&self, consumer: &Arc<ConsumerHandle>, held: HeldDelivery) -> LocalDelivery {
        // A consumer's delivery carries x-delivery-count once the message came back (RabbitMQ
        // 3.10.8, measured: none on the first delivery, 1 on the second).
        let Some(message) = self.message(&held.body, (held.delivery_count > 0).then_some(held.delivery_count)) else {
            return LocalDelivery::SettleNow;
        };
        let channel = &consumer.channel;
        let mut ledger = channel.ledger.lock();
        if !ledger.open {
            return LocalDelivery::Requeue;
        }
        ledger.last_tag += 1;
        let delivery_tag = ledger.last_tag;
        ledger.counters.count_delivery(false, consumer.no_ack, held.redelivered);
        if !consumer.no_ack {
            let queue = crate::queue_type::Queue::Quorum(self.strong());
            ledger.track(delivery_tag, queue, held.position, Some(consumer.clone()));
            consumer.count_delivery();
        }
        channel.connection.outbound_deliveries.fetch_add(1, Ordering::AcqRel);
        channel.connection.send(Outbound::Deliver {
            channel: channel.id,
            consumer_tag: consumer.tag.clone(),
            delivery_tag,
            redelivered: held.redelivered,
            message,
        });
        match consumer.no_ack {
            true => LocalDelivery::SettleNow,
            false => LocalDelivery::Taken,
        }
    }

    /// Sends what local consumers hold, as far as they can take it now (their writer drained,
    /// flow resumed, consume-ok sent).
    pub fn dispatch(&self) {
        let Dispatched { settle, requeue } = self.dispatch_now();
        if !settle.is_empty() {
            self.settle(&settle, Settlement::Ack);
        }
        if !requeue.is_empty() {
            self.settle(&requeue, Settlement::Return);
        }
    }

    /// Sends what local consumers hold, in order, one dispatcher at a time; what must be settled
    /// or given back is left to the caller.
    pub(crate) fn dispatch_now(&self) -> Dispatched {
        let _turn = self.dispatching.lock();
        let mut dispatched = Dispatched::default();
        loop {
            let next = {
                let mut local = self.local.lock();
                local.consumers.values_mut().find_map(|entry| {
                    let ready = entry.accepted && !entry.held.is_empty() && can_send(&entry.handle);
                    ready.then(|| (entry.handle.clone(), entry.held.pop_front().expect("not empty")))
                })
            };
            let Some((handle, held)) = next else { break };
            let position = held.position;
            match self.send(&handle, held) {
                LocalDelivery::Taken => {}
                LocalDelivery::SettleNow => dispatched.settle.push(position),
                LocalDelivery::Requeue => dispatched.requeue.push(position),
            }
        }
        dispatched
    }

    /// The local consumers the machine forgot when it released this node (cut off too long):
    /// removed here, with what they held, for their clients to be told (basic.cancel). A
    /// consumer whose consume-ok was not sent yet stays: its add is proposed again.
    pub(crate) fn release_local_consumers(&self) -> Vec<Arc<ConsumerHandle>> {
        let mut local = self.local.lock();
        let released: Vec<u64> = local.consumers.iter().filter(|(_, entry)| entry.accepted).map(|(id, _)| *id).collect();
        released.into_iter().filter_map(|id| local.consumers.remove(&id).map(|entry| entry.handle)).collect()
    }

    /// A local consumer the machine removed (its queue was deleted elsewhere).
    pub(crate) fn remove_local_consumer(&self, consumer: u64) -> Option<Arc<ConsumerHandle>> {
        self.local.lock().consumers.remove(&consumer).map(|entry| entry.handle)
    }

    /// Publishes the figures of its queue `id` in `machine` after a commit (none if it is gone);
    /// `proposer` is this node's proposer in the shard, to tell its consumers from others'.
    pub(crate) fn update_figures(&self, machine: &QueueStateMachine, id: QueueId, proposer: u64) {
        let Some(core) = machine.queue(id) else { return };
        let held = machine.held_dead_letters(id);
        let messages = core.messages();
        let stats = core.stats();
        let figures = &self.figures;
        figures.dead_letters_held.store(held.map_or(0, |held| held.len() as u64), Ordering::Relaxed);
        figures.dead_letter_bytes_held.store(held.map_or(0, HeldDeadLetters::payload_bytes), Ordering::Relaxed);
        figures.ready.store(messages.ready_count() as u64, Ordering::Relaxed);
        figures.unacked.store(messages.unacked_count() as u64, Ordering::Relaxed);
        figures.ready_bytes.store(messages.ready_bytes(), Ordering::Relaxed);
        figures.unacked_bytes.store(messages.unacked_bytes(), Ordering::Relaxed);
        let active_here = machine.single_active_consumer(id).filter(|(owner, _)| *owner == proposer);
        figures.single_active_consumer.store(active_here.map_or(0, |(_, local)| local + 1), Ordering::Relaxed);
        let consumers = core.consumer_ids().count() as u64;
        let consumers_before = figures.consumers.swap(consumers, Ordering::Relaxed);
        self.consumers_changed(consumers_before, consumers);
        figures.published.store(stats.published, Ordering::Relaxed);
        figures.delivered.store(stats.delivered, Ordering::Relaxed);
        figures.acked.store(stats.acked, Ordering::Relaxed);
        figures.requeued.store(stats.requeued, Ordering::Relaxed);
        // After the figures: a sampler that clears the flag before reading them reads these, or
        // finds the flag set again next time.
        figures.changed_since_sample.store(true, Ordering::Release);
        let head_expires_at_ms = messages.head_expires_at_ms();
        self.head_expires_at_ms.store(head_expires_at_ms.unwrap_or(0), Ordering::Relaxed);
        self.tell_expiry_deadline(head_expires_at_ms);
    }

    /// x-expires: the queue's first consumer (anywhere in the cluster) holds it; its last one
    /// leaving starts the clock.
    fn consumers_changed(&self, before: u64, now: u64) {
        if before == 0 && now > 0 {
            self.expiry.lock().consumed();
        } else if before > 0 && now == 0 {
            self.expiry.lock().idle(now_ms(), self.self_reference.clone());
        }
    }

    /// Starts the x-expires clock of a queue just declared or recovered, as a classic queue's.
    pub fn start_expiry_clock(&self, recovered: bool) {
        let mut expiry = self.expiry.lock();
        if recovered {
            expiry.recover_last_use(now_ms());
            expiry.schedule_deadline(self.self_reference.clone());
        } else {
            expiry.idle(now_ms(), self.self_reference.clone());
        }
    }

    /// queue.declare of the queue on this node (also passive): renews the x-expires lease here at
    /// once, and on every replica through the log (a `Touch`), so whichever node leads the queue
    /// when the lease runs out saw the use. At most one touch per [`TOUCHES_PER_LEASE`]th of the
    /// lease: a client redeclaring in a loop costs the log little and the lease at most that much.
    pub fn redeclared(&self) {
        self.mark_used();
        let Some(expires_ms) = self.expiry.lock().expires_ms() else { return };
        let now = now_ms();
        let last = self.touched_at_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < (expires_ms / TOUCHES_PER_LEASE).max(1) {
            return;
        }
        if self.touched_at_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            self.submit(QueueCommand::Touch, Waiter::Nothing);
        }
    }

    /// A use of the queue, on this node: a redeclare here, or a committed use from any node.
    pub fn mark_used(&self) {
        let idle = self.is_idle();
        self.expiry.lock().used(now_ms(), idle);
    }

    /// Whether no consumer holds the queue: none on this node, none committed anywhere.
    fn is_idle(&self) -> bool {
        self.local.lock().consumers.is_empty() && self.figures.consumers.load(Ordering::Relaxed) == 0
    }

    /// What the expiry task finds. Only the node leading the queue's shard deletes it (the
    /// deletion is replicated): another looks again one expiry later, when it may lead.
    pub fn check_expiry(&self, now_ms: u64) -> ExpiryCheck {
        let idle = self.is_idle();
        let mut expiry = self.expiry.lock();
        match expiry.check(now_ms, idle) {
            ExpiryCheck::Expired if !self.leads() => {
                expiry.postponed();
                ExpiryCheck::Later(now_ms.saturating_add(expiry.expires_ms().unwrap_or(0)))
            }
            check => check,
        }
    }

    /// Tells the dead-letter worker when the head expires, when the queue dead-letters (every
    /// replica does: the one that leads when the deadline comes proposes the expire).
    fn tell_expiry_deadline(&self, deadline_ms: Option<u64>) {
        let Some(sender) = &self.dead_letters else { return };
        if deadline_ms.is_none() || self.limits.lock().dead_letter.is_none() {
            return;
        }
        let queue = self.self_reference.clone();
        sender.schedule_expiry(&mut self.expiry_deadline.lock(), deadline_ms, || DeadlineQueue::Quorum(queue));
    }

    /// A message the queue dropped (this node leads the shard): dead-lettered when the queue has
    /// a dead-letter exchange.
    pub(crate) fn dead_letter(
        &self,
        position: u64,
        reason: DeadLetterReason,
        body: &Bytes,
        sender: &crate::dead_letter::DeadLetterSender,
        scope: crate::dead_letter::DeadLetterScope,
    ) {
        let Some(target) = self.limits.lock().dead_letter.clone() else { return };
        let Ok(message) = envelope::decode(body) else { return };
        let letter = DeadLetter { position, logged: false, held: false, message, reason, target };
        let batch = DeadLetterBatch { source: self.dead_letter_source.clone(), letters: vec![letter], scope };
        if sender.try_send(batch).is_err() {
            tracing::warn!(queue = %self.name(), "the dead-letter worker is full; a quorum queue's dead letter is dropped");
        }
    }
}

/// Whether a local consumer can be sent one more message now (its channel's flow and writer;
/// its prefetch is the plan's, which the replicated core already honours).
fn can_send(consumer: &ConsumerHandle) -> bool {
    !consumer.cancelled.load(Ordering::Acquire)
        && consumer.channel.flow_active.load(Ordering::Acquire)
        && consumer.channel.connection.outbound_deliveries.load(Ordering::Acquire) < OUTBOUND_DELIVERIES_MAX
}

impl QuorumQueue {
    /// Ready messages and consumers (declare-ok).
    pub fn counts(&self) -> (u32, u32) {
        let ready = self.figures.ready.load(Ordering::Relaxed).min(u64::from(u32::MAX)) as u32;
        let consumers = self.figures.consumers.load(Ordering::Relaxed).min(u64::from(u32::MAX)) as u32;
        (ready, consumers)
    }

    /// queue.purge: the count of messages it dropped.
    pub fn purge(&self) -> u32 {
        match self.commit_and_wait(QueueCommand::Purge) {
            Ok(CommandResult::Core(Reply::Purged { count })) => count.min(u64::from(u32::MAX)) as u32,
            _ => 0,
        }
    }

    /// Deletes the queue (replicated) and hands back its ready count and its local consumers.
    pub fn delete(&self) -> (u32, Vec<Arc<ConsumerHandle>>) {
        let replayed = self.deleted.swap(true, Ordering::AcqRel);
        self.expiry.lock().remove_file();
        let (ready, _) = self.counts();
        let consumers = std::mem::take(&mut self.local.lock().consumers).into_values().map(|entry| entry.handle).collect();
        if replayed {
            // Marked by `forget_replayed_deletion`: the shard deleted it in an earlier run.
            return (ready, consumers);
        }
        if crate::cluster::applying() {
            // Every node applies a clustered deletion on its metadata group's thread: proposed,
            // not waited for, so a slow or leaderless shard never holds up the definitions.
            self.submit(QueueCommand::Delete, Waiter::Nothing);
            return (ready, consumers);
        }
        if self.commit_and_wait(QueueCommand::Delete).is_err() {
            tracing::error!(queue = %self.name(), "the deletion of a quorum queue was not committed in time; it goes on in the background");
        }
        (ready, consumers)
    }

    /// A deletion the cluster's metadata log replays at start (the shard applied it in an earlier
    /// run): `delete` then proposes nothing, and the shard does not look the queue up by name.
    pub fn forget_replayed_deletion(&self) {
        self.deleted.store(true, Ordering::Release);
    }

    /// Whether it was deleted (or its deletion replayed).
    pub(crate) fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// Applies the policy that now matches the queue (or none): its limits are replicated.
    pub fn apply_policy(&self, policy: Option<Arc<Policy>>) {
        let limits = {
            let mut current = self.limits.lock();
            *current = QueueLimits::new(&self.definition.arguments, policy.clone());
            replicated_limits(&current)
        };
        log_strategy_fallback(&limits, &self.definition.name, &self.vhost);
        self.submit(QueueCommand::SetLimits { limits }, Waiter::Nothing);
        let idle = self.is_idle();
        let mut expiry = self.expiry.lock();
        expiry.set_policy_ms(policy.and_then(|policy| policy.queue_settings.expires_ms));
        if idle {
            expiry.schedule_deadline(self.self_reference.clone());
        }
    }

    /// The policy that applies to it.
    pub fn policy(&self) -> Option<Arc<Policy>> {
        self.limits.lock().policy.clone()
    }

    /// x-consumer-timeout and the policy's consumer-timeout, the lower of both.
    pub fn consumer_timeout_ms(&self) -> Option<u64> {
        let policy = self.limits.lock().policy.as_ref().and_then(|policy| policy.queue_settings.consumer_timeout_ms);
        crate::queue_runtime::lower(crate::queue_runtime::consumer_timeout_argument_ms(&self.definition.arguments), policy)
    }

    /// Its counts and totals, for management and metrics.
    pub fn snapshot(&self) -> QueueSnapshot {
        let figures = &self.figures;
        let stats = QueueStats {
            published: figures.published.load(Ordering::Relaxed),
            delivered: figures.delivered.load(Ordering::Relaxed),
            acked: figures.acked.load(Ordering::Relaxed),
            requeued: figures.requeued.load(Ordering::Relaxed),
        };
        QueueSnapshot {
            ready: figures.ready.load(Ordering::Relaxed),
            paged: 0,
            unacked: figures.unacked.load(Ordering::Relaxed),
            ready_bytes: figures.ready_bytes.load(Ordering::Relaxed),
            unacked_bytes: figures.unacked_bytes.load(Ordering::Relaxed),
            consumers: figures.consumers.load(Ordering::Relaxed).min(u64::from(u32::MAX)) as u32,
            stats,
            single_active_consumer_tag: self.single_active_consumer_here().map(|consumer| consumer.tag.to_string_lossy()),
            ..QueueSnapshot::default()
        }
    }

    /// With x-single-active-consumer, the consumer getting the messages when it is this node's.
    fn single_active_consumer_here(&self) -> Option<Arc<ConsumerHandle>> {
        let active = self.figures.single_active_consumer.load(Ordering::Relaxed).checked_sub(1)?;
        self.local.lock().consumers.get(&active).map(|entry| entry.handle.clone())
    }

    /// The figures the management sampler keeps, or `None` when no commit changed them since it
    /// last took them: an idle quorum queue costs the sampler one atomic load, as a classic one.
    pub fn sample_if_changed(&self) -> Option<QueueSnapshot> {
        self.figures.changed_since_sample.swap(false, Ordering::AcqRel).then(|| self.snapshot())
    }

    /// Whether [`QuorumQueue::sample_if_changed`] would read the figures (no lock taken).
    pub fn changed_since_sample(&self) -> bool {
        self.figures.changed_since_sample.load(Ordering::Acquire)
    }

    /// Its dead letters held until their targets have them, for management.
    pub fn held_dead_letters(&self) -> super::HeldDeadLetterFigures {
        super::HeldDeadLetterFigures {
            count: self.figures.dead_letters_held.load(Ordering::Relaxed),
            body_bytes: self.figures.dead_letter_bytes_held.load(Ordering::Relaxed),
        }
    }

    /// This node's consumers of the queue, for management.
    pub fn consumer_views(&self) -> Vec<ConsumerView> {
        let single_active = crate::queue_runtime::single_active_consumer(&self.definition.arguments);
        let active_id = self.figures.single_active_consumer.load(Ordering::Relaxed).checked_sub(1);
        self.local
            .lock()
            .consumers
            .iter()
            .filter(|(_, entry)| entry.accepted && !entry.handle.cancelled.load(Ordering::Acquire))
            .map(|(id, entry)| {
                let active = !single_active || active_id == Some(*id);
                (entry, active, crate::queue_runtime::activity_status(single_active, active))
            })
            .map(|(entry, active, activity_status)| ConsumerView {
                tag: entry.handle.tag.to_string_lossy(),
                channel: entry.handle.channel.id,
                connection_id: entry.handle.channel.connection.id,
                ack_required: !entry.handle.no_ack,
                prefetch: entry.handle.prefetch,
                priority: entry.handle.priority,
                exclusive: false,
                active,
                activity_status,
            })
            .collect()
    }

    /// The dead-letter worker's visit at the queue's deadline `key`. When the head has expired,
    /// the leader proposes an expire (its commit tells the next deadline); every replica looks
    /// again after [`EXPIRE_INTERVAL_MS`] while the head stays expired (no commit came: a
    /// follower waits for its leader, a leader's proposal may be lost).
    pub fn expire_due(&self, key: DeadlineKey) -> Option<DeadLetterBatch> {
        let mut entry = self.expiry_deadline.lock();
        entry.taken(key);
        let Some(sender) = &self.dead_letters else { return None };
        if self.is_deleted() {
            return None;
        }
        let now = now_ms();
        let head_expires_at_ms = self.head_expires_at_ms.load(Ordering::Relaxed);
        if head_expires_at_ms == 0 {
            return None;
        }
        if head_expires_at_ms > now {
            sender.schedule_expiry(&mut entry, Some(head_expires_at_ms), || DeadlineQueue::Quorum(self.self_reference.clone()));
            return None;
        }
        sender.schedule_expiry(&mut entry, Some(now + EXPIRE_INTERVAL_MS), || DeadlineQueue::Quorum(self.self_reference.clone()));
        // Not under the entry's lock: the shard's thread takes it when it applies a commit.
        drop(entry);
        if self.leads() && self.id() != 0 {
            self.submit(QueueCommand::Expire, Waiter::Nothing);
        }
        None
    }
}

mod held_dead_letters;

/// How soon a quorum queue whose head expired looks again while no commit has removed it.
pub const EXPIRE_INTERVAL_MS: u64 = 1000;
