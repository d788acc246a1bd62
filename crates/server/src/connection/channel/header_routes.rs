//! Sender-selected destinations: the `CC` and `BCC` headers of a publish name more routing keys,
//! as RabbitMQ routes them (`rabbit_basic:header_routes`). The message goes, through the same
//! exchange, to what each of those keys routes to, once per queue; `BCC` is taken out before any
//! queue holds the message, so no consumer learns who was blind-copied.
//!
//! Only a message with a header named `CC` or `BCC` pays for this (one decode of its properties);
//! any other message with headers costs a walk of its header names, without decoding a value.

use amqp_codec::{ContentHeader, FieldTable, FieldValue, ShortStr};
use broker_core::Message;
use std::sync::Arc;

/// The routing keys in a message's `CC` and `BCC` headers (arrays of long strings; elements of
/// another type, and keys past 255 bytes, which no binding can match, are skipped), and whether
/// it carries a `BCC` header to take out.
pub(super) fn header_routes(message: &Message) -> (Vec<ShortStr>, bool) {
    if !message.header.may_have_header_named(&[b"CC", b"BCC"]) {
        return (Vec::new(), false);
    }
    let Some(headers) = message.header.properties().ok().and_then(|properties| properties.headers) else {
        return (Vec::new(), false);
    };
    let mut keys = routing_keys_in(&headers, "CC");
    keys.extend(routing_keys_in(&headers, "BCC"));
    (keys, headers.get("BCC").is_some())
}

/// The routing keys a `CC` or `BCC` header names (see [`header_routes`]).
fn routing_keys_in(headers: &FieldTable, name: &str) -> Vec<ShortStr> {
    let Some(FieldValue::Array(values)) = headers.get(name) else {
        return Vec::new();
    };
    values
        .iter()
        .filter_map(|value| match value {
            FieldValue::LongStr(key) if key.len() <= 255 => Some(ShortStr::from_bytes(key.clone())),
            _ => None,
        })
        .collect()
}

/// The message without its `BCC` header (the body is shared, the header re-encoded), its BCC
/// keys kept beside it (`Message::bcc_routing_keys`) for a dead letter to be routed by.
pub(super) fn without_bcc(message: &Arc<Message>) -> Arc<Message> {
    let Ok(mut properties) = message.header.properties() else {
        return message.clone();
    };
    let mut bcc_keys = Vec::new();
    if let Some(headers) = properties.headers.as_mut() {
        bcc_keys = routing_keys_in(headers, "BCC");
        headers.0.retain(|(name, _)| name.as_bytes() != b"BCC");
    }
    let header = ContentHeader::from_properties(message.header.class_id, message.header.body_size, &properties);
    let bcc_routing_keys = (!bcc_keys.is_empty()).then(|| Arc::from(bcc_keys));
    Arc::new(Message { header, bcc_routing_keys, ..(**message).clone() })
}
