//! A deterministic three-node cluster in one process: each node on its own `MemoryFileSystem`,
//! an in-memory network with seeded delays, drops and cut links, crashes as power cuts that lose
//! unsynced writes. Everything random comes from one seed, so a failing seed replays exactly.
//!
//! The cluster records every `Committed` outcome of every node incarnation, so the checks can say
//! whether two nodes ever committed different things at one index and whether the final queue
//! holds exactly the committed enqueues that were not settled.

#![allow(dead_code)]

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use replication::batcher::Batcher;
use replication::command::QueueCommand;
use replication::node::{NodeConfig, ReplicaNode};
use replication::state_machine::{CommandResult, Outcome};
use replication::transport::{ShardId, Transport};
use replication::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use storage::memory_file_system::{MemoryFileSystem, PowerCut};

/// The one replicated queue the scenarios use.
pub const QUEUE: u64 = 7;
/// The consumer the scenarios attach.
pub const CONSUMER: u64 = 99;
/// The client's proposer id (commands are named by it, whichever node leads).
pub const CLIENT: u64 = 1000;

/// What the network and the clock do with a message in flight.
struct InFlight {
    deliver_at_tick: u64,
    order: u64,
    /// The message as the wire carries it ([`replication::transport::encode_frame`]).
    frame: Bytes,
}

/// Counts of what a run exercised, so a test can require that its seeds covered each case.
#[derive(Debug, Default, Clone, Copy)]
pub struct Coverage {
    pub elections: u64,
    pub crashes: u64,
    pub leader_crashes: u64,
    pub snapshots_delivered: u64,
    pub messages_dropped: u64,
    pub partitions: u64,
    pub commands_committed: u64,
    pub disk_failures: u64,
    pub client_retries: u64,
}

/// What one command is, for the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Enqueue(Bytes),
    Settle(u64),
    Requeue(u64),
    Other,
}

pub struct Cluster {
    pub seed: u64,
    pub random: StdRng,
    pub file_systems: Vec<MemoryFileSystem>,
    pub nodes: Vec<Option<ReplicaNode>>,
    pub incarnations: Vec<u64>,
    pub snapshot_entries_interval: u64,
    in_flight: Vec<InFlight>,
    next_order: u64,
    /// Links that drop everything: (from, to).
    pub cut_links: BTreeSet<(u64, u64)>,
    /// Percent of messages dropped.
    pub drop_percent: u32,
    pub tick: u64,
    next_body: u64,
    /// The client: one proposer whose commands go to whichever node leads, retried under the same
    /// numbers after a change of leader.
    pub client: Batcher,
    client_leader: (Option<u64>, Option<u64>),
    client_retried_tick: u64,
    /// Every command proposed, by sequence.
    pub proposed: BTreeMap<u64, Kind>,
    /// Every commit seen, by (proposer, sequence): the index it was committed at.
    pub committed: BTreeMap<(u64, u64), u64>,
    /// Commands the client saw confirmed (a `Committed` outcome on the node it proposed to).
    pub confirmed: BTreeSet<u64>,
    /// Deliveries the plan made and the client has not settled or requeued: position -> body.
    pub outstanding: BTreeMap<u64, Bytes>,
    /// Positions whose settle or requeue is proposed and not committed yet.
    pub settling: BTreeSet<u64>,
    /// Position -> body, over the whole run (a position never changes its message).
    pub bodies: BTreeMap<u64, Bytes>,
    /// Positions whose settle was committed, and at which index: never delivered after it.
    pub settled_at: BTreeMap<u64, u64>,
    pub violations: Vec<String>,
    pub coverage: Coverage,
    last_leader: Option<u64>,
}

pub fn directory() -> PathBuf {
    PathBuf::from("/data/raft/shard-0")
}

impl Cluster {
    pub fn new(seed: u64, snapshot_entries_interval: u64) -> Cluster {
        let mut cluster = Cluster {
            seed,
            random: StdRng::seed_from_u64(seed),
            file_systems: Vec::new(),
            nodes: Vec::new(),
            incarnations: vec![0; 3],
            snapshot_entries_interval,
            in_flight: Vec::new(),
            next_order: 0,
            cut_links: BTreeSet::new(),
            drop_percent: 0,
            tick: 0,
            next_body: 1,
            client: Batcher::new(CLIENT, 1 << 20, 1_000_000),
            client_leader: (None, None),
            client_retried_tick: 0,
            proposed: BTreeMap::new(),
            committed: BTreeMap::new(),
            confirmed: BTreeSet::new(),
            outstanding: BTreeMap::new(),
            settling: BTreeSet::new(),
            bodies: BTreeMap::new(),
            settled_at: BTreeMap::new(),
            violations: Vec::new(),
            coverage: Coverage::default(),
            last_leader: None,
        };
        for id in 1..=3u64 {
            let file_system = MemoryFileSystem::new();
            file_system.create_durable_directory(Path::new("/data/raft"));
            cluster.file_systems.push(file_system);
            cluster.nodes.push(None);
            cluster.start(id);
        }
        cluster
    }

