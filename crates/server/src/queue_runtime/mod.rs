//! A queue at runtime: its messages, its consumers, and handing messages to consumers.
//!
//! Each queue has its own lock; there is no broker-wide lock on the publish, deliver or ack path.
//! Whoever changes what a queue can deliver (a publish, an ack freeing prefetch, a new consumer, a
//! writer that drained) calls [`QueueRuntime::dispatch`] right there, so no extra task hop is paid.
//! Lock order: queue, then a channel's ledger; never the other way round.

use crate::dead_letter::deadlines::{DeadlineKey, DeadlineQueue};
use crate::dead_letter::{DeadLetter, DeadLetterBatch, DeadLetterSender, DeadLetterSource, DeadLetterTarget, ExpiryDeadline};
use crate::policy::Policy;
use crate::queue_type::{ClassicStorageError, LazyRecovery, RecoveredLog, Settlement};
use crate::shared::{ConsumerHandle, Outbound};
use amqp_codec::ShortStr;
use broker_core::queue::QueueState;
use broker_core::vhost::{Overflow, QueueDefinition};
use broker_core::{AmqpError, Message};
use parking_lot::Mutex;
use queue_core::{Command, ConsumerId, Effect, Limits, QueueCore, Reply};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use storage::syncer::SharedLog;

mod expiry;
mod paging;
mod perform;

pub use expiry::{ExpiryCheck, ExpiryClock};
pub use paging::{Pager, GET_PAGE_IN_ROUNDS_MAX};
pub use queue_core::QueueStats;

/// The runtime of one queue.
#[derive(Debug)]
pub struct QueueRuntime {
    /// Fixed properties.
    pub definition: QueueDefinition,
    /// The vhost's name, for reply texts.
    pub vhost: String,
    /// The message log, for durable queues (set when recovered, for one restored unrecovered).
    log: std::sync::OnceLock<SharedLog>,
    inner: Mutex<QueueInner>,
    /// Whether the queue's messages are there: false for a durable queue restored at start until
    /// its log is recovered (see [`QueueRuntime::unrecovered`]).
    recovered: AtomicBool,
    deleted: AtomicBool,
    /// The queue itself, for the page-in read it hands to a blocking thread.
    self_reference: Weak<QueueRuntime>,
    /// Woken when a page-in result was applied (a basic.get waits on it).
    page_in_done: tokio::sync::Notify,
    /// Where its dead letters are handed over (none in tests that do not dead-letter).
    dead_letter_sender: Option<DeadLetterSender>,
    /// The queue as its dead letters name it (made with the log, when the first dead letter
    /// leaves: a queue restored unrecovered has no log before).
    dead_letter_source: std::sync::OnceLock<Arc<DeadLetterSource>>,
    /// x-consumer-timeout and the `consumer-timeout` policy key, the lower of both (0: none):
    /// read by channels at each consumer-timeout sample, without the queue's lock.
    consumer_timeout_ms: AtomicU64,
    /// With x-message-deduplication, the cache of keys enqueued (see `dedup`), set once when the
    /// queue is made.
    deduplication: std::sync::OnceLock<Arc<crate::dedup::DedupCache>>,
    /// Whether a command ran since the management sampler last read the queue's figures: an idle
    /// queue is then skipped by the sampler (see `management/rates.rs`). Set after each command,
    /// under the queue's lock, with a load first so a busy queue does not write the line each time.
    changed_since_sample: AtomicBool,
}

#[derive(Debug)]
struct QueueInner {
    /// The queue's rules and messages, stats included (totals since the queue was created or the
    /// broker started).
    core: QueueCore<Arc<Message>>,
    /// The consumers, in the core's order, with the ids the core knows them by.
    consumers: Vec<(ConsumerId, Arc<ConsumerHandle>)>,
    next_consumer_id: ConsumerId,
    /// Where the paged tail continues on disk, while the queue pages.
    pager: Option<Pager>,
    /// Limits from the queue's arguments and its policy.
    limits: QueueLimits,
    /// The effects buffer, reused by every command.
    effects: Vec<Effect<Arc<Message>>>,
    /// Dead letters not yet handed to the dead-letter worker (only while its backlog is full do
    /// they stay past the command that made them).
    dead_letters: Vec<DeadLetter>,
    /// x-expires: the last use, and when the queue is deleted unused.
    expiry: ExpiryClock,
    /// With a dead-letter exchange, the deadline the dead-letter worker holds for the queue.
    expiry_deadline: ExpiryDeadline,
    /// For a durable queue restored at start, until its log is recovered: how to recover it.
    unrecovered: Option<Arc<LazyRecovery>>,
}

/// A queue's effective limits: its arguments merged with the policy that applies to it, the way
/// RabbitMQ merges them (the lower `max-length`, `max-length-bytes` and `message-ttl` win; an
/// `x-overflow`, `x-dead-letter-exchange` or `x-dead-letter-routing-key` argument wins over the
/// policy's).
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueLimits {
    max_length: Option<u64>,
    max_length_bytes: Option<u64>,
    pub(crate) overflow: Option<Overflow>,
    pub(crate) message_ttl_ms: Option<u64>,
    /// x-delivery-limit (a Lepus extension on classic queues, as quorum queues have it).
    delivery_limit: Option<u64>,
    /// Where dropped messages go; none drops them (no per-message work beyond this branch).
    pub(crate) dead_letter: Option<DeadLetterTarget>,
    /// x-dead-letter-strategy at-least-once (or the policy's `dead-letter-strategy`; the
    /// argument wins): quorum queues only, and only with reject-publish.
    pub(crate) dead_letter_at_least_once: bool,
    pub(crate) policy: Option<Arc<Policy>>,
}

