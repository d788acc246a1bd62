//! One durable queue's message log: a directory of segment files of checksummed records.
//!
//! Record layout (all integers big-endian):
//!
//! ```text
//! length u32 | crc32c u32 | kind u8 | position u64 | payload
//! ```
//!
//! `length` counts kind, position and payload; the CRC covers the same bytes. Kinds: publish
//! (payload: exchange, routing key, property flags, properties, body), delivered (the message was
//! handed to a consumer, so it comes back with `redelivered` set) and settled (acked, rejected,
//! expired or purged). Records are buffered in memory and written by the syncer, which fdatasyncs
//! before any confirm goes out.
//!
//! A segment is named after the first queue position published into it (`{position:020}.seg`)
//! and holds the publishes of a contiguous range of positions; settle and delivered records go to
//! the newest segment whatever position they name. Each segment counts its unsettled publishes;
//! an older segment whose count reaches zero is deleted, so the log's size follows the backlog.
//! When a segment stops being the active one, a seal record with its length closes it.

use crate::range_set::RangeSet;
use crate::StorageError;
#[cfg(test)]
use amqp_codec::ShortStr;
use amqp_codec::{ContentHeader, Reader};
use broker_core::Message;
use bytes::{BufMut, Bytes, BytesMut};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const KIND_PUBLISH: u8 = 1;
const KIND_DELIVERED: u8 = 2;
const KIND_SETTLED: u8 = 3;
/// Closes a segment that is no longer active; its payload is the segment's length before it. An
/// older segment without its seal was truncated, even when the cut fell between two records.
const KIND_SEALED: u8 = 4;
/// A transient message written only because its queue was paging: read back while the broker
/// runs, ignored by recovery.
const KIND_PUBLISH_TRANSIENT: u8 = 5;
/// How much one tail read takes from a segment at a time.
const TAIL_READ_CHUNK_BYTES: usize = 1 << 20;
const RECORD_HEADER_BYTES: usize = 8;
/// No record may claim more than this; a larger length is corruption, not a message (RabbitMQ's
/// largest message is 512 MiB).
pub const RECORD_BYTES_MAX: usize = 600 * 1024 * 1024;
/// A segment takes new publishes until it holds this many bytes.
///
/// Small on purpose: deleting a settled segment makes the filesystem free its extents, and on
/// ext4 a concurrent fdatasync waits for that journal commit, so every deletion stalls confirms
/// in proportion to the segment's size. Measured at 38,000 msg/s of 1 KiB (send-ack p99): 64 MiB
/// 75-85 ms, 16 MiB 24 ms, 8 MiB 13 ms, no deletion 0.34 ms. Recycling segment files instead of
/// deleting them would remove the stall altogether.
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 8 * 1024 * 1024;
const SEGMENT_SUFFIX: &str = ".seg";
/// A settled segment waiting for the janitor; removed at recovery if a crash left it.
const DELETED_SUFFIX: &str = "deleted";

/// What recovery found in a log. Message bodies stay on disk: the queue reads them back through
/// the [`TailCursor`] of [`QueueLog::recovered_tail`], so a restart costs one scan of the log and
/// memory in proportion to the ranges, not to the messages.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Positions of unsettled persistent messages.
    pub live: RangeSet,
    /// How many positions `live` holds.
    pub live_count: u64,
    /// Positions that had been delivered before the restart.
    pub delivered: RangeSet,
    /// One past the highest position seen.
    pub next_position: u64,
    /// Segments whose tail was cut (torn or corrupt records), with the offset of the cut.
    pub truncated: Vec<(PathBuf, u64)>,
}

/// Where a record starts: its segment (by first position) and its offset in that file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RecordLocation {
    /// The segment's first position (its name).
    pub segment: u64,
    /// Byte offset in the segment.
    pub offset: u64,
}

/// Reads a queue's paged messages back in order. Publish records are yielded when their position
/// is at or past `floor`; before the recovered end, only the positions recovery found live.
#[derive(Debug)]
pub struct TailCursor {
    at: RecordLocation,
    floor: u64,
    recovered: Option<(RangeSet, RecordLocation)>,
}

impl TailCursor {
    /// A cursor for messages paged while the broker runs, starting at the first paged record.
    pub fn new(at: RecordLocation, floor: u64) -> TailCursor {
        TailCursor { at, floor, recovered: None }
    }
}