    fn config(&self, id: u64) -> NodeConfig {
        NodeConfig {
            id,
            voters: vec![1, 2, 3],
            election_tick: 10,
            heartbeat_tick: 2,
            snapshot_entries_interval: self.snapshot_entries_interval,
            election_seed: self.seed.wrapping_mul(31).wrapping_add(id * 1_000 + self.incarnations[id as usize - 1]),
            checksum_seed: 0x51A2_D000,
        }
    }

    /// Starts (or restarts) node `id` from what its file system holds.
    pub fn start(&mut self, id: u64) -> replication::log_store::Recovery {
        let index = id as usize - 1;
        self.incarnations[index] += 1;
        let config = self.config(id);
        let (node, recovery) =
            ReplicaNode::open(config, self.file_systems[index].shared(), &directory()).expect("a node opens from its durable state");
        self.nodes[index] = Some(node);
        recovery
    }

    /// Power-cuts node `id`: it stops, and what it had not synced is lost.
    pub fn crash(&mut self, id: u64, cut: PowerCut) {
        let index = id as usize - 1;
        if let Some(node) = self.nodes[index].take() {
            if node.is_leader() {
                self.coverage.leader_crashes += 1;
            }
            self.coverage.crashes += 1;
        }
        self.file_systems[index] = self.file_systems[index].power_cut(cut);
    }

    pub fn node(&self, id: u64) -> Option<&ReplicaNode> {
        self.nodes[id as usize - 1].as_ref()
    }

    pub fn leader(&self) -> Option<u64> {
        // The leader of the highest term, when two believe they lead (one is deposed, not told yet).
        self.nodes.iter().flatten().filter(|node| node.is_leader()).max_by_key(|node| node.term()).map(|node| node.id())
    }

    /// Cuts (or heals) every link between `id` and the others.
    pub fn isolate(&mut self, id: u64, isolated: bool) {
        for other in 1..=3u64 {
            if other == id {
                continue;
            }
            for link in [(id, other), (other, id)] {
                if isolated {
                    self.cut_links.insert(link);
                } else {
                    self.cut_links.remove(&link);
                }
            }
        }
        if isolated {
            self.coverage.partitions += 1;
        }
    }

    /// Proposes commands on the leader as one batch; false when there is no leader.
    pub fn propose(&mut self, commands: Vec<(u64, QueueCommand)>) -> bool {
        for (queue, command) in commands {
            let kind = match &command {
                QueueCommand::Enqueue { body, .. } => Kind::Enqueue(body.clone()),
                QueueCommand::Settle { position } => Kind::Settle(*position),
                QueueCommand::Requeue { position } => Kind::Requeue(*position),
                _ => Kind::Other,
            };
            let sequence = self.client.push(queue, command).expect("the client's bound is far");
            self.proposed.insert(sequence, kind);
        }
        self.flush_client();
        true
    }

    /// Cuts the client's window and proposes it on the leader; after a change of leader or term
    /// (the entries of the old one may be lost), and every 100 ticks, everything unconfirmed again.
    pub fn flush_client(&mut self) {
        let now_ms = 1_000_000 + self.tick * 10;
        let mut batches = self.client.cut(now_ms);
        let Some(leader) = self.leader() else { return };
        let term = self.node(leader).map(|node| node.term());
        if self.client_leader != (Some(leader), term) || self.tick >= self.client_retried_tick + 100 {
            self.client_leader = (Some(leader), term);
            self.client_retried_tick = self.tick;
            batches = self.client.retry(now_ms);
            self.coverage.client_retries += 1;
        }
        let node = self.nodes[leader as usize - 1].as_mut().expect("the leader is up");
        for batch in batches {
            // A refusal leaves the commands unconfirmed: the next retry proposes them again.
            let _ = node.propose(&batch);
        }
    }

    /// Proposes `count` enqueues whose bodies are unique.
    pub fn publish(&mut self, count: usize) -> bool {
        let first = self.next_body;
        self.next_body += count as u64;
        let commands = (0..count as u64)
            .map(|offset| {
                let body = Bytes::from(format!("message-{}", first + offset));
                (QUEUE, QueueCommand::Enqueue { persistent: true, own_ttl_ms: None, body, deduplication: None })
            })
            .collect();
        self.propose(commands)
    }

