//! Opening a group's state: the hard state, the snapshot, then the log read front to back.

use super::{
    decode_record, io_error, read_all, LogStore, LogStoreError, Recovery, HARD_STATE_COPY_FILE, HARD_STATE_FILE, LOG_FILE,
    RECORD_BYTES_MAX, RECORD_HEADER_BYTES, SNAPSHOT_FILE,
};
use crate::codec::{verify_checksum, DecodeError, Reader};
use bytes::Bytes;
use raft::eraftpb::{ConfState, HardState, Snapshot};
use std::path::Path;
use storage::file_system::{OpenMode, SharedFileSystem};

/// The hard state file: term, vote, commit, the voters, then (files written since learners
/// exist) the learners and the index of the membership change the members come from.
pub(super) fn decode_hard_state(bytes: Bytes, checksum_seed: u32) -> Result<(HardState, ConfState, u64), DecodeError> {
    let mut reader = Reader::new(verify_checksum(&bytes, checksum_seed)?);
    let hard_state = HardState { term: reader.u64()?, vote: reader.u64()?, commit: reader.u64()?, ..Default::default() };
    let mut conf_state = decode_voters(&mut reader)?;
    let mut conf_index = 0;
    if reader.remaining() > 0 {
        conf_state.learners = decode_learners(&mut reader)?;
        conf_index = reader.u64()?;
    }
    Ok((hard_state, conf_state, conf_index))
}

/// What the two copies of the hard state hold.
enum StoredHardState {
    /// Neither exists: a new group.
    Fresh,
    /// The newer readable copy.
    Read(HardState, ConfState, u64),
    /// One or both exist and neither is readable.
    Damaged,
}

/// Reads both copies of the hard state and takes the newer readable one. Each write replaces the
/// first, then the second, so they differ only after a crash between the two: then the first is
/// newer. Term, vote, membership index and commit only grow between writes (a vote only from none
/// to a node within a term), which orders any two copies without knowing which file was first.
fn read_hard_state(
    file_system: &SharedFileSystem,
    directory: &Path,
    checksum_seed: u32,
    recovery: &mut Recovery,
) -> Result<StoredHardState, LogStoreError> {
    let mut newest: Option<(HardState, ConfState, u64)> = None;
    let mut found = false;
    for name in [HARD_STATE_FILE, HARD_STATE_COPY_FILE] {
        let path = directory.join(name);
        if !file_system.exists(&path) {
            continue;
        }
        found = true;
        let file = file_system.open(&path, OpenMode::Read).map_err(io_error(&path))?;
        let bytes = read_all(file.as_ref()).map_err(io_error(&path))?;
        let Ok(stored) = decode_hard_state(Bytes::from(bytes), checksum_seed) else {
            recovery.hard_state_copies_damaged += 1;
            continue;
        };
        let age = |(hard_state, _, conf_index): &(HardState, ConfState, u64)| {
            (hard_state.term, hard_state.vote != 0, *conf_index, hard_state.commit)
        };
        if newest.as_ref().is_none_or(|current| age(&stored) > age(current)) {
            newest = Some(stored);
        }
    }
    Ok(match newest {
        Some((hard_state, conf_state, conf_index)) => StoredHardState::Read(hard_state, conf_state, conf_index),
        None if found => StoredHardState::Damaged,
        None => StoredHardState::Fresh,
    })
}

fn decode_learners(reader: &mut Reader) -> Result<Vec<u64>, DecodeError> {
    let count = reader.u32()?;
    if count as usize > reader.remaining() / 8 {
        return Err(DecodeError::Invalid { field: "learner count", value: count.into() });
    }
    (0..count).map(|_| reader.u64()).collect()
}

pub(super) fn decode_voters(reader: &mut Reader) -> Result<ConfState, DecodeError> {
    let count = reader.u32()?;
    if count as usize > reader.remaining() / 8 {
        return Err(DecodeError::Invalid { field: "voter count", value: count.into() });
    }
    let mut conf_state = ConfState::default();
    for _ in 0..count {
        conf_state.voters.push(reader.u64()?);
    }
    Ok(conf_state)
}

/// The snapshot file: index, term, voters, the state machine image.
pub(super) fn decode_snapshot(bytes: Bytes, checksum_seed: u32) -> Result<Snapshot, DecodeError> {
    let mut reader = Reader::new(verify_checksum(&bytes, checksum_seed)?);
    let mut snapshot = Snapshot::default();
    let metadata = snapshot.mut_metadata();
    metadata.index = reader.u64()?;
    metadata.term = reader.u64()?;
    metadata.set_conf_state(decode_voters(&mut reader)?);
    snapshot.data = reader.bytes()?;
    if reader.remaining() > 0 {
        snapshot.mut_metadata().mut_conf_state().learners = decode_learners(&mut reader)?;
    }
    Ok(snapshot)
}

