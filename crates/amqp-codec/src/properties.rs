//! Content headers and the basic class's message properties.
//!
//! The broker never needs most properties, so a [`ContentHeader`] keeps them as the raw bytes the
//! publisher sent: a delivery writes them back out unchanged, with no decode and no encode. The few
//! properties the broker acts on (`delivery-mode`, `headers`, `user-id`) are read on demand.

use crate::reader::{write_short_str, write_table, Reader};
use crate::types::{FieldTable, ShortStr};
use crate::DecodeError;
use bytes::{BufMut, Bytes, BytesMut};

const FLAG_CONTENT_TYPE: u16 = 1 << 15;
const FLAG_CONTENT_ENCODING: u16 = 1 << 14;
const FLAG_HEADERS: u16 = 1 << 13;
const FLAG_DELIVERY_MODE: u16 = 1 << 12;
const FLAG_PRIORITY: u16 = 1 << 11;
const FLAG_CORRELATION_ID: u16 = 1 << 10;
const FLAG_REPLY_TO: u16 = 1 << 9;
const FLAG_EXPIRATION: u16 = 1 << 8;
const FLAG_MESSAGE_ID: u16 = 1 << 7;
const FLAG_TIMESTAMP: u16 = 1 << 6;
const FLAG_TYPE: u16 = 1 << 5;
const FLAG_USER_ID: u16 = 1 << 4;
const FLAG_APP_ID: u16 = 1 << 3;
const FLAG_CLUSTER_ID: u16 = 1 << 2;

/// A content header frame's payload.
#[derive(Debug, Clone, PartialEq)]
pub struct ContentHeader {
    /// The class of the method this content belongs to (60, basic).
    pub class_id: u16,
    /// The total size of the body frames that follow.
    pub body_size: u64,
    /// Which properties are present.
    pub property_flags: u16,
    /// The encoded properties, exactly as received.
    pub properties_raw: Bytes,
}

impl ContentHeader {
    /// Decodes a content header payload, checking that the properties it announces parse.
    pub fn decode(payload: Bytes) -> Result<ContentHeader, DecodeError> {
        let mut reader = Reader::new(payload);
        let class_id = reader.read_u16()?;
        let _weight = reader.read_u16()?;
        let body_size = reader.read_u64()?;
        // Bits 1 and 0 name no basic property (bit 0 would announce a second flags word).
        // RabbitMQ 3.10.8 ignores them and hands them on to consumers unchanged (see the
        // `unused-property-flags` fixture), so they are kept, not refused.
        let property_flags = reader.read_u16()?;
        let properties_raw = reader.take(reader.remaining())?;
        // Parse once to reject malformed properties at the door, as RabbitMQ does, so that a
        // delivery never carries bytes a consumer's client cannot decode.
        let header = ContentHeader { class_id, body_size, property_flags, properties_raw };
        header.check_properties()?;
        Ok(header)
    }

    /// Checks that the properties parse. Without headers, every property is a short string, an
    /// octet or a timestamp: walking their lengths is enough, where decoding them would build a
    /// value (a reference count per string) for every published message. With headers, or when the
    /// walk fails, the full decode runs, so a table is checked to its nested values and an error
    /// is reported exactly as the decode words it.
    fn check_properties(&self) -> Result<(), DecodeError> {
        if self.property_flags & FLAG_HEADERS == 0 && plain_properties_fit(self.property_flags, &self.properties_raw) {
            return Ok(());
        }
        self.properties().map(drop)
    }

    /// Builds a header from decoded properties.
    pub fn from_properties(class_id: u16, body_size: u64, properties: &BasicProperties) -> ContentHeader {
        let mut raw = BytesMut::new();
        let property_flags = properties.encode(&mut raw);
        ContentHeader { class_id, body_size, property_flags, properties_raw: raw.freeze() }
    }

    /// Decodes the properties.
    pub fn properties(&self) -> Result<BasicProperties, DecodeError> {
        BasicProperties::decode(self.property_flags, self.properties_raw.clone())
    }

