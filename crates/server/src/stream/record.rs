//! An AMQP 0-9-1 message as a stream record, and back, the way RabbitMQ 3.10's
//! `rabbit_msg_record` maps them, so a message published over AMQP 0-9-1 reads the same over the
//! RabbitMQ Stream protocol (an AMQP 1.0 message) and the reverse.
//!
//! A record is AMQP 1.0 sections:
//! - message annotations: `x-exchange`, `x-routing-key`, and the 0-9-1 properties AMQP 1.0 has no
//!   field for, `x-basic-priority`, `x-basic-delivery-mode` (ubyte), `x-basic-expiration` (string);
//! - properties: message-id, user-id, reply-to, correlation-id, content-type, content-encoding,
//!   creation-time (the 0-9-1 timestamp, in milliseconds); omitted when none is set;
//! - application properties: the headers, and `x-basic-type` and `x-basic-app-id`; omitted when
//!   empty. Table and array headers are dropped, as RabbitMQ drops them (measured: they do not
//!   come back); decimals too (RabbitMQ has no AMQP 1.0 counterpart for them);
//! - the body as one data section, or as it is when the 0-9-1 type is `amqp-1.0` (the body is
//!   AMQP 1.0 sections already).
//!
//! Read back for an AMQP 0-9-1 consumer, a record without `x-exchange` (published over the stream
//! protocol) comes from the default exchange with the queue's name as routing key, and a body that
//! is not one data section is handed over encoded, with type `amqp-1.0`, as RabbitMQ does.

use super::amqp10::{write, Decoder, Malformed, Value};
use amqp_codec::{BasicProperties, FieldTable, FieldValue, ShortStr};
use broker_core::Message;
use bytes::Bytes;

const MESSAGE_ANNOTATIONS: u8 = 0x72;
const PROPERTIES: u8 = 0x73;
const APPLICATION_PROPERTIES: u8 = 0x74;
const DATA: u8 = 0x75;
const AMQP_SEQUENCE: u8 = 0x76;
const AMQP_VALUE: u8 = 0x77;
/// The 0-9-1 type that says the body is AMQP 1.0 sections already.
const AMQP10_TYPE: &[u8] = b"amqp-1.0";

/// Appends `message` to `out` as a stream record. The properties are decoded once here (a
/// message with none, or only a delivery mode, decodes nothing).
pub fn encode(message: &Message, out: &mut Vec<u8>) {
    let properties = match message.header.property_flags {
        0 => BasicProperties::default(),
        // delivery-mode alone: read in place.
        0x1000 => BasicProperties { delivery_mode: message.header.delivery_mode(), ..Default::default() },
        // Checked when the content header arrived: a message that got here has valid properties.
        _ => message.header.properties().unwrap_or_default(),
    };
    encode_annotations(message, &properties, out);
    encode_properties(&properties, out);
    encode_application_properties(&properties, out);
    if properties.message_type.as_ref().is_some_and(|kind| kind.as_bytes() == AMQP10_TYPE) {
        out.extend_from_slice(&message.body);
    } else {
        write::descriptor(out, DATA);
        write::binary(out, &message.body);
    }
}

fn encode_annotations(message: &Message, properties: &BasicProperties, out: &mut Vec<u8>) {
    write::descriptor(out, MESSAGE_ANNOTATIONS);
    let at = write::start_compound(out, 0xd1);
    let mut elements = 0;
    let mut text = |out: &mut Vec<u8>, key: &[u8], value: &[u8]| {
        write::symbol(out, key);
        write::string(out, value);
        elements += 2;
    };
    text(out, b"x-exchange", message.exchange.as_bytes());
    text(out, b"x-routing-key", message.routing_key.as_bytes());
    if let Some(expiration) = &properties.expiration {
        text(out, b"x-basic-expiration", expiration.as_bytes());
    }
    for (key, value) in [(b"x-basic-priority".as_slice(), properties.priority), (b"x-basic-delivery-mode", properties.delivery_mode)] {
        if let Some(value) = value {
            write::symbol(out, key);
            write::fixed(out, 0x50, &[value]);
            elements += 2;
        }
    }
    write::finish_compound(out, at, elements);
}

