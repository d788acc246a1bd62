//! Storage under disk faults, through the in-memory file system: power cuts that lose every
//! unsynced write and directory change, a torn write, ENOSPC and EIO during group commits, a
//! bit flipped on read. Each test runs the real syncer, journal and queue logs the way the server
//! wires them (journal replay, then logs opened, watched and journaled by policy), keeps a ledger
//! of what the syncer confirmed, and checks after every restart that each confirmed, unsettled
//! message is recovered with its body, and that recovery never invents one.

use crate::file_cache::FileCache;
use crate::journal::{replay_in, Journal};
use crate::memory_file_system::{FaultOperation, MemoryFileSystem, PowerCut};
use crate::queue_log::{is_past_every_segment, QueueLog, Recovery};
use crate::syncer::{Confirm, ConfirmSink, SharedLog, SyncPolicy, Syncer};
use amqp_codec::{BasicProperties, ContentHeader, ShortStr};
use broker_core::Message;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DATA: &str = "/data";

fn queues_directory() -> PathBuf {
    Path::new(DATA).join("queues")
}

fn journal_directory() -> PathBuf {
    Path::new(DATA).join("journal")
}

/// A delivery tag naming a run of the node, a queue and a position, so one ledger serves every
/// queue across restarts (a restart reuses the positions of messages that were lost).
fn tag(run: u64, queue: usize, position: u64) -> u64 {
    (run << 48) | ((queue as u64) << 32) | position
}

fn queue_of(tag: u64) -> usize {
    ((tag >> 32) & 0xffff) as usize
}

fn position_of(tag: u64) -> u64 {
    tag & 0xffff_ffff
}

fn body(tag: u64) -> Bytes {
    Bytes::from(format!("message {tag:016x} {}", "x".repeat(60)))
}

fn message(tag: u64) -> Message {
    let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
    let body = body(tag);
    Message {
        exchange: ShortStr::from("x"),
        routing_key: ShortStr::from("k"),
        header: ContentHeader::from_properties(60, body.len() as u64, &properties),
        body,
        published_at_ns: 0,
        bcc_routing_keys: None,
    }
}

/// Every confirm the syncer sent: delivery tag to durable (ack) or not (nack).
#[derive(Default)]
struct Ledger(Mutex<BTreeMap<u64, bool>>);

impl ConfirmSink for Ledger {
    fn confirm_batch(&self, confirms: &[(u64, bool)]) {
        let mut ledger = self.0.lock();
        for (delivery_tag, durable) in confirms {
            assert!(ledger.insert(*delivery_tag, *durable).is_none(), "delivery tag {delivery_tag} confirmed twice");
        }
    }
}

impl Ledger {
    fn outcome(&self, delivery_tag: u64) -> Option<bool> {
        self.0.lock().get(&delivery_tag).copied()
    }

    fn acked(&self) -> Vec<u64> {
        self.0.lock().iter().filter(|(_, durable)| **durable).map(|(tag, _)| *tag).collect()
    }

    fn count(&self) -> usize {
        self.0.lock().len()
    }
}

/// Storage as one run of the broker opens it, on one view of the file system.
struct Node {
    /// Which start of the node this is.
    run: u64,
    syncer: Syncer,
    logs: Vec<SharedLog>,
    /// Each queue's next position.
    next: Vec<u64>,
    /// What each queue recovered at start: (position, body).
    recovered: Vec<Vec<(u64, Bytes)>>,
    recoveries: Vec<Recovery>,
}

struct Setup {
    policy: SyncPolicy,
    queues: usize,
    segment_bytes: u64,
    /// A small journal size makes background checkpoints run during the test.
    checkpoint_bytes: Option<u64>,
}