    /// Whether the publisher set a user-id (which the broker must check against the login).
    pub fn has_user_id(&self) -> bool {
        self.property_flags & FLAG_USER_ID != 0
    }

    /// Whether the message carries a headers table.
    pub fn has_headers(&self) -> bool {
        self.property_flags & FLAG_HEADERS != 0
    }

    /// Whether the publisher set reply-to (direct reply-to rewrites it).
    pub fn has_reply_to(&self) -> bool {
        self.property_flags & FLAG_REPLY_TO != 0
    }

    /// Whether the publisher set a per-message expiration.
    pub fn has_expiration(&self) -> bool {
        self.property_flags & FLAG_EXPIRATION != 0
    }

    /// The delivery mode (2 = persistent) without decoding the other properties. It reads the raw
    /// bytes in place: cloning them would cost a reference count per message.
    pub fn delivery_mode(&self) -> Option<u8> {
        if self.property_flags & FLAG_DELIVERY_MODE == 0 {
            return None;
        }
        let raw: &[u8] = &self.properties_raw;
        let mut offset = 0usize;
        for (flag, length_bytes) in [(FLAG_CONTENT_TYPE, 1), (FLAG_CONTENT_ENCODING, 1), (FLAG_HEADERS, 4)] {
            if self.property_flags & flag == 0 {
                continue;
            }
            let length_field = raw.get(offset..offset + length_bytes)?;
            let length = length_field.iter().fold(0usize, |length, &byte| (length << 8) | usize::from(byte));
            offset = offset.checked_add(length_bytes + length)?;
        }
        raw.get(offset).copied()
    }

    /// Whether the headers table may hold an entry named one of `names`, read in place without
    /// decoding a value (the broker asks it of every publish with headers, for `CC` and `BCC`).
    /// False only when the table was walked whole and no entry has such a name; a table that does
    /// not walk answers true, so the caller's full decode decides, as it would without this.
    pub fn may_have_header_named(&self, names: &[&[u8]]) -> bool {
        if self.property_flags & FLAG_HEADERS == 0 {
            return false;
        }
        let raw: &[u8] = &self.properties_raw;
        let mut offset = 0usize;
        for flag in [FLAG_CONTENT_TYPE, FLAG_CONTENT_ENCODING] {
            if self.property_flags & flag != 0 {
                let Some(&length) = raw.get(offset) else { return true };
                offset += 1 + usize::from(length);
            }
        }
        let Some(table) = long_field(raw, offset) else { return true };
        table_has_entry_named(table, names).unwrap_or(true)
    }

    /// The priority property without decoding the others (a priority queue reads it for every
    /// message it takes).
    pub fn priority(&self) -> Option<u8> {
        priority_in(self.property_flags, &self.properties_raw)
    }
}

/// The bytes of a length-prefixed (u32) field at `offset`, when they are all there.
fn long_field(raw: &[u8], offset: usize) -> Option<&[u8]> {
    let length = u32::from_be_bytes(raw.get(offset..offset.checked_add(4)?)?.try_into().ok()?) as usize;
    raw.get(offset + 4..(offset + 4).checked_add(length)?)
}

/// Whether a field table has an entry named one of `names` (values skipped by their type's size
/// or length prefix, never decoded); `None` when the table is cut or has an unknown type before
/// such an entry, or after its last entry.
fn table_has_entry_named(table: &[u8], names: &[&[u8]]) -> Option<bool> {
    let mut offset = 0usize;
    while offset < table.len() {
        let name_length = usize::from(*table.get(offset)?);
        if names.contains(&table.get(offset + 1..offset + 1 + name_length)?) {
            return Some(true);
        }
        offset += 1 + name_length;
        let tag = *table.get(offset)?;
        offset += 1;
        offset += match tag {
            b't' | b'b' | b'B' => 1,
            b's' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'l' | b'L' | b'd' | b'T' => 8,
            b'D' => 5,
            b'V' => 0,
            b'S' | b'x' | b'A' | b'F' => 4 + long_field(table, offset)?.len(),
            _ => return None,
        };
    }
    (offset == table.len()).then_some(false)
}

