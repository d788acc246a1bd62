//! The state connections, channels and consumers share with the queues that deliver to them and
//! the syncer that confirms to them, and what the rest of the broker asks a connection's writer
//! to send ([`Outbound`]).

use crate::queue_type::{Queue, WeakQueue};
use amqp_codec::ShortStr;
use broker_core::Message;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::mpsc;

mod unacked;
pub use unacked::DeliveriesByTag;

/// How many deliveries may wait in a connection's writer before queues stop handing it more. This
/// is the bound for no-ack consumers and consumers without a prefetch limit; a slow socket then
/// holds messages in their queues, not in memory here.
pub const OUTBOUND_DELIVERIES_MAX: usize = 4096;
/// When the writer's backlog falls to this, stalled queues are woken to deliver again.
pub const OUTBOUND_DELIVERIES_RESUME: usize = OUTBOUND_DELIVERIES_MAX / 4;

/// How much work may wait for one connection (items queued to its writer plus publishes waiting
/// for their fsync) before its reader stops reading the socket. TCP then pushes back on the
/// client, the way RabbitMQ's credit flow does, so a client that publishes faster than the disk
/// syncs, or never reads its confirms, cannot grow the broker's memory without bound.
pub const CONNECTION_PENDING_WORK_MAX: usize = 65_536;
/// The reader resumes once the pending work falls to this.
pub const CONNECTION_PENDING_WORK_RESUME: usize = CONNECTION_PENDING_WORK_MAX / 2;

/// One item for a connection's writer.
#[derive(Debug)]
pub enum Outbound {
    /// Frames already encoded.
    Frames(Bytes),
    /// basic.deliver with content.
    Deliver {
        /// Channel.
        channel: u16,
        /// Consumer tag.
        consumer_tag: ShortStr,
        /// Delivery tag.
        delivery_tag: u64,
        /// Redelivered flag.
        redelivered: bool,
        /// The message.
        message: Arc<Message>,
    },
    /// basic.get-ok with content.
    GetOk {
        /// Channel.
        channel: u16,
        /// Delivery tag.
        delivery_tag: u64,
        /// Redelivered flag.
        redelivered: bool,
        /// Messages left in the queue.
        message_count: u32,
        /// The message.
        message: Arc<Message>,
    },
    /// basic.return with content.
    Return {
        /// Channel.
        channel: u16,
        /// Reply code (312).
        reply_code: u16,
        /// Reply text.
        reply_text: ShortStr,
        /// The message.
        message: Arc<Message>,
    },
    /// Flush what is queued, then close the socket.
    Shutdown,
}

/// What a connection shares with queues and the syncer.
#[derive(Debug)]
pub struct ConnectionShared {
    /// Unique per broker process.
    pub id: u64,
    /// The writer's queue.
    pub outbound: mpsc::UnboundedSender<Outbound>,
    /// Deliveries handed to the writer and not written yet.
    pub outbound_deliveries: AtomicUsize,
    /// Queues that skipped this connection's consumers because the writer was full.
    pub stalled_queues: Mutex<Vec<WeakQueue>>,
    /// Whether the client understands broker-initiated basic.cancel.
    pub consumer_cancel_notify: AtomicBool,
    /// Items queued to the writer plus publishes waiting for a sync (see [`CONNECTION_PENDING_WORK_MAX`]).
    pub pending_work: AtomicUsize,
    /// Signalled when the pending work falls to [`CONNECTION_PENDING_WORK_RESUME`].
    pub pending_work_drained: tokio::sync::Notify,
    /// Set once the client published: only publishing connections are blocked by alarms.
    pub has_published: AtomicBool,
    /// Signalled when the broker closes the connection (shutdown): 320 CONNECTION_FORCED.
    pub force_close: tokio::sync::Notify,
    /// The client's address.
    pub peer: std::net::SocketAddr,
    /// When the connection was accepted, in milliseconds since the epoch.
    pub connected_at_ms: u64,
    /// Who logged in where, and what the client said it is (set by the handshake).
    pub session: Mutex<SessionInfo>,
    /// Why the broker closes the connection, when an operator closes it (else: shutdown).
    pub close_reason: Mutex<Option<String>>,
    /// What TLS negotiated, for a connection to the AMQPS port.
    pub tls: Option<crate::tls::TlsInfo>,
    /// Bytes and socket reads and writes (RabbitMQ's recv_oct, recv_cnt, send_oct, send_cnt).
    pub traffic: crate::metrics::counters::ConnectionTraffic,
}

