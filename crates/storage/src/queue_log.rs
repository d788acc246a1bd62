//! One durable queue's message log: an append-only file of checksummed records.
//!
//! Record layout (all integers big-endian):
//!
//! ```text
//! length u32 | crc32c u32 | kind u8 | position u64 | payload
//! ```
//!
//! `length` counts kind, position and payload; the CRC covers the same bytes. Kinds: publish
//! (payload: exchange, routing key, property flags, properties, body), delivered (the message was
//! handed to a consumer, so it comes back with `redelivered` set) and settled (acked, rejected or
//! purged). Records are buffered in memory and written by the syncer, which fdatasyncs before any
//! confirm goes out.

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
const RECORD_HEADER_BYTES: usize = 8;
/// No record may claim more than this; a larger length is corruption, not a message (RabbitMQ's
/// largest message is 512 MiB).
pub const RECORD_BYTES_MAX: usize = 600 * 1024 * 1024;
/// When a queue is empty and its log has grown past this, the log is truncated.
pub const LOG_BYTES_COMPACT_THRESHOLD: u64 = 16 * 1024 * 1024;

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
    /// Where the valid records end, if a torn or corrupt tail was cut there.
    pub truncated_at: Option<u64>,
}

/// An open queue log.
#[derive(Debug)]
pub struct QueueLog {
    path: PathBuf,
    file: File,
    pending: BytesMut,
    bytes_on_disk: u64,
    deleted: bool,
}

impl QueueLog {
    /// Opens (creating) the log at `path`, replays it and cuts any invalid tail.
    pub fn open(path: &Path) -> Result<(QueueLog, Recovery), StorageError> {
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(|error| StorageError::io(path, error))?;
        let recovery = replay(path, &file)?;
        let valid_bytes = match recovery.truncated_at {
            Some(offset) => {
                file.set_len(offset)
                    .map_err(|error| StorageError::io(path, error))?;
                file.sync_all()
                    .map_err(|error| StorageError::io(path, error))?;
                offset
            }
            None => file
                .metadata()
                .map_err(|error| StorageError::io(path, error))?
                .len(),
        };
        let log = QueueLog {
            path: path.to_path_buf(),
            file,
            pending: BytesMut::new(),
            bytes_on_disk: valid_bytes,
            deleted: false,
        };
        Ok((log, recovery))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
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
        let checksum = crc32c::crc32c(&self.pending[start + RECORD_HEADER_BYTES..]);
        self.pending[start..start + 4].copy_from_slice(&(length as u32).to_be_bytes());
        self.pending[start + 4..start + 8].copy_from_slice(&checksum.to_be_bytes());
    }

    /// Buffers a publish record.
    pub fn append_publish(&mut self, position: u64, message: &Message) {
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
    }

    /// Buffers a delivered marker.
    pub fn append_delivered(&mut self, position: u64) {
        self.append(KIND_DELIVERED, position, |_| {});
    }

    /// Buffers a settled record.
    pub fn append_settled(&mut self, position: u64) {
        self.append(KIND_SETTLED, position, |_| {});
    }

    /// Whether records wait to be written.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes the buffered records; returns a handle to fdatasync outside the caller's lock.
    pub fn write_pending(&mut self) -> Result<Option<File>, StorageError> {
        if self.deleted {
            return Ok(None);
        }
        if !self.pending.is_empty() {
            self.file
                .write_all(&self.pending)
                .map_err(|error| StorageError::io(&self.path, error))?;
            self.bytes_on_disk += self.pending.len() as u64;
            self.pending.clear();
        }
        self.file
            .try_clone()
            .map(Some)
            .map_err(|error| StorageError::io(&self.path, error))
    }

    /// Empties the log once every message in it is settled, so it does not grow forever.
    pub fn compact_if_settled(&mut self) -> Result<(), StorageError> {
        if self.deleted
            || self.bytes_on_disk + self.pending.len() as u64 <= LOG_BYTES_COMPACT_THRESHOLD
        {
            return Ok(());
        }
        self.pending.clear();
        self.file
            .set_len(0)
            .map_err(|error| StorageError::io(&self.path, error))?;
        self.file
            .sync_all()
            .map_err(|error| StorageError::io(&self.path, error))?;
        self.bytes_on_disk = 0;
        Ok(())
    }

    /// Deletes the file (queue deleted); later appends are dropped.
    pub fn delete(&mut self) -> Result<(), StorageError> {
        self.deleted = true;
        self.pending.clear();
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(StorageError::io(&self.path, error)),
        }
    }
}

