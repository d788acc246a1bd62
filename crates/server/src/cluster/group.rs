//! The metadata group's driver: one thread running raft-rs's `RawNode` over a
//! `replication::log_store::LogStore`, fed by the links (Raft messages) and the node (proposals,
//! configuration changes), ticking every [`TICK_MS`], persisting before acknowledging (one
//! fdatasync per `Ready`), and applying committed entries in log order through an [`Applier`].
//!
//! Its own thread, not an async worker: it writes and syncs files, and applying a definition
//! change takes the broker's locks and creates queue logs.

use super::link::Links;
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfState, Entry, EntryType, Message, MessageType};
use raft::{RawNode, StateRole};
use replication::log_store::LogStore;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The metadata group's number on the links (quorum-queue shards count up from 0).
pub const METADATA_GROUP: u32 = u32::MAX;

/// One Raft tick.
pub const TICK_MS: u64 = 100;

/// Ticks without a leader before a follower campaigns (1 s; raft-rs draws from [10, 20) ticks).
pub const ELECTION_TICKS: usize = 10;

/// Ticks between a leader's heartbeats.
pub const HEARTBEAT_TICKS: usize = 2;

/// Proposals held while no leader is known; one more is refused (its waiter times out).
pub const PENDING_PROPOSALS_MAX: usize = 4096;

/// Events the group's thread takes, from a bounded channel (`GROUP_EVENTS_MAX`).
pub enum GroupEvent {
    /// A Raft message from a peer.
    Raft(Message),
    /// A proposal's entry data.
    Propose(Vec<u8>),
    /// A membership change.
    ConfChange(ConfChange),
    /// Stop the thread.
    Stop,
}

/// The most events waiting for the group's thread; past it Raft messages are dropped (Raft
/// resends) and proposals refused.
pub const GROUP_EVENTS_MAX: usize = 16_384;

/// What the group looks like, for status pages and metrics.
#[derive(Debug, Clone, Default)]
pub struct GroupView {
    /// `leader`, `follower`, `candidate`, `pre_candidate`.
    pub role: &'static str,
    /// Current term.
    pub term: u64,
    /// The leader known, if any.
    pub leader: Option<u64>,
    /// Commit index.
    pub commit: u64,
    /// Applied index.
    pub applied: u64,
    /// Last index of the log.
    pub last_index: u64,
    /// Voters.
    pub voters: Vec<u64>,
    /// Learners.
    pub learners: Vec<u64>,
    /// On the leader: each member's matched index.
    pub matched: Vec<(u64, u64)>,
    /// Elections this node started.
    pub elections: u64,
    /// Whether a membership change is in flight.
    pub conf_change_pending: bool,
}

/// What the group does with committed entries.
pub trait Applier: Send + 'static {
    /// A committed normal entry (empty ones, a new leader's, are not passed).
    fn apply(&mut self, index: u64, data: &[u8]);
    /// A committed membership change, and the members after it.
    fn conf_changed(&mut self, index: u64, change: &ConfChange, members: &ConfState);
    /// Called after every round with the group's view (the applier proposes what it must).
    fn after_round(&mut self, view: &GroupView);
}

fn role_name(role: StateRole) -> &'static str {
    match role {
        StateRole::Leader => "leader",
        StateRole::Follower => "follower",
        StateRole::Candidate => "candidate",
        StateRole::PreCandidate => "pre_candidate",
    }
}

/// Where a node whose log recovery found damage stands (as `replication::node::Damage`; see
/// docs/replication.md, "Recovery and damaged logs"): a node that may have lost acknowledged
/// entries must neither vote nor campaign until a leader has given them back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    /// The log is whole.
    None,
    /// Damaged, no leader heard from yet: no ticks, no votes.
    AwaitingLeader,
    /// Damaged; whole again once the log reaches this index (the leader's commit when first heard).
    CatchingUpTo(u64),
}