fn start(file_system: &MemoryFileSystem, setup: &Setup, run: u64) -> Node {
    let shared = file_system.shared();
    let journal = (setup.policy == SyncPolicy::Always).then(|| {
        let (mut journal, entries) = Journal::open_in(shared.clone(), &journal_directory()).expect("open the journal");
        replay_in(shared.clone(), &queues_directory(), &entries, is_past_every_segment).expect("replay the journal");
        journal.start_new_file().expect("retire the replayed journal");
        if let Some(bytes) = setup.checkpoint_bytes {
            journal.set_checkpoint_bytes(bytes);
        }
        journal
    });
    let journaled = journal.is_some();
    let syncer = Syncer::start(setup.policy, journal);
    let cache = FileCache::with_file_system(16, shared);
    let mut node = Node { run, syncer, logs: Vec::new(), next: Vec::new(), recovered: Vec::new(), recoveries: Vec::new() };
    for queue in 0..setup.queues {
        let directory = queues_directory().join(format!("q{queue}"));
        let (mut log, recovery) = QueueLog::open_with_cache(&directory, setup.segment_bytes, cache.clone()).expect("recovery never fails");
        if journaled {
            log.use_journal();
        }
        let mut cursor = log.recovered_tail(&recovery);
        let recovered = log.read_tail(&mut cursor, usize::MAX, usize::MAX).expect("read the recovered messages");
        node.recovered.push(recovered.into_iter().map(|(position, message)| (position, message.body)).collect());
        node.next.push(recovery.next_position);
        node.recoveries.push(recovery);
        let log: SharedLog = Arc::new(Mutex::new(log));
        node.syncer.watch(log.clone());
        node.logs.push(log);
    }
    node
}

/// A fresh data directory that exists durably, as one made before the broker first started.
fn fresh_file_system() -> MemoryFileSystem {
    let file_system = MemoryFileSystem::new();
    file_system.create_durable_directory(&queues_directory());
    file_system
}

impl Node {
    /// Publishes the next message of `queue` and asks for its confirm, as a channel does.
    fn publish(&mut self, queue: usize, ledger: &Arc<Ledger>) -> u64 {
        let position = self.next[queue];
        self.next[queue] += 1;
        let delivery_tag = tag(self.run, queue, position);
        self.logs[queue].lock().append_publish(position, &message(delivery_tag), true, None);
        let sink: Arc<dyn ConfirmSink> = ledger.clone();
        self.syncer.confirm(vec![self.logs[queue].clone()], vec![Confirm { sink, delivery_tag, accepted: true }]);
        delivery_tag
    }

    /// Appends the next message of `queue` without asking for a confirm (it waits in memory).
    fn append_unconfirmed(&mut self, queue: usize) -> u64 {
        let position = self.next[queue];
        self.next[queue] += 1;
        self.logs[queue].lock().append_publish(position, &message(tag(self.run, queue, position)), true, None);
        position
    }

    /// The tags recovered at start (from their bodies), each checked against its queue and position.
    fn recovered_tags(&self) -> Vec<u64> {
        let mut tags = Vec::new();
        for (queue, recovered) in self.recovered.iter().enumerate() {
            for (position, recovered_body) in recovered {
                let text = std::str::from_utf8(&recovered_body[8..24]).expect("a published body");
                let delivery_tag = u64::from_str_radix(text, 16).expect("a published body");
                assert_eq!(*recovered_body, body(delivery_tag), "queue {queue} position {position} came back with another body");
                assert_eq!((queue_of(delivery_tag), position_of(delivery_tag)), (queue, *position), "a body at the wrong place");
                tags.push(delivery_tag);
            }
        }
        tags.sort_unstable();
        tags
    }
}

/// Waits (bounded) until `condition` holds.
fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Cuts the power under a running node (its threads may be writing) and returns the restarted
/// machine's file system.
fn cut(file_system: &MemoryFileSystem, node: Node, power_cut: PowerCut) -> MemoryFileSystem {
    let restarted = file_system.power_cut(power_cut);
    drop(node);
    // Jobs the dead node queued fail on its powered-off view; let them finish first.
    crate::janitor::wait_idle();
    restarted
}

