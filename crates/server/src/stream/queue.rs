//! A stream queue at runtime: the stream it appends to, the consumers reading it, its settings
//! from arguments and policy, and its figures.
//!
//! Publishing appends the message (as an AMQP 1.0 record) to the stream's open chunk under the
//! stream's lock and hands back a confirm ticket naming the stream; the syncer's group commit
//! writes, fdatasyncs and commits it before the confirm goes out. Every message of a stream is
//! kept whatever its delivery mode, as in RabbitMQ. Consumers are tasks of their own
//! ([`super::consumer`]); this side wakes them (a commit, an ack, a writer that drained) and
//! cancels them.

use super::consumer::{self, ConsumerTask};
use crate::policy::Policy;
use crate::queue_type::{ConsumerRemoval, ConsumerView, QueueSnapshot};
use crate::shared::ConsumerHandle;
use amqp_codec::ShortStr;
use broker_core::vhost::QueueDefinition;
use broker_core::{AmqpError, Message};
use parking_lot::Mutex;
use queue_core::QueueStats;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use storage::stream::{OffsetSpec, Retention, Stream, StreamError, StreamSettings};

/// How often retention by age is applied to each stream (besides at every segment roll): a
/// segment older than `max-age` is deleted at most this late.
pub const RETENTION_CHECK_INTERVAL_MS: u64 = 10_000;

/// One stream queue.
#[derive(Debug)]
pub struct StreamQueue {
    /// Fixed properties.
    pub definition: QueueDefinition,
    /// The vhost's name, for reply texts.
    pub vhost: String,
    /// The stream.
    pub stream: Arc<Stream>,
    consumers: Mutex<Vec<Arc<ConsumerTask>>>,
    /// Stream-protocol connections reading this stream, woken with the consumers (see
    /// `stream_protocol`): dropped ones are pruned when a new one comes.
    protocol_readers: Mutex<Vec<std::sync::Weak<tokio::sync::Notify>>>,
    policy: Mutex<Option<Arc<Policy>>>,
    deleted: AtomicBool,
    published: AtomicU64,
    /// Deliveries and acks, counted by the consumers.
    pub(super) delivered: AtomicU64,
    acked: AtomicU64,
    /// In a cluster: the stream's copy on this node, led by one member.
    replication: std::sync::OnceLock<Arc<super::replication::StreamReplication>>,
}

/// What a publish did at a stream queue.
pub enum Appended {
    /// Appended; confirmed once the stream commits it.
    Written,
    /// The queue is being deleted: dropped (confirmed, as RabbitMQ confirms a dropped message).
    Deleted,
    /// The append failed (a record too large for a chunk entry): nacked.
    Refused,
    /// Forwarded to the leader of a replicated stream: confirmed when it answers.
    Forwarded(Arc<crate::quorum::CommitSlot>),
    /// Appended on the leader of a replicated stream in this epoch: confirmed once the cluster
    /// commits it (the offset after it).
    Replicated {
        /// The offset after the message.
        next_offset: u64,
        /// The leader's epoch.
        epoch: u64,
    },
}

