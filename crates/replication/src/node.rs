//! One member of a Raft group: raft-rs's `RawNode` over a [`LogStore`], the replicated
//! [`QueueStateMachine`], and the driver loop that persists before it acknowledges.
//!
//! The caller owns time and the network: it calls [`ReplicaNode::tick`] every tick, hands every
//! message addressed to this node to [`ReplicaNode::step`], proposes batches on the leader, then
//! calls [`ReplicaNode::process_ready`] and sends what [`ReplicaNode::take_messages`] returns.
//! Nothing here reads a clock or a random source the caller did not seed, so a run is a function
//! of its inputs.

use crate::command::Batch;
use crate::log_store::{LogStore, LogStoreError, Recovery};
use crate::state_machine::{Outcome, QueueStateMachine};
use raft::eraftpb::{Entry, EntryType, Message, MessageType};
use raft::{RawNode, SnapshotStatus, StateRole};
use std::io;
use std::path::Path;
use storage::file_system::SharedFileSystem;

/// How a member is set up.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's Raft id (non-zero).
    pub id: u64,
    /// Every member of the group, this node included.
    pub voters: Vec<u64>,
    /// Ticks without a leader before a follower campaigns (the timeout is drawn in
    /// `[election_tick, 2 * election_tick)`).
    pub election_tick: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_tick: usize,
    /// Applied entries past the last snapshot that make the node take a new one and compact.
    pub snapshot_entries_interval: u64,
    /// Seeds the election timeouts.
    pub election_seed: u64,
    /// Seeds the log's checksums (the group's identity).
    pub checksum_seed: u32,
}

/// Why a node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Its durable state could not be opened.
    #[error(transparent)]
    Open(#[from] LogStoreError),
    /// Writing its durable state failed: the node must stop (it cannot promise anything).
    #[error("raft log write: {0}")]
    Write(#[from] io::Error),
    /// raft-rs refused.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// A proposal reached a node that does not lead; the leader it knows, if any.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader this node knows of.
        leader: Option<u64>,
    },
}

/// Where a node with a damaged log stands (docs/replication.md, "Recovery and damaged logs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// The log is whole.
    None,
    /// Damaged, and no leader heard from yet: the node neither ticks nor votes.
    AwaitingLeader,
    /// Damaged; repaired once the log reaches this index (the leader's commit when first heard).
    CatchingUpTo(u64),
}

/// A small deterministic generator (xorshift64*) for election timeouts.
#[derive(Debug, Clone)]
struct ElectionRandom(u64);

impl ElectionRandom {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// One member of a group.
pub struct ReplicaNode {
    raw: RawNode<LogStore>,
    machine: QueueStateMachine,
    config: NodeConfig,
    damage: Damage,
    random: ElectionRandom,
    /// The role and term the election timeout was last drawn for.
    timeout_drawn_for: (StateRole, u64),
    outbox: Vec<Message>,
    outcomes: Vec<Outcome>,
    /// Committed entries whose data was not a batch (a bug, never input): skipped on every replica alike.
    undecodable_entries: u64,
    /// Membership changes applied since the node opened.
    membership_changes: u64,
    /// Snapshots received from a leader and installed since the node opened: the entries each
    /// covered were never applied here, so no outcome came out of them.
    snapshots_installed: u64,
    /// The machine's image at the applied index where the log last passed the snapshot interval:
    /// the next compaction goes up to it, not to the applied index then (see `maybe_compact`).
    compaction_candidate: Option<(u64, Vec<u8>)>,
}

mod checks;
mod driver;

pub use checks::RefusedMessage;

impl ReplicaNode {
    /// Opens a member from its directory (created, empty, when missing).
    pub fn open(config: NodeConfig, file_system: SharedFileSystem, directory: &Path) -> Result<(ReplicaNode, Recovery), NodeError> {
        let (mut store, recovery) = LogStore::open(file_system, directory, config.checksum_seed, &config.voters)?;
        let members_unknown = store.conf_state().voters.is_empty() && store.conf_state().learners.is_empty();
        if members_unknown && store.last_index_now() == 0 && !config.voters.is_empty() {
            // A node that joined a cluster opened its shards before it knew the cluster's
            // founding voters; it holds nothing yet, so its log starts from them now.
            store
                .set_conf_state(raft::eraftpb::ConfState { voters: config.voters.clone(), ..Default::default() })
                .map_err(NodeError::Write)?;
        }
        let snapshot = store.snapshot_ref();
        let applied = snapshot.get_metadata().index;
        let machine = match applied {
            0 => QueueStateMachine::new(),
            _ => QueueStateMachine::decode_image(snapshot.data.clone())
                .map_err(|source| LogStoreError::Snapshot { path: directory.join("snapshot"), source })?,
        };
        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_tick,
            heartbeat_tick: config.heartbeat_tick,
            applied,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..raft::Config::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_config, store, &logger)?;
        let damage = if recovery.damaged { Damage::AwaitingLeader } else { Damage::None };
        let random = ElectionRandom(config.election_seed | 1);
        let mut node = ReplicaNode {
            raw,
            machine,
            config,
            damage,
            random,
            timeout_drawn_for: (StateRole::Follower, u64::MAX),
            outbox: Vec::new(),
            outcomes: Vec::new(),
            undecodable_entries: 0,
            membership_changes: 0,
            snapshots_installed: 0,
            compaction_candidate: None,
        };
        node.draw_election_timeout();
        Ok((node, recovery))
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.config.id
    }

