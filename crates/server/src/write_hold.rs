//! A Raft member whose log could not be written (a full disk: ENOSPC; EIO) holds back until a
//! probe write shows the disk takes writes again. Shared by the quorum shards
//! (`quorum/shard/write_hold.rs`) and the metadata group (`cluster/group/write_hold.rs`): each
//! reopens its node from what is durable after the failed round (which acknowledged nothing it
//! could not persist), then asks its [`WriteGuard`] what to do and sends the notices it returns.
//!
//! While held the member:
//! - does not campaign (its driver does not tick its election timer) and refuses a leadership
//!   transfer: a node that cannot append must not lead, and each term it won would cost an election;
//! - does not take the leader's appends and snapshots: each would fail again and cost a reopen
//!   (heartbeats it takes: they write nothing);
//! - tells the leader it is held, so the leader does not hand it the group's leadership;
//! - logs the failure once, then (failed writes and probes) a summary at most every
//!   [`WRITE_FAILURE_LOG_INTERVAL_MS`] (a disk full for an hour must not write a line per group
//!   per second, and must still be said now and then);
//! - probes the disk every [`WRITE_PROBE_INTERVAL_MS`] by writing and syncing
//!   [`WRITE_PROBE_BYTES`] beside its log. Once that works it tells the leader, which sends again
//!   at once a snapshot the node could not install (else raft-rs waits out the snapshot timeout,
//!   10 s and more, before it resends).
//!
//! The notices ride the group's own Raft link as message types raft-rs only uses locally (never
//! sent by a peer): `MsgUnreachable` says "held", `MsgSnapStatus` says "writing again". RabbitMQ's
//! Ra does the same in substance: a WAL that fails to write stops and is restarted, its members
//! resend what was not written, and nothing unwritten is confirmed.

use replication::{Message, MessageType};
use std::collections::HashMap;
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use storage::file_system::{OpenMode, SharedFileSystem};

/// How often a held member tries a probe write.
pub const WRITE_PROBE_INTERVAL_MS: u64 = 1_000;

/// What a probe writes: room for a few batches, not only a page.
pub const WRITE_PROBE_BYTES: usize = 256 << 10;

/// The least time between two log lines about the same held member's failures.
pub const WRITE_FAILURE_LOG_INTERVAL_MS: u64 = 10_000;

/// How long (in the caller's ticks) a leader believes a member that said it is held, unless it
/// says it writes again (a held member says it again every probe).
pub const PEER_HELD_TICKS: u64 = 100;

/// The probe file, in the group's directory.
const PROBE_FILE: &str = "write-probe";

/// A member that could not write its log, since when.
#[derive(Debug)]
struct Hold {
    since: Instant,
    failures: u64,
    failures_logged: u64,
    logged_at: Instant,
    next_probe: Instant,
    /// The leader last told that this node is held.
    told: Option<u64>,
}

/// A peer's notice, taken out of the Raft stream by [`WriteGuard::take_notice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// The peer cannot write its log.
    Held,
    /// The peer (this one) writes again: a snapshot it could not install is due again now.
    WritingAgain(u64),
}

/// One member's hold, and what its peers said of theirs.
pub struct WriteGuard {
    /// What the log lines call the group ("quorum shard", "metadata group").
    subject: &'static str,
    /// Which one, in the log lines' `group` field.
    label: String,
    node_id: u64,
    probe_path: PathBuf,
    file_system: SharedFileSystem,
    hold: Option<Hold>,
    /// The hold ended and the leader was not told yet (no leader known).
    writing_again_untold: bool,
    /// Members that said they cannot write their log, and the tick they said it.
    peers_held: HashMap<u64, u64>,
}

impl WriteGuard {
    /// A guard for member `node_id` of the group whose log lives in `directory`.
    pub fn new(subject: &'static str, label: String, node_id: u64, directory: &Path, file_system: SharedFileSystem) -> WriteGuard {
        WriteGuard {
            subject,
            label,
            node_id,
            probe_path: directory.join(PROBE_FILE),
            file_system,
            hold: None,
            writing_again_untold: false,
            peers_held: HashMap::new(),
        }
    }

