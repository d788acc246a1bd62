//! Readers: a position in a stream, from an offset specification, walking committed chunks.
//!
//! A reader never decodes a record. [`StreamReader::next_chunk`] gives the next chunk's header
//! and where its bytes are (file and position), so a RabbitMQ Stream protocol connection sends
//! the header and `sendfile`s the data from the page cache; [`StreamReader::read_chunk`] reads
//! the data entries into the caller's buffer (one read per chunk, CRC checked) for an AMQP 0-9-1
//! consumer, which splits them into records. Readers see committed chunks only (fdatasynced
//! with `--sync always`), so no reader ever sees an offset that a crash could take back.
//!
//! A reader holds its segment file through the node's file cache (a handle, reopened by path
//! when the cache closed it). A segment deleted by retention under a reader sends it to the
//! stream's first segment, as osiris does.

use super::chunk::{self, ChunkDefect, ChunkHeader, ChunkType, CHUNK_HEADER_BYTES};
use super::index::{self, IndexEntry, FILE_HEADER_BYTES, INDEX_ENTRY_BYTES};
use super::log::Stream;
use super::StreamError;
use crate::file_cache::FileHandle;
use crate::file_system::{OpenMode, StorageFile};
use crate::StorageError;
use std::sync::Arc;

/// Where a reader starts, as RabbitMQ's `x-stream-offset` and the stream protocol's subscribe
/// name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The first record still held.
    First,
    /// The start of the last chunk of messages.
    Last,
    /// Only what is appended from now on.
    Next,
    /// This offset (the chunk holding it; earlier records of that chunk are the caller's to skip).
    /// Before the first offset: the first; past the end: next (with [`StreamReader::start_offset`]
    /// still this offset).
    Offset(u64),
    /// The first chunk written at or after this time (ms since the Unix epoch).
    Timestamp(i64),
}

/// Which chunks a reader yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkSelector {
    /// Chunks of messages only (what consumers read).
    UserData,
    /// Every chunk, tracking ones included.
    All,
}

/// How far a reader reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadBound {
    /// What is committed: readable by consumers.
    Committed,
    /// What this node has fdatasynced (for a replicated stream, committed by the cluster or
    /// not): what a leader sends its followers.
    Synced,
}

/// A committed chunk, where it is.
#[derive(Debug, Clone)]
pub struct ChunkLocation {
    /// Its header.
    pub header: ChunkHeader,
    /// The header's bytes, as on disk (what the stream protocol's `Deliver` starts with).
    pub header_bytes: [u8; CHUNK_HEADER_BYTES],
    /// The segment file.
    pub file: Arc<dyn StorageFile>,
    /// Where the chunk starts in it.
    pub position: u64,
}

impl ChunkLocation {
    /// Where its data entries start in the file (after the header and any filter).
    pub fn data_position(&self) -> u64 {
        self.position + self.header.data_start()
    }

    /// Whether it is the first chunk of its segment (a follower starts a segment there too).
    pub fn starts_segment(&self) -> bool {
        self.position == FILE_HEADER_BYTES
    }

    /// Reads the whole chunk, header to trailer, into `bytes` (resized to it) and checks its
    /// data against the header: what a leader sends a follower.
    pub fn read_whole(&self, bytes: &mut Vec<u8>) -> Result<(), ChunkDefect> {
        bytes.resize(self.header.chunk_bytes() as usize, 0);
        if self.file.read_exact_at(bytes, self.position).is_err() || bytes[..CHUNK_HEADER_BYTES] != self.header_bytes {
            return Err(ChunkDefect::Truncated);
        }
        let data_start = self.header.data_start() as usize;
        chunk::check_data(&self.header, &bytes[data_start..data_start + self.header.data_bytes as usize])
    }

