//! A segment's files: the segment (`OSIL` and version 1, then chunks, exactly as osiris lays out
//! a segment file) and its index (`LPSI` and version 1, then one fixed-size entry per chunk).
//!
//! An index entry is (big-endian)
//!
//! ```text
//! chunk id u64 | timestamp i64 | epoch u64 | file position u32 | chunk type u8 | reserved 3 bytes
//! | records u32 | chunk bytes u32 | crc32c u32          = 44 bytes
//! ```
//!
//! osiris's entry (the first 29 bytes) plus what lets Lepus answer an offset or a timestamp, and
//! walk a sealed segment, from the index alone: the chunk's record count and size, and a CRC32C
//! of the entry itself, so a torn or flipped entry is never taken for a chunk. The offset index
//! and the timestamp index are the same entries: chunk ids and timestamps both only grow.

use crate::stream::chunk::{ChunkHeader, ChunkType};

/// The segment file's header: osiris's magic and version.
pub const SEGMENT_HEADER: [u8; 8] = *b"OSIL\x00\x00\x00\x01";
/// The index file's header: Lepus's magic (its entries are not osiris's) and version 1.
pub const INDEX_HEADER: [u8; 8] = *b"LPSI\x00\x00\x00\x01";
/// Bytes of either file header.
pub const FILE_HEADER_BYTES: u64 = 8;
/// Bytes of one index entry.
pub const INDEX_ENTRY_BYTES: usize = 44;
/// The file name suffix of segments.
pub const SEGMENT_SUFFIX: &str = ".segment";
/// The file name suffix of indexes.
pub const INDEX_SUFFIX: &str = ".index";

/// One chunk as the index records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// The chunk's first offset.
    pub chunk_id: u64,
    /// When it was written (ms since the Unix epoch).
    pub timestamp_ms: i64,
    /// Its epoch.
    pub epoch: u64,
    /// Where it starts in the segment file.
    pub position: u32,
    /// What it holds.
    pub chunk_type: ChunkType,
    /// How many offsets it takes.
    pub records: u32,
    /// Its size in the segment: header, filter, data and trailer.
    pub chunk_bytes: u32,
}

impl IndexEntry {
    /// The entry for a chunk written at `position`.
    pub fn for_chunk(header: &ChunkHeader, position: u64) -> IndexEntry {
        IndexEntry {
            chunk_id: header.first_offset,
            timestamp_ms: header.timestamp_ms,
            epoch: header.epoch,
            position: position as u32,
            chunk_type: header.chunk_type,
            records: header.records,
            chunk_bytes: header.chunk_bytes() as u32,
        }
    }

    /// The offset after the chunk's last record.
    pub fn next_offset(&self) -> u64 {
        self.chunk_id + u64::from(self.records)
    }

    /// Where the chunk ends in the segment.
    pub fn end_position(&self) -> u64 {
        u64::from(self.position) + u64::from(self.chunk_bytes)
    }

    /// Whether `offset` is one of the chunk's records.
    pub fn holds(&self, offset: u64) -> bool {
        offset >= self.chunk_id && offset < self.next_offset()
    }

    /// The entry's bytes, checksummed.
    pub fn encode(&self) -> [u8; INDEX_ENTRY_BYTES] {
        let mut bytes = [0u8; INDEX_ENTRY_BYTES];
        bytes[0..8].copy_from_slice(&self.chunk_id.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.timestamp_ms.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.epoch.to_be_bytes());
        bytes[24..28].copy_from_slice(&self.position.to_be_bytes());
        bytes[28] = self.chunk_type.code();
        bytes[32..36].copy_from_slice(&self.records.to_be_bytes());
        bytes[36..40].copy_from_slice(&self.chunk_bytes.to_be_bytes());
        let crc = crc32c::crc32c(&bytes[..40]);
        bytes[40..44].copy_from_slice(&crc.to_be_bytes());
        bytes
    }

    /// Parses an entry; `None` when its checksum, type or sizes are wrong (an all-zero entry, the
    /// end of what was written, fails its checksum too).
    pub fn parse(bytes: &[u8; INDEX_ENTRY_BYTES]) -> Option<IndexEntry> {
        let crc = u32::from_be_bytes([bytes[40], bytes[41], bytes[42], bytes[43]]);
        if crc32c::crc32c(&bytes[..40]) != crc || bytes[29..32] != [0, 0, 0] {
            return None;
        }
        let word = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_be_bytes(word)
        };
        let half = |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let entry = IndexEntry {
            chunk_id: word(0),
            timestamp_ms: word(8) as i64,
            epoch: word(16),
            position: half(24),
            chunk_type: ChunkType::from_code(bytes[28])?,
            records: half(32),
            chunk_bytes: half(36),
        };
        let sane = entry.records > 0
            && u64::from(entry.position) >= FILE_HEADER_BYTES
            && entry.chunk_bytes as usize >= crate::stream::chunk::CHUNK_HEADER_BYTES
            && entry.chunk_id.checked_add(u64::from(entry.records)).is_some();
        sane.then_some(entry)
    }
}

/// The index entries of an index file's bytes (after its header), up to the first that does not
/// parse; with the byte offset (in the file) where valid entries end.
pub fn parse_entries(bytes: &[u8]) -> (Vec<IndexEntry>, u64) {
    let mut entries = Vec::with_capacity(bytes.len() / INDEX_ENTRY_BYTES);
    for raw in bytes.chunks_exact(INDEX_ENTRY_BYTES) {
        let raw: &[u8; INDEX_ENTRY_BYTES] = raw.try_into().expect("chunks_exact gives whole entries");
        match IndexEntry::parse(raw) {
            Some(entry) => entries.push(entry),
            None => break,
        }
    }
    let end = FILE_HEADER_BYTES + (entries.len() * INDEX_ENTRY_BYTES) as u64;
    (entries, end)
}

/// A segment's file name: its first offset, 20 digits, as osiris names them.
pub fn segment_file_name(first_offset: u64) -> String {
    format!("{first_offset:020}{SEGMENT_SUFFIX}")
}

/// The index file name of the segment starting at `first_offset`.
pub fn index_file_name(first_offset: u64) -> String {
    format!("{first_offset:020}{INDEX_SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_and_a_damaged_one_is_refused() {
        let entry = IndexEntry {
            chunk_id: 1234,
            timestamp_ms: 1_700_000_000_000,
            epoch: 1,
            position: 8,
            chunk_type: ChunkType::User,
            records: 10,
            chunk_bytes: 300,
        };
        let bytes = entry.encode();
        assert_eq!(IndexEntry::parse(&bytes), Some(entry));
        for bit in 0..INDEX_ENTRY_BYTES * 8 {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(IndexEntry::parse(&flipped), None, "bit {bit} flipped went unnoticed");
        }
        assert_eq!(IndexEntry::parse(&[0u8; INDEX_ENTRY_BYTES]), None);
        let mut file = Vec::new();
        file.extend_from_slice(&bytes);
        file.extend_from_slice(&IndexEntry { chunk_id: 1244, position: 308, ..entry }.encode());
        file.extend_from_slice(&[0u8; INDEX_ENTRY_BYTES]);
        file.extend_from_slice(&bytes);
        let (entries, end) = parse_entries(&file);
        assert_eq!(entries.len(), 2);
        assert_eq!(end, FILE_HEADER_BYTES + 2 * INDEX_ENTRY_BYTES as u64);
    }
}