    /// Whether this member is held (its driver does not tick its election timer).
    pub fn held(&self) -> bool {
        self.hold.is_some()
    }

    /// Notes a failed write: logged the first time, then summarised now and then. `leader`: the
    /// leader the node knew before it was reopened (it knows none after), told it is held; the
    /// notice to send is returned.
    pub fn hold_after_failure(&mut self, error: &dyn Display, leader: Option<u64>, term: u64) -> Option<Message> {
        let now = Instant::now();
        let next_probe = now + Duration::from_millis(WRITE_PROBE_INTERVAL_MS);
        match self.hold.as_mut() {
            None => {
                tracing::error!(
                    group = %self.label,
                    %error,
                    "the {}'s log could not be written: nothing unwritten is acknowledged; the node reopens its log, does \
                     not lead or campaign, and probes the disk until it takes writes again",
                    self.subject
                );
                self.hold = Some(Hold { since: now, failures: 1, failures_logged: 1, logged_at: now, next_probe, told: None });
            }
            Some(hold) => {
                hold.next_probe = next_probe;
                self.count_failure_while_held(error);
            }
        }
        if let Some(hold) = self.hold.as_mut() {
            hold.told = leader;
        }
        leader.and_then(|leader| self.notice(leader, MessageType::MsgUnreachable, term))
    }

    /// Counts a failed write or probe while held; says so at most every
    /// [`WRITE_FAILURE_LOG_INTERVAL_MS`], with how many failed since it last said.
    fn count_failure_while_held(&mut self, error: &dyn Display) {
        let Some(hold) = self.hold.as_mut() else { return };
        hold.failures += 1;
        let now = Instant::now();
        if now.duration_since(hold.logged_at) < Duration::from_millis(WRITE_FAILURE_LOG_INTERVAL_MS) {
            return;
        }
        let (failures, held_s) = (hold.failures - hold.failures_logged, hold.since.elapsed().as_secs());
        tracing::error!(group = %self.label, %error, failures, held_s, "the {}'s log still cannot be written", self.subject);
        hold.failures_logged = hold.failures;
        hold.logged_at = now;
    }

    /// On ticks: a probe write when one is due, while held; the hold ends when it works. Returns
    /// the notices to send: "held" to a leader not told yet (and again every failed probe, so
    /// the leader's note never runs out while the disk stays full), "writing again" once this
    /// node knows a leader after the hold ended (a node reopened knows none until its next
    /// heartbeat). `leader`, `term`: the node's, now.
    pub fn probe_while_held(&mut self, leader: Option<u64>, term: u64) -> Vec<Message> {
        let mut notices = Vec::new();
        if self.writing_again_untold {
            if let Some(leader) = leader {
                notices.extend(self.notice(leader, MessageType::MsgSnapStatus, term));
                self.writing_again_untold = false;
            }
        }
        let node_id = self.node_id;
        let Some(hold) = self.hold.as_mut() else { return notices };
        // A leader elected while this node was held learns it too (the node that was full may
        // have led itself, and told nobody).
        let other_leader = leader.filter(|leader| *leader != self.node_id);
        if other_leader.is_some() && other_leader != hold.told {
            hold.told = other_leader;
            notices.extend(other_leader.and_then(|to| notice(node_id, to, MessageType::MsgUnreachable, term)));
        }
        if Instant::now() < hold.next_probe {
            return notices;
        }
        match probe_write(&self.file_system, &self.probe_path) {
            Ok(()) => {
                let (held_ms, failures) = (hold.since.elapsed().as_millis() as u64, hold.failures);
                tracing::info!(group = %self.label, held_ms, failures, "the {}'s log can be written again; it catches up", self.subject);
                self.hold = None;
                self.writing_again_untold = true;
            }
            Err(error) => {
                hold.next_probe = Instant::now() + Duration::from_millis(WRITE_PROBE_INTERVAL_MS);
                self.count_failure_while_held(&error);
                notices.extend(leader.and_then(|to| self.notice(to, MessageType::MsgUnreachable, term)));
            }
        }
        notices
    }

