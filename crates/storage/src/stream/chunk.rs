//! The chunk: the unit a stream is written, indexed, replicated and read in, laid out exactly as
//! RabbitMQ's osiris writes it, so a RabbitMQ Stream protocol reader gets the chunk's bytes
//! straight from the segment file (the `Deliver` frame carries the 48-byte header and the data
//! entries as they are on disk) and the broker never decodes a record it only stores and sends.
//!
//! ```text
//! magic 0x5 (4 bits) | version 0x1 (4 bits) | chunk type u8 | entries u16 | records u32
//! | timestamp i64 (ms) | epoch u64 | first offset u64 | data crc u32 | data bytes u32
//! | trailer bytes u32 | filter bytes u8 | reserved 3 bytes          = 48 bytes
//! [filter] [data entries] [trailer]
//! ```
//!
//! All integers are big-endian. The data CRC is CRC-32 (IEEE, Erlang's `erlang:crc32`, what the
//! stream clients check) over the data entries only. A data entry is a *simple* entry
//! (`0 | length u31 | body`, one record) or a *sub-batch* (`1 | compression u3 | reserved u4 |
//! records u16 | uncompressed bytes u32 | bytes u32 | body`, many records, written by clients
//! that batch on their side). The trailer carries tracking (publisher sequences) and is never
//! sent to clients; the filter (RabbitMQ 3.13's bloom filter) is always empty here, since 3.10
//! has none, but a chunk that has one is still read.
//!
//! Chunk types: user data, tracking delta (stored consumer offsets) and tracking snapshot (all
//! tracking, the first chunk of a segment). Each takes as many offsets as it has records, so a
//! tracking chunk takes one, as in RabbitMQ.

use crate::stream::StreamError;

/// The high nibble of a chunk's first byte.
pub const CHUNK_MAGIC: u8 = 0x5;
/// The low nibble: the chunk format version.
pub const CHUNK_VERSION: u8 = 0x1;
/// The fixed header in front of every chunk.
pub const CHUNK_HEADER_BYTES: usize = 48;
/// The most data bytes a chunk may claim. A header claiming more is damage, not a chunk: no
/// writer makes one this large (an AMQP chunk is cut at [`AMQP_CHUNK_BYTES_TARGET`] or holds one
/// message, at most 512 MiB in RabbitMQ; a protocol chunk is one frame).
pub const CHUNK_DATA_BYTES_MAX: u32 = 600 * 1024 * 1024;
/// The most trailer bytes a chunk may claim (tracking of a few hundred publishers).
pub const CHUNK_TRAILER_BYTES_MAX: u32 = 16 * 1024 * 1024;
/// An open chunk of AMQP 0-9-1 publishes is cut once its data reaches this size, before its
/// group-commit window ends, so a reader's buffer stays bounded by it (or by one message).
pub const AMQP_CHUNK_BYTES_TARGET: usize = 1024 * 1024;
/// The most entries one chunk holds: the header counts them in 16 bits.
pub const CHUNK_ENTRIES_MAX: usize = u16::MAX as usize;
/// The most bytes one simple entry's body may have: its length is 31 bits.
pub const SIMPLE_ENTRY_BYTES_MAX: usize = (1 << 31) - 1;
/// A simple entry's header: its length.
pub const SIMPLE_ENTRY_HEADER_BYTES: usize = 4;
/// A sub-batch entry's header: flags, records, uncompressed and stored lengths.
pub const SUB_BATCH_HEADER_BYTES: usize = 11;

/// What a chunk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkType {
    /// Messages.
    User,
    /// Tracking changes: consumer offsets stored since the last chunk that carried tracking.
    TrackingDelta,
    /// All tracking: the first chunk of a segment, so retention can delete older segments.
    TrackingSnapshot,
}

impl ChunkType {
    /// Its code in the header.
    pub fn code(self) -> u8 {
        match self {
            ChunkType::User => 0,
            ChunkType::TrackingDelta => 1,
            ChunkType::TrackingSnapshot => 2,
        }
    }