#[derive(Debug)]
struct Segment {
    first_position: u64,
    path: PathBuf,
    unsettled: u64,
}

/// An open queue log.
#[derive(Debug)]
pub struct QueueLog {
    directory: PathBuf,
    segments: Vec<Segment>,
    active: File,
    active_bytes: u64,
    segment_bytes_max: u64,
    pending: BytesMut,
    /// Older segments written since the last sync, which the next sync must cover too.
    unsynced: Vec<File>,
    deleted: bool,
}

fn segment_path(directory: &Path, first_position: u64) -> PathBuf {
    directory.join(format!("{first_position:020}{SEGMENT_SUFFIX}"))
}

fn list_segments(directory: &Path) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let mut segments = Vec::new();
    let entries = std::fs::read_dir(directory).map_err(|error| StorageError::io(directory, error))?;
    for entry in entries {
        let entry = entry.map_err(|error| StorageError::io(directory, error))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(&format!(".{DELETED_SUFFIX}")) {
            // A settled segment whose deletion a crash interrupted.
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        match name.strip_suffix(SEGMENT_SUFFIX).and_then(|stem| stem.parse::<u64>().ok()) {
            Some(first_position) => segments.push((first_position, entry.path())),
            None => {
                tracing::warn!(file = %entry.path().display(), "ignoring a file that is not a segment")
            }
        }
    }
    segments.sort();
    Ok(segments)
}

fn open_append(path: &Path) -> Result<File, StorageError> {
    OpenOptions::new().create(true).read(true).append(true).open(path).map_err(|error| StorageError::io(path, error))
}

impl QueueLog {
    /// Opens (creating) the log in `directory`, replays every segment, cuts invalid tails and
    /// deletes older segments with nothing unsettled.
    pub fn open(directory: &Path, segment_bytes_max: u64) -> Result<(QueueLog, Recovery), StorageError> {
        std::fs::create_dir_all(directory).map_err(|error| StorageError::io(directory, error))?;
        let mut replayed = Replayed::default();
        let mut segments = Vec::new();
        let mut recovery = Recovery::default();
        let listed = list_segments(directory)?;
        let last = listed.len().saturating_sub(1);
        for (index, (first_position, path)) in listed.into_iter().enumerate() {
            let file = open_append(&path)?;
            let replay = replay_segment(&path, &file, &mut replayed)?;
            if let Some(offset) = replay.cut_at {
                file.set_len(offset).map_err(|error| StorageError::io(&path, error))?;
                file.sync_all().map_err(|error| StorageError::io(&path, error))?;
                recovery.truncated.push((path.clone(), offset));
            } else if index < last && !replay.sealed {
                tracing::error!(file = %path.display(), offset = replay.end, "segment ends without its seal: it was truncated, messages after this offset are lost");
                recovery.truncated.push((path.clone(), replay.end));
            }
            segments.push(Segment { first_position, path, unsettled: 0 });
        }
        for index in 0..segments.len() {
            let end = segments.get(index + 1).map_or(u64::MAX, |next| next.first_position);
            segments[index].unsettled = replayed.live.count_in(segments[index].first_position, end);
        }
        recovery.next_position = replayed.next_position;
        recovery.live_count = replayed.live.count_in(0, u64::MAX);
        recovery.live = replayed.live;
        recovery.delivered = replayed.delivered;
        if segments.is_empty() {
            let path = segment_path(directory, recovery.next_position);
            segments.push(Segment { first_position: recovery.next_position, path, unsettled: 0 });
        }
        let active_path = segments.last().expect("at least one segment").path.clone();
        let active = open_append(&active_path)?;
        let active_bytes = active.metadata().map_err(|error| StorageError::io(&active_path, error))?.len();
        let mut log = QueueLog {
            directory: directory.to_path_buf(),
            segments,
            active,
            active_bytes,
            segment_bytes_max,
            pending: BytesMut::new(),
            unsynced: Vec::new(),
            deleted: false,
        };
        log.delete_settled_segments();
        Ok((log, recovery))
    }

