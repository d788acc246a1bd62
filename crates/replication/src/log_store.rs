//! A Raft group's durable state on the storage crate's filesystem seam: the log (one append-only
//! file of checksummed records), the hard state (term, vote, commit) and the latest snapshot,
//! each rewritten through a temporary file, a rename and a directory sync.
//!
//! raft-rs reads the log through [`raft::Storage`]; the node driver writes it (`append`,
//! `set_hard_state`, `apply_snapshot`, `compact`) and calls [`LogStore::sync`] once per `Ready`,
//! before any message that acknowledges what was written leaves the node.
//!
//! Recovery tells a torn tail from damage. A record cut short by the end of the file is the
//! unsynced tail of a power cut: it was never acknowledged, so it is cut off. A record that is
//! whole but fails its checksum (or breaks the index sequence) may have been acknowledged and
//! committed: the store keeps the records before it, drops the rest, and reports the log
//! **damaged**, so the driver stops the node from voting or campaigning until a leader has
//! repaired it (see docs/replication.md, "Recovery and damaged logs").

use crate::codec::{DecodeError, Reader, Writer};
use bytes::Bytes;
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use storage::file_system::{SharedFileSystem, StorageFile};

const LOG_FILE: &str = "log";
const HARD_STATE_FILE: &str = "hard_state";
/// A second copy of the hard state, written after the first: a vote lost to a damaged file lets a
/// node vote twice in a term that is still running; with two copies that takes both damaged.
const HARD_STATE_COPY_FILE: &str = "hard_state.copy";
const SNAPSHOT_FILE: &str = "snapshot";

/// A record header: length of what follows the checksum, then the checksum.
const RECORD_HEADER_BYTES: usize = 8;

/// The largest record recovery accepts; a longer length field is damage, not a record.
pub const RECORD_BYTES_MAX: u32 = 64 << 20;

/// How many bytes of the newest entries a group keeps in memory (at least the newest entry):
/// the log past the snapshot may hold up to `snapshot_entries_interval` entries of up to 1 MiB
/// each, and only the newest are read often (to apply and to replicate).
pub const LOG_CACHE_BYTES_MAX: usize = 32 << 20;

/// Why a group's durable state could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    /// The file system failed.
    #[error("raft log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// The snapshot file is damaged: the node cannot rebuild its state machine from it.
    #[error("raft snapshot {path}: {source}")]
    Snapshot {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: DecodeError,
    },
}

/// What recovery found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Records read back whole.
    pub records: u64,
    /// Bytes of an incomplete last record cut off (an unsynced tail).
    pub torn_tail_bytes: u64,
    /// A whole record failed its check, or the hard state did: the node must not vote or
    /// campaign until repaired.
    pub damaged: bool,
    /// Copies of the hard state that failed their checksum while another was read (the vote is
    /// known; the next write replaces both): for the log.
    pub hard_state_copies_damaged: u32,
}

/// One Raft group's log, hard state and snapshot.
pub struct LogStore {
    file_system: SharedFileSystem,
    directory: PathBuf,
    /// Seeds every checksum, so a record of another group's log never passes for one of ours.
    checksum_seed: u32,
    log: Arc<dyn StorageFile>,
    log_end: u64,
    /// Per entry after the snapshot, in index order: where its record starts, and its term.
    offsets: Vec<u64>,
    terms: Vec<u64>,
    /// The newest entries, in index order, kept in memory up to [`LOG_CACHE_BYTES_MAX`]: raft-rs
    /// reads them to apply and to send; older ones are read back from the file when asked for.
    cache: std::collections::VecDeque<Entry>,
    cache_bytes: usize,
    cache_bytes_max: usize,
    hard_state: HardState,
    conf_state: ConfState,
    /// The index of the membership change `conf_state` comes from (or of the snapshot holding it).
    conf_index: u64,
    snapshot: Snapshot,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> LogStoreError + '_ {
    move |source| LogStoreError::Io { path: path.to_path_buf(), source }
}

fn entry_type_code(entry_type: EntryType) -> u8 {
    match entry_type {
        EntryType::EntryNormal => 0,
        EntryType::EntryConfChange => 1,
        EntryType::EntryConfChangeV2 => 2,
    }
}

fn entry_type_from_code(code: u8) -> Result<EntryType, DecodeError> {
    match code {
        0 => Ok(EntryType::EntryNormal),
        1 => Ok(EntryType::EntryConfChange),
        2 => Ok(EntryType::EntryConfChangeV2),
        value => Err(DecodeError::Invalid { field: "entry type", value: value.into() }),
    }
}

/// Appends one entry's record to `buffer`.
fn encode_record(buffer: &mut Vec<u8>, entry: &Entry, checksum_seed: u32) {
    let start = buffer.len();
    buffer.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
    let body_start = buffer.len();
    let mut writer = Writer(buffer);
    writer.u64(entry.index);
    writer.u64(entry.term);
    writer.u8(entry_type_code(entry.get_entry_type()));
    writer.bytes(&entry.data);
    writer.bytes(&entry.context);
    let checksum = crc32c::crc32c_append(checksum_seed, &buffer[body_start..]);
    let length = (buffer.len() - body_start) as u32;
    buffer[start..start + 4].copy_from_slice(&length.to_le_bytes());
    buffer[start + 4..start + 8].copy_from_slice(&checksum.to_le_bytes());
}

