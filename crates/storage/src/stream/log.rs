//! One stream: appends planned in memory under the stream's lock (offsets, segment rolls, chunk
//! headers, index entries), written and fdatasynced by the syncer's group commit outside that
//! lock, and then committed, which makes them readable and lets their confirms go out.
//!
//! Appending never touches the disk: a chunk's place (segment and byte position) is decided when
//! it is appended, so the syncer writes each batch with one positioned write per file. The open
//! chunk of AMQP 0-9-1 records reserves its header and is finished (CRC, counts) when the syncer
//! takes the batch or when it reaches [`AMQP_CHUNK_BYTES_TARGET`].

use super::chunk::{self, ChunkHeader, ChunkType, EntryBatch, AMQP_CHUNK_BYTES_TARGET, CHUNK_ENTRIES_MAX, CHUNK_HEADER_BYTES};
use super::index::{self, IndexEntry, FILE_HEADER_BYTES, INDEX_ENTRY_BYTES, INDEX_HEADER, SEGMENT_HEADER};
use super::recovery::{self, StreamRecovery};
pub(crate) use super::replica::UNREPLICATED_CHUNKS_MAX;
use super::tracking::{self, Tracking};
use super::{Retention, StreamError, StreamSettings, EPOCH};
use crate::file_cache::{FileCache, FileHandle};
use crate::file_system::{OpenMode, SharedFileSystem, StorageFile};
use crate::queue_log::{PendingSync, SyncDue};
use crate::StorageError;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Called on the syncer's thread after chunks were committed, with the stream's new committed
/// next offset: wakes the readers waiting for them. It must return quickly.
pub type CommitListener = Arc<dyn Fn(u64) + Send + Sync>;

/// Where a chunk starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPoint {
    /// Its first offset.
    pub chunk_id: u64,
    /// The first offset of its segment (the segment's name).
    pub segment: u64,
    /// Its byte position in the segment.
    pub position: u64,
}

/// How far a stream is committed: readable, and confirmed to publishers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitPoint {
    /// The offset after the last committed chunk: where `next` starts.
    pub next_offset: u64,
    /// The segment the committed chunks end in.
    pub segment: u64,
    /// Where they end in it.
    pub end_position: u64,
    /// Where its committed index entries end.
    pub index_end: u64,
    /// The last committed user chunk: where `last` starts.
    pub last_user_chunk: Option<ChunkPoint>,
}

/// A segment as the stream plans it: its size counts what is appended but not yet written.
#[derive(Debug, Clone)]
pub(crate) struct SegmentState {
    pub first_offset: u64,
    pub bytes: u64,
    pub index_bytes: u64,
    pub chunks: u32,
    pub next_offset: u64,
    pub first_timestamp_ms: Option<i64>,
    pub last_timestamp_ms: i64,
    /// The epoch of its last chunk (0 while it has none).
    pub last_epoch: u64,
}

impl SegmentState {
    pub(crate) fn empty(first_offset: u64) -> SegmentState {
        SegmentState {
            first_offset,
            bytes: FILE_HEADER_BYTES,
            index_bytes: FILE_HEADER_BYTES,
            chunks: 0,
            next_offset: first_offset,
            first_timestamp_ms: None,
            last_timestamp_ms: i64::MIN,
            last_epoch: 0,
        }
    }
}

/// Bytes appended to one segment and its index, to be written at these positions.
#[derive(Debug)]
pub(crate) struct PendingWrite {
    pub segment: u64,
    /// The segment's files are to be created (with their headers) first.
    pub create: bool,
    pub data_position: u64,
    pub data: Vec<u8>,
    pub index_position: u64,
    pub index: Vec<u8>,
}

/// The chunk AMQP 0-9-1 records go into until it is cut.
#[derive(Debug)]
struct OpenChunk {
    /// Where its reserved header is in the last pending write's data.
    header_at: usize,
    position: u64,
    first_offset: u64,
    entries: u16,
    records: u32,
    timestamp_ms: i64,
}

