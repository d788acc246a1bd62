//! Little-endian fixed-width encoding for log records, batches and snapshots: a writer over a
//! `Vec<u8>` and a reader over a slice that fails with [`DecodeError`] instead of panicking, since
//! everything it reads came from a disk or another node.

use bytes::Bytes;

/// Bytes that do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended inside a field.
    #[error("truncated: {needed} bytes needed at offset {offset}, {available} available")]
    Truncated {
        /// Where the field starts.
        offset: usize,
        /// Its size.
        needed: usize,
        /// What was left.
        available: usize,
    },
    /// A field holds a value no encoder writes.
    #[error("invalid {field}: {value}")]
    Invalid {
        /// Which field.
        field: &'static str,
        /// What it held.
        value: u64,
    },
    /// The checksum does not match the bytes.
    #[error("checksum mismatch")]
    Checksum,
}

/// Appends fields to a buffer.
pub struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    /// One byte.
    pub fn u8(&mut self, value: u8) {
        self.0.push(value);
    }

    /// Four bytes.
    pub fn u32(&mut self, value: u32) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// Eight bytes.
    pub fn u64(&mut self, value: u64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// Eight bytes, two's complement.
    pub fn i64(&mut self, value: i64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// A length (u32) and the bytes.
    pub fn bytes(&mut self, value: &[u8]) {
        self.u32(u32::try_from(value.len()).expect("a field over 4 GiB is refused before encoding"));
        self.0.extend_from_slice(value);
    }

    /// 0, or 1 and the value.
    pub fn optional_u64(&mut self, value: Option<u64>) {
        match value {
            None => self.u8(0),
            Some(value) => {
                self.u8(1);
                self.u64(value);
            }
        }
    }
}

/// Reads fields from a slice; byte fields come out as slices of the shared input.
pub struct Reader {
    input: Bytes,
    offset: usize,
}

impl Reader {
    /// A reader at the start of `input`.
    pub fn new(input: Bytes) -> Reader {
        Reader { input, offset: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.input.len() - self.offset
    }

    /// Whether everything was read.
    pub fn is_at_end(&self) -> bool {
        self.offset == self.input.len()
    }

    fn take(&mut self, needed: usize) -> Result<Bytes, DecodeError> {
        let available = self.input.len() - self.offset;
        if needed > available {
            return Err(DecodeError::Truncated { offset: self.offset, needed, available });
        }
        let slice = self.input.slice(self.offset..self.offset + needed);
        self.offset += needed;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let slice = self.take(N)?;
        let mut array = [0; N];
        array.copy_from_slice(&slice);
        Ok(array)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    /// Four bytes.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Eight bytes.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Eight bytes, two's complement.
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A length-prefixed byte field.
    pub fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        let length = self.u32()? as usize;
        self.take(length)
    }

    /// A flag byte (0 or 1).
    pub fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(DecodeError::Invalid { field, value: value.into() }),
        }
    }

    /// See [`Writer::optional_u64`].
    pub fn optional_u64(&mut self, field: &'static str) -> Result<Option<u64>, DecodeError> {
        match self.bool(field)? {
            false => Ok(None),
            true => Ok(Some(self.u64()?)),
        }
    }
}

/// Appends a crc32c of `buffer[start..]` seeded with `seed`, so a record is checked against
/// what it belongs to (a shard), not only against itself.
pub fn append_checksum(buffer: &mut Vec<u8>, start: usize, seed: u32) {
    let checksum = crc32c::crc32c_append(seed, &buffer[start..]);
    buffer.extend_from_slice(&checksum.to_le_bytes());
}

/// Splits off and checks the trailing checksum that [`append_checksum`] wrote.
pub fn verify_checksum(input: &Bytes, seed: u32) -> Result<Bytes, DecodeError> {
    let Some(body_length) = input.len().checked_sub(4) else {
        return Err(DecodeError::Truncated { offset: 0, needed: 4, available: input.len() });
    };
    let mut stored = [0; 4];
    stored.copy_from_slice(&input[body_length..]);
    if crc32c::crc32c_append(seed, &input[..body_length]) != u32::from_le_bytes(stored) {
        return Err(DecodeError::Checksum);
    }
    Ok(input.slice(..body_length))
}

/// A queue's limits, as commands and snapshot images carry them.
pub fn encode_limits(writer: &mut Writer, limits: &queue_core::Limits) {
    writer.optional_u64(limits.max_length);
    writer.optional_u64(limits.max_length_bytes);
    writer.u8(match limits.overflow {
        queue_core::Overflow::DropHead => 1,
        queue_core::Overflow::RejectPublish => 2,
    });
    writer.optional_u64(limits.message_ttl_ms);
    writer.optional_u64(limits.delivery_limit.map(u64::from));
    // 2: at least once (a byte earlier versions wrote as a bool, so their logs still decode).
    writer.u8(match (limits.dead_letters, limits.dead_letter_at_least_once) {
        (false, _) => 0,
        (true, false) => 1,
        (true, true) => 2,
    });
}

/// See [`encode_limits`].
pub fn decode_limits(reader: &mut Reader) -> Result<queue_core::Limits, DecodeError> {
    let max_length = reader.optional_u64("max length")?;
    let max_length_bytes = reader.optional_u64("max length bytes")?;
    let overflow = match reader.u8()? {
        1 => queue_core::Overflow::DropHead,
        2 => queue_core::Overflow::RejectPublish,
        value => return Err(DecodeError::Invalid { field: "overflow", value: value.into() }),
    };
    let message_ttl_ms = reader.optional_u64("message ttl")?;
    let delivery_limit = match reader.optional_u64("delivery limit")? {
        Some(limit) => Some(u32::try_from(limit).map_err(|_| DecodeError::Invalid { field: "delivery limit", value: limit })?),
        None => None,
    };
    let (dead_letters, dead_letter_at_least_once) = match reader.u8()? {
        0 => (false, false),
        1 => (true, false),
        2 => (true, true),
        value => return Err(DecodeError::Invalid { field: "dead letters", value: value.into() }),
    };
    Ok(queue_core::Limits {
        max_length,
        max_length_bytes,
        overflow,
        message_ttl_ms,
        delivery_limit,
        dead_letters,
        dead_letter_at_least_once,
    })
}