fn decode_record(body: Bytes) -> Result<Entry, DecodeError> {
    let mut reader = Reader::new(body);
    let mut entry = Entry { index: reader.u64()?, term: reader.u64()?, ..Default::default() };
    entry.set_entry_type(entry_type_from_code(reader.u8()?)?);
    entry.data = reader.bytes()?;
    entry.context = reader.bytes()?;
    if !reader.is_at_end() {
        return Err(DecodeError::Invalid { field: "bytes after the entry", value: 0 });
    }
    Ok(entry)
}

/// Reads a whole file (small files, and the log once at recovery).
fn read_all(file: &dyn StorageFile) -> io::Result<Vec<u8>> {
    let length = file.len()? as usize;
    let mut buffer = vec![0; length];
    file.read_exact_at(&mut buffer, 0)?;
    Ok(buffer)
}

mod recovery;
mod storage_impl;
mod write;

impl LogStore {
    /// Opens (or creates, with `voters` as the group's members) a group's state under `directory`.
    pub fn open(
        file_system: SharedFileSystem,
        directory: &Path,
        checksum_seed: u32,
        voters: &[u64],
    ) -> Result<(LogStore, Recovery), LogStoreError> {
        recovery::open(file_system, directory, checksum_seed, voters)
    }

    /// The persisted hard state.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// The group's members as last applied (voters and learners).
    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    /// The index of the membership change the members come from: one at or below it is applied.
    pub fn conf_index(&self) -> u64 {
        self.conf_index
    }

    /// The latest snapshot (index 0 and no data: none yet).
    pub fn snapshot_ref(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The index of the last entry (or of the snapshot when the log after it is empty).
    pub fn last_index_now(&self) -> u64 {
        self.snapshot.get_metadata().index + self.offsets.len() as u64
    }

    /// Bounds the entries kept in memory at `bytes` (tests use small bounds).
    pub fn set_cache_bytes_max(&mut self, bytes: usize) {
        self.cache_bytes_max = bytes;
    }

    /// The entries kept in memory now (the newest ones).
    pub fn cached_entries(&self) -> usize {
        self.cache.len()
    }

    /// Adds an entry (the newest) to the cache, evicting the oldest past the byte bound.
    fn cache_push(&mut self, entry: Entry) {
        self.cache_bytes += entry.data.len() + entry.context.len() + 32;
        self.cache.push_back(entry);
        while self.cache_bytes > self.cache_bytes_max && self.cache.len() > 1 {
            if let Some(evicted) = self.cache.pop_front() {
                self.cache_bytes -= evicted.data.len() + evicted.context.len() + 32;
            }
        }
    }

    /// Drops cached entries at or past `index` (a truncated suffix) or at or before it (compacted).
    fn cache_drop_from(&mut self, index: u64) {
        while self.cache.back().is_some_and(|entry| entry.index >= index) {
            if let Some(dropped) = self.cache.pop_back() {
                self.cache_bytes -= dropped.data.len() + dropped.context.len() + 32;
            }
        }
    }

    fn cache_drop_through(&mut self, index: u64) {
        while self.cache.front().is_some_and(|entry| entry.index <= index) {
            if let Some(dropped) = self.cache.pop_front() {
                self.cache_bytes -= dropped.data.len() + dropped.context.len() + 32;
            }
        }
    }

    /// Entry `index` (after the snapshot, at or before the last index): from the cache, or read
    /// back from the log file and checked against its checksum.
    fn entry(&self, index: u64) -> io::Result<Entry> {
        if let Some(first) = self.cache.front() {
            if index >= first.index {
                return Ok(self.cache[(index - first.index) as usize].clone());
            }
        }
        let position = (index - self.snapshot.get_metadata().index - 1) as usize;
        let start = self.offsets[position];
        let end = self.offsets.get(position + 1).copied().unwrap_or(self.log_end);
        let mut record = vec![0; (end - start) as usize];
        self.log.read_exact_at(&mut record, start)?;
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("raft log record of entry {index}: {what}"));
        if record.len() < RECORD_HEADER_BYTES {
            return Err(invalid("shorter than its header"));
        }
        let stored_checksum = u32::from_le_bytes(record[4..8].try_into().expect("4 bytes"));
        let body = Bytes::from(record).slice(RECORD_HEADER_BYTES..);
        if crc32c::crc32c_append(self.checksum_seed, &body) != stored_checksum {
            return Err(invalid("checksum mismatch"));
        }
        let entry = decode_record(body).map_err(|error| invalid(&error.to_string()))?;
        if entry.index != index {
            return Err(invalid("another index"));
        }
        Ok(entry)
    }

    /// Where the log file is (tests damage it).
    pub fn log_path(&self) -> PathBuf {
        self.directory.join(LOG_FILE)
    }
}
