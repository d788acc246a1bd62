//! A queue at runtime: its messages, its consumers, and handing messages to consumers.
//!
//! Each queue has its own lock; there is no broker-wide lock on the publish, deliver or ack path.
//! Whoever changes what a queue can deliver (a publish, an ack freeing prefetch, a new consumer, a
//! writer that drained) calls [`QueueRuntime::dispatch`] right there, so no extra task hop is paid.
//! Lock order: queue, then a channel's ledger; never the other way round.

use crate::policy::Policy;
use crate::shared::{ConsumerHandle, Outbound, Readiness, Unacked};
use amqp_codec::ShortStr;
use broker_core::queue::{QueueState, QueuedMessage};
use broker_core::vhost::{queue_length_limit, Overflow, QueueDefinition};
use broker_core::{AmqpError, Message};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use storage::syncer::SharedLog;

mod paging;

pub use paging::Pager;

/// The runtime of one queue.
#[derive(Debug)]
pub struct QueueRuntime {
    /// Fixed properties.
    pub definition: QueueDefinition,
    /// The vhost's name, for reply texts.
    pub vhost: String,
    /// The message log, for durable queues.
    pub log: Option<SharedLog>,
    inner: Mutex<QueueInner>,
    deleted: AtomicBool,
}

#[derive(Debug)]
struct QueueInner {
    messages: QueueState,
    consumers: Vec<Arc<ConsumerHandle>>,
    /// Where the round robin resumes among consumers of equal priority.
    next_consumer: usize,
    has_exclusive_consumer: bool,
    /// Where the paged tail continues on disk, while the queue pages.
    pager: Option<Pager>,
    /// Totals since the queue was created (or the broker started), for rates in listings.
    stats: QueueStats,
    /// Limits from the queue's arguments and its policy.
    limits: QueueLimits,
}

/// A queue's effective limits: its arguments merged with the policy that applies to it, the way
/// RabbitMQ merges them (the lower `max-length` and `message-ttl` win; an `x-overflow` argument wins
/// over the policy's).
#[derive(Debug, Clone, Default)]
struct QueueLimits {
    length_limit: Option<(u64, Overflow)>,
    message_ttl_ms: Option<u64>,
    policy: Option<Arc<Policy>>,
}

impl QueueLimits {
    fn new(arguments: &amqp_codec::FieldTable, policy: Option<Arc<Policy>>) -> QueueLimits {
        let settings = policy.as_ref().map(|policy| policy.queue_settings).unwrap_or_default();
        let argument_limit = queue_length_limit(arguments);
        let argument_overflow = arguments.get("x-overflow").and(argument_limit.map(|(_, overflow)| overflow));
        let length = lower(argument_limit.map(|(limit, _)| limit), settings.max_length);
        let overflow = argument_overflow.or(settings.overflow).unwrap_or(Overflow::DropHead);
        let argument_ttl = arguments.get("x-message-ttl").and_then(|value| value.as_i64()).map(|ttl| ttl.max(0) as u64);
        QueueLimits {
            length_limit: length.map(|limit| (limit, overflow)),
            message_ttl_ms: lower(argument_ttl, settings.message_ttl_ms),
            policy,
        }
    }
}

