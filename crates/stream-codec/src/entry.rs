//! Data entries: the unit a publish carries and a chunk stores, in osiris's format
//! (`osiris_log.erl`, "Data Entry format"). The broker keeps an entry's bytes as they came and
//! never looks inside the body: AMQP 1.0 encoding, compression and batching are the clients'.
//!
//! ```text
//! simple entry:     0:1 body_bytes:31 body
//! sub-batch entry:  1:1 compression:3 reserved:4 record_count:16 uncompressed_bytes:32 body_bytes:32 body
//! ```

use crate::wire::Reader;
use crate::DecodeError;
use bytes::{BufMut, Bytes, BytesMut};

/// Header bytes of a simple entry.
pub const SIMPLE_ENTRY_HEADER_BYTES: usize = 4;
/// Header bytes of a sub-batch entry.
pub const SUB_BATCH_ENTRY_HEADER_BYTES: usize = 11;
/// The compression value of an uncompressed sub-batch.
pub const COMPRESSION_NONE: u8 = 0;

/// One data entry, its header and body as they are on the wire and on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataEntry {
    raw: Bytes,
}

impl DataEntry {
    /// Reads one entry (header and body) and shares its bytes.
    pub(crate) fn read(reader: &mut Reader) -> Result<DataEntry, DecodeError> {
        let start = reader.position();
        let first = reader.u8()?;
        let body_bytes = if first & 0x80 == 0 {
            u32::from_be_bytes([first & 0x7f, reader.u8()?, reader.u8()?, reader.u8()?])
        } else {
            let _record_count = reader.u16()?;
            let _uncompressed_bytes = reader.u32()?;
            reader.u32()?
        };
        reader.skip(body_bytes as usize)?;
        Ok(DataEntry { raw: reader.since(start) })
    }

    /// An entry from its bytes, checked: exactly one entry, nothing after it.
    pub fn from_raw(raw: Bytes) -> Result<DataEntry, DecodeError> {
        let mut reader = Reader::new(raw);
        let entry = DataEntry::read(&mut reader)?;
        reader.finish()?;
        Ok(entry)
    }

    /// A simple entry holding `body`.
    pub fn simple(body: &[u8]) -> DataEntry {
        let mut raw = BytesMut::with_capacity(SIMPLE_ENTRY_HEADER_BYTES + body.len());
        put_simple_entry(&mut raw, body);
        DataEntry { raw: raw.freeze() }
    }

    /// The entry's bytes, header included, as a chunk stores them.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// True for a sub-batch (several records in one entry, perhaps compressed).
    pub fn is_sub_batch(&self) -> bool {
        self.raw[0] & 0x80 != 0
    }

    /// Records in the entry: 1 for a simple entry.
    pub fn record_count(&self) -> u16 {
        if self.is_sub_batch() {
            u16::from_be_bytes([self.raw[1], self.raw[2]])
        } else {
            1
        }
    }

    /// The compression of a sub-batch (0 for none, and for a simple entry).
    pub fn compression(&self) -> u8 {
        if self.is_sub_batch() {
            (self.raw[0] >> 4) & 0x07
        } else {
            COMPRESSION_NONE
        }
    }

    /// The body: the message of a simple entry, the (maybe compressed) records of a sub-batch.
    pub fn body(&self) -> Bytes {
        let header = if self.is_sub_batch() { SUB_BATCH_ENTRY_HEADER_BYTES } else { SIMPLE_ENTRY_HEADER_BYTES };
        self.raw.slice(header..)
    }
}

impl DataEntry {
    /// The records, when they can be read without decompressing: the body of a simple entry,
    /// or each record (int32 size, then the bytes) of an uncompressed sub-batch. `None` for a
    /// compressed sub-batch, whose records only the clients' codecs can read.
    pub fn records(&self) -> Option<Records> {
        if !self.is_sub_batch() {
            return Some(Records { single: Some(self.body()), batch: None, left: 0 });
        }
        if self.compression() != COMPRESSION_NONE {
            return None;
        }
        Some(Records { single: None, batch: Some(Reader::new(self.body())), left: self.record_count() })
    }
}

/// The records of one entry (see [`DataEntry::records`]).
pub struct Records {
    single: Option<Bytes>,
    batch: Option<Reader>,
    left: u16,
}

impl Iterator for Records {
    type Item = Result<Bytes, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(body) = self.single.take() {
            return Some(Ok(body));
        }
        let reader = self.batch.as_mut()?;
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let record = reader.u32().and_then(|bytes| reader.take(bytes as usize));
        if record.is_err() {
            self.left = 0;
        }
        Some(record)
    }
}

/// Appends a simple entry holding `body`. The 31-bit size bounds a body to 2 GiB, far above any
/// frame_max, so a larger body is a caller's bug.
pub fn put_simple_entry(writer: &mut BytesMut, body: &[u8]) {
    assert!(body.len() < 1 << 31, "entry body of {} bytes", body.len());
    writer.put_u32(body.len() as u32);
    writer.put_slice(body);
}
