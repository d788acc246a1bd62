//! One shard's thread: commands in through a channel, one Raft round at a time.

use super::queue::QuorumQueue;
use super::tickets::{CommitSlot, ConfirmGate, SlotOutcome};
use super::HostConfig;
use crate::dead_letter::DeadLetterSender;
use parking_lot::{Condvar, Mutex};
use replication::batcher::Batcher;
use replication::command::{QueueCommand, QueueId};
use replication::node::{NodeConfig, NodeError, ReplicaNode};
use replication::state_machine::CommandResult;
use replication::transport::{PeerTransport, ShardId};
use replication::Message;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

mod apply;
pub(crate) mod delayed;
mod installed_snapshot;
mod membership;
mod peers;
mod rejoin;
mod write_hold;

/// The most bytes of commands one Raft entry carries (docs/replication.md: `batch_bytes_max`).
pub const BATCH_BYTES_MAX: usize = 1 << 20;

/// The most commands a shard's proposer keeps proposed and not yet committed; past it, new
/// commands wait in the shard's channel (the node's memory alarm bounds that, as it bounds
/// classic queues' messages in memory).
pub const UNCONFIRMED_COMMANDS_MAX: usize = 262_144;

/// The most inputs one round takes from the channel before it proposes, so a flood of commands
/// still gets rounds (and ticks) at a steady pace.
pub const INPUTS_PER_ROUND_MAX: usize = 65_536;

/// Ticks without a commit of the proposer's commands after which they are proposed again, when
/// the leader did not change (a forwarded proposal lost on the way).
pub const PROPOSAL_RETRY_TICKS: u64 = 20;

/// How long a leader waits for a member to take a snapshot it sent before it reports the
/// snapshot lost and sends it again (a link that went down drops it; raft-rs would otherwise wait
/// for the member forever), plus [`SNAPSHOT_SEND_MS_PER_MIB`] for each MiB it holds.
pub const SNAPSHOT_SEND_TIMEOUT_MS: u64 = 10_000;

/// The time a snapshot's size adds to its timeout (32 MiB a second, well under a link's speed).
pub const SNAPSHOT_SEND_MS_PER_MIB: u64 = 32;

/// Ticks between a leader's checks whether the shard's preferred node should lead it.
pub const LEADERSHIP_CHECK_TICKS: u64 = 50;

/// What a shard's Raft group looks like from this node, for metrics and management.
#[derive(Debug, Default)]
pub struct ShardFigures {
    /// The current term.
    pub term: AtomicU64,
    /// The highest index known committed.
    pub commit_index: AtomicU64,
    /// The highest index applied.
    pub applied_index: AtomicU64,
    /// The index the latest snapshot covers (0: none yet); the log holds entries after it.
    pub snapshot_index: AtomicU64,
    /// The index of the last entry written and fdatasynced to this node's log.
    pub last_written_index: AtomicU64,
    /// The latest sample of the time from this node's proposal of a batch to its commit, in
    /// microseconds (0: none yet). One batch at a time is timed (see `ShardWorker::latency_probe`).
    pub commit_latency_us: AtomicU64,
    /// Snapshots from the leader this node installed (entries it never applied itself).
    pub snapshots_installed: AtomicU64,
    /// Deliveries to this node's consumers that installed snapshots had skipped, performed after.
    pub deliveries_after_snapshot: AtomicU64,
    /// The leader this node knows of (0: none).
    pub leader: AtomicU64,
    /// Whether this node leads the shard.
    pub is_leader: AtomicBool,
    /// The shard applied its log up to its current term and found its recovered queues.
    pub ready: AtomicBool,
    /// The shard's voters and learners (refreshed every tick).
    pub members: Mutex<(Vec<u64>, Vec<u64>)>,
}

/// What a shard's thread is sent.
pub(crate) enum ShardInput {
    /// A command for a queue.
    Submit(Submission),
    /// Several at once (the settles of one socket read).
    SubmitMany(Vec<Submission>),
    /// A Raft message from a peer.
    #[cfg_attr(not(test), allow(dead_code))]
    Peer(Message),
    /// A queue found in the definitions at start: find its id by name once the shard caught up,
    /// declaring it again if the shard does not have it.
    Recovered(Arc<QuorumQueue>),
    /// The cluster's founding voters, learnt by a node that joined after its shards opened.
    InitialVoters(Vec<u64>),
    /// This shard holds the cluster's replicated delay store: fire its due messages there.
    Delayed(delayed::DelayedHook),
    /// Say what this shard holds that leaving its group would discard (queues, delayed messages).
    Holdings(mpsc::Sender<Vec<String>>),
    /// Leave the group this node formed alone and wait, empty, for the founding voters of the
    /// cluster it joins (see `rejoin.rs`).
    Rejoin(mpsc::Sender<Result<(), String>>),
    /// Stop after this round.
    Stop,
}

