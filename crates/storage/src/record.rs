//! The record format of queue log segments, in one place: how a record is laid out, what its
//! checksum covers, and how the segment header and seal records look.
//!
//! Layout (all integers big-endian):
//!
//! ```text
//! length u32 | crc32c u32 | kind u8 | term u64 | position u64 | payload
//! ```
//!
//! `length` counts kind, term, position and payload. The CRC32C covers the same bytes, prefixed
//! with the segment's identity (its first position and a random nonce drawn when the file starts
//! a new life), so a record left in a recycled file by its previous life fails its checksum in
//! the new one. Every segment starts with a header record, whose checksum has no prefix (it is
//! what tells the identity): it names the segment's first position and holds the format version
//! and the nonce. A zero `length` is not a record: it ends a segment's replay normally (every
//! write is followed by zeros, and fresh segment files are filled with zeros).

use amqp_codec::ShortStr;
use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;

/// A persistent message: exchange, routing key, property flags, properties, body.
pub(crate) const KIND_PUBLISH: u8 = 1;
/// The message was handed to a consumer, so it comes back with `redelivered` set.
pub(crate) const KIND_DELIVERED: u8 = 2;
/// The message was acked, rejected, expired or purged.
pub(crate) const KIND_SETTLED: u8 = 3;
/// Closes a segment that is no longer active; its payload is its own offset (the segment's valid
/// length before it). Replay of a segment stops at its seal: what follows is stale. An older
/// segment without its seal was truncated or damaged.
pub(crate) const KIND_SEALED: u8 = 4;
/// A transient message written only because its queue was paging: read back while the broker
/// runs, ignored by recovery.
pub(crate) const KIND_PUBLISH_TRANSIENT: u8 = 5;
/// The first record of every segment: payload `format_version u8 | nonce u64`.
pub(crate) const KIND_SEGMENT_HEADER: u8 = 6;
/// A persistent message written by segment format 3:
/// `flags u8 | [expires_at_ms u64] | [bcc_count u16 | (length u8 | key)*] | message`, the message
/// laid out as in [`KIND_PUBLISH`]. With [`PUBLISH_FLAG_EXPIRES`] the expiry follows the flags:
/// fixed when the message was enqueued (RabbitMQ's rule), so a message read back by a page-in or
/// a restart keeps its time to live counted from its publish. With [`PUBLISH_FLAG_BCC`] the
/// routing keys of its BCC header follow (taken out of its headers, kept for its dead letter).
pub(crate) const KIND_PUBLISH_FLAGGED: u8 = 8;
/// A transient message of format 3, laid out as [`KIND_PUBLISH_FLAGGED`] (see
/// [`KIND_PUBLISH_TRANSIENT`]).
pub(crate) const KIND_PUBLISH_TRANSIENT_FLAGGED: u8 = 9;
/// In a flagged publish's flags: an expiry (`u64`, milliseconds since the Unix epoch) follows.
pub(crate) const PUBLISH_FLAG_EXPIRES: u8 = 1;
/// In a flagged publish's flags: the message's BCC routing keys follow the expiry.
pub(crate) const PUBLISH_FLAG_BCC: u8 = 2;
/// Damaged bytes recovery stepped over, made into one record so every later reader walks past
/// them: its header is written over the first bytes of the damage, its payload is the rest of
/// the damage as found (a copy is set aside, see crate::quarantine). Its position means nothing.
pub(crate) const KIND_QUARANTINED: u8 = 7;

/// Whether `header` could be a record after the header of the segment whose publishes have
/// positions in `positions` (from its first position up to the next segment's): what a search
/// for the next intact record after damage may land on. Deliveries and settles may name any
/// earlier position; a seal names the next segment's first.
pub(crate) fn could_follow_in_segment(header: &RecordHeader, positions: &std::ops::Range<u64>) -> bool {
    match header.kind {
        kind if is_publish(kind) => positions.contains(&header.position),
        KIND_DELIVERED | KIND_SETTLED => header.position < positions.end,
        KIND_SEALED => header.position >= positions.start,
        KIND_QUARANTINED => true,
        _ => false,
    }
}

/// Whether records of `kind` carry a message.
pub(crate) fn is_publish(kind: u8) -> bool {
    matches!(kind, KIND_PUBLISH | KIND_PUBLISH_TRANSIENT | KIND_PUBLISH_FLAGGED | KIND_PUBLISH_TRANSIENT_FLAGGED)
}

