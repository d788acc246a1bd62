//! A shard whose log could not be written (a full disk: ENOSPC; EIO) holds back until a probe
//! write shows the disk takes writes again: what the hold does and why is `crate::write_hold`,
//! shared with the metadata group; this is the shard's side of it. The failed round acknowledged
//! nothing it could not persist, and the node was reopened from what is durable
//! (`restart_after`): it is a follower again, and a leader whose write failed has stepped down.

use super::ShardWorker;
use crate::write_hold::Notice;
use replication::node::NodeError;
use replication::Message;

impl ShardWorker {
    /// Notes a failed write (`crate::write_hold::WriteGuard::hold_after_failure`). `leader`: the
    /// leader the node knew before it was reopened (it knows none after), told it is held.
    pub(super) fn hold_after_write_failure(&mut self, error: &NodeError, leader: Option<u64>) {
        let notice = self.write_guard.hold_after_failure(error, leader, self.node.term());
        self.send_notices(notice);
    }

    /// Whether this node's shard is held (it does not tick its election timer).
    pub(super) fn write_held(&self) -> bool {
        self.write_guard.held()
    }

    /// On ticks: a probe write when one is due while held, and the notices due to the leader.
    pub(super) fn probe_while_held(&mut self) {
        let notices = self.write_guard.probe_while_held(self.node.leader(), self.node.term());
        self.send_notices(notices);
    }

    fn send_notices(&self, notices: impl IntoIterator<Item = Message>) {
        for notice in notices {
            self.transport.send(self.shard, notice);
        }
    }

    /// While held, a leadership offer, an append or a snapshot is refused (an offer answered
    /// with a held notice). Returns whether `message` was refused.
    pub(super) fn refuse_while_held(&self, message: &Message) -> bool {
        match self.write_guard.refuse_while_held(message, self.node.term()) {
            Some(answer) => {
                self.send_notices(answer);
                true
            }
            None => false,
        }
    }

    /// A peer's held or writing-again notice; a member that writes again is sent at once a
    /// snapshot it waits for. Returns whether `message` was one.
    pub(super) fn take_write_notice(&mut self, message: &Message) -> bool {
        let Some(notice) = self.write_guard.take_notice(message, self.ticks) else { return false };
        if let Notice::WritingAgain(from) = notice {
            if self.node.awaits_snapshot(from) {
                tracing::info!(shard = self.shard, to = %format!("{from:x}"), "a member writes again: its snapshot is sent again now");
                self.snapshots_in_flight.remove(&from);
                self.node.report_snapshot(from, false);
            }
        }
        true
    }

    /// Whether `peer` said lately that it cannot write its log.
    pub(super) fn peer_held(&self, peer: u64) -> bool {
        self.write_guard.peer_held(peer, self.ticks)
    }
}