/// What the stream's lock guards.
#[derive(Debug)]
pub(crate) struct StreamState {
    pub settings: StreamSettings,
    pub segments: VecDeque<SegmentState>,
    /// The offset the next record takes.
    pub next_offset: u64,
    pub last_timestamp_ms: i64,
    open_chunk: Option<OpenChunk>,
    pub(crate) pending: Vec<PendingWrite>,
    pub tracking: Tracking,
    /// What readers see and confirms wait for: what was synced here, and, for a replicated
    /// stream, also committed by the cluster.
    pub committed: CommitPoint,
    /// The epoch this node writes its chunks with (a replicated stream's leader's term).
    pub epoch: u64,
    /// A replicated stream's local sync point and its chunks not yet committed by the cluster.
    pub(crate) replication: Option<super::replica::ReplicationState>,
    /// Whether this node may append of its own (a replicated stream's follower may not).
    pub(crate) writable: bool,
    /// The last user chunk appended (committed or not).
    pub(crate) last_user_chunk: Option<ChunkPoint>,
    pub deleted: bool,
    /// Segments deleted by retention, so far.
    pub segments_retired: u64,
    /// An append rolled a segment: retention is due.
    pub(crate) rolled: bool,
}

/// The syncer's side: the files being written, and what was written but not synced yet.
#[derive(Debug, Default)]
pub(crate) struct WriterState {
    /// The segment last written, with its data and index files in the cache.
    pub files: Option<(u64, FileHandle, FileHandle)>,
    pub unsynced: Vec<Arc<dyn StorageFile>>,
    pub directory_unsynced: bool,
}

/// A segment's data file and index file.
type SegmentFiles = (Arc<dyn StorageFile>, Arc<dyn StorageFile>);

/// What [`Stream::write_pending`] leaves for the syncer.
#[derive(Debug, Default)]
pub struct StreamWritten {
    /// Files (and the directory) to fdatasync before committing.
    pub sync_now: Vec<PendingSync>,
    /// What to commit once they are synced (none: nothing was written, or it is committed already).
    pub commit: Option<CommitPoint>,
}

/// Figures of a stream, for management and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamInfo {
    /// The first offset still held.
    pub first_offset: u64,
    /// The committed next offset.
    pub committed_next_offset: u64,
    /// The next offset an append takes.
    pub next_offset: u64,
    /// Segments on disk (or planned).
    pub segments: usize,
    /// Bytes of its segments.
    pub bytes: u64,
    /// Segments deleted by retention since it was opened.
    pub segments_retired: u64,
}

/// One stream.
pub struct Stream {
    directory: PathBuf,
    cache: Arc<FileCache>,
    pub(crate) file_system: SharedFileSystem,
    pub(crate) state: Mutex<StreamState>,
    pub(crate) writer: Mutex<WriterState>,
    listener: Mutex<Option<CommitListener>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Stream").field("directory", &self.directory).finish_non_exhaustive()
    }
}

/// Milliseconds since the Unix epoch, by the wall clock (chunk timestamps are wall-clock times).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as i64).unwrap_or(0)
}

