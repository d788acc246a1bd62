//! Recovery of a stream at start: what every confirmed chunk needs to be readable again at the
//! same offset, and nothing that was never written.
//!
//! - A sealed (older) segment is taken from its index when the index is consistent: entries that
//!   pass their checksums, chunk ids and positions following on from each other, the last one
//!   ending where the segment file ends. Its data is not read. Otherwise it is scanned.
//! - The newest segment is always scanned, chunk by chunk from its start: header, chunk id
//!   following on from the previous chunk, the CRC of the data, the framing of its entries and
//!   the trailer's checksum. The first chunk that fails ends it: the segment and its index are
//!   cut there (a torn tail after a crash: those chunks were never confirmed, since a confirm
//!   waits for the fdatasync of both files) and the cut is reported with the file and offset.
//!   Its tracking (the snapshot it starts with, then deltas and trailers) is rebuilt on the way.
//! - An empty newest segment (created, then the power went before its first chunk was synced)
//!   is removed, and the one before it is the newest.
//! - Index entries that differ from the scan are rewritten, the files cut and synced, so the
//!   damage is reported once.

use super::chunk::{self, ChunkDefect, ChunkHeader, ChunkType, Entries, Entry, CHUNK_HEADER_BYTES};
use super::index::{self, IndexEntry, FILE_HEADER_BYTES, INDEX_ENTRY_BYTES, INDEX_HEADER, SEGMENT_HEADER};
use super::log::{ChunkPoint, CommitPoint, SegmentState};
use super::tracking::{self, Tracking, TrackingSource};
use super::StreamError;
use crate::file_system::{FileSystem, OpenMode, StorageFile};
use crate::StorageError;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

/// A segment whose valid chunks ended before its file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    /// The segment file.
    pub path: PathBuf,
    /// Where its valid chunks end (the file was cut there).
    pub position: u64,
    /// What was found there.
    pub reason: String,
}

/// What recovery found in a stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamRecovery {
    /// The first offset held.
    pub first_offset: u64,
    /// The offset the next record takes.
    pub next_offset: u64,
    /// Segments kept.
    pub segments: usize,
    /// Chunks read and checked (the newest segment's, and those of segments whose index did not hold).
    pub chunks_scanned: u64,
    /// Segments cut at their first invalid chunk.
    pub truncated: Vec<Truncation>,
    /// Offsets missing between consecutive segments (a damaged older segment cut short).
    pub gaps: Vec<std::ops::Range<u64>>,
}

pub(crate) struct Recovered {
    pub segments: VecDeque<SegmentState>,
    pub next_offset: u64,
    pub last_timestamp_ms: i64,
    /// The epoch of the newest chunk (0 in an empty stream).
    pub last_epoch: u64,
    pub tracking: Tracking,
    pub committed: CommitPoint,
    pub report: StreamRecovery,
}

/// What a segment's recovery gives: its state and its last user chunk.
struct RecoveredSegment {
    state: SegmentState,
    last_user_chunk: Option<ChunkPoint>,
}

