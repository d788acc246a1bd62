//! The change log beside the definitions snapshot: a header naming the snapshot generation it
//! follows, then one record per [`DefinitionChange`], each with its length and a CRC32C.
//!
//! ```text
//! header: "LPDEFLOG" | storage format u32 | generation u64 | crc32c of the 20 bytes before, u32
//! record: payload length u32 | crc32c(generation ++ length ++ payload) u32 | payload (JSON)
//! ```
//!
//! All integers are little-endian. The checksum is seeded with the generation, so a record of an
//! older log can never be read as part of a newer one. A crash in the middle of an append leaves
//! a record whose length runs past the end of the file or whose checksum does not match: replay
//! ends there, and nothing after it was acknowledged (a change is acknowledged only after its
//! record and every one before it were fdatasynced).

use crate::definitions_state::DefinitionChange;
use crate::{StorageError, STORAGE_FORMAT_VERSION};
use std::path::Path;

const LOG_MAGIC: [u8; 8] = *b"LPDEFLOG";

/// The bytes of a log's header.
pub const LOG_HEADER_BYTES: u64 = 24;

const RECORD_HEADER_BYTES: usize = 8;

/// The largest record replay accepts; a length field above it is damage, not a record (the
/// largest real record, the whole control plane of 4,096 vhosts with their users and policies,
/// is a few MiB).
const RECORD_PAYLOAD_BYTES_MAX: usize = 64 << 20;

/// The header of a log that follows the snapshot of `generation`.
pub fn encode_header(generation: u64) -> Vec<u8> {
    let mut header = Vec::with_capacity(LOG_HEADER_BYTES as usize);
    header.extend_from_slice(&LOG_MAGIC);
    header.extend_from_slice(&STORAGE_FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&generation.to_le_bytes());
    let checksum = crc32c::crc32c(&header);
    header.extend_from_slice(&checksum.to_le_bytes());
    header
}

/// The generation a log follows, if `bytes` start with an intact header of the current format.
pub fn decode_header(bytes: &[u8]) -> Option<u64> {
    let header = bytes.get(..LOG_HEADER_BYTES as usize)?;
    let (body, checksum) = header.split_at(20);
    if body[..8] != LOG_MAGIC || crc32c::crc32c(body).to_le_bytes() != checksum {
        return None;
    }
    let format = u32::from_le_bytes(body[8..12].try_into().ok()?);
    if format != STORAGE_FORMAT_VERSION {
        return None;
    }
    Some(u64::from_le_bytes(body[12..20].try_into().ok()?))
}

fn record_checksum(generation: u64, length: u32, payload: &[u8]) -> u32 {
    let seeded = crc32c::crc32c(&generation.to_le_bytes());
    let with_length = crc32c::crc32c_append(seeded, &length.to_le_bytes());
    crc32c::crc32c_append(with_length, payload)
}

/// Appends one framed record holding `change` to `out`.
pub fn encode_record(out: &mut Vec<u8>, generation: u64, change: &DefinitionChange) {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
    // The records hold strings, booleans, numbers and JSON objects with string keys: nothing that
    // serde_json refuses to write.
    serde_json::to_writer(&mut *out, change).expect("a definition change serialises to JSON");
    let payload_bytes = out.len() - start - RECORD_HEADER_BYTES;
    assert!(payload_bytes <= RECORD_PAYLOAD_BYTES_MAX, "a definition change of {payload_bytes} bytes is past the record limit");
    let length = payload_bytes as u32;
    let checksum = record_checksum(generation, length, &out[start + RECORD_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&length.to_le_bytes());
    out[start + 4..start + RECORD_HEADER_BYTES].copy_from_slice(&checksum.to_le_bytes());
}

/// What a log's records hold.
#[derive(Debug, Default)]
pub struct ReplayedLog {
    /// The changes, in the order they were made.
    pub changes: Vec<DefinitionChange>,
    /// The bytes of the header and the intact records: where the next record goes.
    pub valid_bytes: u64,
    /// Why replay stopped before the end of the file (a torn or damaged last write), if it did.
    pub torn: Option<String>,
}

/// Reads the records of a log of `generation` whose whole content (header included) is `bytes`.
/// A record that checks out but does not parse was written by another build: that is an error,
/// not a torn write.
pub fn read_records(path: &Path, bytes: &[u8], generation: u64) -> Result<ReplayedLog, StorageError> {
    let mut replayed = ReplayedLog { valid_bytes: LOG_HEADER_BYTES, ..ReplayedLog::default() };
    let mut offset = LOG_HEADER_BYTES as usize;
    while offset < bytes.len() {
        let Some(header) = bytes.get(offset..offset + RECORD_HEADER_BYTES) else {
            replayed.torn = Some(format!("a record header cut short at offset {offset}"));
            break;
        };
        let length = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let checksum = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let start = offset + RECORD_HEADER_BYTES;
        let payload = match bytes.get(start..start + length as usize) {
            Some(payload) if (length as usize) <= RECORD_PAYLOAD_BYTES_MAX => payload,
            _ => {
                replayed.torn = Some(format!("a record of {length} bytes at offset {offset} runs past the end of the file"));
                break;
            }
        };
        if record_checksum(generation, length, payload) != checksum {
            replayed.torn = Some(format!("the record at offset {offset} fails its checksum"));
            break;
        }
        let change = serde_json::from_slice(payload).map_err(|error| StorageError::Corrupt {
            path: path.display().to_string(),
            detail: format!("the record at offset {offset} passes its checksum but does not parse: {error}"),
        })?;
        replayed.changes.push(change);
        offset = start + length as usize;
        replayed.valid_bytes = offset as u64;
    }
    Ok(replayed)
}