    /// Settles (or requeues, one in five) up to `count` outstanding deliveries.
    pub fn settle_some(&mut self, count: usize) {
        let positions: Vec<u64> =
            self.outstanding.keys().copied().filter(|position| !self.settling.contains(position)).take(count).collect();
        if positions.is_empty() {
            return;
        }
        let mut commands = Vec::new();
        for position in &positions {
            let command = match self.random.gen_range(0..5) {
                0 => QueueCommand::Requeue { position: *position },
                _ => QueueCommand::Settle { position: *position },
            };
            commands.push((QUEUE, command));
        }
        if self.propose(commands) {
            self.settling.extend(positions);
        }
    }

    /// One tick: time passes on every node, due messages arrive, every node handles its `Ready`.
    pub fn step(&mut self) {
        self.tick += 1;
        for node in self.nodes.iter_mut().flatten() {
            node.tick();
        }
        self.deliver_due();
        self.process_all();
        if self.client.unconfirmed_count() > 0 {
            self.flush_client();
        }
        let leader = self.leader();
        if leader.is_some() && leader != self.last_leader {
            self.coverage.elections += 1;
        }
        self.last_leader = leader;
    }

    fn deliver_due(&mut self) {
        // Several rounds: a message answered within the tick is sent on by the next round only
        // if its delay is 0, which the network never draws, so each round drains what is due.
        self.in_flight.sort_by_key(|message| (message.deliver_at_tick, message.order));
        let due = self.in_flight.iter().take_while(|message| message.deliver_at_tick <= self.tick).count();
        let arriving: Vec<InFlight> = self.in_flight.drain(..due).collect();
        for InFlight { frame, .. } in arriving {
            let (shard, message) = replication::transport::decode_frame(frame).expect("a frame decodes");
            assert_eq!(shard, 0);
            let (from, to) = (message.from, message.to);
            let is_snapshot = message.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot;
            let Some(node) = self.nodes[to as usize - 1].as_mut() else {
                if is_snapshot {
                    self.report_snapshot(from, to, false);
                }
                continue;
            };
            node.step(message);
            if is_snapshot {
                self.coverage.snapshots_delivered += 1;
                self.report_snapshot(from, to, true);
            }
        }
    }

    fn report_snapshot(&mut self, from: u64, to: u64, delivered: bool) {
        if let Some(sender) = self.nodes[from as usize - 1].as_mut() {
            sender.report_snapshot(to, delivered);
        }
    }

    pub fn process_all(&mut self) {
        for index in 0..3 {
            let Some(node) = self.nodes[index].as_mut() else { continue };
            if node.process_ready().is_err() {
                // A write or sync failed: the node stops without acknowledging what it could not
                // persist, and its process restarts from what is durable.
                self.coverage.disk_failures += 1;
                let id = node.id();
                let messages = node.take_messages();
                for message in messages {
                    Transport::send(self, 0, message);
                }
                self.file_systems[index] = self.file_systems[index].power_cut(PowerCut::LoseUnsynced);
                self.nodes[index] = None;
                self.start(id);
                continue;
            }
            let messages = node.take_messages();
            let outcomes = node.take_outcomes();
            let id = node.id();
            self.record_outcomes(id, outcomes);
            for message in messages {
                Transport::send(self, 0, message);
            }
        }
    }
}

impl Transport for Cluster {
    fn send(&mut self, _shard: ShardId, message: Message) {
        let dropped = self.cut_links.contains(&(message.from, message.to)) || self.random.gen_range(0..100) < self.drop_percent;
        if dropped {
            self.coverage.messages_dropped += 1;
            if message.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot {
                self.report_snapshot(message.from, message.to, false);
            }
            return;
        }
        let delay = self.random.gen_range(1..=3);
        let frame = Bytes::from(replication::transport::encode_frame(0, &message).expect("a message encodes"));
        self.in_flight.push(InFlight { deliver_at_tick: self.tick + delay, order: self.next_order, frame });
        self.next_order += 1;
    }
}

