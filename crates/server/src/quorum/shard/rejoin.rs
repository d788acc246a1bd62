//! A node that formed a cluster of one (a cluster port, no seeds) and then joins another with
//! `lepus ctl cluster join` leaves the shard groups it formed alone: each shard drops its
//! one-node log and opens again empty, without voters, exactly as the shards of a node that
//! joins through the seeds open at its first start. The join's answer then names the founding
//! voters (`ShardInput::InitialVoters`), the shard's log starts from them, and every shard's
//! leader adds the node as a learner (`membership.rs`).
//!
//! Nothing of the old groups is carried over: the join is refused before this runs when the node
//! made any definition change, and a shard that holds a queue (other than the cluster's internal
//! delay store, which every clustered node makes by itself) or a delayed message refuses too.

use super::{fail, first_batcher, ShardWorker};
use crate::delayed::replicated::STORE_QUEUE_NAME;
use replication::node::ReplicaNode;

impl ShardWorker {
    /// What this shard holds that leaving its group would discard, for the operator: quorum
    /// queues by `vhost/name`, and the delay store's held messages.
    pub(super) fn holdings(&self) -> Vec<String> {
        let machine = self.node.machine();
        let mut held = Vec::new();
        for (key, id) in machine.queue_names() {
            let (vhost, name) = match key.iter().position(|byte| *byte == 0) {
                Some(split) => (&key[..split], &key[split + 1..]),
                None => (&key[..0], key),
            };
            if vhost.is_empty() && name == STORE_QUEUE_NAME.as_bytes() {
                let count = machine.delayed(id).map_or(0, |entries| entries.len());
                if count > 0 {
                    held.push(format!("{count} delayed messages"));
                }
                continue;
            }
            held.push(format!("quorum queue '{}' in vhost '{}'", String::from_utf8_lossy(name), String::from_utf8_lossy(vhost)));
        }
        held
    }

    /// Leaves the group this node formed alone: its log, hard state and snapshot are removed and
    /// the shard opens again empty, waiting for the founding voters of the cluster it joins.
    /// Refused (nothing changed) when the shard holds anything.
    pub(super) fn rejoin(&mut self) -> Result<(), String> {
        let held = self.holdings();
        if !held.is_empty() {
            return Err(format!("quorum shard {} holds {}", self.shard, held.join(", ")));
        }
        let directory = self.config.data_dir.join("raft").join(format!("shard-{}", self.shard));
        self.config
            .file_system
            .remove_dir_all(&directory)
            .map_err(|error| format!("removing quorum shard {} ({}): {error}", self.shard, directory.display()))?;
        // Without voters, as a node that joins through the seeds opens its shards: the log starts
        // once the join's answer names the founding voters.
        self.node_config.voters = Vec::new();
        self.config.voters = Vec::new();
        let (node, _) = ReplicaNode::open(self.node_config.clone(), self.config.file_system.clone(), &directory)
            .map_err(|error| format!("opening quorum shard {} empty: {error}", self.shard))?;
        self.node = node;
        // Commands proposed to the old group are never committed in the new one.
        for proposed in self.proposed.drain(..) {
            fail(proposed.waiter);
        }
        for submission in self.unresolved.drain(..) {
            fail(submission.waiter);
        }
        self.batcher = first_batcher(self.proposer, self.config.node_id);
        // Queues bound to the old group (the internal delay store's) are found by name in the new
        // one once it caught up, as at a restart.
        for (_, queue) in self.queues.drain() {
            if let Some(queue) = queue.upgrade() {
                queue.set_id(0);
                self.recovered.push(queue);
            }
        }
        if let Some(hook) = self.delayed.as_mut() {
            hook.firing.clear();
        }
        self.proposed_to = (None, 0);
        self.last_heard.clear();
        self.released.clear();
        self.latency_probe = None;
        self.membership_held_at_tick = 0;
        self.commit_at_membership_check = None;
        self.dead_letter_retry = crate::quorum::dead_letter_retry::DeadLetterRetry::new(self.config.dead_letter_retry_interval_ms);
        tracing::info!(shard = self.shard, "left the quorum shard's one-node group; waiting for the joined cluster's voters");
        Ok(())
    }
}