    /// The type of a header code.
    pub fn from_code(code: u8) -> Option<ChunkType> {
        match code {
            0 => Some(ChunkType::User),
            1 => Some(ChunkType::TrackingDelta),
            2 => Some(ChunkType::TrackingSnapshot),
            _ => None,
        }
    }
}

/// A chunk's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// What it holds.
    pub chunk_type: ChunkType,
    /// How many data entries.
    pub entries: u16,
    /// How many records (offsets) it takes: one per simple entry, a sub-batch's count for each
    /// sub-batch.
    pub records: u32,
    /// When it was written, in milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The leader epoch (always 1 on a single node).
    pub epoch: u64,
    /// The offset of its first record (the chunk id).
    pub first_offset: u64,
    /// CRC-32 (IEEE) of the data entries.
    pub data_crc: u32,
    /// Bytes of data entries.
    pub data_bytes: u32,
    /// Bytes of trailer after the data.
    pub trailer_bytes: u32,
    /// Bytes of filter between the header and the data (0 for chunks Lepus writes).
    pub filter_bytes: u8,
}

impl ChunkHeader {
    /// Parses a header, checking what a header alone can tell: magic, version, type, and sizes
    /// within their bounds.
    pub fn parse(bytes: &[u8; CHUNK_HEADER_BYTES]) -> Result<ChunkHeader, ChunkDefect> {
        if bytes[0] >> 4 != CHUNK_MAGIC || bytes[0] & 0x0f != CHUNK_VERSION {
            return Err(ChunkDefect::BadMagic(bytes[0]));
        }
        let chunk_type = ChunkType::from_code(bytes[1]).ok_or(ChunkDefect::UnknownType(bytes[1]))?;
        let header = ChunkHeader {
            chunk_type,
            entries: u16::from_be_bytes([bytes[2], bytes[3]]),
            records: be_u32(bytes, 4),
            timestamp_ms: be_u64(bytes, 8) as i64,
            epoch: be_u64(bytes, 16),
            first_offset: be_u64(bytes, 24),
            data_crc: be_u32(bytes, 32),
            data_bytes: be_u32(bytes, 36),
            trailer_bytes: be_u32(bytes, 40),
            filter_bytes: bytes[44],
        };
        if header.data_bytes > CHUNK_DATA_BYTES_MAX || header.trailer_bytes > CHUNK_TRAILER_BYTES_MAX {
            return Err(ChunkDefect::TooLarge);
        }
        // Every entry takes a record at least, and a chunk takes at least one offset: a chunk of
        // no records would give the next chunk its own id.
        if header.records < u32::from(header.entries) || header.entries == 0 {
            return Err(ChunkDefect::BadCounts { entries: header.entries, records: header.records });
        }
        if header.first_offset.checked_add(u64::from(header.records)).is_none() {
            return Err(ChunkDefect::BadCounts { entries: header.entries, records: header.records });
        }
        Ok(header)
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_BYTES] {
        let mut bytes = [0u8; CHUNK_HEADER_BYTES];
        bytes[0] = (CHUNK_MAGIC << 4) | CHUNK_VERSION;
        bytes[1] = self.chunk_type.code();
        bytes[2..4].copy_from_slice(&self.entries.to_be_bytes());
        bytes[4..8].copy_from_slice(&self.records.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.timestamp_ms.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.epoch.to_be_bytes());
        bytes[24..32].copy_from_slice(&self.first_offset.to_be_bytes());
        bytes[32..36].copy_from_slice(&self.data_crc.to_be_bytes());
        bytes[36..40].copy_from_slice(&self.data_bytes.to_be_bytes());
        bytes[40..44].copy_from_slice(&self.trailer_bytes.to_be_bytes());
        bytes[44] = self.filter_bytes;
        bytes
    }