fn encode_properties(properties: &BasicProperties, out: &mut Vec<u8>) {
    let fields: [Option<(u8, &[u8])>; 8] = [
        properties.message_id.as_ref().map(|id| (0xa1, id.as_bytes())),
        properties.user_id.as_ref().map(|user| (0xa0, user.as_bytes())),
        None,
        None,
        properties.reply_to.as_ref().map(|reply| (0xa1, reply.as_bytes())),
        properties.correlation_id.as_ref().map(|id| (0xa1, id.as_bytes())),
        properties.content_type.as_ref().map(|kind| (0xa3, kind.as_bytes())),
        properties.content_encoding.as_ref().map(|encoding| (0xa3, encoding.as_bytes())),
    ];
    let last = fields.iter().rposition(Option::is_some);
    if last.is_none() && properties.timestamp.is_none() {
        return;
    }
    write::descriptor(out, PROPERTIES);
    let at = write::start_compound(out, 0xd0);
    let count = if properties.timestamp.is_some() { 10 } else { last.map_or(0, |last| last + 1) };
    for field in fields.iter().take(count.min(fields.len())) {
        match field {
            None => write::null(out),
            Some((0xa1, text)) => write::string(out, text),
            Some((0xa0, bytes)) => write::binary(out, bytes),
            Some((_, symbol)) => write::symbol(out, symbol),
        }
    }
    if let Some(seconds) = properties.timestamp {
        // absolute-expiry-time, then creation-time in milliseconds.
        write::null(out);
        write::fixed(out, 0x83, &(seconds as i64).saturating_mul(1000).to_be_bytes());
    }
    write::finish_compound(out, at, count as u32);
}

fn encode_application_properties(properties: &BasicProperties, out: &mut Vec<u8>) {
    let headers = properties.headers.as_ref().map(|headers| headers.0.as_slice()).unwrap_or(&[]);
    let kind = properties.message_type.as_ref().filter(|kind| kind.as_bytes() != AMQP10_TYPE);
    if headers.is_empty() && kind.is_none() && properties.app_id.is_none() {
        return;
    }
    write::descriptor(out, APPLICATION_PROPERTIES);
    let at = write::start_compound(out, 0xd1);
    let mut elements = 0;
    for (key, value) in headers {
        let mut encoded = Vec::new();
        if encode_header_value(value, &mut encoded) {
            write::string(out, key.as_bytes());
            out.extend_from_slice(&encoded);
            elements += 2;
        }
    }
    for (key, value) in [(b"x-basic-type".as_slice(), kind), (b"x-basic-app-id", properties.app_id.as_ref())] {
        if let Some(value) = value {
            write::string(out, key);
            write::string(out, value.as_bytes());
            elements += 2;
        }
    }
    write::finish_compound(out, at, elements);
}

/// A header value as AMQP 1.0 (RabbitMQ's `from_091`); false for the types it drops.
fn encode_header_value(value: &FieldValue, out: &mut Vec<u8>) -> bool {
    match value {
        FieldValue::LongStr(text) => write::string(out, text),
        FieldValue::I64(number) => write::fixed(out, 0x81, &number.to_be_bytes()),
        FieldValue::U8(number) => write::fixed(out, 0x50, &[*number]),
        FieldValue::I16(number) => write::fixed(out, 0x61, &number.to_be_bytes()),
        FieldValue::U16(number) => write::fixed(out, 0x60, &number.to_be_bytes()),
        FieldValue::U32(number) => write::fixed(out, 0x70, &number.to_be_bytes()),
        FieldValue::I32(number) => write::fixed(out, 0x71, &number.to_be_bytes()),
        FieldValue::F64(number) => write::fixed(out, 0x82, &number.to_be_bytes()),
        FieldValue::F32(number) => write::fixed(out, 0x72, &number.to_be_bytes()),
        FieldValue::Bool(true) => out.push(0x41),
        FieldValue::Bool(false) => out.push(0x42),
        FieldValue::Bytes(bytes) => write::binary(out, bytes),
        FieldValue::Timestamp(seconds) => write::fixed(out, 0x83, &(*seconds as i64).saturating_mul(1000).to_be_bytes()),
        FieldValue::I8(number) => write::fixed(out, 0x51, &[*number as u8]),
        FieldValue::Void => write::null(out),
        FieldValue::Decimal(_) | FieldValue::Array(_) | FieldValue::Table(_) => return false,
    }
    true
}

/// A record read back as an AMQP 0-9-1 message.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The exchange it was published to ("" for stream protocol publishes).
    pub exchange: ShortStr,
    /// Its routing key (the queue's name for stream protocol publishes).
    pub routing_key: ShortStr,
    /// Its properties; `headers` gets the caller's `x-stream-offset`.
    pub properties: BasicProperties,
    /// Its body (a slice of the chunk's buffer: no copy).
    pub body: Bytes,
}