/// What the handshake learned about a connection, for listings.
#[derive(Debug, Clone, Default)]
pub struct SessionInfo {
    /// The logged-in user ("" before login).
    pub user: String,
    /// The vhost opened ("" before connection.open).
    pub vhost: String,
    /// The client's `product` property.
    pub client_product: String,
    /// The client's `version` property.
    pub client_version: String,
    /// Open channels.
    pub channels: usize,
    /// The open channels' shared halves, for listings (weak: a channel belongs to its connection's
    /// reader task, and the registry must not keep it, or its connection, alive).
    pub open_channels: BTreeMap<u16, Weak<ChannelShared>>,
    /// Negotiated frame_max.
    pub frame_max: u32,
    /// Negotiated heartbeat, in seconds.
    pub heartbeat_s: u16,
}

impl ConnectionShared {
    /// A connection without a socket, whose writer's items arrive on `outbound` (the management
    /// API's get messages, which reads get-ok as a value; unit tests).
    pub fn detached(id: u64, outbound: mpsc::UnboundedSender<Outbound>) -> ConnectionShared {
        ConnectionShared {
            id,
            outbound,
            outbound_deliveries: Default::default(),
            stalled_queues: Default::default(),
            consumer_cancel_notify: Default::default(),
            pending_work: Default::default(),
            pending_work_drained: tokio::sync::Notify::new(),
            has_published: Default::default(),
            force_close: tokio::sync::Notify::new(),
            peer: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            connected_at_ms: 0,
            session: Default::default(),
            close_reason: Default::default(),
            tls: None,
            traffic: Default::default(),
        }
    }

