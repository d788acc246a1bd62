//! The messages of stream replication on the cluster links (payload channel
//! [`STREAM_REPLICATION_CHANNEL`]), without I/O. A follower pulls: it sends a [`Fetch`] naming
//! the end of its log and how far it has fdatasynced (its acknowledgement); the leader answers
//! with [`Data`]: the chunks that follow (whole, as on disk), the cluster's commit offset, and,
//! when the follower's log left the leader's, where to cut it first, or, when it ends before
//! the leader's first offset (retention deleted what it lacks), that offset to start again at.

use bytes::Bytes;
use replication::codec::{DecodeError, Reader, Writer};

/// The link payload channel of stream replication.
pub const STREAM_REPLICATION_CHANNEL: u8 = 7;

/// Chunk bytes in one [`Data`] at most (a chunk larger than this goes alone): well inside a
/// peer's send queue (16 MiB by default) so other traffic keeps flowing beside it.
pub const DATA_BYTES_MAX: usize = 4 << 20;

const KIND_FETCH: u8 = 1;
const KIND_DATA: u8 = 2;
const KIND_PUBLISH: u8 = 3;
const KIND_PUBLISHED: u8 = 4;
const KIND_PUBLISH_ENTRIES: u8 = 5;
const KIND_STORE_OFFSET: u8 = 6;

/// Bytes one forwarded entry takes in [`ForwardedEntries`]' index: its publishing id, record
/// count and length.
const FORWARDED_ENTRY_INDEX_BYTES: usize = 16;

/// No cut ([`Data::truncate_to`]).
const NO_TRUNCATION: u64 = u64::MAX;

/// No reset ([`Data::reset_to`]).
const NO_RESET: u64 = u64::MAX;

/// Which stream: a stream queue's vhost and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    /// Vhost.
    pub vhost: String,
    /// Queue name.
    pub name: String,
}

/// A follower asks for what follows its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// The epoch of the leader it follows.
    pub epoch: u64,
    /// The epoch of its last chunk.
    pub tail_epoch: u64,
    /// The offset after its last chunk.
    pub tail_next: u64,
    /// The offset below which its files are fdatasynced.
    pub synced_next: u64,
}

/// A leader's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    /// The leader's epoch.
    pub epoch: u64,
    /// The offset below which the cluster committed the stream.
    pub commit: u64,
    /// Cut the log before this offset first (chunks no majority held).
    pub truncate_to: Option<u64>,
    /// The leader's log starts here, past the end of the follower's: the offsets it asked for
    /// were deleted by retention. It drops its log and starts again empty at this offset; the
    /// chunks sent start here.
    pub reset_to: Option<u64>,
    /// Whole chunks, each with whether it starts a segment.
    pub chunks: Vec<(bool, Bytes)>,
}

/// One replication message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaMessage {
    /// Follower to leader.
    Fetch(StreamKey, Fetch),
    /// Leader to follower.
    Data(StreamKey, Data),
    /// A member that does not lead the stream forwards its clients' publishes (AMQP records)
    /// to the leader.
    Publish(StreamKey, Forwarded),
    /// The leader's answer: committed (confirm) or not (nack).
    Published(StreamKey, Outcome),
    /// A member that does not lead the stream forwards a stream-protocol publish (entries as
    /// the client sent them, with their publishing ids) to the leader, as RabbitMQ routes a
    /// publish from any node to the stream's leader. Answered by `Published`.
    PublishEntries(StreamKey, ForwardedEntries),
    /// A member that does not lead the stream forwards a consumer's stored offset to the
    /// leader (a tracking chunk only the leader can write). Not answered, as the protocol's
    /// `store_offset` is not.
    StoreOffset(StreamKey, StoredOffset),
}

/// One stream-protocol publish frame forwarded to the leader, which deduplicates it by the
/// publisher's reference (its own tracking is the one that counts) before appending it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedEntries {
    /// The forwarding member's number for it.
    pub request: u64,
    /// The publisher's reference (deduplication), if it has one.
    pub reference: Option<Bytes>,
    /// Each entry's publishing id, record count and length, in order.
    pub entries: Vec<ForwardedEntry>,
    /// The entries' bytes (as the client sent them), one after the other.
    pub data: Bytes,
}

/// One entry of [`ForwardedEntries`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardedEntry {
    /// The publisher's id for it.
    pub publishing_id: u64,
    /// Records in it (1, or a sub-entry batch's count).
    pub records: u32,
    /// Its bytes in [`ForwardedEntries::data`].
    pub length: u32,
}

/// A consumer's offset stored through a member that does not lead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOffset {
    /// The consumer's reference.
    pub reference: Bytes,
    /// The offset.
    pub offset: u64,
}

/// Publishes a member forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    /// The forwarding member's number for them.
    pub request: u64,
    /// The records, in order.
    pub records: Vec<Bytes>,
}

/// What became of forwarded publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The forwarding member's number.
    pub request: u64,
    /// Committed by the cluster.
    pub committed: bool,
}

