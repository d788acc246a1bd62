//! One channel: assembling published content, and the exchange, queue, basic, tx and confirm
//! methods. Runs on the connection's reader task, which owns this state alone; what queues must
//! see lives in [`ChannelShared`].

use super::context::Context;

mod consumer_timeout;
mod delivery;
mod get;
mod header_routes;

pub use consumer_timeout::tick_interval as consumer_timeout_tick_interval;
mod methods;
mod publish;

use crate::queue_type::{ConfirmTickets, ConsumerRemoval, PendingConfirm, Queue};
use crate::shared::{ChannelShared, ConsumerHandle, Unacked};
use amqp_codec::{ChannelClose, ChannelCloseOk, ChannelOpenOk, ContentHeader, FramePayload, LongStr, Method, ShortStr};
use broker_core::{AmqpError, Message};
use bytes::{Bytes, BytesMut};
use delivery::finish_grouped;
pub use get::WaitingGet;
use rand::RngCore;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How many publishes and acks one transaction may hold before commit (a bound on memory).
pub const TRANSACTION_OPERATIONS_MAX: usize = 1_000_000;
/// How many publisher confirms a channel gathers before it hands them to the syncer even in the
/// middle of a socket read (the read buffer bounds them too; this names the bound).
pub const PENDING_CONFIRMS_MAX: usize = 4096;

/// Publishes of the current socket read whose confirm tickets are waited for together: one group
/// commit request per read instead of one per message.
#[derive(Default)]
struct PendingSync {
    tickets: ConfirmTickets,
    confirms: Vec<PendingConfirm>,
}

/// What the connection does with the channel after a frame.
pub enum After {
    /// Keep it.
    KeepOpen,
    /// It is closed: forget it.
    Forget,
}

/// A publish whose content is still arriving.
struct Content {
    exchange: ShortStr,
    routing_key: ShortStr,
    mandatory: bool,
    header: Option<ContentHeader>,
    body: BytesMut,
    first_body_frame: Option<Bytes>,
    body_received: u64,
}

/// A completed publish.
struct Publish {
    mandatory: bool,
    message: Arc<Message>,
}

/// Where a publish went.
struct Routed {
    /// Whether a queue's confirm ticket must be waited for before confirming.
    waits: bool,
    /// Whether a queue refused the message (x-overflow reject-publish).
    rejected: bool,
}

/// Acks, nacks and rejects wait in a transaction until commit.
struct PendingSettle {
    delivery_tag: u64,
    multiple: bool,
    requeue: Option<bool>,
}

#[derive(Default)]
struct Transaction {
    publishes: Vec<Publish>,
    settles: Vec<PendingSettle>,
}

/// A channel's state on the reader task.
pub struct Channel {
    shared: Arc<ChannelShared>,
    closing: bool,
    content: Option<Content>,
    consumers: HashMap<ShortStr, (Arc<ConsumerHandle>, Queue)>,
    consumer_prefetch: u32,
    /// In confirm mode: the sequence number of the last publish.
    confirm_sequence: Option<u64>,
    transaction: Option<Transaction>,
    last_declared_queue: Option<ShortStr>,
    /// The exchange this channel last passed the write-permission check for.
    publish_allowed: Option<ShortStr>,
    /// Publishes waiting to be handed to the syncer at the end of the socket read.
    pending_sync: PendingSync,
    /// The queues a publish is routed to, empty between publishes (a list reused, not allocated
    /// per message).
    routed_queues: Vec<Queue>,
    /// Deliveries acked in this socket read, taken off the ledger and not yet settled in their
    /// queues (see [`Channel::flush_acks`]).
    pending_acks: Vec<Unacked>,
    /// Direct reply-to: the token and consumer tag while the channel consumes
    /// `amq.rabbitmq.reply-to`.
    reply_consumer: Option<(String, ShortStr)>,
    /// consumer_timeout: the oldest unacked delivery and when it was first seen.
    timeout_watch: consumer_timeout::TimeoutWatch,
    /// Publishes through the current exchange not yet added to its stats.
    exchange_counts: crate::metrics::counters::PendingExchangeCounts,
}

fn random_name(prefix: &str) -> ShortStr {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 22];
    rand::thread_rng().fill_bytes(&mut bytes);
    let suffix: String = bytes.iter().map(|byte| ALPHABET[usize::from(byte % 64)] as char).collect();
    ShortStr::from(format!("{prefix}{suffix}"))
}

impl Channel {
    /// channel.open: replies open-ok.
    pub fn open(id: u16, context: &Context) -> Channel {
        context.reply(id, ChannelOpenOk { channel_id: LongStr::default() }.into());
        Channel {
            shared: Arc::new(ChannelShared::new(id, context.connection.clone())),
            closing: false,
            content: None,
            consumers: HashMap::new(),
            consumer_prefetch: 0,
            confirm_sequence: None,
            transaction: None,
            last_declared_queue: None,
            publish_allowed: None,
            pending_sync: PendingSync::default(),
            routed_queues: Vec::new(),
            pending_acks: Vec::new(),
            reply_consumer: None,
            timeout_watch: Default::default(),
            exchange_counts: Default::default(),
        }
    }

    fn id(&self) -> u16 {
        self.shared.id
    }

