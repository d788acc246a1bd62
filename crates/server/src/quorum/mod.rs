//! Quorum queues at runtime: the node's host of the replicated shards (docs/replication.md).
//!
//! A node runs a few Raft groups, the shards, each on its own thread ([`shard`]): the thread owns
//! the shard's `replication::ReplicaNode` and its `Batcher`, takes commands from the queues'
//! callers through a channel, cuts them into one Raft entry per round (the commands that arrived
//! while the previous round's fdatasync ran: group commit), proposes it (or forwards it to the
//! leader), persists and syncs, sends the Raft messages, applies what is committed and performs
//! what the node must: filling the confirm slots of its own publishes ([`tickets`]), handing the
//! delivery plan's messages to its own consumers, answering basic.get, dead-lettering as leader.
//! Nothing here blocks an async worker: the callers only send to a channel (a declare, consume,
//! purge or delete waits for its commit the way declarations wait for the definitions file).
//!
//! A queue is a [`QuorumQueue`] ([`queue`]); the seam's `Queue::Quorum` holds one.
//!
//! On a node alone every shard is a group of one: a commit is the node's own fdatasync.

mod dead_letter_retry;
pub mod envelope;
pub(crate) mod queue;
pub(crate) mod shard;
pub mod tickets;

pub use dead_letter_retry::DEAD_LETTER_RETRY_INTERVAL_MS_DEFAULT;
pub use queue::QuorumQueue;
pub use shard::ShardFigures;
pub use tickets::{CommitSlot, ConfirmGate};

use crate::dead_letter::DeadLetterSender;
use replication::transport::{PeerTransport, ShardId};
use replication::Message;
use shard::{ShardHandle, ShardInput};
use std::path::PathBuf;
use std::sync::Arc;
use storage::file_system::SharedFileSystem;

/// How a node runs its shards.
#[derive(Clone)]
pub struct HostConfig {
    /// This node's Raft id (non-zero); 1 on a node alone.
    pub node_id: u64,
    /// Every voter of every shard, this node included.
    pub voters: Vec<u64>,
    /// How many shards (Raft groups) quorum queues are spread over. Fixed when the cluster is
    /// made: a queue's shard is a hash of its name modulo this.
    pub shards: u32,
    /// Where each shard keeps its log, hard state and snapshot (`raft/shard-<n>/` under it).
    pub data_dir: PathBuf,
    /// The Raft tick.
    pub tick_ms: u64,
    /// Ticks without a leader before a follower campaigns.
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Applied entries between snapshots.
    pub snapshot_entries_interval: u64,
    /// Ticks a leader goes without hearing from a node before it releases that node's consumers
    /// and basic.gets (their messages are redelivered elsewhere).
    pub node_down_ticks: u64,
    /// The disk.
    pub file_system: SharedFileSystem,
    /// How long a held (at-least-once) dead letter that was not settled waits before its leader
    /// publishes it again.
    pub dead_letter_retry_interval_ms: u64,
}

/// How long the host waits for a shard's thread to answer a question (one round: a tick and an
/// fdatasync at most, unless its disk hangs).
const SHARD_ANSWER_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// Shards a node runs by default: with three nodes, one leader each (docs/replication.md).
pub const SHARDS_DEFAULT: u32 = 3;

impl HostConfig {
    /// A node alone, with the design's timings: a tick of 100 ms, elections after 1 s.
    pub fn single_node(data_dir: PathBuf, shards: u32) -> HostConfig {
        HostConfig {
            node_id: 1,
            voters: vec![1],
            shards: shards.max(1),
            data_dir,
            tick_ms: 100,
            election_ticks: 10,
            heartbeat_ticks: 1,
            snapshot_entries_interval: 1024,
            node_down_ticks: 30,
            file_system: storage::file_system::real(),
            dead_letter_retry_interval_ms: DEAD_LETTER_RETRY_INTERVAL_MS_DEFAULT,
        }
    }
}

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A shard's durable state could not be opened.
    #[error("quorum shard {shard}: {source}")]
    Open {
        /// The shard.
        shard: ShardId,
        /// What failed.
        source: replication::node::NodeError,
    },
    /// A thread could not be started.
    #[error("starting a quorum shard thread: {0}")]
    Thread(std::io::Error),
}