pub(super) fn open(
    file_system: SharedFileSystem,
    directory: &Path,
    checksum_seed: u32,
    voters: &[u64],
) -> Result<(LogStore, Recovery), LogStoreError> {
    let fresh = !file_system.exists(directory);
    file_system.create_dir_all(directory).map_err(io_error(directory))?;
    if fresh {
        if let Some(parent) = directory.parent() {
            file_system.sync_directory(parent).map_err(io_error(parent))?;
        }
    }
    let mut recovery = Recovery::default();
    let mut conf_state = ConfState { voters: voters.to_vec(), ..Default::default() };
    let mut hard_state = HardState::default();
    let mut conf_index = 0;
    let hard_state_path = directory.join(HARD_STATE_FILE);
    match read_hard_state(&file_system, directory, checksum_seed, &mut recovery)? {
        StoredHardState::Fresh => {}
        StoredHardState::Read(stored, stored_conf_state, stored_conf_index) => {
            (hard_state, conf_state, conf_index) = (stored, stored_conf_state, stored_conf_index)
        }
        // The vote is unknown: the node must not vote until repaired.
        StoredHardState::Damaged => recovery.damaged = true,
    }
    let mut snapshot = Snapshot::default();
    snapshot.mut_metadata().set_conf_state(conf_state.clone());
    let snapshot_path = directory.join(SNAPSHOT_FILE);
    if file_system.exists(&snapshot_path) {
        let file = file_system.open(&snapshot_path, OpenMode::Read).map_err(io_error(&snapshot_path))?;
        let bytes = read_all(file.as_ref()).map_err(io_error(&snapshot_path))?;
        snapshot = decode_snapshot(Bytes::from(bytes), checksum_seed)
            .map_err(|source| LogStoreError::Snapshot { path: snapshot_path.clone(), source })?;
        if hard_state.term < snapshot.get_metadata().term {
            hard_state.term = snapshot.get_metadata().term;
        }
    }
    let log_path = directory.join(LOG_FILE);
    let log = file_system.open(&log_path, OpenMode::CreateReadWrite).map_err(io_error(&log_path))?;
    let mut store = LogStore {
        file_system,
        directory: directory.to_path_buf(),
        checksum_seed,
        log,
        log_end: 0,
        offsets: Vec::new(),
        terms: Vec::new(),
        cache: Default::default(),
        cache_bytes: 0,
        cache_bytes_max: super::LOG_CACHE_BYTES_MAX,
        hard_state,
        conf_state,
        conf_index,
        snapshot,
    };
    store.conf_index = store.conf_index.max(store.snapshot.get_metadata().index);
    store.read_log(&mut recovery).map_err(io_error(&log_path))?;
    // A node never holds an entry of a term above its own (a lost hard state would say 0).
    if let Some(last) = store.terms.last() {
        store.hard_state.term = store.hard_state.term.max(*last);
    }
    let snapshot_index = store.snapshot.get_metadata().index;
    let last_index = store.last_index_now();
    // A commit index recorded before a compaction may trail the snapshot; one past the log (a
    // damaged log lost its tail) is lowered: raft-rs learns the true commit from the leader.
    store.hard_state.commit = store.hard_state.commit.clamp(snapshot_index, last_index);
    if fresh {
        store.write_hard_state().map_err(io_error(&hard_state_path))?;
    }
    Ok((store, recovery))
}

impl LogStore {
    /// Reads every record, stopping at a torn tail or at damage, and cuts the file there.
    fn read_log(&mut self, recovery: &mut Recovery) -> std::io::Result<()> {
        let contents = Bytes::from(read_all(self.log.as_ref())?);
        let mut offset = 0usize;
        let mut expected_index = self.snapshot.get_metadata().index + 1;
        while offset < contents.len() {
            let remaining = contents.len() - offset;
            if remaining < RECORD_HEADER_BYTES {
                recovery.torn_tail_bytes = remaining as u64;
                break;
            }
            let length = u32::from_le_bytes(contents[offset..offset + 4].try_into().expect("4 bytes"));
            if length > RECORD_BYTES_MAX {
                recovery.damaged = true;
                break;
            }
            let end = offset + RECORD_HEADER_BYTES + length as usize;
            if end > contents.len() {
                recovery.torn_tail_bytes = remaining as u64;
                break;
            }
            let stored_checksum = u32::from_le_bytes(contents[offset + 4..offset + 8].try_into().expect("4 bytes"));
            let body = contents.slice(offset + RECORD_HEADER_BYTES..end);
            let decoded = match crc32c::crc32c_append(self.checksum_seed, &body) == stored_checksum {
                true => decode_record(body),
                false => Err(DecodeError::Checksum),
            };
            let Ok(entry) = decoded else {
                recovery.damaged = true;
                break;
            };
            if entry.index < expected_index {
                // Records before the snapshot, left by a compaction cut short: already covered.
                offset = end;
                continue;
            }
            if entry.index != expected_index {
                recovery.damaged = true;
                break;
            }
            self.offsets.push(offset as u64);
            self.terms.push(entry.term);
            self.cache_push(entry);
            recovery.records += 1;
            expected_index += 1;
            offset = end;
        }
        if offset < contents.len() {
            self.log.set_len(offset as u64)?;
            self.log.sync_data()?;
        }
        self.log_end = offset as u64;
        Ok(())
    }
}