/// Reads the record at `record` (a slice of `chunk`) as an AMQP 0-9-1 message.
pub fn decode(chunk: &Bytes, record: &[u8], queue: &ShortStr) -> Result<Decoded, Malformed> {
    let mut decoded =
        Decoded { exchange: ShortStr::from(""), routing_key: queue.clone(), properties: BasicProperties::default(), body: Bytes::new() };
    let mut headers = FieldTable::new();
    let mut body_sections: Vec<&[u8]> = Vec::new();
    let mut single_data: Option<&[u8]> = None;
    let mut decoder = Decoder::new(record);
    while !decoder.is_empty() {
        let section_start = decoder.rest();
        let Value::Described(descriptor, value) = decoder.value()? else {
            return Err(Malformed("a section that is not a described value"));
        };
        let section = &section_start[..section_start.len() - decoder.rest().len()];
        match descriptor {
            0x72 => read_annotations(value, &mut decoded)?,
            0x73 => read_properties(value, &mut decoded.properties, &mut headers)?,
            0x74 => read_application_properties(value, &mut decoded.properties, &mut headers)?,
            0x75 => {
                let Value::Binary(body) = Decoder::new(value).value()? else { return Err(Malformed("a data section without a binary")) };
                single_data = if body_sections.is_empty() && single_data.is_none() { Some(body) } else { None };
                body_sections.push(section);
            }
            AMQP_SEQUENCE_DESCRIPTOR | AMQP_VALUE_DESCRIPTOR => {
                single_data = None;
                body_sections.push(section);
            }
            // Header, delivery annotations, footer: nothing of AMQP 0-9-1.
            _ => {}
        }
    }
    decoded.body = match (single_data, body_sections.len()) {
        (Some(body), 1) => slice_of(chunk, body),
        (_, 0) => Bytes::new(),
        _ => {
            if decoded.properties.message_type.is_none() {
                decoded.properties.message_type = Some(ShortStr::from_bytes(Bytes::from_static(AMQP10_TYPE)));
            }
            let start = body_sections[0].as_ptr() as usize - record.as_ptr() as usize;
            let last = body_sections[body_sections.len() - 1];
            let end = last.as_ptr() as usize + last.len() - record.as_ptr() as usize;
            slice_of(chunk, &record[start..end])
        }
    };
    if !headers.is_empty() {
        decoded.properties.headers = Some(headers);
    }
    Ok(decoded)
}

const AMQP_SEQUENCE_DESCRIPTOR: u64 = AMQP_SEQUENCE as u64;
const AMQP_VALUE_DESCRIPTOR: u64 = AMQP_VALUE as u64;

/// `part` (a slice of `chunk`'s bytes) as a `Bytes` sharing `chunk`'s buffer.
fn slice_of(chunk: &Bytes, part: &[u8]) -> Bytes {
    let start = part.as_ptr() as usize - chunk.as_ptr() as usize;
    chunk.slice(start..start + part.len())
}

fn short(bytes: &[u8]) -> Option<ShortStr> {
    (bytes.len() <= 255).then(|| ShortStr::from_bytes(Bytes::copy_from_slice(bytes)))
}

fn read_annotations(value: &[u8], decoded: &mut Decoded) -> Result<(), Malformed> {
    let Value::Other(map) = Decoder::new(value).value()? else { return Err(Malformed("annotations that are not a map")) };
    for (key, value) in Decoder::map_entries(map)? {
        let Value::Symbol(key) = key else { continue };
        match (key, value) {
            (b"x-exchange", Value::String(name)) => decoded.exchange = short(name).unwrap_or_else(|| ShortStr::from("")),
            (b"x-routing-key", Value::String(key)) => decoded.routing_key = short(key).unwrap_or_else(|| ShortStr::from("")),
            (b"x-basic-expiration", Value::String(expiration)) => decoded.properties.expiration = short(expiration),
            (b"x-basic-priority", Value::Ubyte(priority)) => decoded.properties.priority = Some(priority),
            (b"x-basic-delivery-mode", Value::Ubyte(mode)) => decoded.properties.delivery_mode = Some(mode),
            _ => {}
        }
    }
    Ok(())
}

