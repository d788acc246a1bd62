//! A snapshot from the leader replaced this node's machine: the entries it covers were never
//! applied here, so none of their outcomes came out. What this node had to do for them is found
//! in the machine instead: the deliveries the plan made to its consumers, and the confirms of its
//! own commands.
//!
//! Without this, a follower that fell behind the leader's compacted log (a busy node: the leader
//! compacts up to its own applied index) never sent its consumers the messages the skipped
//! entries delivered to them. Those stayed unacked, counted against the consumer's prefetch, for
//! as long as the consumer lived: a consumer with a prefetch of 1000 went on with the few credits
//! left, at a few thousand messages a second, or with none at all.

use super::ShardWorker;
use replication::command::{QueueCommand, QueueId};
use replication::state_machine::{CheckedOut, Outcome};
use std::collections::HashSet;

impl ShardWorker {
    /// Performs the plan's deliveries to this node's consumers that the snapshot skipped, and
    /// has the unconfirmed commands proposed again: those the snapshot holds come back
    /// `Duplicate`, in order, and count as confirmed.
    pub(super) fn after_snapshot_installed(&mut self, outcomes: &[Outcome]) {
        // Proposed again at the next round or tick, as for a new leader.
        self.proposed_to = (None, 0);
        let skipped = self.skipped_deliveries(outcomes);
        let mut performed = 0usize;
        for message in skipped {
            let CheckedOut { queue, consumer, position, redelivered, delivery_count, body } = message;
            if self.queue(queue).is_none_or(|local| local.was_handed(position)) {
                continue;
            }
            performed += 1;
            self.deliver(queue, consumer, position, redelivered, delivery_count, body);
        }
        self.handle.figures.deliveries_after_snapshot.fetch_add(performed as u64, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(
            shard = self.shard,
            performed,
            "this node installed a snapshot of the shard from its leader; the deliveries to its consumers the snapshot covered are performed now"
        );
    }

    /// The messages checked out to this node's consumers whose delivery no outcome of this round
    /// performs and whose settle is not on its way (taken by the shard, not committed yet).
    fn skipped_deliveries(&self, outcomes: &[Outcome]) -> Vec<CheckedOut> {
        let delivered_now: HashSet<(QueueId, u64)> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                Outcome::Delivered { queue, owner, position, .. } if *owner == self.proposer => Some((*queue, *position)),
                _ => None,
            })
            .collect();
        let settling: HashSet<(QueueId, u64)> = self
            .batcher
            .pending_commands()
            .filter_map(|proposed| match proposed.command {
                QueueCommand::Settle { position }
                | QueueCommand::Requeue { position }
                | QueueCommand::RequeueToTail { position }
                | QueueCommand::Reject { position } => Some((proposed.queue, position)),
                _ => None,
            })
            .collect();
        let mut checked_out = self.node.machine().checked_out_to(self.proposer);
        checked_out.retain(|message| {
            !delivered_now.contains(&(message.queue, message.position)) && !settling.contains(&(message.queue, message.position))
        });
        checked_out
    }
}
