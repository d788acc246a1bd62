//! A shard whose log could not be written (a full disk: ENOSPC; EIO) holds back until a probe
//! write shows the disk takes writes again.
//!
//! The failed round acknowledged nothing it could not persist, and the node was reopened from
//! what is durable (`restart_after`): it is a follower again, and a leader whose write failed has
//! stepped down. While held the node:
//! - does not campaign (its election timer does not run) and refuses a leadership transfer: a
//!   node that cannot append must not lead, and each term it won would cost an election;
//! - does not take the leader's appends and snapshots: each would fail again and cost a reopen
//!   (heartbeats it takes: they write nothing);
//! - tells the leader it is held, so the leader does not hand it the shard's leadership;
//! - logs the failure once, then (failed writes and probes) a summary at most every
//!   [`WRITE_FAILURE_LOG_INTERVAL_MS`] (a disk full for an hour must not write a line per shard
//!   per second, and must still be said now and then);
//! - probes the disk every [`WRITE_PROBE_INTERVAL_MS`] by writing and syncing
//!   [`WRITE_PROBE_BYTES`] beside its log. Once that works it tells the leader, which sends again
//!   at once a snapshot the node could not install (else raft-rs waits out the snapshot timeout,
//!   10 s and more, before it resends).
//!
//! The notices ride the shard's own Raft link as message types raft-rs only uses locally (never
//! sent by a peer): `MsgUnreachable` says "held", `MsgSnapStatus` says "writing again". RabbitMQ's
//! Ra does the same in substance: a WAL that fails to write stops and is restarted, its members
//! resend what was not written, and nothing unwritten is confirmed.

use super::ShardWorker;
use replication::node::NodeError;
use replication::{Message, MessageType};
use std::time::{Duration, Instant};
use storage::file_system::OpenMode;

/// How often a held shard tries a probe write.
pub const WRITE_PROBE_INTERVAL_MS: u64 = 1_000;

/// What a probe writes: room for a few batches, not only a page.
pub const WRITE_PROBE_BYTES: usize = 256 << 10;

/// The least time between two log lines about the same held shard's failures.
pub const WRITE_FAILURE_LOG_INTERVAL_MS: u64 = 10_000;

/// How long a leader believes a member that said it is held, unless it says it writes again (a
/// held member says it again every probe).
pub const PEER_HELD_TICKS: u64 = 100;

/// The probe file, in the shard's directory.
const PROBE_FILE: &str = "write-probe";

/// A shard that could not write its log.
#[derive(Debug)]
pub(super) struct WriteHold {
    since: Instant,
    failures: u64,
    failures_logged: u64,
    logged_at: Instant,
    next_probe: Instant,
    /// The leader last told that this node is held.
    told: Option<u64>,
}

impl ShardWorker {
    /// Notes a failed write: logged the first time, then summarised now and then. `leader`: the
    /// leader the node knew before it was reopened (it knows none after), told it is held.
    pub(super) fn hold_after_write_failure(&mut self, error: &NodeError, leader: Option<u64>) {
        let now = Instant::now();
        let next_probe = now + Duration::from_millis(WRITE_PROBE_INTERVAL_MS);
        match self.write_hold.as_mut() {
            None => {
                tracing::error!(
                    shard = self.shard,
                    %error,
                    "the quorum shard's log could not be written: nothing unwritten is acknowledged; the node reopens \
                     its log, does not lead or campaign, and probes the disk until it takes writes again"
                );
                self.write_hold = Some(WriteHold { since: now, failures: 1, failures_logged: 1, logged_at: now, next_probe, told: None });
            }
            Some(hold) => {
                hold.next_probe = next_probe;
                self.count_failure_while_held(error);
            }
        }
        if let Some(leader) = leader {
            self.tell(leader, MessageType::MsgUnreachable);
        }
        if let Some(hold) = self.write_hold.as_mut() {
            hold.told = leader;
        }
    }

    /// Counts a failed write or probe while held; says so at most every
    /// [`WRITE_FAILURE_LOG_INTERVAL_MS`], with how many failed since it last said.
    fn count_failure_while_held(&mut self, error: &dyn std::fmt::Display) {
        let shard = self.shard;
        let Some(hold) = self.write_hold.as_mut() else { return };
        hold.failures += 1;
        let now = Instant::now();
        if now.duration_since(hold.logged_at) < Duration::from_millis(WRITE_FAILURE_LOG_INTERVAL_MS) {
            return;
        }
        let (failures, held_s) = (hold.failures - hold.failures_logged, hold.since.elapsed().as_secs());
        tracing::error!(shard, %error, failures, held_s, "the quorum shard's log still cannot be written");
        hold.failures_logged = hold.failures;
        hold.logged_at = now;
    }

    /// Whether this node's shard is held (it does not tick its election timer).
    pub(super) fn write_held(&self) -> bool {
        self.write_hold.is_some()
    }