    /// The whole chunk's size on disk: header, filter, data and trailer.
    pub fn chunk_bytes(&self) -> u64 {
        CHUNK_HEADER_BYTES as u64 + u64::from(self.filter_bytes) + u64::from(self.data_bytes) + u64::from(self.trailer_bytes)
    }

    /// Where the data entries start, from the chunk's start.
    pub fn data_start(&self) -> u64 {
        CHUNK_HEADER_BYTES as u64 + u64::from(self.filter_bytes)
    }

    /// The offset after its last record: the next chunk's id.
    pub fn next_offset(&self) -> u64 {
        self.first_offset + u64::from(self.records)
    }
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

/// Why bytes are not a valid chunk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkDefect {
    /// The first byte is not magic 5, version 1 (zeros: nothing was written there).
    #[error("no chunk header (first byte {0:#04x})")]
    BadMagic(u8),
    /// A chunk type osiris does not have.
    #[error("unknown chunk type {0}")]
    UnknownType(u8),
    /// Sizes past their bounds.
    #[error("chunk sizes past their bounds")]
    TooLarge,
    /// Entry and record counts that cannot be.
    #[error("{entries} entries and {records} records")]
    BadCounts {
        /// The header's entries.
        entries: u16,
        /// The header's records.
        records: u32,
    },
    /// Not the chunk expected at this place in the log.
    #[error("chunk id {found}, expected {expected}")]
    WrongOffset {
        /// The header's first offset.
        found: u64,
        /// The next offset of the log.
        expected: u64,
    },
    /// The data does not match its CRC.
    #[error("data checksum mismatch")]
    ChecksumMismatch,
    /// The entries do not fill the data exactly, or do not add up to the header's counts.
    #[error("entries do not match the header: {0}")]
    BadEntries(&'static str),
    /// The chunk runs past the end of what was written.
    #[error("chunk cut short")]
    Truncated,
    /// The header differs from the index entry written with it.
    #[error("header differs from its index entry")]
    IndexMismatch,
}

/// CRC-32 (IEEE) of data entries, as the header carries it.
pub fn data_crc(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// One data entry of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    /// One record: its bytes (an AMQP 1.0 message for RabbitMQ's clients).
    Simple(&'a [u8]),
    /// Records a client batched (and maybe compressed) itself: given to readers as they are.
    SubBatch {
        /// Compression type (0: none).
        compression: u8,
        /// How many records.
        records: u16,
        /// Their bytes before compression.
        uncompressed_bytes: u32,
        /// The stored body.
        body: &'a [u8],
    },
}

impl Entry<'_> {
    /// How many records (offsets) the entry holds.
    pub fn records(&self) -> u32 {
        match self {
            Entry::Simple(_) => 1,
            Entry::SubBatch { records, .. } => u32::from(*records),
        }
    }
}

/// The data entries of a chunk, front to back; an entry that runs past the data is an error and
/// ends the iteration.
#[derive(Debug, Clone)]
pub struct Entries<'a> {
    data: &'a [u8],
}

impl<'a> Entries<'a> {
    /// The entries of a chunk's data (without header, filter or trailer).
    pub fn new(data: &'a [u8]) -> Entries<'a> {
        Entries { data }
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<Entry<'a>, ChunkDefect>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.data.is_empty() {
            return None;
        }
        let parsed = parse_entry(self.data);
        match parsed {
            Ok((entry, used)) => {
                self.data = &self.data[used..];
                Some(Ok(entry))
            }
            Err(defect) => {
                self.data = &[];
                Some(Err(defect))
            }
        }
    }
}