fn replay(path: &Path, file: &File) -> Result<Recovery, StorageError> {
    let mut reader = BufReader::with_capacity(
        1 << 20,
        file.try_clone()
            .map_err(|error| StorageError::io(path, error))?,
    );
    let mut published: BTreeMap<u64, (Arc<Message>, bool)> = BTreeMap::new();
    let mut recovery = Recovery::default();
    let mut offset = 0u64;
    loop {
        let mut header = [0u8; RECORD_HEADER_BYTES];
        match read_full(&mut reader, &mut header) {
            Ok(0) => break,
            Ok(count) if count < RECORD_HEADER_BYTES => {
                tracing::warn!(file = %path.display(), offset, "torn record header at the log's tail; truncating");
                recovery.truncated_at = Some(offset);
                break;
            }
            Ok(_) => {}
            Err(error) => return Err(StorageError::io(path, error)),
        }
        let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let checksum = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        if !(9..=RECORD_BYTES_MAX).contains(&length) {
            tracing::error!(file = %path.display(), offset, length, "record with an impossible length; truncating the log here");
            recovery.truncated_at = Some(offset);
            break;
        }
        let mut record = vec![0u8; length];
        let count =
            read_full(&mut reader, &mut record).map_err(|error| StorageError::io(path, error))?;
        if count < length || crc32c::crc32c(&record) != checksum {
            tracing::error!(file = %path.display(), offset, "torn or corrupt record (checksum mismatch); truncating the log here");
            recovery.truncated_at = Some(offset);
            break;
        }
        let kind = record[0];
        let position = u64::from_be_bytes(record[1..9].try_into().expect("length checked above"));
        recovery.next_position = recovery.next_position.max(position + 1);
        match kind {
            KIND_PUBLISH => match decode_publish(Bytes::from(record).slice(9..)) {
                Some(message) => {
                    published.insert(position, (Arc::new(message), false));
                }
                None => {
                    tracing::error!(file = %path.display(), offset, "publish record does not parse; truncating the log here");
                    recovery.truncated_at = Some(offset);
                    break;
                }
            },
            KIND_DELIVERED => {
                if let Some(entry) = published.get_mut(&position) {
                    entry.1 = true;
                }
            }
            KIND_SETTLED => {
                published.remove(&position);
            }
            other => {
                tracing::error!(file = %path.display(), offset, kind = other, "unknown record kind; truncating the log here");
                recovery.truncated_at = Some(offset);
                break;
            }
        }
        offset += (RECORD_HEADER_BYTES + length) as u64;
    }
    recovery.messages = published
        .into_iter()
        .map(|(position, (message, delivered))| RecoveredMessage {
            position,
            message,
            delivered,
        })
        .collect();
    Ok(recovery)
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
        let path = temporary_dir("replay").join("q.log");
        let (mut log, recovery) = QueueLog::open(&path).expect("open");
        assert!(recovery.messages.is_empty());
        for position in 0..3 {
            log.append_publish(position, &message(&format!("m{position}")));
        }
        log.append_delivered(1);
        log.append_settled(0);
        log.write_pending().expect("write");
        drop(log);
        let (_, recovery) = QueueLog::open(&path).expect("reopen");
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

    #[test]
    fn torn_tail_and_flipped_byte_are_cut() {
        let path = temporary_dir("torn").join("q.log");
        let (mut log, _) = QueueLog::open(&path).expect("open");
        log.append_publish(0, &message("keep"));
        log.append_publish(1, &message("torn"));
        log.write_pending().expect("write");
        drop(log);
        let full = std::fs::metadata(&path).expect("meta").len();
        // Flip a byte in the second record's body: its checksum no longer matches.
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let (_, recovery) = QueueLog::open(&path).expect("reopen");
        assert_eq!(recovery.messages.len(), 1);
        assert_eq!(recovery.messages[0].message.body, Bytes::from("keep"));
        let cut = recovery.truncated_at.expect("cut");
        assert!(cut < full);
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), cut);
        // Half a header at the tail is cut too.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open")
            .write_all(&[0, 0, 1])
            .expect("append");
        let (_, recovery) = QueueLog::open(&path).expect("reopen again");
        assert_eq!(recovery.truncated_at, Some(cut));
        assert_eq!(recovery.messages.len(), 1);
    }
}
