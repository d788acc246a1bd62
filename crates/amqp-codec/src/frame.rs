//! Frames: the 7-byte header (type, channel, size), the payload and the frame-end octet.

use crate::constants::{FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD};
use crate::properties::ContentHeader;
use crate::reader::Reader;
use crate::types::ShortStr;
use crate::{DecodeError, Method};
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// What a 0-9-1 client sends first.
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
/// Type, channel and size.
pub const FRAME_HEADER_BYTES: usize = 7;
/// Header plus the frame-end octet: what a frame costs beyond its payload.
pub const FRAME_OVERHEAD_BYTES: usize = FRAME_HEADER_BYTES + 1;

/// One decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The channel it was sent on (0 is the connection itself).
    pub channel: u16,
    /// What it carries.
    pub payload: FramePayload,
}

/// The four kinds of frame.
#[derive(Debug, Clone, PartialEq)]
pub enum FramePayload {
    /// A method with its arguments.
    Method(Method),
    /// A content header, after a content-bearing method.
    Header(ContentHeader),
    /// A piece of a message body.
    Body(Bytes),
    /// A heartbeat.
    Heartbeat,
}

/// Takes one complete frame off the front of `buffer`, or returns `None` when more bytes are needed.
///
/// `frame_max` is the negotiated maximum frame size including the 8 bytes of framing (0 means no
/// limit). Like RabbitMQ, the reader allows one empty frame's size of slack: a payload of up to
/// `frame_max` bytes is accepted, because clients such as rabbitpy and aiorabbit split bodies into
/// payloads of exactly `frame_max` and RabbitMQ has always taken them. A frame that announces more
/// is an error before its payload arrives, so a hostile size never makes us buffer it.
pub fn decode_frame(buffer: &mut BytesMut, frame_max: u32) -> Result<Option<Frame>, DecodeError> {
    if buffer.len() < FRAME_HEADER_BYTES {
        return Ok(None);
    }
    let kind = buffer[0];
    let channel = u16::from_be_bytes([buffer[1], buffer[2]]);
    let size = u32::from_be_bytes([buffer[3], buffer[4], buffer[5], buffer[6]]) as usize;
    if !matches!(kind, FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT) {
        return Err(DecodeError::UnknownFrameType(kind));
    }
    if frame_max != 0 && size as u64 > u64::from(frame_max) {
        let payload_bytes_allowed = u64::from(frame_max).saturating_sub(FRAME_OVERHEAD_BYTES as u64);
        return Err(DecodeError::FrameTooLarge { kind, payload_bytes: size as u64, payload_bytes_allowed });
    }
    if buffer.len() < FRAME_HEADER_BYTES + size + 1 {
        buffer.reserve(FRAME_HEADER_BYTES + size + 1 - buffer.len());
        return Ok(None);
    }
    let end = buffer[FRAME_HEADER_BYTES + size];
    if end != FRAME_END {
        return Err(DecodeError::BadFrameEnd(end));
    }
    buffer.advance(FRAME_HEADER_BYTES);
    let payload = buffer.split_to(size).freeze();
    buffer.advance(1);
    let payload = match kind {
        FRAME_METHOD => FramePayload::Method(decode_method(payload)?),
        FRAME_HEADER => FramePayload::Header(ContentHeader::decode(payload)?),
        FRAME_BODY => FramePayload::Body(payload),
        _ => FramePayload::Heartbeat,
    };
    Ok(Some(Frame { channel, payload }))
}

fn decode_method(payload: Bytes) -> Result<Method, DecodeError> {
    let mut reader = Reader::new(payload);
    let class_id = reader.read_u16()?;
    let method_id = reader.read_u16()?;
    let wrap = |error: DecodeError| match error {
        DecodeError::UnknownMethod { .. } => error,
        other => DecodeError::MethodArguments { class_id, method_id, detail: other.to_string() },
    };
    let method = Method::decode(class_id, method_id, &mut reader).map_err(wrap)?;
    reader.finish().map_err(wrap)?;
    Ok(method)
}

fn begin_frame(writer: &mut BytesMut, kind: u8, channel: u16) -> usize {
    writer.put_u8(kind);
    writer.put_u16(channel);
    let size_at = writer.len();
    writer.put_u32(0);
    size_at
}