/// Every acked message that was not settled is among the recovered ones, and every recovered
/// one was published (bodies are checked by [`Node::recovered_tags`]).
fn assert_acked_recovered(node: &Node, ledger: &Ledger, settled: &[u64], published: &[u64]) {
    let recovered = node.recovered_tags();
    let missing: Vec<u64> =
        ledger.acked().into_iter().filter(|tag| !settled.contains(tag) && recovered.binary_search(tag).is_err()).collect();
    assert!(missing.is_empty(), "{} confirmed messages lost, e.g. {:x?}", missing.len(), &missing[..missing.len().min(5)]);
    let invented: Vec<&u64> = recovered.iter().filter(|tag| !published.contains(tag)).collect();
    assert!(invented.is_empty(), "recovered messages never published: {invented:x?}");
}

/// `--sync always`: three power cuts, each while confirms are in flight, with segments rolling,
/// settled segments recycled and background checkpoints running. Every confirmed message comes
/// back; nothing that was not published does.
#[test]
fn power_cuts_under_confirmed_load_lose_no_confirmed_message() {
    let mut setup = Setup { policy: SyncPolicy::Always, queues: 2, segment_bytes: 2048, checkpoint_bytes: None };
    let mut file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let (mut published, mut settled) = (Vec::new(), Vec::new());
    for round in 0..3 {
        // Odd rounds checkpoint in the background all the time; even rounds never do, so what
        // they confirmed lives in the journal alone when the power goes.
        setup.checkpoint_bytes = (round % 2 == 1).then_some(8192);
        let mut node = start(&file_system, &setup, round);
        assert_acked_recovered(&node, &ledger, &settled, &published);
        assert!(node.recoveries.iter().all(|recovery| recovery.truncated.is_empty()), "a power cut is not damage");
        let before = ledger.count();
        for index in 0..300usize {
            let queue = index % setup.queues;
            published.push(node.publish(queue, &ledger));
            if index % 3 == 0 {
                // Settle an older confirmed message: its segment can be recycled.
                let current_run = |tag: &u64| tag >> 48 == round;
                if let Some(&old) =
                    ledger.acked().iter().find(|tag| current_run(tag) && !settled.contains(*tag) && queue_of(**tag) == queue)
                {
                    node.logs[queue].lock().append_settled(position_of(old));
                    settled.push(old);
                }
            }
        }
        wait_until("a hundred confirms of this round", || ledger.count() >= before + 100);
        // These are in flight when the power goes.
        for index in 0..100usize {
            published.push(node.publish(index % setup.queues, &ledger));
        }
        file_system = cut(&file_system, node, PowerCut::LoseUnsynced);
        assert!(ledger.acked().len() as u64 > 100 * (round + 1), "too few confirms to mean anything");
    }
    let node = start(&file_system, &setup, 3);
    assert_acked_recovered(&node, &ledger, &settled, &published);
}

