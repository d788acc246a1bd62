//! A delivery (basic.deliver, its content header and its body frames) encoded with one reservation
//! and a handful of copies.
//!
//! The broker's writer encodes every delivery. Encoded field by field through `BufMut`, a delivery
//! of a 16-byte message took about 35 `put_*` calls, each a capacity check, a `memcpy` call and a
//! length update: 10 % of the broker's instructions per message (bench/results/hotpath-budget.md).
//! Here the sizes are summed first, the fixed part (the method frame and the content header up to
//! its properties) is written through a cursor into bytes already reserved, and the properties and
//! the body are copied once each.

use crate::constants::{FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD};
use crate::frame::{DeliverFields, FRAME_HEADER_BYTES, FRAME_OVERHEAD_BYTES};
use crate::properties::ContentHeader;
use crate::types::ShortStr;
use bytes::BytesMut;

const BASIC_DELIVER_METHOD_ID: u16 = 60;
/// Class, weight, body size and property flags: the content header's payload before the properties.
const CONTENT_HEADER_FIXED_BYTES: usize = 2 + 2 + 8 + 2;

/// Writes into a slice whose size was computed beforehand; writing past it is a bug in that
/// computation, and panics on the slice's bounds check rather than corrupting the stream.
struct Cursor<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Cursor<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let end = self.at + bytes.len();
        self.out[self.at..end].copy_from_slice(bytes);
        self.at = end;
    }

    fn put_short_str(&mut self, text: &ShortStr) {
        // A ShortStr is at most 255 bytes by construction, so the length fits its octet.
        self.put(&[text.len() as u8]);
        self.put(text.as_bytes());
    }

    fn begin_frame(&mut self, kind: u8, channel: u16, payload_bytes: usize) {
        self.put(&[kind]);
        self.put(&channel.to_be_bytes());
        self.put(&(payload_bytes as u32).to_be_bytes());
    }
}

/// Appends basic.deliver, its content header and its body as as many body frames as `frame_max`
/// requires (none for an empty body): the same bytes as [`crate::encode_deliver_frame`],
/// [`crate::encode_content_header`] and [`crate::encode_body_frames`] one after the other.
pub fn encode_delivery(
    writer: &mut BytesMut,
    channel: u16,
    deliver: DeliverFields<'_>,
    header: &ContentHeader,
    body: &[u8],
    frame_max: u32,
) {
    let chunk_bytes_max = if frame_max == 0 { usize::MAX } else { frame_max as usize - FRAME_OVERHEAD_BYTES };
    assert!(chunk_bytes_max > 0, "frame_max {frame_max} leaves no room for a body");
    let method_payload_bytes = 2 + 2 + 1 + deliver.consumer_tag.len() + 8 + 1 + 1 + deliver.exchange.len() + 1 + deliver.routing_key.len();
    let header_payload_bytes = CONTENT_HEADER_FIXED_BYTES + header.properties_raw.len();
    let body_frames = body.len().div_ceil(chunk_bytes_max);
    writer.reserve(FRAME_OVERHEAD_BYTES * (2 + body_frames) + method_payload_bytes + header_payload_bytes + body.len());

    let fixed_bytes = FRAME_HEADER_BYTES + method_payload_bytes + 1 + FRAME_HEADER_BYTES + CONTENT_HEADER_FIXED_BYTES;
    let start = writer.len();
    writer.resize(start + fixed_bytes, 0);
    let mut cursor = Cursor { out: &mut writer[start..], at: 0 };
    cursor.begin_frame(FRAME_METHOD, channel, method_payload_bytes);
    cursor.put(&crate::class_id::BASIC.to_be_bytes());
    cursor.put(&BASIC_DELIVER_METHOD_ID.to_be_bytes());
    cursor.put_short_str(deliver.consumer_tag);
    cursor.put(&deliver.delivery_tag.to_be_bytes());
    cursor.put(&[u8::from(deliver.redelivered)]);
    cursor.put_short_str(deliver.exchange);
    cursor.put_short_str(deliver.routing_key);
    cursor.put(&[FRAME_END]);
    cursor.begin_frame(FRAME_HEADER, channel, header_payload_bytes);
    cursor.put(&header.class_id.to_be_bytes());
    cursor.put(&0u16.to_be_bytes());
    cursor.put(&header.body_size.to_be_bytes());
    cursor.put(&header.property_flags.to_be_bytes());
    assert_eq!(cursor.at, fixed_bytes, "the delivery's fixed part was sized wrong");
    writer.extend_from_slice(&header.properties_raw);
    // Each body frame's header goes out with the end of the frame before it, in one copy.
    for chunk in body.chunks(chunk_bytes_max) {
        let mut seam = [FRAME_END, FRAME_BODY, 0, 0, 0, 0, 0, 0];
        seam[2..4].copy_from_slice(&channel.to_be_bytes());
        seam[4..8].copy_from_slice(&(chunk.len() as u32).to_be_bytes());
        writer.extend_from_slice(&seam);
        writer.extend_from_slice(chunk);
    }
    writer.extend_from_slice(&[FRAME_END]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_body_frames, encode_content_header, encode_deliver_frame, BasicProperties, FieldTable, FieldValue};
    use proptest::prelude::*;

    fn field_by_field(channel: u16, fields: DeliverFields<'_>, header: &ContentHeader, body: &[u8], frame_max: u32) -> BytesMut {
        let mut expected = BytesMut::new();
        encode_deliver_frame(&mut expected, channel, fields);
        encode_content_header(&mut expected, channel, header);
        encode_body_frames(&mut expected, channel, body, frame_max);
        expected
    }

    proptest! {
        #[test]
        fn a_delivery_is_the_same_bytes_as_its_frames_encoded_one_by_one(
            channel in any::<u16>(),
            delivery_tag in any::<u64>(),
            redelivered in any::<bool>(),
            tag_bytes in 0usize..=255,
            exchange_bytes in 0usize..=255,
            key_bytes in 0usize..=255,
            body_bytes in 0usize..3000,
            frame_max in prop_oneof![Just(0u32), 9u32..600, Just(4096u32)],
            with_headers in any::<bool>(),
        ) {
            let text = |length: usize, letter: u8| ShortStr::from_bytes(bytes::Bytes::from(vec![letter; length]));
            let (consumer_tag, exchange, routing_key) = (text(tag_bytes, b'c'), text(exchange_bytes, b'e'), text(key_bytes, b'k'));
            let mut properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
            if with_headers {
                let mut headers = FieldTable::new();
                headers.insert("x-trace", FieldValue::LongStr(bytes::Bytes::from_static(b"abc")));
                properties.headers = Some(headers);
            }
            let body: Vec<u8> = (0..body_bytes).map(|index| index as u8).collect();
            let header = ContentHeader::from_properties(60, body.len() as u64, &properties);
            let fields = DeliverFields { consumer_tag: &consumer_tag, delivery_tag, redelivered, exchange: &exchange, routing_key: &routing_key };
            let mut encoded = BytesMut::from(&b"already queued"[..]);
            encode_delivery(&mut encoded, channel, fields, &header, &body, frame_max);
            let mut expected = BytesMut::from(&b"already queued"[..]);
            expected.extend_from_slice(&field_by_field(channel, fields, &header, &body, frame_max));
            prop_assert_eq!(encoded, expected);
        }
    }
}