fn end_frame(writer: &mut BytesMut, size_at: usize) {
    let size = (writer.len() - size_at - 4) as u32;
    writer[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
    writer.put_u8(FRAME_END);
}

/// Appends a method frame.
pub fn encode_method_frame(writer: &mut BytesMut, channel: u16, method: &Method) {
    let size_at = begin_frame(writer, FRAME_METHOD, channel);
    method.encode(writer);
    end_frame(writer, size_at);
}

/// Appends a basic.deliver method frame from borrowed fields: the same bytes as encoding a
/// [`crate::BasicDeliver`], without cloning the strings into one (a reference count each) for
/// every delivery.
pub fn encode_deliver_frame(writer: &mut BytesMut, channel: u16, deliver: DeliverFields<'_>) {
    const BASIC_DELIVER_METHOD_ID: u16 = 60;
    let size_at = begin_frame(writer, FRAME_METHOD, channel);
    writer.put_u16(crate::class_id::BASIC);
    writer.put_u16(BASIC_DELIVER_METHOD_ID);
    put_short_str(writer, deliver.consumer_tag);
    writer.put_u64(deliver.delivery_tag);
    writer.put_u8(u8::from(deliver.redelivered));
    put_short_str(writer, deliver.exchange);
    put_short_str(writer, deliver.routing_key);
    end_frame(writer, size_at);
}

/// The arguments of a basic.deliver, borrowed (see [`encode_deliver_frame`]).
#[derive(Debug, Clone, Copy)]
pub struct DeliverFields<'a> {
    /// Consumer tag.
    pub consumer_tag: &'a ShortStr,
    /// Delivery tag.
    pub delivery_tag: u64,
    /// Redelivered flag.
    pub redelivered: bool,
    /// Exchange the message was published to.
    pub exchange: &'a ShortStr,
    /// Routing key it was published with.
    pub routing_key: &'a ShortStr,
}

fn put_short_str(writer: &mut BytesMut, text: &ShortStr) {
    // A ShortStr is at most 255 bytes by construction, so the length fits its octet.
    writer.put_u8(text.len() as u8);
    writer.put_slice(text.as_bytes());
}

/// Appends a content header frame.
pub fn encode_content_header(writer: &mut BytesMut, channel: u16, header: &ContentHeader) {
    let size_at = begin_frame(writer, FRAME_HEADER, channel);
    writer.put_u16(header.class_id);
    writer.put_u16(0);
    writer.put_u64(header.body_size);
    writer.put_u16(header.property_flags);
    writer.put_slice(&header.properties_raw);
    end_frame(writer, size_at);
}

/// Appends the body as as many body frames as `frame_max` requires (none for an empty body).
pub fn encode_body_frames(writer: &mut BytesMut, channel: u16, body: &[u8], frame_max: u32) {
    let chunk_bytes_max = if frame_max == 0 { usize::MAX } else { frame_max as usize - FRAME_OVERHEAD_BYTES };
    assert!(chunk_bytes_max > 0, "frame_max {frame_max} leaves no room for a body");
    for chunk in body.chunks(chunk_bytes_max) {
        let size_at = begin_frame(writer, FRAME_BODY, channel);
        writer.put_slice(chunk);
        end_frame(writer, size_at);
    }
}

/// Appends a heartbeat frame.
pub fn encode_heartbeat(writer: &mut BytesMut) {
    writer.put_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BasicDeliver;

    #[test]
    fn deliver_frame_matches_the_generated_encoding() {
        let (consumer_tag, exchange, routing_key) = (ShortStr::from("ctag"), ShortStr::from("ex"), ShortStr::from("rk"));
        let mut generated = BytesMut::new();
        let method = Method::BasicDeliver(BasicDeliver {
            consumer_tag: consumer_tag.clone(),
            delivery_tag: 7,
            redelivered: true,
            exchange: exchange.clone(),
            routing_key: routing_key.clone(),
        });
        encode_method_frame(&mut generated, 3, &method);
        let mut borrowed = BytesMut::new();
        let fields = DeliverFields {
            consumer_tag: &consumer_tag,
            delivery_tag: 7,
            redelivered: true,
            exchange: &exchange,
            routing_key: &routing_key,
        };
        encode_deliver_frame(&mut borrowed, 3, fields);
        assert_eq!(borrowed, generated);
    }

    fn body_frame_of(payload_bytes: usize) -> BytesMut {
        let mut frame = BytesMut::new();
        frame.put_u8(FRAME_BODY);
        frame.put_u16(1);
        frame.put_u32(payload_bytes as u32);
        frame.put_bytes(b'x', payload_bytes);
        frame.put_u8(FRAME_END);
        frame
    }

    #[test]
    fn a_payload_of_exactly_frame_max_is_accepted_as_rabbitmq_accepts_it() {
        let mut buffer = body_frame_of(4096);
        let frame = decode_frame(&mut buffer, 4096).expect("RabbitMQ's slack of one empty frame").expect("complete");
        assert_eq!(frame.payload, FramePayload::Body(Bytes::from(vec![b'x'; 4096])));
    }

    #[test]
    fn a_payload_one_byte_over_frame_max_is_refused_with_rabbitmqs_text() {
        let mut buffer = body_frame_of(4097);
        let error = decode_frame(&mut buffer, 4096).expect_err("over the slack");
        assert_eq!(error.to_string(), "type 3, all octets = <<>>: {frame_too_large,4097,4088}");
    }
}