impl Stream {
    /// Creates an empty stream in `directory`, replacing whatever an older stream of the same
    /// name left there.
    pub fn create(directory: &Path, settings: StreamSettings, cache: Arc<FileCache>) -> Result<Arc<Stream>, StreamError> {
        let file_system = cache.file_system().clone();
        match file_system.remove_dir_all(directory) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(StorageError::io(directory, error).into()),
        }
        let (stream, _) = Stream::open(directory, settings, cache)?;
        Ok(stream)
    }

    /// Opens (recovers) the stream in `directory`, creating the directory if it is missing.
    /// The directory's own name is made durable (its parent synced) before this returns.
    pub fn open(directory: &Path, settings: StreamSettings, cache: Arc<FileCache>) -> Result<(Arc<Stream>, StreamRecovery), StreamError> {
        let file_system = cache.file_system().clone();
        if !file_system.is_dir(directory) {
            file_system.create_dir_all(directory).map_err(|error| StorageError::io(directory, error))?;
            if let Some(parent) = directory.parent() {
                file_system.sync_directory(parent).map_err(|error| StorageError::io(parent, error))?;
            }
        }
        let recovered = recovery::recover(&*file_system, directory)?;
        let settings = settings.bounded();
        let mut state = StreamState {
            settings,
            segments: recovered.segments,
            next_offset: recovered.next_offset,
            last_timestamp_ms: recovered.last_timestamp_ms,
            open_chunk: None,
            pending: Vec::new(),
            tracking: recovered.tracking,
            committed: recovered.committed,
            epoch: recovered.last_epoch.max(EPOCH),
            replication: None,
            writable: true,
            last_user_chunk: recovered.committed.last_user_chunk,
            deleted: false,
            segments_retired: 0,
            rolled: false,
        };
        if state.segments.is_empty() {
            state.plan_segment(recovered.next_offset);
        }
        let stream = Stream {
            directory: directory.to_path_buf(),
            cache,
            file_system,
            state: Mutex::new(state),
            writer: Mutex::new(WriterState::default()),
            listener: Mutex::new(None),
        };
        Ok((Arc::new(stream), recovered.report))
    }

    /// Its directory.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    pub(crate) fn cache(&self) -> &Arc<FileCache> {
        &self.cache
    }

    /// Who to call after each commit (replaces the previous listener).
    pub fn set_commit_listener(&self, listener: CommitListener) {
        *self.listener.lock() = Some(listener);
    }

    /// New segment size and retention (a policy changed); applies to the next roll and the next
    /// retention check.
    pub fn set_settings(&self, settings: StreamSettings) {
        self.state.lock().settings = settings.bounded();
    }

    /// Appends one record (an AMQP 0-9-1 publish) to the open chunk; returns its offset.
    /// Durable and readable after the syncer's next batch that names this stream.
    pub fn append_record(&self, record: &[u8], now_ms: i64) -> Result<u64, StreamError> {
        if record.len() > chunk::SIMPLE_ENTRY_BYTES_MAX {
            return Err(StreamError::RecordTooLarge { bytes: record.len() });
        }
        let mut state = self.state.lock();
        state.check_writable()?;
        state.append_record(record, now_ms);
        let offset = state.next_offset - 1;
        self.retire_after_roll(state, now_ms);
        Ok(offset)
    }

    /// Appends a batch of entries as one chunk (a RabbitMQ Stream protocol publish), with the
    /// publisher's reference and the last publishing id of the batch when it deduplicates;
    /// returns the chunk's first offset.
    pub fn append_batch(&self, batch: &EntryBatch<'_>, publisher: Option<(&[u8], u64)>, now_ms: i64) -> Result<u64, StreamError> {
        let mut trailer = Vec::new();
        if let Some((reference, sequence)) = publisher {
            tracking::put_sequence_block(&mut trailer, reference, sequence)?;
            tracking::seal_trailer(&mut trailer);
        }
        let mut state = self.state.lock();
        state.check_writable()?;
        let first_offset = state.push_chunk(ChunkType::User, batch.data, batch.entries, batch.records, &trailer, now_ms);
        if let Some((reference, sequence)) = publisher {
            state.tracking.set_sequence(reference, first_offset, sequence);
        }
        self.retire_after_roll(state, now_ms);
        Ok(first_offset)
    }

    /// Stores a consumer's offset under `reference` (a tracking delta chunk, which takes one
    /// offset, as in RabbitMQ).
    pub fn store_offset(&self, reference: &[u8], offset: u64, now_ms: i64) -> Result<(), StreamError> {
        let mut state = self.state.lock();
        state.check_writable()?;
        state.tracking.check_offset(reference)?;
        let mut blocks = Vec::new();
        tracking::put_offset_block(&mut blocks, reference, offset);
        let mut data = Vec::with_capacity(blocks.len() + chunk::SIMPLE_ENTRY_HEADER_BYTES);
        chunk::put_simple_entry(&mut data, &blocks)?;
        state.push_chunk(ChunkType::TrackingDelta, &data, 1, 1, &[], now_ms);
        state.tracking.set_offset(reference, offset);
        self.retire_after_roll(state, now_ms);
        Ok(())
    }

    /// Applies retention when the append just made rolled a segment (unlinking outside the lock).
    pub(crate) fn retire_after_roll(&self, mut state: parking_lot::MutexGuard<'_, StreamState>, now_ms: i64) {
        if !std::mem::take(&mut state.rolled) {
            return;
        }
        let retired = state.retire_segments(now_ms);
        drop(state);
        if !retired.is_empty() {
            self.unlink_segments(retired);
        }
    }

    /// The offset stored under `reference` (committed or not: as RabbitMQ answers from its
    /// writer's state).
    pub fn query_offset(&self, reference: &[u8]) -> Option<u64> {
        self.state.lock().tracking.offset(reference)
    }

    /// The last publishing id stored for publisher `reference`.
    pub fn publisher_sequence(&self, reference: &[u8]) -> Option<u64> {
        self.state.lock().tracking.sequence(reference)
    }

    /// How far the stream is committed.
    pub fn committed(&self) -> CommitPoint {
        self.state.lock().committed
    }

    /// Its figures.
    pub fn info(&self) -> StreamInfo {
        let state = self.state.lock();
        StreamInfo {
            first_offset: state.segments.front().map_or(state.next_offset, |segment| segment.first_offset),
            committed_next_offset: state.committed.next_offset,
            next_offset: state.next_offset,
            segments: state.segments.len(),
            bytes: state.segments.iter().map(|segment| segment.bytes).sum(),
            segments_retired: state.segments_retired,
        }
    }

    /// Whether appends wait to be written.
    pub fn has_pending(&self) -> bool {
        let state = self.state.lock();
        !state.deleted && (!state.pending.is_empty() || state.open_chunk.is_some())
    }

    /// Writes what was appended (one positioned write per file and segment), creating new
    /// segments' files. With [`SyncDue::Now`] returns the files to fdatasync and the point to
    /// commit after; otherwise commits at once (the policy confirms without fdatasync). A failed
    /// write puts the appends back, to be written again (over the same bytes) by the next batch.
    pub fn write_pending(&self, due: SyncDue) -> Result<StreamWritten, StreamError> {
        let mut writer = self.writer.lock();
        let (writes, point) = {
            let mut state = self.state.lock();
            if state.deleted {
                return Ok(StreamWritten::default());
            }
            state.close_open_chunk();
            (std::mem::take(&mut state.pending), state.planned_point())
        };
        let wrote = !writes.is_empty();
        if let Err(error) = self.write_all(&mut writer, &writes) {
            let mut state = self.state.lock();
            let newer = std::mem::replace(&mut state.pending, writes);
            state.pending.extend(newer);
            return Err(error);
        }
        match due {
            SyncDue::Now => {
                let mut sync_now: Vec<PendingSync> = writer.unsynced.drain(..).map(PendingSync::File).collect();
                if std::mem::take(&mut writer.directory_unsynced) {
                    sync_now.push(PendingSync::Directory(self.cache.clone(), self.directory.clone()));
                }
                let commit = (wrote || !sync_now.is_empty()).then_some(point);
                Ok(StreamWritten { sync_now, commit })
            }
            SyncDue::Later | SyncDue::Never => {
                if due == SyncDue::Never {
                    writer.unsynced.clear();
                    writer.directory_unsynced = false;
                }
                drop(writer);
                if wrote {
                    self.commit(point);
                }
                Ok(StreamWritten::default())
            }
        }
    }

    /// The files of a batch whose fdatasync failed: synced again by the next batch (which then
    /// commits what this one could not).
    pub fn sync_failed(&self, files: Vec<PendingSync>) {
        let mut writer = self.writer.lock();
        for file in files {
            match file {
                PendingSync::File(file) => writer.unsynced.push(file),
                PendingSync::Directory(..) => writer.directory_unsynced = true,
            }
        }
    }

    pub(crate) fn write_all(&self, writer: &mut WriterState, writes: &[PendingWrite]) -> Result<(), StreamError> {
        for write in writes {
            let (data_file, index_file) = self.files_for(writer, write)?;
            let segment_path = self.directory.join(index::segment_file_name(write.segment));
            data_file.write_all_at(&write.data, write.data_position).map_err(|error| StorageError::io(&segment_path, error))?;
            let index_path = self.directory.join(index::index_file_name(write.segment));
            index_file.write_all_at(&write.index, write.index_position).map_err(|error| StorageError::io(&index_path, error))?;
            for file in [data_file, index_file] {
                if !writer.unsynced.iter().any(|known| Arc::ptr_eq(known, &file)) {
                    writer.unsynced.push(file);
                }
            }
        }
        Ok(())
    }

    /// The data and index files of a write's segment: created (with their headers) for a new
    /// segment, else the cached ones, else reopened.
    fn files_for(&self, writer: &mut WriterState, write: &PendingWrite) -> Result<SegmentFiles, StreamError> {
        if let Some((segment, data, index)) = writer.files {
            if segment == write.segment && !write.create {
                if let (Some(data), Some(index)) = (self.cache.get(data), self.cache.get(index)) {
                    return Ok((data, index));
                }
            }
            self.cache.remove(data);
            self.cache.remove(index);
            writer.files = None;
        }
        let mode = if write.create { OpenMode::CreateReadWrite } else { OpenMode::ReadWrite };
        let segment_path = self.directory.join(index::segment_file_name(write.segment));
        let index_path = self.directory.join(index::index_file_name(write.segment));
        let (data_handle, data) = self.cache.open(&segment_path, mode).map_err(|error| StorageError::io(&segment_path, error))?;
        let (index_handle, index) = match self.cache.open(&index_path, mode) {
            Ok(opened) => opened,
            Err(error) => {
                self.cache.remove(data_handle);
                return Err(StorageError::io(&index_path, error).into());
            }
        };
        writer.files = Some((write.segment, data_handle, index_handle));
        if write.create {
            data.write_all_at(&SEGMENT_HEADER, 0).map_err(|error| StorageError::io(&segment_path, error))?;
            index.write_all_at(&INDEX_HEADER, 0).map_err(|error| StorageError::io(&index_path, error))?;
            writer.directory_unsynced = true;
        }
        Ok((data, index))
    }

    /// Makes everything up to `point` readable (and tells the listener), once synced here: for
    /// a replicated stream, only as far as the cluster committed too. Only moves forward.
    pub fn commit(&self, point: CommitPoint) {
        let next_offset = {
            let mut state = self.state.lock();
            if state.deleted {
                return;
            }
            if state.replication.is_some() {
                match state.note_synced(point) {
                    Some(next_offset) => next_offset,
                    None => return,
                }
            } else {
                if point.next_offset < state.committed.next_offset {
                    return;
                }
                state.committed = point;
                point.next_offset
            }
        };
        self.tell_listener(next_offset);
    }

    /// Wakes the readers waiting for offsets below `next_offset`.
    pub(crate) fn tell_listener(&self, next_offset: u64) {
        let listener = self.listener.lock().clone();
        if let Some(listener) = listener {
            listener(next_offset);
        }
    }

    /// Applies retention now (the age limit needs the clock; the server calls this now and then,
    /// and each segment roll calls it too); returns how many segments it deleted.
    pub fn evaluate_retention(&self, now_ms: i64) -> usize {
        let mut state = self.state.lock();
        let retired = state.retire_segments(now_ms);
        drop(state);
        self.unlink_segments(retired)
    }

    fn unlink_segments(&self, retired: Vec<u64>) -> usize {
        let count = retired.len();
        let mut writer = self.writer.lock();
        for segment in retired {
            if let Some((written, data, index)) = writer.files {
                if written == segment {
                    self.cache.remove(data);
                    self.cache.remove(index);
                    writer.files = None;
                }
            }
            for name in [index::segment_file_name(segment), index::index_file_name(segment)] {
                crate::janitor::unlink(self.file_system.clone(), self.directory.join(name));
            }
        }
        count
    }

    /// Deletes the stream and its files (the directory is renamed away and removed by the
    /// janitor). Appends and reads fail from now on.
    pub fn delete(&self) -> Result<(), StreamError> {
        {
            let mut state = self.state.lock();
            state.deleted = true;
            state.pending.clear();
            state.open_chunk = None;
        }
        let mut writer = self.writer.lock();
        if let Some((_, data, index)) = writer.files.take() {
            self.cache.remove(data);
            self.cache.remove(index);
        }
        writer.unsynced.clear();
        let mut doomed_name = self.directory.file_name().unwrap_or_default().to_os_string();
        doomed_name.push(format!(".{:016x}.deleted", crate::entropy::random_u64()));
        let doomed = self.directory.with_file_name(doomed_name);
        match self.file_system.rename(&self.directory, &doomed) {
            Ok(()) => {
                crate::janitor::remove_directory(self.file_system.clone(), doomed);
                Ok(())
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(StorageError::io(&self.directory, error).into()),
        }
    }
}