fn lower(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Message totals of a queue (RabbitMQ's message_stats), kept under the queue's lock.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueStats {
    /// Messages enqueued.
    pub published: u64,
    /// Deliveries to consumers and basic.get.
    pub delivered: u64,
    /// Deliveries settled by ack (or no-ack).
    pub acked: u64,
    /// Deliveries put back (reject, nack, recover, consumer gone).
    pub requeued: u64,
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
}

/// A queue's state for listings (management API, metrics).
#[derive(Debug, Clone)]
pub struct QueueSnapshot {
    /// Ready messages (in memory and paged).
    pub ready: u64,
    /// Ready messages on disk only.
    pub paged: u64,
    /// Delivered and not settled.
    pub unacked: u64,
    /// Active consumers.
    pub consumers: u32,
    /// Totals.
    pub stats: QueueStats,
}

/// What happened to a published message at one queue.
#[derive(Debug)]
pub enum Enqueued {
    /// Enqueued and written to this log, which must be synced before a confirm.
    Logged(SharedLog),
    /// Enqueued in memory only (transient message or queue), or dropped at once by a zero length limit.
    InMemory,
    /// Refused: the queue is at its x-max-length with x-overflow reject-publish.
    Rejected,
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
    ) -> Arc<QueueRuntime> {
        Arc::new(QueueRuntime {
            inner: Mutex::new(QueueInner {
                messages,
                consumers: Vec::new(),
                next_consumer: 0,
                has_exclusive_consumer: false,
                pager,
                stats: QueueStats::default(),
                limits: QueueLimits::new(&definition.arguments, None),
            }),
            definition,
            vhost: vhost.to_string(),
            log,
            deleted: AtomicBool::new(false),
        })
    }

    /// The queue's name.
    pub fn name(&self) -> &ShortStr {
        &self.definition.name
    }

    /// The log to settle a message in, if it has a record there.
    fn log_of(&self, queued: &QueuedMessage) -> Option<&SharedLog> {
        self.log.as_ref().filter(|_| queued.logged)
    }

    /// Enqueues a message and delivers what it can.
    pub fn publish(self: &Arc<Self>, message: Arc<Message>) -> Enqueued {
        if self.deleted.load(Ordering::Acquire) {
            return Enqueued::InMemory;
        }
        let mut inner = self.inner.lock();
        if let Some((limit, overflow)) = inner.limits.length_limit {
            if inner.messages.ready_count() as u64 >= limit {
                match overflow {
                    Overflow::RejectPublish => return Enqueued::Rejected,
                    Overflow::DropHead => {
                        // Room for the new message.
                        self.drop_head_to(&mut inner, limit.max(1) - 1);
                        if limit == 0 {
                            return Enqueued::InMemory;
                        }
                    }
                }
            }
        }
        inner.stats.published += 1;
        if self.should_page(&inner) {
            let enqueued = self.page_out(&mut inner, &message);
            self.dispatch_locked(&mut inner);
            return enqueued;
        }
        let expires_at_ms = expiry(&message, inner.limits.message_ttl_ms);
        let log = self.log.as_ref().filter(|_| message.is_persistent()).cloned();
        let position = inner.messages.push_expiring(message.clone(), expires_at_ms, log.is_some());
        if let Some(log) = &log {
            log.lock().append_publish(position, &message, true);
        }
        self.dispatch_locked(&mut inner);
        match log {
            Some(log) => Enqueued::Logged(log),
            None => Enqueued::InMemory,
        }
    }

    /// Delivers ready messages to consumers that can take them.
    pub fn dispatch(self: &Arc<Self>) {
        let mut inner = self.inner.lock();
        self.dispatch_locked(&mut inner);
    }

    /// Drops the oldest ready messages (settling them in the log) until at most `count` are ready.
    fn drop_head_to(&self, inner: &mut QueueInner, count: u64) {
        while inner.messages.ready_count() as u64 > count {
            if inner.messages.ready_in_memory() == 0 {
                self.page_in(inner);
            }
            let Some((position, dropped)) = inner.messages.pop(false) else {
                break;
            };
            if let Some(log) = self.log_of(&dropped) {
                log.lock().append_settled(position);
            }
        }
    }

    /// Applies the policy that now matches the queue (or none). A lower length limit drops the
    /// oldest messages at once when the overflow is drop-head, as RabbitMQ does; a new TTL applies
    /// to messages enqueued from now on.
    pub fn apply_policy(&self, policy: Option<Arc<Policy>>) {
        let mut inner = self.inner.lock();
        inner.limits = QueueLimits::new(&self.definition.arguments, policy);
        if let Some((limit, Overflow::DropHead)) = inner.limits.length_limit {
            self.drop_head_to(&mut inner, limit);
        }
    }

    /// The name of the policy that applies to the queue, and its definition.
    pub fn policy(&self) -> Option<Arc<Policy>> {
        self.inner.lock().limits.policy.clone()
    }
}

/// When a message published now expires: the sooner of its own expiration and the queue's TTL.
fn expiry(message: &Message, message_ttl_ms: Option<u64>) -> Option<u64> {
    let own = if message.header.has_expiration() {
        message
            .header
            .properties()
            .ok()
            .and_then(|properties| properties.expiration)
            .and_then(|text| text.to_string_lossy().parse::<u64>().ok())
    } else {
        None
    };
    let ttl_ms = lower(own, message_ttl_ms)?;
    Some(now_ms().saturating_add(ttl_ms))
}

impl QueueRuntime {
    /// Drops expired messages at the head (settling them in the log).
    fn expire_head(&self, inner: &mut QueueInner) {
        for (position, expired) in inner.messages.drop_expired_head(now_ms()) {
            if let Some(log) = self.log_of(&expired) {
                log.lock().append_settled(position);
            }
        }
    }

    fn dispatch_locked(self: &Arc<Self>, inner: &mut QueueInner) {
        self.page_in(inner);
        self.expire_head(inner);
        while inner.messages.ready_count() > 0 {
            let Some(index) = self.pick_consumer(inner) else {
                return;
            };
            // Borrowing the consumer in place, rather than cloning its Arc, saves two contended
            // reference count updates per delivery.
            let QueueInner { messages, consumers, stats, .. } = inner;
            let consumer = &consumers[index];
            if !self.deliver_to(messages, stats, consumer) {
                // The channel closed under us: its cleanup removes the consumer; try the others.
                consumer.cancelled.store(true, Ordering::Release);
            }
            self.page_in(inner);
            self.expire_head(inner);
        }
    }

    /// The highest-priority consumer that can take a message, round robin among equals.
    fn pick_consumer(self: &Arc<Self>, inner: &mut QueueInner) -> Option<usize> {
        let count = inner.consumers.len();
        let mut best: Option<(usize, i64)> = None;
        for offset in 0..count {
            let index = (inner.next_consumer + offset) % count;
            let consumer = &inner.consumers[index];
            match consumer.readiness() {
                Readiness::Ready => {
                    if best.is_none_or(|(_, priority)| consumer.priority > priority) {
                        best = Some((index, consumer.priority));
                    }
                }
                Readiness::WriterFull => consumer.channel.connection.note_stalled(self),
                Readiness::Blocked => {}
            }
        }
        let (index, _) = best?;
        inner.next_consumer = (index + 1) % count;
        Some(index)
    }

    /// Hands the first ready message to `consumer`. False when its channel has closed.
    fn deliver_to(self: &Arc<Self>, messages: &mut QueueState, stats: &mut QueueStats, consumer: &Arc<ConsumerHandle>) -> bool {
        let channel = &consumer.channel;
        let mut ledger = channel.ledger.lock();
        if !ledger.open {
            return false;
        }
        let Some((position, queued)) = messages.pop(!consumer.no_ack) else {
            return true;
        };
        stats.delivered += 1;
        if consumer.no_ack {
            stats.acked += 1;
        }
        ledger.last_tag += 1;
        let delivery_tag = ledger.last_tag;
        if !consumer.no_ack {
            ledger.unacked.insert(delivery_tag, Unacked { queue: self.clone().into(), position, consumer: Some(consumer.clone()) });
            consumer.count_delivery();
        }
        channel.connection.outbound_deliveries.fetch_add(1, Ordering::AcqRel);
        channel.connection.send(Outbound::Deliver {
            channel: channel.id,
            consumer_tag: consumer.tag.clone(),
            delivery_tag,
            redelivered: queued.redelivered,
            message: queued.message.clone(),
        });
        drop(ledger);
        self.log_handed_out(position, &queued, consumer.no_ack);
        true
    }

    /// Records on disk that a message left (no-ack) or was handed out (so a restart marks it
    /// redelivered). Neither is synced on its own: losing them in a crash only means a duplicate.
    fn log_handed_out(&self, position: u64, queued: &QueuedMessage, no_ack: bool) {
        if let Some(log) = self.log_of(queued) {
            let mut log = log.lock();
            if no_ack {
                log.append_settled(position);
            } else if !queued.redelivered {
                log.append_delivered(position);
            }
        }
    }

    /// basic.get: the first ready message, tracked on `ledger` unless `no_ack`.
    pub fn get(self: &Arc<Self>, channel: &crate::shared::ChannelShared, no_ack: bool) -> Option<Outbound> {
        let mut inner = self.inner.lock();
        self.page_in(&mut inner);
        self.expire_head(&mut inner);
        let mut ledger = channel.ledger.lock();
        let (position, queued) = inner.messages.pop(!no_ack)?;
        inner.stats.delivered += 1;
        if no_ack {
            inner.stats.acked += 1;
        }
        ledger.last_tag += 1;
        let delivery_tag = ledger.last_tag;
        if !no_ack {
            ledger.unacked.insert(delivery_tag, Unacked { queue: self.clone().into(), position, consumer: None });
        }
        let message_count = inner.messages.ready_count() as u32;
        drop(ledger);
        self.log_handed_out(position, &queued, no_ack);
        Some(Outbound::GetOk { channel: channel.id, delivery_tag, redelivered: queued.redelivered, message_count, message: queued.message })
    }

    /// Settles or requeues deliveries, then delivers again (prefetch was freed).
    pub fn finish_deliveries(self: &Arc<Self>, positions: &[u64], requeue: bool) {
        let mut inner = self.inner.lock();
        for &position in positions {
            if requeue {
                if inner.messages.requeue(position) {
                    inner.stats.requeued += 1;
                }
            } else if let Some(queued) = inner.messages.settle(position) {
                inner.stats.acked += 1;
                if let Some(log) = self.log_of(&queued) {
                    log.lock().append_settled(position);
                }
            }
        }
        self.dispatch_locked(&mut inner);
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
        let mut inner = self.inner.lock();
        inner.consumers.retain(|existing| !existing.cancelled.load(Ordering::Acquire));
        if inner.has_exclusive_consumer || (exclusive && !inner.consumers.is_empty()) {
            return Err(AmqpError::access_refused(format!("queue '{}' in vhost '{}' in exclusive use", self.name(), self.vhost)));
        }
        inner.has_exclusive_consumer = exclusive;
        inner.consumers.push(consumer);
        accepted();
        self.dispatch_locked(&mut inner);
        Ok(())
    }

    /// Removes a consumer (cancel, channel or connection close).
    pub fn remove_consumer(&self, consumer: &Arc<ConsumerHandle>) -> ConsumerRemoval {
        let mut inner = self.inner.lock();
        let before = inner.consumers.len();
        inner.consumers.retain(|existing| !Arc::ptr_eq(existing, consumer));
        if inner.consumers.len() == before {
            return ConsumerRemoval::NotFound;
        }
        inner.has_exclusive_consumer = false;
        inner.next_consumer = 0;
        if inner.consumers.is_empty() && self.definition.auto_delete {
            ConsumerRemoval::DeleteQueue
        } else {
            ConsumerRemoval::Removed
        }
    }

    /// Ready messages and consumers, for declare-ok.
    pub fn counts(&self) -> (u32, u32) {
        let mut inner = self.inner.lock();
        self.expire_head(&mut inner);
        let consumers = inner.consumers.iter().filter(|consumer| !consumer.cancelled.load(Ordering::Acquire)).count();
        (inner.messages.ready_count() as u32, consumers as u32)
    }

    /// The queue's counts and totals, for listings.
    pub fn snapshot(&self) -> QueueSnapshot {
        let mut inner = self.inner.lock();
        self.expire_head(&mut inner);
        let consumers = inner.consumers.iter().filter(|consumer| !consumer.cancelled.load(Ordering::Acquire)).count() as u32;
        QueueSnapshot {
            ready: inner.messages.ready_count() as u64,
            paged: inner.messages.paged_count(),
            unacked: inner.messages.unacked_count() as u64,
            consumers,
            stats: inner.stats,
        }
    }

    /// The queue's active consumers, for listings.
    pub fn consumer_views(&self) -> Vec<ConsumerView> {
        let inner = self.inner.lock();
        inner
            .consumers
            .iter()
            .filter(|consumer| !consumer.cancelled.load(Ordering::Acquire))
            .map(|consumer| ConsumerView {
                tag: consumer.tag.to_string_lossy(),
                channel: consumer.channel.id,
                connection_id: consumer.channel.connection.id,
                ack_required: !consumer.no_ack,
                prefetch: consumer.prefetch,
                priority: consumer.priority,
                exclusive: inner.has_exclusive_consumer,
            })
            .collect()
    }

    /// Drops ready messages; returns how many.
    pub fn purge(&self) -> u32 {
        let mut inner = self.inner.lock();
        let purged = inner.messages.purge();
        if let Some(log) = &self.log {
            let mut log = log.lock();
            for (position, queued) in &purged {
                if queued.logged {
                    log.append_settled(*position);
                }
            }
        }
        let paged = self.purge_paged(&mut inner);
        (purged.len() as u64 + paged).min(u64::from(u32::MAX)) as u32
    }

    /// Marks the queue deleted and hands back its consumers (to notify) and its ready count.
    pub fn delete(&self) -> (u32, Vec<Arc<ConsumerHandle>>) {
        self.deleted.store(true, Ordering::Release);
        let mut inner = self.inner.lock();
        let count = inner.messages.ready_count() as u32;
        let consumers = std::mem::take(&mut inner.consumers);
        inner.messages = QueueState::new(0);
        inner.pager = None;
        if let Some(log) = &self.log {
            if let Err(error) = log.lock().delete() {
                tracing::error!(%error, "deleting a queue log failed");
            }
        }
        (count, consumers)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as u64).unwrap_or(0)
}
