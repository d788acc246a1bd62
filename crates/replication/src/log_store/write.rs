//! Writing a group's state: appends (no sync), the one sync per `Ready`, the hard state, and
//! snapshots with the compaction they allow.

use super::{encode_record, LogStore, HARD_STATE_FILE, LOG_FILE, SNAPSHOT_FILE};
use crate::codec::{append_checksum, Writer};
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use std::io;
use storage::file_system::OpenMode;

fn encode_voters(writer: &mut Writer, conf_state: &ConfState) {
    writer.u32(conf_state.voters.len() as u32);
    for voter in &conf_state.voters {
        writer.u64(*voter);
    }
}

/// The learners, after everything a file held before learners existed (a file written before
/// them ends where they would start, and reads as "no learners").
fn encode_learners(writer: &mut Writer, conf_state: &ConfState) {
    writer.u32(conf_state.learners.len() as u32);
    for learner in &conf_state.learners {
        writer.u64(*learner);
    }
}

impl LogStore {
    /// Appends entries from raft-rs (not synced: see [`LogStore::sync`]). Entries at or below the
    /// last index replace the log from there on: a new leader overwrote an unacknowledged suffix.
    /// A write that fails (a full disk) leaves the store as it was before the write: the caller
    /// may append the same entries again once there is room.
    pub fn append(&mut self, entries: &[Entry]) -> io::Result<()> {
        let Some(first) = entries.first() else { return Ok(()) };
        let snapshot_index = self.snapshot.get_metadata().index;
        assert!(first.index > snapshot_index, "append of entry {} at or below the snapshot {snapshot_index}", first.index);
        assert!(first.index <= self.last_index_now() + 1, "append of entry {} leaves a gap after {}", first.index, self.last_index_now());
        let keep = (first.index - snapshot_index - 1) as usize;
        if keep < self.offsets.len() {
            // The file first: when it cannot be cut, nothing changed.
            self.log.set_len(self.offsets[keep])?;
            self.log_end = self.offsets[keep];
            self.offsets.truncate(keep);
            self.terms.truncate(keep);
            self.cache_drop_from(first.index);
        }
        let mut buffer = Vec::new();
        let mut offsets = Vec::with_capacity(entries.len());
        for entry in entries {
            offsets.push(self.log_end + buffer.len() as u64);
            encode_record(&mut buffer, entry, self.checksum_seed);
        }
        if let Err(error) = self.log.write_all_at(&buffer, self.log_end) {
            // Part of the records may have landed past the end: cut off, so the file ends where
            // the store says (if even that fails, recovery cuts them as a torn tail). Before, the
            // store counted the entries it had failed to write: its last index and its cache
            // held entries that were on no disk.
            let _ = self.log.set_len(self.log_end);
            return Err(error);
        }
        self.offsets.extend(offsets);
        self.terms.extend(entries.iter().map(|entry| entry.term));
        for entry in entries {
            self.cache_push(entry.clone());
        }
        self.log_end += buffer.len() as u64;
        Ok(())
    }

    /// fdatasyncs the log: everything appended is durable when this returns.
    pub fn sync(&self) -> io::Result<()> {
        self.log.sync_data()
    }

    /// Records raft-rs's hard state. A change of term or vote is made durable before this
    /// returns (a vote must survive a crash before it is sent); a commit index alone is kept in
    /// memory and written with the next durable change (a lower one after a crash is safe).
    pub fn set_hard_state(&mut self, hard_state: &HardState) -> io::Result<()> {
        let durable_change = hard_state.term != self.hard_state.term || hard_state.vote != self.hard_state.vote;
        self.hard_state = hard_state.clone();
        if durable_change {
            self.write_hard_state()?;
        }
        Ok(())
    }

    /// Records the group's members after a membership change was applied; durable before this
    /// returns (a restart must know who votes).
    pub fn set_conf_state(&mut self, conf_state: ConfState) -> io::Result<()> {
        self.conf_state = conf_state;
        self.write_hard_state()
    }

    /// Records the members after the membership change of entry `index` was applied, durably:
    /// a restart starts from these members and does not apply that change again (replaying an
    /// older change over a newer configuration would undo it for a while).
    pub fn set_conf_state_at(&mut self, conf_state: ConfState, index: u64) -> io::Result<()> {
        self.conf_index = self.conf_index.max(index);
        self.set_conf_state(conf_state)
    }

