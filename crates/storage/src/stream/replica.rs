//! A stream's replication seam (docs/streams.md, "Replication"): the storage half of copying a
//! stream from its leader to its followers, as osiris does for RabbitMQ's streams.
//!
//! The leader's chunks are copied byte for byte: a follower writes each at the same offset and
//! segment boundary ([`Stream::append_replicated`]), so a chunk id means the same records on
//! every member and a follower can serve readers from its own files. A replicated stream tells
//! apart what this node has fdatasynced (its *synced* point, what it acknowledges to the leader)
//! from what readers may see: a chunk becomes readable, and its publishers confirmed, only once
//! the cluster has committed it, which the cluster layer works out from the members'
//! acknowledgements and hands back as an offset ([`Stream::commit_replicated`]).
//!
//! Each leader writes with an epoch greater than every earlier leader's (the chunk header's
//! epoch field). A member whose log ends in chunks no majority held (a leader that died before
//! replicating them) finds where its log leaves the new leader's by Kafka's leader-epoch rule:
//! the leader answers [`Stream::epoch_end`] of the member's last epoch, and the member cuts its
//! log there ([`Stream::truncate_from`]) before it takes the leader's chunks. A member whose
//! log ends before the leader's first offset (the leader's retention deleted what it lacks)
//! drops its log and starts again at that offset ([`Stream::reset_to`]).
//!
//! Nothing here touches the network; the cluster layer reads what to send with
//! [`Stream::replication_reader`].

use super::chunk::{self, ChunkHeader, ChunkType, CHUNK_HEADER_BYTES};
use super::index::{self, IndexEntry, FILE_HEADER_BYTES, INDEX_ENTRY_BYTES, SEGMENT_HEADER};
use super::log::{ChunkPoint, CommitPoint, SegmentState, StreamState};
use super::reader::{ReadBound, StreamReader};
use super::recovery;
use super::tracking::Tracking;
use super::{Stream, StreamError};
use crate::file_system::OpenMode;
use crate::StorageError;
use std::collections::VecDeque;
use std::sync::Arc;

/// Chunks a replicated stream holds appended but not yet committed by the cluster; past it,
/// appends are refused with [`StreamError::ReplicationBehind`] (the publisher is nacked) until
/// the followers catch up. 65,536 chunks of at least one record each; the bookkeeping is 80
/// bytes per chunk, 5 MiB at most.
pub const UNREPLICATED_CHUNKS_MAX: usize = 65_536;

/// A replicated stream's bookkeeping, under the stream's lock.
#[derive(Debug, Clone)]
pub(crate) struct ReplicationState {
    /// How far this node's own files are fdatasynced.
    pub synced: CommitPoint,
    /// The offset below which the cluster committed the stream.
    pub cluster_commit: u64,
    /// The point after each chunk appended here and not readable yet, oldest first.
    pub chunk_ends: VecDeque<CommitPoint>,
}

/// The end of a stream's log, as two members compare theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTail {
    /// The epoch of its last chunk (0: no chunk).
    pub last_epoch: u64,
    /// The offset after its last chunk.
    pub next_offset: u64,
}

impl StreamState {
    /// This node synced up to `point`; returns the new readable next offset if it moved.
    pub(crate) fn note_synced(&mut self, point: CommitPoint) -> Option<u64> {
        let replication = self.replication.as_mut()?;
        if point.next_offset > replication.synced.next_offset {
            replication.synced = point;
        }
        self.advance_readable()
    }

    /// Makes readable every chunk both synced here and committed by the cluster.
    fn advance_readable(&mut self) -> Option<u64> {
        let replication = self.replication.as_mut()?;
        let limit = replication.synced.next_offset.min(replication.cluster_commit);
        let mut readable = None;
        while replication.chunk_ends.front().is_some_and(|end| end.next_offset <= limit) {
            readable = replication.chunk_ends.pop_front();
        }
        let point = readable?;
        self.committed = point;
        Some(point.next_offset)
    }

    /// The point a reader of `bound` stops at.
    pub(crate) fn bound_point(&self, bound: ReadBound) -> CommitPoint {
        match (bound, &self.replication) {
            (ReadBound::Synced, Some(replication)) => replication.synced,
            _ => self.committed,
        }
    }