impl StreamState {
    /// [`StreamState::check_open`], for this node's own appends.
    fn check_writable(&self) -> Result<(), StreamError> {
        self.check_open()?;
        if !self.writable {
            return Err(StreamError::NotWritable);
        }
        Ok(())
    }

    pub(crate) fn check_open(&self) -> Result<(), StreamError> {
        if self.deleted {
            return Err(StreamError::Deleted);
        }
        if self.replication.as_ref().is_some_and(|replication| replication.chunk_ends.len() >= UNREPLICATED_CHUNKS_MAX) {
            return Err(StreamError::ReplicationBehind { chunks: UNREPLICATED_CHUNKS_MAX });
        }
        Ok(())
    }

    /// A chunk's timestamp: the wall clock, never going back along the stream (timestamp
    /// lookups binary-search it).
    fn timestamp(&mut self, now_ms: i64) -> i64 {
        self.last_timestamp_ms = self.last_timestamp_ms.max(now_ms);
        self.last_timestamp_ms
    }

    pub(crate) fn active(&self) -> &SegmentState {
        self.segments.back().expect("a stream always has a segment")
    }

    /// Adds a new (empty) segment starting at `first_offset`, its files to be created.
    pub(crate) fn plan_segment(&mut self, first_offset: u64) {
        self.segments.push_back(SegmentState::empty(first_offset));
        self.pending.push(PendingWrite {
            segment: first_offset,
            create: true,
            data_position: FILE_HEADER_BYTES,
            data: Vec::new(),
            index_position: FILE_HEADER_BYTES,
            index: Vec::new(),
        });
    }