fn non_negative_argument(arguments: &amqp_codec::FieldTable, key: &str) -> Option<u64> {
    arguments.get(key).and_then(|value| value.as_i64()).map(|value| value.max(0) as u64)
}

fn text_argument(arguments: &amqp_codec::FieldTable, key: &str) -> Option<ShortStr> {
    match arguments.get(key) {
        Some(amqp_codec::FieldValue::LongStr(text)) => Some(ShortStr::from_bytes(text.clone())),
        _ => None,
    }
}

impl QueueLimits {
    pub(crate) fn new(arguments: &amqp_codec::FieldTable, policy: Option<Arc<Policy>>) -> QueueLimits {
        let settings = policy.as_ref().map(|policy| policy.queue_settings.clone()).unwrap_or_default();
        let argument_overflow = arguments.get("x-overflow").and_then(|value| value.as_text()).and_then(|name| Overflow::from_name(&name));
        let exchange =
            text_argument(arguments, "x-dead-letter-exchange").or_else(|| settings.dead_letter_exchange.map(ShortStr::truncating));
        let routing_key =
            text_argument(arguments, "x-dead-letter-routing-key").or_else(|| settings.dead_letter_routing_key.map(ShortStr::truncating));
        QueueLimits {
            max_length: lower(non_negative_argument(arguments, "x-max-length"), settings.max_length),
            max_length_bytes: lower(non_negative_argument(arguments, "x-max-length-bytes"), settings.max_length_bytes),
            overflow: argument_overflow.or(settings.overflow),
            message_ttl_ms: lower(non_negative_argument(arguments, "x-message-ttl"), settings.message_ttl_ms),
            delivery_limit: lower(non_negative_argument(arguments, "x-delivery-limit"), settings.delivery_limit),
            dead_letter: exchange.map(|exchange| DeadLetterTarget { exchange, routing_key }),
            dead_letter_at_least_once: match arguments.get("x-dead-letter-strategy").and_then(|value| value.as_text()) {
                Some(strategy) => strategy == "at-least-once",
                None => settings.dead_letter_at_least_once.unwrap_or(false),
            },
            policy,
        }
    }

    /// The limits as the core applies them.
    pub(crate) fn core_limits(&self) -> Limits {
        let overflow = match self.overflow.unwrap_or(Overflow::DropHead) {
            Overflow::DropHead => queue_core::Overflow::DropHead,
            Overflow::RejectPublish | Overflow::RejectPublishDeadLetter => queue_core::Overflow::RejectPublish,
        };
        Limits {
            max_length: self.max_length,
            max_length_bytes: self.max_length_bytes,
            overflow,
            message_ttl_ms: self.message_ttl_ms,
            delivery_limit: self.delivery_limit.map(|limit| limit.min(u64::from(u32::MAX)) as u32),
            dead_letters: self.dead_letter.is_some(),
            // Classic queues dead-letter at least once their own way (`dead_letter`), as RabbitMQ's
            // classic queues ignore the strategy; quorum queues set this in `replicated_limits`.
            dead_letter_at_least_once: false,
        }
    }

    /// Where a message refused by reject-publish-dlx goes.
    pub(crate) fn refused_dead_letter(&self) -> Option<&DeadLetterTarget> {
        match self.overflow {
            Some(Overflow::RejectPublishDeadLetter) => self.dead_letter.as_ref(),
            _ => None,
        }
    }
}

pub(crate) fn lower(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A consumer as listed (management API).
#[derive(Debug, Clone)]
pub struct ConsumerView {
    /// Consumer tag.
    pub tag: String,
    /// Channel number.
    pub channel: u16,
    /// Broker-unique id of its connection.
    pub connection_id: u64,
    /// Whether deliveries need an ack.
    pub ack_required: bool,
    /// Per-consumer prefetch (0 = none).
    pub prefetch: u32,
    /// x-priority.
    pub priority: i64,
    /// Whether it consumes exclusively.
    pub exclusive: bool,
    /// Whether it gets messages: false for the waiting consumers of a single-active-consumer queue.
    pub active: bool,
    /// RabbitMQ's `activity_status`: "up", or "single_active" / "waiting" with x-single-active-consumer.
    pub activity_status: &'static str,
}

/// A queue's state for listings (management API, metrics).
#[derive(Debug, Clone, Default)]
pub struct QueueSnapshot {
    /// Ready messages (in memory and paged).
    pub ready: u64,
    /// Ready messages on disk only.
    pub paged: u64,
    /// Delivered and not settled.
    pub unacked: u64,
    /// Body bytes of the ready messages (paged ones recovered from disk count 0 until read).
    pub ready_bytes: u64,
    /// Body bytes of the unacked messages.
    pub unacked_bytes: u64,
    /// Body bytes of the ready messages in memory (the rest of `ready_bytes` is paged).
    pub ready_bytes_in_memory: u64,
    /// Body bytes of the paged messages.
    pub paged_bytes: u64,
    /// The messages without a record in the queue's log (transient ones, every one of a
    /// transient queue): the others are RabbitMQ's `messages_persistent`.
    pub unlogged: queue_core::MessageTally,
    /// Active consumers.
    pub consumers: u32,
    /// Totals.
    pub stats: QueueStats,
    /// With x-single-active-consumer, the tag of the consumer getting the messages.
    pub single_active_consumer_tag: Option<String>,
}

/// What happened to a published message at one queue.
#[derive(Debug)]
pub enum Enqueued {
    /// Enqueued and written to this log, which must be synced before a confirm.
    Logged(SharedLog),
    /// Enqueued in memory only (transient message or queue).
    InMemory,
    /// Taken and dropped at once, nothing kept or written: a zero length limit with drop-head,
    /// or the queue was being deleted.
    Dropped,
    /// Refused: the queue is at its x-max-length with x-overflow reject-publish.
    Rejected,
}

/// What basic.get found.
#[derive(Debug)]
pub enum GetAnswer {
    /// The first ready message, as get-ok.
    Message(Outbound),
    /// No ready message: get-empty.
    Empty,
    /// Only paged messages are ready and a read of them is under way: ask again once
    /// [`QueueRuntime::wait_for_page_in`] returns (RabbitMQ answers with the message, not
    /// get-empty).
    PageInPending,
}

/// What [`QueueRuntime::remove_consumer`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum ConsumerRemoval {
    /// The consumer was not on this queue.
    NotFound,
    /// Removed; others remain or the queue is not auto-delete.
    Removed,
    /// Removed the last consumer of an auto-delete queue: delete the queue.
    DeleteQueue,
}