/// Whether records of `kind` carry a message that survives a restart.
pub(crate) fn is_persistent_publish(kind: u8) -> bool {
    matches!(kind, KIND_PUBLISH | KIND_PUBLISH_FLAGGED)
}

/// When a logged message expires, as its record tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedExpiry {
    /// It had no expiry when it was enqueued, so it never expires.
    Never,
    /// It expires at this time, in milliseconds since the Unix epoch.
    AtMs(u64),
    /// Its record was written by segment format 2, which kept no expiry: the reader computes one.
    Unrecorded,
}

/// What a format 3 publish record keeps beside the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishPrefix {
    /// When the message expires.
    pub expiry: RecordedExpiry,
    /// The routing keys of its BCC header, if it had one.
    pub bcc_routing_keys: Option<Arc<[ShortStr]>>,
}

/// Appends a format 3 publish's flags, expiry and BCC keys: what comes before the message. At
/// most `u16::MAX` keys are kept (a content header, one frame, holds fewer).
pub(crate) fn put_publish_prefix(buffer: &mut BytesMut, expires_at_ms: Option<u64>, bcc_routing_keys: Option<&[ShortStr]>) {
    let bcc_routing_keys = bcc_routing_keys.filter(|keys| !keys.is_empty());
    let flags = u8::from(expires_at_ms.is_some()) * PUBLISH_FLAG_EXPIRES + u8::from(bcc_routing_keys.is_some()) * PUBLISH_FLAG_BCC;
    buffer.put_u8(flags);
    if let Some(expires_at_ms) = expires_at_ms {
        buffer.put_u64(expires_at_ms);
    }
    if let Some(keys) = bcc_routing_keys {
        let kept = &keys[..keys.len().min(usize::from(u16::MAX))];
        buffer.put_u16(kept.len() as u16);
        for key in kept {
            buffer.put_u8(key.len() as u8);
            buffer.put_slice(key.as_bytes());
        }
    }
}

/// Splits the payload of a publish record of `kind` into what it keeps beside the message and
/// the message's bytes; `None` when the prefix does not parse (unknown flags, a short payload).
pub(crate) fn split_publish(kind: u8, payload: Bytes) -> Option<(PublishPrefix, Bytes)> {
    if matches!(kind, KIND_PUBLISH | KIND_PUBLISH_TRANSIENT) {
        return Some((PublishPrefix { expiry: RecordedExpiry::Unrecorded, bcc_routing_keys: None }, payload));
    }
    let flags = *payload.first()?;
    if flags & !(PUBLISH_FLAG_EXPIRES | PUBLISH_FLAG_BCC) != 0 {
        return None;
    }
    let mut at = 1;
    let expiry = match flags & PUBLISH_FLAG_EXPIRES {
        0 => RecordedExpiry::Never,
        _ => {
            at += 8;
            RecordedExpiry::AtMs(u64_at(&payload, 1)?)
        }
    };
    let mut bcc_routing_keys = None;
    if flags & PUBLISH_FLAG_BCC != 0 {
        let count = u16::from_be_bytes(payload.get(at..at + 2)?.try_into().ok()?);
        at += 2;
        let mut keys = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let length = usize::from(*payload.get(at)?);
            let key = payload.get(at + 1..at + 1 + length)?;
            keys.push(ShortStr::from_bytes(payload.slice_ref(key)));
            at += 1 + length;
        }
        bcc_routing_keys = Some(Arc::from(keys));
    }
    Some((PublishPrefix { expiry, bcc_routing_keys }, payload.slice(at..)))
}

/// The header of a [`KIND_QUARANTINED`] record covering `damaged` (the bad bytes from its start
/// up to the next intact record, at least [`RECORD_HEADER_BYTES`] of them): the bytes to write
/// over the start of the damage, whose checksum covers the rest of it as it is on disk.
pub(crate) fn quarantined_header(seed: u32, term: u64, position: u64, damaged: &[u8]) -> Option<[u8; RECORD_HEADER_BYTES]> {
    let kept = damaged.get(RECORD_HEADER_BYTES..)?;
    let length = u32::try_from(RECORD_FIXED_BYTES + kept.len()).ok()?;
    let mut fixed = [0u8; RECORD_FIXED_BYTES];
    fixed[0] = KIND_QUARANTINED;
    fixed[1..9].copy_from_slice(&term.to_be_bytes());
    fixed[9..].copy_from_slice(&position.to_be_bytes());
    let checksum = crc32c::crc32c_append(crc32c::crc32c_append(seed, &fixed), kept);
    let mut header = [0u8; RECORD_HEADER_BYTES];
    header[..4].copy_from_slice(&length.to_be_bytes());
    header[4..8].copy_from_slice(&checksum.to_be_bytes());
    header[LENGTH_AND_CHECKSUM_BYTES..].copy_from_slice(&fixed);
    Some(header)
}