/// Recovers the stream in `directory`.
pub(crate) fn recover(file_system: &dyn FileSystem, directory: &Path) -> Result<Recovered, StreamError> {
    let mut names = list(file_system, directory)?;
    let mut report = StreamRecovery::default();
    let mut tracking = Tracking::default();
    // The newest non-empty segment, scanned with its tracking; empty newest segments go.
    let mut newest: Option<RecoveredSegment> = None;
    while let Some((&first_offset, _)) = names.iter().next_back() {
        names.remove(&first_offset);
        let recovered = recover_segment(file_system, directory, first_offset, true, Some(&mut tracking), &mut report)?;
        if recovered.state.chunks > 0 || names.is_empty() {
            newest = Some(recovered);
            break;
        }
        tracking = Tracking::default();
        remove_segment(file_system, directory, first_offset)?;
    }
    let mut segments = VecDeque::new();
    let mut last_user_chunk = newest.as_ref().and_then(|segment| segment.last_user_chunk);
    for &first_offset in names.keys().rev() {
        let recovered = recover_segment(file_system, directory, first_offset, false, None, &mut report)?;
        last_user_chunk = last_user_chunk.or(recovered.last_user_chunk);
        segments.push_front(recovered.state);
    }
    segments.extend(newest.map(|segment| segment.state));
    check_order(&segments, directory, &mut report)?;
    let Some(active) = segments.back() else {
        return Ok(Recovered {
            segments,
            next_offset: 0,
            last_timestamp_ms: i64::MIN,
            last_epoch: 0,
            tracking,
            committed: CommitPoint {
                next_offset: 0,
                segment: 0,
                end_position: FILE_HEADER_BYTES,
                index_end: FILE_HEADER_BYTES,
                last_user_chunk: None,
            },
            report,
        });
    };
    let committed = CommitPoint {
        next_offset: active.next_offset,
        segment: active.first_offset,
        end_position: active.bytes,
        index_end: active.index_bytes,
        last_user_chunk,
    };
    report.first_offset = segments.front().map_or(0, |segment| segment.first_offset);
    report.next_offset = active.next_offset;
    report.segments = segments.len();
    let last_timestamp_ms = segments.iter().map(|segment| segment.last_timestamp_ms).max().unwrap_or(i64::MIN);
    let last_epoch = segments.iter().rev().find(|segment| segment.chunks > 0).map_or(0, |segment| segment.last_epoch);
    Ok(Recovered { next_offset: active.next_offset, last_timestamp_ms, last_epoch, tracking, committed, segments, report })
}

/// The segments of a directory by first offset (whether each has its index); indexes without a
/// segment (a retention delete a crash interrupted) are removed.
fn list(file_system: &dyn FileSystem, directory: &Path) -> Result<BTreeMap<u64, ()>, StreamError> {
    let listed = file_system.list_directory(directory).map_err(|error| StorageError::io(directory, error))?;
    let mut segments = BTreeMap::new();
    let mut indexes = Vec::new();
    for name in listed {
        if let Some(first_offset) = name.strip_suffix(index::SEGMENT_SUFFIX).and_then(|stem| stem.parse::<u64>().ok()) {
            segments.insert(first_offset, ());
        } else if let Some(first_offset) = name.strip_suffix(index::INDEX_SUFFIX).and_then(|stem| stem.parse::<u64>().ok()) {
            indexes.push(first_offset);
        } else {
            tracing::warn!(file = %directory.join(&name).display(), "ignoring a file that is not a stream segment or index");
        }
    }
    for first_offset in indexes {
        if !segments.contains_key(&first_offset) {
            let path = directory.join(index::index_file_name(first_offset));
            file_system.remove_file(&path).map_err(|error| StorageError::io(&path, error))?;
        }
    }
    Ok(segments)
}

fn remove_segment(file_system: &dyn FileSystem, directory: &Path, first_offset: u64) -> Result<(), StreamError> {
    for name in [index::segment_file_name(first_offset), index::index_file_name(first_offset)] {
        let path = directory.join(name);
        match file_system.remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(StorageError::io(&path, error).into()),
        }
    }
    file_system.sync_directory(directory).map_err(|error| StorageError::io(directory, error))?;
    Ok(())
}

/// Consecutive segments must not overlap; a gap (a damaged older segment cut short) is reported.
fn check_order(segments: &VecDeque<SegmentState>, directory: &Path, report: &mut StreamRecovery) -> Result<(), StreamError> {
    for pair in segments.iter().collect::<Vec<_>>().windows(2) {
        let (older, newer) = (pair[0], pair[1]);
        if newer.first_offset < older.next_offset {
            return Err(StorageError::Corrupt {
                path: directory.join(index::segment_file_name(newer.first_offset)).display().to_string(),
                detail: format!("starts at offset {} inside the previous segment, which ends at {}", newer.first_offset, older.next_offset),
            }
            .into());
        }
        if newer.first_offset > older.next_offset {
            tracing::warn!(directory = %directory.display(), from = older.next_offset, to = newer.first_offset, "offsets missing between two segments");
            report.gaps.push(older.next_offset..newer.first_offset);
        }
    }
    Ok(())
}