thread_local! {
    /// The record of the message being published, reused: no allocation per publish once warm.
    static RECORD: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl StreamQueue {
    /// A stream queue over `stream`, with the stream told of the commits (to wake consumers).
    pub fn new(definition: QueueDefinition, vhost: &str, stream: Arc<Stream>) -> Arc<StreamQueue> {
        let queue = Arc::new(StreamQueue {
            definition,
            vhost: vhost.to_string(),
            stream,
            consumers: Mutex::new(Vec::new()),
            protocol_readers: Mutex::new(Vec::new()),
            policy: Mutex::new(None),
            deleted: AtomicBool::new(false),
            published: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            replication: std::sync::OnceLock::new(),
        });
        let weak: Weak<StreamQueue> = Arc::downgrade(&queue);
        queue.stream.set_commit_listener(Arc::new(move |next_offset| {
            if let Some(queue) = weak.upgrade() {
                queue.wake_consumers();
                if let Some(replication) = queue.replication.get() {
                    replication.release_waiters(next_offset);
                }
            }
        }));
        queue.stream.set_settings(settings(&queue.definition.arguments, None));
        queue
    }

    /// The queue's name.
    pub fn name(&self) -> &ShortStr {
        &self.definition.name
    }

    /// Makes this a replicated stream's copy (once, as it is made).
    pub fn set_replication(&self, replication: Arc<super::replication::StreamReplication>) {
        let _ = self.replication.set(replication);
    }

    /// The stream's replication on this node, in a cluster.
    pub fn replication(&self) -> Option<&Arc<super::replication::StreamReplication>> {
        self.replication.get()
    }

    /// Appends a published message to the stream (in a cluster, on its leader: a member that
    /// does not lead it forwards the message there).
    pub fn publish(&self, message: &Message) -> Appended {
        let epoch = match self.replication.get() {
            Some(replication) => match replication.leading_epoch() {
                Some(epoch) => Some(epoch),
                None => return self.forward(replication, message),
            },
            None => None,
        };
        let appended = RECORD.with(|record| {
            let mut record = record.borrow_mut();
            record.clear();
            super::record::encode(message, &mut record);
            let appended = self.stream.append_record(&record, storage::stream::now_ms());
            if record.capacity() > 1 << 20 {
                // One huge message must not keep its buffer on this thread for good.
                *record = Vec::new();
            }
            appended
        });
        match (appended, epoch) {
            (Ok(offset), Some(epoch)) => {
                self.published.fetch_add(1, Ordering::Relaxed);
                if let Some(replication) = self.replication.get() {
                    replication.request_sync();
                }
                Appended::Replicated { next_offset: offset + 1, epoch }
            }
            (Ok(_), None) => {
                self.published.fetch_add(1, Ordering::Relaxed);
                Appended::Written
            }
            (Err(StreamError::Deleted), _) => Appended::Deleted,
            (Err(error), _) => {
                tracing::warn!(queue = %self.definition.name, %error, "a message could not be appended to its stream");
                Appended::Refused
            }
        }
    }

    /// Sends a message to the stream's leader, on another member.
    fn forward(&self, replication: &Arc<super::replication::StreamReplication>, message: &Message) -> Appended {
        let record = RECORD.with(|record| {
            let mut record = record.borrow_mut();
            record.clear();
            super::record::encode(message, &mut record);
            bytes::Bytes::copy_from_slice(&record)
        });
        if record.len() > storage::stream::chunk::SIMPLE_ENTRY_BYTES_MAX {
            return Appended::Refused;
        }
        self.published.fetch_add(1, Ordering::Relaxed);
        let slot = crate::quorum::CommitSlot::new();
        replication.forward(record, super::replication::CommitWaiter::Slot(slot.clone()));
        Appended::Forwarded(slot)
    }

    /// basic.consume: starts a consumer reading from `offset`. `accepted` runs before its first
    /// delivery (it sends consume-ok).
    pub fn add_consumer(
        self: &Arc<Self>,
        handle: Arc<ConsumerHandle>,
        offset: OffsetSpec,
        accepted: impl FnOnce(),
    ) -> Result<(), AmqpError> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(AmqpError::no_queue(&self.definition.name.to_string_lossy(), &self.vhost));
        }
        let reader = self.stream.reader(offset, storage::stream::ChunkSelector::UserData).map_err(|error| {
            tracing::error!(queue = %self.definition.name, %error, "starting a stream reader failed");
            AmqpError::internal(format!("could not read stream {}: {error}", self.definition.name))
        })?;
        let task = Arc::new(ConsumerTask::new(handle));
        self.consumers.lock().push(task.clone());
        accepted();
        consumer::start(self.clone(), task, reader);
        Ok(())
    }

    /// basic.cancel, or the consumer's channel closed: its task ends.
    pub fn remove_consumer(&self, handle: &Arc<ConsumerHandle>) -> ConsumerRemoval {
        let removed = {
            let mut consumers = self.consumers.lock();
            consumers.iter().position(|task| Arc::ptr_eq(&task.handle, handle)).map(|index| consumers.remove(index))
        };
        match removed {
            Some(task) => {
                task.stop();
                ConsumerRemoval::Removed
            }
            None => ConsumerRemoval::NotFound,
        }
    }

    /// Acks (and the channel's cleanup of unacked deliveries, which requeues them: a stream has
    /// nothing to requeue) free the consumers' credit: they read on.
    pub fn settle(&self, deliveries: usize) {
        self.acked.fetch_add(deliveries as u64, Ordering::Relaxed);
        self.wake_consumers();
    }

    /// Wakes every consumer to look again (a commit, credit freed, a writer that drained).
    pub fn wake_consumers(&self) {
        for task in self.consumers.lock().iter() {
            task.wake();
        }
        for reader in self.protocol_readers.lock().iter() {
            if let Some(notify) = reader.upgrade() {
                notify.notify_one();
            }
        }
    }

    /// Wakes `notify` with the consumers (commits, deletion) until it is dropped: a
    /// stream-protocol connection reading this stream.
    pub fn watch(&self, notify: &Arc<tokio::sync::Notify>) {
        let mut readers = self.protocol_readers.lock();
        readers.retain(|reader| reader.strong_count() > 0);
        readers.push(Arc::downgrade(notify));
    }

    /// Whether the queue was deleted.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// The messages it holds: what declare-ok and listings count (RabbitMQ counts offsets from
    /// the first held to the committed end).
    pub fn message_count(&self) -> u64 {
        let info = self.stream.info();
        info.committed_next_offset.saturating_sub(info.first_offset)
    }

    /// Its counts and totals, for listings.
    pub fn snapshot(&self) -> QueueSnapshot {
        let consumers = self.consumers.lock();
        let unacked = consumers.iter().map(|task| u64::from(task.handle.unacked.load(Ordering::Acquire))).sum();
        let stats = QueueStats {
            published: self.published.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
            acked: self.acked.load(Ordering::Relaxed),
            requeued: 0,
        };
        QueueSnapshot {
            ready: self.message_count(),
            paged: 0,
            unacked,
            // Not shown for streams (their listing drops the byte fields).
            ready_bytes: 0,
            unacked_bytes: 0,
            consumers: consumers.len() as u32,
            stats,
            ..QueueSnapshot::default()
        }
    }

    /// Its consumers, for listings: RabbitMQ 3.10.8 lists a stream's consumers as not active,
    /// with activity status `up` (measured).
    pub fn consumer_views(&self) -> Vec<ConsumerView> {
        self.consumers
            .lock()
            .iter()
            .map(|task| ConsumerView {
                tag: task.handle.tag.to_string_lossy(),
                channel: task.handle.channel.id,
                connection_id: task.handle.channel.connection.id,
                ack_required: true,
                prefetch: task.handle.prefetch,
                priority: 0,
                exclusive: false,
                active: false,
                activity_status: "up",
            })
            .collect()
    }

    /// Deletes the stream and its files; hands back its consumers, to tell of the cancel.
    pub fn delete(&self) -> (u32, Vec<Arc<ConsumerHandle>>) {
        self.deleted.store(true, Ordering::Release);
        if let Some(replication) = self.replication.get() {
            replication.stop();
        }
        let count = self.message_count().min(u64::from(u32::MAX)) as u32;
        if let Err(error) = self.stream.delete() {
            tracing::error!(queue = %self.definition.name, %error, "deleting a stream's files failed");
        }
        let consumers: Vec<Arc<ConsumerTask>> = std::mem::take(&mut *self.consumers.lock());
        // Stream-protocol readers find it deleted when they look.
        self.wake_consumers();
        let handles = consumers
            .into_iter()
            .map(|task| {
                task.stop();
                task.handle.clone()
            })
            .collect();
        (count, handles)
    }

    /// Applies the policy that now matches the queue: retention and segment size.
    pub fn apply_policy(&self, policy: Option<Arc<Policy>>) {
        self.stream.set_settings(settings(&self.definition.arguments, policy.as_deref()));
        *self.policy.lock() = policy;
        self.stream.evaluate_retention(storage::stream::now_ms());
    }

    /// The policy that applies to it.
    pub fn policy(&self) -> Option<Arc<Policy>> {
        self.policy.lock().clone()
    }

    /// Applies retention by age now (the broker's timer calls this now and then).
    pub fn evaluate_retention(&self) {
        self.stream.evaluate_retention(storage::stream::now_ms());
    }
}