    /// Reads its data entries into `data` (resized to them) and checks them against the header.
    pub fn read_data(&self, data: &mut Vec<u8>) -> Result<(), ChunkDefect> {
        data.resize(self.header.data_bytes as usize, 0);
        if self.file.read_exact_at(data, self.data_position()).is_err() {
            return Err(ChunkDefect::Truncated);
        }
        chunk::check_data(&self.header, data)
    }
}

/// A reader of one stream.
pub struct StreamReader {
    stream: Arc<Stream>,
    selector: ChunkSelector,
    bound: ReadBound,
    segment: u64,
    position: u64,
    /// The chunk id expected next.
    next_offset: u64,
    /// The offset the specification asked for: records before it in the first chunk are skipped.
    start_offset: u64,
    file: Option<(u64, FileHandle)>,
}

impl std::fmt::Debug for StreamReader {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("StreamReader")
            .field("segment", &self.segment)
            .field("position", &self.position)
            .field("next_offset", &self.next_offset)
            .finish_non_exhaustive()
    }
}

/// Where a reader starts: segment, position, chunk id and the offset asked for.
#[derive(Debug, Clone, Copy)]
struct Start {
    segment: u64,
    position: u64,
    chunk_id: u64,
    offset: u64,
}

impl Stream {
    /// A reader starting where `spec` says, among committed chunks.
    pub fn reader(self: &Arc<Self>, spec: OffsetSpec, selector: ChunkSelector) -> Result<StreamReader, StreamError> {
        StreamReader::new(self, spec, selector, ReadBound::Committed)
    }

    fn resolve(&self, spec: OffsetSpec, bound: ReadBound) -> Result<Start, StreamError> {
        let (first, next, last, target) = {
            let state = self.state.lock();
            if state.deleted {
                return Err(StreamError::Deleted);
            }
            let front = state.segments.front().expect("a stream always has a segment");
            let first = Start {
                segment: front.first_offset,
                position: FILE_HEADER_BYTES,
                chunk_id: front.first_offset,
                offset: front.first_offset,
            };
            let committed = state.bound_point(bound);
            let next = Start {
                segment: committed.segment,
                position: committed.end_position,
                chunk_id: committed.next_offset,
                offset: committed.next_offset,
            };
            let last = committed.last_user_chunk.filter(|chunk| chunk.segment >= front.first_offset).map(|chunk| Start {
                segment: chunk.segment,
                position: chunk.position,
                chunk_id: chunk.chunk_id,
                offset: chunk.chunk_id,
            });
            // The segment to search and how many of its index entries are committed.
            let target = match spec {
                OffsetSpec::Offset(offset) if offset > first.offset && offset < next.offset => {
                    state.segments.iter().rev().find(|segment| segment.first_offset <= offset)
                }
                OffsetSpec::Timestamp(timestamp) => state.segments.iter().find(|segment| {
                    segment.chunks > 0 && segment.last_timestamp_ms >= timestamp && segment.first_offset < committed.next_offset
                }),
                _ => None,
            }
            .map(|segment| {
                let index_end = if segment.first_offset == committed.segment { committed.index_end } else { segment.index_bytes };
                (segment.first_offset, (index_end.saturating_sub(FILE_HEADER_BYTES)) / INDEX_ENTRY_BYTES as u64)
            });
            (first, next, last, target)
        };
        match spec {
            OffsetSpec::First => Ok(first),
            OffsetSpec::Next => Ok(next),
            OffsetSpec::Last => Ok(last.unwrap_or(next)),
            OffsetSpec::Offset(offset) if offset <= first.offset => Ok(first),
            // Past the end: the reader waits at the end, and the records before the offset asked
            // for are still the caller's to skip (as RabbitMQ's stream queue skips them).
            OffsetSpec::Offset(offset) if offset >= next.offset => Ok(Start { offset, ..next }),
            OffsetSpec::Offset(offset) => {
                let Some((segment, entries)) = target else { return Ok(next) };
                let found = self.search_index(segment, entries, |entry| entry.chunk_id <= offset, true)?;
                Ok(found.map_or(next, |entry| Start { segment, position: u64::from(entry.position), chunk_id: entry.chunk_id, offset }))
            }
            OffsetSpec::Timestamp(timestamp) => {
                let Some((segment, entries)) = target else { return Ok(next) };
                let found = self.search_index(segment, entries, |entry| entry.timestamp_ms < timestamp, false)?;
                Ok(found.map_or(next, |entry| Start {
                    segment,
                    position: u64::from(entry.position),
                    chunk_id: entry.chunk_id,
                    offset: entry.chunk_id,
                }))
            }
        }
    }