    /// Queues an item for the writer; a closed writer means the connection is going away, and
    /// whatever was meant for it is requeued by the channel cleanup.
    pub fn send(&self, item: Outbound) {
        self.pending_work.fetch_add(1, Ordering::AcqRel);
        if self.outbound.send(item).is_err() {
            self.pending_work.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Counts work that will end in a send (a publish waiting for its sync).
    pub fn begin_pending(&self) {
        self.pending_work.fetch_add(1, Ordering::AcqRel);
    }

    /// Ends work counted by [`ConnectionShared::begin_pending`], or an item the writer wrote.
    pub fn end_pending(&self, count: usize) {
        let before = self.pending_work.fetch_sub(count, Ordering::AcqRel);
        assert!(before >= count, "connection pending work underflow");
        if before - count <= CONNECTION_PENDING_WORK_RESUME && before > CONNECTION_PENDING_WORK_RESUME {
            self.pending_work_drained.notify_waiters();
        }
    }

    /// Waits while too much work is pending for this connection.
    pub async fn wait_for_capacity(&self) {
        while self.pending_work.load(Ordering::Acquire) > CONNECTION_PENDING_WORK_MAX {
            let drained = self.pending_work_drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.pending_work.load(Ordering::Acquire) <= CONNECTION_PENDING_WORK_MAX {
                return;
            }
            tokio::select! {
                _ = drained => {}
                // The writer is gone (socket failed): stop waiting; the next read ends the connection.
                _ = self.outbound.closed() => return,
            }
        }
    }

    /// Remembers a queue to wake when the writer drains.
    pub fn note_stalled(&self, queue: impl Into<WeakQueue>) {
        let queue = queue.into();
        let mut stalled = self.stalled_queues.lock();
        if !stalled.iter().any(|known| known.same(&queue)) {
            stalled.push(queue);
        }
    }
}

/// A delivery waiting for ack, nack or reject.
#[derive(Debug)]
pub struct Unacked {
    /// The queue it came from.
    pub queue: Queue,
    /// The id its queue gave it, by which the queue settles it (a classic queue's position).
    pub position: u64,
    /// The consumer it went to (None for basic.get).
    pub consumer: Option<Arc<ConsumerHandle>>,
    /// How many consumer-timeout ticks its channel had counted when it was delivered
    /// ([`DeliveryLedger::timeout_ticks`]): it was delivered after that tick and before the next.
    pub delivered_after_tick: u64,
}

/// Delivery tags and unacked deliveries of a channel. Tags are assigned and the delivery queued to
/// the writer under this lock, so a channel's deliveries reach the client in tag order.
#[derive(Debug, Default)]
pub struct DeliveryLedger {
    /// The last tag handed out.
    pub last_tag: u64,
    /// Unacked deliveries by tag.
    pub unacked: DeliveriesByTag<Unacked>,
    /// False once the channel closes: no more deliveries.
    pub open: bool,
    /// The channel's deliveries and acks, for the broker's metrics.
    pub counters: crate::metrics::counters::DeliveryCounters,
    /// The consumer-timeout ticks the channel has counted (see `channel/consumer_timeout.rs`):
    /// a delivery notes it, so a timeout is measured from the delivery without a clock read per
    /// message.
    pub timeout_ticks: u64,
}

impl DeliveryLedger {
    /// Tracks a delivery until its ack, nack or reject.
    pub fn track(&mut self, tag: u64, queue: Queue, position: u64, consumer: Option<Arc<ConsumerHandle>>) {
        let delivered_after_tick = self.timeout_ticks;
        self.unacked.insert(tag, Unacked { queue, position, consumer, delivered_after_tick });
    }
}

/// What a channel shares with queues.
#[derive(Debug)]
pub struct ChannelShared {
    /// Channel number.
    pub id: u16,
    /// Its connection.
    pub connection: Arc<ConnectionShared>,
    /// Tags and unacked deliveries.
    pub ledger: Mutex<DeliveryLedger>,
    /// basic.qos global=true limit (0 = none).
    pub prefetch_global: AtomicU32,
    /// Unacked deliveries to consumers on this channel.
    pub unacked_consumer_deliveries: AtomicU32,
    /// channel.flow state.
    pub flow_active: AtomicBool,
    /// Publisher confirms of this channel waiting in the syncer.
    pub confirms_in_syncer: AtomicUsize,
    /// Whether confirm.select was sent (for listings).
    pub confirm_mode: AtomicBool,
    /// Whether tx.select was sent (for listings).
    pub transactional: AtomicBool,
    /// basic.qos global=false limit for new consumers (for listings).
    pub prefetch_count: AtomicU32,
    /// Consumers on this channel (for listings).
    pub consumer_count: AtomicU32,
    /// Set when the broker cancelled one of this channel's consumers (its queue was deleted); the
    /// channel then forgets cancelled consumers, freeing their tags.
    pub consumers_cancelled_by_broker: AtomicBool,
    /// Set when channel.close was sent from outside the reader task (a tx.commit whose sync
    /// failed, see `Channel::commit`); the reader then treats the channel as closing.
    pub closed_by_broker: AtomicBool,
    /// The channel's publishes, gets and confirms, for the broker's metrics.
    pub publish_counters: crate::metrics::counters::PublishCounters,
    /// Groups of confirms in the syncer, for the confirm latency histogram (a lock per group of
    /// a socket read, never per message).
    pub confirm_groups: Mutex<crate::metrics::latency::ConfirmGroups>,
    /// Confirms and tx.commits waiting for quorum queues' commits, released in order.
    pub quorum_confirms: Arc<crate::quorum::ConfirmGate>,
}

impl ChannelShared {
    /// A newly opened channel.
    pub fn new(id: u16, connection: Arc<ConnectionShared>) -> ChannelShared {
        ChannelShared {
            id,
            connection,
            ledger: Mutex::new(DeliveryLedger { open: true, ..Default::default() }),
            prefetch_global: AtomicU32::new(0),
            unacked_consumer_deliveries: AtomicU32::new(0),
            flow_active: AtomicBool::new(true),
            confirms_in_syncer: AtomicUsize::new(0),
            confirm_mode: AtomicBool::new(false),
            transactional: AtomicBool::new(false),
            prefetch_count: AtomicU32::new(0),
            consumer_count: AtomicU32::new(0),
            consumers_cancelled_by_broker: AtomicBool::new(false),
            closed_by_broker: AtomicBool::new(false),
            publish_counters: Default::default(),
            confirm_groups: Default::default(),
            quorum_confirms: crate::quorum::ConfirmGate::new(),
        }
    }
}

/// A consumer, shared by its channel and its queue.
#[derive(Debug)]
pub struct ConsumerHandle {
    /// Consumer tag.
    pub tag: ShortStr,
    /// Its channel.
    pub channel: Arc<ChannelShared>,
    /// Whether deliveries need no ack.
    pub no_ack: bool,
    /// basic.qos global=false limit in force when it was created (0 = none).
    pub prefetch: u32,
    /// Its unacked deliveries.
    pub unacked: AtomicU32,
    /// x-priority argument.
    pub priority: i64,
    /// Set when the consumer is cancelled by either side.
    pub cancelled: AtomicBool,
}

/// Why a consumer cannot take a message now.
#[derive(Debug, PartialEq, Eq)]
pub enum Readiness {
    /// It can.
    Ready,
    /// Its prefetch, channel flow or cancellation stops it.
    Blocked,
    /// Its connection's writer is full.
    WriterFull,
}

impl ConsumerHandle {
    /// Whether the consumer can take one more message now.
    pub fn readiness(&self) -> Readiness {
        if self.cancelled.load(Ordering::Acquire) || !self.channel.flow_active.load(Ordering::Acquire) {
            return Readiness::Blocked;
        }
        if !self.no_ack {
            if self.prefetch != 0 && self.unacked.load(Ordering::Acquire) >= self.prefetch {
                return Readiness::Blocked;
            }
            let global = self.channel.prefetch_global.load(Ordering::Acquire);
            if global != 0 && self.channel.unacked_consumer_deliveries.load(Ordering::Acquire) >= global {
                return Readiness::Blocked;
            }
        }
        if self.channel.connection.outbound_deliveries.load(Ordering::Acquire) >= OUTBOUND_DELIVERIES_MAX {
            return Readiness::WriterFull;
        }
        Readiness::Ready
    }

    /// Counts a delivery against the consumer's and the channel's prefetch.
    pub fn count_delivery(&self) {
        self.unacked.fetch_add(1, Ordering::AcqRel);
        self.channel.unacked_consumer_deliveries.fetch_add(1, Ordering::AcqRel);
    }

    /// Releases a settled or requeued delivery from the prefetch counts.
    pub fn release_delivery(&self) {
        let before = self.unacked.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "consumer unacked count underflow");
        let before = self.channel.unacked_consumer_deliveries.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "channel unacked count underflow");
    }
}