fn read_properties(value: &[u8], properties: &mut BasicProperties, headers: &mut FieldTable) -> Result<(), Malformed> {
    let Value::Other(list) = Decoder::new(value).value()? else { return Err(Malformed("properties that are not a list")) };
    for (index, field) in Decoder::list_elements(list)?.into_iter().enumerate() {
        match (index, field) {
            (0, id) => properties.message_id = message_id(id, "x-message-id", headers),
            (1, Value::Binary(user)) => properties.user_id = short(user),
            (4, Value::String(reply)) => properties.reply_to = short(reply),
            (5, id) => properties.correlation_id = message_id(id, "x-correlation-id", headers),
            (6, Value::Symbol(kind)) => properties.content_type = short(kind),
            (7, Value::Symbol(encoding)) => properties.content_encoding = short(encoding),
            (9, Value::Timestamp(milliseconds)) => properties.timestamp = u64::try_from(milliseconds / 1000).ok(),
            _ => {}
        }
    }
    Ok(())
}

/// A message or correlation id as 0-9-1 text, as RabbitMQ's `message_id/3` converts it: a long
/// string goes to a header of its own; ulong, uuid and binary ids become text with a header
/// naming their type.
fn message_id(value: Value<'_>, header: &str, headers: &mut FieldTable) -> Option<ShortStr> {
    let typed = |headers: &mut FieldTable, kind: &'static str, text: String| {
        headers.insert(&format!("{header}-type"), FieldValue::LongStr(Bytes::from_static(kind.as_bytes())));
        Some(ShortStr::truncating(text))
    };
    match value {
        Value::String(text) if text.len() > 256 => {
            headers.insert(header, FieldValue::LongStr(Bytes::copy_from_slice(text)));
            None
        }
        Value::String(text) => short(text),
        Value::Ulong(number) => typed(headers, "ulong", number.to_string()),
        Value::Uuid(bytes) => typed(headers, "uuid", uuid_text(&bytes)),
        Value::Binary(bytes) => {
            let text = base64_text(bytes);
            if text.len() > 256 {
                headers.insert(header, FieldValue::Bytes(Bytes::copy_from_slice(bytes)));
                return None;
            }
            typed(headers, "binary", text)
        }
        _ => None,
    }
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