    /// A held (`MsgUnreachable`) or writing-again (`MsgSnapStatus`) notice to `to`; none to
    /// this node itself.
    fn notice(&self, to: u64, kind: MessageType, term: u64) -> Option<Message> {
        notice(self.node_id, to, kind, term)
    }

    /// While held: a leader's offer of the leadership (`MsgTimeoutNow`) is refused (the answer,
    /// a held notice, is returned with it); its appends and snapshots are not taken (they could
    /// not be written: each try would cost a reopen, and the leader resends what it needs once
    /// told the node writes again). `None`: not refused.
    pub fn refuse_while_held(&self, message: &Message, term: u64) -> Option<Option<Message>> {
        self.hold.as_ref()?;
        match message.get_msg_type() {
            MessageType::MsgTimeoutNow => {
                tracing::info!(group = %self.label, "the {}'s leadership was offered to this node, whose log cannot be written: refused", self.subject);
                Some(self.notice(message.from, MessageType::MsgUnreachable, term))
            }
            MessageType::MsgAppend | MessageType::MsgSnapshot => Some(None),
            _ => None,
        }
    }

    /// A peer's held or writing-again notice, taken here at tick `tick` (never stepped: raft-rs
    /// refuses local message types from peers). `None`: `message` is not one.
    pub fn take_notice(&mut self, message: &Message, tick: u64) -> Option<Notice> {
        match message.get_msg_type() {
            MessageType::MsgUnreachable => {
                self.peers_held.insert(message.from, tick);
                Some(Notice::Held)
            }
            MessageType::MsgSnapStatus => {
                self.peers_held.remove(&message.from);
                Some(Notice::WritingAgain(message.from))
            }
            _ => None,
        }
    }

    /// Whether `peer` said, less than [`PEER_HELD_TICKS`] before `tick`, that it cannot write
    /// its log.
    pub fn peer_held(&self, peer: u64, tick: u64) -> bool {
        self.peers_held.get(&peer).is_some_and(|at| tick < at + PEER_HELD_TICKS)
    }
}

/// A held (`MsgUnreachable`) or writing-again (`MsgSnapStatus`) notice from `from` to `to`; none
/// to the node itself.
fn notice(from: u64, to: u64, kind: MessageType, term: u64) -> Option<Message> {
    if to == from {
        return None;
    }
    let mut message = Message::default();
    message.set_msg_type(kind);
    message.from = from;
    message.to = to;
    message.term = term;
    Some(message)
}