/// Recovers one segment: from its index when `scan` is false and the index holds, else by
/// scanning it (and repairing its index and length).
fn recover_segment(
    file_system: &dyn FileSystem,
    directory: &Path,
    first_offset: u64,
    scan: bool,
    tracking: Option<&mut Tracking>,
    report: &mut StreamRecovery,
) -> Result<RecoveredSegment, StreamError> {
    let segment_path = directory.join(index::segment_file_name(first_offset));
    let index_path = directory.join(index::index_file_name(first_offset));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| StreamError::from(StorageError::io(&path, error))
    };
    let segment = file_system.open(&segment_path, OpenMode::ReadWrite).map_err(io(&segment_path))?;
    let segment_bytes = segment.len().map_err(io(&segment_path))?;
    let indexed = read_index(file_system, &index_path)?;
    if !scan && index_holds(&indexed, first_offset, segment_bytes) {
        return Ok(summarize(first_offset, indexed.as_deref().unwrap_or(&[])));
    }
    let scanned = scan_segment(&*segment, first_offset, indexed.as_deref().unwrap_or(&[]), tracking).map_err(io(&segment_path))?;
    report.chunks_scanned += scanned.entries.len() as u64;
    if scanned.header_missing || scanned.valid_end < segment_bytes {
        if let Some((position, defect)) = &scanned.defect {
            tracing::warn!(file = %segment_path.display(), position, %defect, "cutting a stream segment at its first invalid chunk");
            report.truncated.push(Truncation { path: segment_path.clone(), position: *position, reason: defect.to_string() });
        }
        segment.set_len(scanned.valid_end).map_err(io(&segment_path))?;
        if scanned.header_missing {
            segment.write_all_at(&SEGMENT_HEADER, 0).map_err(io(&segment_path))?;
        }
        segment.sync_data().map_err(io(&segment_path))?;
    }
    if repair_index(file_system, &index_path, &indexed, &scanned.entries)? {
        // A new index file: its name must survive a power cut like the segment's.
        file_system.sync_directory(directory).map_err(io(directory))?;
    }
    Ok(summarize(first_offset, &scanned.entries))
}

/// The valid entries of an index file (none when it is missing or its header is wrong).
pub(crate) fn read_index(file_system: &dyn FileSystem, path: &Path) -> Result<Option<Vec<IndexEntry>>, StreamError> {
    let file = match file_system.open(path, OpenMode::Read) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StorageError::io(path, error).into()),
    };
    let bytes = file.len().map_err(|error| StorageError::io(path, error))?;
    let mut contents = vec![0u8; usize::try_from(bytes).unwrap_or(usize::MAX).min(64 << 20)];
    file.read_exact_at(&mut contents, 0).map_err(|error| StorageError::io(path, error))?;
    if contents.len() < FILE_HEADER_BYTES as usize || contents[..FILE_HEADER_BYTES as usize] != INDEX_HEADER {
        return Ok(None);
    }
    Ok(Some(index::parse_entries(&contents[FILE_HEADER_BYTES as usize..]).0))
}

/// Whether a sealed segment's index describes it whole: entries following on from each other
/// from the segment's first offset and first byte to the end of its file.
fn index_holds(indexed: &Option<Vec<IndexEntry>>, first_offset: u64, segment_bytes: u64) -> bool {
    let Some(entries) = indexed else { return false };
    let (mut offset, mut position) = (first_offset, FILE_HEADER_BYTES);
    for entry in entries {
        if entry.chunk_id != offset || u64::from(entry.position) != position {
            return false;
        }
        offset = entry.next_offset();
        position = entry.end_position();
    }
    !entries.is_empty() && position == segment_bytes
}