    /// Forgets the whole log in memory (what was appended and not written too) and starts it
    /// again, empty, at `first_offset`, in a segment whose files exist already; returns the
    /// first offsets of the segments it held, oldest first.
    fn restart_at(&mut self, first_offset: u64) -> Vec<u64> {
        self.close_open_chunk();
        self.pending.clear();
        self.rolled = false;
        let dropped: Vec<u64> = self.segments.drain(..).map(|segment| segment.first_offset).collect();
        self.segments.push_back(SegmentState::empty(first_offset));
        self.segments_retired += dropped.len() as u64;
        self.next_offset = first_offset;
        self.tracking = Tracking::default();
        self.last_user_chunk = None;
        let empty = CommitPoint {
            next_offset: first_offset,
            segment: first_offset,
            end_position: FILE_HEADER_BYTES,
            index_end: FILE_HEADER_BYTES,
            last_user_chunk: None,
        };
        self.committed = empty;
        if let Some(replication) = self.replication.as_mut() {
            replication.synced = empty;
            replication.cluster_commit = replication.cluster_commit.max(first_offset);
            replication.chunk_ends.clear();
        }
        dropped
    }

    fn tail(&self) -> StreamTail {
        let last_epoch = self.segments.iter().rev().find(|segment| segment.chunks > 0).map_or(0, |segment| segment.last_epoch);
        StreamTail { last_epoch, next_offset: self.next_offset }
    }
}

impl Stream {
    /// Makes this stream a replicated one, of which the cluster is known to have committed the
    /// offsets below `committed_next_offset` (what this member learnt before it stopped; 0 when
    /// it knows nothing). Readers see no further until [`Stream::commit_replicated`] says so.
    /// Called once, right after [`Stream::open`], before any append or reader.
    pub fn enable_replication(&self, committed_next_offset: u64) -> Result<(), StreamError> {
        let segments: Vec<u64> = {
            let state = self.state.lock();
            state.check_idle()?;
            state.segments.iter().map(|segment| segment.first_offset).collect()
        };
        let (readable, chunk_ends) = self.points_from(&segments, committed_next_offset)?;
        let mut state = self.state.lock();
        let synced = state.committed;
        state.committed = readable;
        state.replication = Some(ReplicationState { synced, cluster_commit: readable.next_offset, chunk_ends });
        Ok(())
    }

    /// The epoch this node's chunks are written with from now on (it became the stream's
    /// leader in that epoch). Epochs only grow along a stream.
    pub fn set_epoch(&self, epoch: u64) -> Result<(), StreamError> {
        let mut state = self.state.lock();
        let last = state.tail().last_epoch;
        if epoch < last {
            return Err(StreamError::StaleEpoch { epoch, last });
        }
        state.close_open_chunk();
        state.epoch = epoch;
        Ok(())
    }

    /// Whether this node may append of its own: only while it leads the stream (a follower
    /// takes its leader's chunks, [`Stream::append_replicated`], and nothing else).
    pub fn set_writable(&self, writable: bool) {
        let mut state = self.state.lock();
        state.close_open_chunk();
        state.writable = writable;
    }

    /// The cluster committed everything below `next_offset`: what is synced here up to it
    /// becomes readable (and the readers waiting for it are woken).
    pub fn commit_replicated(&self, next_offset: u64) {
        let readable = {
            let mut state = self.state.lock();
            let deleted = state.deleted;
            let Some(replication) = state.replication.as_mut() else { return };
            if deleted || next_offset <= replication.cluster_commit {
                return;
            }
            replication.cluster_commit = next_offset;
            state.advance_readable()
        };
        if let Some(next_offset) = readable {
            self.tell_listener(next_offset);
        }
    }

    /// The offset below which this node's files are fdatasynced: what it acknowledges.
    pub fn synced_next_offset(&self) -> u64 {
        let state = self.state.lock();
        state.bound_point(ReadBound::Synced).next_offset
    }

    /// The end of the log as appended here (synced or not).
    pub fn tail(&self) -> StreamTail {
        self.state.lock().tail()
    }

    /// A reader of every chunk this node has synced (committed by the cluster or not), from
    /// the chunk starting at `from_offset` (or the first held, if retention removed it): what
    /// a leader sends its followers.
    pub fn replication_reader(self: &Arc<Self>, from_offset: u64) -> Result<StreamReader, StreamError> {
        StreamReader::exact(self, from_offset, ReadBound::Synced)
    }

