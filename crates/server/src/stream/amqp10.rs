//! The part of the AMQP 1.0 type system a stream record needs: RabbitMQ stores every stream
//! message as an AMQP 1.0 message (sections of described values), which is what RabbitMQ Stream
//! protocol clients publish and expect to read. Writing uses a fixed subset of encodings; reading
//! takes every encoding the specification has, and skips what it does not map. No panic on any
//! input: every length is checked against what is left.

/// A decoded AMQP 1.0 value, as far as records need to tell them apart.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// null
    Null,
    /// boolean
    Bool(bool),
    /// ubyte
    Ubyte(u8),
    /// ushort
    Ushort(u16),
    /// uint
    Uint(u32),
    /// ulong
    Ulong(u64),
    /// byte
    Byte(i8),
    /// short
    Short(i16),
    /// int
    Int(i32),
    /// long
    Long(i64),
    /// float
    Float(f32),
    /// double
    Double(f64),
    /// timestamp (ms since the Unix epoch)
    Timestamp(i64),
    /// uuid
    Uuid([u8; 16]),
    /// binary
    Binary(&'a [u8]),
    /// string (UTF-8 by the specification; kept as bytes)
    String(&'a [u8]),
    /// symbol
    Symbol(&'a [u8]),
    /// list, map, array, decimal, char: kept as their encoded bytes (constructor included)
    Other(&'a [u8]),
    /// A described value: descriptor and value, both encoded.
    Described(u64, &'a [u8]),
}

/// Input that is not valid AMQP 1.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid AMQP 1.0 encoding: {0}")]
pub struct Malformed(pub &'static str);

/// Reads values front to back.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    bytes: &'a [u8],
}

impl<'a> Decoder<'a> {
    /// A decoder of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes }
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// What is left.
    pub fn rest(&self) -> &'a [u8] {
        self.bytes
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], Malformed> {
        if self.bytes.len() < count {
            return Err(Malformed("a value runs past the end"));
        }
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn length(&mut self, wide: bool) -> Result<usize, Malformed> {
        Ok(if wide { u32::from_be_bytes(self.fixed()?) as usize } else { usize::from(self.byte()?) })
    }

    /// The next value.
    pub fn value(&mut self) -> Result<Value<'a>, Malformed> {
        let start = self.bytes;
        let code = self.byte()?;
        if code == 0x00 {
            let descriptor = match self.value()? {
                Value::Ulong(number) => number,
                // Symbolic descriptors name nothing a record maps: keep the value, numbered 0.
                Value::Symbol(_) => 0,
                _ => return Err(Malformed("a descriptor that is neither a ulong nor a symbol")),
            };
            let before = self.bytes;
            self.value()?;
            let used = before.len() - self.bytes.len();
            return Ok(Value::Described(descriptor, &before[..used]));
        }
        let value = match code {
            0x40 => Value::Null,
            0x41 => Value::Bool(true),
            0x42 => Value::Bool(false),
            0x56 => Value::Bool(self.byte()? != 0),
            0x50 => Value::Ubyte(self.byte()?),
            0x60 => Value::Ushort(u16::from_be_bytes(self.fixed()?)),
            0x70 => Value::Uint(u32::from_be_bytes(self.fixed()?)),
            0x52 => Value::Uint(u32::from(self.byte()?)),
            0x43 => Value::Uint(0),
            0x80 => Value::Ulong(u64::from_be_bytes(self.fixed()?)),
            0x53 => Value::Ulong(u64::from(self.byte()?)),
            0x44 => Value::Ulong(0),
            0x51 => Value::Byte(self.byte()? as i8),
            0x61 => Value::Short(i16::from_be_bytes(self.fixed()?)),
            0x71 => Value::Int(i32::from_be_bytes(self.fixed()?)),
            0x54 => Value::Int(i32::from(self.byte()? as i8)),
            0x81 => Value::Long(i64::from_be_bytes(self.fixed()?)),
            0x55 => Value::Long(i64::from(self.byte()? as i8)),
            0x72 => Value::Float(f32::from_be_bytes(self.fixed()?)),
            0x82 => Value::Double(f64::from_be_bytes(self.fixed()?)),
            0x83 => Value::Timestamp(i64::from_be_bytes(self.fixed()?)),
            0x98 => Value::Uuid(self.fixed()?),
            0x73 | 0x74 => {
                self.take(4)?;
                Value::Other(&start[..5])
            }
            0x84 => {
                self.take(8)?;
                Value::Other(&start[..9])
            }
            0x94 => {
                self.take(16)?;
                Value::Other(&start[..17])
            }
            0xa0 | 0xb0 => {
                let length = self.length(code == 0xb0)?;
                Value::Binary(self.take(length)?)
            }
            0xa1 | 0xb1 => {
                let length = self.length(code == 0xb1)?;
                Value::String(self.take(length)?)
            }
            0xa3 | 0xb3 => {
                let length = self.length(code == 0xb3)?;
                Value::Symbol(self.take(length)?)
            }
            0x45 => Value::Other(&start[..1]),
            // list8/32, map8/32, array8/32: size, then that many bytes (count and elements).
            0xc0 | 0xc1 | 0xe0 | 0xd0 | 0xd1 | 0xf0 => {
                let wide = code >= 0xd0;
                let size = self.length(wide)?;
                self.take(size)?;
                let header = if wide { 5 } else { 2 };
                Value::Other(&start[..header + size])
            }
            _ => return Err(Malformed("an unknown format code")),
        };
        Ok(value)
    }

    /// The entries of a map value's encoded bytes (`Value::Other` of a map8/map32).
    pub fn map_entries(encoded: &'a [u8]) -> Result<Vec<(Value<'a>, Value<'a>)>, Malformed> {
        let mut decoder = Decoder::new(encoded);
        let wide = match decoder.byte()? {
            0xc1 => false,
            0xd1 => true,
            _ => return Err(Malformed("not a map")),
        };
        let _size = decoder.length(wide)?;
        let elements = decoder.length(wide)?;
        if elements % 2 != 0 {
            return Err(Malformed("a map with an odd number of elements"));
        }
        let mut entries = Vec::with_capacity((elements / 2).min(1024));
        for _ in 0..elements / 2 {
            entries.push((decoder.value()?, decoder.value()?));
        }
        Ok(entries)
    }

    /// The elements of a list value's encoded bytes (`Value::Other` of a list0/8/32).
    pub fn list_elements(encoded: &'a [u8]) -> Result<Vec<Value<'a>>, Malformed> {
        let mut decoder = Decoder::new(encoded);
        let wide = match decoder.byte()? {
            0x45 => return Ok(Vec::new()),
            0xc0 => false,
            0xd0 => true,
            _ => return Err(Malformed("not a list")),
        };
        let _size = decoder.length(wide)?;
        let count = decoder.length(wide)?;
        let mut elements = Vec::with_capacity(count.min(64));
        for _ in 0..count {
            elements.push(decoder.value()?);
        }
        Ok(elements)
    }
}

/// Writes values in the encodings a record uses.
pub mod write {
    /// null
    pub fn null(out: &mut Vec<u8>) {
        out.push(0x40);
    }

    /// A string (str8 or str32).
    pub fn string(out: &mut Vec<u8>, text: &[u8]) {
        variable(out, 0xa1, 0xb1, text);
    }

    /// A symbol (sym8 or sym32).
    pub fn symbol(out: &mut Vec<u8>, text: &[u8]) {
        variable(out, 0xa3, 0xb3, text);
    }

    /// A binary (vbin8 or vbin32).
    pub fn binary(out: &mut Vec<u8>, bytes: &[u8]) {
        variable(out, 0xa0, 0xb0, bytes);
    }

    fn variable(out: &mut Vec<u8>, short: u8, long: u8, bytes: &[u8]) {
        match u8::try_from(bytes.len()) {
            Ok(length) => out.extend_from_slice(&[short, length]),
            Err(_) => {
                out.push(long);
                out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            }
        }
        out.extend_from_slice(bytes);
    }

    /// A value with a fixed-width encoding: its format code and its bytes.
    pub fn fixed(out: &mut Vec<u8>, code: u8, bytes: &[u8]) {
        out.push(code);
        out.extend_from_slice(bytes);
    }

    /// The start of a described section: `0x00 smallulong descriptor`.
    pub fn descriptor(out: &mut Vec<u8>, descriptor: u8) {
        out.extend_from_slice(&[0x00, 0x53, descriptor]);
    }

    /// Starts a map32 or list32 (`code`); returns where its size goes, for [`finish_compound`].
    pub fn start_compound(out: &mut Vec<u8>, code: u8) -> usize {
        out.push(code);
        let at = out.len();
        out.extend_from_slice(&[0u8; 8]);
        at
    }

    /// Fills in a compound's size and element count.
    pub fn finish_compound(out: &mut [u8], at: usize, elements: u32) {
        let size = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&size.to_be_bytes());
        out[at + 4..at + 8].copy_from_slice(&elements.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_encoding_reads_back() {
        let mut out = Vec::new();
        write::string(&mut out, b"hello");
        write::symbol(&mut out, &[b's'; 300]);
        write::binary(&mut out, b"\x00\x01");
        write::null(&mut out);
        write::fixed(&mut out, 0x81, &(-5i64).to_be_bytes());
        let at = write::start_compound(&mut out, 0xd1);
        write::string(&mut out, b"k");
        write::fixed(&mut out, 0x50, &[7]);
        write::finish_compound(&mut out, at, 2);
        let mut decoder = Decoder::new(&out);
        assert_eq!(decoder.value(), Ok(Value::String(b"hello")));
        assert_eq!(decoder.value(), Ok(Value::Symbol(&[b's'; 300])));
        assert_eq!(decoder.value(), Ok(Value::Binary(b"\x00\x01")));
        assert_eq!(decoder.value(), Ok(Value::Null));
        assert_eq!(decoder.value(), Ok(Value::Long(-5)));
        let Ok(Value::Other(map)) = decoder.value() else { panic!("a map") };
        assert_eq!(Decoder::map_entries(map), Ok(vec![(Value::String(b"k"), Value::Ubyte(7))]));
        assert!(decoder.is_empty());
    }

    #[test]
    fn cut_or_unknown_input_is_an_error_not_a_panic() {
        for bytes in [&[0xa1u8, 5, b'a'][..], &[0xd1, 0, 0, 0, 9], &[0xff], &[0x00, 0x53], &[0x00, 0xa1, 0x01, b'x']] {
            assert!(Decoder::new(bytes).value().is_err(), "{bytes:?}");
        }
    }
}