fn summarize(first_offset: u64, entries: &[IndexEntry]) -> RecoveredSegment {
    let mut state = SegmentState::empty(first_offset);
    let mut last_user_chunk = None;
    for entry in entries {
        state.bytes = entry.end_position();
        state.index_bytes += INDEX_ENTRY_BYTES as u64;
        state.chunks += 1;
        state.next_offset = entry.next_offset();
        state.first_timestamp_ms.get_or_insert(entry.timestamp_ms);
        state.last_timestamp_ms = entry.timestamp_ms;
        state.last_epoch = entry.epoch;
        if entry.chunk_type == ChunkType::User {
            last_user_chunk = Some(ChunkPoint { chunk_id: entry.chunk_id, segment: first_offset, position: u64::from(entry.position) });
        }
    }
    RecoveredSegment { state, last_user_chunk }
}

/// Rewrites the index entries that differ from `scanned` and cuts the index after them; returns
/// whether the file was created.
fn repair_index(
    file_system: &dyn FileSystem,
    path: &Path,
    indexed: &Option<Vec<IndexEntry>>,
    scanned: &[IndexEntry],
) -> Result<bool, StreamError> {
    let io = |error| StreamError::from(StorageError::io(path, error));
    let existing: &[IndexEntry] = indexed.as_deref().unwrap_or(&[]);
    let same = existing.iter().zip(scanned).take_while(|(a, b)| a == b).count();
    let file_exists = file_system.exists(path);
    let file = file_system.open(path, OpenMode::CreateReadWrite).map_err(io)?;
    let length = file.len().map_err(io)?;
    let end = FILE_HEADER_BYTES + (scanned.len() * INDEX_ENTRY_BYTES) as u64;
    if indexed.is_some() && same == scanned.len() && length == end {
        return Ok(false);
    }
    let mut bytes = Vec::with_capacity((scanned.len() - same) * INDEX_ENTRY_BYTES);
    for entry in &scanned[same..] {
        bytes.extend_from_slice(&entry.encode());
    }
    if indexed.is_none() {
        file.write_all_at(&INDEX_HEADER, 0).map_err(io)?;
    }
    file.write_all_at(&bytes, FILE_HEADER_BYTES + (same * INDEX_ENTRY_BYTES) as u64).map_err(io)?;
    file.set_len(end).map_err(io)?;
    file.sync_data().map_err(io)?;
    Ok(!file_exists)
}

/// What a scan of a segment found.
#[derive(Debug, Default)]
pub struct SegmentScan {
    /// The valid chunks, as index entries.
    pub entries: Vec<IndexEntry>,
    /// Where they end.
    pub valid_end: u64,
    /// The segment file does not start with its header (it is rewritten).
    pub header_missing: bool,
    /// What ended the scan before the file's end, and where.
    pub defect: Option<(u64, ChunkDefect)>,
}

/// Scans a segment from its start: every chunk checked (header, chunk id, data CRC, entries,
/// trailer, and the header against the index entry written with it, where `indexed` has one),
/// the tracking it carries applied to `tracking`. Reads one chunk at a time.
pub fn scan_segment(
    file: &dyn StorageFile,
    first_offset: u64,
    indexed: &[IndexEntry],
    mut tracking: Option<&mut Tracking>,
) -> std::io::Result<SegmentScan> {
    let file_bytes = file.len()?;
    let mut scan = SegmentScan { valid_end: FILE_HEADER_BYTES, ..SegmentScan::default() };
    let mut file_header = [0u8; FILE_HEADER_BYTES as usize];
    if file_bytes < FILE_HEADER_BYTES || {
        file.read_exact_at(&mut file_header, 0)?;
        file_header != SEGMENT_HEADER
    } {
        scan.header_missing = true;
        if file_bytes > 0 {
            scan.defect = Some((0, ChunkDefect::BadMagic(file_header[0])));
        }
        return Ok(scan);
    }
    let (mut position, mut expected) = (FILE_HEADER_BYTES, first_offset);
    let mut body = Vec::new();
    while position < file_bytes {
        match read_chunk(file, position, file_bytes, expected, &mut body) {
            Ok(header) => {
                let entry = IndexEntry::for_chunk(&header, position);
                if indexed.get(scan.entries.len()).is_some_and(|written| written.position == entry.position && *written != entry) {
                    scan.defect = Some((position, ChunkDefect::IndexMismatch));
                    break;
                }
                if let Some(tracking) = tracking.as_deref_mut() {
                    if let Err(defect) = apply_tracking(tracking, &header, &body) {
                        scan.defect = Some((position, defect));
                        break;
                    }
                }
                scan.entries.push(entry);
                position += header.chunk_bytes();
                expected = header.next_offset();
                scan.valid_end = position;
            }
            Err(ScanError::Io(error)) => return Err(error),
            Err(ScanError::Defect(defect)) => {
                scan.defect = Some((position, defect));
                break;
            }
        }
    }
    Ok(scan)
}