/// The priority property of encoded properties (`property_flags` and the raw fields after them),
/// read in place: the fields before it are skipped by their lengths. `None` when it is absent or
/// the fields before it are cut short.
pub fn priority_in(property_flags: u16, raw: &[u8]) -> Option<u8> {
    if property_flags & FLAG_PRIORITY == 0 {
        return None;
    }
    let mut offset = 0usize;
    for (flag, length_bytes) in [(FLAG_CONTENT_TYPE, 1), (FLAG_CONTENT_ENCODING, 1), (FLAG_HEADERS, 4), (FLAG_DELIVERY_MODE, 0)] {
        if property_flags & flag == 0 {
            continue;
        }
        if length_bytes == 0 {
            // delivery-mode: one octet, no length.
            offset = offset.checked_add(1)?;
            continue;
        }
        let length_field = raw.get(offset..offset.checked_add(length_bytes)?)?;
        let length = length_field.iter().fold(0usize, |length, &byte| (length << 8) | usize::from(byte));
        offset = offset.checked_add(length_bytes)?.checked_add(length)?;
    }
    raw.get(offset).copied()
}

/// How a property other than headers is encoded.
#[derive(Clone, Copy)]
enum PlainProperty {
    ShortStr,
    Octet,
    Timestamp,
}

/// The properties other than headers, in wire order.
const PLAIN_PROPERTIES: [(u16, PlainProperty); 13] = [
    (FLAG_CONTENT_TYPE, PlainProperty::ShortStr),
    (FLAG_CONTENT_ENCODING, PlainProperty::ShortStr),
    (FLAG_DELIVERY_MODE, PlainProperty::Octet),
    (FLAG_PRIORITY, PlainProperty::Octet),
    (FLAG_CORRELATION_ID, PlainProperty::ShortStr),
    (FLAG_REPLY_TO, PlainProperty::ShortStr),
    (FLAG_EXPIRATION, PlainProperty::ShortStr),
    (FLAG_MESSAGE_ID, PlainProperty::ShortStr),
    (FLAG_TIMESTAMP, PlainProperty::Timestamp),
    (FLAG_TYPE, PlainProperty::ShortStr),
    (FLAG_USER_ID, PlainProperty::ShortStr),
    (FLAG_APP_ID, PlainProperty::ShortStr),
    (FLAG_CLUSTER_ID, PlainProperty::ShortStr),
];

/// Whether `raw` holds exactly the properties `flags` announce, none of them headers: true only
/// when [`BasicProperties::decode`] would succeed.
fn plain_properties_fit(flags: u16, raw: &[u8]) -> bool {
    let mut offset = 0usize;
    for (flag, kind) in PLAIN_PROPERTIES {
        if flags & flag == 0 {
            continue;
        }
        offset += match kind {
            PlainProperty::ShortStr => match raw.get(offset) {
                Some(&length) => 1 + usize::from(length),
                None => return false,
            },
            PlainProperty::Octet => 1,
            PlainProperty::Timestamp => 8,
        };
        if offset > raw.len() {
            return false;
        }
    }
    offset == raw.len()
}

/// The properties of a message (the basic class's content header fields).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BasicProperties {
    /// MIME content type.
    pub content_type: Option<ShortStr>,
    /// MIME content encoding.
    pub content_encoding: Option<ShortStr>,
    /// Application headers.
    pub headers: Option<FieldTable>,
    /// 1 = transient, 2 = persistent.
    pub delivery_mode: Option<u8>,
    /// Priority 0-9.
    pub priority: Option<u8>,
    /// Correlation id.
    pub correlation_id: Option<ShortStr>,
    /// Address to reply to.
    pub reply_to: Option<ShortStr>,
    /// Expiration (milliseconds, as text).
    pub expiration: Option<ShortStr>,
    /// Application message id.
    pub message_id: Option<ShortStr>,
    /// Seconds since the epoch.
    pub timestamp: Option<u64>,
    /// Message type name.
    pub message_type: Option<ShortStr>,
    /// Creating user id (validated by the broker).
    pub user_id: Option<ShortStr>,
    /// Creating application id.
    pub app_id: Option<ShortStr>,
    /// Deprecated cluster id.
    pub cluster_id: Option<ShortStr>,
}

