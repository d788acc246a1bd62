//! The protocol's field types: big-endian integers, strings with a 16-bit length, byte strings
//! with a 32-bit length, counted lists and maps. Reading works on [`Bytes`], so strings and
//! message bodies are slices of the frame that carried them (a reference count, no copy).

use crate::DecodeError;
use bytes::{BufMut, Bytes, BytesMut};

/// A protocol string: int16 length, then the bytes. RabbitMQ 3.10.8 reads the length as
/// unsigned and never checks UTF-8, so neither does this type; [`Text::as_str`] checks on demand.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text(Bytes);

impl Text {
    /// The longest string the 16-bit length can carry.
    pub const BYTES_MAX: usize = u16::MAX as usize;

    /// A string from static text.
    pub const fn from_static(text: &'static str) -> Text {
        Text(Bytes::from_static(text.as_bytes()))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes as UTF-8, or `None` when they are not.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The text, with invalid UTF-8 replaced (for logs and messages).
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The shared bytes.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl From<&str> for Text {
    fn from(text: &str) -> Text {
        Text(Bytes::copy_from_slice(text.as_bytes()))
    }
}

impl From<String> for Text {
    fn from(text: String) -> Text {
        Text(Bytes::from(text))
    }
}

impl From<Bytes> for Text {
    fn from(bytes: Bytes) -> Text {
        Text(bytes)
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{:?}", self.to_string_lossy())
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.to_string_lossy())
    }
}

/// Key/value string pairs (peer properties, stream arguments, subscription properties) in the
/// order they came. RabbitMQ turns them into a map, so a repeated key keeps its last value:
/// [`get`] answers the same.
pub type TextMap = Vec<(Text, Text)>;

/// The value of `key` in `map`, the last one when repeated (as RabbitMQ's map keeps it).
pub fn get<'a>(map: &'a TextMap, key: &str) -> Option<&'a Text> {
    map.iter().rev().find(|(name, _)| name.as_bytes() == key.as_bytes()).map(|(_, value)| value)
}

/// A cursor over one frame. Everything it returns shares the frame's memory.
pub(crate) struct Reader {
    payload: Bytes,
    position: usize,
}

impl Reader {
    pub(crate) fn new(payload: Bytes) -> Reader {
        Reader { payload, position: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.payload.len() - self.position
    }

    /// Fails unless everything was read: RabbitMQ's parser matches whole frames, so trailing
    /// bytes make a frame unknown there too.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes(extra)),
        }
    }

    pub(crate) fn take(&mut self, count: usize) -> Result<Bytes, DecodeError> {
        if self.remaining() < count {
            return Err(DecodeError::Truncated);
        }
        let slice = self.payload.slice(self.position..self.position + count);
        self.position += count;
        Ok(slice)
    }

    /// Where the cursor is, for [`Reader::since`].
    pub(crate) fn position(&self) -> usize {
        self.position
    }

    /// The bytes read since `start` (a [`Reader::position`]), shared.
    pub(crate) fn since(&self, start: usize) -> Bytes {
        self.payload.slice(start..self.position)
    }

    pub(crate) fn skip(&mut self, count: usize) -> Result<(), DecodeError> {
        if self.remaining() < count {
            return Err(DecodeError::Truncated);
        }
        self.position += count;
        Ok(())
    }

    /// Everything not read yet.
    pub(crate) fn rest(&mut self) -> Bytes {
        let slice = self.payload.slice(self.position..);
        self.position = self.payload.len();
        slice
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let bytes = self.payload.get(self.position..self.position + N).ok_or(DecodeError::Truncated)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        self.position += N;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    pub(crate) fn text(&mut self) -> Result<Text, DecodeError> {
        let length = usize::from(self.u16()?);
        Ok(Text(self.take(length)?))
    }

    /// A byte string: int32 length, -1 for null (read as empty, as RabbitMQ reads a SASL
    /// response of -1).
    pub(crate) fn byte_string(&mut self) -> Result<Bytes, DecodeError> {
        match self.u32()? {
            u32::MAX => Ok(Bytes::new()),
            length => self.take(length as usize),
        }
    }

    /// A count, refused when `count` items of at least `item_bytes_min` each cannot fit in what
    /// is left: a hostile count never sizes an allocation.
    pub(crate) fn count(&mut self, item_bytes_min: usize) -> Result<usize, DecodeError> {
        let count = self.u32()? as usize;
        if count.saturating_mul(item_bytes_min) > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        Ok(count)
    }

    pub(crate) fn text_list(&mut self) -> Result<Vec<Text>, DecodeError> {
        let count = self.count(2)?;
        (0..count).map(|_| self.text()).collect()
    }

    pub(crate) fn text_map(&mut self) -> Result<TextMap, DecodeError> {
        let count = self.count(4)?;
        (0..count).map(|_| Ok((self.text()?, self.text()?))).collect()
    }
}

/// Writes a string. Its length must fit the 16-bit field: every string Lepus sends was read
/// from a frame or is a name the broker already bounds (255 bytes), so a longer one is a bug.
pub(crate) fn put_text(writer: &mut BytesMut, text: &Text) {
    assert!(text.len() <= Text::BYTES_MAX, "protocol string of {} bytes", text.len());
    writer.put_u16(text.len() as u16);
    writer.put_slice(text.as_bytes());
}

pub(crate) fn put_byte_string(writer: &mut BytesMut, bytes: &[u8]) {
    writer.put_u32(bytes.len() as u32);
    writer.put_slice(bytes);
}

pub(crate) fn put_text_list(writer: &mut BytesMut, list: &[Text]) {
    writer.put_u32(list.len() as u32);
    for text in list {
        put_text(writer, text);
    }
}

pub(crate) fn put_text_map(writer: &mut BytesMut, map: &[(Text, Text)]) {
    writer.put_u32(map.len() as u32);
    for (key, value) in map {
        put_text(writer, key);
        put_text(writer, value);
    }
}
