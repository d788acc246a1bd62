//! Reading AMQP values out of a frame payload without copying, and writing them into a buffer.

use crate::types::{Decimal, FieldTable, FieldValue, LongStr, ShortStr};
use crate::DecodeError;
use bytes::{BufMut, Bytes, BytesMut};

/// How deep tables and arrays may nest inside each other. RabbitMQ's own clients never go beyond a
/// few levels; the bound keeps a hostile frame from exhausting the stack.
pub const FIELD_NESTING_DEPTH_MAX: usize = 32;

/// A cursor over a frame payload. Strings and tables it returns share the payload's memory.
pub struct Reader {
    payload: Bytes,
    position: usize,
}

impl Reader {
    /// Starts reading at the first byte of `payload`.
    pub fn new(payload: Bytes) -> Reader {
        Reader { payload, position: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.payload.len() - self.position
    }

    /// Fails unless everything was read, since RabbitMQ rejects methods with trailing bytes.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes(extra)),
        }
    }

    /// Takes the next `count` bytes as a shared slice.
    pub fn take(&mut self, count: usize) -> Result<Bytes, DecodeError> {
        if self.remaining() < count {
            return Err(DecodeError::Truncated);
        }
        let slice = self.payload.slice(self.position..self.position + count);
        self.position += count;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        if self.remaining() < N {
            return Err(DecodeError::Truncated);
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.payload[self.position..self.position + N]);
        self.position += N;
        Ok(out)
    }

    /// Reads an octet.
    pub fn read_u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    /// Reads a big-endian 16-bit integer.
    pub fn read_u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    /// Reads a big-endian 32-bit integer.
    pub fn read_u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// Reads a big-endian 64-bit integer.
    pub fn read_u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// Reads a short string (one length octet).
    pub fn read_short_str(&mut self) -> Result<ShortStr, DecodeError> {
        let length = usize::from(self.read_u8()?);
        Ok(ShortStr::from_bytes(self.take(length)?))
    }

    /// Reads a long string (four length octets).
    pub fn read_long_str(&mut self) -> Result<LongStr, DecodeError> {
        let length = self.read_u32()? as usize;
        Ok(LongStr(self.take(length)?))
    }

    /// Reads a field table (four length octets, then name/value pairs).
    pub fn read_table(&mut self) -> Result<FieldTable, DecodeError> {
        self.read_table_at_depth(0)
    }

    fn read_table_at_depth(&mut self, depth: usize) -> Result<FieldTable, DecodeError> {
        let length = self.read_u32()? as usize;
        let mut inner = Reader::new(self.take(length)?);
        inner.read_table_entries(depth)
    }

    /// Reads name/value pairs until the payload ends (a table body without its length prefix, as
    /// the AMQPLAIN mechanism sends it).
    pub fn read_table_entries(&mut self, depth: usize) -> Result<FieldTable, DecodeError> {
        if depth >= FIELD_NESTING_DEPTH_MAX {
            return Err(DecodeError::NestingTooDeep(FIELD_NESTING_DEPTH_MAX));
        }
        let mut entries = Vec::new();
        while self.remaining() > 0 {
            let name = self.read_short_str()?;
            let value = self.read_field_value(depth)?;
            entries.push((name, value));
        }
        Ok(FieldTable(entries))
    }

    fn read_field_value(&mut self, depth: usize) -> Result<FieldValue, DecodeError> {
        let tag = self.read_u8()?;
        Ok(match tag {
            b't' => FieldValue::Bool(self.read_u8()? != 0),
            b'b' => FieldValue::I8(self.read_u8()? as i8),
            b'B' => FieldValue::U8(self.read_u8()?),
            b's' => FieldValue::I16(self.read_u16()? as i16),
            b'u' => FieldValue::U16(self.read_u16()?),
            b'I' => FieldValue::I32(self.read_u32()? as i32),
            b'i' => FieldValue::U32(self.read_u32()?),
            b'l' => FieldValue::I64(self.read_u64()? as i64),
            // py-amqp (kombu, Celery) writes integers past 32 bits as 'L', a signed 64-bit value:
            // Celery's delayed-delivery queues declare x-message-ttl up to 2^27 s so. RabbitMQ takes it.
            b'L' => FieldValue::I64(self.read_u64()? as i64),
            b'f' => FieldValue::F32(f32::from_bits(self.read_u32()?)),
            b'd' => FieldValue::F64(f64::from_bits(self.read_u64()?)),
            b'D' => FieldValue::Decimal(Decimal { scale: self.read_u8()?, value: self.read_u32()? }),
            b'S' => FieldValue::LongStr(self.read_long_str()?.0),
            b'x' => FieldValue::Bytes(self.read_long_str()?.0),
            b'A' => {
                let length = self.read_u32()? as usize;
                let mut inner = Reader::new(self.take(length)?);
                if depth + 1 >= FIELD_NESTING_DEPTH_MAX {
                    return Err(DecodeError::NestingTooDeep(FIELD_NESTING_DEPTH_MAX));
                }
                let mut values = Vec::new();
                while inner.remaining() > 0 {
                    values.push(inner.read_field_value(depth + 1)?);
                }
                FieldValue::Array(values)
            }
            b'T' => FieldValue::Timestamp(self.read_u64()?),
            b'F' => FieldValue::Table(self.read_table_at_depth(depth + 1)?),
            b'V' => FieldValue::Void,
            other => return Err(DecodeError::UnknownFieldType(other)),
        })
    }
}