    /// Binary search over the first `entries` entries of a segment's index, where `before` holds
    /// for a prefix of them: returns the last entry of that prefix (`last_of_prefix`) or the
    /// first one after it.
    fn search_index(
        &self,
        segment: u64,
        entries: u64,
        before: impl Fn(&IndexEntry) -> bool,
        last_of_prefix: bool,
    ) -> Result<Option<IndexEntry>, StreamError> {
        let path = self.directory().join(index::index_file_name(segment));
        let file = match self.cache().file_system().open(&path, OpenMode::Read) {
            Ok(file) => file,
            // Retired since: the caller starts from what is there.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(StorageError::io(&path, error).into()),
        };
        let read = |at: u64| -> Result<IndexEntry, StreamError> {
            let mut bytes = [0u8; INDEX_ENTRY_BYTES];
            file.read_exact_at(&mut bytes, FILE_HEADER_BYTES + at * INDEX_ENTRY_BYTES as u64)
                .map_err(|error| StorageError::io(&path, error))?;
            IndexEntry::parse(&bytes).ok_or_else(|| {
                StorageError::Corrupt { path: path.display().to_string(), detail: format!("index entry {at} does not pass its checksum") }
                    .into()
            })
        };
        // The number of entries for which `before` holds.
        let (mut low, mut high) = (0u64, entries);
        while low < high {
            let middle = low + (high - low) / 2;
            if before(&read(middle)?) {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        match (last_of_prefix, low) {
            (true, 0) => Ok(None),
            (true, prefix) => read(prefix - 1).map(Some),
            (false, prefix) if prefix == entries => Ok(None),
            (false, prefix) => read(prefix).map(Some),
        }
    }
}

impl StreamReader {
    fn new(stream: &Arc<Stream>, spec: OffsetSpec, selector: ChunkSelector, bound: ReadBound) -> Result<StreamReader, StreamError> {
        let start = stream.resolve(spec, bound)?;
        Ok(StreamReader {
            stream: stream.clone(),
            selector,
            bound,
            segment: start.segment,
            position: start.position,
            next_offset: start.chunk_id,
            start_offset: start.offset,
            file: None,
        })
    }

    /// A reader of every chunk up to `bound`, from the chunk holding `offset`.
    pub(crate) fn exact(stream: &Arc<Stream>, offset: u64, bound: ReadBound) -> Result<StreamReader, StreamError> {
        StreamReader::new(stream, OffsetSpec::Offset(offset), ChunkSelector::All, bound)
    }

    /// The offset the reader's specification resolved to: records before it (in its first
    /// chunk) were not asked for.
    pub fn start_offset(&self) -> u64 {
        self.start_offset
    }

    /// The chunk id it reads next.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The stream it reads.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// The next committed chunk the selector takes, without reading its data; `None` when the
    /// reader is at the committed end (wait for the stream's commit listener, then ask again).
    pub fn next_chunk(&mut self) -> Result<Option<ChunkLocation>, StreamError> {
        loop {
            if !self.locate()? {
                return Ok(None);
            }
            let Some(file) = self.segment_file()? else { continue };
            let mut header_bytes = [0u8; CHUNK_HEADER_BYTES];
            let path = || self.stream.directory().join(index::segment_file_name(self.segment)).display().to_string();
            file.read_exact_at(&mut header_bytes, self.position).map_err(|error| StorageError::Io { path: path(), source: error })?;
            let damaged = |defect| StreamError::Damaged { path: path(), position: self.position, defect };
            let header = ChunkHeader::parse(&header_bytes).map_err(damaged)?;
            if header.first_offset != self.next_offset {
                return Err(damaged(ChunkDefect::WrongOffset { found: header.first_offset, expected: self.next_offset }));
            }
            let location = ChunkLocation { header, header_bytes, file, position: self.position };
            self.position += header.chunk_bytes();
            self.next_offset = header.next_offset();
            if self.selector == ChunkSelector::All || header.chunk_type == ChunkType::User {
                return Ok(Some(location));
            }
        }
    }

    /// Reads the next chunk's data entries into `data` (checked against the header); `None`
    /// at the committed end.
    pub fn read_chunk(&mut self, data: &mut Vec<u8>) -> Result<Option<ChunkHeader>, StreamError> {
        let Some(location) = self.next_chunk()? else { return Ok(None) };
        location.read_data(data).map_err(|defect| StreamError::Damaged {
            path: self.stream.directory().join(index::segment_file_name(self.segment)).display().to_string(),
            position: location.position,
            defect,
        })?;
        Ok(Some(location.header))
    }

    /// Whether a committed chunk is at the reader's position, moving it to the next segment (or
    /// to the first one, if retention deleted its segment) as needed.
    fn locate(&mut self) -> Result<bool, StreamError> {
        let stream = self.stream.clone();
        let state = stream.state.lock();
        if state.deleted {
            return Err(StreamError::Deleted);
        }
        let committed = state.bound_point(self.bound);
        loop {
            if self.next_offset >= committed.next_offset {
                return Ok(false);
            }
            let found = state.segments.iter().position(|segment| segment.first_offset == self.segment);
            let Some(at) = found else {
                let front = state.segments.front().expect("a stream always has a segment").first_offset;
                if self.segment < front {
                    // Retired under the reader: it continues from the first segment.
                    self.enter(front);
                    continue;
                }
                // Readers only enter segments the stream holds, and segments go from the front.
                return Ok(false);
            };
            let segment = &state.segments[at];
            let end = if segment.first_offset == committed.segment { committed.end_position } else { segment.bytes };
            if self.position < end {
                return Ok(true);
            }
            match state.segments.get(at + 1) {
                Some(next) => self.enter(next.first_offset),
                None => return Ok(false),
            }
        }
    }

    /// Moves to the start of segment `first_offset`, whose first chunk is what it reads next
    /// (offsets between the segments, if any, are gone).
    fn enter(&mut self, first_offset: u64) {
        self.segment = first_offset;
        self.position = FILE_HEADER_BYTES;
        self.next_offset = first_offset;
        self.file = None;
    }

    /// The reader's segment file, through the node's cache; `None` when it was deleted meanwhile
    /// (the caller locates again).
    fn segment_file(&mut self) -> Result<Option<Arc<dyn StorageFile>>, StreamError> {
        let cache = self.stream.cache();
        if let Some((segment, handle)) = self.file {
            if segment == self.segment {
                if let Some(file) = cache.get(handle) {
                    return Ok(Some(file));
                }
            }
        }
        let path = self.stream.directory().join(index::segment_file_name(self.segment));
        match cache.open(&path, OpenMode::Read) {
            Ok((handle, file)) => {
                self.file = Some((self.segment, handle));
                Ok(Some(file))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                // Retention deleted it after `locate` saw it: drop it from view and locate again.
                let front = self.stream.info().first_offset;
                if front <= self.segment {
                    return Err(StorageError::io(&path, error).into());
                }
                self.enter(front);
                Ok(None)
            }
            Err(error) => Err(StorageError::io(&path, error).into()),
        }
    }
}

impl Drop for StreamReader {
    /// Closes its segment file now rather than when the cache needs the room.
    fn drop(&mut self) {
        if let Some((_, handle)) = self.file.take() {
            self.stream.cache().remove(handle);
        }
    }
}