/// `--sync interval` (issue 15): a batch that writes without fdatasyncing must leave the sealed
/// segments and new directory entries to the next fdatasync, not drop them; the same for the
/// first segment after a restart. Everything written before an interval's fdatasync survives a
/// power cut after it.
#[test]
fn an_interval_fdatasync_covers_segments_sealed_and_created_since_the_last_one() {
    let setup = Setup { policy: SyncPolicy::Interval { interval_ms: 150 }, queues: 1, segment_bytes: 512, checkpoint_bytes: None };
    let mut file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let mut published = Vec::new();
    for round in 0..2 {
        let mut node = start(&file_system, &setup, round);
        assert_acked_recovered(&node, &ledger, &[], &published);
        assert_eq!(node.recovered_tags(), published, "round {round}: everything written before the last fdatasync");
        let segments = node.logs[0].lock().segment_count();
        for _ in 0..30 {
            published.push(node.publish(0, &ledger));
        }
        wait_until("every publish confirmed (written)", || ledger.count() == published.len());
        assert!(node.logs[0].lock().segment_count() > segments + 3, "segments rolled between fdatasyncs");
        // The batch that asks for this sync runs after the interval's fdatasync has finished.
        // The syncer's own count: the janitor's spare preparation syncs too.
        let stats = node.syncer.stats();
        let fsyncs = stats.fsyncs.load(std::sync::atomic::Ordering::Relaxed);
        wait_until("the interval's fdatasync", || stats.fsyncs.load(std::sync::atomic::Ordering::Relaxed) > fsyncs);
        let (done, synced) = std::sync::mpsc::channel();
        node.syncer.sync(vec![node.logs[0].clone()], Some(Box::new(move |durable| done.send(durable).expect("send"))));
        assert!(synced.recv_timeout(Duration::from_secs(20)).expect("the sync request is answered"));
        file_system = cut(&file_system, node, PowerCut::LoseUnsynced);
    }
    let node = start(&file_system, &setup, 2);
    assert_eq!(node.recovered_tags(), published);
}

/// A journal write torn by the power cut (only a prefix reached the disk) after its fdatasync
/// failed: the batch was nacked, the torn entry is ignored at replay, every confirmed message
/// before it comes back.
#[test]
fn a_torn_journal_write_loses_only_its_unconfirmed_batch() {
    let setup = Setup { policy: SyncPolicy::Always, queues: 1, segment_bytes: 4096, checkpoint_bytes: None };
    let file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let mut node = start(&file_system, &setup, 0);
    let mut published: Vec<u64> = (0..20).map(|_| node.publish(0, &ledger)).collect();
    wait_until("20 confirms", || ledger.count() == 20);
    file_system.fail(FaultOperation::Sync, libc::EIO, &journal_directory(), u64::MAX);
    let torn = node.publish(0, &ledger);
    published.push(torn);
    wait_until("the failed batch's confirm", || ledger.outcome(torn).is_some());
    assert_eq!(ledger.outcome(torn), Some(false), "a batch whose journal sync failed was acked");
    let file_system = cut(&file_system, node, PowerCut::TearLastWrite { bytes_kept: 11 });
    let node = start(&file_system, &setup, 1);
    assert_acked_recovered(&node, &ledger, &[], &published);
    assert!(node.recoveries[0].truncated.is_empty(), "{:?}", node.recoveries[0].truncated);
}

/// ENOSPC and EIO in group commits: on the journal's write and sync (the whole batch nacked) and
/// on one queue's segment write (only that queue's confirms nacked). Nothing panics, the store
/// works again once the fault clears, and a power cut after it loses nothing confirmed.
#[test]
fn enospc_and_eio_in_group_commits_nack_what_they_hit_and_the_store_recovers() {
    let setup = Setup { policy: SyncPolicy::Always, queues: 2, segment_bytes: 1024, checkpoint_bytes: Some(1) };
    let file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let mut node = start(&file_system, &setup, 0);
    let mut published = Vec::new();
    let publish_both = |node: &mut Node, published: &mut Vec<u64>| -> [u64; 2] {
        let tags = [node.publish(0, &ledger), node.publish(1, &ledger)];
        published.extend(tags);
        wait_until("both confirms", || tags.iter().all(|tag| ledger.outcome(*tag).is_some()));
        [ledger.outcome(tags[0]) == Some(true), ledger.outcome(tags[1]) == Some(true)].map(u64::from)
    };
    for _ in 0..10 {
        assert_eq!(publish_both(&mut node, &mut published), [1, 1], "a working disk acks");
    }
    let faults = [
        (FaultOperation::Write, libc::ENOSPC, journal_directory(), [0, 0]),
        (FaultOperation::Sync, libc::EIO, journal_directory(), [0, 0]),
        (FaultOperation::Write, libc::ENOSPC, queues_directory().join("q0"), [0, 1]),
        (FaultOperation::Write, libc::EIO, queues_directory().join("q1"), [1, 0]),
    ];
    for (operation, errno, under, expected) in faults {
        file_system.fail(operation, errno, &under, u64::MAX);
        assert_eq!(publish_both(&mut node, &mut published), expected, "{operation:?} errno {errno} under {}", under.display());
        file_system.clear_faults();
        for _ in 0..5 {
            assert_eq!(publish_both(&mut node, &mut published), [1, 1], "the store works again after {operation:?} errno {errno}");
        }
    }
    let file_system = cut(&file_system, node, PowerCut::LoseUnsynced);
    let node = start(&file_system, &setup, 1);
    assert_acked_recovered(&node, &ledger, &[], &published);
}