impl BasicProperties {
    /// Decodes the properties present in `flags` from `raw`.
    pub fn decode(flags: u16, raw: Bytes) -> Result<BasicProperties, DecodeError> {
        let mut reader = Reader::new(raw);
        let short = |flag: u16, reader: &mut Reader| -> Result<Option<ShortStr>, DecodeError> {
            if flags & flag != 0 {
                reader.read_short_str().map(Some)
            } else {
                Ok(None)
            }
        };
        let content_type = short(FLAG_CONTENT_TYPE, &mut reader)?;
        let content_encoding = short(FLAG_CONTENT_ENCODING, &mut reader)?;
        let headers = if flags & FLAG_HEADERS != 0 { Some(reader.read_table()?) } else { None };
        let delivery_mode = if flags & FLAG_DELIVERY_MODE != 0 { Some(reader.read_u8()?) } else { None };
        let priority = if flags & FLAG_PRIORITY != 0 { Some(reader.read_u8()?) } else { None };
        let correlation_id = short(FLAG_CORRELATION_ID, &mut reader)?;
        let reply_to = short(FLAG_REPLY_TO, &mut reader)?;
        let expiration = short(FLAG_EXPIRATION, &mut reader)?;
        let message_id = short(FLAG_MESSAGE_ID, &mut reader)?;
        let timestamp = if flags & FLAG_TIMESTAMP != 0 { Some(reader.read_u64()?) } else { None };
        let message_type = short(FLAG_TYPE, &mut reader)?;
        let user_id = short(FLAG_USER_ID, &mut reader)?;
        let app_id = short(FLAG_APP_ID, &mut reader)?;
        let cluster_id = short(FLAG_CLUSTER_ID, &mut reader)?;
        reader.finish()?;
        Ok(BasicProperties {
            content_type,
            content_encoding,
            headers,
            delivery_mode,
            priority,
            correlation_id,
            reply_to,
            expiration,
            message_id,
            timestamp,
            message_type,
            user_id,
            app_id,
            cluster_id,
        })
    }

    /// Encodes the properties that are set and returns the property flags.
    pub fn encode(&self, writer: &mut BytesMut) -> u16 {
        let mut flags = 0u16;
        let short = |flag: u16, value: &Option<ShortStr>, writer: &mut BytesMut, flags: &mut u16| {
            if let Some(value) = value {
                *flags |= flag;
                write_short_str(writer, value);
            }
        };
        short(FLAG_CONTENT_TYPE, &self.content_type, writer, &mut flags);
        short(FLAG_CONTENT_ENCODING, &self.content_encoding, writer, &mut flags);
        if let Some(headers) = &self.headers {
            flags |= FLAG_HEADERS;
            write_table(writer, headers);
        }
        if let Some(mode) = self.delivery_mode {
            flags |= FLAG_DELIVERY_MODE;
            writer.put_u8(mode);
        }
        if let Some(priority) = self.priority {
            flags |= FLAG_PRIORITY;
            writer.put_u8(priority);
        }
        short(FLAG_CORRELATION_ID, &self.correlation_id, writer, &mut flags);
        short(FLAG_REPLY_TO, &self.reply_to, writer, &mut flags);
        short(FLAG_EXPIRATION, &self.expiration, writer, &mut flags);
        short(FLAG_MESSAGE_ID, &self.message_id, writer, &mut flags);
        if let Some(timestamp) = self.timestamp {
            flags |= FLAG_TIMESTAMP;
            writer.put_u64(timestamp);
        }
        short(FLAG_TYPE, &self.message_type, writer, &mut flags);
        short(FLAG_USER_ID, &self.user_id, writer, &mut flags);
        short(FLAG_APP_ID, &self.app_id, writer, &mut flags);
        short(FLAG_CLUSTER_ID, &self.cluster_id, writer, &mut flags);
        flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Decimal, FieldValue};
    use proptest::prelude::*;