impl QueueRuntime {
    /// A queue with the given messages (and, after recovery, the pager over its log).
    pub fn new(
        definition: QueueDefinition,
        vhost: &str,
        log: Option<SharedLog>,
        messages: QueueState,
        pager: Option<Pager>,
        dead_letter_sender: Option<DeadLetterSender>,
        expiry: ExpiryClock,
    ) -> Arc<QueueRuntime> {
        let queue = QueueRuntime::made(definition, vhost, log.is_some(), messages, pager, dead_letter_sender, expiry, None);
        if let Some(log) = log {
            let _ = queue.log.set(log);
        }
        queue
    }

    /// A durable queue restored at start without its messages: the first command under its lock
    /// (publish, consume, get, declare-ok's count, purge, delete, a listing, a policy...) recovers
    /// its log through `recovery` first, so it sees what a full recovery at start would have given.
    pub fn unrecovered(
        definition: QueueDefinition,
        vhost: &str,
        dead_letter_sender: Option<DeadLetterSender>,
        expiry: ExpiryClock,
        recovery: Arc<LazyRecovery>,
    ) -> Arc<QueueRuntime> {
        let messages = QueueState::new(0);
        QueueRuntime::made(definition, vhost, true, messages, None, dead_letter_sender, expiry, Some(recovery))
    }

    #[allow(clippy::too_many_arguments)]
    fn made(
        definition: QueueDefinition,
        vhost: &str,
        durable_log: bool,
        messages: QueueState,
        pager: Option<Pager>,
        dead_letter_sender: Option<DeadLetterSender>,
        expiry: ExpiryClock,
        unrecovered: Option<Arc<LazyRecovery>>,
    ) -> Arc<QueueRuntime> {
        let limits = QueueLimits::new(&definition.arguments, None);
        let consumer_timeout_ms = consumer_timeout_argument_ms(&definition.arguments).unwrap_or(0);
        let window = durable_log.then_some(paging::WINDOW);
        let recovered = AtomicBool::new(unrecovered.is_none());
        Arc::new_cyclic(|self_reference| QueueRuntime {
            self_reference: self_reference.clone(),
            page_in_done: tokio::sync::Notify::new(),
            dead_letter_sender,
            dead_letter_source: std::sync::OnceLock::new(),
            recovered,
            inner: Mutex::new(QueueInner {
                core: QueueCore::new(messages, limits.core_limits(), window)
                    .with_single_active_consumer(single_active_consumer(&definition.arguments)),
                consumers: Vec::new(),
                next_consumer_id: 0,
                pager,
                limits,
                effects: Vec::new(),
                dead_letters: Vec::new(),
                expiry,
                expiry_deadline: ExpiryDeadline::default(),
                unrecovered,
            }),
            definition,
            vhost: vhost.to_string(),
            log: std::sync::OnceLock::new(),
            deleted: AtomicBool::new(false),
            consumer_timeout_ms: AtomicU64::new(consumer_timeout_ms),
            deduplication: std::sync::OnceLock::new(),
            changed_since_sample: AtomicBool::new(true),
        })
    }

    /// The message log, for a durable queue (none before a restored queue is recovered).
    pub fn log(&self) -> Option<&SharedLog> {
        self.log.get()
    }

    /// Whether the queue's messages are there (false until a restored queue is recovered).
    pub fn is_recovered(&self) -> bool {
        self.recovered.load(Ordering::Acquire)
    }

