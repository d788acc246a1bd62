//! Segment summaries: what a sealed segment does to its queue's live and delivered positions,
//! kept in the queue's index file, so a restart reads a few bytes per segment instead of the
//! segment (issue 17 item 6: a 10 GB backlog took 17 s to scan with a cold page cache).
//!
//! A segment's records change two sets as recovery replays them in order: *live* (persistent
//! publishes not settled) and *delivered* (live positions handed out before). For any run of
//! records in which a position is published at most once, and before any delivered marker or
//! settle naming it (which is how a queue writes them: it cannot deliver or settle a message
//! before it has it), the segment's effect is
//!
//! ```text
//! live'      = (live ∪ P) − X
//! delivered' = (delivered ∪ (M ∩ (live ∪ P))) − X
//! ```
//!
//! with P its persistent publishes, X its settles and M its delivered markers. The log builds
//! the three sets as it appends (a compare and an increment per record: positions come mostly in
//! order, so they are runs), and when it seals the segment hands the summary to the janitor,
//! which fdatasyncs the segment first and then appends the summary to `segments.idx` in the log's
//! directory. So a summary only ever describes a segment whose records are on disk; one that is
//! lost (a crash before the append, a torn append, a power cut: the index is never synced) only
//! means that segment is read at the next start. An entry whose segment is gone (retired since) is
//! skipped, and recovery names new segments past every name the index mentions, so a name with an
//! entry is never given to another life of a file (the simulator found a restart that reused the
//! name of a retired segment whose header a flipped byte had destroyed).
//!
//! What the index does not do: find damage. A segment recovered from its summary is not read
//! (only its file's length is checked), so a flipped bit in it is found when a queue's page-in
//! reads that record, which quarantines it (see [`crate::quarantine`]), not at the start.
//!
//! Entry: `length u32 | crc32c u32 | payload`, the CRC over the payload seeded with
//! [`INDEX_SEED`]; payload (big-endian) `first_position u64 | seed u32 | valid_bytes u64 |
//! header_term u64 | end_term u64 | position_end u64`, then P, X and M, each `count u32` and
//! `count` ranges `start u64 | end u64`.