/// A command and what its commit must do.
pub(crate) struct Submission {
    pub(crate) queue: Arc<QuorumQueue>,
    pub(crate) command: QueueCommand,
    pub(crate) waiter: Waiter,
}

/// What a command's commit does on this node.
pub(crate) enum Waiter {
    /// Nothing (settles, requeues, cancels).
    Nothing,
    /// A publish: its confirm slot is filled.
    Publish(Arc<CommitSlot>),
    /// Someone waits for the result.
    Completion(Arc<Completion>),
    /// A basic.get's answer goes to its channel.
    Get(super::queue::GetRequest),
}

/// A result someone blocks for (declare, consume, purge, delete).
#[derive(Debug, Default)]
pub(crate) struct Completion {
    result: Mutex<Option<CommandResult>>,
    done: Condvar,
}

impl Completion {
    pub(crate) fn new() -> Arc<Completion> {
        Arc::new(Completion::default())
    }

    pub(crate) fn complete(&self, result: CommandResult) {
        *self.result.lock() = Some(result);
        self.done.notify_all();
    }

    /// The result, or `None` after `timeout`.
    pub(crate) fn wait(&self, timeout: Duration) -> Option<CommandResult> {
        let deadline = Instant::now() + timeout;
        let mut result = self.result.lock();
        while result.is_none() {
            if self.done.wait_until(&mut result, deadline).timed_out() {
                break;
            }
        }
        result.clone()
    }
}

/// The callers' side of a shard.
pub(crate) struct ShardHandle {
    sender: Mutex<Sender<ShardInput>>,
    pub(crate) figures: ShardFigures,
}

impl ShardHandle {
    /// Hands an input to the thread; when the thread is gone (the node stops) the waiters are
    /// told the command failed.
    pub(crate) fn send(&self, input: ShardInput) {
        let sent = self.sender.lock().send(input);
        if let Err(mpsc::SendError(input)) = sent {
            match input {
                ShardInput::Submit(submission) => fail(submission.waiter),
                ShardInput::SubmitMany(submissions) => submissions.into_iter().for_each(|submission| fail(submission.waiter)),
                _ => {}
            }
        }
    }

    pub(crate) fn submit(&self, submission: Submission) {
        self.send(ShardInput::Submit(submission));
    }
}

/// A waiter whose command will never be committed here.
pub(crate) fn fail(waiter: Waiter) {
    match waiter {
        Waiter::Nothing => {}
        Waiter::Publish(slot) => {
            if let Some(gate) = slot.fill(SlotOutcome::Failed) {
                gate.wake();
            }
        }
        Waiter::Completion(completion) => completion.complete(CommandResult::NoSuchQueue),
        Waiter::Get(request) => request.fail(),
    }
}

/// A command proposed and its waiter, until its commit.
struct Proposed {
    sequence: u64,
    queue: Arc<QuorumQueue>,
    waiter: Waiter,
}