    /// The queue's lock, its log recovered first when the queue was restored unrecovered: the
    /// caller waits for the read (off the async worker, as other disk waits do).
    fn lock(&self) -> parking_lot::MutexGuard<'_, QueueInner> {
        let mut inner = match self.inner.try_lock() {
            Some(inner) => inner,
            // The walker may hold it while it reads the queue's log (and its chunk's): that wait
            // is a disk wait too, kept off the async worker.
            None if !self.is_recovered() => wait_off_worker(|| self.inner.lock()),
            None => self.inner.lock(),
        };
        if let Some(recovery) = inner.unrecovered.clone() {
            let opened = wait_off_worker(|| recovery.open_log(&self.definition, &self.vhost, true));
            self.install_recovered(&mut inner, &recovery, opened);
        }
        inner
    }

    /// Recovers the queue's log now if it was restored unrecovered (the walker's last pass).
    pub fn recover_now(&self) {
        drop(self.lock());
    }

    /// For the background walker: the queue's lock when it is free and the queue still waits for
    /// its recovery (a queue in use was recovered by its user, or soon will be).
    pub fn try_lock_unrecovered(&self) -> Option<UnrecoveredQueue<'_>> {
        let inner = self.inner.try_lock()?;
        let recovery = inner.unrecovered.clone()?;
        Some(UnrecoveredQueue { queue: self, inner, recovery })
    }

    /// Builds the queue's messages over its opened log (seals durable) and clears the pending
    /// recovery; a log that cannot be recovered stops the broker, as it stops a start.
    fn install_recovered(
        &self,
        inner: &mut QueueInner,
        recovery: &LazyRecovery,
        opened: Result<crate::queue_type::RecoveredLog, crate::queue_type::ClassicStorageError>,
    ) {
        let parts = match opened.and_then(|opened| recovery.parts(&self.definition, opened)) {
            Ok(parts) => parts,
            Err(error) => recovery_failed(self, &error),
        };
        let _ = self.log.set(parts.log);
        let argument_limits = QueueLimits::new(&self.definition.arguments, None).core_limits();
        inner.core = QueueCore::new(parts.messages, argument_limits, Some(paging::WINDOW))
            .with_single_active_consumer(single_active_consumer(&self.definition.arguments));
        inner.pager = parts.pager;
        inner.unrecovered = None;
        self.recovered.store(true, Ordering::Release);
        // As at a start: the queue is made with its arguments' limits, then its policy applied
        // (a lower length limit drops or dead-letters the oldest messages at once).
        let limits = inner.limits.core_limits();
        self.run(inner, || Command::SetLimits(limits), perform::Context::default());
        self.tell_expiry_deadline(inner, now_ms());
        self.note_changed();
    }

    /// Gives a queue declared with x-message-deduplication its cache (once, as it is made).
    pub fn set_deduplication(&self, cache: Arc<crate::dedup::DedupCache>) {
        if self.deduplication.set(cache).is_err() {
            tracing::error!(queue = %self.name(), "a queue's deduplication cache was set twice; the first is kept");
        }
    }

    /// Its deduplication cache, with x-message-deduplication.
    pub fn deduplication(&self) -> Option<&Arc<crate::dedup::DedupCache>> {
        self.deduplication.get()
    }

    /// The queue's name.
    pub fn name(&self) -> &ShortStr {
        &self.definition.name
    }

    /// Enqueues a message and delivers what it can.
    pub fn publish(self: &Arc<Self>, message: Arc<Message>) -> Enqueued {
        if self.deleted.load(Ordering::Acquire) {
            return Enqueued::Dropped;
        }
        let persistent = message.is_persistent();
        let own_ttl_ms = own_ttl_ms(&message);
        let deduplication = self.deduplication.get();
        let deduplication_key = deduplication.and_then(|cache| cache.key_of(&message));
        let mut inner = self.lock();
        let enqueue = || Command::Enqueue { message: message.clone(), persistent, own_ttl_ms };
        let now_ms = now_ms();
        if let (Some(cache), Some(key)) = (deduplication, &deduplication_key) {
            // Looked up under the queue's lock, so two publishes of one key cannot both get in.
            if cache.contains(key, now_ms) {
                return Enqueued::Dropped;
            }
        }
        let outcome = self.run_at(&mut inner, enqueue, perform::Context::publishing(self, &message), now_ms);
        if let (Some(cache), Some(key), Reply::Ok) = (deduplication, deduplication_key, &outcome.reply) {
            cache.record(key, now_ms);
        }
        match outcome.reply {
            Reply::Rejected => {
                if let Some(target) = inner.limits.refused_dead_letter().cloned() {
                    let reason = queue_core::DeadLetterReason::MaxLength;
                    inner.dead_letters.push(DeadLetter { position: 0, logged: false, held: false, message, reason, target });
                    self.hand_over_dead_letters(&mut inner);
                    self.tell_expiry_deadline(&mut inner, now_ms);
                }
                return Enqueued::Rejected;
            }
            // Not kept (and, with a dead-letter exchange, already handed to its worker).
            Reply::Dropped => return Enqueued::Dropped,
            _ => {}
        }
        self.dispatch_locked_at(&mut inner, now_ms);
        match (outcome.logged, self.log()) {
            (true, Some(log)) => Enqueued::Logged(log.clone()),
            _ => Enqueued::InMemory,
        }
    }

    /// Delivers ready messages to consumers that can take them.
    pub fn dispatch(self: &Arc<Self>) {
        let mut inner = self.lock();
        self.dispatch_locked(&mut inner);
    }

    /// Delivers one message at a time: the readiness of a consumer (channel-wide prefetch, a full
    /// writer) changes only when a delivery is performed, so the core asks again after each.
    fn dispatch_locked(self: &Arc<Self>, inner: &mut QueueInner) {
        self.dispatch_locked_at(inner, now_ms());
    }

    /// Delivers one message per command (a channel-wide prefetch and a full writer change only when
    /// a delivery is performed), all at the time the caller read.
    fn dispatch_locked_at(self: &Arc<Self>, inner: &mut QueueInner, now_ms: u64) {
        let context = perform::Context::dispatching(self);
        while self.run_at(inner, || Command::DispatchOne, context, now_ms).reply == Reply::Delivered {}
    }

    /// Applies the policy that now matches the queue (or none). A lower length limit drops the
    /// oldest messages at once when the overflow is drop-head, as RabbitMQ does; a new TTL applies
    /// to messages enqueued from now on.
    ///
    /// A queue restored unrecovered keeps the policy for its recovery, which applies the limits
    /// to the recovered messages as a start would have (the same messages dropped or
    /// dead-lettered, when it is recovered rather than now): a policy matching 100,000 queues
    /// just after a start does not read their logs one after another.
    pub fn apply_policy(self: &Arc<Self>, policy: Option<Arc<Policy>>) {
        let mut inner = self.inner.lock();
        if inner.unrecovered.is_none() {
            self.apply_policy_locked(&mut inner, policy);
            return;
        }
        inner.limits = QueueLimits::new(&self.definition.arguments, policy.clone());
        self.apply_policy_timers(&mut inner, &policy);
    }

    fn apply_policy_locked(self: &Arc<Self>, inner: &mut QueueInner, policy: Option<Arc<Policy>>) {
        inner.limits = QueueLimits::new(&self.definition.arguments, policy.clone());
        let limits = inner.limits.core_limits();
        self.run(inner, || Command::SetLimits(limits), perform::Context::default());
        self.apply_policy_timers(inner, &policy);
    }

    /// The policy's consumer timeout and x-expires.
    fn apply_policy_timers(self: &Arc<Self>, inner: &mut QueueInner, policy: &Option<Arc<Policy>>) {
        let policy_expires_ms = policy.as_ref().and_then(|policy| policy.queue_settings.expires_ms);
        let policy_timeout_ms = policy.as_ref().and_then(|policy| policy.queue_settings.consumer_timeout_ms);
        let timeout_ms = lower(consumer_timeout_argument_ms(&self.definition.arguments), policy_timeout_ms);
        self.consumer_timeout_ms.store(timeout_ms.unwrap_or(0), Ordering::Release);
        inner.expiry.set_policy_ms(policy_expires_ms);
        if inner.consumers.is_empty() {
            inner.expiry.schedule_deadline(Arc::downgrade(self));
        }
    }

    /// Starts the x-expires clock of a queue just declared or recovered: an idle queue expires
    /// from its last use (now, or for a recovered durable queue the use it stored).
    pub fn start_expiry_clock(self: &Arc<Self>, recovered: bool) {
        self.start_expiry_clock_reading(recovered, recovered);
    }

    /// [`QueueRuntime::start_expiry_clock`] of a recovered queue; `last_use_stored` false when the
    /// start found no stored last use for it (the directory of them is listed once, not each
    /// queue's file opened: 100,000 failed opens were a quarter of a start's CPU).
    pub fn start_recovered_expiry_clock(self: &Arc<Self>, last_use_stored: bool) {
        self.start_expiry_clock_reading(true, last_use_stored);
    }

    fn start_expiry_clock_reading(self: &Arc<Self>, recovered: bool, last_use_stored: bool) {
        // Not `lock`: a queue restored unrecovered starts its clock before its log is read.
        let mut inner = self.inner.lock();
        let now_ms = now_ms();
        if recovered {
            if last_use_stored {
                inner.expiry.recover_last_use(now_ms);
            }
            inner.expiry.schedule_deadline(Arc::downgrade(self));
        } else {
            inner.expiry.idle(now_ms, Arc::downgrade(self));
        }
        // A recovered queue's messages are all paged: a visit pages in its head to expire it.
        self.tell_expiry_deadline(&mut inner, now_ms);
    }

    /// A redeclare (also passive, as RabbitMQ counts it) renews the queue's x-expires lease.
    pub fn mark_used(&self) {
        let mut inner = self.inner.lock();
        let idle = inner.consumers.is_empty();
        inner.expiry.used(now_ms(), idle);
    }

    /// What the expiry task finds: expired, used since, or in use.
    pub fn check_expiry(&self, now_ms: u64) -> ExpiryCheck {
        let mut inner = self.inner.lock();
        let idle = inner.consumers.is_empty();
        inner.expiry.check(now_ms, idle)
    }

    /// How long a delivery from this queue may wait for its ack, when the queue says (its
    /// x-consumer-timeout or policy); otherwise the node's `consumer_timeout` applies.
    pub fn consumer_timeout_ms(&self) -> Option<u64> {
        Some(self.consumer_timeout_ms.load(Ordering::Acquire)).filter(|timeout_ms| *timeout_ms > 0)
    }

    /// The name of the policy that applies to the queue, and its definition.
    pub fn policy(&self) -> Option<Arc<Policy>> {
        self.inner.lock().limits.policy.clone()
    }

    /// basic.get: the first ready message, tracked on `ledger` unless `no_ack`.
    pub fn get(self: &Arc<Self>, channel: &crate::shared::ChannelShared, no_ack: bool) -> GetAnswer {
        let mut inner = self.lock();
        let idle = inner.consumers.is_empty();
        inner.expiry.used(now_ms(), idle);
        let outcome = self.run(&mut inner, || Command::Get { no_ack }, perform::Context::getting(self, channel));
        match (outcome.reply, outcome.got) {
            (Reply::Got { message_count }, Some((delivery_tag, redelivered, message))) => {
                let message_count = message_count as u32;
                GetAnswer::Message(Outbound::GetOk { channel: channel.id, delivery_tag, redelivered, message_count, message })
            }
            (Reply::PageInFirst, _) => GetAnswer::PageInPending,
            _ => GetAnswer::Empty,
        }
    }

    /// Settles or requeues deliveries, then delivers again (prefetch was freed).
    pub fn finish_deliveries(self: &Arc<Self>, positions: &[u64], settlement: Settlement) {
        let mut inner = self.lock();
        let now_ms = now_ms();
        for &position in positions {
            let command = || match settlement {
                Settlement::Ack => Command::Settle { position },
                Settlement::Requeue | Settlement::Return => Command::Requeue { position },
                Settlement::Reject => Command::Reject { position },
            };
            self.run_at(&mut inner, command, perform::Context::default(), now_ms);
        }
        self.dispatch_locked_at(&mut inner, now_ms);
    }

    /// Adds a consumer (basic.consume), enforcing exclusive consumers as RabbitMQ does.
    /// `accepted` runs once the checks pass and before the first delivery (it sends consume-ok,
    /// which must reach the client before any basic.deliver for the new consumer).
    pub fn add_consumer(
        self: &Arc<Self>,
        consumer: Arc<ConsumerHandle>,
        exclusive: bool,
        accepted: impl FnOnce(),
    ) -> Result<(), AmqpError> {
        let mut inner = self.lock();
        self.forget_cancelled_consumers(&mut inner);
        let id = inner.next_consumer_id;
        inner.next_consumer_id += 1;
        let add = || Command::AddConsumer {
            consumer: id,
            priority: consumer.priority,
            exclusive,
            prefetch: consumer.prefetch,
            no_ack: consumer.no_ack,
        };
        if self.run(&mut inner, add, perform::Context::default()).reply == Reply::ExclusiveInUse {
            return Err(AmqpError::access_refused(format!("queue '{}' in vhost '{}' in exclusive use", self.name(), self.vhost)));
        }
        if inner.consumers.is_empty() {
            inner.expiry.consumed();
        }
        inner.consumers.push((id, consumer));
        accepted();
        self.dispatch_locked(&mut inner);
        Ok(())
    }

    /// Drops consumers whose channel went away under a delivery; their channel's cleanup cancels
    /// them for good later (and then finds them gone).
    fn forget_cancelled_consumers(self: &Arc<Self>, inner: &mut QueueInner) {
        let had_consumers = !inner.consumers.is_empty();
        let mut index = 0;
        while index < inner.consumers.len() {
            let (id, consumer) = &inner.consumers[index];
            if consumer.cancelled.load(Ordering::Acquire) {
                let consumer = *id;
                self.run(inner, || Command::ForgetConsumer { consumer }, perform::Context::default());
                inner.consumers.remove(index);
            } else {
                index += 1;
            }
        }
        if had_consumers && inner.consumers.is_empty() {
            inner.expiry.idle(now_ms(), Arc::downgrade(self));
        }
    }

    /// Removes a consumer (cancel, channel or connection close). When it was a single active
    /// consumer, the next one in subscription order takes over at once.
    pub fn remove_consumer(self: &Arc<Self>, consumer: &Arc<ConsumerHandle>) -> ConsumerRemoval {
        let mut inner = self.lock();
        let Some(index) = inner.consumers.iter().position(|(_, existing)| Arc::ptr_eq(existing, consumer)) else {
            return ConsumerRemoval::NotFound;
        };
        let (id, _) = inner.consumers.remove(index);
        let was_active = inner.core.single_active_consumer() == Some(id);
        self.run(&mut inner, || Command::CancelConsumer { consumer: id }, perform::Context::default());
        if was_active {
            self.dispatch_locked(&mut inner);
        }
        if inner.consumers.is_empty() {
            inner.expiry.idle(now_ms(), Arc::downgrade(self));
        }
        if inner.consumers.is_empty() && self.definition.auto_delete {
            ConsumerRemoval::DeleteQueue
        } else {
            ConsumerRemoval::Removed
        }
    }

    /// Ready messages and consumers, for declare-ok.
    pub fn counts(&self) -> (u32, u32) {
        let mut inner = self.lock();
        self.run(&mut inner, || Command::Expire, perform::Context::default());
        let consumers = inner.consumers.iter().filter(|(_, consumer)| !consumer.cancelled.load(Ordering::Acquire)).count();
        (inner.core.messages().ready_count() as u32, consumers as u32)
    }

    /// The queue's counts and totals, for listings.
    pub fn snapshot(&self) -> QueueSnapshot {
        let mut inner = self.lock();
        self.snapshot_locked(&mut inner)
    }

    fn snapshot_locked(&self, inner: &mut QueueInner) -> QueueSnapshot {
        self.run(inner, || Command::Expire, perform::Context::default());
        let consumers = inner.consumers.iter().filter(|(_, consumer)| !consumer.cancelled.load(Ordering::Acquire)).count() as u32;
        let messages = inner.core.messages();
        QueueSnapshot {
            ready: messages.ready_count() as u64,
            paged: messages.paged_count(),
            unacked: messages.unacked_count() as u64,
            ready_bytes: messages.ready_bytes(),
            unacked_bytes: messages.unacked_bytes(),
            ready_bytes_in_memory: messages.ready_bytes_in_memory(),
            paged_bytes: messages.paged_bytes(),
            unlogged: messages.unlogged(),
            consumers,
            stats: inner.core.stats(),
            single_active_consumer_tag: active_consumer(inner).map(|consumer| consumer.tag.to_string_lossy()),
        }
    }

    /// The figures the management sampler keeps (see `management/rates.rs`), or `None` when no
    /// command ran since it last took them: an idle queue costs the sampler one atomic load. A
    /// queue whose head can expire by its TTL is looked at every time (expiry runs when something
    /// looks), so the samples show its messages expiring without anything else touching it.
    pub fn sample_if_changed(&self) -> Option<QueueSnapshot> {
        // A queue not recovered yet is sampled once it is (its flag stays set): the sampler
        // visits every queue, and recovering them one after another here would hold it up.
        if !self.changed_since_sample.load(Ordering::Acquire) || !self.is_recovered() {
            return None;
        }
        let mut inner = self.lock();
        let snapshot = self.snapshot_locked(&mut inner);
        // Under the lock every command sets the flag after this store, so none is missed.
        let head_can_expire = inner.core.messages().head_expires_at_ms().is_some();
        self.changed_since_sample.store(head_can_expire, Ordering::Release);
        Some(snapshot)
    }

    /// Whether a command ran since the sampler last took the figures (no lock taken).
    pub fn changed_since_sample(&self) -> bool {
        self.changed_since_sample.load(Ordering::Acquire)
    }

    /// Notes that a command ran (see `changed_since_sample`).
    pub(super) fn note_changed(&self) {
        if !self.changed_since_sample.load(Ordering::Relaxed) {
            self.changed_since_sample.store(true, Ordering::Release);
        }
    }

    /// The queue's active consumers, for listings.
    pub fn consumer_views(&self) -> Vec<ConsumerView> {
        let inner = self.inner.lock();
        let exclusive = inner.core.has_exclusive_consumer();
        let single_active = inner.core.is_single_active_consumer();
        let active_id = inner.core.single_active_consumer();
        inner
            .consumers
            .iter()
            .filter(|(_, consumer)| !consumer.cancelled.load(Ordering::Acquire))
            .map(|(id, consumer)| {
                let active = !single_active || active_id == Some(*id);
                (consumer, active, activity_status(single_active, active))
            })
            .map(|(consumer, active, activity_status)| ConsumerView {
                tag: consumer.tag.to_string_lossy(),
                channel: consumer.channel.id,
                connection_id: consumer.channel.connection.id,
                ack_required: !consumer.no_ack,
                prefetch: consumer.prefetch,
                priority: consumer.priority,
                exclusive,
                active,
                activity_status,
            })
            .collect()
    }

    /// Drops ready messages; returns how many.
    pub fn purge(&self) -> u32 {
        let mut inner = self.lock();
        match self.run(&mut inner, || Command::Purge, perform::Context::default()).reply {
            Reply::Purged { count } => count.min(u64::from(u32::MAX)) as u32,
            _ => 0,
        }
    }

    /// Marks the queue deleted and hands back its consumers (to notify) and its ready count.
    pub fn delete(&self) -> (u32, Vec<Arc<ConsumerHandle>>) {
        self.deleted.store(true, Ordering::Release);
        let mut inner = self.lock();
        let count = inner.core.messages().ready_count() as u32;
        let consumers = std::mem::take(&mut inner.consumers).into_iter().map(|(_, consumer)| consumer).collect();
        let window = self.log().is_some().then_some(paging::WINDOW);
        // A page-in still out finds the queue deleted and is discarded.
        inner.core = QueueCore::new(QueueState::new(0), inner.limits.core_limits(), window);
        inner.pager = None;
        inner.expiry.remove_file();
        if let Some(sender) = &self.dead_letter_sender {
            sender.cancel_expiry(&mut inner.expiry_deadline);
        }
        if let Some(cache) = self.deduplication.get() {
            cache.remove_files();
        }
        if let Some(log) = self.log() {
            if let Err(error) = log.lock().delete() {
                tracing::error!(%error, "deleting a queue log failed");
            }
        }
        (count, consumers)
    }
}

