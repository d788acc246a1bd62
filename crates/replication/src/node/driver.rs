//! The `Ready` loop: persist, sync once, then acknowledge; apply committed entries in order;
//! snapshot and compact when the applied log has grown.

use super::{Damage, NodeError, ReplicaNode};
use crate::state_machine::QueueStateMachine;

impl ReplicaNode {
    /// Handles everything raft-rs has ready: sends what may go before persistence (a leader's
    /// appends: its own fsync runs beside the followers'), persists entries, hard state and a
    /// received snapshot with one fdatasync, applies committed entries, then releases the
    /// messages that acknowledge what was persisted (votes, append responses).
    pub fn process_ready(&mut self) -> Result<(), NodeError> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut ready = self.raw.ready();
        self.outbox.extend(ready.take_messages());
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            let machine =
                QueueStateMachine::decode_image(snapshot.data.clone()).map_err(|error| NodeError::Write(std::io::Error::other(error)))?;
            self.raw.mut_store().apply_snapshot(snapshot)?;
            self.machine = machine;
            self.snapshots_installed += 1;
            self.compaction_candidate = None;
        }
        let appended = !ready.entries().is_empty();
        self.raw.mut_store().append(ready.entries())?;
        if let Some(hard_state) = ready.hs() {
            self.raw.mut_store().set_hard_state(hard_state)?;
        }
        if appended || ready.must_sync() {
            self.raw.store().sync()?;
        }
        let committed = ready.take_committed_entries();
        self.apply_entries(committed)?;
        self.outbox.extend(ready.take_persisted_messages());
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            self.raw.mut_store().set_commit(commit);
        }
        self.outbox.extend(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply_entries(committed)?;
        self.raw.advance_apply();
        self.check_repaired();
        self.maybe_compact()?;
        Ok(())
    }

    /// A damaged log is repaired once it holds everything the leader had committed when the
    /// node first heard from it: from then on it may vote and campaign again.
    fn check_repaired(&mut self) {
        if let Damage::CatchingUpTo(index) = self.damage {
            if self.raw.store().last_index_now() >= index && self.machine.applied_index() >= index {
                self.damage = Damage::None;
            }
        }
    }

    /// Each time the applied log passes the snapshot interval, the machine's image is taken there
    /// and the log compacted up to the image taken the time before, so the log keeps at least an
    /// interval of entries. Compacting up to the applied index (as this did) left a follower only
    /// a few entries behind (a busy node) to be sent the whole machine as a snapshot as soon as the
    /// leader probed it again (an election, a leadership hand-over): megabytes with a backlog.
    fn maybe_compact(&mut self) -> Result<(), NodeError> {
        let applied = self.machine.applied_index();
        let snapshot_index = self.raw.store().snapshot_ref().get_metadata().index;
        let since = self.compaction_candidate.as_ref().map_or(snapshot_index, |(index, _)| *index);
        if applied < since + self.config.snapshot_entries_interval {
            return Ok(());
        }
        let candidate = (applied, self.machine.encode_image());
        if let Some((index, image)) = self.compaction_candidate.replace(candidate) {
            self.raw.mut_store().compact(index, image)?;
        }
        Ok(())
    }
}