fn base64_text(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn read_application_properties(value: &[u8], properties: &mut BasicProperties, headers: &mut FieldTable) -> Result<(), Malformed> {
    let Value::Other(map) = Decoder::new(value).value()? else { return Err(Malformed("application properties that are not a map")) };
    for (key, value) in Decoder::map_entries(map)? {
        let Value::String(key) = key else { continue };
        match (key, &value) {
            (b"x-basic-type", Value::String(kind)) => properties.message_type = short(kind),
            (b"x-basic-app-id", Value::String(app)) => properties.app_id = short(app),
            _ => {
                if let (Some(key), Some(value)) = (short(key), header_value(&value)) {
                    headers.0.push((key, value));
                }
            }
        }
    }
    Ok(())
}

/// An AMQP 1.0 value as a 0-9-1 header value (RabbitMQ's `to_091`); symbols, ulongs and uuids,
/// which RabbitMQ cannot convert, become the nearest 0-9-1 value; lists and maps are dropped.
fn header_value(value: &Value<'_>) -> Option<FieldValue> {
    Some(match *value {
        Value::String(text) | Value::Symbol(text) => FieldValue::LongStr(Bytes::copy_from_slice(text)),
        Value::Long(number) => FieldValue::I64(number),
        Value::Byte(number) => FieldValue::I8(number),
        Value::Ubyte(number) => FieldValue::U8(number),
        Value::Short(number) => FieldValue::I16(number),
        Value::Ushort(number) => FieldValue::U16(number),
        Value::Uint(number) => FieldValue::U32(number),
        Value::Int(number) => FieldValue::I32(number),
        Value::Ulong(number) => FieldValue::I64(i64::try_from(number).ok()?),
        Value::Double(number) => FieldValue::F64(number),
        Value::Float(number) => FieldValue::F32(number),
        Value::Timestamp(milliseconds) => FieldValue::Timestamp(u64::try_from(milliseconds / 1000).ok()?),
        Value::Binary(bytes) => FieldValue::Bytes(Bytes::copy_from_slice(bytes)),
        Value::Bool(flag) => FieldValue::Bool(flag),
        Value::Null => FieldValue::Void,
        Value::Uuid(bytes) => FieldValue::LongStr(Bytes::from(uuid_text(&bytes))),
        Value::Other(_) | Value::Described(..) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::ContentHeader;

    fn message(properties: &BasicProperties, body: &'static [u8]) -> Message {
        Message {
            exchange: ShortStr::from("ex"),
            routing_key: ShortStr::from("rk"),
            header: ContentHeader::from_properties(60, body.len() as u64, properties),
            body: Bytes::from_static(body),
            published_at_ns: 0,
            bcc_routing_keys: None,
        }
    }

    fn round_trip(properties: &BasicProperties, body: &'static [u8]) -> Decoded {
        let mut out = Vec::new();
        encode(&message(properties, body), &mut out);
        let chunk = Bytes::from(out);
        decode(&chunk, &chunk, &ShortStr::from("q")).expect("decode")
    }

    #[test]
    fn every_property_rabbitmq_keeps_comes_back() {
        let mut headers = FieldTable::new();
        headers.insert("s", FieldValue::LongStr(Bytes::from_static(b"x")));
        headers.insert("i", FieldValue::I32(-7));
        headers.insert("l", FieldValue::I64(1 << 40));
        headers.insert("b", FieldValue::Bool(true));
        headers.insert("t", FieldValue::Timestamp(1_700_000_000));
        headers.insert("table", FieldValue::Table(FieldTable::new()));
        headers.insert("array", FieldValue::Array(vec![FieldValue::I32(1)]));
        headers.insert("v", FieldValue::Void);
        let properties = BasicProperties {
            content_type: Some(ShortStr::from("text/plain")),
            content_encoding: Some(ShortStr::from("gzip")),
            headers: Some(headers),
            delivery_mode: Some(2),
            priority: Some(3),
            correlation_id: Some(ShortStr::from("cid")),
            reply_to: Some(ShortStr::from("rt")),
            expiration: Some(ShortStr::from("60000")),
            message_id: Some(ShortStr::from("mid")),
            timestamp: Some(1_700_000_000),
            message_type: Some(ShortStr::from("tp")),
            user_id: Some(ShortStr::from("guest")),
            app_id: Some(ShortStr::from("app")),
            cluster_id: Some(ShortStr::from("dropped")),
        };
        let decoded = round_trip(&properties, b"body");
        assert_eq!(
            (decoded.exchange.as_bytes(), decoded.routing_key.as_bytes(), &decoded.body[..]),
            (&b"ex"[..], &b"rk"[..], &b"body"[..])
        );
        let mut expected = properties.clone();
        expected.cluster_id = None;
        let kept: Vec<_> = properties
            .headers
            .as_ref()
            .expect("headers")
            .0
            .iter()
            .filter(|(key, _)| !matches!(key.as_bytes(), b"table" | b"array"))
            .cloned()
            .collect();
        expected.headers = Some(FieldTable(kept));
        assert_eq!(decoded.properties, expected);
    }

    #[test]
    fn a_message_without_properties_has_none_back() {
        let decoded = round_trip(&BasicProperties::default(), b"");
        assert_eq!(decoded.properties, BasicProperties::default());
        assert!(decoded.body.is_empty());
    }

    #[test]
    fn a_stream_protocol_message_comes_from_the_default_exchange() {
        // An AMQP 1.0 message as a stream client writes it: properties and an amqp-value body.
        let mut record = Vec::new();
        write::descriptor(&mut record, PROPERTIES);
        let at = write::start_compound(&mut record, 0xd0);
        write::fixed(&mut record, 0x80, &42u64.to_be_bytes());
        write::finish_compound(&mut record, at, 1);
        write::descriptor(&mut record, AMQP_VALUE);
        write::string(&mut record, b"hello");
        let chunk = Bytes::from(record);
        let decoded = decode(&chunk, &chunk, &ShortStr::from("the-queue")).expect("decode");
        assert_eq!((decoded.exchange.as_bytes(), decoded.routing_key.as_bytes()), (&b""[..], &b"the-queue"[..]));
        assert_eq!(decoded.properties.message_id, Some(ShortStr::from("42")));
        assert_eq!(
            decoded.properties.headers.expect("headers").get("x-message-id-type"),
            Some(&FieldValue::LongStr(Bytes::from_static(b"ulong")))
        );
        assert_eq!(decoded.properties.message_type, Some(ShortStr::from("amqp-1.0")));
        assert_eq!(&decoded.body[..], &chunk[chunk.len() - 10..], "the amqp-value section, encoded");
    }

    #[test]
    fn damaged_records_are_errors() {
        let mut out = Vec::new();
        encode(&message(&BasicProperties::default(), b"body"), &mut out);
        for cut in 0..out.len() {
            let chunk = Bytes::copy_from_slice(&out[..cut]);
            let _ = decode(&chunk, &chunk, &ShortStr::from("q"));
        }
        let chunk = Bytes::from_static(b"\x40");
        assert!(decode(&chunk, &chunk, &ShortStr::from("q")).is_err());
    }
}
