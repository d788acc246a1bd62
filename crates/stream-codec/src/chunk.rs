//! Osiris chunks, the unit a deliver carries: a 48-byte header, the data entries, the tracking
//! trailer (`osiris_log.erl`, "Chunk format", osiris 1.3.1 as RabbitMQ 3.10.8 ships it). The
//! broker sends stored chunks as they are; this module is for the clients that read them (the
//! perf consumer) and for tests.

use crate::entry::DataEntry;
use crate::wire::Reader;
use crate::DecodeError;
use bytes::{BufMut, Bytes, BytesMut};

/// Bytes of a chunk header.
pub const CHUNK_HEADER_BYTES: usize = 48;
/// Magic 0x5 in the high nibble, chunk format version 0 in the low one (osiris 1.3.1 and later).
pub const CHUNK_MAGIC_AND_VERSION: u8 = 0x50;

/// Chunk types.
pub mod chunk_type {
    /// Messages.
    pub const USER: u8 = 0;
    /// Changes to the tracking of publishers and consumers.
    pub const TRACKING_DELTA: u8 = 1;
    /// All the tracking, at the start of a segment.
    pub const TRACKING_SNAPSHOT: u8 = 2;
}

/// A chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkHeader {
    /// One of [`chunk_type`].
    pub chunk_type: u8,
    /// Data entries in the chunk.
    pub entry_count: u16,
    /// Records (messages): a sub-batch entry holds several.
    pub record_count: u32,
    /// When the chunk was written, milliseconds since the epoch.
    pub timestamp_ms: i64,
    /// The leader's epoch when it was written.
    pub epoch: u64,
    /// The offset of the chunk's first record (the chunk id).
    pub first_offset: u64,
    /// CRC-32 (IEEE, as `erlang:crc32/1`) of the data entries; clients check it.
    pub data_crc: u32,
    /// Bytes of data entries after the header.
    pub data_bytes: u32,
    /// Bytes of tracking trailer after the data.
    pub trailer_bytes: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

impl ChunkHeader {
    /// Reads a header from the first 48 bytes of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<ChunkHeader, DecodeError> {
        let header = bytes.get(..CHUNK_HEADER_BYTES).ok_or(DecodeError::Truncated)?;
        // The magic only: osiris's later chunk format version (1, with a filter size in the
        // reserved bytes) reads the same for chunks without a filter.
        if header[0] >> 4 != CHUNK_MAGIC_AND_VERSION >> 4 {
            return Err(DecodeError::BadChunkMagic(header[0]));
        }
        let u16_at = |at: usize| u16::from_be_bytes([header[at], header[at + 1]]);
        let u32_at = |at: usize| u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
        let u64_at = |at: usize| (u64::from(u32_at(at)) << 32) | u64::from(u32_at(at + 4));
        Ok(ChunkHeader {
            chunk_type: header[1],
            entry_count: u16_at(2),
            record_count: u32_at(4),
            timestamp_ms: u64_at(8) as i64,
            epoch: u64_at(16),
            first_offset: u64_at(24),
            data_crc: u32_at(32),
            data_bytes: u32_at(36),
            trailer_bytes: u32_at(40),
            reserved: u32_at(44),
        })
    }

    /// Appends the 48 header bytes.
    pub fn write(&self, writer: &mut BytesMut) {
        writer.put_u8(CHUNK_MAGIC_AND_VERSION);
        writer.put_u8(self.chunk_type);
        writer.put_u16(self.entry_count);
        writer.put_u32(self.record_count);
        writer.put_i64(self.timestamp_ms);
        writer.put_u64(self.epoch);
        writer.put_u64(self.first_offset);
        writer.put_u32(self.data_crc);
        writer.put_u32(self.data_bytes);
        writer.put_u32(self.trailer_bytes);
        writer.put_u32(self.reserved);
    }

    /// Bytes of the whole chunk: header, data and trailer.
    pub fn chunk_bytes(&self) -> u64 {
        CHUNK_HEADER_BYTES as u64 + u64::from(self.data_bytes) + u64::from(self.trailer_bytes)
    }
}

/// A chunk, split into its parts (all shared with the bytes it was read from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The header.
    pub header: ChunkHeader,
    /// The data entries.
    pub data: Bytes,
    /// The tracking trailer, when the bytes hold it: a deliver does not, since osiris sends a
    /// subscriber the header and the data only (RabbitMQ 3.10.8, measured), while the header
    /// still gives the trailer's length.
    pub trailer: Bytes,
}

impl Chunk {
    /// Splits `bytes`, which must hold exactly one chunk: header and data, or header, data
    /// and trailer.
    pub fn parse(bytes: Bytes) -> Result<Chunk, DecodeError> {
        let header = ChunkHeader::parse(&bytes)?;
        let mut reader = Reader::new(bytes);
        reader.skip(CHUNK_HEADER_BYTES)?;
        let data = reader.take(header.data_bytes as usize)?;
        let trailer = if reader.remaining() == 0 { Bytes::new() } else { reader.take(header.trailer_bytes as usize)? };
        reader.finish()?;
        Ok(Chunk { header, data, trailer })
    }

    /// Bytes of header and data: what a deliver carries.
    pub fn delivered_bytes(header: &ChunkHeader) -> u64 {
        CHUNK_HEADER_BYTES as u64 + u64::from(header.data_bytes)
    }

    /// The data entries (at most `entry_count` of them, as the header says).
    pub fn entries(&self) -> ChunkEntries {
        ChunkEntries { reader: Reader::new(self.data.clone()), left: self.header.entry_count }
    }
}

/// The data entries of a [`Chunk`].
pub struct ChunkEntries {
    reader: Reader,
    left: u16,
}

impl Iterator for ChunkEntries {
    type Item = Result<DataEntry, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let entry = DataEntry::read(&mut self.reader);
        if entry.is_err() {
            self.left = 0;
        }
        Some(entry)
    }
}
