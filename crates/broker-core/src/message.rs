//! A published message as the broker holds it: shared by every queue it was routed to.

use amqp_codec::{ContentHeader, ShortStr};
use bytes::Bytes;
use std::sync::Arc;

/// A message, immutable once published. Queues hold it behind an `Arc`, so fanning out to many
/// queues copies nothing.
#[derive(Debug, Clone)]
pub struct Message {
    /// The exchange it was published to.
    pub exchange: ShortStr,
    /// The routing key it was published with.
    pub routing_key: ShortStr,
    /// The content header, properties kept raw.
    pub header: ContentHeader,
    /// The body.
    pub body: Bytes,
    /// When the socket read that carried its publish ended, in nanoseconds on the server's
    /// latency clock (`lepus_delivery_latency_seconds`); 0 when unknown (recovered from disk,
    /// dead-lettered, made by a test). Not part of the message: equality ignores it.
    pub published_at_ns: u64,
    /// The routing keys of its publish's `BCC` header, taken out of its headers before any queue
    /// held it (no consumer learns who was blind-copied) but kept, as RabbitMQ keeps them among
    /// the message's routing keys: its dead letter is routed by them too.
    pub bcc_routing_keys: Option<Arc<[ShortStr]>>,
}

impl PartialEq for Message {
    fn eq(&self, other: &Message) -> bool {
        self.exchange == other.exchange
            && self.routing_key == other.routing_key
            && self.header == other.header
            && self.body == other.body
            && self.bcc_routing_keys == other.bcc_routing_keys
    }
}

impl Message {
    /// Whether the publisher asked for it to survive a restart (delivery-mode 2).
    pub fn is_persistent(&self) -> bool {
        self.header.delivery_mode() == Some(2)
    }
}

impl queue_core::Payload for Message {
    fn size_bytes(&self) -> u64 {
        self.body.len() as u64
    }

    fn priority(&self) -> u8 {
        self.header.priority().unwrap_or(0)
    }
}
