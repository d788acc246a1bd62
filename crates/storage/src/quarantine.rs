//! Quarantine: damage with intact records after it, stepped over instead of ending a read.
//!
//! Recovery, reading a segment, steps over damage to the next record that checks
//! ([`find_next_record`]), copies the bad bytes aside, reports them, and writes a quarantined
//! record's header over them ([`crate::record::KIND_QUARANTINED`]) so later reads step over them
//! as over any record that is not a publish. A page-in does the same in segments recovery did not
//! read, without writing:
//!
//! A start trusts a sealed segment's summary in the index without reading the segment (so a
//! 10 GB backlog starts in the time it takes to read its newest segment and the index, issue 17
//! item 6), so a flipped bit in such a segment is found when a queue's page-in reads the record,
//! which checks every record's checksum. A quarantining cursor ([`crate::queue_log::TailCursor::quarantining`])
//! then steps over the bad bytes instead of failing the read, to the next record that checks
//! (where the bad record's length leads, else the first offset where one does), else over the
//! rest of the segment. The positions
//! the bad range held are those between the last publish read before it and the first read after
//! it (a segment's publishes are in position order), of which the ones the queue still counted
//! (recovery's live positions) are lost. The queue drops them from its counts and settles them in
//! its log, so the next start agrees; the bad bytes are copied aside
//! (`{segment}.{offset}.quarantined` in the queue's directory) and one log line names the file,
//! the offsets and the positions. The rest of the queue is served.

use crate::file_system::{FileSystem, OpenMode, StorageFile};
use crate::range_set::RangeSet;
use crate::record::{self, RecordHeader, LENGTH_AND_CHECKSUM_BYTES, RECORD_HEADER_BYTES};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The suffix of a bad range's copy; recovery leaves such files alone.
pub const QUARANTINED_SUFFIX: &str = "quarantined";
/// The most bytes of one bad range copied aside (a segment's default size): the copy is
/// evidence, not a way to get the records back.
pub const QUARANTINE_COPY_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// A bad range a quarantining cursor stepped over, and the positions lost with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The segment file.
    pub path: PathBuf,
    /// The segment's first position (its name).
    pub segment: u64,
    /// The bad bytes: from the first record that failed to where reading resumed.
    pub offsets: Range<u64>,
    /// Why the first record failed.
    pub reason: String,
    /// The positions lost: for a recovered backlog exactly its live positions in the gap;
    /// past it (paged since the start) every position in the gap, of which the queue counts at
    /// most its paged messages.
    pub positions: RangeSet,
    /// Whether `positions` are exactly live ones (recovery's live set), so they may be settled.
    pub exact: bool,
}

impl Quarantined {
    /// How many positions were lost.
    pub fn count(&self) -> u64 {
        self.positions.count_in(0, u64::MAX)
    }

    /// Copies the bad bytes aside (at most [`QUARANTINE_COPY_BYTES_MAX`]) and logs one line with
    /// the file, the offsets and the positions. Returns the copy's path, if the copy was made.
    pub fn set_aside_and_report(&self, file_system: &dyn FileSystem, queue: &str) -> Option<PathBuf> {
        let copy = self.path.with_extension(format!("seg.{}.{QUARANTINED_SUFFIX}", self.offsets.start));
        let copied = copy_range(file_system, &self.path, &copy, self.offsets.clone());
        let (first_lost, last_lost) = match (self.positions.ranges().next(), self.positions.ranges().last()) {
            (Some((first, _)), Some((_, end))) => (Some(first), Some(end - 1)),
            _ => (None, None),
        };
        let positions: Vec<String> = self.positions.ranges().take(8).map(|(start, end)| format!("{start}..{end}")).collect();
        let set_aside = match &copied {
            Ok(()) => copy.display().to_string(),
            Err(error) => format!("not copied: {error}"),
        };
        tracing::error!(
            queue, file = %self.path.display(), offset = self.offsets.start, resumed_at = self.offsets.end, reason = %self.reason,
            lost = self.count(), first_lost, last_lost, positions = %positions.join(","), set_aside = %set_aside,
            "damaged records quarantined (set aside and stepped over): the intact records around them are served"
        );
        copied.ok().map(|()| copy)
    }
}

fn copy_range(file_system: &dyn FileSystem, from: &Path, to: &Path, offsets: Range<u64>) -> std::io::Result<()> {
    let bytes = offsets.end.saturating_sub(offsets.start).min(QUARANTINE_COPY_BYTES_MAX);
    let mut buffer = vec![0u8; usize::try_from(bytes).unwrap_or(0)];
    let source = file_system.open(from, OpenMode::Read)?;
    // The range may run past a truncated file's end: copy what is there.
    let available = source.len()?.saturating_sub(offsets.start).min(bytes);
    buffer.truncate(usize::try_from(available).unwrap_or(0));
    source.read_exact_at(&mut buffer, offsets.start)?;
    let target = file_system.open(to, OpenMode::CreateReadWrite)?;
    target.set_len(0)?;
    target.write_all_at(&buffer, 0)
}

/// Where reading resumes after a record at `offset` failed: right after it when its `header`'s
/// length leads to the segment's valid end or to a record that checks with `seed`, else at the
/// next intact record [`find_next_record`] finds before `valid_bytes` (a damaged length loses one
/// record, not the rest of the segment), else at `valid_bytes`. `positions` are those the
/// segment's records may carry.
pub(crate) fn resume_after(
    file: &dyn StorageFile,
    seed: u32,
    offset: u64,
    header: Option<&RecordHeader>,
    valid_bytes: u64,
    positions: Range<u64>,
) -> u64 {
    if let Some(next) = header.filter(|header| header.payload_bytes().is_some()).map(|header| offset.saturating_add(header.record_bytes()))
    {
        if next == valid_bytes || record_checks_at(file, seed, next, valid_bytes) {
            return next;
        }
    }
    let plausible = |header: &RecordHeader| record::could_follow_in_segment(header, &positions);
    find_next_record(file, seed, offset.saturating_add(1), valid_bytes, plausible).unwrap_or(valid_bytes)
}