/// The stream's settings from the queue's arguments and its policy: as in RabbitMQ 3.10.8's
/// `rabbit_stream_queue`, a policy's value wins over the argument (`policy_precedence`).
pub fn settings(arguments: &amqp_codec::FieldTable, policy: Option<&Policy>) -> StreamSettings {
    let policy = policy.map(|policy| &policy.queue_settings);
    let argument_bytes = arguments.get("x-max-length-bytes").and_then(|value| value.as_i64()).map(|bytes| bytes.max(0) as u64);
    let argument_age = match arguments.get("x-max-age") {
        Some(amqp_codec::FieldValue::LongStr(text)) => match super::arguments::parse_max_age(text) {
            super::arguments::MaxAge::Milliseconds(age) => Some(age),
            _ => None,
        },
        _ => None,
    };
    let argument_segment =
        arguments.get("x-stream-max-segment-size-bytes").and_then(|value| value.as_i64()).map(|bytes| bytes.max(0) as u64);
    let retention = Retention {
        max_bytes: policy.and_then(|policy| policy.max_length_bytes).or(argument_bytes),
        max_age_ms: policy.and_then(|policy| policy.max_age_ms).or(argument_age),
    };
    let segment_bytes_max = policy
        .and_then(|policy| policy.stream_max_segment_size_bytes)
        .or(argument_segment)
        // 0 is accepted by RabbitMQ; a segment then takes one chunk.
        .unwrap_or(storage::stream::SEGMENT_BYTES_MAX_DEFAULT);
    StreamSettings { segment_bytes_max, retention, ..StreamSettings::default() }
}