use crate::file_system::{FileSystem, OpenMode};
use crate::range_set::RangeSet;
use crate::record::{
    RecordHeader, SegmentIdentity, HEADER_SEED, KIND_SEGMENT_HEADER, LENGTH_AND_CHECKSUM_BYTES, RECORD_FIXED_BYTES,
    SEGMENT_HEADER_RECORD_BYTES,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The index file in a queue log's directory.
pub const INDEX_FILE_NAME: &str = "segments.idx";
/// The most runs a segment's summary holds; past it (acks in a pattern with no runs), the
/// segment gets no summary and is read at recovery, as before the index: the bound keeps a
/// summary's memory under about 1 MiB per queue (16 B a run) whatever the acks do.
pub const SUMMARY_RUNS_MAX: usize = 1 << 16;
/// Stale entries (of retired segments) an index may hold beyond twice its live ones before the
/// janitor rewrites it.
pub const INDEX_STALE_ENTRIES_MIN: usize = 16;
/// The checksum seed of index entries (no segment's identity: an entry names its segment).
pub const INDEX_SEED: u32 = 0x1d3e_c0de;
/// The fixed part of an entry's payload.
const FIXED_PAYLOAD_BYTES: usize = 8 + 4 + 8 + 8 + 8 + 8;

/// Positions pushed mostly in increasing order, kept as runs: one compare and an increment for
/// a position next to the last one. Those out of order are kept aside and merged at the end.
#[derive(Debug, Default, Clone)]
pub(crate) struct Runs {
    runs: Vec<(u64, u64)>,
    unordered: Vec<u64>,
}

impl Runs {
    #[inline]
    fn push(&mut self, position: u64) {
        match self.runs.last_mut() {
            Some(last) if last.1 == position => last.1 += 1,
            Some(last) if position < last.1 => self.unordered.push(position),
            _ => self.runs.push((position, position + 1)),
        }
    }

    fn len(&self) -> usize {
        self.runs.len() + self.unordered.len()
    }

    /// Sorted, disjoint, merged ranges.
    fn into_ranges(self) -> Vec<(u64, u64)> {
        if self.unordered.is_empty() {
            return self.runs;
        }
        let mut set = RangeSet::new();
        for (start, end) in self.runs {
            set.insert_range(start, end);
        }
        for position in self.unordered {
            set.insert(position);
        }
        set.ranges().collect()
    }
}

/// A segment's summary as its records are appended (or scanned).
#[derive(Debug, Default, Clone)]
pub(crate) struct SummaryBuilder {
    published: Runs,
    settled: Runs,
    delivered: Runs,
    /// One past the highest publish position, persistent or not.
    position_end: u64,
    /// Past [`SUMMARY_RUNS_MAX`]: no summary for this segment.
    overflowed: bool,
}

impl SummaryBuilder {
    /// A publish record.
    #[inline]
    pub(crate) fn publish(&mut self, position: u64, persistent: bool) {
        self.position_end = self.position_end.max(position.saturating_add(1));
        if persistent && !self.overflowed {
            self.published.push(position);
            self.check_bound();
        }
    }

    /// A settled record.
    #[inline]
    pub(crate) fn settle(&mut self, position: u64) {
        if !self.overflowed {
            self.settled.push(position);
            self.check_bound();
        }
    }

    /// A delivered marker.
    #[inline]
    pub(crate) fn deliver(&mut self, position: u64) {
        if !self.overflowed {
            self.delivered.push(position);
            self.check_bound();
        }
    }

    #[inline]
    fn check_bound(&mut self) {
        if self.published.len() + self.settled.len() + self.delivered.len() > SUMMARY_RUNS_MAX {
            self.overflowed = true;
            self.published = Runs::default();
            self.settled = Runs::default();
            self.delivered = Runs::default();
        }
    }

    /// The summary of the segment these records were appended to, now sealed at `valid_bytes`;
    /// `None` when it outgrew its bound.
    pub(crate) fn finish(self, segment: SealedSegment) -> Option<SegmentSummary> {
        if self.overflowed {
            return None;
        }
        Some(SegmentSummary {
            segment,
            position_end: self.position_end,
            published: self.published.into_ranges(),
            settled: self.settled.into_ranges(),
            delivered: self.delivered.into_ranges(),
        })
    }
}

/// Which segment a summary describes, and how it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedSegment {
    /// Its first position (its name).
    pub first_position: u64,
    /// The checksum seed of its records (its identity: first position and nonce).
    pub seed: u32,
    /// Where its valid records end, the seal included.
    pub valid_bytes: u64,
    /// The term of its header.
    pub header_term: u64,
    /// The term of its last record.
    pub end_term: u64,
}

/// A sealed segment's effect on its queue's live and delivered positions (see the module).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSummary {
    /// The segment.
    pub segment: SealedSegment,
    /// One past the highest position it published (0: none).
    pub position_end: u64,
    /// Persistent publishes.
    pub published: Vec<(u64, u64)>,
    /// Settles.
    pub settled: Vec<(u64, u64)>,
    /// Delivered markers.
    pub delivered: Vec<(u64, u64)>,
}

impl SegmentSummary {
    /// Applies the segment to the sets as replaying its records in order would.
    pub fn apply(&self, live: &mut RangeSet, delivered: &mut RangeSet) {
        for &(start, end) in &self.published {
            live.insert_range(start, end);
        }
        for &(start, end) in &self.delivered {
            for (low, high) in live.ranges_within(start, end) {
                delivered.insert_range(low, high);
            }
        }
        for &(start, end) in &self.settled {
            live.remove_range(start, end);
            delivered.remove_range(start, end);
        }
    }