    /// Appends a chunk copied from the leader: checked (header, size, data CRC, offset and
    /// epoch following on), written at the same offset, starting a new segment where the
    /// leader's did. Returns the offset after it. Durable after the syncer's next batch that
    /// names this stream, then acknowledged with [`Stream::synced_next_offset`].
    pub fn append_replicated(&self, bytes: &[u8], starts_segment: bool, now_ms: i64) -> Result<u64, StreamError> {
        let header = checked_chunk(bytes)?;
        let mut state = self.state.lock();
        state.check_open()?;
        let tail = state.tail();
        if header.first_offset != tail.next_offset {
            return Err(StreamError::OutOfSequence { found: header.first_offset, expected: tail.next_offset });
        }
        if header.epoch < tail.last_epoch {
            return Err(StreamError::StaleEpoch { epoch: header.epoch, last: tail.last_epoch });
        }
        recovery::apply_tracking(&mut state.tracking, &header, &bytes[CHUNK_HEADER_BYTES..]).map_err(StreamError::BadBatch)?;
        state.close_open_chunk();
        if starts_segment && state.active().chunks > 0 {
            state.rolled = true;
            state.plan_segment(header.first_offset);
        }
        let (segment, position) = (state.active().first_offset, state.active().bytes);
        if position + header.chunk_bytes() > u64::from(u32::MAX) {
            return Err(StreamError::BadBatch(chunk::ChunkDefect::TooLarge));
        }
        state.last_timestamp_ms = state.last_timestamp_ms.max(header.timestamp_ms);
        state.pending_for(segment, position).data.extend_from_slice(bytes);
        state.next_offset = header.next_offset();
        state.record_chunk(&header, position);
        self.retire_after_roll(state, now_ms);
        Ok(header.next_offset())
    }

    /// The first chunk id written in an epoch later than `epoch`, or the end of the log if
    /// there is none: where the log of a member whose last chunk has `epoch` stops agreeing
    /// with this one (Kafka's leader-epoch end offset).
    pub fn epoch_end(&self, epoch: u64) -> Result<u64, StreamError> {
        let (segment, pending, next_offset) = {
            let state = self.state.lock();
            let Some(segment) = state.segments.iter().find(|segment| segment.last_epoch > epoch) else {
                return Ok(state.next_offset);
            };
            let pending: Vec<IndexEntry> = state
                .pending
                .iter()
                .filter(|write| write.segment == segment.first_offset)
                .flat_map(|write| index::parse_entries(&write.index).0)
                .collect();
            (segment.first_offset, pending, state.next_offset)
        };
        let mut entries = self.index_entries(segment)?;
        let written_end = entries.last().map_or(segment, IndexEntry::next_offset);
        entries.extend(pending.into_iter().filter(|entry| entry.chunk_id >= written_end));
        Ok(entries.iter().find(|entry| entry.epoch > epoch).map_or(next_offset, |entry| entry.chunk_id))
    }

    /// Cuts the log before the chunk starting at `offset` (chunks no majority held: a member
    /// following a new leader), on disk and in memory. Only chunks the cluster did not commit
    /// can go: `offset` is at or past the readable end.
    pub fn truncate_from(&self, offset: u64) -> Result<(), StreamError> {
        let mut writer = self.writer.lock();
        let (pending, segments, readable) = {
            let mut state = self.state.lock();
            if state.deleted {
                return Err(StreamError::Deleted);
            }
            if state.replication.is_none() || offset < state.committed.next_offset || offset > state.next_offset {
                return Err(StreamError::BadTruncation { offset, readable: state.committed.next_offset, next: state.next_offset });
            }
            state.close_open_chunk();
            let segments: Vec<(u64, u64)> = state.segments.iter().map(|segment| (segment.first_offset, segment.next_offset)).collect();
            (std::mem::take(&mut state.pending), segments, state.committed.next_offset)
        };
        // Written first, so the files hold everything before the cut and recovery rebuilds the
        // stream's state (tracking included) from them alone.
        if let Err(error) = self.write_all(&mut writer, &pending) {
            let mut state = self.state.lock();
            let newer = std::mem::replace(&mut state.pending, pending);
            state.pending.extend(newer);
            return Err(error);
        }
        if let Some((_, data, index)) = writer.files.take() {
            self.cache().remove(data);
            self.cache().remove(index);
        }
        self.cut_files(&segments, offset)?;
        let recovered = recovery::recover(&*self.file_system, self.directory())?;
        let mut state = self.state.lock();
        debug_assert!(recovered.next_offset == offset && offset >= readable, "cut at {offset}, recovered up to {}", recovered.next_offset);
        state.segments = recovered.segments;
        state.next_offset = recovered.next_offset;
        state.last_timestamp_ms = recovered.last_timestamp_ms;
        state.tracking = recovered.tracking;
        state.last_user_chunk = recovered.committed.last_user_chunk;
        if state.segments.is_empty() {
            state.plan_segment(recovered.next_offset);
        }
        if let Some(replication) = state.replication.as_mut() {
            replication.chunk_ends.retain(|end| end.next_offset <= offset);
            if replication.synced.next_offset > offset {
                replication.synced = recovered.committed;
            }
        }
        Ok(())
    }