/// The thread's state.
pub(crate) struct ShardWorker {
    shard: ShardId,
    node: ReplicaNode,
    node_config: NodeConfig,
    config: HostConfig,
    batcher: Batcher,
    proposer: u64,
    inputs: Receiver<ShardInput>,
    handle: Arc<ShardHandle>,
    transport: Arc<dyn PeerTransport>,
    dead_letters: Option<DeadLetterSender>,
    /// Commands proposed and not committed, in number order.
    proposed: VecDeque<Proposed>,
    /// Commands waiting for their queue's id (a declaration not committed yet, a queue recovered
    /// before the shard caught up).
    unresolved: Vec<Submission>,
    /// Queues recovered from the definitions, found by name once the shard caught up.
    recovered: Vec<Arc<QuorumQueue>>,
    /// This node's queues by id, for their deliveries and figures.
    queues: HashMap<QueueId, Weak<QuorumQueue>>,
    /// Confirm gates to wake after this round's slots were filled.
    gates: Vec<Arc<ConfirmGate>>,
    ticks: u64,
    /// The leader and term the unconfirmed commands were last proposed to.
    proposed_to: (Option<u64>, u64),
    retried_at_tick: u64,
    /// The last tick a command of this proposer was confirmed.
    progress_at_tick: u64,
    /// Peers and the tick this node last heard from each.
    last_heard: HashMap<u64, u64>,
    /// Peers whose node was released as gone (until heard from again).
    released: HashMap<u64, u64>,
    /// The batch being timed for `ShardFigures::commit_latency_us`: the number of its last
    /// command and when it was proposed. One at a time, so timing costs a clock read per sample.
    latency_probe: Option<(u64, Instant)>,
    /// The members the shard's leader makes the shard's (the cluster's).
    members_target: super::MembersTarget,
    /// The roles the operator chose for nodes in the shards.
    shard_roles: super::ShardRoles,
    /// The tick a membership change was last held back (its reason logged), to log it seldom.
    membership_held_at_tick: u64,
    /// As leader: the commit index at the previous membership check, the bar a learner must
    /// reach to be promoted (`shard/membership.rs`).
    commit_at_membership_check: Option<u64>,
    stopping: bool,
    /// When held (at-least-once) dead letters are published again.
    dead_letter_retry: super::dead_letter_retry::DeadLetterRetry,
    /// On the shard of the cluster's delay store: its queue and firing thread.
    delayed: Option<delayed::DelayedHook>,
    /// Snapshots sent and not yet taken, by member: when each is reported lost.
    snapshots_in_flight: HashMap<u64, Instant>,
    /// Snapshots from the leader this node installed (`ReplicaNode::snapshots_installed`), as of
    /// the last round: one more means entries were skipped (see `after_snapshot_installed`).
    snapshots_installed: u64,
    /// Whether this node's log could not be written, and what the others said of theirs
    /// (`write_hold.rs`).
    write_guard: crate::write_hold::WriteGuard,
}

/// Opens shard `shard` of this node and makes its thread's state.
pub(crate) fn open(
    shard: ShardId,
    config: &HostConfig,
    proposer: u64,
    transport: Arc<dyn PeerTransport>,
    dead_letters: Option<DeadLetterSender>,
    members_target: super::MembersTarget,
    shard_roles: super::ShardRoles,
) -> Result<(Arc<ShardHandle>, ShardWorker), NodeError> {
    let node_config = NodeConfig {
        id: config.node_id,
        voters: config.voters.clone(),
        election_tick: config.election_ticks,
        heartbeat_tick: config.heartbeat_ticks,
        snapshot_entries_interval: config.snapshot_entries_interval,
        election_seed: rand::random::<u64>(),
        // The group's identity: a record of another shard's log never passes for one of ours.
        checksum_seed: 0x51A2_D000 ^ shard,
    };
    let directory = config.data_dir.join("raft").join(format!("shard-{shard}"));
    let (node, recovery) = ReplicaNode::open(node_config.clone(), config.file_system.clone(), &directory)?;
    if recovery.damaged {
        tracing::error!(shard, "the quorum shard's log is damaged: the node neither votes nor campaigns until a leader repaired it");
    } else if recovery.hard_state_copies_damaged > 0 {
        tracing::warn!(shard, "a copy of the quorum shard's hard state fails its checksum; the other copy was read");
    }
    let (sender, inputs) = mpsc::channel();
    let handle = Arc::new(ShardHandle { sender: Mutex::new(sender), figures: ShardFigures::default() });
    let batcher = first_batcher(proposer, config.node_id);
    let write_guard =
        crate::write_hold::WriteGuard::new("quorum shard", shard.to_string(), config.node_id, &directory, config.file_system.clone());
    let worker = ShardWorker {
        shard,
        node,
        node_config,
        config: config.clone(),
        batcher,
        proposer,
        inputs,
        handle: handle.clone(),
        transport,
        dead_letters,
        proposed: VecDeque::new(),
        unresolved: Vec::new(),
        recovered: Vec::new(),
        queues: HashMap::new(),
        gates: Vec::new(),
        ticks: 0,
        proposed_to: (None, 0),
        retried_at_tick: 0,
        progress_at_tick: 0,
        last_heard: HashMap::new(),
        released: HashMap::new(),
        latency_probe: None,
        members_target,
        shard_roles,
        membership_held_at_tick: 0,
        commit_at_membership_check: None,
        stopping: false,
        dead_letter_retry: super::dead_letter_retry::DeadLetterRetry::new(config.dead_letter_retry_interval_ms),
        delayed: None,
        snapshots_in_flight: HashMap::new(),
        snapshots_installed: 0,
        write_guard,
    };
    Ok((handle, worker))
}

