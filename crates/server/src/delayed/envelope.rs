//! A delayed message as the delay store keeps it: the message itself (exchange, routing key,
//! properties, body) in a publish record of a queue log, its body prefixed with what the store
//! needs to route it later: when it is due, its delay, the vhost and the delayed exchange.
//!
//! `version u8 | due_ms u64 | delay_ms u64 | vhost length u16 | vhost | exchange length u8 |
//! exchange | body`, big-endian. The prefix is checked on the way back, so a record of another
//! shape is refused, never routed.

use amqp_codec::ShortStr;
use broker_core::Message;
use bytes::{BufMut, Bytes, BytesMut};

/// The envelope's format version.
const ENVELOPE_VERSION: u8 = 1;

/// What the store keeps beside a delayed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// When it is routed, in milliseconds since the epoch.
    pub due_ms: u64,
    /// Its `x-delay` (the routed message's header is its negation).
    pub delay_ms: u64,
    /// The vhost of its delayed exchange.
    pub vhost: String,
    /// The delayed exchange it is routed from.
    pub exchange: ShortStr,
}

/// The message the store writes for `message` held back as `envelope` (its body copied once,
/// behind the prefix).
pub fn wrap(envelope: &Envelope, message: &Message) -> Message {
    let vhost = envelope.vhost.as_bytes();
    let vhost = &vhost[..vhost.len().min(usize::from(u16::MAX))];
    let exchange = envelope.exchange.as_bytes();
    let mut body = BytesMut::with_capacity(1 + 8 + 8 + 2 + vhost.len() + 1 + exchange.len() + message.body.len());
    body.put_u8(ENVELOPE_VERSION);
    body.put_u64(envelope.due_ms);
    body.put_u64(envelope.delay_ms);
    body.put_u16(vhost.len() as u16);
    body.put_slice(vhost);
    body.put_u8(exchange.len() as u8);
    body.put_slice(exchange);
    body.put_slice(&message.body);
    let mut header = message.header.clone();
    header.body_size = body.len() as u64;
    Message {
        exchange: message.exchange.clone(),
        routing_key: message.routing_key.clone(),
        header,
        body: body.freeze(),
        published_at_ns: 0,
        bcc_routing_keys: None,
    }
}

/// The envelope and the message a stored record holds; `None` when it is not an envelope.
pub fn unwrap(stored: Message) -> Option<(Envelope, Message)> {
    let body = &stored.body;
    if *body.first()? != ENVELOPE_VERSION {
        return None;
    }
    let due_ms = u64::from_be_bytes(body.get(1..9)?.try_into().ok()?);
    let delay_ms = u64::from_be_bytes(body.get(9..17)?.try_into().ok()?);
    let vhost_bytes = usize::from(u16::from_be_bytes(body.get(17..19)?.try_into().ok()?));
    let vhost = String::from_utf8(body.get(19..19 + vhost_bytes)?.to_vec()).ok()?;
    let exchange_at = 19 + vhost_bytes;
    let exchange_bytes = usize::from(*body.get(exchange_at)?);
    let exchange = ShortStr::from_bytes(Bytes::copy_from_slice(body.get(exchange_at + 1..exchange_at + 1 + exchange_bytes)?));
    let body_at = exchange_at + 1 + exchange_bytes;
    let original_body: Bytes = stored.body.slice(body_at..);
    let mut header = stored.header;
    header.body_size = original_body.len() as u64;
    let message = Message {
        exchange: stored.exchange,
        routing_key: stored.routing_key,
        header,
        body: original_body,
        published_at_ns: 0,
        bcc_routing_keys: None,
    };
    Some((Envelope { due_ms, delay_ms, vhost, exchange }, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::{BasicProperties, ContentHeader};

    #[test]
    fn an_envelope_comes_back_with_its_message_unchanged() {
        let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
        let message = Message {
            exchange: ShortStr::from("delayed"),
            routing_key: ShortStr::from("key"),
            header: ContentHeader::from_properties(60, 5, &properties),
            body: Bytes::from("hello"),
            published_at_ns: 0,
            bcc_routing_keys: None,
        };
        let envelope = Envelope { due_ms: 1_700_000_000_123, delay_ms: 5000, vhost: "/v".to_string(), exchange: ShortStr::from("x") };
        let stored = wrap(&envelope, &message);
        assert_eq!(unwrap(stored.clone()), Some((envelope, message)));
        let mut other = stored;
        other.body = other.body.slice(..10);
        assert_eq!(unwrap(other), None, "a cut record is refused");
    }
}