    /// Drops this member's whole log and starts it again, empty, at `first_offset`: the leader's
    /// first offset, when this log ends before it (the leader's retention deleted the offsets
    /// this member lacks, so nothing here continues the leader's log), as osiris resets a
    /// follower. The next chunk copied is the leader's first, which starts a segment named
    /// `first_offset` here as there, so offsets and segment boundaries stay the same on every
    /// member. Tracking starts empty and comes back with that chunk (a segment starts with a
    /// tracking snapshot); readers in the old log go on from `first_offset`, as after
    /// retention. Returns how many segments were dropped.
    ///
    /// Crash safety: the new segment's files are created and synced before any old file is
    /// removed, and no chunk is written to them before the removals are synced. A restart that
    /// finds old segments beside the new, empty one drops the empty one (recovery's rule for an
    /// empty newest segment) and has the old log, or the whole segments of it that the crash
    /// left (recovery takes each as it finds it: never an offset it does not hold), and is
    /// reset again; one that finds the new one alone has the new log, empty at `first_offset`.
    pub fn reset_to(&self, first_offset: u64) -> Result<usize, StreamError> {
        let mut writer = self.writer.lock();
        {
            let state = self.state.lock();
            if state.deleted {
                return Err(StreamError::Deleted);
            }
            if state.replication.is_none() || first_offset <= state.next_offset {
                return Err(StreamError::NotBehind { first_offset, next: state.next_offset });
            }
        }
        self.create_empty_segment(first_offset)?;
        let dropped = self.state.lock().restart_at(first_offset);
        if let Some((_, data, index)) = writer.files.take() {
            self.cache().remove(data);
            self.cache().remove(index);
        }
        // Writes of the dropped segments: they are not to be synced, nor their directory
        // entries, which the removals below sync.
        writer.unsynced.clear();
        writer.directory_unsynced = false;
        self.remove_segments(&dropped)?;
        Ok(dropped.len())
    }

    /// Creates the files of an empty segment starting at `first_offset` (headers only) and
    /// makes them and their names durable.
    fn create_empty_segment(&self, first_offset: u64) -> Result<(), StreamError> {
        let files = [(index::segment_file_name(first_offset), SEGMENT_HEADER), (index::index_file_name(first_offset), index::INDEX_HEADER)];
        for (name, header) in files {
            let path = self.directory().join(name);
            let file = self.file_system.open(&path, OpenMode::CreateReadWrite).map_err(|error| StorageError::io(&path, error))?;
            file.write_all_at(&header, 0)
                .and_then(|()| file.set_len(FILE_HEADER_BYTES))
                .and_then(|()| file.sync_data())
                .map_err(|error| StorageError::io(&path, error))?;
        }
        self.file_system.sync_directory(self.directory()).map_err(|error| StorageError::io(self.directory(), error))?;
        Ok(())
    }

    /// Removes the files of `segments`, oldest first as retention does (each segment file
    /// before its index, whose orphan recovery removes), then syncs the directory.
    fn remove_segments(&self, segments: &[u64]) -> Result<(), StreamError> {
        for &segment in segments {
            for path in [self.directory().join(index::segment_file_name(segment)), self.directory().join(index::index_file_name(segment))] {
                match self.file_system.remove_file(&path) {
                    Ok(()) => {}
                    // Never created (a segment planned, not written yet), or retired meanwhile.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => return Err(StorageError::io(&path, error).into()),
                }
            }
        }
        self.file_system.sync_directory(self.directory()).map_err(|error| StorageError::io(self.directory(), error))?;
        Ok(())
    }

    /// Removes the segments starting at or after `offset` (the stream's first segment is cut
    /// to its header instead) and cuts the segment holding it at that chunk.
    fn cut_files(&self, segments: &[(u64, u64)], offset: u64) -> Result<(), StreamError> {
        let file_system = &self.file_system;
        let front = segments.first().map_or(0, |(first, _)| *first);
        for &(first, next) in segments.iter().rev() {
            if next <= offset && first < offset {
                break;
            }
            let segment_path = self.directory().join(index::segment_file_name(first));
            let index_path = self.directory().join(index::index_file_name(first));
            if first >= offset && first != front {
                for path in [&segment_path, &index_path] {
                    match file_system.remove_file(path) {
                        Ok(()) => {}
                        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                        Err(error) => return Err(StorageError::io(path, error).into()),
                    }
                }
                continue;
            }
            let entries = self.index_entries(first)?;
            let kept = entries.iter().take_while(|entry| entry.chunk_id < offset).count();
            if entries.get(kept).is_some_and(|entry| entry.chunk_id != offset) || kept == entries.len() && next != offset {
                return Err(StreamError::BadTruncation { offset, readable: 0, next });
            }
            let data_end = entries.get(kept).map_or(FILE_HEADER_BYTES, |entry| u64::from(entry.position));
            let index_end = FILE_HEADER_BYTES + (kept * INDEX_ENTRY_BYTES) as u64;
            for (path, end) in [(&segment_path, data_end), (&index_path, index_end)] {
                let file = file_system.open(path, OpenMode::ReadWrite).map_err(|error| StorageError::io(path, error))?;
                file.set_len(end).and_then(|()| file.sync_data()).map_err(|error| StorageError::io(path, error))?;
            }
        }
        file_system.sync_directory(self.directory()).map_err(|error| StorageError::io(self.directory(), error))?;
        Ok(())
    }