/// Runs the group until [`GroupEvent::Stop`] or a write failure (after which it cannot promise
/// anything: the node must restart from what is durable).
pub struct GroupDriver<A: Applier> {
    raw: RawNode<LogStore>,
    links: Arc<Links>,
    applier: A,
    view: Arc<Mutex<GroupView>>,
    pending: Vec<Vec<u8>>,
    pending_changes: Vec<ConfChange>,
    applied: u64,
    elections: u64,
    last_role: StateRole,
    damage: Damage,
}

impl<A: Applier> GroupDriver<A> {
    /// A driver for `raw`, sending through `links`; `damaged`: recovery found a damaged log.
    pub fn new(raw: RawNode<LogStore>, links: Arc<Links>, applier: A, view: Arc<Mutex<GroupView>>, damaged: bool) -> GroupDriver<A> {
        GroupDriver {
            raw,
            links,
            applier,
            view,
            pending: Vec::new(),
            pending_changes: Vec::new(),
            applied: 0,
            elections: 0,
            last_role: StateRole::Follower,
            damage: if damaged { Damage::AwaitingLeader } else { Damage::None },
        }
    }

    /// The thread's loop. Returns whether it stopped because it was asked to (true), or because
    /// it could not go on (false: its log could not be written).
    pub fn run(mut self, events: Receiver<GroupEvent>) -> bool {
        let tick = Duration::from_millis(TICK_MS);
        let mut next_tick = Instant::now() + tick;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match events.recv_timeout(wait) {
                Ok(GroupEvent::Stop) | Err(RecvTimeoutError::Disconnected) => return true,
                Ok(event) => self.take(event),
                Err(RecvTimeoutError::Timeout) => {}
            }
            // Everything already queued, before one Ready: the batch that one fdatasync covers.
            while let Ok(event) = events.try_recv() {
                if matches!(event, GroupEvent::Stop) {
                    return true;
                }
                self.take(event);
            }
            if Instant::now() >= next_tick {
                next_tick += tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + tick;
                }
                // A damaged node does not tick: it must not campaign.
                if self.damage == Damage::None {
                    self.raw.tick();
                }
            }
            self.propose_pending();
            if let Err(error) = self.process_ready() {
                tracing::error!(%error, "the metadata group's log could not be written");
                return false;
            }
            let view = self.refresh_view();
            self.applier.after_round(&view);
        }
    }

    fn take(&mut self, event: GroupEvent) {
        match event {
            GroupEvent::Raft(message) => {
                let Some(message) = self.guard_damaged(message) else { return };
                // A message from a removed member, or for a term long gone: raft-rs refuses it.
                let _ = self.raw.step(message);
            }
            GroupEvent::Propose(data) => {
                if self.pending.len() < PENDING_PROPOSALS_MAX {
                    self.pending.push(data);
                }
            }
            GroupEvent::ConfChange(change) => self.pending_changes.push(change),
            GroupEvent::Stop => {}
        }
    }

    /// While the log is damaged: no votes given, and a heartbeat's commit index capped at the
    /// log's end (the leader still believes this node holds what it acknowledged; raft-rs would
    /// panic on a commit past the log). The first append from a leader says how far to catch up.
    fn guard_damaged(&mut self, mut message: Message) -> Option<Message> {
        if self.damage == Damage::None {
            return Some(message);
        }
        match message.get_msg_type() {
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote => return None,
            MessageType::MsgHeartbeat => message.commit = message.commit.min(self.raw.store().last_index_now()),
            MessageType::MsgAppend if self.damage == Damage::AwaitingLeader => self.damage = Damage::CatchingUpTo(message.commit),
            _ => {}
        }
        Some(message)
    }

    /// A damaged log is whole again once it holds and applied what the leader had committed.
    fn check_repaired(&mut self) {
        if let Damage::CatchingUpTo(index) = self.damage {
            if self.raw.store().last_index_now() >= index && self.applied >= index {
                tracing::info!(index, "the metadata log is repaired: this node votes and campaigns again");
                self.damage = Damage::None;
            }
        }
    }

    /// Hands held proposals to raft-rs once a leader is known (a follower forwards them to it).
    fn propose_pending(&mut self) {
        if self.raw.raft.leader_id == 0 {
            return;
        }
        for data in std::mem::take(&mut self.pending) {
            if self.raw.propose(Vec::new(), data.clone()).is_err() {
                self.pending.push(data);
            }
        }
        // A follower forwards the change to the leader; a leader takes one change at a time.
        let leading = self.raw.raft.state == StateRole::Leader;
        if !leading || !self.raw.raft.has_pending_conf() {
            if let Some(change) = self.pending_changes.first().cloned() {
                match self.raw.propose_conf_change(change.context.to_vec(), change) {
                    Ok(()) => {
                        self.pending_changes.remove(0);
                    }
                    Err(error) => tracing::warn!(%error, "a membership change was refused; retried"),
                }
            }
        }
    }

    fn send(&self, messages: Vec<Message>) {
        for message in messages {
            match message.write_to_bytes() {
                Ok(bytes) => {
                    self.links.send_raft(message.to, METADATA_GROUP, bytes.into());
                }
                Err(error) => tracing::error!(%error, "a Raft message did not encode"),
            }
        }
    }

    fn process_ready(&mut self) -> Result<(), String> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut ready = self.raw.ready();
        self.send(ready.take_messages());
        if !ready.snapshot().is_empty() {
            return Err("the metadata group received a snapshot, which this version does not take".to_string());
        }
        let appended = !ready.entries().is_empty();
        let store = self.raw.mut_store();
        store.append(ready.entries()).map_err(|error| error.to_string())?;
        if let Some(hard_state) = ready.hs() {
            store.set_hard_state(hard_state).map_err(|error| error.to_string())?;
        }
        if appended || ready.must_sync() {
            self.raw.store().sync().map_err(|error| error.to_string())?;
        }
        let committed = ready.take_committed_entries();
        self.apply_entries(committed)?;
        self.send(ready.take_persisted_messages());
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            self.raw.mut_store().set_commit(commit);
        }
        self.send(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply_entries(committed)?;
        self.raw.advance_apply();
        self.check_repaired();
        Ok(())
    }

    fn apply_entries(&mut self, entries: Vec<Entry>) -> Result<(), String> {
        for entry in entries {
            if entry.index <= self.applied {
                continue;
            }
            self.applied = entry.index;
            match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() => {}
                EntryType::EntryNormal => self.applier.apply(entry.index, &entry.data),
                EntryType::EntryConfChange => {
                    let change = ConfChange::parse_from_bytes(&entry.data).map_err(|error| error.to_string())?;
                    let members = self.raw.apply_conf_change(&change).map_err(|error| error.to_string())?;
                    self.raw.mut_store().set_conf_state(members.clone()).map_err(|error| error.to_string())?;
                    self.applier.conf_changed(entry.index, &change, &members);
                }
                EntryType::EntryConfChangeV2 => return Err("a joint membership change, which this version does not make".to_string()),
            }
        }
        Ok(())
    }

    fn refresh_view(&mut self) -> GroupView {
        let raft = &self.raw.raft;
        if raft.state != self.last_role {
            if matches!(raft.state, StateRole::Candidate | StateRole::PreCandidate) && self.last_role == StateRole::Follower {
                self.elections += 1;
            }
            tracing::info!(role = role_name(raft.state), term = raft.term, leader = raft.leader_id, "metadata group: role changed");
            self.last_role = raft.state;
        }
        let configuration = raft.prs().conf();
        let mut voters: Vec<u64> = configuration.voters().ids().iter().collect();
        voters.sort_unstable();
        let mut learners: Vec<u64> = configuration.learners().iter().copied().collect();
        learners.sort_unstable();
        let matched = if raft.state == StateRole::Leader {
            raft.prs().iter().map(|(id, progress)| (*id, progress.matched)).collect()
        } else {
            Vec::new()
        };
        let view = GroupView {
            role: role_name(raft.state),
            term: raft.term,
            leader: Some(raft.leader_id).filter(|leader| *leader != 0),
            commit: raft.raft_log.committed,
            applied: self.applied,
            last_index: raft.raft_log.last_index(),
            voters,
            learners,
            matched,
            elections: self.elections,
            conf_change_pending: raft.has_pending_conf() || !self.pending_changes.is_empty(),
        };
        *self.view.lock() = view.clone();
        view
    }
}
