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

use crate::StorageError;
#[cfg(test)]
use amqp_codec::ShortStr;
use amqp_codec::{ContentHeader, Reader};
use broker_core::Message;
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const KIND_PUBLISH: u8 = 1;
const KIND_DELIVERED: u8 = 2;
const KIND_SETTLED: u8 = 3;
/// Closes a segment that is no longer active; its payload is the segment's length before it. An
/// older segment without its seal was truncated, even when the cut fell between two records.
const KIND_SEALED: u8 = 4;
const RECORD_HEADER_BYTES: usize = 8;
/// No record may claim more than this; a larger length is corruption, not a message (RabbitMQ's
/// largest message is 512 MiB).
pub const RECORD_BYTES_MAX: usize = 600 * 1024 * 1024;
/// A segment takes new publishes until it holds this many bytes.
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
const SEGMENT_SUFFIX: &str = ".seg";

/// A message recovered from a log.
#[derive(Debug)]
pub struct RecoveredMessage {
    /// Its queue position.
    pub position: u64,
    /// The message.
    pub message: Arc<Message>,
    /// Whether it had been delivered before the restart.
    pub delivered: bool,
}

/// What recovery found in a log.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Unsettled messages in position order.
    pub messages: Vec<RecoveredMessage>,
    /// One past the highest position seen.
    pub next_position: u64,
    /// Segments whose tail was cut (torn or corrupt records), with the offset of the cut.
    pub truncated: Vec<(PathBuf, u64)>,
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
    let entries =
        std::fs::read_dir(directory).map_err(|error| StorageError::io(directory, error))?;
    for entry in entries {
        let entry = entry.map_err(|error| StorageError::io(directory, error))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        match name
            .strip_suffix(SEGMENT_SUFFIX)
            .and_then(|stem| stem.parse::<u64>().ok())
        {
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
    OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)
        .map_err(|error| StorageError::io(path, error))
}

