//! Quorum shard membership by hand: RabbitMQ's `rabbitmq-queues grow`, `shrink`, `add_member`
//! and `delete_member`, mapped onto shards (docs/cluster.md, "Shard membership by hand").
//!
//! A quorum queue lives on a shard, a Raft group many queues share, so membership is per shard:
//! `grow` and `shrink` act on every shard (as RabbitMQ's act on every queue), `add_member` and
//! `delete_member` on the queue's shard, which the answer names with the queues it holds. Every
//! cluster member runs every shard (a learner serves its clients from its own apply), so a node
//! shrunk out of a shard stays in it as a learner, and one grown is promoted from learner.
//!
//! The choice is a metadata command (`ShardRole`), so every node holds it, a shard's next leader
//! follows it as its current one did, and a restart or a snapshot keeps it; each shard's leader
//! makes it so one change at a time (`quorum/shard/membership.rs`).

use super::command::MetadataCommand;
use super::Cluster;
use replication::transport::ShardId;
use std::time::{Duration, Instant};

/// How long a role change waits for every shard named to show the new role here (below `lepus
/// ctl`'s 30 s request timeout, so the command hears why).
const ROLE_CHANGE_WAIT_MS: u64 = 20_000;

/// Which shards a change acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardSelection {
    /// Every shard (`grow NODE all`, `shrink NODE`).
    All,
    /// The shards with an even number of voters (`grow NODE even`).
    Even,
    /// One shard (a queue's: `add_member`, `delete_member`).
    One(ShardId),
}

impl ShardSelection {
    /// Whether this selection takes `shard`, which has `voters` voters.
    pub fn takes(self, shard: ShardId, voters: usize) -> bool {
        match self {
            ShardSelection::All => true,
            ShardSelection::Even => voters.is_multiple_of(2),
            ShardSelection::One(one) => one == shard,
        }
    }
}

/// Why a role change was refused or did not complete (RabbitMQ's errors, by node name).
#[derive(Debug, thiserror::Error)]
pub enum ShardRoleError {
    /// The node is not a member of the cluster.
    #[error("node {0} is not a member of this cluster")]
    UnknownNode(String),
    /// A node must run to be made a voter (it must catch up first).
    #[error("node {0} is not running")]
    NotRunning(String),
    /// The node is a shard's only voter.
    #[error("node {node} is the last voter of quorum shard {shard}: it cannot stop voting")]
    LastVoter {
        /// The node.
        node: String,
        /// The shard.
        shard: ShardId,
    },
    /// Its voters without the node would not have a running majority.
    #[error("node {node} does not stop voting: {reason}")]
    NoMajority {
        /// The node.
        node: String,
        /// Which shard, and what runs.
        reason: String,
    },
    /// The metadata group did not commit the choice.
    #[error("{0}")]
    NotCommitted(String),
    /// The choice is recorded, but a shard did not show it in time.
    #[error("the role is recorded, but quorum shard {shard} does not show node {node} as a {role} yet after {seconds} s (its leader makes it so once the node caught up and a majority runs)")]
    Pending {
        /// The node.
        node: String,
        /// The shard.
        shard: ShardId,
        /// voter or learner.
        role: &'static str,
        /// How long it waited.
        seconds: u64,
    },
}

impl Cluster {
    /// Makes member `name` a voter (`voter`) or a learner of the `selection`'s shards; returns the
    /// shards it acted on once this node's view of each shows the role.
    pub fn choose_shard_role(&self, name: &str, selection: ShardSelection, voter: bool) -> Result<Vec<ShardId>, ShardRoleError> {
        let members = self.members();
        let member = members.iter().find(|member| member.name == name).ok_or_else(|| ShardRoleError::UnknownNode(name.to_string()))?;
        if voter && !member.running {
            return Err(ShardRoleError::NotRunning(name.to_string()));
        }
        let Some(broker) = self.broker() else { return Err(ShardRoleError::NotCommitted("the broker is shutting down".to_string())) };
        let shard_members = broker.quorum.shard_member_ids();
        let shards: Vec<ShardId> =
            (0..shard_members.len() as ShardId).filter(|shard| selection.takes(*shard, shard_members[*shard as usize].0.len())).collect();
        if !voter {
            for &shard in &shards {
                let voters = &shard_members[shard as usize].0;
                if voters.iter().all(|other| *other == member.id) && voters.contains(&member.id) {
                    return Err(ShardRoleError::LastVoter { node: name.to_string(), shard });
                }
            }
            let connected = |id: u64| members.iter().any(|other| other.id == id && other.running);
            broker
                .quorum
                .check_voters_without(member.id, |shard| shards.contains(&shard), connected)
                .map_err(|reason| ShardRoleError::NoMajority { node: name.to_string(), reason })?;
        }
        if shards.is_empty() {
            return Ok(shards);
        }
        let command = MetadataCommand::ShardRole { node: member.id, shards: shards.clone(), voter };
        self.propose(command).map_err(|error| ShardRoleError::NotCommitted(error.to_string()))?;
        self.wait_for_roles(&broker.quorum, member.id, name, &shards, voter)?;
        Ok(shards)
    }

    /// Waits until this node's view of every shard in `shards` shows `node` in its role.
    fn wait_for_roles(
        &self,
        quorum: &crate::quorum::QuorumHost,
        node: u64,
        name: &str,
        shards: &[ShardId],
        voter: bool,
    ) -> Result<(), ShardRoleError> {
        let deadline = Instant::now() + Duration::from_millis(ROLE_CHANGE_WAIT_MS);
        loop {
            let members = quorum.shard_member_ids();
            let pending = shards.iter().copied().find(|shard| {
                let (voters, learners) = &members[*shard as usize];
                if voter {
                    !voters.contains(&node)
                } else {
                    !learners.contains(&node)
                }
            });
            let Some(shard) = pending else { return Ok(()) };
            if Instant::now() >= deadline {
                let role = if voter { "voter" } else { "learner" };
                return Err(ShardRoleError::Pending { node: name.to_string(), shard, role, seconds: ROLE_CHANGE_WAIT_MS / 1000 });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