    /// Where the next chunk goes: the active segment, or a new one when it is full (which
    /// starts with a tracking snapshot when anything is tracked).
    fn place(&mut self, now_ms: i64) -> (u64, u64) {
        let active = self.active();
        let full =
            active.chunks > 0 && (active.bytes >= self.settings.segment_bytes_max || active.chunks >= self.settings.segment_chunks_max);
        if full {
            self.rolled = true;
            self.plan_segment(self.next_offset);
            if !self.tracking.is_empty() {
                let first_offset = self.segments.front().map_or(0, |segment| segment.first_offset);
                let blocks = self.tracking.snapshot(first_offset);
                let mut data = Vec::with_capacity(blocks.len() + chunk::SIMPLE_ENTRY_HEADER_BYTES);
                // A snapshot is bounded by the tracking limits, far below an entry's.
                if chunk::put_simple_entry(&mut data, &blocks).is_ok() {
                    self.push_chunk(ChunkType::TrackingSnapshot, &data, 1, 1, &[], now_ms);
                }
            }
        }
        let active = self.active();
        (active.first_offset, active.bytes)
    }

    /// The pending write that continues at `position` of `segment`, or a new one there.
    pub(crate) fn pending_for(&mut self, segment: u64, position: u64) -> &mut PendingWrite {
        let continues =
            self.pending.last().is_some_and(|last| last.segment == segment && last.data_position + last.data.len() as u64 == position);
        if !continues {
            let index_position = self.active().index_bytes;
            self.pending.push(PendingWrite {
                segment,
                create: false,
                data_position: position,
                data: Vec::new(),
                index_position,
                index: Vec::new(),
            });
        }
        self.pending.last_mut().expect("just ensured")
    }