    /// Whether this node leads the group.
    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<u64> {
        Some(self.raw.raft.leader_id).filter(|leader| *leader != 0)
    }

    /// The commit index this node knows of.
    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// Whether this node has applied an entry of the current term: everything committed before
    /// the term began (in particular, before a restart) is applied, so the state machine is
    /// as current as a leader's of this term was when it was elected.
    pub fn caught_up(&self) -> bool {
        let applied = self.machine.applied_index();
        applied > 0 && applied >= self.commit_index() && self.raw.raft.raft_log.term(applied).is_ok_and(|term| term == self.term())
    }

    /// Starts an election now (a group of one elects itself at once, instead of after an
    /// election timeout). A damaged node does not campaign.
    pub fn campaign(&mut self) -> Result<(), NodeError> {
        if self.damage != Damage::None {
            return Ok(());
        }
        self.raw.campaign()?;
        self.draw_election_timeout();
        Ok(())
    }

    /// As leader: hands the leadership to `to` if its log is as long as the leader's (so the
    /// transfer is immediate and loses no time); returns whether a transfer started. A node
    /// that leads more shards than its share gives some away this way (docs/replication.md).
    pub fn transfer_leadership(&mut self, to: u64) -> bool {
        if !self.is_leader() || to == self.id() {
            return false;
        }
        let last_index = self.raw.raft.raft_log.last_index();
        let caught_up = self.raw.raft.prs().get(to).is_some_and(|progress| progress.matched == last_index && progress.recent_active);
        if caught_up {
            self.raw.transfer_leader(to);
        }
        caught_up
    }

    /// The group's voters, this node included.
    pub fn voters(&self) -> Vec<u64> {
        self.raw.raft.prs().conf().voters().ids().iter().collect()
    }

    /// The group's learners (members that replicate and apply the log but do not vote).
    pub fn learners(&self) -> Vec<u64> {
        self.raw.raft.prs().conf().learners().iter().copied().collect()
    }

    /// Whether `node` is a voter or a learner of the group.
    pub fn is_member(&self, node: u64) -> bool {
        self.raw.raft.prs().conf().voters().contains(node) || self.raw.raft.prs().conf().learners().contains(&node)
    }

    /// Whether a membership change is proposed and not applied yet (one at a time).
    pub fn membership_change_pending(&self) -> bool {
        self.raw.raft.has_pending_conf()
    }

    /// As leader: how far `node` has replicated (its matched index) and whether it was heard
    /// from within the last election timeout.
    pub fn member_progress(&self, node: u64) -> Option<(u64, bool)> {
        if !self.is_leader() {
            return None;
        }
        self.raw.raft.prs().get(node).map(|progress| (progress.matched, progress.recent_active || node == self.id()))
    }

