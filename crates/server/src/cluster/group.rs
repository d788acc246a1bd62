//! The metadata group's driver: one thread running raft-rs's `RawNode` over a
//! `replication::log_store::LogStore`, fed by the links (Raft messages) and the node (proposals,
//! configuration changes), ticking every [`TICK_MS`], persisting before acknowledging (one
//! fdatasync per `Ready`), and applying committed entries in log order through an [`Applier`].
//!
//! Its own thread, not an async worker: it writes and syncs files, and applying a definition
//! change takes the broker's locks and creates queue logs.
//!
//! A write that fails (a full disk) does not stop the node: the group reopens from what is
//! durable and is held until its disk takes writes again (`group/write_hold.rs`).

use super::link::Links;
use super::promotion::{next_promotion, LearnerProgress, Promotion, LEARNER_BEHIND_LOG_MS, PROMOTION_CHECK_INTERVAL};
use super::proposals::PendingProposals;
use super::snapshot::{MetadataImage, METADATA_SNAPSHOT_BYTES_MAX};
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType, ConfState, Entry, EntryType, Message, MessageType};
use raft::{ProgressState, RawNode, SnapshotStatus, StateRole};
use replication::log_store::{LogStore, Recovery};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::file_system::SharedFileSystem;

#[cfg(test)]
mod tests;
mod write_hold;

/// The metadata group's number on the links (quorum-queue shards count up from 0).
pub const METADATA_GROUP: u32 = u32::MAX;

/// One Raft tick.
pub const TICK_MS: u64 = 100;

/// Ticks without a leader before a follower campaigns (1 s; raft-rs draws from [10, 20) ticks).
pub const ELECTION_TICKS: usize = 10;

/// Ticks between a leader's heartbeats.
pub const HEARTBEAT_TICKS: usize = 2;

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

/// How long a leader waits for a follower to take a snapshot it sent before it reports the
/// snapshot lost and sends it again (a link that went down empties its queue; raft-rs would
/// otherwise wait for the follower forever).
pub const SNAPSHOT_SEND_TIMEOUT_MS: u64 = 10_000;

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
    /// The index the latest snapshot covers (0: none); the log holds the entries after it.
    pub snapshot_index: u64,
    /// Snapshots this node took (its log compacted up to each).
    pub snapshots_taken: u64,
    /// Snapshots this node installed from a leader.
    pub snapshots_installed: u64,
    /// Snapshots this node sent to members behind its compacted log.
    pub snapshots_sent: u64,
    /// This node's log could not be written and its disk takes no writes yet (`write_hold.rs`):
    /// it takes part in no commit, so changes proposed through it are refused.
    pub write_held: bool,
}

/// Why a round of the group failed.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// The log, hard state or a snapshot could not be written (a full disk): the node is held
    /// until its disk takes writes again.
    #[error("{0}")]
    Write(#[from] std::io::Error),
    /// Something no disk explains (a bug, never input): the group cannot go on.
    #[error("{0}")]
    Invalid(String),
}

/// Where the group's durable state lives and how raft-rs is set up over it: the node opens it at
/// start, and again after a write failed.
#[derive(Clone)]
pub struct GroupStorage {
    /// `cluster/metadata` under the data directory.
    pub directory: PathBuf,
    /// Reads and writes the directory (the real disk; a test's in-memory one).
    pub file_system: SharedFileSystem,
    /// The log's checksum seed (the cluster's identity).
    pub checksum_seed: u32,
    /// The members a new log starts with.
    pub initial_voters: Vec<u64>,
    /// raft-rs's settings; its `applied` is set on each open.
    pub config: raft::Config,
}

impl GroupStorage {
    /// Opens the log and a raft-rs node over it. `applied`: none at start (the node applies from
    /// its snapshot on); after a failed write, what was applied, as far as the durable commit
    /// index goes (raft-rs refuses an applied index past its commit; the entries in between come
    /// again and are skipped, see `apply_entries`).
    pub fn open(&self, applied: Option<u64>) -> Result<(RawNode<LogStore>, Recovery), String> {
        let (store, recovery) = LogStore::open(self.file_system.clone(), &self.directory, self.checksum_seed, &self.initial_voters)
            .map_err(|error| error.to_string())?;
        let snapshot_index = store.snapshot_ref().get_metadata().index;
        let applied = applied.map_or(snapshot_index, |applied| applied.min(store.hard_state().commit).max(snapshot_index));
        let config = raft::Config { applied, ..self.config.clone() };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&config, store, &logger).map_err(|error| error.to_string())?;
        Ok((raw, recovery))
    }
}

