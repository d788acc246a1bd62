//! Direct reply-to, as RabbitMQ offers it: an RPC client consumes (no-ack) from the pseudo-queue
//! `amq.rabbitmq.reply-to` and publishes its requests with that `reply_to`; the broker rewrites it
//! to `amq.rabbitmq.reply-to.<token>`, and a reply published to the default exchange with that
//! routing key goes straight to the requesting channel, through no queue.
//!
//! The token is random (128 bits), so a reply can reach only a channel that handed its token out.
//! Bound: one entry per channel consuming the pseudo-queue (a channel may consume it once), so the
//! map is bounded by the open channels; an entry leaves at basic.cancel or when its channel closes.

use crate::shared::{ChannelShared, Outbound};
use amqp_codec::ShortStr;
use broker_core::{AmqpError, Message};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// The pseudo-queue a client consumes its replies from.
pub const REPLY_TO_QUEUE: &str = "amq.rabbitmq.reply-to";

/// What the broker puts before a channel's token in the rewritten `reply_to`.
pub const REPLY_TO_PREFIX: &str = "amq.rabbitmq.reply-to.";

/// A channel consuming its replies.
#[derive(Debug)]
struct ReplyConsumer {
    channel: Weak<ChannelShared>,
    consumer_tag: ShortStr,
}

/// The channels consuming `amq.rabbitmq.reply-to`, by token.
#[derive(Debug, Default)]
pub struct ReplyConsumers {
    by_token: Mutex<HashMap<String, ReplyConsumer>>,
}

/// basic.consume on the pseudo-queue without no-ack, with RabbitMQ's text.
pub fn acknowledging_consumer_refused() -> AmqpError {
    AmqpError::precondition("reply consumer cannot acknowledge")
}

/// A second basic.consume on the pseudo-queue from the same channel, with RabbitMQ's text.
pub fn consumer_already_set() -> AmqpError {
    AmqpError::precondition("reply consumer already set")
}

/// A publish with `reply_to` set to the pseudo-queue from a channel that does not consume it.
pub fn no_reply_consumer() -> AmqpError {
    AmqpError::precondition("fast reply consumer does not exist").during(60, 40)
}

impl ReplyConsumers {
    /// Registers `channel` as consuming its replies under `consumer_tag`; returns its token.
    pub fn register(&self, channel: &Arc<ChannelShared>, consumer_tag: ShortStr) -> String {
        let token = format!("{:032x}", rand::random::<u128>());
        let consumer = ReplyConsumer { channel: Arc::downgrade(channel), consumer_tag };
        self.by_token.lock().insert(token.clone(), consumer);
        token
    }

    /// Forgets a token (basic.cancel, or its channel closed).
    pub fn unregister(&self, token: &str) {
        self.by_token.lock().remove(token);
    }

    /// Delivers a reply published to the default exchange with `routing_key`, when the key is a
    /// reply address and its channel is still consuming; otherwise the publish is unroutable (a
    /// mandatory one is returned 312 NO_ROUTE, as RabbitMQ 3.10.8 returns it).
    pub fn deliver(&self, message: &Arc<Message>) -> ReplyDelivery {
        let Some(token) = message.routing_key.as_bytes().strip_prefix(REPLY_TO_PREFIX.as_bytes()) else {
            return ReplyDelivery::NotAReply;
        };
        let Ok(token) = std::str::from_utf8(token) else { return ReplyDelivery::NobodyToDeliverTo };
        let (channel, consumer_tag) = {
            let by_token = self.by_token.lock();
            let Some(consumer) = by_token.get(token) else { return ReplyDelivery::NobodyToDeliverTo };
            let Some(channel) = consumer.channel.upgrade() else { return ReplyDelivery::NobodyToDeliverTo };
            (channel, consumer.consumer_tag.clone())
        };
        // Sent under the ledger's lock, as queue deliveries are, so delivery tags reach the
        // socket in order.
        let mut ledger = channel.ledger.lock();
        if !ledger.open {
            return ReplyDelivery::NobodyToDeliverTo;
        }
        // No-ack: the delivery takes a tag and is never tracked.
        ledger.last_tag += 1;
        let delivery_tag = ledger.last_tag;
        channel.connection.outbound_deliveries.fetch_add(1, Ordering::AcqRel);
        channel.connection.send(Outbound::Deliver {
            channel: channel.id,
            consumer_tag,
            delivery_tag,
            redelivered: false,
            message: message.clone(),
        });
        ReplyDelivery::Delivered
    }
}

/// What became of a publish to the default exchange that no queue took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyDelivery {
    /// Its routing key is not a reply address.
    NotAReply,
    /// Delivered to the requesting channel's reply consumer.
    Delivered,
    /// A reply address whose channel is gone (or that no channel made): dropped, or returned
    /// when mandatory.
    NobodyToDeliverTo,
}