/// Writes and syncs [`WRITE_PROBE_BYTES`] at `path`, then removes the file.
fn probe_write(file_system: &SharedFileSystem, path: &Path) -> std::io::Result<()> {
    let written = file_system.open(path, OpenMode::CreateReadWrite).and_then(|file| {
        file.write_all_at(&vec![0; WRITE_PROBE_BYTES], 0)?;
        file.sync_data()
    });
    // Removed either way: the probe must not hold the space it asked about.
    let _ = file_system.remove_file(path);
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::memory_file_system::{FaultOperation, MemoryFileSystem};

    const NODE: u64 = 1;
    const LEADER: u64 = 2;

    fn guard_on(disk: &MemoryFileSystem) -> WriteGuard {
        let directory = Path::new("/data/group");
        disk.create_durable_directory(directory);
        WriteGuard::new("test group", "test".to_string(), NODE, directory, disk.shared())
    }

    fn message(kind: MessageType, from: u64) -> Message {
        let mut message = Message::default();
        message.set_msg_type(kind);
        message.from = from;
        message.to = NODE;
        message
    }

    fn kinds(notices: &[Message]) -> Vec<(MessageType, u64)> {
        notices.iter().map(|notice| (notice.get_msg_type(), notice.to)).collect()
    }

    #[test]
    fn a_held_member_refuses_appends_snapshots_and_the_leadership_and_takes_heartbeats() {
        let disk = MemoryFileSystem::new();
        let mut guard = guard_on(&disk);
        assert_eq!(guard.refuse_while_held(&message(MessageType::MsgAppend, LEADER), 1), None, "not held: refuses nothing");
        let error = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let told = guard.hold_after_failure(&error, Some(LEADER), 3).expect("the leader is told");
        assert_eq!((told.get_msg_type(), told.to, told.term), (MessageType::MsgUnreachable, LEADER, 3));
        assert!(guard.held());
        assert_eq!(guard.refuse_while_held(&message(MessageType::MsgAppend, LEADER), 3), Some(None));
        assert_eq!(guard.refuse_while_held(&message(MessageType::MsgSnapshot, LEADER), 3), Some(None));
        let answer = guard.refuse_while_held(&message(MessageType::MsgTimeoutNow, LEADER), 3).flatten().expect("an answer");
        assert_eq!((answer.get_msg_type(), answer.to), (MessageType::MsgUnreachable, LEADER));
        assert_eq!(guard.refuse_while_held(&message(MessageType::MsgHeartbeat, LEADER), 3), None);
    }

    #[test]
    fn a_held_member_probes_its_disk_and_tells_the_leader_when_it_writes_again() {
        let disk = MemoryFileSystem::new();
        let mut guard = guard_on(&disk);
        disk.fail(FaultOperation::Write, libc::ENOSPC, Path::new("/data/group"), u64::MAX);
        let error = std::io::Error::from_raw_os_error(libc::ENOSPC);
        guard.hold_after_failure(&error, None, 1);
        assert!(guard.probe_while_held(None, 1).is_empty(), "no probe due, no leader: nothing to say");
        // A leader learnt while held is told at once.
        assert_eq!(kinds(&guard.probe_while_held(Some(LEADER), 1)), [(MessageType::MsgUnreachable, LEADER)]);
        std::thread::sleep(Duration::from_millis(WRITE_PROBE_INTERVAL_MS + 50));
        // The probe fails: still held, and said again.
        assert_eq!(kinds(&guard.probe_while_held(Some(LEADER), 1)), [(MessageType::MsgUnreachable, LEADER)]);
        assert!(guard.held());
        disk.clear_faults();
        std::thread::sleep(Duration::from_millis(WRITE_PROBE_INTERVAL_MS + 50));
        // The probe works: the hold ends; the leader hears it at the next tick it is known.
        assert!(guard.probe_while_held(None, 1).is_empty());
        assert!(!guard.held());
        assert_eq!(kinds(&guard.probe_while_held(Some(LEADER), 1)), [(MessageType::MsgSnapStatus, LEADER)]);
        assert!(guard.probe_while_held(Some(LEADER), 1).is_empty(), "said once");
        assert!(disk.contents(&Path::new("/data/group").join(PROBE_FILE)).is_err(), "the probe file is removed");
    }

    #[test]
    fn a_peer_said_held_is_believed_until_it_writes_again_or_its_notice_runs_out() {
        let disk = MemoryFileSystem::new();
        let mut guard = guard_on(&disk);
        assert_eq!(guard.take_notice(&message(MessageType::MsgHeartbeat, LEADER), 5), None);
        assert_eq!(guard.take_notice(&message(MessageType::MsgUnreachable, LEADER), 5), Some(Notice::Held));
        assert!(guard.peer_held(LEADER, 5 + PEER_HELD_TICKS - 1));
        assert!(!guard.peer_held(LEADER, 5 + PEER_HELD_TICKS));
        assert_eq!(guard.take_notice(&message(MessageType::MsgSnapStatus, LEADER), 6), Some(Notice::WritingAgain(LEADER)));
        assert!(!guard.peer_held(LEADER, 6));
    }
}