/// Parses the entry at the start of `data`; returns it and the bytes it takes.
fn parse_entry(data: &[u8]) -> Result<(Entry<'_>, usize), ChunkDefect> {
    if data.len() < SIMPLE_ENTRY_HEADER_BYTES {
        return Err(ChunkDefect::BadEntries("an entry header runs past the data"));
    }
    let first = be_u32(data, 0);
    if first & 0x8000_0000 == 0 {
        let length = first as usize;
        let end = SIMPLE_ENTRY_HEADER_BYTES.checked_add(length).filter(|end| *end <= data.len());
        let end = end.ok_or(ChunkDefect::BadEntries("a simple entry runs past the data"))?;
        return Ok((Entry::Simple(&data[SIMPLE_ENTRY_HEADER_BYTES..end]), end));
    }
    if data.len() < SUB_BATCH_HEADER_BYTES {
        return Err(ChunkDefect::BadEntries("a sub-batch header runs past the data"));
    }
    let compression = (data[0] >> 4) & 0x07;
    let records = u16::from_be_bytes([data[1], data[2]]);
    let uncompressed_bytes = be_u32(data, 3);
    let length = be_u32(data, 7) as usize;
    let end = SUB_BATCH_HEADER_BYTES.checked_add(length).filter(|end| *end <= data.len());
    let end = end.ok_or(ChunkDefect::BadEntries("a sub-batch runs past the data"))?;
    let entry = Entry::SubBatch { compression, records, uncompressed_bytes, body: &data[SUB_BATCH_HEADER_BYTES..end] };
    Ok((entry, end))
}

/// Checks a chunk's data against its header: the CRC, and that its entries fill the data exactly
/// and add up to the header's entry and record counts. Only the entries' framing is read, never
/// a record's content; with the CRC this keeps a damaged header from claiming records that were
/// never written.
pub fn check_data(header: &ChunkHeader, data: &[u8]) -> Result<(), ChunkDefect> {
    if data.len() != header.data_bytes as usize {
        return Err(ChunkDefect::Truncated);
    }
    if data_crc(data) != header.data_crc {
        return Err(ChunkDefect::ChecksumMismatch);
    }
    let (mut entries, mut records) = (0u32, 0u64);
    for entry in Entries::new(data) {
        let entry = entry?;
        entries += 1;
        records += u64::from(entry.records());
    }
    if entries != u32::from(header.entries) {
        return Err(ChunkDefect::BadEntries("entry count differs from the header's"));
    }
    if records != u64::from(header.records) {
        return Err(ChunkDefect::BadEntries("record count differs from the header's"));
    }
    Ok(())
}

/// Appends a simple entry (one record) to `out`.
pub fn put_simple_entry(out: &mut Vec<u8>, body: &[u8]) -> Result<(), StreamError> {
    if body.len() > SIMPLE_ENTRY_BYTES_MAX {
        return Err(StreamError::RecordTooLarge { bytes: body.len() });
    }
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    Ok(())
}

/// Data entries made by a caller (a RabbitMQ Stream protocol publish batch: its messages as
/// simple entries, or the sub-batches its client made), to store as one chunk.
#[derive(Debug, Clone, Copy)]
pub struct EntryBatch<'a> {
    /// The entries, framed as in a chunk.
    pub data: &'a [u8],
    /// How many entries `data` holds.
    pub entries: u16,
    /// How many records they hold.
    pub records: u32,
}