    /// Appends the entry (length, checksum, payload) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut payload =
            Vec::with_capacity(FIXED_PAYLOAD_BYTES + 12 + 16 * (self.published.len() + self.settled.len() + self.delivered.len()));
        let segment = &self.segment;
        payload.extend_from_slice(&segment.first_position.to_be_bytes());
        payload.extend_from_slice(&segment.seed.to_be_bytes());
        for value in [segment.valid_bytes, segment.header_term, segment.end_term, self.position_end] {
            payload.extend_from_slice(&value.to_be_bytes());
        }
        for ranges in [&self.published, &self.settled, &self.delivered] {
            payload.extend_from_slice(&(ranges.len() as u32).to_be_bytes());
            for &(start, end) in ranges {
                payload.extend_from_slice(&start.to_be_bytes());
                payload.extend_from_slice(&end.to_be_bytes());
            }
        }
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&crc32c::crc32c_append(INDEX_SEED, &payload).to_be_bytes());
        out.extend_from_slice(&payload);
    }

    /// Decodes one payload; `None` when it is malformed.
    fn decode(payload: &[u8]) -> Option<SegmentSummary> {
        let mut reader = Cursor { bytes: payload };
        let first_position = reader.u64()?;
        let seed = reader.u32()?;
        let (valid_bytes, header_term, end_term, position_end) = (reader.u64()?, reader.u64()?, reader.u64()?, reader.u64()?);
        let mut sets = [Vec::new(), Vec::new(), Vec::new()];
        for set in &mut sets {
            let count = reader.u32()? as usize;
            // Bounded by what the payload holds, so a bad count cannot allocate much.
            if count > reader.bytes.len() / 16 {
                return None;
            }
            for _ in 0..count {
                let (start, end) = (reader.u64()?, reader.u64()?);
                if start >= end || set.last().is_some_and(|&(_, last_end): &(u64, u64)| start <= last_end) {
                    return None;
                }
                set.push((start, end));
            }
        }
        if !reader.bytes.is_empty() {
            return None;
        }
        let [published, settled, delivered] = sets;
        let segment = SealedSegment { first_position, seed, valid_bytes, header_term, end_term };
        Some(SegmentSummary { segment, position_end, published, settled, delivered })
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.bytes.split_first_chunk::<N>()?;
        self.bytes = rest;
        Some(*head)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_be_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_be_bytes)
    }
}

/// The entries of an index file's bytes by segment (a later entry for the same segment wins),
/// and how many entries were read. Reading ends at the first entry that is cut short, fails its
/// checksum or does not parse: everything after a torn append is ignored.
pub fn decode_index(bytes: &[u8]) -> (HashMap<u64, SegmentSummary>, usize) {
    let mut entries = HashMap::new();
    let mut count = 0;
    let mut rest = bytes;
    while let Some((head, after)) = rest.split_first_chunk::<8>() {
        let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let checksum = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        let Some(payload) = after.get(..length) else { break };
        if length == 0 || crc32c::crc32c_append(INDEX_SEED, payload) != checksum {
            break;
        }
        let Some(summary) = SegmentSummary::decode(payload) else { break };
        entries.insert(summary.segment.first_position, summary);
        count += 1;
        rest = &after[length..];
    }
    (entries, count)
}

/// The seed of the segment whose header `path` starts with, if it starts with a valid one.
fn seed_on_disk(file_system: &dyn FileSystem, path: &Path) -> std::io::Result<Option<u32>> {
    let file = file_system.open(path, OpenMode::Read)?;
    let mut bytes = [0u8; SEGMENT_HEADER_RECORD_BYTES as usize];
    if file.read_exact_at(&mut bytes, 0).is_err() {
        return Ok(None);
    }
    let Some(header) = RecordHeader::decode(&bytes) else { return Ok(None) };
    let Some(covered) = bytes.get(LENGTH_AND_CHECKSUM_BYTES..LENGTH_AND_CHECKSUM_BYTES + header.length) else { return Ok(None) };
    if header.kind != KIND_SEGMENT_HEADER || !header.checksum_matches(HEADER_SEED, covered) {
        return Ok(None);
    }
    let nonce = crate::record::decode_segment_header(&covered[RECORD_FIXED_BYTES..]).map(|(_, nonce)| nonce);
    Ok(nonce.map(|nonce| SegmentIdentity { first_position: header.position, nonce }.seed()))
}

