//! Tracking: what a stream remembers besides its messages, kept in the log itself as osiris keeps
//! it, so it survives restarts and needs no file of its own.
//!
//! - Consumer offsets (RabbitMQ Stream's store offset / query offset): a reference and an offset.
//!   Stored in a *tracking delta* chunk.
//! - Publisher sequences (deduplication): a publisher reference and the last publishing id it
//!   stored. Carried in the trailer of the user chunk that holds the publish, so deduplication
//!   costs no chunk and no offset of its own.
//! - Every new segment starts with a *tracking snapshot* chunk holding all of it, so retention
//!   may delete older segments and recovery reads only the newest segment.
//!
//! A tracking block is `type u8 | reference length u8 | reference | value`, the value being a
//! u64 offset (type 1), a u64 publishing id (type 0 in deltas and trailers), or the chunk id and
//! the publishing id, two u64 (type 0 in snapshots); type 2 (a timestamp, which RabbitMQ 3.10
//! does not write) is read and ignored.

use crate::stream::chunk::ChunkDefect;
use crate::stream::StreamError;
use std::collections::BTreeMap;

const TYPE_SEQUENCE: u8 = 0;
const TYPE_OFFSET: u8 = 1;
const TYPE_TIMESTAMP: u8 = 2;

/// The longest reference: its length is one byte (RabbitMQ's references are at most 255 bytes).
pub const REFERENCE_BYTES_MAX: usize = 255;
/// How many consumer references one stream tracks at most; storing an offset for another is
/// refused ([`StreamError::TrackingFull`]) until retention drops old ones.
pub const TRACKED_OFFSETS_MAX: usize = 16_384;
/// How many publisher references a snapshot keeps: the most recently active, as osiris keeps 255.
pub const TRACKED_SEQUENCES_MAX: usize = 255;

/// Consumer offsets and publisher sequences of one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracking {
    /// Reference -> stored offset.
    offsets: BTreeMap<Vec<u8>, u64>,
    /// Publisher reference -> (chunk id that carried it, last publishing id).
    sequences: BTreeMap<Vec<u8>, (u64, u64)>,
}

/// Which record a tracking block came in, which decides a sequence block's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackingSource {
    /// A user chunk's trailer or a tracking delta chunk, whose first offset is this.
    Delta(u64),
    /// A tracking snapshot chunk (replaces everything before it).
    Snapshot,
}

impl Tracking {
    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty() && self.sequences.is_empty()
    }

    /// The offset stored for `reference`.
    pub fn offset(&self, reference: &[u8]) -> Option<u64> {
        self.offsets.get(reference).copied()
    }

    /// The last publishing id stored for publisher `reference`.
    pub fn sequence(&self, reference: &[u8]) -> Option<u64> {
        self.sequences.get(reference).map(|(_, sequence)| *sequence)
    }

    /// How many consumer references are tracked.
    pub fn offsets_len(&self) -> usize {
        self.offsets.len()
    }

    /// Checks that `reference` can be stored (its length, and room for a new one).
    pub fn check_offset(&self, reference: &[u8]) -> Result<(), StreamError> {
        check_reference(reference)?;
        if !self.offsets.contains_key(reference) && self.offsets.len() >= TRACKED_OFFSETS_MAX {
            return Err(StreamError::TrackingFull);
        }
        Ok(())
    }

    /// Records an offset.
    pub fn set_offset(&mut self, reference: &[u8], offset: u64) {
        self.offsets.insert(reference.to_vec(), offset);
    }

    /// Records a publisher's sequence, carried by the chunk `chunk_id`.
    pub fn set_sequence(&mut self, reference: &[u8], chunk_id: u64, sequence: u64) {
        self.sequences.insert(reference.to_vec(), (chunk_id, sequence));
    }

    /// The snapshot of everything, for the first chunk of a new segment: offsets below the
    /// stream's first offset are dropped (those messages are gone), and only the
    /// [`TRACKED_SEQUENCES_MAX`] most recently active publishers are kept, as osiris does.
    pub fn snapshot(&mut self, first_offset: u64) -> Vec<u8> {
        self.offsets.retain(|_, offset| *offset >= first_offset);
        if self.sequences.len() > TRACKED_SEQUENCES_MAX {
            let mut by_chunk: Vec<u64> = self.sequences.values().map(|(chunk, _)| *chunk).collect();
            by_chunk.sort_unstable();
            let cutoff = by_chunk[by_chunk.len() - TRACKED_SEQUENCES_MAX];
            self.sequences.retain(|_, (chunk, _)| *chunk >= cutoff);
        }
        let mut out = Vec::new();
        for (reference, (chunk, sequence)) in &self.sequences {
            put_block(&mut out, TYPE_SEQUENCE, reference);
            out.extend_from_slice(&chunk.to_be_bytes());
            out.extend_from_slice(&sequence.to_be_bytes());
        }
        for (reference, offset) in &self.offsets {
            put_block(&mut out, TYPE_OFFSET, reference);
            out.extend_from_slice(&offset.to_be_bytes());
        }
        out
    }

    /// Applies tracking blocks read from a chunk (a trailer, a delta, or a snapshot, which
    /// replaces what came before). Blocks that do not parse make the whole chunk's tracking
    /// invalid, and nothing of it is applied.
    pub fn apply(&mut self, blocks: &[u8], source: TrackingSource) -> Result<(), ChunkDefect> {
        let parsed = parse_blocks(blocks, source)?;
        if source == TrackingSource::Snapshot {
            *self = Tracking::default();
        }
        for block in parsed {
            match block {
                Block::Offset(reference, offset) => {
                    self.offsets.insert(reference.to_vec(), offset);
                }
                Block::Sequence(reference, chunk, sequence) => {
                    self.sequences.insert(reference.to_vec(), (chunk, sequence));
                }
            }
        }
        Ok(())
    }
}