/// How soon a queue looks again when its head is paged (a visit asks for the page-in that gives
/// the head its expiry; the page-in's result tells the real deadline).
pub const PAGED_HEAD_RETRY_MS: u64 = 100;

/// How soon a queue hands its dead letters over again when the worker's backlog was full.
pub const HAND_OVER_RETRY_MS: u64 = 100;

impl QueueRuntime {
    /// The dead-letter worker's visit at the queue's deadline `key`: expires the head and takes
    /// every dead letter the queue still holds. It dispatches rather than only expiring, so a
    /// backlog paged to disk is paged in and expires too, one page-in batch per visit, with no
    /// consumer asking. The commands it runs tell the queue's next deadline.
    pub fn expire_due(self: &Arc<Self>, key: DeadlineKey) -> Option<DeadLetterBatch> {
        let mut inner = self.lock();
        inner.expiry_deadline.taken(key);
        if self.deleted.load(Ordering::Acquire) {
            return None;
        }
        self.dispatch_locked(&mut inner);
        self.take_batch(&mut inner)
    }

    /// Tells the dead-letter worker when the queue next needs a visit: when its head expires,
    /// soon when its head is paged or dead letters wait for the worker's backlog, never when it
    /// has nothing to expire. Called after each command: an earlier head than the deadline held
    /// costs one map operation; the same or a later one costs a comparison.
    fn tell_expiry_deadline(&self, inner: &mut QueueInner, now_ms: u64) {
        let Some(sender) = &self.dead_letter_sender else { return };
        if inner.limits.dead_letter.is_none() {
            return;
        }
        let messages = inner.core.messages();
        let deadline_ms = if !inner.dead_letters.is_empty() {
            Some(now_ms.saturating_add(HAND_OVER_RETRY_MS))
        } else if messages.head_is_paged() {
            Some(now_ms.saturating_add(PAGED_HEAD_RETRY_MS))
        } else {
            messages.head_expires_at_ms()
        };
        let queue = self.self_reference.clone();
        sender.schedule_expiry(&mut inner.expiry_deadline, deadline_ms, || DeadlineQueue::Classic(queue));
    }