/// A bit flipped on read in the middle of a segment: recovery detects it by checksum, reports the
/// segment and the offset of the damaged record, and recovers the records before and after it.
#[test]
fn a_flipped_bit_is_reported_with_file_and_offset() {
    let setup = Setup { policy: SyncPolicy::Always, queues: 1, segment_bytes: 1 << 20, checkpoint_bytes: None };
    let file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let mut node = start(&file_system, &setup, 0);
    let mut locations = Vec::new();
    for _ in 0..10 {
        locations.push(node.logs[0].lock().end_location());
        node.publish(0, &ledger);
    }
    wait_until("10 confirms", || ledger.count() == 10);
    assert!(node.syncer.checkpoint(node.logs.clone()), "a clean stop");
    let file_system = cut(&file_system, node, PowerCut::LoseUnsynced);
    let damaged = locations[6];
    let segment = queues_directory().join("q0").join(format!("{:020}.seg", damaged.segment));
    file_system.flip_bit_on_read(&segment, damaged.offset + 30, 3).expect("flip");
    let node = start(&file_system, &setup, 1);
    assert!(node.recoveries[0].truncated.is_empty(), "{:?}", node.recoveries[0].truncated);
    let quarantined: Vec<_> = node.recoveries[0].quarantined.iter().map(|bad| (bad.path.clone(), bad.offsets.clone())).collect();
    assert_eq!(quarantined, vec![(segment, damaged.offset..locations[7].offset)]);
    let intact: Vec<_> = (0..10).filter(|position| *position != 6).map(|position| tag(0, 0, position)).collect();
    assert_eq!(node.recovered_tags(), intact);
}

/// The clean-shutdown marker is removed durably at start (issue 15): a power cut must not bring
/// it back, or the next start takes a crash for a clean shutdown.
#[test]
fn the_clean_shutdown_marker_stays_removed_after_a_power_cut() {
    let file_system = fresh_file_system();
    let data = Path::new(DATA);
    crate::write_clean_shutdown_marker(&file_system, data).expect("write the marker");
    let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
    assert!(crate::take_clean_shutdown_marker(&file_system, data).expect("take"), "the marker was written durably");
    let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
    assert!(!crate::take_clean_shutdown_marker(&file_system, data).expect("take"), "the removed marker came back after a power cut");
}

