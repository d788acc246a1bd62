//! Quarantine: damage a page-in finds in a segment that recovery did not read.
//!
//! A start trusts a sealed segment's summary in the index without reading the segment (so a
//! 10 GB backlog starts in the time it takes to read its newest segment and the index, issue 17
//! item 6), so a flipped bit in such a segment is found when a queue's page-in reads the record,
//! which checks every record's checksum. A quarantining cursor ([`crate::queue_log::TailCursor::quarantining`])
//! then steps over the bad bytes instead of failing the read: over the one bad record when its
//! length still leads to a record that checks, else over the rest of the segment. The positions
//! the bad range held are those between the last publish read before it and the first read after
//! it (a segment's publishes are in position order), of which the ones the queue still counted
//! (recovery's live positions) are lost. The queue drops them from its counts and settles them in
//! its log, so the next start agrees; the bad bytes are copied aside
//! (`{segment}.{offset}.quarantined` in the queue's directory) and one log line names the file,
//! the offsets and the positions. The rest of the queue is served.

use crate::file_system::{FileSystem, OpenMode, StorageFile};
use crate::range_set::RangeSet;
use crate::record::{RecordHeader, LENGTH_AND_CHECKSUM_BYTES, RECORD_HEADER_BYTES};
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
            "damaged records in a segment recovery did not read: quarantined, the rest of the queue is served"
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
/// length is plausible and leads to the segment's valid end or to a record that checks with
/// `seed`, else at `valid_bytes` (the rest of the segment is set aside).
pub(crate) fn resume_after(file: Option<&dyn StorageFile>, seed: u32, offset: u64, header: Option<&RecordHeader>, valid_bytes: u64) -> u64 {
    let (Some(file), Some(header)) = (file, header) else { return valid_bytes };
    if header.payload_bytes().is_none() {
        return valid_bytes;
    }
    let next = offset.saturating_add(header.record_bytes());
    if next >= valid_bytes {
        return valid_bytes;
    }
    let mut head = [0u8; RECORD_HEADER_BYTES];
    if next + RECORD_HEADER_BYTES as u64 > valid_bytes || file.read_exact_at(&mut head, next).is_err() {
        return valid_bytes;
    }
    let Some(next_header) = RecordHeader::decode(&head) else { return valid_bytes };
    if next_header.payload_bytes().is_none() || next + next_header.record_bytes() > valid_bytes {
        return valid_bytes;
    }
    let mut covered = vec![0u8; next_header.length];
    if file.read_exact_at(&mut covered, next + LENGTH_AND_CHECKSUM_BYTES as u64).is_err() {
        return valid_bytes;
    }
    match next_header.checksum_matches(seed, &covered) {
        true => next,
        false => valid_bytes,
    }
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
