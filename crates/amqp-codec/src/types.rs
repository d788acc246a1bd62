//! AMQP value types: short and long strings, field tables and their values.
//!
//! Strings are byte strings on the wire (RabbitMQ does not require UTF-8), so they are kept as
//! [`Bytes`]: decoding slices them out of the frame without copying.

use bytes::Bytes;
use std::fmt;

/// The longest a short string may be on the wire.
pub const SHORT_STR_BYTES_MAX: usize = 255;

/// A `shortstr`: at most 255 bytes.
#[derive(Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct ShortStr(Bytes);

impl ShortStr {
    /// Wraps bytes already known to be at most 255 long (decoded from the wire, or checked).
    ///
    /// # Panics
    /// When `bytes` is longer than 255: that is a bug in the caller, not bad input.
    pub fn from_bytes(bytes: Bytes) -> ShortStr {
        assert!(bytes.len() <= SHORT_STR_BYTES_MAX, "shortstr of {} bytes", bytes.len());
        ShortStr(bytes)
    }

    /// Makes a short string from text that may be too long (a reply text that quotes a name),
    /// cutting it at 255 bytes as RabbitMQ does.
    pub fn truncating(text: impl Into<String>) -> ShortStr {
        let mut text: String = text.into();
        if text.len() > SHORT_STR_BYTES_MAX {
            let mut cut = SHORT_STR_BYTES_MAX;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        ShortStr(Bytes::from(text))
    }

    /// A short string from a static text, without copying it.
    pub const fn from_static(text: &'static str) -> ShortStr {
        assert!(text.len() <= SHORT_STR_BYTES_MAX);
        ShortStr(Bytes::from_static(text.as_bytes()))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The raw bytes as a cheap shared handle.
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// The text, with invalid UTF-8 replaced (for reply texts and logs).
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    /// The text when it is valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// Byte length.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for ShortStr {
    /// # Panics
    /// When the text is longer than 255 bytes; use [`ShortStr::truncating`] for unchecked text.
    fn from(text: &str) -> ShortStr {
        ShortStr::from_bytes(Bytes::copy_from_slice(text.as_bytes()))
    }
}

impl From<String> for ShortStr {
    /// # Panics
    /// When the text is longer than 255 bytes; use [`ShortStr::truncating`] for unchecked text.
    fn from(text: String) -> ShortStr {
        ShortStr::from_bytes(Bytes::from(text))
    }
}

impl fmt::Debug for ShortStr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl fmt::Display for ShortStr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&String::from_utf8_lossy(&self.0))
    }
}

/// A `longstr`: up to 4 GiB of bytes on the wire (bounded in practice by `frame_max`).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct LongStr(pub Bytes);

impl LongStr {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for LongStr {
    fn from(text: &str) -> LongStr {
        LongStr(Bytes::copy_from_slice(text.as_bytes()))
    }
}

impl From<Vec<u8>> for LongStr {
    fn from(bytes: Vec<u8>) -> LongStr {
        LongStr(Bytes::from(bytes))
    }
}

impl fmt::Debug for LongStr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// A decimal value: `value * 10^-scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decimal {
    /// Number of decimal digits after the point.
    pub scale: u8,
    /// The unscaled value.
    pub value: u32,
}

/// One value in a field table or array. The variants are exactly RabbitMQ's type tags, so a table
/// decoded and encoded again is byte-for-byte what the client sent.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    /// `t`
    Bool(bool),
    /// `b`
    I8(i8),
    /// `B`
    U8(u8),
    /// `s` (RabbitMQ's tag for a signed 16-bit integer)
    I16(i16),
    /// `u`
    U16(u16),
    /// `I`
    I32(i32),
    /// `i`
    U32(u32),
    /// `l`
    I64(i64),
    /// `f`
    F32(f32),
    /// `d`
    F64(f64),
    /// `D`
    Decimal(Decimal),
    /// `S`
    LongStr(Bytes),
    /// `x`
    Bytes(Bytes),
    /// `A`
    Array(Vec<FieldValue>),
    /// `T`: seconds since the epoch.
    Timestamp(u64),
    /// `F`
    Table(FieldTable),
    /// `V`
    Void,
}

impl FieldValue {
    /// The value as text when it is a string (`S`), for arguments such as `alternate-exchange`.
    pub fn as_text(&self) -> Option<String> {
        match self {
            FieldValue::LongStr(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        }
    }

    /// The value as an integer when it is any integer type.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            FieldValue::I8(v) => Some(v.into()),
            FieldValue::U8(v) => Some(v.into()),
            FieldValue::I16(v) => Some(v.into()),
            FieldValue::U16(v) => Some(v.into()),
            FieldValue::I32(v) => Some(v.into()),
            FieldValue::U32(v) => Some(v.into()),
            FieldValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a boolean when it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            FieldValue::Bool(v) => Some(v),
            _ => None,
        }
    }
}

/// A field table: named values, in the order they came.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldTable(pub Vec<(ShortStr, FieldValue)>);

impl FieldTable {
    /// An empty table.
    pub fn new() -> FieldTable {
        FieldTable(Vec::new())
    }

    /// The value under `key`, if any (the first one, should a client repeat a key).
    pub fn get(&self, key: &str) -> Option<&FieldValue> {
        self.0.iter().find(|(name, _)| name.as_bytes() == key.as_bytes()).map(|(_, value)| value)
    }

    /// Appends a value (no check for an existing key).
    pub fn insert(&mut self, key: &str, value: FieldValue) {
        self.0.push((ShortStr::from(key), value));
    }

    /// Whether the table holds nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Iterates over the entries.
    pub fn iter(&self) -> impl Iterator<Item = &(ShortStr, FieldValue)> {
        self.0.iter()
    }
}