/// Writes a short string.
pub fn write_short_str(writer: &mut BytesMut, value: &ShortStr) {
    writer.put_u8(value.len() as u8);
    writer.put_slice(value.as_bytes());
}

/// Writes a long string.
pub fn write_long_str(writer: &mut BytesMut, value: &LongStr) {
    writer.put_u32(value.0.len() as u32);
    writer.put_slice(&value.0);
}

/// Writes a field table with its length prefix.
pub fn write_table(writer: &mut BytesMut, table: &FieldTable) {
    let length_at = writer.len();
    writer.put_u32(0);
    for (name, value) in table.iter() {
        write_short_str(writer, name);
        write_field_value(writer, value);
    }
    patch_length(writer, length_at);
}

fn patch_length(writer: &mut BytesMut, length_at: usize) {
    let length = (writer.len() - length_at - 4) as u32;
    writer[length_at..length_at + 4].copy_from_slice(&length.to_be_bytes());
}

fn write_field_value(writer: &mut BytesMut, value: &FieldValue) {
    match value {
        FieldValue::Bool(v) => {
            writer.put_u8(b't');
            writer.put_u8(u8::from(*v));
        }
        FieldValue::I8(v) => {
            writer.put_u8(b'b');
            writer.put_i8(*v);
        }
        FieldValue::U8(v) => {
            writer.put_u8(b'B');
            writer.put_u8(*v);
        }
        FieldValue::I16(v) => {
            writer.put_u8(b's');
            writer.put_i16(*v);
        }
        FieldValue::U16(v) => {
            writer.put_u8(b'u');
            writer.put_u16(*v);
        }
        FieldValue::I32(v) => {
            writer.put_u8(b'I');
            writer.put_i32(*v);
        }
        FieldValue::U32(v) => {
            writer.put_u8(b'i');
            writer.put_u32(*v);
        }
        FieldValue::I64(v) => {
            writer.put_u8(b'l');
            writer.put_i64(*v);
        }
        FieldValue::F32(v) => {
            writer.put_u8(b'f');
            writer.put_u32(v.to_bits());
        }
        FieldValue::F64(v) => {
            writer.put_u8(b'd');
            writer.put_u64(v.to_bits());
        }
        FieldValue::Decimal(v) => {
            writer.put_u8(b'D');
            writer.put_u8(v.scale);
            writer.put_u32(v.value);
        }
        FieldValue::LongStr(v) => {
            writer.put_u8(b'S');
            writer.put_u32(v.len() as u32);
            writer.put_slice(v);
        }
        FieldValue::Bytes(v) => {
            writer.put_u8(b'x');
            writer.put_u32(v.len() as u32);
            writer.put_slice(v);
        }
        FieldValue::Array(values) => {
            writer.put_u8(b'A');
            let length_at = writer.len();
            writer.put_u32(0);
            for value in values {
                write_field_value(writer, value);
            }
            patch_length(writer, length_at);
        }
        FieldValue::Timestamp(v) => {
            writer.put_u8(b'T');
            writer.put_u64(*v);
        }
        FieldValue::Table(table) => {
            writer.put_u8(b'F');
            write_table(writer, table);
        }
        FieldValue::Void => writer.put_u8(b'V'),
    }
}