impl<'a> EntryBatch<'a> {
    /// Frames `data` as a batch, counting its entries and records; refuses data whose entries
    /// do not parse or are too many for one chunk.
    pub fn counted(data: &'a [u8]) -> Result<EntryBatch<'a>, StreamError> {
        let (mut entries, mut records) = (0usize, 0u64);
        for entry in Entries::new(data) {
            let entry = entry.map_err(StreamError::BadBatch)?;
            entries += 1;
            records += u64::from(entry.records());
        }
        if entries == 0 || entries > CHUNK_ENTRIES_MAX || records > u64::from(u32::MAX) || data.len() > CHUNK_DATA_BYTES_MAX as usize {
            return Err(StreamError::BadBatch(ChunkDefect::BadCounts {
                entries: entries.min(usize::from(u16::MAX)) as u16,
                records: records.min(u64::from(u32::MAX)) as u32,
            }));
        }
        Ok(EntryBatch { data, entries: entries as u16, records: records as u32 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(records: u32, data: &[u8]) -> ChunkHeader {
        ChunkHeader {
            chunk_type: ChunkType::User,
            entries: records as u16,
            records,
            timestamp_ms: 1_700_000_000_000,
            epoch: 1,
            first_offset: 42,
            data_crc: data_crc(data),
            data_bytes: data.len() as u32,
            trailer_bytes: 0,
            filter_bytes: 0,
        }
    }

    #[test]
    fn a_header_round_trips_and_matches_the_osiris_layout() {
        let mut data = Vec::new();
        put_simple_entry(&mut data, b"hello").expect("entry");
        put_simple_entry(&mut data, b"").expect("entry");
        let header = header(2, &data);
        let bytes = header.encode();
        assert_eq!(bytes[0], 0x51, "magic 5, version 1");
        assert_eq!(&bytes[2..4], &[0, 2], "entries");
        assert_eq!(&bytes[24..32], &42u64.to_be_bytes(), "chunk id");
        assert_eq!(&bytes[44..48], &[0, 0, 0, 0], "no filter, reserved zeros");
        assert_eq!(ChunkHeader::parse(&bytes), Ok(header));
        assert_eq!(check_data(&header, &data), Ok(()));
        assert_eq!(header.next_offset(), 44);
        assert_eq!(header.chunk_bytes(), 48 + 9 + 4);
    }

    #[test]
    fn the_crc_is_crc32_ieee_as_the_stream_clients_check_it() {
        // The CRC-32 check value of "123456789".
        assert_eq!(data_crc(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn damaged_data_or_counts_are_refused() {
        let mut data = Vec::new();
        put_simple_entry(&mut data, b"one").expect("entry");
        put_simple_entry(&mut data, b"two").expect("entry");
        let good = header(2, &data);
        let mut flipped = data.clone();
        flipped[5] ^= 1;
        assert_eq!(check_data(&good, &flipped), Err(ChunkDefect::ChecksumMismatch));
        let more_records = ChunkHeader { records: 3, ..good };
        assert!(matches!(check_data(&more_records, &data), Err(ChunkDefect::BadEntries(_))));
        let fewer_entries = ChunkHeader { entries: 1, records: 1, ..good };
        assert!(matches!(check_data(&fewer_entries, &data), Err(ChunkDefect::BadEntries(_))));
        assert_eq!(check_data(&good, &data[..data.len() - 1]), Err(ChunkDefect::Truncated));
    }

    #[test]
    fn a_sub_batch_counts_its_records() {
        let mut data = Vec::new();
        data.push(0x80);
        data.extend_from_slice(&5u16.to_be_bytes());
        data.extend_from_slice(&3u32.to_be_bytes());
        data.extend_from_slice(&3u32.to_be_bytes());
        data.extend_from_slice(b"abc");
        put_simple_entry(&mut data, b"x").expect("entry");
        let batch = EntryBatch::counted(&data).expect("batch");
        assert_eq!((batch.entries, batch.records), (2, 6));
        let entries: Vec<Entry> = Entries::new(&data).map(|entry| entry.expect("entry")).collect();
        assert_eq!(entries[0], Entry::SubBatch { compression: 0, records: 5, uncompressed_bytes: 3, body: b"abc" });
        assert_eq!(entries[1], Entry::Simple(b"x"));
    }

    #[test]
    fn headers_of_zeros_or_impossible_counts_are_refused() {
        assert_eq!(ChunkHeader::parse(&[0u8; CHUNK_HEADER_BYTES]), Err(ChunkDefect::BadMagic(0)));
        let mut bytes = header(1, b"\0\0\0\0").encode();
        bytes[1] = 9;
        assert_eq!(ChunkHeader::parse(&bytes), Err(ChunkDefect::UnknownType(9)));
        let no_records = ChunkHeader { entries: 1, records: 0, ..header(1, b"") }.encode();
        assert!(matches!(ChunkHeader::parse(&no_records), Err(ChunkDefect::BadCounts { .. })));
    }
}