    /// Appends a whole chunk; returns its first offset.
    fn push_chunk(&mut self, chunk_type: ChunkType, data: &[u8], entries: u16, records: u32, trailer: &[u8], now_ms: i64) -> u64 {
        self.close_open_chunk();
        let (segment, position) = self.place(now_ms);
        let header = ChunkHeader {
            chunk_type,
            entries,
            records,
            timestamp_ms: self.timestamp(now_ms),
            epoch: self.epoch,
            first_offset: self.next_offset,
            data_crc: chunk::data_crc(data),
            data_bytes: data.len() as u32,
            trailer_bytes: trailer.len() as u32,
            filter_bytes: 0,
        };
        let write = self.pending_for(segment, position);
        write.data.extend_from_slice(&header.encode());
        write.data.extend_from_slice(data);
        write.data.extend_from_slice(trailer);
        self.next_offset = header.next_offset();
        self.record_chunk(&header, position);
        header.first_offset
    }

    /// Counts a chunk whose bytes are in the pending write: its index entry, its segment's size,
    /// chunk count and timestamps, the last user chunk.
    pub(crate) fn record_chunk(&mut self, header: &ChunkHeader, position: u64) {
        let entry = IndexEntry::for_chunk(header, position);
        let write = self.pending.last_mut().expect("the chunk's write is pending");
        write.index.extend_from_slice(&entry.encode());
        let segment = self.segments.back_mut().expect("a stream always has a segment");
        segment.bytes = position + header.chunk_bytes();
        segment.index_bytes += INDEX_ENTRY_BYTES as u64;
        segment.chunks += 1;
        segment.next_offset = header.next_offset();
        segment.first_timestamp_ms.get_or_insert(header.timestamp_ms);
        segment.last_timestamp_ms = header.timestamp_ms;
        segment.last_epoch = header.epoch;
        if header.chunk_type == ChunkType::User {
            self.last_user_chunk = Some(ChunkPoint { chunk_id: header.first_offset, segment: segment.first_offset, position });
        }
        if let Some(replication) = self.replication.as_mut() {
            let segment = self.segments.back().expect("a stream always has a segment");
            replication.chunk_ends.push_back(CommitPoint {
                next_offset: header.next_offset(),
                segment: segment.first_offset,
                end_position: position + header.chunk_bytes(),
                index_end: segment.index_bytes,
                last_user_chunk: self.last_user_chunk,
            });
        }
    }