impl Cluster {
    fn record_outcomes(&mut self, node: u64, outcomes: Vec<Outcome>) {
        for (sequence, _) in self.client.confirm(&outcomes) {
            self.confirmed.insert(sequence);
        }
        for outcome in outcomes {
            match outcome {
                Outcome::Committed { index, proposer, sequence, result, .. } => {
                    if result == CommandResult::Duplicate {
                        continue;
                    }
                    if let Some(earlier) = self.committed.insert((proposer, sequence), index) {
                        if earlier != index {
                            self.violations.push(format!(
                                "seed {}: command {sequence} committed at {earlier} and at {index} (node {node})",
                                self.seed
                            ));
                        }
                    }
                    let kind = self.proposed.get(&sequence).cloned().unwrap_or(Kind::Other);
                    if let (Kind::Settle(position) | Kind::Requeue(position), CommandResult::Core(_)) = (&kind, result) {
                        self.outstanding.remove(position);
                        self.settling.remove(position);
                    }
                    if let Kind::Settle(position) = kind {
                        self.settled_at.entry(position).or_insert(index);
                    }
                }
                Outcome::Delivered { index, queue, position, body, .. } => {
                    assert_eq!(queue, QUEUE);
                    if let Some(settled_index) = self.settled_at.get(&position).filter(|settled_index| **settled_index < index) {
                        let seed = self.seed;
                        self.violations.push(format!("seed {seed}: position {position} delivered at {index} after its ack committed at {settled_index} (node {node})"));
                    }
                    if let Some(earlier) = self.bodies.insert(position, body.clone()) {
                        if earlier != body {
                            self.violations
                                .push(format!("seed {}: position {position} held {earlier:?} and {body:?} (node {node})", self.seed));
                        }
                    }
                    self.outstanding.insert(position, body);
                }
                Outcome::Dropped { .. } | Outcome::ConsumerRemoved { .. } => {}
            }
        }
    }

    /// Heals the network, restarts every node, and runs until all agree on one applied index
    /// under one leader (or the tick budget runs out).
    pub fn settle_down(&mut self, ticks_max: u64) {
        self.cut_links.clear();
        self.drop_percent = 0;
        for id in 1..=3 {
            if self.node(id).is_none() {
                self.start(id);
            }
        }
        for _ in 0..ticks_max {
            self.step();
            if self.converged() {
                return;
            }
        }
    }

    fn converged(&self) -> bool {
        let Some(leader) = self.leader().and_then(|id| self.node(id)) else { return false };
        if self.client.unconfirmed_count() > 0 {
            return false;
        }
        let commit = leader.commit_index();
        // A new leader learns what is committed only once an entry of its own term is: until its
        // whole log is committed, its commit index may trail what an earlier leader committed.
        if commit != leader.store().last_index_now() {
            return false;
        }
        self.nodes
            .iter()
            .all(|node| node.as_ref().is_some_and(|node| node.machine().applied_index() == commit && node.commit_index() == commit))
    }

    /// The checks of a finished run; each failure is one line naming the seed.
    pub fn check(&mut self) -> Vec<String> {
        let mut failures = std::mem::take(&mut self.violations);
        let seed = self.seed;
        if !self.converged() {
            failures.push(format!("seed {seed}: the nodes did not converge"));
            return failures;
        }
        let images: Vec<Vec<u8>> = self.nodes.iter().flatten().map(|node| node.machine().encode_image()).collect();
        if images.windows(2).any(|pair| pair[0] != pair[1]) {
            failures.push(format!("seed {seed}: the state machines differ between nodes"));
        }
        let node = self.nodes[0].as_ref().expect("up");
        let Some(core) = node.machine().queue(QUEUE) else {
            failures.push(format!("seed {seed}: the queue is gone"));
            return failures;
        };
        let image = core.image();
        let stats = core.stats();
        let committed_enqueues: BTreeSet<Bytes> = self
            .committed
            .keys()
            .filter_map(|(_, sequence)| match self.proposed.get(sequence) {
                Some(Kind::Enqueue(body)) => Some(body.clone()),
                _ => None,
            })
            .collect();
        let mut held: Vec<Bytes> = image.messages.ready.iter().map(|(_, queued)| queued.message.0.clone()).collect();
        held.extend(image.messages.unacked.iter().map(|(_, queued, _)| queued.message.0.clone()));
        let held_set: BTreeSet<Bytes> = held.iter().cloned().collect();
        if held_set.len() != held.len() {
            failures.push(format!("seed {seed}: a message is held twice"));
        }
        if !held_set.is_subset(&committed_enqueues) {
            failures.push(format!("seed {seed}: the queue holds a message never committed"));
        }
        if stats.published != committed_enqueues.len() as u64 {
            failures.push(format!("seed {seed}: {} enqueues committed, {} applied", committed_enqueues.len(), stats.published));
        }
        let settled = committed_enqueues.len() - held_set.len();
        if stats.acked != settled as u64 {
            failures.push(format!("seed {seed}: {settled} committed messages are not in the queue, {} were acked", stats.acked));
        }
        // The client retried until every command was confirmed: each enqueue it pushed is applied
        // exactly once.
        let pushed_enqueues = self.proposed.values().filter(|kind| matches!(kind, Kind::Enqueue(_))).count() as u64;
        if stats.published != pushed_enqueues {
            failures.push(format!("seed {seed}: {pushed_enqueues} enqueues proposed and confirmed, {} applied", stats.published));
        }
        failures
    }
}