    fn short_str() -> impl Strategy<Value = Option<ShortStr>> {
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..=255).prop_map(|bytes| ShortStr::from_bytes(Bytes::from(bytes))))
    }

    proptest! {
        #[test]
        fn the_walk_accepts_what_the_decode_accepts_and_nothing_else(
            content_type in short_str(),
            priority in proptest::option::of(any::<u8>()),
            expiration in short_str(),
            timestamp in proptest::option::of(any::<u64>()),
            flags_flipped in any::<u16>(),
            bytes_added in proptest::collection::vec(any::<u8>(), 0..3),
            bytes_cut in 0usize..3,
        ) {
            // Valid properties, then damaged: other flags announced, bytes added or cut.
            let properties = BasicProperties { content_type, priority, expiration, timestamp, ..Default::default() };
            let mut raw = BytesMut::new();
            let flags = properties.encode(&mut raw) ^ (flags_flipped & flags_flipped.rotate_left(3));
            raw.extend_from_slice(&bytes_added);
            raw.truncate(raw.len().saturating_sub(bytes_cut));
            let header = ContentHeader { class_id: 60, body_size: 0, property_flags: flags, properties_raw: raw.freeze() };
            if flags & FLAG_HEADERS == 0 && plain_properties_fit(flags, &header.properties_raw) {
                prop_assert!(header.properties().is_ok());
            }
            prop_assert_eq!(header.check_properties().is_ok(), header.properties().is_ok());
        }

        #[test]
        fn the_header_name_walk_agrees_with_the_decode(
            names in proptest::collection::vec(proptest::sample::select(vec!["CC", "BCC", "cc", "x-death", "C", "BCCX"]), 0..5),
            values in proptest::collection::vec(0u8..8, 5),
            content_type in short_str(),
            bytes_cut in 0usize..2,
        ) {
            let mut headers = FieldTable::new();
            for (name, kind) in names.iter().zip(values) {
                let value = match kind {
                    0 => FieldValue::Array(vec![FieldValue::LongStr(Bytes::from_static(b"key"))]),
                    1 => FieldValue::Table(FieldTable::new()),
                    2 => FieldValue::I64(-1),
                    3 => FieldValue::Decimal(Decimal { scale: 2, value: 7 }),
                    4 => FieldValue::Void,
                    5 => FieldValue::Bool(true),
                    6 => FieldValue::U16(9),
                    _ => FieldValue::LongStr(Bytes::from_static(b"CC")),
                };
                headers.insert(name, value);
            }
            let properties = BasicProperties { content_type, headers: Some(headers), ..Default::default() };
            let mut raw = BytesMut::new();
            let flags = properties.encode(&mut raw);
            raw.truncate(raw.len().saturating_sub(bytes_cut));
            let header = ContentHeader { class_id: 60, body_size: 0, property_flags: flags, properties_raw: raw.freeze() };
            let wanted: [&[u8]; 2] = [b"CC", b"BCC"];
            let decoded = header.properties().ok().and_then(|properties| properties.headers);
            let has = decoded.as_ref().is_some_and(|headers| headers.get("CC").is_some() || headers.get("BCC").is_some());
            // Never a false "no": that would lose a CC route.
            prop_assert!(header.may_have_header_named(&wanted) || !has);
            // And exact when the properties decode.
            if decoded.is_some() {
                prop_assert_eq!(header.may_have_header_named(&wanted), has);
            }
        }

        #[test]
        fn encoded_properties_without_headers_pass_the_walk(
            content_type in short_str(),
            delivery_mode in proptest::option::of(any::<u8>()),
            reply_to in short_str(),
            timestamp in proptest::option::of(any::<u64>()),
            user_id in short_str(),
            cluster_id in short_str(),
        ) {
            let properties = BasicProperties { content_type, delivery_mode, reply_to, timestamp, user_id, cluster_id, ..Default::default() };
            let mut raw = BytesMut::new();
            let flags = properties.encode(&mut raw);
            prop_assert!(plain_properties_fit(flags, &raw));
        }
    }
}