/// Appends the summaries of sealed segments to the index of `directory` (the janitor's job).
/// Each segment is fdatasynced first, so an entry never describes records the disk may not hold,
/// and its header is checked against the summary, so an entry never names another life of the
/// file. A segment gone meanwhile (retired, its queue deleted) is skipped. The caller holds the
/// log's spare pool open (not closed), so a deleted and redeclared queue's new directory never
/// receives an entry of the old one.
pub(crate) fn append(file_system: &dyn FileSystem, directory: &Path, entries: Vec<(PathBuf, SegmentSummary)>) {
    let mut bytes = Vec::new();
    for (segment, summary) in entries {
        let synced = file_system.open(&segment, OpenMode::Read).and_then(|file| file.sync_data());
        match synced.and_then(|()| seed_on_disk(file_system, &segment)) {
            Ok(Some(seed)) if seed == summary.segment.seed => summary.encode(&mut bytes),
            Ok(_) => tracing::debug!(file = %segment.display(), "a sealed segment's file holds another life now; not indexed"),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(file = %segment.display(), %error, "syncing a sealed segment for its index failed; it is read at the next start")
            }
        }
    }
    if bytes.is_empty() {
        return;
    }
    let path = directory.join(INDEX_FILE_NAME);
    let appended = file_system.open(&path, OpenMode::CreateReadWrite).and_then(|file| file.write_all_at(&bytes, file.len()?));
    match appended {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(file = %path.display(), %error, "appending to a queue's segment index failed; its segments are read at the next start")
        }
    }
}