impl ReplicaMessage {
    /// Its bytes.
    pub fn encode(&self) -> Bytes {
        let mut out = Vec::new();
        let mut writer = Writer(&mut out);
        match self {
            ReplicaMessage::Fetch(key, fetch) => {
                writer.u8(KIND_FETCH);
                put_key(&mut writer, key);
                for value in [fetch.epoch, fetch.tail_epoch, fetch.tail_next, fetch.synced_next] {
                    writer.u64(value);
                }
            }
            ReplicaMessage::Data(key, data) => {
                writer.u8(KIND_DATA);
                put_key(&mut writer, key);
                writer.u64(data.epoch);
                writer.u64(data.commit);
                writer.u64(data.truncate_to.unwrap_or(NO_TRUNCATION));
                writer.u64(data.reset_to.unwrap_or(NO_RESET));
                writer.u32(data.chunks.len() as u32);
                for (starts_segment, bytes) in &data.chunks {
                    writer.u8(u8::from(*starts_segment));
                    writer.bytes(bytes);
                }
            }
            ReplicaMessage::Publish(key, forwarded) => {
                writer.u8(KIND_PUBLISH);
                put_key(&mut writer, key);
                writer.u64(forwarded.request);
                writer.u32(forwarded.records.len() as u32);
                for record in &forwarded.records {
                    writer.bytes(record);
                }
            }
            ReplicaMessage::Published(key, outcome) => {
                writer.u8(KIND_PUBLISHED);
                put_key(&mut writer, key);
                writer.u64(outcome.request);
                writer.u8(u8::from(outcome.committed));
            }
            ReplicaMessage::PublishEntries(key, forwarded) => {
                writer.u8(KIND_PUBLISH_ENTRIES);
                put_key(&mut writer, key);
                put_forwarded_entries(&mut writer, forwarded);
            }
            ReplicaMessage::StoreOffset(key, stored) => {
                writer.u8(KIND_STORE_OFFSET);
                put_key(&mut writer, key);
                writer.bytes(&stored.reference);
                writer.u64(stored.offset);
            }
        }
        Bytes::from(out)
    }

    /// Reads one from a peer's bytes.
    pub fn decode(bytes: Bytes) -> Result<ReplicaMessage, DecodeError> {
        let mut reader = Reader::new(bytes);
        let message = match reader.u8()? {
            KIND_FETCH => {
                let key = key(&mut reader)?;
                let fetch = Fetch { epoch: reader.u64()?, tail_epoch: reader.u64()?, tail_next: reader.u64()?, synced_next: reader.u64()? };
                ReplicaMessage::Fetch(key, fetch)
            }
            KIND_DATA => {
                let key = key(&mut reader)?;
                let (epoch, commit, truncate_to, reset_to) = (reader.u64()?, reader.u64()?, reader.u64()?, reader.u64()?);
                let count = reader.u32()? as usize;
                // Each chunk takes at least 5 bytes here: a count past that is a lie.
                if count > reader.remaining() / 5 {
                    return Err(DecodeError::Invalid { field: "stream replication chunk count", value: count as u64 });
                }
                let mut chunks = Vec::with_capacity(count);
                for _ in 0..count {
                    let starts_segment = reader.u8()? != 0;
                    chunks.push((starts_segment, reader.bytes()?));
                }
                let truncate_to = (truncate_to != NO_TRUNCATION).then_some(truncate_to);
                let reset_to = (reset_to != NO_RESET).then_some(reset_to);
                ReplicaMessage::Data(key, Data { epoch, commit, truncate_to, reset_to, chunks })
            }
            KIND_PUBLISH => {
                let key = key(&mut reader)?;
                let request = reader.u64()?;
                let count = reader.u32()? as usize;
                if count > reader.remaining() / 4 {
                    return Err(DecodeError::Invalid { field: "forwarded record count", value: count as u64 });
                }
                let mut records = Vec::with_capacity(count);
                for _ in 0..count {
                    records.push(reader.bytes()?);
                }
                ReplicaMessage::Publish(key, Forwarded { request, records })
            }
            KIND_PUBLISHED => {
                let key = key(&mut reader)?;
                ReplicaMessage::Published(key, Outcome { request: reader.u64()?, committed: reader.u8()? != 0 })
            }
            KIND_PUBLISH_ENTRIES => {
                let key = key(&mut reader)?;
                ReplicaMessage::PublishEntries(key, read_forwarded_entries(&mut reader)?)
            }
            KIND_STORE_OFFSET => {
                let key = key(&mut reader)?;
                ReplicaMessage::StoreOffset(key, StoredOffset { reference: reader.bytes()?, offset: reader.u64()? })
            }
            kind => return Err(DecodeError::Invalid { field: "stream replication message kind", value: u64::from(kind) }),
        };
        if !reader.is_at_end() {
            return Err(DecodeError::Invalid { field: "bytes after a stream replication message", value: reader.remaining() as u64 });
        }
        Ok(message)
    }
}