/// A power cut right after a segment roll, once the new segment's name was synced but before
/// the journal fdatasync holding the old segment's seal (issue 15): recovery says what was lost
/// (the unconfirmed publishes of that write, by position) instead of reporting damage, and
/// every confirmed message comes back.
#[test]
fn a_cut_right_after_a_roll_reports_the_unconfirmed_publishes_it_lost_not_damage() {
    let setup = Setup { policy: SyncPolicy::Always, queues: 1, segment_bytes: 1024, checkpoint_bytes: None };
    let file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let mut node = start(&file_system, &setup, 0);
    let mut published = vec![node.publish(0, &ledger)];
    wait_until("the first confirm", || ledger.count() == 1);
    let record_bytes = {
        let before = node.logs[0].lock().end_location().offset;
        published.push(node.publish(0, &ledger));
        wait_until("the second confirm", || ledger.count() == 2);
        node.logs[0].lock().end_location().offset - before
    };
    // Fill the segment with confirmed messages until two more fit and a third rolls it.
    while node.logs[0].lock().end_location().offset + 2 * record_bytes < setup.segment_bytes {
        published.push(node.publish(0, &ledger));
        let count = published.len();
        wait_until("a confirm", || ledger.count() == count);
    }
    file_system.fail(FaultOperation::Sync, libc::EIO, &journal_directory(), u64::MAX);
    let unconfirmed = [node.append_unconfirmed(0), node.append_unconfirmed(0)];
    let first_position_of_next_segment = node.next[0];
    let rolling = node.publish(0, &ledger);
    assert_eq!(node.logs[0].lock().segment_count(), 2, "the third publish rolled the segment");
    wait_until("the failed batch's confirm", || ledger.outcome(rolling).is_some());
    assert_eq!(ledger.outcome(rolling), Some(false));
    let file_system = cut(&file_system, node, PowerCut::LoseUnsynced);
    let node = start(&file_system, &setup, 1);
    let recovery = &node.recoveries[0];
    assert!(recovery.truncated.is_empty(), "a lost seal reported as damage: {:?}", recovery.truncated);
    assert_eq!(recovery.unsealed.len(), 1, "{:?}", recovery.unsealed);
    assert_eq!(recovery.unsealed[0].lost_positions, unconfirmed[0]..first_position_of_next_segment);
    assert_acked_recovered(&node, &ledger, &[], &published);
}

/// A journal write that fails while a checkpoint is due and another one runs: when that one ends,
/// the next must wait for the failed batch's entries to be written. Rotating the journal under
/// them broke its invariant and killed the syncer thread, which nacked every later confirm.
#[test]
fn a_failed_journal_write_while_a_checkpoint_runs_leaves_the_syncer_running() {
    let setup = Setup { policy: SyncPolicy::Always, queues: 1, segment_bytes: 4096, checkpoint_bytes: Some(1) };
    let file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let mut node = start(&file_system, &setup, 0);
    // The checkpoint after the first batch stops at its segment sync.
    file_system.hold_syncs(&queues_directory());
    let first = node.publish(0, &ledger);
    wait_until("the first confirm", || ledger.outcome(first) == Some(true));
    wait_until("the checkpoint to wait at its segment sync", || file_system.held_syncs() == 1);
    // Written while the checkpoint runs: the new journal file is past its size.
    let second = node.publish(0, &ledger);
    wait_until("the second confirm", || ledger.outcome(second) == Some(true));
    file_system.fail(FaultOperation::Write, libc::ENOSPC, &journal_directory(), u64::MAX);
    let failed = node.publish(0, &ledger);
    wait_until("the failed batch's confirm", || ledger.outcome(failed).is_some());
    assert_eq!(ledger.outcome(failed), Some(false));
    // The checkpoint ends, with the failed batch's entries still pending in the journal: it
    // retires journal file 2, then wakes the syncer to look for the next one.
    let wakeups = || node.syncer.stats().wakeups.load(std::sync::atomic::Ordering::Relaxed);
    let journal_files = || {
        let names = crate::file_system::FileSystem::list_directory(&file_system, &journal_directory()).expect("list");
        names.into_iter().filter(|name| name.ends_with(".wal")).collect::<Vec<_>>()
    };
    file_system.release_syncs();
    wait_until("the checkpoint to retire journal file 2", || journal_files() == [format!("{:020}.wal", 3)]);
    let woken = wakeups();
    wait_until("the syncer to hear the checkpoint ended", || wakeups() > woken);
    file_system.clear_faults();
    let after = node.publish(0, &ledger);
    wait_until("the confirm after the fault", || ledger.outcome(after).is_some());
    assert_eq!(ledger.outcome(after), Some(true), "the syncer stopped working after a failed journal write");
}