    fn take_batch(&self, inner: &mut QueueInner) -> Option<DeadLetterBatch> {
        if inner.dead_letters.is_empty() {
            return None;
        }
        let letters = std::mem::take(&mut inner.dead_letters);
        // Made at the first dead letter: a command runs only once the log is recovered.
        let source = self.dead_letter_source.get_or_init(|| {
            Arc::new(DeadLetterSource {
                vhost: self.vhost.clone(),
                queue: self.definition.name.clone(),
                log: self.log().cloned(),
                quorum: None,
            })
        });
        Some(DeadLetterBatch { source: source.clone(), letters, scope: crate::dead_letter::DeadLetterScope::Everywhere })
    }

    /// Hands the dead letters a command made to the worker; while its backlog is full they stay
    /// here, for the next command or sweep.
    fn hand_over_dead_letters(&self, inner: &mut QueueInner) {
        let Some(sender) = &self.dead_letter_sender else {
            inner.dead_letters.clear();
            return;
        };
        if let Some(batch) = self.take_batch(inner) {
            if let Err(batch) = sender.try_send(batch) {
                inner.dead_letters = batch.letters;
            }
        }
    }
}

/// A queue restored unrecovered, locked by the background walker while its log is opened: the
/// walker opens many logs, makes their seals durable with one sync of the file system, then
/// installs each (see `recovery_walker.rs`). A user of the queue waits on its lock meanwhile.
pub struct UnrecoveredQueue<'a> {
    queue: &'a QueueRuntime,
    inner: parking_lot::MutexGuard<'a, QueueInner>,
    recovery: Arc<LazyRecovery>,
}