/// Rewrites the index of `directory` with the entries whose segments still exist (the janitor's
/// job, under the same guard as [`append`]). Not synced: a rewrite a crash loses or tears costs
/// a read of the segments at the next start, nothing else.
pub(crate) fn compact(file_system: &dyn FileSystem, directory: &Path) {
    let path = directory.join(INDEX_FILE_NAME);
    let rewritten = (|| -> std::io::Result<()> {
        let file = file_system.open(&path, OpenMode::Read)?;
        let mut bytes = vec![0u8; usize::try_from(file.len()?).unwrap_or(0)];
        file.read_exact_at(&mut bytes, 0)?;
        let (entries, _) = decode_index(&bytes);
        let names: std::collections::HashSet<String> = file_system.list_directory(directory)?.into_iter().collect();
        let mut kept: Vec<&SegmentSummary> =
            entries.values().filter(|entry| names.contains(&format!("{:020}.seg", entry.segment.first_position))).collect();
        kept.sort_by_key(|entry| entry.segment.first_position);
        let mut out = Vec::new();
        for entry in kept {
            entry.encode(&mut out);
        }
        let temporary = path.with_extension("idx.tmp");
        let new = file_system.open(&temporary, OpenMode::CreateReadWrite)?;
        new.set_len(0)?;
        new.write_all_at(&out, 0)?;
        file_system.rename(&temporary, &path)
    })();
    match rewritten {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => tracing::warn!(file = %path.display(), %error, "rewriting a queue's segment index failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sealed(first_position: u64) -> SealedSegment {
        SealedSegment { first_position, seed: 7, valid_bytes: 4096, header_term: 1, end_term: 1 }
    }

    #[derive(Debug, Clone)]
    enum Record {
        Publish(bool),
        Deliver(u64),
        Settle(u64),
    }

    fn record() -> impl Strategy<Value = Record> {
        prop_oneof![any::<bool>().prop_map(Record::Publish), (0u64..64).prop_map(Record::Deliver), (0u64..64).prop_map(Record::Settle),]
    }

    proptest! {
        /// Segments of records a queue could write (each position published once, before any
        /// marker or settle of it) summarised and applied in order give the sets that replaying
        /// every record gives, as recovery's scan does.
        #[test]
        fn applying_summaries_equals_replaying_the_records(segments in proptest::collection::vec(proptest::collection::vec(record(), 0..40), 1..6)) {
            let (mut replayed_live, mut replayed_delivered) = (RangeSet::new(), RangeSet::new());
            let (mut live, mut delivered) = (RangeSet::new(), RangeSet::new());
            let mut next = 0u64;
            for (index, records) in segments.iter().enumerate() {
                let mut builder = SummaryBuilder::default();
                for record in records {
                    match *record {
                        Record::Publish(persistent) => {
                            builder.publish(next, persistent);
                            if persistent {
                                replayed_live.insert(next);
                            }
                            next += 1;
                        }
                        // Only positions published so far: a queue never names another.
                        Record::Deliver(pick) if next > 0 => {
                            let position = pick % next;
                            builder.deliver(position);
                            if replayed_live.contains(position) {
                                replayed_delivered.insert(position);
                            }
                        }
                        Record::Settle(pick) if next > 0 => {
                            let position = pick % next;
                            builder.settle(position);
                            replayed_live.remove(position);
                            replayed_delivered.remove(position);
                        }
                        _ => {}
                    }
                }
                let summary = builder.finish(sealed(index as u64)).expect("within the bound");
                let mut bytes = Vec::new();
                summary.encode(&mut bytes);
                let (decoded, count) = decode_index(&bytes);
                prop_assert_eq!(count, 1);
                prop_assert_eq!(decoded.get(&(index as u64)), Some(&summary));
                summary.apply(&mut live, &mut delivered);
                prop_assert_eq!(&live, &replayed_live);
                prop_assert_eq!(&delivered, &replayed_delivered);
            }
        }
    }

    #[test]
    fn a_torn_or_damaged_entry_ends_the_index_and_later_entries_of_a_segment_win() {
        let mut bytes = Vec::new();
        let mut first = SummaryBuilder::default();
        first.publish(0, true);
        first.publish(1, true);
        first.finish(sealed(0)).expect("summary").encode(&mut bytes);
        let mut again = SummaryBuilder::default();
        again.publish(0, true);
        again.finish(sealed(0)).expect("summary").encode(&mut bytes);
        let whole = bytes.len();
        let mut third = SummaryBuilder::default();
        third.settle(0);
        third.finish(sealed(2)).expect("summary").encode(&mut bytes);
        let (entries, count) = decode_index(&bytes);
        assert_eq!((entries.len(), count), (2, 3));
        assert_eq!(entries[&0].published, vec![(0, 1)], "the later entry of segment 0 wins");
        let (entries, count) = decode_index(&bytes[..bytes.len() - 1]);
        assert_eq!((entries.len(), count), (1, 2), "a torn last entry is ignored");
        let mut flipped = bytes.clone();
        flipped[whole + 12] ^= 1;
        assert_eq!(decode_index(&flipped).1, 2, "an entry failing its checksum ends the index");
    }

    #[test]
    fn a_summary_past_its_bound_is_dropped() {
        let mut builder = SummaryBuilder::default();
        for position in 0..=SUMMARY_RUNS_MAX as u64 {
            builder.settle(position * 2);
        }
        assert!(builder.finish(sealed(0)).is_none());
        let mut runs = SummaryBuilder::default();
        for position in 0..1_000_000 {
            runs.publish(position, true);
            runs.settle(position);
        }
        let summary = runs.finish(sealed(0)).expect("runs stay small");
        assert_eq!((summary.published.len(), summary.settled.len(), summary.position_end), (1, 1, 1_000_000));
    }
}