/// Whether a whole record that checks with `seed` starts at `offset` and ends by `end`.
fn record_checks_at(file: &dyn StorageFile, seed: u32, offset: u64, end: u64) -> bool {
    let mut head = [0u8; RECORD_HEADER_BYTES];
    if offset.saturating_add(RECORD_HEADER_BYTES as u64) > end || file.read_exact_at(&mut head, offset).is_err() {
        return false;
    }
    let Some(header) = RecordHeader::decode(&head) else { return false };
    if header.payload_bytes().is_none() || offset.saturating_add(header.record_bytes()) > end {
        return false;
    }
    let mut covered = vec![0u8; header.length];
    file.read_exact_at(&mut covered, offset + LENGTH_AND_CHECKSUM_BYTES as u64).is_ok() && header.checksum_matches(seed, &covered)
}

/// Bytes read at a time while looking for the next intact record after damage.
const RESYNC_CHUNK_BYTES: usize = 256 * 1024;

/// The offset of the first intact record at or after `from` that ends by `end` (or the file's
/// end, if shorter): a record whose header `plausible` accepts (its kind and position could be
/// this segment's) and whose checksum holds under the segment's `seed`, which no record of
/// another life or file carries. Every offset is tried, so a damaged length costs one read of
/// the rest of the segment instead of its records; a checksum is computed only for headers
/// `plausible` accepts. `None` when no record checks or the file cannot be read.
pub(crate) fn find_next_record(
    file: &dyn StorageFile,
    seed: u32,
    from: u64,
    end: u64,
    plausible: impl Fn(&RecordHeader) -> bool,
) -> Option<u64> {
    let end = end.min(file.len().ok()?);
    let mut chunk_start = from;
    let mut chunk = Vec::new();
    while chunk_start.saturating_add(RECORD_HEADER_BYTES as u64) <= end {
        let chunk_bytes = usize::try_from(end - chunk_start).unwrap_or(usize::MAX).min(RESYNC_CHUNK_BYTES);
        chunk.resize(chunk_bytes, 0);
        file.read_exact_at(&mut chunk, chunk_start).ok()?;
        for at in 0..=chunk_bytes - RECORD_HEADER_BYTES {
            let Some(header) = RecordHeader::decode(&chunk[at..]) else { break };
            let offset = chunk_start + at as u64;
            if header.payload_bytes().is_none() || offset.saturating_add(header.record_bytes()) > end || !plausible(&header) {
                continue;
            }
            let covered_at = at + LENGTH_AND_CHECKSUM_BYTES;
            let checks = match chunk.get(covered_at..covered_at + header.length) {
                Some(covered) => header.checksum_matches(seed, covered),
                None => record_checks_at(file, seed, offset, end),
            };
            if checks {
                return Some(offset);
            }
        }
        // The next chunk overlaps this one by a header's bytes less one, so a header across
        // the boundary is tried too.
        chunk_start += (chunk_bytes - RECORD_HEADER_BYTES + 1) as u64;
    }
    None
}

/// A quarantining cursor's state: the bad ranges found, the one whose lost positions are not
/// known yet (they end at the next publish read), and where the last publish read was.
#[derive(Debug, Clone, Default)]
pub(crate) struct QuarantineWatch {
    found: Vec<Quarantined>,
    open: Option<Quarantined>,
    /// The segment of the last publish read, and the position after it.
    after_last_publish: Option<(u64, u64)>,
}

impl QuarantineWatch {
    /// A valid publish record at `position` in `segment`: the open bad range's positions end
    /// before it.
    #[inline]
    pub(crate) fn saw_publish(&mut self, segment: u64, position: u64) {
        self.after_last_publish = Some((segment, position.saturating_add(1)));
        if self.open.is_some() {
            self.close(position);
        }
    }

    /// The cursor left the open bad range's segment for one starting at `next_segment`.
    pub(crate) fn left_segment(&mut self, next_segment: u64) {
        if self.open.is_some() {
            self.close(next_segment);
        }
    }

    fn close(&mut self, end_position: u64) {
        if let Some(mut bad) = self.open.take() {
            bad.positions.remove_range(end_position, u64::MAX);
            self.found.push(bad);
        }
    }

    /// Damage at `offsets` of `segment` (positions from `segment` up to `segment_end`): its lost
    /// positions start after the last publish read in that segment. `candidates` are the
    /// positions the cursor would yield from there to `segment_end` (recovery's live ones when
    /// `exact`). A second bad range before the first is closed joins it.
    pub(crate) fn open(
        &mut self,
        path: &Path,
        segment: u64,
        offsets: Range<u64>,
        reason: String,
        candidates: impl FnOnce(u64) -> (RangeSet, bool),
    ) {
        if let Some(open) = self.open.as_mut().filter(|open| open.segment == segment) {
            open.offsets.end = open.offsets.end.max(offsets.end);
            return;
        }
        let from = match self.after_last_publish {
            Some((last_segment, after)) if last_segment == segment => after,
            _ => segment,
        };
        let (positions, exact) = candidates(from);
        self.open = Some(Quarantined { path: path.to_path_buf(), segment, offsets, reason, positions, exact });
    }

    /// The bad ranges whose positions are known, oldest first.
    pub(crate) fn take_found(&mut self) -> Vec<Quarantined> {
        std::mem::take(&mut self.found)
    }
}
