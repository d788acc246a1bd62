//! Simulated messages: the body names its publisher, its sequence number and its TTL, and the
//! rest of it is a function of those, so a recovered body proves which publish it is and that
//! not one byte changed.

use amqp_codec::{BasicProperties, ContentHeader, ShortStr};
use broker_core::Message;
use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;

/// A publish's identity: publisher in the top 16 bits, its sequence number below. It is also the
/// confirm's delivery tag.
pub type MessageId = u64;

/// The bytes before the filler: id and TTL.
const HEADER_BYTES: usize = 16;
/// The most filler a body carries, so segments roll every few messages.
pub const FILLER_BYTES_MAX: u64 = 200;

/// The id of `publisher`'s `sequence`-th publish.
pub fn message_id(publisher: u16, sequence: u64) -> MessageId {
    (u64::from(publisher) << 48) | sequence
}

/// The publisher of `id`.
pub fn publisher_of(id: MessageId) -> u16 {
    (id >> 48) as u16
}

/// The sequence number of `id` among its publisher's publishes.
pub fn sequence_of(id: MessageId) -> u64 {
    id & 0xffff_ffff_ffff
}

/// The one body `id` has.
pub fn body(id: MessageId, ttl_ms: Option<u64>, filler_bytes: u64) -> Bytes {
    let mut body = BytesMut::with_capacity(HEADER_BYTES + filler_bytes as usize);
    body.put_u64(id);
    body.put_u64(ttl_ms.map_or(0, |ttl| ttl + 1));
    for index in 0..filler_bytes {
        body.put_u8((id.wrapping_mul(31).wrapping_add(index) % 251) as u8);
    }
    body.freeze()
}

/// Reads a body back: its id and TTL, if it is exactly the body that id was published with.
pub fn parse_body(body: &[u8]) -> Option<(MessageId, Option<u64>)> {
    if body.len() < HEADER_BYTES {
        return None;
    }
    let id = u64::from_be_bytes(body[..8].try_into().ok()?);
    let ttl_field = u64::from_be_bytes(body[8..16].try_into().ok()?);
    let ttl_ms = ttl_field.checked_sub(1);
    let expected = self::body(id, ttl_ms, (body.len() - HEADER_BYTES) as u64);
    (expected[..] == body[..]).then_some((id, ttl_ms))
}

/// The message a publisher sends, persistent, as a channel hands it to a queue.
pub fn message(id: MessageId, ttl_ms: Option<u64>, filler_bytes: u64) -> Message {
    let body = body(id, ttl_ms, filler_bytes);
    let properties = BasicProperties {
        delivery_mode: Some(2),
        expiration: ttl_ms.map(|ttl| ShortStr::from(ttl.to_string().as_str())),
        ..Default::default()
    };
    Message {
        exchange: ShortStr::from(""),
        routing_key: ShortStr::from("q"),
        header: ContentHeader::from_properties(60, body.len() as u64, &properties),
        body,
        published_at_ns: 0,
        bcc_routing_keys: None,
    }
}

/// A message as the queue core holds it.
#[derive(Debug, Clone)]
pub struct Simulated {
    /// Its id.
    pub id: MessageId,
    /// Its TTL, if it has one.
    pub ttl_ms: Option<u64>,
    /// The message itself.
    pub message: Arc<Message>,
}

impl queue_core::Payload for Simulated {
    fn size_bytes(&self) -> u64 {
        self.message.body.len() as u64
    }
}
