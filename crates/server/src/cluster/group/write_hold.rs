//! The metadata group when its log could not be written (a full disk: ENOSPC; EIO): held until a
//! probe write shows the disk takes writes again, as the quorum shards are (`crate::write_hold`
//! says what the hold does and why), instead of stopping the node.
//!
//! The failed round acknowledged nothing it could not persist (its acknowledgements go out only
//! after the writes, in `process_ready`). The group then reopens from what is durable, which makes
//! a leader step down, and while held:
//! - it does not tick (no campaign) and refuses the leader's appends and snapshots;
//! - it drops messages of a later term than its own: taking one means writing the new term
//!   durably, which would fail and cost a reopen at every heartbeat of a leader elected since;
//! - changes proposed through it are refused (`ClusterState::propose`, 541 as when no majority
//!   can commit): it could not make them durable here, so it must not answer them as done;
//! - what it serves that needs no new definition goes on (queues, connections).
//!
//! Once a probe write works it ticks again, takes the leader's term, and catches up from the
//! leader's log, or its snapshot (sent again at once: the node tells the leader it writes again),
//! applying the changes it missed, with no restart.

use super::{Applier, GroupDriver, METADATA_GROUP};
use crate::write_hold::Notice;
use protobuf::Message as _;
use raft::eraftpb::Message;
use raft::{ProgressState, SnapshotStatus};

impl<A: Applier> GroupDriver<A> {
    /// A write or sync failed: the group reopens from what is durable and is held.
    pub(super) fn hold_after_write_failure(&mut self, error: &std::io::Error) {
        let node_id = self.storage.config.id;
        let leader = Some(self.raw.raft.leader_id).filter(|leader| *leader != 0 && *leader != node_id);
        let notice = self.write_guard.hold_after_failure(error, leader, self.raw.raft.term);
        self.send_notices(notice);
        match self.storage.open(Some(self.applied)) {
            Ok((raw, _recovery)) => {
                self.raw = raw;
                // A leader that stepped down no longer waits for the snapshots it sent.
                self.snapshots_in_flight.clear();
            }
            // The node goes on with the node it had; the next failed write tries again.
            Err(error) => tracing::error!(%error, "reopening the metadata group's log failed; trying again at the next failure"),
        }
    }

    /// On ticks: a probe write when one is due while held, and the notices due to the leader.
    pub(super) fn probe_while_held(&mut self) {
        let leader = Some(self.raw.raft.leader_id).filter(|leader| *leader != 0);
        let notices = self.write_guard.probe_while_held(leader, self.raw.raft.term);
        self.send_notices(notices);
    }

    /// While held: a leadership offer (answered with a held notice), an append, a snapshot, or
    /// any message of a later term is refused. Returns whether `message` was refused.
    pub(super) fn refuse_while_held(&mut self, message: &Message) -> bool {
        let term = self.raw.raft.term;
        match self.write_guard.refuse_while_held(message, term) {
            Some(answer) => {
                self.send_notices(answer);
                true
            }
            None => self.write_guard.held() && message.term > term,
        }
    }

    /// A peer's held or writing-again notice; a member that writes again is sent at once a
    /// snapshot it waits for. Returns whether `message` was one.
    pub(super) fn take_write_notice(&mut self, message: &Message) -> bool {
        let Some(notice) = self.write_guard.take_notice(message, self.ticks) else { return false };
        let Notice::WritingAgain(from) = notice else { return true };
        let awaits_snapshot = self.raw.raft.prs().get(from).is_some_and(|progress| progress.state == ProgressState::Snapshot);
        if awaits_snapshot {
            tracing::info!(to = %format!("{from:x}"), "a member writes its metadata log again: its snapshot is sent again now");
            self.snapshots_in_flight.remove(&from);
            self.raw.report_snapshot(from, SnapshotStatus::Failure);
        }
        true
    }

    /// Whether this node is the group's only voter.
    pub(super) fn sole_voter(&self) -> bool {
        let voters = self.raw.raft.prs().conf().voters().ids();
        voters.len() == 1 && voters.contains(self.storage.config.id)
    }

    fn send_notices(&self, notices: impl IntoIterator<Item = Message>) {
        for notice in notices {
            match notice.write_to_bytes() {
                Ok(bytes) => {
                    // Not queued (no link, or its queue full): the notice is said again at the
                    // next probe.
                    let _ = self.links.send_raft(notice.to, METADATA_GROUP, bytes.into());
                }
                Err(error) => tracing::error!(%error, "a Raft message did not encode"),
            }
        }
    }
}