/// The segment format version, in every segment header. Version 3 writes publishes as
/// [`KIND_PUBLISH_FLAGGED`] (with their expiry); version 2's publishes (without) are still read,
/// so a data directory of an older build starts. Version 1 (no term, no segment header, no
/// identity in the checksum) is not readable any more. Data directory format 3
/// ([`crate::STORAGE_FORMAT_VERSION`]) changed the definitions file only.
pub const SEGMENT_FORMAT_VERSION: u8 = 3;
/// The oldest segment format version this build reads.
pub const SEGMENT_FORMAT_VERSION_OLDEST_READ: u8 = 2;
/// The term every record is written with until replication elects leaders. Terms never decrease
/// along a log; recovery treats a decrease as corruption.
pub const CURRENT_TERM: u64 = 1;

/// `length` and `crc32c`: the bytes before what the checksum covers.
pub(crate) const LENGTH_AND_CHECKSUM_BYTES: usize = 8;
/// kind, term and position: what `length` counts besides the payload, so its smallest value.
pub(crate) const RECORD_FIXED_BYTES: usize = 17;
/// Everything before the payload.
pub(crate) const RECORD_HEADER_BYTES: usize = LENGTH_AND_CHECKSUM_BYTES + RECORD_FIXED_BYTES;
/// No record may claim more than this; a larger length is corruption, not a message (RabbitMQ's
/// largest message is 512 MiB).
pub const RECORD_BYTES_MAX: usize = 600 * 1024 * 1024;
/// Zeros written after the last record of every write: a zero length ends replay, so the normal
/// end of a segment is never mistaken for a torn record, whatever an older life left behind.
pub(crate) const TERMINATOR_BYTES: usize = LENGTH_AND_CHECKSUM_BYTES;
const SEGMENT_HEADER_PAYLOAD_BYTES: usize = 9;
/// How many bytes a segment header record takes: records of the segment start after it.
pub(crate) const SEGMENT_HEADER_RECORD_BYTES: u64 = (RECORD_HEADER_BYTES + SEGMENT_HEADER_PAYLOAD_BYTES) as u64;
const SEAL_PAYLOAD_BYTES: usize = 8;
/// How many bytes a seal record takes.
pub(crate) const SEAL_RECORD_BYTES: u64 = (RECORD_HEADER_BYTES + SEAL_PAYLOAD_BYTES) as u64;
/// The checksum prefix of segment headers: none, so a header can be checked without knowing the
/// identity it announces.
pub(crate) const HEADER_SEED: u32 = 0;

/// Which life of which segment a record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentIdentity {
    /// The segment's first position (its file name).
    pub first_position: u64,
    /// Drawn at random each time a file starts a new life as a segment.
    pub nonce: u64,
}

impl SegmentIdentity {
    /// A new life for a segment starting at `first_position`.
    pub fn new(first_position: u64) -> SegmentIdentity {
        SegmentIdentity { first_position, nonce: crate::entropy::random_u64() }
    }

    /// The CRC32C state after the identity bytes: the checksum prefix of the segment's records.
    pub fn seed(&self) -> u32 {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.first_position.to_be_bytes());
        bytes[8..].copy_from_slice(&self.nonce.to_be_bytes());
        crc32c::crc32c(&bytes)
    }
}

/// The fixed part of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    /// Bytes from `kind` to the end of the payload.
    pub length: usize,
    pub checksum: u32,
    pub kind: u8,
    pub term: u64,
    pub position: u64,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

impl RecordHeader {
    /// Decodes the first [`RECORD_HEADER_BYTES`] of `bytes`; `None` when there are fewer.
    pub fn decode(bytes: &[u8]) -> Option<RecordHeader> {
        Some(RecordHeader {
            length: u32_at(bytes, 0)? as usize,
            checksum: u32_at(bytes, 4)?,
            kind: *bytes.get(8)?,
            term: u64_at(bytes, 9)?,
            position: u64_at(bytes, 17)?,
        })
    }