fn check_reference(reference: &[u8]) -> Result<(), StreamError> {
    if reference.is_empty() || reference.len() > REFERENCE_BYTES_MAX {
        return Err(StreamError::BadReference { bytes: reference.len() });
    }
    Ok(())
}

/// Appends a delta block storing `offset` for `reference`.
pub fn put_offset_block(out: &mut Vec<u8>, reference: &[u8], offset: u64) {
    put_block(out, TYPE_OFFSET, reference);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// Appends a trailer block storing publisher `reference`'s last publishing id.
pub fn put_sequence_block(out: &mut Vec<u8>, reference: &[u8], sequence: u64) -> Result<(), StreamError> {
    check_reference(reference)?;
    put_block(out, TYPE_SEQUENCE, reference);
    out.extend_from_slice(&sequence.to_be_bytes());
    Ok(())
}

/// The bytes of a trailer: tracking blocks and their CRC32C. osiris checksums the data entries
/// only; a trailer is at the chunk's very end, where a torn write ends, so it carries its own
/// checksum and a damaged one is never read as a publisher's sequence. Clients never see it.
pub fn seal_trailer(blocks: &mut Vec<u8>) {
    let crc = crc32c::crc32c(blocks);
    blocks.extend_from_slice(&crc.to_be_bytes());
}

/// The tracking blocks of a trailer, if its checksum holds.
pub fn open_trailer(trailer: &[u8]) -> Result<&[u8], ChunkDefect> {
    let damaged = ChunkDefect::BadEntries("trailer checksum mismatch");
    let Some(split) = trailer.len().checked_sub(4) else { return Err(damaged) };
    let (blocks, crc) = trailer.split_at(split);
    if crc32c::crc32c(blocks).to_be_bytes() != crc {
        return Err(damaged);
    }
    Ok(blocks)
}

fn put_block(out: &mut Vec<u8>, kind: u8, reference: &[u8]) {
    out.push(kind);
    out.push(reference.len() as u8);
    out.extend_from_slice(reference);
}

enum Block<'a> {
    Offset(&'a [u8], u64),
    Sequence(&'a [u8], u64, u64),
}

fn parse_blocks(mut bytes: &[u8], source: TrackingSource) -> Result<Vec<Block<'_>>, ChunkDefect> {
    let mut blocks = Vec::new();
    let word = |bytes: &[u8], at: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_be_bytes(word)
    };
    while !bytes.is_empty() {
        let short = ChunkDefect::BadEntries("a tracking block runs past its entry");
        if bytes.len() < 2 {
            return Err(short);
        }
        let (kind, length) = (bytes[0], bytes[1] as usize);
        let value_bytes = match (kind, source) {
            (TYPE_SEQUENCE, TrackingSource::Snapshot) => 16,
            (TYPE_SEQUENCE | TYPE_OFFSET | TYPE_TIMESTAMP, _) => 8,
            _ => return Err(ChunkDefect::BadEntries("unknown tracking type")),
        };
        let end = 2 + length + value_bytes;
        if bytes.len() < end {
            return Err(short);
        }
        let reference = &bytes[2..2 + length];
        let value_at = 2 + length;
        match (kind, source) {
            (TYPE_OFFSET, _) => blocks.push(Block::Offset(reference, word(bytes, value_at))),
            (TYPE_SEQUENCE, TrackingSource::Snapshot) => {
                blocks.push(Block::Sequence(reference, word(bytes, value_at), word(bytes, value_at + 8)))
            }
            (TYPE_SEQUENCE, TrackingSource::Delta(chunk)) => blocks.push(Block::Sequence(reference, chunk, word(bytes, value_at))),
            _ => {}
        }
        bytes = &bytes[end..];
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_and_a_snapshot_rebuild_the_same_tracking() {
        let mut tracking = Tracking::default();
        let mut delta = Vec::new();
        put_offset_block(&mut delta, b"consumer-a", 17);
        put_sequence_block(&mut delta, b"publisher-1", 99).expect("block");
        tracking.apply(&delta, TrackingSource::Delta(40)).expect("delta");
        assert_eq!(tracking.offset(b"consumer-a"), Some(17));
        assert_eq!(tracking.sequence(b"publisher-1"), Some(99));
        let snapshot = tracking.clone().snapshot(0);
        let mut rebuilt = Tracking::default();
        rebuilt.set_offset(b"stale", 1);
        rebuilt.apply(&snapshot, TrackingSource::Snapshot).expect("snapshot");
        assert_eq!(rebuilt, tracking);
        // An offset below the stream's first offset goes with its messages.
        let trimmed = tracking.clone().snapshot(18);
        let mut after_retention = Tracking::default();
        after_retention.apply(&trimmed, TrackingSource::Snapshot).expect("snapshot");
        assert_eq!(after_retention.offset(b"consumer-a"), None);
        assert_eq!(after_retention.sequence(b"publisher-1"), Some(99));
    }

    #[test]
    fn a_cut_block_applies_nothing() {
        let mut delta = Vec::new();
        put_offset_block(&mut delta, b"a", 1);
        put_offset_block(&mut delta, b"b", 2);
        let mut tracking = Tracking::default();
        assert!(tracking.apply(&delta[..delta.len() - 1], TrackingSource::Delta(0)).is_err());
        assert!(tracking.is_empty());
        assert!(matches!(put_sequence_block(&mut Vec::new(), &[b'x'; 256], 1), Err(StreamError::BadReference { bytes: 256 })));
    }
}