/// The group as opened at start.
pub struct OpenedGroup {
    /// raft-rs over the log.
    pub raw: RawNode<LogStore>,
    /// Where it was opened from (opened again after a failed write).
    pub storage: GroupStorage,
    /// Recovery found a damaged log.
    pub damaged: bool,
    /// The decoded image of the store's snapshot, if it has one (installed first).
    pub start_image: Option<MetadataImage>,
}

/// What the group does with committed entries.
pub trait Applier: Send + 'static {
    /// A committed normal entry (empty ones, a new leader's, are not passed).
    fn apply(&mut self, index: u64, data: &[u8]);
    /// A committed membership change, and the members after it.
    fn conf_changed(&mut self, index: u64, change: &ConfChange, members: &ConfState);
    /// Called after every round with the group's view (the applier proposes what it must).
    fn after_round(&mut self, view: &GroupView);
    /// The applied state at `index` (the last entry applied), for a snapshot.
    fn image(&mut self, index: u64) -> MetadataImage;
    /// Replaces the applied state with `image` (its index: the last entry it covers): at start
    /// from this node's own snapshot, or one received from the leader.
    fn install(&mut self, image: MetadataImage);
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

/// Runs the group until [`GroupEvent::Stop`] or a failure no disk explains ([`RoundError::Invalid`]).
pub struct GroupDriver<A: Applier> {
    raw: RawNode<LogStore>,
    storage: GroupStorage,
    /// Whether the log could not be written, and what the others said of theirs.
    write_guard: crate::write_hold::WriteGuard,
    /// Ticks since the thread started.
    ticks: u64,
    links: Arc<Links>,
    applier: A,
    view: Arc<Mutex<GroupView>>,
    proposals: PendingProposals,
    pending_changes: Vec<ConfChange>,
    applied: u64,
    elections: u64,
    last_role: StateRole,
    damage: Damage,
    /// Applied entries past the latest snapshot that make the node take a new one.
    snapshot_entries_interval: u64,
    /// The applied index at which a snapshot was last refused (too large): the next try waits for
    /// another interval, so the refusal is said once per interval, not once per round.
    snapshot_refused_at: u64,
    /// A member was added after the log was compacted: a snapshot is taken at once, so the one
    /// the new member is sent holds it among the members (raft-rs refuses a snapshot whose
    /// members do not include the node it is sent to).
    snapshot_due: bool,
    /// The image of this node's snapshot, installed when the thread starts.
    start_image: Option<MetadataImage>,
    /// Snapshots sent and not yet taken, by member: when each was sent.
    snapshots_in_flight: HashMap<u64, Instant>,
    snapshots_taken: u64,
    snapshots_installed: u64,
    snapshots_sent: u64,
    /// When the leader last looked at its learners (learner first: `promotion.rs`).
    promotion_checked_at: Instant,
    /// When the leader last logged that a learner is not caught up.
    learner_behind_logged_at: Option<Instant>,
    /// As leader: the commit index at the previous look at the learners (`promotion.rs`).
    commit_at_last_check: Option<u64>,
}

impl<A: Applier> GroupDriver<A> {
    /// A driver for the group `opened`, sending through `links`.
    pub fn new(
        opened: OpenedGroup,
        links: Arc<Links>,
        applier: A,
        view: Arc<Mutex<GroupView>>,
        snapshot_entries_interval: u64,
    ) -> GroupDriver<A> {
        let OpenedGroup { raw, storage, damaged, start_image } = opened;
        let applied = raw.store().snapshot_ref().get_metadata().index;
        let write_guard = crate::write_hold::WriteGuard::new(
            "metadata group",
            "metadata".to_string(),
            storage.config.id,
            &storage.directory,
            storage.file_system.clone(),
        );
        GroupDriver {
            raw,
            storage,
            write_guard,
            ticks: 0,
            links,
            applier,
            view,
            proposals: PendingProposals::new(Duration::from_millis(super::settings::METADATA_COMMIT_TIMEOUT_MS_DEFAULT)),
            pending_changes: Vec::new(),
            applied,
            elections: 0,
            last_role: StateRole::Follower,
            damage: if damaged { Damage::AwaitingLeader } else { Damage::None },
            snapshot_entries_interval: snapshot_entries_interval.max(1),
            snapshot_refused_at: 0,
            snapshot_due: false,
            start_image,
            snapshots_in_flight: HashMap::new(),
            snapshots_taken: 0,
            snapshots_installed: 0,
            snapshots_sent: 0,
            promotion_checked_at: Instant::now(),
            learner_behind_logged_at: None,
            commit_at_last_check: None,
        }
    }