    fn append_record(&mut self, record: &[u8], now_ms: i64) {
        let full = self.open_chunk.as_ref().is_some_and(|open| {
            let data = self.pending.last().map_or(0, |write| write.data.len() - open.header_at - CHUNK_HEADER_BYTES);
            data + record.len() > AMQP_CHUNK_BYTES_TARGET || open.entries as usize >= CHUNK_ENTRIES_MAX
        });
        if full {
            self.close_open_chunk();
        }
        if self.open_chunk.is_none() {
            let (segment, position) = self.place(now_ms);
            let timestamp_ms = self.timestamp(now_ms);
            let first_offset = self.next_offset;
            let write = self.pending_for(segment, position);
            let header_at = write.data.len();
            write.data.extend_from_slice(&[0u8; CHUNK_HEADER_BYTES]);
            self.open_chunk = Some(OpenChunk { header_at, position, first_offset, entries: 0, records: 0, timestamp_ms });
        }
        let write = self.pending.last_mut().expect("the open chunk's write is pending");
        write.data.extend_from_slice(&(record.len() as u32).to_be_bytes());
        write.data.extend_from_slice(record);
        let open = self.open_chunk.as_mut().expect("just opened");
        open.entries += 1;
        open.records += 1;
        self.next_offset += 1;
        let end = open.position + (write.data.len() - open.header_at) as u64;
        self.segments.back_mut().expect("a stream always has a segment").bytes = end;
    }

    /// Finishes the open chunk: its header (counts, CRC) and its index entry.
    pub(crate) fn close_open_chunk(&mut self) {
        let Some(open) = self.open_chunk.take() else { return };
        let write = self.pending.last_mut().expect("the open chunk's write is pending");
        let data = &write.data[open.header_at + CHUNK_HEADER_BYTES..];
        let header = ChunkHeader {
            chunk_type: ChunkType::User,
            entries: open.entries,
            records: open.records,
            timestamp_ms: open.timestamp_ms,
            epoch: self.epoch,
            first_offset: open.first_offset,
            data_crc: chunk::data_crc(data),
            data_bytes: data.len() as u32,
            trailer_bytes: 0,
            filter_bytes: 0,
        };
        write.data[open.header_at..open.header_at + CHUNK_HEADER_BYTES].copy_from_slice(&header.encode());
        self.record_chunk(&header, open.position);
    }

    /// What a batch taking everything appended so far commits.
    pub(crate) fn planned_point(&self) -> CommitPoint {
        let active = self.active();
        CommitPoint {
            next_offset: self.next_offset,
            segment: active.first_offset,
            end_position: active.bytes,
            index_end: active.index_bytes,
            last_user_chunk: self.last_user_chunk,
        }
    }

    /// Drops the oldest segments that retention no longer keeps; returns their names. Never the
    /// active segment, nor one holding chunks not committed yet.
    fn retire_segments(&mut self, now_ms: i64) -> Vec<u64> {
        let Retention { max_bytes, max_age_ms } = self.settings.retention;
        let mut retired = Vec::new();
        let mut total_bytes: u64 = self.segments.iter().map(|segment| segment.bytes).sum();
        while self.segments.len() > 1 {
            let oldest = &self.segments[0];
            let committed = oldest.next_offset <= self.committed.next_offset && oldest.first_offset != self.committed.segment;
            let too_big = max_bytes.is_some_and(|max| total_bytes > max);
            let too_old = max_age_ms.is_some_and(|max| oldest.chunks > 0 && oldest.last_timestamp_ms < now_ms.saturating_sub(max as i64));
            if !committed || !(too_big || too_old) {
                break;
            }
            total_bytes -= oldest.bytes;
            retired.push(oldest.first_offset);
            self.segments.pop_front();
            self.segments_retired += 1;
        }
        retired
    }
}