    /// As leader: proposes one membership change (raft-rs `ConfChange`: add a learner, add or
    /// promote a voter, remove a member). raft-rs takes one at a time; a change proposed while
    /// another is pending is dropped by raft-rs (the caller proposes it again later).
    pub fn propose_membership_change(&mut self, change: raft::eraftpb::ConfChange) -> Result<(), NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        self.raw.propose_conf_change(Vec::new(), change)?;
        Ok(())
    }

    /// Whether the log is damaged and not yet repaired.
    pub fn damage(&self) -> Damage {
        self.damage
    }

    /// The replicated queues.
    pub fn machine(&self) -> &QueueStateMachine {
        &self.machine
    }

    /// The durable state.
    pub fn store(&self) -> &LogStore {
        self.raw.store()
    }

    /// Committed entries that were not batches (always 0 unless a proposer has a bug).
    pub fn undecodable_entries(&self) -> u64 {
        self.undecodable_entries
    }

    /// Messages to send, in order.
    pub fn take_messages(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.outbox)
    }

    /// What applying committed entries produced since the last call.
    pub fn take_outcomes(&mut self) -> Vec<Outcome> {
        std::mem::take(&mut self.outcomes)
    }

    /// Proposes a batch; it is committed (and its commands' [`Outcome::Committed`] appear) once a
    /// majority has it fdatasynced.
    pub fn propose(&mut self, batch: &Batch) -> Result<(), NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        self.raw.propose(Vec::new(), batch.encode())?;
        Ok(())
    }

    /// Proposes a batch on the leader, or, on a follower that knows the leader, forwards it there
    /// (raft-rs sends the leader a `MsgPropose`). A forwarded proposal may be lost on the way, or
    /// overtaken by a later one: the proposer's numbers and its retries take care of both.
    ///
    /// A damaged node forwards too: its proposals (a restart's `RegisterProposer` first) are
    /// what makes an idle leader append, find the node's log shorter than it believed, and
    /// repair it. Refusing them left a damaged node of an idle shard unrepaired (and not voting)
    /// for as long as nobody else proposed (found by test_quorum_damaged_log.py).
    pub fn propose_anywhere(&mut self, batch: &Batch) -> Result<(), NodeError> {
        if !self.is_leader() && self.leader().is_none() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        self.raw.propose(Vec::new(), batch.encode())?;
        Ok(())
    }

    /// Says whether a snapshot this node sent reached `to` (a lost one must be resent).
    pub fn report_snapshot(&mut self, to: u64, delivered: bool) {
        let status = if delivered { SnapshotStatus::Finish } else { SnapshotStatus::Failure };
        self.raw.report_snapshot(to, status);
    }

    /// Whether this node leads the group and waits for `to` to take a snapshot it sent.
    pub fn awaits_snapshot(&self, to: u64) -> bool {
        self.raw.raft.state == raft::StateRole::Leader
            && self.raw.raft.prs().get(to).is_some_and(|progress| progress.state == raft::ProgressState::Snapshot)
    }

    /// Advances time by one tick. A damaged node does not tick: it must not campaign.
    pub fn tick(&mut self) {
        if self.damage != Damage::None {
            return;
        }
        self.raw.tick();
        self.draw_election_timeout();
    }

    /// Takes a message addressed to this node.
    pub fn step(&mut self, mut message: Message) {
        if self.damage != Damage::None {
            // The leader believes this node holds what it acknowledged before the damage, and
            // its heartbeat may carry a commit index past the shortened log (raft-rs would
            // panic): the node can only commit what it holds; the leader's appends repair the rest.
            if message.get_msg_type() == MessageType::MsgHeartbeat {
                message.commit = message.commit.min(self.raw.store().last_index_now());
            }
            match message.get_msg_type() {
                // A node that may have lost acknowledged entries must not vote.
                MessageType::MsgRequestVote | MessageType::MsgRequestPreVote => return,
                MessageType::MsgAppend if self.damage == Damage::AwaitingLeader => {
                    self.damage = Damage::CatchingUpTo(message.commit);
                }
                MessageType::MsgSnapshot if self.damage == Damage::AwaitingLeader => {
                    self.damage = Damage::CatchingUpTo(message.get_snapshot().get_metadata().index);
                }
                _ => {}
            }
        }
        // A message from a removed member or a stale local one: nothing to do with it.
        let _ = self.raw.step(message);
        self.draw_election_timeout();
    }

    /// raft-rs draws election timeouts from a thread-local generator when the role or term
    /// changes; the driver redraws them from its seeded one at once, before the next tick, so
    /// the run does not depend on anything outside its seed.
    fn draw_election_timeout(&mut self) {
        let now = (self.raw.raft.state, self.raw.raft.term);
        if now == self.timeout_drawn_for {
            return;
        }
        self.timeout_drawn_for = now;
        let election_tick = self.config.election_tick as u64;
        let timeout = election_tick + self.random.next() % election_tick;
        self.raw.raft.set_randomized_election_timeout(timeout as usize);
    }

    fn apply_entries(&mut self, entries: Vec<Entry>) -> Result<(), NodeError> {
        for entry in entries {
            if entry.index <= self.machine.applied_index() {
                continue;
            }
            if entry.get_entry_type() == EntryType::EntryConfChange {
                self.apply_membership_change(&entry)?;
                self.machine.skip(entry.index);
                continue;
            }
            if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
                self.machine.skip(entry.index);
                continue;
            }
            match Batch::decode(entry.data.clone()) {
                Ok(batch) => self.machine.apply(entry.index, batch, &mut self.outcomes),
                Err(_) => {
                    self.undecodable_entries += 1;
                    self.machine.skip(entry.index);
                }
            }
        }
        Ok(())
    }

    /// A committed membership change: applied to raft-rs and made durable with its index, unless
    /// the stored members already come from it or a later one (a restart replays the log from
    /// the snapshot). A change that does not parse or that raft-rs refuses is skipped on every
    /// replica alike (counted with the undecodable entries).
    fn apply_membership_change(&mut self, entry: &Entry) -> Result<(), NodeError> {
        use protobuf::Message as _;
        if entry.index <= self.raw.store().conf_index() || entry.data.is_empty() {
            return Ok(());
        }
        let applied = raft::eraftpb::ConfChange::parse_from_bytes(&entry.data)
            .map_err(|error| raft::Error::ConfChangeError(error.to_string()))
            .and_then(|change| self.raw.apply_conf_change(&change));
        match applied {
            Ok(members) => {
                self.raw.mut_store().set_conf_state_at(members, entry.index)?;
                self.membership_changes += 1;
            }
            Err(_) => self.undecodable_entries += 1,
        }
        Ok(())
    }

    /// Snapshots from a leader this node installed since it opened. The outcomes of the entries a
    /// snapshot covers never come out here: their confirms and the deliveries to this node's
    /// consumers are for the host to find in the machine (see `QueueStateMachine::checked_out_to`).
    pub fn snapshots_installed(&self) -> u64 {
        self.snapshots_installed
    }

    /// Membership changes this node applied since it opened (the host refreshes what it shows).
    pub fn membership_changes(&self) -> u64 {
        self.membership_changes
    }
}