    /// How long a proposal not yet committed is proposed again at a change of leader: as long as
    /// its proposer waits (`metadata_commit_timeout_ms`, the default unless told).
    pub fn retry_proposals_for(mut self, window: Duration) -> GroupDriver<A> {
        self.proposals = PendingProposals::new(window);
        self
    }

    /// The thread's loop. Returns whether it stopped because it was asked to (true), or because
    /// it could not go on (false: a failure no disk explains).
    pub fn run(mut self, events: Receiver<GroupEvent>) -> bool {
        if let Some(image) = self.start_image.take() {
            // The state the snapshot holds, before any entry after it is applied.
            tracing::info!(index = image.index, entries = image.entries.len(), "starting from the metadata snapshot");
            self.applier.install(image);
        }
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
                self.ticks += 1;
                // A damaged node does not tick: it must not campaign; nor does a held one (a
                // group of one ticks on: no other node could lead it).
                if self.damage == Damage::None && (!self.write_guard.held() || self.sole_voter()) {
                    self.raw.tick();
                }
                self.probe_while_held();
            }
            self.propose_pending();
            self.promote_caught_up_learner();
            match self.process_ready().and_then(|()| self.maybe_snapshot()) {
                Ok(()) => {}
                Err(RoundError::Write(error)) => self.hold_after_write_failure(&error),
                Err(RoundError::Invalid(error)) => {
                    tracing::error!(%error, "the metadata group cannot go on");
                    return false;
                }
            }
            self.expire_snapshots_in_flight();
            let view = self.refresh_view();
            self.applier.after_round(&view);
        }
    }

    fn take(&mut self, event: GroupEvent) {
        match event {
            GroupEvent::Raft(message) => {
                if message.get_msg_type() == MessageType::MsgSnapshot {
                    // Checked before raft-rs takes it: a snapshot whose image does not decode
                    // would leave this node with a state it cannot rebuild.
                    if let Err(error) = MetadataImage::decode(&message.get_snapshot().data) {
                        tracing::error!(%error, from = %format!("{:x}", message.from), "a metadata snapshot from the leader was refused");
                        return;
                    }
                }
                if self.take_write_notice(&message) || self.refuse_while_held(&message) {
                    return;
                }
                let Some(message) = self.guard_damaged(message) else { return };
                // A message from a removed member, or for a term long gone: raft-rs refuses it.
                let _ = self.raw.step(message);
            }
            GroupEvent::Propose(data) => {
                // Past `PENDING_PROPOSALS_MAX` the proposal is dropped: its waiter times out.
                let _ = self.proposals.hold(data, Instant::now());
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
            MessageType::MsgSnapshot if self.damage == Damage::AwaitingLeader => {
                self.damage = Damage::CatchingUpTo(message.get_snapshot().get_metadata().index)
            }
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

    /// Hands held proposals to raft-rs once a leader is known (a follower forwards them to it),
    /// and again those not committed under an earlier leader or term: raft-rs keeps no proposal
    /// it forwarded, so one sent to a leader whose node just stopped is lost without this.
    fn propose_pending(&mut self) {
        let (term, leader) = (self.raw.raft.term, self.raw.raft.leader_id);
        if leader == 0 {
            return;
        }
        for proposal in self.proposals.due(term, leader, Instant::now()) {
            match self.raw.propose(Vec::new(), proposal.data.clone()) {
                Ok(()) => self.proposals.proposed(proposal, term, leader),
                Err(_) => self.proposals.refused(proposal),
            }
        }
        let retried = self.proposals.take_retried();
        if retried > 0 {
            tracing::info!(retried, term, leader = %format!("{leader:x}"), "metadata proposals not committed under the last leader proposed again");
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

    /// As leader, every [`PROMOTION_CHECK_INTERVAL`] while no membership change is in flight: the
    /// lowest-id learner that holds the commit index of the previous look is promoted to voter
    /// (a node joins as a learner, `control.rs`); one still behind stays a learner, said every
    /// [`LEARNER_BEHIND_LOG_MS`].
    fn promote_caught_up_learner(&mut self) {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            self.commit_at_last_check = None;
            return;
        }
        if self.promotion_checked_at.elapsed() < PROMOTION_CHECK_INTERVAL {
            return;
        }
        self.promotion_checked_at = Instant::now();
        let commit = raft.raft_log.committed;
        // A new leader's first look has no earlier commit: the current one is the bar.
        let caught_up_at = self.commit_at_last_check.replace(commit).unwrap_or(commit);
        if raft.has_pending_conf() || !self.pending_changes.is_empty() || self.damage != Damage::None {
            return;
        }
        let learners: Vec<u64> = raft.prs().conf().learners().iter().copied().collect();
        let progress =
            |node: u64| raft.prs().get(node).map(|progress| LearnerProgress { matched: progress.matched, active: progress.recent_active });
        match next_promotion(&learners, caught_up_at, progress) {
            Promotion::Nothing => {}
            Promotion::Promote(learner) => {
                let mut change = ConfChange { node_id: learner, ..Default::default() };
                change.set_change_type(ConfChangeType::AddNode);
                tracing::info!(node = %format!("{learner:x}"), caught_up_at, commit, "a metadata learner caught up: promoted to voter");
                if let Err(error) = self.raw.propose_conf_change(Vec::new(), change) {
                    tracing::warn!(%error, "promoting a metadata learner was refused; tried again later");
                }
            }
            Promotion::Behind(behind) => {
                let due = self.learner_behind_logged_at.is_none_or(|at| at.elapsed() >= Duration::from_millis(LEARNER_BEHIND_LOG_MS));
                if due {
                    self.learner_behind_logged_at = Some(Instant::now());
                    let behind: Vec<String> =
                        behind.iter().map(|(node, matched, active)| format!("{node:x} at {matched} (heard from: {active})")).collect();
                    tracing::warn!(
                        caught_up_at,
                        ?behind,
                        "a metadata learner is not caught up: it stays a learner until it holds the commit index"
                    );
                }
            }
        }
    }

    fn send(&mut self, messages: Vec<Message>) {
        for message in messages {
            let (to, is_snapshot) = (message.to, message.get_msg_type() == MessageType::MsgSnapshot);
            let sent = match message.write_to_bytes() {
                Ok(bytes) => self.links.send_raft(to, METADATA_GROUP, bytes.into()),
                Err(error) => {
                    tracing::error!(%error, "a Raft message did not encode");
                    false
                }
            };
            if is_snapshot {
                let index = message.get_snapshot().get_metadata().index;
                if sent {
                    self.snapshots_sent += 1;
                    self.snapshots_in_flight.insert(to, Instant::now());
                    tracing::info!(to = %format!("{to:x}"), index, "metadata snapshot sent to a member behind the compacted log");
                } else {
                    // Not queued (no link, or its queue full): raft-rs sends it again later.
                    self.raw.report_snapshot(to, SnapshotStatus::Failure);
                }
            }
        }
    }

    /// A snapshot sent and not taken within [`SNAPSHOT_SEND_TIMEOUT_MS`] is reported lost, so
    /// the leader sends it again (it may have gone with a link that went down).
    fn expire_snapshots_in_flight(&mut self) {
        if self.snapshots_in_flight.is_empty() {
            return;
        }
        let timeout = Duration::from_millis(SNAPSHOT_SEND_TIMEOUT_MS);
        let leading = self.raw.raft.state == StateRole::Leader;
        let mut expired = Vec::new();
        self.snapshots_in_flight.retain(|to, sent_at| {
            let waiting = leading && self.raw.raft.prs().get(*to).is_some_and(|progress| progress.state == ProgressState::Snapshot);
            if waiting && sent_at.elapsed() > timeout {
                expired.push(*to);
            }
            waiting && sent_at.elapsed() <= timeout
        });
        for to in expired {
            tracing::warn!(to = %format!("{to:x}"), "a metadata snapshot sent was not taken in time: sent again");
            self.raw.report_snapshot(to, SnapshotStatus::Failure);
        }
    }

    /// Takes a snapshot of the applied state and compacts the log up to it once the applied log
    /// has grown by `snapshot_entries_interval` entries past the latest one.
    fn maybe_snapshot(&mut self) -> Result<(), RoundError> {
        let snapshot_index = self.raw.store().snapshot_ref().get_metadata().index;
        let since = snapshot_index.max(self.snapshot_refused_at);
        let due = self.snapshot_due && self.applied > snapshot_index;
        if !due && self.applied < since + self.snapshot_entries_interval || self.damage != Damage::None {
            return Ok(());
        }
        self.snapshot_due = false;
        let image = self.applier.image(self.applied);
        let bytes = match image.encode() {
            Ok(bytes) => bytes,
            Err(error) => {
                self.snapshot_refused_at = self.applied;
                tracing::error!(%error, index = self.applied, bound = METADATA_SNAPSHOT_BYTES_MAX, "NO METADATA SNAPSHOT: the definitions are over the snapshot bound; the metadata log is not compacted past the latest snapshot (restarts and joining nodes replay it from there)");
                return Ok(());
            }
        };
        let (index, entries, size) = (self.applied, image.entries.len(), bytes.len());
        self.raw.mut_store().compact(index, bytes)?;
        self.snapshots_taken += 1;
        tracing::info!(index, entries, bytes = size, "metadata snapshot taken; the log is compacted up to it");
        Ok(())
    }

    fn process_ready(&mut self) -> Result<(), RoundError> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut ready = self.raw.ready();
        self.send(ready.take_messages());
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            // Checked when it arrived; a failure here is a bug, not input.
            let image = MetadataImage::decode(&snapshot.data).map_err(|error| RoundError::Invalid(error.to_string()))?;
            let index = snapshot.get_metadata().index;
            self.raw.mut_store().apply_snapshot(snapshot)?;
            tracing::info!(index, entries = image.entries.len(), "metadata snapshot installed from the leader");
            self.applier.install(image);
            self.applied = index;
            self.snapshots_installed += 1;
        }
        let appended = !ready.entries().is_empty();
        let store = self.raw.mut_store();
        store.append(ready.entries())?;
        if let Some(hard_state) = ready.hs() {
            store.set_hard_state(hard_state)?;
        }
        if appended || ready.must_sync() {
            self.raw.store().sync()?;
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

    /// Applies committed entries past the applied index (a node reopened after a failed write is
    /// handed again those between its durable commit index and what it had applied: skipped).
    fn apply_entries(&mut self, entries: Vec<Entry>) -> Result<(), RoundError> {
        for entry in entries {
            if entry.index <= self.applied {
                continue;
            }
            match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() => {}
                EntryType::EntryNormal => {
                    self.proposals.committed(&entry.data);
                    self.applier.apply(entry.index, &entry.data);
                }
                EntryType::EntryConfChange => {
                    let change = ConfChange::parse_from_bytes(&entry.data).map_err(|error| RoundError::Invalid(error.to_string()))?;
                    let members = self.raw.apply_conf_change(&change).map_err(|error| RoundError::Invalid(error.to_string()))?;
                    // Not counted applied when the members could not be recorded: the node
                    // reopened after the failure applies the change again.
                    self.raw.mut_store().set_conf_state(members.clone())?;
                    let added = matches!(change.get_change_type(), ConfChangeType::AddNode | ConfChangeType::AddLearnerNode);
                    if added && self.raw.store().snapshot_ref().get_metadata().index > 0 {
                        self.snapshot_due = true;
                    }
                    self.applier.conf_changed(entry.index, &change, &members);
                }
                EntryType::EntryConfChangeV2 => {
                    return Err(RoundError::Invalid("a joint membership change, which this version does not make".to_string()))
                }
            }
            self.applied = entry.index;
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
            snapshot_index: self.raw.store().snapshot_ref().get_metadata().index,
            snapshots_taken: self.snapshots_taken,
            snapshots_installed: self.snapshots_installed,
            snapshots_sent: self.snapshots_sent,
            write_held: self.write_guard.held(),
        };
        *self.view.lock() = view.clone();
        view
    }
}