/// A quorum queue's held dead letters, as management shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldDeadLetterFigures {
    /// How many (RabbitMQ's `messages_dlx`).
    pub count: u64,
    /// Their bodies' bytes (RabbitMQ's `message_bytes_dlx`).
    pub body_bytes: u64,
}

/// Where a quorum queue's replicas are, as management shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// The node leading the queue's shard (None: no leader known).
    pub leader: Option<String>,
    /// Every member of the shard.
    pub members: Vec<String>,
    /// The members this node heard from lately (itself included).
    pub online: Vec<String>,
}

/// One shard's members, as management shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMembers {
    /// The shard.
    pub shard: ShardId,
    /// The node leading it (None: no leader known).
    pub leader: Option<String>,
    /// The members that vote (a commit needs a majority of them).
    pub voters: Vec<String>,
    /// The members that replicate and apply the log without voting.
    pub learners: Vec<String>,
    /// The learners the operator chose as voters (`grow`, `add_member`): the shard's leader
    /// promotes each once it holds the leader's commit index; until then it stays a learner.
    pub promotion_pending: Vec<String>,
}

/// The cluster's members as this node's metadata group last applied them: every shard's leader
/// makes them the shard's members (joined nodes as learners first). `None` while not known (a
/// node alone, or one still replaying its metadata log): the shards keep the members they have.
pub(crate) type MembersTarget = Arc<parking_lot::RwLock<Option<Vec<u64>>>>;

/// The operator's choices of nodes' roles in the shards, (shard, node) -> voter, as the metadata
/// group applied them (`lepus ctl queues grow`, `shrink`, `add_member`, `delete_member`).
pub type ShardRoleMap = std::collections::BTreeMap<(ShardId, u64), bool>;

/// The choices, shared with every shard's thread: its leader makes them so.
pub(crate) type ShardRoles = Arc<parking_lot::RwLock<ShardRoleMap>>;

/// The node's shards.
pub struct QuorumHost {
    config: HostConfig,
    shards: Vec<Arc<ShardHandle>>,
    threads: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Members' names as management shows them (set by the cluster for its nodes).
    names: parking_lot::RwLock<std::collections::BTreeMap<u64, String>>,
    /// When this node last heard from each peer.
    heard: parking_lot::Mutex<std::collections::HashMap<u64, std::time::Instant>>,
    self_reference: std::sync::Weak<QuorumHost>,
    /// Where queues with a dead-letter exchange tell when their head expires.
    dead_letters: Option<DeadLetterSender>,
    /// The members every shard's leader makes its shard's.
    members_target: MembersTarget,
    /// The roles the operator chose, which every shard's leader makes so.
    shard_roles: ShardRoles,
}

impl std::fmt::Debug for QuorumHost {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("QuorumHost").field("node_id", &self.config.node_id).field("shards", &self.shards.len()).finish()
    }
}