    /// The directory.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// How many segment files the log has.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    fn append(&mut self, kind: u8, position: u64, payload: impl FnOnce(&mut BytesMut)) {
        if self.deleted {
            return;
        }
        let start = self.pending.len();
        self.pending.put_u32(0);
        self.pending.put_u32(0);
        self.pending.put_u8(kind);
        self.pending.put_u64(position);
        payload(&mut self.pending);
        let length = self.pending.len() - start - RECORD_HEADER_BYTES;
        assert!(length <= RECORD_BYTES_MAX, "record of {length} bytes");
        let checksum = crc32c::crc32c(&self.pending[start + RECORD_HEADER_BYTES..]);
        self.pending[start..start + 4].copy_from_slice(&(length as u32).to_be_bytes());
        self.pending[start + 4..start + 8].copy_from_slice(&checksum.to_be_bytes());
    }

    /// Buffers a publish record, starting a new segment first when the active one is full, and
    /// returns where the record starts. `persistent` records survive a restart; the others are
    /// only there to be read back while the queue pages.
    pub fn append_publish(&mut self, position: u64, message: &Message, persistent: bool) -> RecordLocation {
        if !self.deleted && self.active_bytes + self.pending.len() as u64 >= self.segment_bytes_max {
            if let Err(error) = self.roll_segment(position) {
                // Keep appending to the full segment rather than lose the record.
                tracing::error!(%error, "starting a new segment failed");
            }
        }
        let location = self.end_location();
        if self.deleted {
            return location;
        }
        let kind = if persistent { KIND_PUBLISH } else { KIND_PUBLISH_TRANSIENT };
        self.append(kind, position, |buffer| {
            buffer.put_u8(message.exchange.len() as u8);
            buffer.put_slice(message.exchange.as_bytes());
            buffer.put_u8(message.routing_key.len() as u8);
            buffer.put_slice(message.routing_key.as_bytes());
            buffer.put_u16(message.header.property_flags);
            buffer.put_u32(message.header.properties_raw.len() as u32);
            buffer.put_slice(&message.header.properties_raw);
            buffer.put_slice(&message.body);
        });
        let active = self.segments.last_mut().expect("a log always has an active segment");
        assert!(position >= active.first_position, "publish position {position} before its segment");
        active.unsettled += 1;
        location
    }

    /// Where the next record will start.
    pub fn end_location(&self) -> RecordLocation {
        let active = self.segments.last().expect("a log always has an active segment");
        RecordLocation { segment: active.first_position, offset: self.active_bytes + self.pending.len() as u64 }
    }

    /// A cursor over what recovery found live: from the first record up to where the log ended at
    /// open; past that, everything at or after `next_position` (paged after the restart).
    pub fn recovered_tail(&self, recovery: &Recovery) -> TailCursor {
        let start = RecordLocation { segment: self.segments[0].first_position, offset: 0 };
        TailCursor { at: start, floor: recovery.next_position, recovered: Some((recovery.live.clone(), self.end_location())) }
    }

    /// Reads up to `records_max` paged messages (and about `bytes_max` bytes) from `cursor`, in
    /// order. Fewer means the cursor reached the end of what is written.
    pub fn read_tail(
        &mut self,
        cursor: &mut TailCursor,
        records_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Message)>, StorageError> {
        self.write_to_active()?;
        let mut out = Vec::new();
        let mut bytes_read = 0usize;
        while out.len() < records_max && bytes_read < bytes_max {
            let index = self.segments.partition_point(|segment| segment.first_position < cursor.at.segment);
            let Some(segment) = self.segments.get(index) else { break };
            if segment.first_position != cursor.at.segment {
                // The cursor's segment was deleted (all settled): go on with the next one.
                cursor.at = RecordLocation { segment: segment.first_position, offset: 0 };
            }
            let is_active = index + 1 == self.segments.len();
            let path = segment.path.clone();
            let file_bytes =
                if is_active { self.active_bytes } else { std::fs::metadata(&path).map_err(|error| StorageError::io(&path, error))?.len() };
            if cursor.at.offset >= file_bytes {
                match self.segments.get(index + 1) {
                    Some(next) if !is_active => {
                        cursor.at = RecordLocation { segment: next.first_position, offset: 0 };
                        continue;
                    }
                    _ => break,
                }
            }
            let file = File::open(&path).map_err(|error| StorageError::io(&path, error))?;
            let chunk_bytes = (file_bytes - cursor.at.offset).min(TAIL_READ_CHUNK_BYTES as u64) as usize;
            let mut chunk = vec![0u8; chunk_bytes];
            file.read_exact_at(&mut chunk, cursor.at.offset).map_err(|error| StorageError::io(&path, error))?;
            let chunk = Bytes::from(chunk);
            let mut consumed = 0usize;
            while consumed + RECORD_HEADER_BYTES <= chunk.len() && out.len() < records_max && bytes_read < bytes_max {
                let length = u32::from_be_bytes(chunk[consumed..consumed + 4].try_into().expect("4 bytes")) as usize;
                let checksum = u32::from_be_bytes(chunk[consumed + 4..consumed + 8].try_into().expect("4 bytes"));
                if !(9..=RECORD_BYTES_MAX).contains(&length) {
                    return Err(StorageError::Corrupt {
                        path: path.display().to_string(),
                        detail: format!("bad record length at offset {}", cursor.at.offset),
                    });
                }
                let record = if consumed + RECORD_HEADER_BYTES + length <= chunk.len() {
                    chunk.slice(consumed + RECORD_HEADER_BYTES..consumed + RECORD_HEADER_BYTES + length)
                } else if consumed == 0 {
                    // A record larger than one chunk: read it whole.
                    let mut whole = vec![0u8; length];
                    file.read_exact_at(&mut whole, cursor.at.offset + RECORD_HEADER_BYTES as u64)
                        .map_err(|error| StorageError::io(&path, error))?;
                    Bytes::from(whole)
                } else {
                    break;
                };
                if crc32c::crc32c(&record) != checksum {
                    return Err(StorageError::Corrupt {
                        path: path.display().to_string(),
                        detail: format!("checksum mismatch at offset {}", cursor.at.offset),
                    });
                }
                let location = cursor.at;
                consumed += RECORD_HEADER_BYTES + length;
                cursor.at.offset += (RECORD_HEADER_BYTES + length) as u64;
                let kind = record[0];
                if kind != KIND_PUBLISH && kind != KIND_PUBLISH_TRANSIENT {
                    continue;
                }
                let position = u64::from_be_bytes(record[1..9].try_into().expect("9 bytes"));
                let wanted = match &cursor.recovered {
                    Some((live, end)) if location < *end => kind == KIND_PUBLISH && live.contains(position),
                    _ => position >= cursor.floor,
                };
                if !wanted {
                    continue;
                }
                let message = decode_publish(record.slice(9..)).ok_or_else(|| StorageError::Corrupt {
                    path: path.display().to_string(),
                    detail: format!("publish record does not parse at offset {}", location.offset),
                })?;
                bytes_read += length;
                out.push((position, message));
            }
            if let Some((_, end)) = &cursor.recovered {
                if cursor.at >= *end {
                    cursor.recovered = None;
                }
            }
        }
        Ok(out)
    }

    fn roll_segment(&mut self, first_position: u64) -> Result<(), StorageError> {
        let path = segment_path(&self.directory, first_position);
        let file = open_append(&path)?;
        let sealed_length = self.active_bytes + self.pending.len() as u64;
        self.append(KIND_SEALED, first_position, |buffer| buffer.put_u64(sealed_length));
        self.write_to_active()?;
        let previous = std::mem::replace(&mut self.active, file);
        self.unsynced.push(previous);
        self.active_bytes = 0;
        self.segments.push(Segment { first_position, path, unsettled: 0 });
        self.delete_settled_segments();
        Ok(())
    }

    /// Buffers a delivered marker.
    pub fn append_delivered(&mut self, position: u64) {
        self.append(KIND_DELIVERED, position, |_| {});
    }

    /// Buffers a settled record and releases the position from its segment.
    pub fn append_settled(&mut self, position: u64) {
        self.append(KIND_SETTLED, position, |_| {});
        let index = self.segments.partition_point(|segment| segment.first_position <= position);
        if index == 0 {
            return;
        }
        let segment = &mut self.segments[index - 1];
        if segment.unsettled > 0 {
            segment.unsettled -= 1;
            if segment.unsettled == 0 && index == 1 {
                self.delete_settled_segments();
            }
        }
    }

    /// Deletes the oldest segments while they hold nothing unsettled (never the active one).
    ///
    /// Only from the front, in order: a settle record lives in the segment that was active when
    /// it was written, and may name a publish in any older segment. Deleting a newer segment
    /// while an older one survives could take such a settle record with it and bring its
    /// message back at recovery.
    fn delete_settled_segments(&mut self) {
        while self.segments.len() > 1 && self.segments[0].unsettled == 0 {
            let segment = self.segments.remove(0);
            // Renaming is a cheap metadata change; the slow unlink happens off the message path
            // (see janitor.rs). The new name cannot collide with a segment a redeclared queue of
            // the same name creates meanwhile.
            let doomed = segment.path.with_extension(DELETED_SUFFIX);
            match std::fs::rename(&segment.path, &doomed) {
                Ok(()) => crate::janitor::unlink(doomed),
                Err(error) => tracing::error!(file = %segment.path.display(), %error, "retiring a settled segment failed"),
            }
        }
    }

    /// Whether records wait to be written.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || !self.unsynced.is_empty()
    }

    /// Writes the buffered records to the active segment. A failed write (ENOSPC, EIO) may leave
    /// part of a record behind; the file is cut back to its last whole record so a later write
    /// does not append after garbage, and the records stay buffered for the next attempt.
    fn write_to_active(&mut self) -> Result<(), StorageError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = &self.segments.last().expect("active segment").path;
        if let Err(error) = self.active.write_all(&self.pending) {
            if let Err(cut_error) = self.active.set_len(self.active_bytes) {
                tracing::error!(file = %path.display(), %cut_error, "cutting a failed write back failed; recovery will cut it by checksum");
            }
            return Err(StorageError::io(path, error));
        }
        self.active_bytes += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }
    /// Writes the buffered records; returns the files to fdatasync outside the caller's lock.
    pub fn write_pending(&mut self) -> Result<Vec<File>, StorageError> {
        if self.deleted {
            return Ok(Vec::new());
        }
        self.write_to_active()?;
        let mut files = std::mem::take(&mut self.unsynced);
        let path = &self.segments.last().expect("active segment").path;
        files.push(self.active.try_clone().map_err(|error| StorageError::io(path, error))?);
        Ok(files)
    }

    /// Deletes every segment (queue deleted); later appends are dropped.
    pub fn delete(&mut self) -> Result<(), StorageError> {
        self.deleted = true;
        self.pending.clear();
        self.unsynced.clear();
        match std::fs::remove_dir_all(&self.directory) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(StorageError::io(&self.directory, error)),
        }
    }
}