impl UnrecoveredQueue<'_> {
    /// Opens the queue's log without syncing the seals it writes.
    pub fn open_log(&self) -> Result<RecoveredLog, ClassicStorageError> {
        self.recovery.open_log(&self.queue.definition, &self.queue.vhost, false)
    }

    /// Installs the opened log (its seals made durable by the caller) and unlocks the queue.
    pub fn install(mut self, opened: Result<RecoveredLog, ClassicStorageError>) {
        self.queue.install_recovered(&mut self.inner, &self.recovery, opened);
    }
}

/// Runs a blocking disk wait: off the async worker when called from one (its other tasks move to
/// another worker meanwhile), as is elsewhere.
fn wait_off_worker<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

/// A restored queue's log that cannot be recovered stops the broker, as it would have stopped the
/// start had the log been read then: serving the queue without its messages would lose them.
fn recovery_failed(queue: &QueueRuntime, error: &ClassicStorageError) -> ! {
    tracing::error!(%error, queue = %queue.name(), vhost = %queue.vhost, "recovering a queue's log failed; stopping");
    eprintln!("lepus: recovering queue '{}' in vhost '{}' failed: {error}", queue.name(), queue.vhost);
    std::process::exit(1)
}

/// x-max-priority (checked at declaration to be 0 to 255; an integer of any width, as RabbitMQ
/// takes it), 0 without it: a plain queue.
pub fn max_priority(arguments: &amqp_codec::FieldTable) -> u8 {
    let maximum = arguments.get("x-max-priority").and_then(|value| value.as_i64()).unwrap_or(0);
    maximum.clamp(0, i64::from(u8::MAX)) as u8
}

