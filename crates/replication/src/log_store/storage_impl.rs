//! raft-rs reads the log through its `Storage` trait.

use super::LogStore;
use raft::eraftpb::{Entry, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

impl raft::Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(&self, low: u64, high: u64, max_size: impl Into<Option<u64>>, _context: GetEntriesContext) -> raft::Result<Vec<Entry>> {
        let snapshot_index = self.snapshot.get_metadata().index;
        if low <= snapshot_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        assert!(high <= self.last_index_now() + 1, "entries up to {high} asked, the log ends at {}", self.last_index_now());
        let max_size = max_size.into().unwrap_or(u64::MAX);
        let mut entries = Vec::with_capacity((high - low).min(1024) as usize);
        let mut size = 0u64;
        for index in low..high {
            // A read that fails is reported as the log ending there: raft-rs asks again later (an
            // entry whose record went bad on disk is damage, found again at the next start).
            let entry = self.entry(index).map_err(|error| raft::Error::Store(StorageError::Other(Box::new(error))))?;
            size += u64::from(protobuf::Message::compute_size(&entry));
            if !entries.is_empty() && size > max_size {
                break;
            }
            entries.push(entry);
        }
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        let metadata = self.snapshot.get_metadata();
        if index == metadata.index {
            return Ok(metadata.term);
        }
        if index < metadata.index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        match self.terms.get((index - metadata.index - 1) as usize) {
            Some(term) => Ok(*term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.snapshot.get_metadata().index + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index_now())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.get_metadata().index < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}