/// A proposer's batcher as it starts in a group: first of all it says which node this proposer
/// is, and releases this node's earlier incarnations, whose consumers and basic.gets died with
/// them (their messages come back).
fn first_batcher(proposer: u64, node: u64) -> Batcher {
    let mut batcher = Batcher::new(proposer, BATCH_BYTES_MAX, UNCONFIRMED_COMMANDS_MAX);
    for command in [QueueCommand::RegisterProposer { node }, QueueCommand::ReleaseNode { node, keep: proposer }] {
        batcher.push(0, command).expect("an empty batcher has room");
    }
    batcher
}

impl ShardWorker {
    /// The thread's loop: take inputs until the next tick, tick, propose, persist, apply.
    pub(crate) fn run(mut self) {
        if self.node.voters() == [self.config.node_id] {
            // A group of one needs no election timeout to elect itself.
            if let Err(error) = self.node.campaign() {
                tracing::error!(shard = self.shard, %error, "campaigning failed");
            }
        }
        let tick = Duration::from_millis(self.config.tick_ms.max(1));
        let mut next_tick = Instant::now() + tick;
        let mut next_delayed_ms: Option<u64> = None;
        while !self.stopping {
            let mut wait = next_tick.saturating_duration_since(Instant::now());
            if let Some(due_ms) = next_delayed_ms {
                // Woken for the next held message due, not only at the next tick.
                wait = wait.min(Duration::from_millis(due_ms.saturating_sub(crate::queue_runtime::now_ms())));
            }
            match self.inputs.recv_timeout(wait) {
                Ok(input) => self.take(input),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            for _ in 0..INPUTS_PER_ROUND_MAX {
                match self.inputs.try_recv() {
                    Ok(input) => self.take(input),
                    Err(_) => break,
                }
            }
            let tick_due = Instant::now() >= next_tick;
            if tick_due {
                next_tick += tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + tick;
                }
            }
            // raft-rs panics on states it holds impossible (a log read that failed, say); the
            // shard then reopens from what is durable rather than take the process down.
            let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if tick_due {
                    self.tick();
                }
                self.round();
                next_delayed_ms = self.fire_due_delayed();
            }));
            if round.is_err() {
                self.restart_after(NodeError::Write(std::io::Error::other("the raft driver panicked")));
            }
        }
        self.stop();
    }

    fn take(&mut self, input: ShardInput) {
        match input {
            ShardInput::Submit(submission) => self.admit(submission),
            ShardInput::SubmitMany(submissions) => submissions.into_iter().for_each(|submission| self.admit(submission)),
            ShardInput::Peer(message) => self.step_peer(message),
            ShardInput::Recovered(queue) => self.recovered.push(queue),
            ShardInput::InitialVoters(voters) => self.learn_initial_voters(voters),
            ShardInput::Delayed(hook) => self.delayed = Some(hook),
            ShardInput::Holdings(answer) => {
                let _ = answer.send(self.holdings());
            }
            ShardInput::Rejoin(answer) => {
                let _ = answer.send(self.rejoin());
            }
            ShardInput::Stop => self.stopping = true,
        }
    }

    /// Takes a command into the open window, or parks it until its queue's id is known.
    fn admit(&mut self, submission: Submission) {
        let is_declare = matches!(submission.command, QueueCommand::Declare { .. });
        let id = submission.queue.id();
        if id == 0 && !is_declare {
            self.unresolved.push(submission);
            return;
        }
        let Submission { queue, command, waiter } = submission;
        if let QueueCommand::Settle { position }
        | QueueCommand::Requeue { position }
        | QueueCommand::RequeueToTail { position }
        | QueueCommand::Reject { position } = command
        {
            queue.forget_handed(position);
        }
        match self.batcher.push(id, command) {
            Ok(sequence) => self.proposed.push_back(Proposed { sequence, queue, waiter }),
            Err(_) => {
                // Past UNCONFIRMED_COMMANDS_MAX: refused rather than held without bound.
                tracing::warn!(shard = self.shard, "too many quorum commands wait for their commit; one is refused");
                fail(waiter);
            }
        }
    }

    /// One tick of Raft time, and what is due on ticks.
    fn tick(&mut self) {
        self.ticks += 1;
        // A held follower's election timer stands still: it must not campaign (a group of one
        // leads alone and ticks on: no other node could).
        if !self.write_held() || self.node.is_leader() {
            self.node.tick();
        }
        self.probe_while_held();
        let leader = self.node.leader();
        let term = self.node.term();
        let leader_changed = (leader, term) != self.proposed_to;
        let quiet_since = self.retried_at_tick.max(self.progress_at_tick);
        let stalled = self.batcher.unconfirmed_count() > 0 && self.ticks >= quiet_since + PROPOSAL_RETRY_TICKS;
        if leader.is_some() && (leader_changed || stalled || self.batcher.retry_due()) {
            self.retry();
        }
        self.release_gone_nodes();
        self.expire_snapshots_in_flight();
        self.spread_leadership();
        self.reconcile_membership();
        *self.handle.figures.members.lock() = (self.node.voters(), self.node.learners());
        let leading = self.node.is_leader() && self.node.caught_up();
        self.dead_letter_retry.tick(leading, self.node.machine(), &self.queues, self.dead_letters.as_ref());
    }

    /// Leaders spread over the nodes: shard `n`'s preferred leader is the `n`-th voter (in id
    /// order, round robin), so with as many shards as nodes each node leads one. A leader that is
    /// not the preferred one hands over once the preferred node is caught up (checked every
    /// [`LEADERSHIP_CHECK_TICKS`], after the group settled), so a node that restarts takes its
    /// shard back.
    fn spread_leadership(&mut self) {
        if !self.node.is_leader() || !self.ticks.is_multiple_of(LEADERSHIP_CHECK_TICKS) {
            return;
        }
        // A voter the operator chose to demote is about to stop voting: never handed the lead.
        let chosen = self.chosen_roles();
        let mut voters: Vec<u64> = self.node.voters().into_iter().filter(|voter| !chosen.contains(&(*voter, false))).collect();
        if voters.is_empty() {
            return;
        }
        voters.sort_unstable();
        let preferred = voters[self.shard as usize % voters.len()];
        // A preferred node that cannot write its log would refuse, and the transfer would
        // stall proposals for an election timeout.
        if preferred != self.config.node_id && !self.peer_held(preferred) && self.node.transfer_leadership(preferred) {
            tracing::info!(shard = self.shard, to = preferred, "handing the shard's leadership to its preferred node");
        }
    }

    /// Proposes every unconfirmed command again, in order (a new leader, a lost forward).
    fn retry(&mut self) {
        self.proposed_to = (self.node.leader(), self.node.term());
        self.retried_at_tick = self.ticks;
        let batches = self.batcher.retry(super::queue::now_ms());
        for batch in batches {
            if self.node.propose_anywhere(&batch).is_err() {
                break;
            }
        }
    }

    /// Cuts the open window into entries and proposes them, persists, sends, applies.
    fn round(&mut self) {
        self.resolve();
        if self.batcher.open_count() > 0 && self.node.leader().is_some() {
            if self.batcher.retry_due() || (self.node.leader(), self.node.term()) != self.proposed_to {
                // Earlier commands first: a retry takes the open window along, in order.
                let _ = self.batcher.cut(super::queue::now_ms());
                self.retry();
            } else {
                for batch in self.batcher.cut(super::queue::now_ms()) {
                    if self.latency_probe.is_none() {
                        self.latency_probe = batch.commands.last().map(|command| (command.sequence, Instant::now()));
                    }
                    if self.node.propose_anywhere(&batch).is_err() {
                        // No leader after all: the next retry proposes it.
                        break;
                    }
                }
            }
        }
        if let Err(error) = self.node.process_ready() {
            self.restart_after(error);
            return;
        }
        self.send_messages();
        let outcomes = self.node.take_outcomes();
        if self.node.snapshots_installed() != self.snapshots_installed {
            self.snapshots_installed = self.node.snapshots_installed();
            self.handle.figures.snapshots_installed.store(self.snapshots_installed, Ordering::Relaxed);
            self.after_snapshot_installed(&outcomes);
        }
        if !outcomes.is_empty() {
            self.apply(outcomes);
        }
        self.publish_figures();
        for gate in self.gates.drain(..) {
            gate.wake();
        }
    }

    fn send_messages(&mut self) {
        for message in self.node.take_messages() {
            let (to, is_snapshot) = (message.to, message.get_msg_type() == replication::MessageType::MsgSnapshot);
            let snapshot_mib = if is_snapshot { (message.get_snapshot().data.len() >> 20) as u64 } else { 0 };
            let sent = self.transport.send(self.shard, message);
            if is_snapshot && !sent {
                self.node.report_snapshot(to, false);
            } else if is_snapshot {
                let timeout_ms = SNAPSHOT_SEND_TIMEOUT_MS + snapshot_mib * SNAPSHOT_SEND_MS_PER_MIB;
                tracing::info!(shard = self.shard, to = %format!("{to:x}"), snapshot_mib, "shard snapshot sent to a member behind the compacted log");
                self.snapshots_in_flight.insert(to, Instant::now() + Duration::from_millis(timeout_ms));
            }
        }
    }

    /// A snapshot sent and not taken in time is reported lost, so the leader sends it again.
    fn expire_snapshots_in_flight(&mut self) {
        if self.snapshots_in_flight.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut expired = Vec::new();
        let node = &self.node;
        self.snapshots_in_flight.retain(|to, deadline| {
            let waiting = node.awaits_snapshot(*to);
            if waiting && now > *deadline {
                expired.push(*to);
            }
            waiting && now <= *deadline
        });
        for to in expired {
            tracing::warn!(shard = self.shard, to = %format!("{to:x}"), "a shard snapshot sent was not taken in time: sent again");
            self.node.report_snapshot(to, false);
        }
    }

    /// A write or sync of the shard's log failed: nothing it could not persist was acknowledged.
    /// The node is opened again from what is durable (a leader steps down so), and held until
    /// its disk takes writes again (`write_hold.rs`); its unconfirmed commands are proposed again.
    fn restart_after(&mut self, error: NodeError) {
        let leader = self.node.leader().filter(|leader| *leader != self.config.node_id);
        self.hold_after_write_failure(&error, leader);
        std::thread::sleep(Duration::from_millis(self.config.tick_ms.max(1) * 10));
        let directory = self.config.data_dir.join("raft").join(format!("shard-{}", self.shard));
        match ReplicaNode::open(self.node_config.clone(), self.config.file_system.clone(), &directory) {
            Ok((node, _)) => {
                self.node = node;
                self.proposed_to = (None, 0);
                if self.node.voters() == [self.config.node_id] {
                    let _ = self.node.campaign();
                }
            }
            Err(error) => tracing::error!(shard = self.shard, %error, "reopening the quorum shard failed; trying again"),
        }
        // The failed round published nothing: without this a leader that stepped down went on
        // showing itself the leader (management, metrics) for as long as its rounds failed.
        self.publish_figures();
    }

    fn publish_figures(&self) {
        let figures = &self.handle.figures;
        figures.term.store(self.node.term(), Ordering::Relaxed);
        figures.commit_index.store(self.node.commit_index(), Ordering::Relaxed);
        figures.applied_index.store(self.node.machine().applied_index(), Ordering::Relaxed);
        let store = self.node.store();
        figures.snapshot_index.store(store.snapshot_ref().get_metadata().index, Ordering::Relaxed);
        figures.last_written_index.store(store.last_index_now(), Ordering::Relaxed);
        figures.leader.store(self.node.leader().unwrap_or(0), Ordering::Relaxed);
        figures.is_leader.store(self.node.is_leader(), Ordering::Relaxed);
        // A node that joined and does not know the founding voters yet has nothing to wait for.
        let members_unknown = store.conf_state().voters.is_empty() && store.conf_state().learners.is_empty();
        figures.ready.store((self.node.caught_up() && self.recovered.is_empty()) || members_unknown, Ordering::Release);
    }

    /// The node stops: whatever waits for a commit here is told it failed.
    fn stop(mut self) {
        for proposed in self.proposed.drain(..) {
            fail(proposed.waiter);
        }
        for submission in self.unresolved.drain(..) {
            fail(submission.waiter);
        }
        while let Ok(input) = self.inputs.try_recv() {
            match input {
                ShardInput::Submit(submission) => fail(submission.waiter),
                ShardInput::SubmitMany(submissions) => submissions.into_iter().for_each(|submission| fail(submission.waiter)),
                _ => {}
            }
        }
    }
}