/// Whether the declaration asks for a single active consumer (a bool, as RabbitMQ requires).
pub(crate) fn single_active_consumer(arguments: &amqp_codec::FieldTable) -> bool {
    matches!(arguments.get("x-single-active-consumer"), Some(amqp_codec::FieldValue::Bool(true)))
}

/// A consumer's `activity_status` as RabbitMQ names it: "up" on a queue without a single active
/// consumer, else "single_active" for the one getting the messages and "waiting" for the others.
pub(crate) fn activity_status(single_active: bool, active: bool) -> &'static str {
    match (single_active, active) {
        (false, _) => "up",
        (true, true) => "single_active",
        (true, false) => "waiting",
    }
}

/// x-consumer-timeout when it is a positive integer. RabbitMQ 3.10.8 ignores the argument (and
/// takes any value, measured); later versions honour it, as Lepus does: another value is ignored,
/// as 3.10.8 ignores it, so a declaration that RabbitMQ takes is never refused.
pub(crate) fn consumer_timeout_argument_ms(arguments: &amqp_codec::FieldTable) -> Option<u64> {
    arguments.get("x-consumer-timeout").and_then(|value| value.as_i64()).filter(|timeout| *timeout > 0).map(|timeout| timeout as u64)
}

/// With x-single-active-consumer, the consumer getting the messages, unless it was cancelled under
/// a delivery and waits for its channel's cleanup.
fn active_consumer(inner: &QueueInner) -> Option<&Arc<ConsumerHandle>> {
    let active_id = inner.core.single_active_consumer()?;
    let (_, consumer) = inner.consumers.iter().find(|(id, _)| *id == active_id)?;
    (!consumer.cancelled.load(Ordering::Acquire)).then_some(consumer)
}

/// The message's own TTL (its expiration property), in milliseconds.
pub(crate) fn own_ttl_ms(message: &Message) -> Option<u64> {
    if !message.header.has_expiration() {
        return None;
    }
    message
        .header
        .properties()
        .ok()
        .and_then(|properties| properties.expiration)
        .and_then(|text| text.to_string_lossy().parse::<u64>().ok())
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as u64).unwrap_or(0)
}