/// Replay state across the segments of one log.
#[derive(Default)]
struct Replayed {
    /// Unsettled persistent publishes.
    live: RangeSet,
    /// Live positions handed out before the restart.
    delivered: RangeSet,
    next_position: u64,
}

/// What replaying one segment found.
struct SegmentReplay {
    /// Where to cut the file, if its tail is torn or corrupt.
    cut_at: Option<u64>,
    /// Whether it ends with a valid seal.
    sealed: bool,
    /// The offset after the last valid record.
    end: u64,
}

/// Replays one segment into `replayed`.
fn replay_segment(path: &Path, file: &File, replayed: &mut Replayed) -> Result<SegmentReplay, StorageError> {
    let mut reader = BufReader::with_capacity(1 << 20, file.try_clone().map_err(|error| StorageError::io(path, error))?);
    let mut offset = 0u64;
    let mut sealed = false;
    let cut = |offset: u64| Ok(SegmentReplay { cut_at: Some(offset), sealed: false, end: offset });
    loop {
        let mut header = [0u8; RECORD_HEADER_BYTES];
        match read_full(&mut reader, &mut header) {
            Ok(0) => return Ok(SegmentReplay { cut_at: None, sealed, end: offset }),
            Ok(count) if count < RECORD_HEADER_BYTES => {
                tracing::warn!(file = %path.display(), offset, "torn record header at the segment's tail; truncating");
                return cut(offset);
            }
            Ok(_) => {}
            Err(error) => return Err(StorageError::io(path, error)),
        }
        let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let checksum = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        if !(9..=RECORD_BYTES_MAX).contains(&length) {
            tracing::error!(file = %path.display(), offset, length, "record with an impossible length; truncating the segment here");
            return cut(offset);
        }
        let mut record = vec![0u8; length];
        let count = read_full(&mut reader, &mut record).map_err(|error| StorageError::io(path, error))?;
        if count < length || crc32c::crc32c(&record) != checksum {
            tracing::error!(file = %path.display(), offset, "torn or corrupt record (checksum mismatch); truncating the segment here");
            return cut(offset);
        }
        let kind = record[0];
        let position = u64::from_be_bytes(record[1..9].try_into().expect("length checked above"));
        match kind {
            KIND_PUBLISH | KIND_PUBLISH_TRANSIENT => {
                // Check the payload parses now, so a bad record is cut here rather than found later.
                if decode_publish(Bytes::from(record).slice(9..)).is_none() {
                    tracing::error!(file = %path.display(), offset, "publish record does not parse; truncating the segment here");
                    return cut(offset);
                }
                replayed.next_position = replayed.next_position.max(position + 1);
                if kind == KIND_PUBLISH {
                    replayed.live.insert(position);
                }
            }
            KIND_DELIVERED => {
                if replayed.live.contains(position) {
                    replayed.delivered.insert(position);
                }
            }
            KIND_SETTLED => {
                replayed.live.remove(position);
                replayed.delivered.remove(position);
            }
            KIND_SEALED if record.len() == 17 && u64::from_be_bytes(record[9..17].try_into().expect("17 bytes")) == offset => {
                sealed = true;
            }
            other => {
                tracing::error!(file = %path.display(), offset, kind = other, "unknown record kind; truncating the segment here");
                return cut(offset);
            }
        }
        offset += (RECORD_HEADER_BYTES + length) as u64;
    }
}