impl storage::syncer::ConfirmSink for ChannelShared {
    /// Sends a group commit's confirms for this channel as few frames as it can: a run of acks
    /// becomes one `basic.ack` with `multiple`, which is exact because every earlier confirm of
    /// the channel has been sent already (they pass the syncer in order).
    fn confirm_batch(&self, confirms: &[(u64, bool)]) {
        use amqp_codec::{encode_method_frame, BasicAck, BasicNack};
        assert!(confirms.windows(2).all(|pair| pair[0].0 < pair[1].0), "a channel's confirms arrive in order");
        if self.ledger.lock().open {
            let mut frames = bytes::BytesMut::with_capacity(32 * confirms.len().min(16));
            let mut acked_through: Option<u64> = None;
            let acked = confirms.iter().filter(|(_, durable)| *durable).count() as u64;
            self.publish_counters.confirmed.fetch_add(acked, Ordering::Relaxed);
            for &(delivery_tag, durable) in confirms {
                if durable {
                    acked_through = Some(delivery_tag);
                    continue;
                }
                if let Some(through) = acked_through.take() {
                    encode_method_frame(&mut frames, self.id, &BasicAck { delivery_tag: through, multiple: true }.into());
                }
                encode_method_frame(&mut frames, self.id, &BasicNack { delivery_tag, multiple: false, requeue: false }.into());
            }
            if let Some(through) = acked_through {
                encode_method_frame(&mut frames, self.id, &BasicAck { delivery_tag: through, multiple: true }.into());
            }
            self.connection.send(Outbound::Frames(frames.freeze()));
        }
        if let Some(&(last_tag, _)) = confirms.last() {
            self.confirm_groups.lock().finished(last_tag);
        }
        self.confirms_in_syncer.fetch_sub(confirms.len(), Ordering::AcqRel);
        self.connection.end_pending(confirms.len());
    }
}