fn put_forwarded_entries(writer: &mut Writer<'_>, forwarded: &ForwardedEntries) {
    writer.u64(forwarded.request);
    // References are 1 to 255 bytes: empty says there is none.
    writer.bytes(forwarded.reference.as_deref().unwrap_or_default());
    writer.u32(forwarded.entries.len() as u32);
    for entry in &forwarded.entries {
        writer.u64(entry.publishing_id);
        writer.u32(entry.records);
        writer.u32(entry.length);
    }
    writer.bytes(&forwarded.data);
}

fn read_forwarded_entries(reader: &mut Reader) -> Result<ForwardedEntries, DecodeError> {
    let request = reader.u64()?;
    let reference = reader.bytes()?;
    let count = reader.u32()? as usize;
    if count > reader.remaining() / FORWARDED_ENTRY_INDEX_BYTES {
        return Err(DecodeError::Invalid { field: "forwarded entry count", value: count as u64 });
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        entries.push(ForwardedEntry { publishing_id: reader.u64()?, records: reader.u32()?, length: reader.u32()? });
    }
    let data = reader.bytes()?;
    let indexed: u64 = entries.iter().map(|entry| u64::from(entry.length)).sum();
    if indexed != data.len() as u64 {
        return Err(DecodeError::Invalid { field: "forwarded entry bytes", value: indexed });
    }
    Ok(ForwardedEntries { request, reference: (!reference.is_empty()).then_some(reference), entries, data })
}

fn put_key(writer: &mut Writer<'_>, key: &StreamKey) {
    writer.bytes(key.vhost.as_bytes());
    writer.bytes(key.name.as_bytes());
}

fn key(reader: &mut Reader) -> Result<StreamKey, DecodeError> {
    let text = |bytes: Bytes| {
        let length = bytes.len() as u64;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::Invalid { field: "stream name (not UTF-8), bytes", value: length })
    };
    Ok(StreamKey { vhost: text(reader.bytes()?)?, name: text(reader.bytes()?)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_back_as_written_and_garbage_is_refused() {
        let key = StreamKey { vhost: "/".to_string(), name: "events".to_string() };
        let fetch = ReplicaMessage::Fetch(key.clone(), Fetch { epoch: 3, tail_epoch: 2, tail_next: 100, synced_next: 90 });
        assert_eq!(ReplicaMessage::decode(fetch.encode()), Ok(fetch));
        let chunks = vec![(true, Bytes::from_static(b"chunk one")), (false, Bytes::from_static(b"two"))];
        for (truncate_to, reset_to) in [(None, None), (Some(42), None), (None, Some(1_000))] {
            let data = ReplicaMessage::Data(key.clone(), Data { epoch: 3, commit: 77, truncate_to, reset_to, chunks: chunks.clone() });
            let encoded = data.encode();
            assert_eq!(ReplicaMessage::decode(encoded.clone()), Ok(data));
            for cut in 0..encoded.len() {
                assert!(ReplicaMessage::decode(encoded.slice(..cut)).is_err(), "a message cut at {cut} was taken");
            }
        }
        let publish = ReplicaMessage::Publish(key.clone(), Forwarded { request: 5, records: vec![Bytes::from_static(b"record")] });
        assert_eq!(ReplicaMessage::decode(publish.encode()), Ok(publish));
        let published = ReplicaMessage::Published(key.clone(), Outcome { request: 5, committed: true });
        assert_eq!(ReplicaMessage::decode(published.encode()), Ok(published));
        assert!(ReplicaMessage::decode(Bytes::from_static(&[9, 0, 0])).is_err());
    }

    #[test]
    fn forwarded_stream_publishes_read_back_and_a_lying_index_is_refused() {
        let key = StreamKey { vhost: "/".to_string(), name: "events".to_string() };
        let entries =
            vec![ForwardedEntry { publishing_id: 7, records: 1, length: 5 }, ForwardedEntry { publishing_id: 8, records: 3, length: 2 }];
        for reference in [None, Some(Bytes::from_static(b"producer-1"))] {
            let forwarded = ForwardedEntries { request: 9, reference, entries: entries.clone(), data: Bytes::from_static(b"hello..") };
            let message = ReplicaMessage::PublishEntries(key.clone(), forwarded);
            let encoded = message.encode();
            assert_eq!(ReplicaMessage::decode(encoded.clone()), Ok(message));
            for cut in 0..encoded.len() {
                assert!(ReplicaMessage::decode(encoded.slice(..cut)).is_err(), "a message cut at {cut} was taken");
            }
        }
        let lying = ForwardedEntries { request: 9, reference: None, entries, data: Bytes::from_static(b"hello.") };
        assert!(ReplicaMessage::decode(ReplicaMessage::PublishEntries(key.clone(), lying).encode()).is_err());
        let stored = ReplicaMessage::StoreOffset(key, StoredOffset { reference: Bytes::from_static(b"consumer"), offset: 42 });
        assert_eq!(ReplicaMessage::decode(stored.encode()), Ok(stored));
    }
}