fn read_full(reader: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

fn decode_publish(payload: Bytes) -> Option<Message> {
    let mut reader = Reader::new(payload);
    let exchange = reader.read_short_str().ok()?;
    let routing_key = reader.read_short_str().ok()?;
    let property_flags = reader.read_u16().ok()?;
    let properties_raw = reader.read_long_str().ok()?.0;
    let body = reader.take(reader.remaining()).ok()?;
    let header = ContentHeader { class_id: 60, body_size: body.len() as u64, property_flags, properties_raw };
    Some(Message { exchange, routing_key, header, body })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::BasicProperties;

    fn message(body: &str) -> Message {
        let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
        Message {
            exchange: ShortStr::from("x"),
            routing_key: ShortStr::from("k"),
            header: ContentHeader::from_properties(60, body.len() as u64, &properties),
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    /// Everything recovery found, read back through the tail: (position, body, delivered).
    fn recovered(log: &mut QueueLog, recovery: &Recovery) -> Vec<(u64, Bytes, bool)> {
        let mut cursor = log.recovered_tail(recovery);
        let messages = log.read_tail(&mut cursor, usize::MAX, usize::MAX).expect("read tail");
        messages.into_iter().map(|(position, message)| (position, message.body, recovery.delivered.contains(position))).collect()
    }

    fn temporary_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lepus-log-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn replays_unsettled_messages_with_delivered_marks() {
        let path = temporary_dir("replay").join("q");
        let (mut log, recovery) = QueueLog::open(&path, SEGMENT_BYTES_MAX_DEFAULT).expect("open");
        assert_eq!(recovery.live_count, 0);
        for position in 0..3 {
            log.append_publish(position, &message(&format!("m{position}")), true);
        }
        log.append_delivered(1);
        log.append_settled(0);
        log.write_pending().expect("write");
        drop(log);
        let (mut log, recovery) = QueueLog::open(&path, SEGMENT_BYTES_MAX_DEFAULT).expect("reopen");
        assert_eq!(recovered(&mut log, &recovery), vec![(1, Bytes::from("m1"), true), (2, Bytes::from("m2"), false)]);
        assert_eq!(recovery.next_position, 3);
        assert_eq!(recovery.live_count, 2);
    }

    fn only_segment(directory: &Path) -> PathBuf {
        let segments = list_segments(directory).expect("list");
        assert_eq!(segments.len(), 1);
        segments[0].1.clone()
    }

    #[test]
    fn torn_tail_and_flipped_byte_are_cut() {
        let directory = temporary_dir("torn").join("q");
        let (mut log, _) = QueueLog::open(&directory, SEGMENT_BYTES_MAX_DEFAULT).expect("open");
        log.append_publish(0, &message("keep"), true);
        log.append_publish(1, &message("torn"), true);
        log.write_pending().expect("write");
        drop(log);
        let path = only_segment(&directory);
        let full = std::fs::metadata(&path).expect("meta").len();
        // Flip a byte in the second record's body: its checksum no longer matches.
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let (mut log, recovery) = QueueLog::open(&directory, SEGMENT_BYTES_MAX_DEFAULT).expect("reopen");
        assert_eq!(recovered(&mut log, &recovery), vec![(0, Bytes::from("keep"), false)]);
        drop(log);
        let (cut_path, cut) = recovery.truncated[0].clone();
        assert_eq!(cut_path, path);
        assert!(cut < full);
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), cut);
        // Half a header at the tail is cut too.
        std::fs::OpenOptions::new().append(true).open(&path).expect("open").write_all(&[0, 0, 1]).expect("append");
        let (_, recovery) = QueueLog::open(&directory, SEGMENT_BYTES_MAX_DEFAULT).expect("reopen again");
        assert_eq!(recovery.truncated, vec![(path, cut)]);
        assert_eq!(recovery.live_count, 1);
    }

    #[test]
    fn settled_segments_are_deleted_and_a_missing_one_loses_only_itself() {
        let directory = temporary_dir("segments").join("q");
        // Tiny segments: every publish starts a new one.
        let (mut log, _) = QueueLog::open(&directory, 1).expect("open");
        for position in 0..4 {
            log.append_publish(position, &message(&format!("m{position}")), true);
            log.write_pending().expect("write");
        }
        assert_eq!(log.segment_count(), 4);
        log.append_settled(0);
        log.append_settled(2);
        log.write_pending().expect("write");
        assert_eq!(log.segment_count(), 3, "segment 0 goes; segment 2 waits behind segment 1, which is unsettled");
        log.append_settled(1);
        assert_eq!(log.segment_count(), 1, "then 1 and 2 go, the active one stays");
        log.append_publish(4, &message("m4"), true);
        log.append_publish(5, &message("m5"), true);
        log.write_pending().expect("write");
        drop(log);
        let (mut log, recovery) = QueueLog::open(&directory, 1).expect("reopen");
        let positions: Vec<u64> = recovered(&mut log, &recovery).into_iter().map(|(position, _, _)| position).collect();
        assert_eq!(positions, vec![3, 4, 5]);
        drop(log);
        // A segment file that disappears takes only its own messages with it.
        std::fs::remove_file(segment_path(&directory, 4)).expect("remove");
        let (mut log, recovery) = QueueLog::open(&directory, 1).expect("reopen after loss");
        let positions: Vec<u64> = recovered(&mut log, &recovery).into_iter().map(|(position, _, _)| position).collect();
        assert_eq!(positions, vec![3, 5]);
        assert_eq!(recovery.next_position, 6);
    }

    #[test]
    fn paged_tail_reads_back_in_order_across_segments_and_skips_the_rest() {
        let directory = temporary_dir("tail").join("q");
        let (mut log, _) = QueueLog::open(&directory, 200).expect("open");
        // Position 0 stays in memory (not paged); 1.. are paged, one of them transient.
        log.append_publish(0, &message("in memory"), true);
        let start = log.append_publish(1, &message("p1"), true);
        log.append_delivered(0);
        log.append_publish(2, &message("p2"), false);
        for position in 3..40 {
            log.append_publish(position, &message(&format!("p{position}")), true);
        }
        assert!(log.segment_count() > 3, "small segments roll over");
        let mut cursor = TailCursor::new(start, 1);
        let mut read = Vec::new();
        loop {
            let batch = log.read_tail(&mut cursor, 7, usize::MAX).expect("read");
            if batch.is_empty() {
                break;
            }
            read.extend(batch.into_iter().map(|(position, message)| (position, message.body)));
        }
        let expected: Vec<(u64, Bytes)> = (1..40).map(|position| (position, Bytes::from(format!("p{position}")))).collect();
        assert_eq!(read, expected);
        // After a restart the transient record is gone and the rest comes back through recovery.
        drop(log);
        let (mut log, recovery) = QueueLog::open(&directory, 200).expect("reopen");
        let positions: Vec<u64> = recovered(&mut log, &recovery).into_iter().map(|(position, _, _)| position).collect();
        let expected: Vec<u64> = (0..40).filter(|position| *position != 2).collect();
        assert_eq!(positions, expected);
    }

    mod model {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeMap;

        #[derive(Debug, Clone)]
        enum Operation {
            Publish { persistent: bool, body_bytes: usize },
            Deliver(usize),
            Settle(usize),
            Reopen,
        }

        fn operation() -> impl Strategy<Value = Operation> {
            prop_oneof![
                4 => (any::<bool>(), 0usize..300).prop_map(|(persistent, body_bytes)| Operation::Publish { persistent, body_bytes }),
                1 => any::<usize>().prop_map(Operation::Deliver),
                3 => any::<usize>().prop_map(Operation::Settle),
                1 => Just(Operation::Reopen),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
            /// The log against a model of live messages: after any mix of publishes (persistent
            /// or not), deliveries, settles, segment roll-overs and deletions, and reopenings,
            /// recovery finds exactly the persistent unsettled messages, with their bodies and
            /// delivered flags, and never keeps a segment that holds nothing live.
            #[test]
            fn recovery_matches_the_model(operations in proptest::collection::vec(operation(), 1..120), segment_bytes in 64u64..2048) {
                let directory = temporary_dir(&format!("model-{}", rand_suffix())).join("q");
                let (mut log, _) = QueueLog::open(&directory, segment_bytes).expect("open");
                // position -> (body, persistent, delivered)
                let mut live: BTreeMap<u64, (Bytes, bool, bool)> = BTreeMap::new();
                let mut next = 0u64;
                for operation in operations {
                    match operation {
                        Operation::Publish { persistent, body_bytes } => {
                            let body = format!("{next}:{}", "x".repeat(body_bytes));
                            log.append_publish(next, &message(&body), persistent);
                            live.insert(next, (Bytes::from(body), persistent, false));
                            next += 1;
                        }
                        Operation::Deliver(index) if !live.is_empty() => {
                            let position = *live.keys().nth(index % live.len()).expect("non-empty");
                            log.append_delivered(position);
                            live.get_mut(&position).expect("present").2 = true;
                        }
                        Operation::Settle(index) if !live.is_empty() => {
                            let position = *live.keys().nth(index % live.len()).expect("non-empty");
                            log.append_settled(position);
                            live.remove(&position);
                        }
                        Operation::Reopen => {
                            log.write_pending().expect("write");
                            drop(log);
                            let (reopened, recovery) = QueueLog::open(&directory, segment_bytes).expect("reopen");
                            log = reopened;
                            // Transient messages do not survive a restart.
                            live.retain(|_, (_, persistent, _)| *persistent);
                            prop_assert_eq!(recovery.live_count, live.len() as u64);
                            next = next.max(recovery.next_position);
                        }
                        _ => {}
                    }
                }
                log.write_pending().expect("write");
                drop(log);
                let (mut log, recovery) = QueueLog::open(&directory, segment_bytes).expect("final open");
                let expected: Vec<(u64, Bytes, bool)> =
                    live.iter().filter(|(_, (_, persistent, _))| *persistent).map(|(position, (body, _, delivered))| (*position, body.clone(), *delivered)).collect();
                prop_assert_eq!(recovered(&mut log, &recovery), expected.clone());
                // Nothing settled stays at the front: the oldest segment holds the oldest live
                // message, or is the only (active) one.
                match expected.first() {
                    None => prop_assert_eq!(log.segment_count(), 1),
                    Some((oldest_live, _, _)) if log.segments.len() > 1 => {
                        prop_assert!(log.segments[0].first_position <= *oldest_live && *oldest_live < log.segments[1].first_position);
                    }
                    Some(_) => {}
                }
                let _ = std::fs::remove_dir_all(directory.parent().expect("temp dir"));
            }
        }

        fn rand_suffix() -> u64 {
            use std::sync::atomic::{AtomicU64, Ordering};
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            COUNTER.fetch_add(1, Ordering::Relaxed)
        }
    }
}