impl QuorumHost {
    /// Opens every shard from its directory and starts its thread. Peer messages go out through
    /// `transport` (see [`QuorumHost::receive`] for those that come in); dropped messages of
    /// queues with a dead-letter exchange go to `dead_letters`.
    pub fn start(
        config: HostConfig,
        transport: Arc<dyn PeerTransport>,
        dead_letters: Option<DeadLetterSender>,
    ) -> Result<Arc<QuorumHost>, HostError> {
        // One proposer per node incarnation, shared by the shards (each shard's machine numbers
        // it separately). Random: a restarted node never reuses an earlier incarnation's id.
        let proposer = rand::random::<u64>() | 1;
        let members_target = MembersTarget::default();
        let shard_roles = ShardRoles::default();
        let mut shards = Vec::new();
        let mut threads = Vec::new();
        for shard in 0..config.shards {
            let (handle, worker) =
                shard::open(shard, &config, proposer, transport.clone(), dead_letters.clone(), members_target.clone(), shard_roles.clone())
                    .map_err(|source| HostError::Open { shard, source })?;
            let thread =
                std::thread::Builder::new().name(format!("lepus-quorum-{shard}")).spawn(move || worker.run()).map_err(HostError::Thread)?;
            shards.push(handle);
            threads.push(thread);
        }
        let names = parking_lot::RwLock::new(std::collections::BTreeMap::from([(config.node_id, crate::management::node_name())]));
        Ok(Arc::new_cyclic(|self_reference| QuorumHost {
            config,
            shards,
            threads: parking_lot::Mutex::new(threads),
            names,
            heard: Default::default(),
            self_reference: self_reference.clone(),
            dead_letters,
            members_target,
            shard_roles,
        }))
    }

    /// The cluster's members as the metadata group applied them (voters and learners): each
    /// shard's leader adds the missing ones as learners, removes the ones gone, and promotes a
    /// caught-up learner while the shard has fewer voters than it started with (one change at a
    /// time per shard; see `shard/membership.rs`).
    pub fn set_cluster_members(&self, mut members: Vec<u64>) {
        members.sort_unstable();
        members.dedup();
        if self.members_target.read().as_ref() == Some(&members) {
            return;
        }
        let mut target = self.members_target.write();
        if target.as_ref() != Some(&members) {
            tracing::info!(members = ?members, "the quorum shards' members follow the cluster's");
            *target = Some(members);
        }
    }

    /// The operator's choices of nodes' roles in the shards, as the metadata group applied them.
    pub fn set_shard_roles(&self, roles: ShardRoleMap) {
        let mut current = self.shard_roles.write();
        if *current != roles {
            tracing::info!(roles = ?roles, "the quorum shards' roles chosen by the operator");
            *current = roles;
        }
    }

    /// The shard quorum queue `name` of `vhost` lives on.
    pub fn shard_of_queue(&self, vhost: &str, name: &str) -> ShardId {
        let mut key = Vec::with_capacity(vhost.len() + 1 + name.len());
        key.extend_from_slice(vhost.as_bytes());
        key.push(0);
        key.extend_from_slice(name.as_bytes());
        let handle = self.shard_for(&key);
        self.shards.iter().position(|other| Arc::ptr_eq(other, handle)).unwrap_or(0) as ShardId
    }

    /// Each shard's voters and learners by id, as this node last saw them.
    pub fn shard_member_ids(&self) -> Vec<(Vec<u64>, Vec<u64>)> {
        self.shards.iter().map(|handle| handle.figures.members.lock().clone()).collect()
    }

    /// The founding voters, learnt by a node that joined a cluster after its shards opened: a
    /// shard that holds nothing yet starts its log from them (the founding nodes' logs start
    /// from them without an entry saying so).
    pub fn set_initial_voters(&self, voters: Vec<u64>) {
        if voters.is_empty() {
            return;
        }
        for handle in &self.shards {
            handle.send(ShardInput::InitialVoters(voters.clone()));
        }
    }

    /// Leaves the shard groups this node formed alone (a cluster of one that joins another):
    /// every shard drops its one-node log and opens again empty, to start from the founding
    /// voters the join's answer names (`set_initial_voters`), as a node that joins through the
    /// seeds does. Refused, with what they hold and nothing changed, when any shard holds a
    /// quorum queue or a delayed message.
    pub fn leave_own_shards(&self) -> Result<(), String> {
        let mut held = Vec::new();
        for handle in &self.shards {
            let (answer, holdings) = std::sync::mpsc::channel();
            handle.send(ShardInput::Holdings(answer));
            held.extend(holdings.recv_timeout(SHARD_ANSWER_WAIT_MAX).map_err(|_| "a quorum shard did not answer".to_string())?);
        }
        if !held.is_empty() {
            return Err(format!("this node holds {}: joining another cluster would discard them", held.join(", ")));
        }
        // No shard leader of the old groups may reconcile toward the old members meanwhile.
        *self.members_target.write() = None;
        self.heard.lock().clear();
        for (shard, handle) in self.shards.iter().enumerate() {
            let (answer, left) = std::sync::mpsc::channel();
            handle.send(ShardInput::Rejoin(answer));
            left.recv_timeout(SHARD_ANSWER_WAIT_MAX).map_err(|_| format!("quorum shard {shard} did not answer"))??;
        }
        Ok(())
    }