enum ScanError {
    Io(std::io::Error),
    Defect(ChunkDefect),
}

/// Reads and checks the chunk at `position`; leaves its filter, data and trailer in `body`.
fn read_chunk(file: &dyn StorageFile, position: u64, file_bytes: u64, expected: u64, body: &mut Vec<u8>) -> Result<ChunkHeader, ScanError> {
    if position + CHUNK_HEADER_BYTES as u64 > file_bytes {
        return Err(ScanError::Defect(ChunkDefect::Truncated));
    }
    let mut header_bytes = [0u8; CHUNK_HEADER_BYTES];
    file.read_exact_at(&mut header_bytes, position).map_err(ScanError::Io)?;
    let header = ChunkHeader::parse(&header_bytes).map_err(ScanError::Defect)?;
    if header.first_offset != expected {
        return Err(ScanError::Defect(ChunkDefect::WrongOffset { found: header.first_offset, expected }));
    }
    let end = position + header.chunk_bytes();
    if end > file_bytes || end > u64::from(u32::MAX) {
        return Err(ScanError::Defect(ChunkDefect::Truncated));
    }
    body.resize((header.chunk_bytes() - CHUNK_HEADER_BYTES as u64) as usize, 0);
    file.read_exact_at(body, position + CHUNK_HEADER_BYTES as u64).map_err(ScanError::Io)?;
    let filter = usize::from(header.filter_bytes);
    let data = &body[filter..filter + header.data_bytes as usize];
    chunk::check_data(&header, data).map_err(ScanError::Defect)?;
    if header.trailer_bytes > 0 {
        tracking::open_trailer(&body[filter + header.data_bytes as usize..]).map_err(ScanError::Defect)?;
    }
    Ok(header)
}

/// Applies the tracking a checked chunk carries (its body: filter, data, trailer).
pub(crate) fn apply_tracking(tracking: &mut Tracking, header: &ChunkHeader, body: &[u8]) -> Result<(), ChunkDefect> {
    let filter = usize::from(header.filter_bytes);
    let data = &body[filter..filter + header.data_bytes as usize];
    match header.chunk_type {
        ChunkType::User if header.trailer_bytes > 0 => {
            let blocks = tracking::open_trailer(&body[filter + header.data_bytes as usize..])?;
            tracking.apply(blocks, TrackingSource::Delta(header.first_offset))
        }
        ChunkType::User => Ok(()),
        ChunkType::TrackingDelta | ChunkType::TrackingSnapshot => {
            let source = match header.chunk_type {
                ChunkType::TrackingSnapshot => TrackingSource::Snapshot,
                _ => TrackingSource::Delta(header.first_offset),
            };
            match Entries::new(data).next() {
                Some(Ok(Entry::Simple(blocks))) => tracking.apply(blocks, source),
                _ => Err(ChunkDefect::BadEntries("a tracking chunk without its entry")),
            }
        }
    }
}