    /// Whether publishes wait to be handed to the syncer (see [`Channel::flush_syncs`]).
    pub fn has_pending_syncs(&self) -> bool {
        !self.pending_sync.tickets.is_empty() || !self.pending_sync.confirms.is_empty()
    }

    /// Hands the confirm tickets of this socket read's publishes to the group commit in one
    /// request. The connection calls it after each read's frames, and the channel before it
    /// releases its state.
    pub fn flush_syncs(&mut self, context: &Context) {
        if !self.has_pending_syncs() {
            return;
        }
        let PendingSync { tickets, confirms } = std::mem::take(&mut self.pending_sync);
        if let Some(last) = confirms.last() {
            self.shared.confirm_groups.lock().started(last.delivery_tag, confirms.len() as u64);
        }
        tickets.confirm_in_order(&self.shared, &context.broker.syncer, confirms);
    }

    /// Whether publishes of this socket read wait to be added to their exchange's stats.
    pub fn has_pending_counts(&self) -> bool {
        self.exchange_counts.is_pending()
    }

    /// Adds this socket read's publishes to their exchange's stats (see `PendingExchangeCounts`).
    pub fn flush_counts(&mut self) {
        self.exchange_counts.flush();
    }

    /// What the channel shares with queues and listings.
    pub fn shared(&self) -> &Arc<ChannelShared> {
        &self.shared
    }

    /// Handles one frame for this channel.
    pub fn handle(&mut self, context: &mut Context, payload: FramePayload) -> Result<After, AmqpError> {
        if !self.closing && self.shared.closed_by_broker.load(Ordering::Acquire) {
            // A failed tx.commit already sent channel.close: release what `fail` would have.
            self.release(context);
            self.closing = true;
        }
        if self.closing {
            return Ok(match payload {
                FramePayload::Method(Method::ChannelCloseOk(_)) => After::Forget,
                FramePayload::Method(Method::ChannelClose(_)) => {
                    context.reply(self.id(), ChannelCloseOk {}.into());
                    After::KeepOpen
                }
                _ => After::KeepOpen,
            });
        }
        match payload {
            FramePayload::Method(method) => {
                if let Some(content) = &self.content {
                    let expected = if content.header.is_none() { "content header for class 60" } else { "content body" };
                    return Err(AmqpError::unexpected_frame(format!(
                        "expected {expected}, got non content frame instead (method {})",
                        method.name()
                    ))
                    .during(60, 40));
                }
                // Any other method sees the queues as they are after the acks before it.
                if !matches!(method, Method::BasicAck(_)) {
                    self.flush_acks();
                }
                if self.shared.consumers_cancelled_by_broker.swap(false, Ordering::AcqRel) {
                    self.forget_cancelled_consumers();
                }
                let (class_id, method_id) = (method.class_id(), method.method_id());
                self.handle_method(context, method).map_err(
                    |error| {
                        if error.class_id == 0 {
                            error.during(class_id, method_id)
                        } else {
                            error
                        }
                    },
                )
            }
            FramePayload::Header(header) => {
                self.handle_header(context, header)?;
                Ok(After::KeepOpen)
            }
            FramePayload::Body(body) => {
                self.handle_body(context, body)?;
                Ok(After::KeepOpen)
            }
            FramePayload::Heartbeat => Err(AmqpError::unexpected_frame("heartbeat frame on a non-zero channel")),
        }
    }

    /// Forgets consumers the broker cancelled (their queue was deleted): their tags become free
    /// for a new basic.consume, as in RabbitMQ, where aio-pika's and the Java client's recovery
    /// re-consume with the same tag. Their unacked deliveries stay on the ledger until settled.
    fn forget_cancelled_consumers(&mut self) {
        self.consumers.retain(|_, (consumer, _)| !consumer.cancelled.load(Ordering::Acquire));
        self.shared.consumer_count.store(self.consumers.len() as u32, Ordering::Relaxed);
    }

    /// Sends channel.close for a soft error and releases the channel's deliveries and consumers.
    pub fn fail(&mut self, context: &mut Context, error: &AmqpError) {
        let close = ChannelClose {
            reply_code: error.code,
            reply_text: ShortStr::truncating(error.text.clone()),
            class_id: error.class_id,
            method_id: error.method_id,
        };
        context.reply(self.id(), close.into());
        self.release(context);
        self.closing = true;
    }

    /// Stops deliveries, removes consumers (auto-deleting queues) and requeues unacked messages.
    pub fn release(&mut self, context: &Context) {
        self.flush_syncs(context);
        self.flush_counts();
        // Acked deliveries are already off the ledger: settle them, or they would be neither
        // settled nor requeued.
        self.flush_acks();
        self.content = None;
        self.transaction = None;
        let unacked = {
            let mut ledger = self.shared.ledger.lock();
            ledger.open = false;
            std::mem::take(&mut ledger.unacked)
        };
        self.shared.consumer_count.store(0, Ordering::Relaxed);
        if let Some((token, _)) = self.reply_consumer.take() {
            context.broker.reply_consumers.unregister(&token);
        }
        for (_, (consumer, queue)) in self.consumers.drain() {
            consumer.cancelled.store(true, Ordering::Release);
            if queue.cancel(&consumer) == ConsumerRemoval::DeleteQueue {
                context.broker.remove_queue(&context.vhost, queue.name());
            }
        }
        finish_grouped(unacked.into_values(), crate::queue_type::Settlement::Return);
    }
}