    /// This node's Raft id.
    pub fn node_id(&self) -> u64 {
        self.config.node_id
    }

    pub(crate) fn self_reference(&self) -> std::sync::Weak<QuorumHost> {
        self.self_reference.clone()
    }

    /// Where dead letters go (and queues tell when their head expires).
    pub(crate) fn dead_letters(&self) -> Option<&DeadLetterSender> {
        self.dead_letters.as_ref()
    }

    /// The shard a queue named `key` lives on.
    pub(crate) fn shard_for(&self, key: &[u8]) -> &Arc<ShardHandle> {
        // FNV-1a: stable across builds and processes, so every node picks the same shard.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in key {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        &self.shards[(hash % self.shards.len() as u64) as usize]
    }

    /// A Raft message from a peer (the cluster's link hands over every frame it decodes).
    /// Messages for a shard this node does not run, or not addressed to it, are dropped.
    // Called by the in-process cluster tests here and by the cluster's links (branch `cluster`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn receive(&self, shard: ShardId, message: Message) {
        if message.to != self.config.node_id {
            return;
        }
        self.heard.lock().insert(message.from, std::time::Instant::now());
        if let Some(handle) = self.shards.get(shard as usize) {
            handle.send(ShardInput::Peer(message));
        }
    }

    /// Waits (at most `timeout`) until every shard applied its log and found the queues recovered
    /// from the definitions, so a node that starts answers with its queues' counts at once. A
    /// shard without a majority is not waited for past the timeout; its queues catch up later.
    pub fn wait_ready(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.shards.iter().all(|shard| shard.figures.ready.load(std::sync::atomic::Ordering::Acquire)) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Each shard's Raft figures, for metrics and management.
    pub fn shard_figures(&self) -> Vec<(ShardId, &ShardFigures)> {
        self.shards.iter().enumerate().map(|(shard, handle)| (shard as ShardId, &handle.figures)).collect()
    }

    /// The Raft figures of the shard quorum queue `name` of `vhost` lives in (queues share
    /// their shard's group, so these are the shard's, not the queue's alone).
    pub fn queue_shard_figures(&self, vhost: &str, name: &str) -> &ShardFigures {
        let mut key = Vec::with_capacity(vhost.len() + 1 + name.len());
        key.extend_from_slice(vhost.as_bytes());
        key.push(0);
        key.extend_from_slice(name.as_bytes());
        &self.shard_for(&key).figures
    }

    /// Names member `node` for management (the cluster names its nodes; this node is named
    /// after management's node name).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn set_member_name(&self, node: u64, name: String) {
        self.names.write().insert(node, name);
    }

    fn member_name(&self, node: u64) -> String {
        self.names.read().get(&node).cloned().unwrap_or_else(|| format!("node-{node:x}"))
    }

    /// Where the replicas of a queue on `shard` are, for management.
    pub(crate) fn replica_info(&self, shard: &ShardHandle) -> ReplicaInfo {
        let leader = shard.figures.leader.load(std::sync::atomic::Ordering::Relaxed);
        let quiet_after = std::time::Duration::from_millis(self.config.tick_ms * self.config.node_down_ticks);
        let heard = self.heard.lock();
        let (voters, learners) = shard.figures.members.lock().clone();
        let mut members: Vec<u64> = voters.into_iter().chain(learners).collect();
        if members.is_empty() {
            members = self.config.voters.clone();
        }
        let online = members
            .iter()
            .filter(|node| **node == self.config.node_id || heard.get(node).is_some_and(|at| at.elapsed() < quiet_after))
            .map(|node| self.member_name(*node))
            .collect();
        ReplicaInfo {
            leader: (leader != 0).then(|| self.member_name(leader)),
            members: members.iter().map(|node| self.member_name(*node)).collect(),
            online,
        }
    }

    /// Every shard's leader, voters and learners by name, as this node knows them (for
    /// `/api/lepus/cluster`: a quorum queue's members are its shard's).
    pub fn shard_members(&self) -> Vec<ShardMembers> {
        let name_all = |nodes: Vec<u64>| nodes.into_iter().map(|node| self.member_name(node)).collect();
        self.shards
            .iter()
            .enumerate()
            .map(|(shard, handle)| {
                let leader = handle.figures.leader.load(std::sync::atomic::Ordering::Relaxed);
                let (voters, learners) = handle.figures.members.lock().clone();
                let chosen_voter = |node: &u64| self.shard_roles.read().get(&(shard as ShardId, *node)).copied().unwrap_or(false);
                let promotion_pending = learners.iter().copied().filter(chosen_voter).collect();
                ShardMembers {
                    shard: shard as ShardId,
                    leader: (leader != 0).then(|| self.member_name(leader)),
                    voters: name_all(voters),
                    learners: name_all(learners),
                    promotion_pending: name_all(promotion_pending),
                }
            })
            .collect()
    }

    /// Refuses to remove `node` from the shards when a shard's voters without it would not have
    /// a running majority as this node sees them: itself, the peers heard from lately on a shard,
    /// and the peers `connected` names (the cluster's links). Raft traffic alone is not enough:
    /// two followers of a shard whose leader just died say nothing to each other until an
    /// election. Its leader would hold the change back, and the operator is told why now.
    pub fn check_removal(&self, node: u64, connected: impl Fn(u64) -> bool) -> Result<(), String> {
        self.check_voters_without(node, |_| true, connected)
    }

    /// As [`QuorumHost::check_removal`], for the shards `selected` picks (a node that stops
    /// voting in them: `lepus ctl queues shrink`, `delete_member`).
    pub fn check_voters_without(
        &self,
        node: u64,
        selected: impl Fn(ShardId) -> bool,
        connected: impl Fn(u64) -> bool,
    ) -> Result<(), String> {
        let quiet_after = std::time::Duration::from_millis(self.config.tick_ms * self.config.node_down_ticks);
        let heard = self.heard.lock();
        let running = |member: &u64| {
            *member == self.config.node_id || connected(*member) || heard.get(member).is_some_and(|at| at.elapsed() < quiet_after)
        };
        for (shard, handle) in self.shards.iter().enumerate() {
            if !selected(shard as ShardId) {
                continue;
            }
            let voters: Vec<u64> = handle.figures.members.lock().0.iter().copied().filter(|voter| *voter != node).collect();
            let live = voters.iter().filter(|voter| running(voter)).count();
            if !voters.is_empty() && live * 2 <= voters.len() {
                return Err(format!(
                    "quorum shard {shard} would be left with {} voters of which {live} are running, not a working majority: start the others first",
                    voters.len()
                ));
            }
        }
        Ok(())
    }

    /// Stops every shard thread after its current round (unconfirmed publishes are nacked) and
    /// waits for them. Their logs hold everything committed.
    pub fn stop(&self) {
        for handle in &self.shards {
            handle.send(ShardInput::Stop);
        }
        for thread in self.threads.lock().drain(..) {
            let _ = thread.join();
        }
    }
}

/// Runs `wait` (a blocking wait for a commit) without starving the async runtime: on a worker of
/// the multi-threaded runtime the worker hands its other tasks over first.
pub(crate) fn block_outside_runtime<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

#[cfg(test)]
mod tests;