    /// On ticks while held: a probe write when one is due; the hold ends when it works. Then the
    /// leader is told, once this node knows it again (a node reopened knows no leader until its
    /// next heartbeat).
    pub(super) fn probe_while_held(&mut self) {
        if self.writing_again_untold {
            if let Some(leader) = self.node.leader() {
                self.tell(leader, MessageType::MsgSnapStatus);
                self.writing_again_untold = false;
            }
        }
        let Some(hold) = self.write_hold.as_ref() else { return };
        // A leader elected while this node was held learns it too (the node that was full may
        // have led itself, and told nobody).
        let leader = self.node.leader().filter(|leader| *leader != self.config.node_id);
        if leader.is_some() && leader != hold.told {
            self.tell(leader.unwrap_or_default(), MessageType::MsgUnreachable);
            if let Some(hold) = self.write_hold.as_mut() {
                hold.told = leader;
            }
        }
        let Some(hold) = self.write_hold.as_ref() else { return };
        if Instant::now() < hold.next_probe {
            return;
        }
        match self.probe_write() {
            Ok(()) => {
                let (held_ms, failures) = (hold.since.elapsed().as_millis() as u64, hold.failures);
                tracing::info!(shard = self.shard, held_ms, failures, "the quorum shard's log can be written again; it catches up");
                self.write_hold = None;
                self.writing_again_untold = true;
            }
            Err(error) => {
                if let Some(hold) = self.write_hold.as_mut() {
                    hold.next_probe = Instant::now() + Duration::from_millis(WRITE_PROBE_INTERVAL_MS);
                }
                self.count_failure_while_held(&error);
                // Said again every probe, so the leader's note never runs out while the disk
                // stays full (else it would offer this node the leadership every PEER_HELD_TICKS).
                if let Some(leader) = self.node.leader() {
                    self.tell(leader, MessageType::MsgUnreachable);
                }
            }
        }
    }

    fn probe_write(&self) -> std::io::Result<()> {
        let path = self.config.data_dir.join("raft").join(format!("shard-{}", self.shard)).join(PROBE_FILE);
        let file_system = &self.config.file_system;
        let written = file_system.open(&path, OpenMode::CreateReadWrite).and_then(|file| {
            file.write_all_at(&vec![0; WRITE_PROBE_BYTES], 0)?;
            file.sync_data()
        });
        // Removed either way: the probe must not hold the space it asked about.
        let _ = file_system.remove_file(&path);
        written
    }

    /// Sends `leader` a held (`MsgUnreachable`) or writing-again (`MsgSnapStatus`) notice.
    pub(super) fn tell(&self, leader: u64, kind: MessageType) {
        if leader == self.config.node_id {
            return;
        }
        let mut message = Message::default();
        message.set_msg_type(kind);
        message.from = self.config.node_id;
        message.to = leader;
        message.term = self.node.term();
        self.transport.send(self.shard, message);
    }

    /// While held: a leader's offer of the leadership (`MsgTimeoutNow`) is refused, and the
    /// leader told why; its appends and snapshots are not taken (they could not be written: each
    /// try would cost a reopen, and the leader resends what it needs once told the node writes
    /// again). Returns whether `message` was refused.
    pub(super) fn refuse_while_held(&self, message: &Message) -> bool {
        if self.write_hold.is_none() {
            return false;
        }
        match message.get_msg_type() {
            MessageType::MsgTimeoutNow => {
                tracing::info!(shard = self.shard, "the shard's leadership was offered to this node, whose log cannot be written: refused");
                self.tell(message.from, MessageType::MsgUnreachable);
                true
            }
            MessageType::MsgAppend | MessageType::MsgSnapshot => true,
            _ => false,
        }
    }

    /// A peer's held or writing-again notice, taken here (never stepped: raft-rs refuses local
    /// message types from peers). Returns whether `message` was one.
    pub(super) fn take_write_notice(&mut self, message: &Message) -> bool {
        let from = message.from;
        match message.get_msg_type() {
            MessageType::MsgUnreachable => {
                self.peers_held.insert(from, self.ticks);
                true
            }
            MessageType::MsgSnapStatus => {
                self.peers_held.remove(&from);
                if self.node.awaits_snapshot(from) {
                    tracing::info!(shard = self.shard, to = %format!("{from:x}"), "a member writes again: its snapshot is sent again now");
                    self.snapshots_in_flight.remove(&from);
                    self.node.report_snapshot(from, false);
                }
                true
            }
            _ => false,
        }
    }

    /// Whether `peer` said lately that it cannot write its log.
    pub(super) fn peer_held(&self, peer: u64) -> bool {
        self.peers_held.get(&peer).is_some_and(|at| self.ticks < at + PEER_HELD_TICKS)
    }
}