    /// The payload's size, or `None` when `length` cannot be a record's.
    pub fn payload_bytes(&self) -> Option<usize> {
        (RECORD_FIXED_BYTES..=RECORD_BYTES_MAX).contains(&self.length).then(|| self.length - RECORD_FIXED_BYTES)
    }

    /// The whole record's size on disk.
    pub fn record_bytes(&self) -> u64 {
        (LENGTH_AND_CHECKSUM_BYTES + self.length) as u64
    }

    /// Whether `covered` (the record's bytes from `kind` to the end of the payload) matches the
    /// checksum under the segment's `seed`.
    pub fn checksum_matches(&self, seed: u32, covered: &[u8]) -> bool {
        covered.len() == self.length && crc32c::crc32c_append(seed, covered) == self.checksum
    }
}

/// Appends one record to `buffer`; returns its size.
pub(crate) fn encode(buffer: &mut BytesMut, seed: u32, kind: u8, term: u64, position: u64, payload: impl FnOnce(&mut BytesMut)) -> usize {
    let start = buffer.len();
    buffer.put_u32(0);
    buffer.put_u32(0);
    buffer.put_u8(kind);
    buffer.put_u64(term);
    buffer.put_u64(position);
    payload(buffer);
    let length = buffer.len() - start - LENGTH_AND_CHECKSUM_BYTES;
    assert!((RECORD_FIXED_BYTES..=RECORD_BYTES_MAX).contains(&length), "record of {length} bytes");
    let checksum = crc32c::crc32c_append(seed, &buffer[start + LENGTH_AND_CHECKSUM_BYTES..]);
    buffer[start..start + 4].copy_from_slice(&(length as u32).to_be_bytes());
    buffer[start + 4..start + 8].copy_from_slice(&checksum.to_be_bytes());
    buffer.len() - start
}

/// Appends the header record that starts a segment's life.
pub(crate) fn encode_segment_header(buffer: &mut BytesMut, identity: SegmentIdentity, term: u64) {
    let written = encode(buffer, HEADER_SEED, KIND_SEGMENT_HEADER, term, identity.first_position, |buffer| {
        buffer.put_u8(SEGMENT_FORMAT_VERSION);
        buffer.put_u64(identity.nonce);
    });
    debug_assert_eq!(written as u64, SEGMENT_HEADER_RECORD_BYTES);
}

/// A segment header's format version and nonce, if the payload has the right size.
pub(crate) fn decode_segment_header(payload: &[u8]) -> Option<(u8, u64)> {
    if payload.len() != SEGMENT_HEADER_PAYLOAD_BYTES {
        return None;
    }
    Some((payload[0], u64_at(payload, 1)?))
}

/// Appends a seal record that will start at `offset` of its segment.
pub(crate) fn encode_seal(buffer: &mut BytesMut, seed: u32, term: u64, next_first_position: u64, offset: u64) {
    let written = encode(buffer, seed, KIND_SEALED, term, next_first_position, |buffer| buffer.put_u64(offset));
    debug_assert_eq!(written as u64, SEAL_RECORD_BYTES);
}

/// The offset a seal record says it starts at, if the payload has the right size.
pub(crate) fn decode_seal(payload: &[u8]) -> Option<u64> {
    (payload.len() == SEAL_PAYLOAD_BYTES).then(|| u64_at(payload, 0)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_identity_in_the_checksum() {
        let identity = SegmentIdentity { first_position: 7, nonce: 42 };
        let mut buffer = BytesMut::new();
        encode(&mut buffer, identity.seed(), KIND_SETTLED, 3, 99, |buffer| buffer.put_slice(b"xy"));
        let header = RecordHeader::decode(&buffer).expect("25 bytes");
        assert_eq!((header.kind, header.term, header.position, header.payload_bytes()), (KIND_SETTLED, 3, 99, Some(2)));
        let covered = &buffer[LENGTH_AND_CHECKSUM_BYTES..];
        assert!(header.checksum_matches(identity.seed(), covered));
        // The same bytes in another life of the file, or another segment, do not check.
        assert!(!header.checksum_matches(SegmentIdentity { nonce: 43, ..identity }.seed(), covered));
        assert!(!header.checksum_matches(SegmentIdentity { first_position: 8, ..identity }.seed(), covered));
        assert!(RecordHeader::decode(&buffer[..RECORD_HEADER_BYTES - 1]).is_none());
    }
}
