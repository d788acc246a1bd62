//! A message as a quorum queue replicates it: `u32 envelope length | envelope | body`, the
//! envelope holding the exchange, the routing key, the content header's raw properties and, when
//! the message had a BCC header, its keys (`u16 count | (u8 length | key)*`, after the
//! properties: an envelope without them, as older builds wrote, ends at the properties)
//! (`replication::command::Body` counts only what follows it, so byte limits count bodies as
//! RabbitMQ does). Decoding makes slices of the Raft entry: no copy of the body.

use amqp_codec::{ContentHeader, ShortStr};
use broker_core::Message;
use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;

/// Bytes of the envelope besides its variable fields: exchange length (1), routing key length
/// (1), class id (2), property flags (2), properties length (4).
const ENVELOPE_FIXED_BYTES: usize = 10;

/// A message's replicated form.
pub fn encode(message: &Message) -> Bytes {
    let properties = &message.header.properties_raw;
    // A content header (one frame) holds fewer keys than the count can say.
    let bcc_keys = message.bcc_routing_keys.as_deref().map(|keys| &keys[..keys.len().min(usize::from(u16::MAX))]);
    let bcc_bytes = bcc_keys.map_or(0, |keys| 2 + keys.iter().map(|key| 1 + key.len()).sum::<usize>());
    let envelope = ENVELOPE_FIXED_BYTES + message.exchange.len() + message.routing_key.len() + properties.len() + bcc_bytes;
    let mut buffer = BytesMut::with_capacity(4 + envelope + message.body.len());
    buffer.put_u32_le(envelope as u32);
    buffer.put_u8(message.exchange.len() as u8);
    buffer.put_slice(message.exchange.as_bytes());
    buffer.put_u8(message.routing_key.len() as u8);
    buffer.put_slice(message.routing_key.as_bytes());
    buffer.put_u16_le(message.header.class_id);
    buffer.put_u16_le(message.header.property_flags);
    buffer.put_u32_le(properties.len() as u32);
    buffer.put_slice(properties);
    if let Some(keys) = bcc_keys {
        buffer.put_u16_le(keys.len() as u16);
        for key in keys {
            buffer.put_u8(key.len() as u8);
            buffer.put_slice(key.as_bytes());
        }
    }
    buffer.put_slice(&message.body);
    buffer.freeze()
}

/// Why replicated bytes are not a message (never written so by [`encode`]: a bug or damage that
/// passed the log's checksums).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a replicated message's envelope is malformed at byte {0}")]
pub struct EnvelopeError(pub usize);

/// The message replicated as `bytes`.
pub fn decode(bytes: &Bytes) -> Result<Arc<Message>, EnvelopeError> {
    let mut reader = Cursor { bytes, offset: 0 };
    let envelope = reader.u32()? as usize;
    let body_start = 4usize.checked_add(envelope).filter(|end| *end <= bytes.len()).ok_or(EnvelopeError(0))?;
    let exchange_length = usize::from(reader.u8()?);
    let exchange = ShortStr::from_bytes(reader.take(exchange_length)?);
    let key_length = usize::from(reader.u8()?);
    let routing_key = ShortStr::from_bytes(reader.take(key_length)?);
    let class_id = reader.u16()?;
    let property_flags = reader.u16()?;
    let properties_length = reader.u32()? as usize;
    let properties_raw = reader.take(properties_length)?;
    let mut bcc_routing_keys = None;
    if reader.offset < body_start {
        let count = reader.u16()?;
        let mut keys = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let length = usize::from(reader.u8()?);
            keys.push(ShortStr::from_bytes(reader.take(length)?));
        }
        bcc_routing_keys = Some(Arc::from(keys));
    }
    if reader.offset != body_start {
        return Err(EnvelopeError(reader.offset));
    }
    let body = bytes.slice(body_start..);
    let header = ContentHeader { class_id, body_size: body.len() as u64, property_flags, properties_raw };
    Ok(Arc::new(Message { exchange, routing_key, header, body, published_at_ns: 0, bcc_routing_keys }))
}

struct Cursor<'a> {
    bytes: &'a Bytes,
    offset: usize,
}

impl Cursor<'_> {
    fn take(&mut self, length: usize) -> Result<Bytes, EnvelopeError> {
        let end = self.offset.checked_add(length).filter(|end| *end <= self.bytes.len()).ok_or(EnvelopeError(self.offset))?;
        let slice = self.bytes.slice(self.offset..end);
        self.offset = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, EnvelopeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, EnvelopeError> {
        let bytes = self.take(2)?;
        Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self) -> Result<u32, EnvelopeError> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::BasicProperties;
    use replication::command::Body;

    #[test]
    fn a_message_comes_back_whole_and_its_size_counts_the_body_only() {
        let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
        let body = Bytes::from_static(b"hello, quorum");
        let message = Message {
            exchange: ShortStr::from("amq.direct"),
            routing_key: ShortStr::from("key"),
            header: ContentHeader::from_properties(60, body.len() as u64, &properties),
            body: body.clone(),
            published_at_ns: 0,
            bcc_routing_keys: None,
        };
        let blind = Message { bcc_routing_keys: Some(vec![ShortStr::from("bcc-one"), ShortStr::from("")].into()), ..message.clone() };
        for message in [message, blind] {
            check_round_trip(&message, &body);
        }
    }

    fn check_round_trip(message: &Message, body: &Bytes) {
        let encoded = encode(message);
        assert_eq!(Body(encoded.clone()).payload_bytes(), body.len() as u64);
        let decoded = decode(&encoded).expect("decodes");
        assert_eq!(*decoded, *message);
        for cut in 0..encoded.len() - body.len() {
            assert!(decode(&encoded.slice(..cut)).is_err(), "an envelope cut at {cut} bytes decoded");
        }
    }
}