/// A segment retired (every message in it settled, the file renamed to a spare) after its last
/// fdatasync, then a checkpoint, then a power cut (found by the simulator, issue 15): the
/// checkpoint must make the rename durable before it deletes the journal files holding the
/// segment's last writes. It skipped the missing file, the cut undid the rename, and the
/// segment came back as of its last fdatasync, without the settle record written into it
/// afterwards: an acked message was delivered again.
#[test]
fn a_segment_retired_before_a_checkpoint_does_not_come_back_after_a_power_cut() {
    let setup = Setup { policy: SyncPolicy::Always, queues: 1, segment_bytes: 1024, checkpoint_bytes: None };
    let file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let mut node = start(&file_system, &setup, 0);
    let first = node.publish(0, &ledger);
    wait_until("the first confirm", || ledger.count() == 1);
    assert!(node.syncer.checkpoint(node.logs.clone()), "segment 0 synced with its first message");
    // The first message's settle record goes into segment 0 after that fdatasync; the others
    // stay unsettled until the log has rolled.
    node.logs[0].lock().append_settled(position_of(first));
    let mut published = vec![first];
    while node.logs[0].lock().segment_count() == 1 {
        published.push(node.publish(0, &ledger));
        let count = published.len();
        wait_until("a confirm", || ledger.count() == count);
    }
    // Settling the rest (records in segment 1) retires segment 0: a rename, not synced yet.
    let in_segment_0 = &published[1..published.len() - 1];
    for tag in in_segment_0 {
        node.logs[0].lock().append_settled(position_of(*tag));
    }
    assert_eq!(node.logs[0].lock().recycled_segment_count(), 1, "segment 0 was retired");
    let settled: Vec<u64> = published[..published.len() - 1].to_vec();
    assert!(node.syncer.checkpoint(node.logs.clone()), "a checkpoint after the retirement");
    let file_system = cut(&file_system, node, PowerCut::LoseUnsynced);
    let node = start(&file_system, &setup, 1);
    assert_acked_recovered(&node, &ledger, &settled, &published);
    let resurrected: Vec<u64> = node.recovered_tags().into_iter().filter(|tag| settled.contains(tag)).collect();
    assert!(resurrected.is_empty(), "settled messages came back after a checkpoint: {resurrected:x?}");
}