impl QueueLog {
    /// Opens (creating) the log in `directory`, replays every segment, cuts invalid tails and
    /// deletes older segments with nothing unsettled.
    pub fn open(
        directory: &Path,
        segment_bytes_max: u64,
    ) -> Result<(QueueLog, Recovery), StorageError> {
        std::fs::create_dir_all(directory).map_err(|error| StorageError::io(directory, error))?;
        let mut replayed = Replayed::default();
        let mut segments = Vec::new();
        let mut recovery = Recovery::default();
        let listed = list_segments(directory)?;
        let last = listed.len().saturating_sub(1);
        for (index, (first_position, path)) in listed.into_iter().enumerate() {
            let file = open_append(&path)?;
            let replay = replay_segment(&path, &file, segments.len(), &mut replayed)?;
            if let Some(offset) = replay.cut_at {
                file.set_len(offset)
                    .map_err(|error| StorageError::io(&path, error))?;
                file.sync_all()
                    .map_err(|error| StorageError::io(&path, error))?;
                recovery.truncated.push((path.clone(), offset));
            } else if index < last && !replay.sealed {
                tracing::error!(file = %path.display(), offset = replay.end, "segment ends without its seal: it was truncated, messages after this offset are lost");
                recovery.truncated.push((path.clone(), replay.end));
            }
            segments.push(Segment {
                first_position,
                path,
                unsettled: 0,
            });
        }
        for (segment, _, _) in replayed.published.values() {
            segments[*segment].unsettled += 1;
        }
        recovery.next_position = replayed.next_position;
        recovery.messages = replayed
            .published
            .into_iter()
            .map(|(position, (_, message, delivered))| RecoveredMessage {
                position,
                message,
                delivered,
            })
            .collect();
        if segments.is_empty() {
            let path = segment_path(directory, recovery.next_position);
            segments.push(Segment {
                first_position: recovery.next_position,
                path,
                unsettled: 0,
            });
        }
        let active_path = segments.last().expect("at least one segment").path.clone();
        let active = open_append(&active_path)?;
        let active_bytes = active
            .metadata()
            .map_err(|error| StorageError::io(&active_path, error))?
            .len();
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

    /// Buffers a publish record, starting a new segment first when the active one is full.
    pub fn append_publish(&mut self, position: u64, message: &Message) {
        if self.deleted {
            return;
        }
        if self.active_bytes + self.pending.len() as u64 >= self.segment_bytes_max {
            if let Err(error) = self.roll_segment(position) {
                // Keep appending to the full segment rather than lose the record.
                tracing::error!(%error, "starting a new segment failed");
            }
        }
        self.append(KIND_PUBLISH, position, |buffer| {
            buffer.put_u8(message.exchange.len() as u8);
            buffer.put_slice(message.exchange.as_bytes());
            buffer.put_u8(message.routing_key.len() as u8);
            buffer.put_slice(message.routing_key.as_bytes());
            buffer.put_u16(message.header.property_flags);
            buffer.put_u32(message.header.properties_raw.len() as u32);
            buffer.put_slice(&message.header.properties_raw);
            buffer.put_slice(&message.body);
        });
        let active = self
            .segments
            .last_mut()
            .expect("a log always has an active segment");
        assert!(
            position >= active.first_position,
            "publish position {position} before its segment"
        );
        active.unsettled += 1;
    }

    fn roll_segment(&mut self, first_position: u64) -> Result<(), StorageError> {
        let path = segment_path(&self.directory, first_position);
        let file = open_append(&path)?;
        let sealed_length = self.active_bytes + self.pending.len() as u64;
        self.append(KIND_SEALED, first_position, |buffer| {
            buffer.put_u64(sealed_length)
        });
        self.write_to_active()?;
        let previous = std::mem::replace(&mut self.active, file);
        self.unsynced.push(previous);
        self.active_bytes = 0;
        self.segments.push(Segment {
            first_position,
            path,
            unsettled: 0,
        });
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
        let index = self
            .segments
            .partition_point(|segment| segment.first_position <= position);
        if index == 0 {
            return;
        }
        let segment = &mut self.segments[index - 1];
        if segment.unsettled > 0 {
            segment.unsettled -= 1;
            if segment.unsettled == 0 && index < self.segments.len() {
                self.delete_settled_segments();
            }
        }
    }

    /// Deletes older segments that hold nothing unsettled (never the active one).
    fn delete_settled_segments(&mut self) {
        let mut index = 0;
        while index + 1 < self.segments.len() {
            if self.segments[index].unsettled == 0 {
                let segment = self.segments.remove(index);
                if let Err(error) = std::fs::remove_file(&segment.path) {
                    tracing::error!(file = %segment.path.display(), %error, "deleting a settled segment failed");
                }
            } else {
                index += 1;
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
        files.push(
            self.active
                .try_clone()
                .map_err(|error| StorageError::io(path, error))?,
        );
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
    /// Unsettled publishes: position -> (segment index, message, delivered).
    published: BTreeMap<u64, (usize, Arc<Message>, bool)>,
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
fn replay_segment(
    path: &Path,
    file: &File,
    segment: usize,
    replayed: &mut Replayed,
) -> Result<SegmentReplay, StorageError> {
    let mut reader = BufReader::with_capacity(
        1 << 20,
        file.try_clone()
            .map_err(|error| StorageError::io(path, error))?,
    );
    let mut offset = 0u64;
    let mut sealed = false;
    let cut = |offset: u64| {
        Ok(SegmentReplay {
            cut_at: Some(offset),
            sealed: false,
            end: offset,
        })
    };
    loop {
        let mut header = [0u8; RECORD_HEADER_BYTES];
        match read_full(&mut reader, &mut header) {
            Ok(0) => {
                return Ok(SegmentReplay {
                    cut_at: None,
                    sealed,
                    end: offset,
                })
            }
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
        let count =
            read_full(&mut reader, &mut record).map_err(|error| StorageError::io(path, error))?;
        if count < length || crc32c::crc32c(&record) != checksum {
            tracing::error!(file = %path.display(), offset, "torn or corrupt record (checksum mismatch); truncating the segment here");
            return cut(offset);
        }
        let kind = record[0];
        let position = u64::from_be_bytes(record[1..9].try_into().expect("length checked above"));
        match kind {
            KIND_PUBLISH => match decode_publish(Bytes::from(record).slice(9..)) {
                Some(message) => {
                    replayed.next_position = replayed.next_position.max(position + 1);
                    replayed
                        .published
                        .insert(position, (segment, Arc::new(message), false));
                }
                None => {
                    tracing::error!(file = %path.display(), offset, "publish record does not parse; truncating the segment here");
                    return cut(offset);
                }
            },
            KIND_DELIVERED => {
                if let Some(entry) = replayed.published.get_mut(&position) {
                    entry.2 = true;
                }
            }
            KIND_SETTLED => {
                replayed.published.remove(&position);
            }
            KIND_SEALED
                if record.len() == 17
                    && u64::from_be_bytes(record[9..17].try_into().expect("17 bytes"))
                        == offset =>
            {
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
    let header = ContentHeader {
        class_id: 60,
        body_size: body.len() as u64,
        property_flags,
        properties_raw,
    };
    Some(Message {
        exchange,
        routing_key,
        header,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::BasicProperties;

    fn message(body: &str) -> Message {
        let properties = BasicProperties {
            delivery_mode: Some(2),
            ..Default::default()
        };
        Message {
            exchange: ShortStr::from("x"),
            routing_key: ShortStr::from("k"),
            header: ContentHeader::from_properties(60, body.len() as u64, &properties),
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    fn temporary_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("lepus-log-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn replays_unsettled_messages_with_delivered_marks() {
        let path = temporary_dir("replay").join("q");
        let (mut log, recovery) = QueueLog::open(&path, SEGMENT_BYTES_MAX_DEFAULT).expect("open");
        assert!(recovery.messages.is_empty());
        for position in 0..3 {
            log.append_publish(position, &message(&format!("m{position}")));
        }
        log.append_delivered(1);
        log.append_settled(0);
        log.write_pending().expect("write");
        drop(log);
        let (_, recovery) = QueueLog::open(&path, SEGMENT_BYTES_MAX_DEFAULT).expect("reopen");
        let bodies: Vec<(u64, Bytes, bool)> = recovery
            .messages
            .iter()
            .map(|m| (m.position, m.message.body.clone(), m.delivered))
            .collect();
        assert_eq!(
            bodies,
            vec![(1, Bytes::from("m1"), true), (2, Bytes::from("m2"), false)]
        );
        assert_eq!(recovery.next_position, 3);
        assert_eq!(recovery.messages[0].message.as_ref(), &message("m1"));
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
        log.append_publish(0, &message("keep"));
        log.append_publish(1, &message("torn"));
        log.write_pending().expect("write");
        drop(log);
        let path = only_segment(&directory);
        let full = std::fs::metadata(&path).expect("meta").len();
        // Flip a byte in the second record's body: its checksum no longer matches.
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let (_, recovery) = QueueLog::open(&directory, SEGMENT_BYTES_MAX_DEFAULT).expect("reopen");
        assert_eq!(recovery.messages.len(), 1);
        assert_eq!(recovery.messages[0].message.body, Bytes::from("keep"));
        let (cut_path, cut) = recovery.truncated[0].clone();
        assert_eq!(cut_path, path);
        assert!(cut < full);
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), cut);
        // Half a header at the tail is cut too.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open")
            .write_all(&[0, 0, 1])
            .expect("append");
        let (_, recovery) =
            QueueLog::open(&directory, SEGMENT_BYTES_MAX_DEFAULT).expect("reopen again");
        assert_eq!(recovery.truncated, vec![(path, cut)]);
        assert_eq!(recovery.messages.len(), 1);
    }

    #[test]
    fn settled_segments_are_deleted_and_a_missing_one_loses_only_itself() {
        let directory = temporary_dir("segments").join("q");
        // Tiny segments: every publish starts a new one.
        let (mut log, _) = QueueLog::open(&directory, 1).expect("open");
        for position in 0..4 {
            log.append_publish(position, &message(&format!("m{position}")));
            log.write_pending().expect("write");
        }
        assert_eq!(log.segment_count(), 4);
        log.append_settled(0);
        log.append_settled(2);
        log.write_pending().expect("write");
        assert_eq!(
            log.segment_count(),
            2,
            "segments 0 and 2 hold nothing unsettled"
        );
        drop(log);
        let (_, recovery) = QueueLog::open(&directory, 1).expect("reopen");
        let positions: Vec<u64> = recovery.messages.iter().map(|m| m.position).collect();
        assert_eq!(positions, vec![1, 3]);
        // A segment file that disappears takes only its own messages with it.
        std::fs::remove_file(segment_path(&directory, 1)).expect("remove");
        let (_, recovery) = QueueLog::open(&directory, 1).expect("reopen after loss");
        let positions: Vec<u64> = recovery.messages.iter().map(|m| m.position).collect();
        assert_eq!(positions, vec![3]);
        assert_eq!(recovery.next_position, 4);
    }
}