    /// The readable point at `from` (or the last chunk end before it) and the end of every
    /// later chunk, from the index files.
    fn points_from(&self, segments: &[u64], from: u64) -> Result<(CommitPoint, VecDeque<CommitPoint>), StreamError> {
        let at = segments.iter().rposition(|first| *first <= from).unwrap_or(0);
        let first = segments.get(at).copied().unwrap_or(0);
        let mut last_user_chunk = self.last_user_chunk_before(&segments[..at])?;
        let mut readable = CommitPoint {
            next_offset: first,
            segment: first,
            end_position: FILE_HEADER_BYTES,
            index_end: FILE_HEADER_BYTES,
            last_user_chunk,
        };
        let mut chunk_ends = VecDeque::new();
        for &segment in segments.get(at..).unwrap_or(&[]) {
            for (number, entry) in self.index_entries(segment)?.iter().enumerate() {
                if entry.chunk_type == ChunkType::User {
                    last_user_chunk = Some(ChunkPoint { chunk_id: entry.chunk_id, segment, position: u64::from(entry.position) });
                }
                let end = CommitPoint {
                    next_offset: entry.next_offset(),
                    segment,
                    end_position: entry.end_position(),
                    index_end: FILE_HEADER_BYTES + ((number + 1) * INDEX_ENTRY_BYTES) as u64,
                    last_user_chunk,
                };
                if end.next_offset <= from {
                    readable = end;
                } else {
                    chunk_ends.push_back(end);
                }
            }
        }
        Ok((readable, chunk_ends))
    }

    fn last_user_chunk_before(&self, segments: &[u64]) -> Result<Option<ChunkPoint>, StreamError> {
        for &segment in segments.iter().rev() {
            let entries = self.index_entries(segment)?;
            if let Some(entry) = entries.iter().rev().find(|entry| entry.chunk_type == ChunkType::User) {
                return Ok(Some(ChunkPoint { chunk_id: entry.chunk_id, segment, position: u64::from(entry.position) }));
            }
        }
        Ok(None)
    }

    /// A segment's index entries as written (none for a segment not written yet).
    fn index_entries(&self, segment: u64) -> Result<Vec<IndexEntry>, StreamError> {
        let path = self.directory().join(index::index_file_name(segment));
        Ok(recovery::read_index(&*self.file_system, &path)?.unwrap_or_default())
    }
}

impl StreamState {
    /// Replication is set up once, on a stream nothing was appended to since it was opened.
    fn check_idle(&self) -> Result<(), StreamError> {
        if self.deleted {
            return Err(StreamError::Deleted);
        }
        if self.replication.is_some() {
            return Err(StreamError::ReplicationSetup("the stream is replicated already"));
        }
        if self.pending.iter().any(|write| !write.data.is_empty()) {
            return Err(StreamError::ReplicationSetup("the stream has appends not written yet"));
        }
        Ok(())
    }
}

/// The header of a whole chunk copied from a leader, once its size and data are checked.
fn checked_chunk(bytes: &[u8]) -> Result<ChunkHeader, StreamError> {
    let header_bytes: &[u8; CHUNK_HEADER_BYTES] = bytes
        .get(..CHUNK_HEADER_BYTES)
        .and_then(|slice| slice.try_into().ok())
        .ok_or(StreamError::BadBatch(chunk::ChunkDefect::Truncated))?;
    let header = ChunkHeader::parse(header_bytes).map_err(StreamError::BadBatch)?;
    if header.chunk_bytes() != bytes.len() as u64 {
        return Err(StreamError::BadBatch(chunk::ChunkDefect::Truncated));
    }
    let data_start = header.data_start() as usize;
    let data = &bytes[data_start..data_start + header.data_bytes as usize];
    chunk::check_data(&header, data).map_err(StreamError::BadBatch)?;
    Ok(header)
}