    /// Raises the commit index (raft-rs's `LightReady::commit_index`).
    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    /// Writes `bytes` to `name` through a temporary file, a rename and a directory sync.
    fn replace_file(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let temporary = self.directory.join(format!("{name}.tmp"));
        let _ = self.file_system.remove_file(&temporary);
        let file = self.file_system.open(&temporary, OpenMode::CreateReadWrite)?;
        file.write_all_at(bytes, 0)?;
        file.sync_data()?;
        self.file_system.rename(&temporary, &self.directory.join(name))?;
        self.file_system.sync_directory(&self.directory)
    }

    pub(super) fn write_hard_state(&self) -> io::Result<()> {
        let mut buffer = Vec::new();
        let mut writer = Writer(&mut buffer);
        writer.u64(self.hard_state.term);
        writer.u64(self.hard_state.vote);
        writer.u64(self.hard_state.commit);
        encode_voters(&mut writer, &self.conf_state);
        encode_learners(&mut writer, &self.conf_state);
        writer.u64(self.conf_index);
        append_checksum(&mut buffer, 0, self.checksum_seed);
        // One after the other, each replaced atomically: a crash between leaves the first newer
        // and both readable (recovery takes the newer); damage at rest leaves the other.
        self.replace_file(HARD_STATE_FILE, &buffer)?;
        self.replace_file(super::HARD_STATE_COPY_FILE, &buffer)
    }

    fn write_snapshot(&self) -> io::Result<()> {
        let metadata = self.snapshot.get_metadata();
        let mut buffer = Vec::new();
        let mut writer = Writer(&mut buffer);
        writer.u64(metadata.index);
        writer.u64(metadata.term);
        encode_voters(&mut writer, metadata.get_conf_state());
        writer.bytes(&self.snapshot.data);
        encode_learners(&mut writer, metadata.get_conf_state());
        append_checksum(&mut buffer, 0, self.checksum_seed);
        self.replace_file(SNAPSHOT_FILE, &buffer)
    }

    /// Installs a snapshot received from the leader: it replaces the whole log.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot) -> io::Result<()> {
        let metadata = snapshot.get_metadata();
        self.hard_state.term = self.hard_state.term.max(metadata.term);
        self.hard_state.commit = metadata.index;
        self.conf_state = metadata.get_conf_state().clone();
        self.conf_index = self.conf_index.max(metadata.index);
        self.snapshot = snapshot;
        self.write_snapshot()?;
        self.offsets.clear();
        self.terms.clear();
        self.cache.clear();
        self.cache_bytes = 0;
        self.rewrite_log(self.log_end)?;
        self.write_hard_state()
    }

    /// Takes a snapshot of the state machine at `applied_index` (`image`) and drops the log up to
    /// there. The snapshot is durable before the log shrinks, so a crash in between only leaves
    /// records the next recovery skips.
    pub fn compact(&mut self, applied_index: u64, image: Vec<u8>) -> io::Result<()> {
        let snapshot_index = self.snapshot.get_metadata().index;
        if applied_index <= snapshot_index {
            return Ok(());
        }
        assert!(applied_index <= self.hard_state.commit, "snapshot at {applied_index} past the commit index {}", self.hard_state.commit);
        let drop = (applied_index - snapshot_index) as usize;
        let term = self.terms[drop - 1];
        let mut snapshot = Snapshot { data: image.into(), ..Default::default() };
        let metadata = snapshot.mut_metadata();
        metadata.index = applied_index;
        metadata.term = term;
        metadata.set_conf_state(self.conf_state.clone());
        self.snapshot = snapshot;
        self.write_snapshot()?;
        let kept_from = self.offsets.get(drop).copied().unwrap_or(self.log_end);
        self.offsets.drain(..drop);
        self.terms.drain(..drop);
        self.cache_drop_through(applied_index);
        self.rewrite_log(kept_from)
    }

    /// Makes the records from byte `kept_from` on the whole new log file (records do not depend
    /// on where they sit: their checksums are seeded by the group, not the offset).
    fn rewrite_log(&mut self, kept_from: u64) -> io::Result<()> {
        let mut kept = vec![0; (self.log_end - kept_from) as usize];
        self.log.read_exact_at(&mut kept, kept_from)?;
        for offset in &mut self.offsets {
            *offset -= kept_from;
        }
        self.replace_file(LOG_FILE, &kept)?;
        self.log = self.file_system.open(&self.directory.join(LOG_FILE), OpenMode::ReadWrite)?;
        self.log_end = kept.len() as u64;
        Ok(())
    }
}