/// Two segments retired after a checkpoint (renames not durable yet), the newer one's file
/// reused at once for a new segment, and a power cut that keeps part of the first write into
/// it while the directory sync never happened (found by the simulator, issue 15): the cut gives
/// both files their old names back, and the reused one had lost its records to the write, the
/// settle records of the older segment's messages among them, which came back. The directory is
/// now synced before the first write into a reused file.
#[test]
fn a_reused_spare_is_not_written_before_its_retirement_is_durable() {
    let setup = Setup { policy: SyncPolicy::Always, queues: 1, segment_bytes: 1024, checkpoint_bytes: None };
    let file_system = fresh_file_system();
    let ledger = Arc::new(Ledger::default());
    let mut node = start(&file_system, &setup, 0);
    let mut published = Vec::new();
    let publish_until_segments = |node: &mut Node, published: &mut Vec<u64>, segments: usize| {
        while node.logs[0].lock().segment_count() < segments {
            published.push(node.publish(0, &ledger));
            let count = published.len();
            wait_until("a confirm", || ledger.count() == count);
        }
    };
    publish_until_segments(&mut node, &mut published, 2);
    let in_segment_0 = published[..published.len() - 1].to_vec();
    // Segment 0's messages but one are settled by records in segment 1.
    let durably_settled: Vec<u64> = in_segment_0[1..].to_vec();
    for tag in &durably_settled {
        node.logs[0].lock().append_settled(position_of(*tag));
    }
    let first_in_segment_1 = published.len() - 1;
    publish_until_segments(&mut node, &mut published, 3);
    assert!(node.syncer.checkpoint(node.logs.clone()), "segments 0 to 2 synced");
    // Settling the rest retires segments 0 and 1: renames, not synced. These settles are never
    // synced (the journal fails below): those messages may come back, as at-least-once allows.
    let mut rest = vec![in_segment_0[0]];
    rest.extend_from_slice(&published[first_in_segment_1..published.len() - 1]);
    for tag in &rest {
        node.logs[0].lock().append_settled(position_of(*tag));
    }
    let mut settled = durably_settled.clone();
    settled.extend(rest);
    assert_eq!(node.logs[0].lock().recycled_segment_count(), 2, "segments 0 and 1 retired as spares");
    // The next segment reuses segment 1's file; its directory sync and the journal never succeed.
    file_system.fail(FaultOperation::Sync, libc::EIO, &queues_directory().join("q0"), u64::MAX);
    file_system.fail(FaultOperation::Write, libc::EIO, &journal_directory(), u64::MAX);
    while node.logs[0].lock().segment_count() < 2 {
        published.push(node.publish(0, &ledger));
    }
    let last = *published.last().expect("published");
    wait_until("the failed batch's confirm", || ledger.outcome(last).is_some());
    let file_system = cut(&file_system, node, PowerCut::TearLastWrite { bytes_kept: 60 });
    let node = start(&file_system, &setup, 1);
    assert_acked_recovered(&node, &ledger, &settled, &published);
    let resurrected: Vec<u64> = node.recovered_tags().into_iter().filter(|tag| durably_settled.contains(tag)).collect();
    assert!(resurrected.is_empty(), "messages whose settle was synced came back: {resurrected:x?}");
}

/// A deleted queue's log is gone for good once `QueueLog::delete` returns (before delete-ok):
/// a power cut right after it does not bring the log back under the queue's name, where a queue
/// declared anew would recover the deleted one's messages (the simulator's seeds 176 and 196).
#[test]
fn a_deleted_log_stays_deleted_after_a_power_cut() {
    let file_system = fresh_file_system();
    let setup = Setup { policy: SyncPolicy::Always, queues: 1, segment_bytes: 4096, checkpoint_bytes: None };
    let mut node = start(&file_system, &setup, 0);
    let ledger = Arc::new(Ledger::default());
    node.publish(0, &ledger);
    wait_until("the confirm", || !ledger.0.lock().is_empty());
    node.logs[0].lock().delete().expect("the deletion succeeds");
    drop(node);
    let restarted = file_system.power_cut(PowerCut::LoseUnsynced);
    let names = restarted.shared().list_directory(&queues_directory()).expect("list the queues");
    assert!(!names.contains(&"q0".to_string()), "the deleted log came back under its name: {names:?}");
}

/// A start removes the logs no definition names, durably: after a power cut the name is still
/// free (the simulator's seeds 173 and 251), and a log a definition names stays.
#[test]
fn orphaned_logs_are_removed_at_start_and_stay_removed_after_a_power_cut() {
    let file_system = fresh_file_system();
    let shared = file_system.shared();
    for name in ["defined", "orphan"] {
        shared.create_dir_all(&queues_directory().join(name)).expect("make a log directory");
    }
    shared.sync_directory(&queues_directory()).expect("sync the queues directory");
    let removed = crate::queue_log::remove_orphaned_logs_in(shared, &queues_directory(), |name| name == "defined").expect("removal");
    assert_eq!(removed.len(), 1, "one orphan: {removed:?}");
    let restarted = file_system.power_cut(PowerCut::LoseUnsynced);
    let names = restarted.shared().list_directory(&queues_directory()).expect("list the queues");
    assert!(names.contains(&"defined".to_string()), "a defined queue's log was removed: {names:?}");
    assert!(!names.contains(&"orphan".to_string()), "the orphaned log came back under its name: {names:?}");
}
