//! Named failures of a three-node group, each staged step by step on the seeded cluster:
//! the leader's crash, a follower catching up by snapshot, and a node whose log was damaged on
//! disk, which must neither vote nor campaign until a leader has repaired it.

mod support;

use replication::command::QueueCommand;
use replication::node::Damage;
use storage::memory_file_system::PowerCut;
use support::{Cluster, CONSUMER, QUEUE};

/// A declaration without a name or limits.
fn declaration() -> QueueCommand {
    QueueCommand::Declare { name: bytes::Bytes::new(), incarnation: 0, limits: queue_core::Limits::NONE, single_active_consumer: false }
}

fn run(cluster: &mut Cluster, ticks: u64) {
    for _ in 0..ticks {
        cluster.step();
    }
}

fn elect(cluster: &mut Cluster) -> u64 {
    for _ in 0..300 {
        cluster.step();
        if let Some(leader) = cluster.leader() {
            return leader;
        }
    }
    panic!("seed {}: no leader", cluster.seed);
}

fn declare(cluster: &mut Cluster, with_consumer: bool) {
    elect(cluster);
    let mut commands = vec![(QUEUE, declaration())];
    if with_consumer {
        commands.push((QUEUE, QueueCommand::AddConsumer { consumer: CONSUMER, priority: 0, prefetch: 4 }));
    }
    assert!(cluster.propose(commands));
    run(cluster, 10);
}

fn assert_checks_pass(cluster: &mut Cluster) {
    cluster.settle_down(3_000);
    let failures = cluster.check();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The leader loses its power with confirmed messages behind it (in even seeds, with the one follower
/// that had them, the third being cut off): a new leader is elected among the two others, holds every confirmed message, and the old
/// leader catches up when it returns.
#[test]
fn a_new_leader_holds_every_confirmed_message_after_the_leader_crashes() {
    for seed in 1..=20 {
        let mut cluster = Cluster::new(seed, 1_000);
        declare(&mut cluster, true);
        let first_leader = cluster.leader().expect("a leader");
        let mut followers = (1..=3).filter(|id| *id != first_leader);
        let (partner, cut_off) = (followers.next().expect("two followers"), followers.next().expect("two followers"));
        let correlated = seed % 2 == 0;
        if correlated {
            // Only the leader and one follower get the messages: they alone hold the majority.
            cluster.isolate(cut_off, true);
        }
        for _ in 0..30 {
            cluster.publish(2);
            cluster.settle_some(1);
            run(&mut cluster, 1);
        }
        run(&mut cluster, 5);
        let old_leader = cluster.leader().expect("a leader");
        let confirmed_before = cluster.confirmed.len();
        assert!(confirmed_before >= 40, "seed {seed}: only {confirmed_before} confirmed");
        cluster.crash(old_leader, PowerCut::LoseUnsynced);
        if correlated {
            // Both holders lose their power at once (one rack): what they fdatasynced survives.
            assert_eq!(old_leader, first_leader, "seed {seed}");
            cluster.crash(partner, PowerCut::LoseUnsynced);
            run(&mut cluster, 5);
            cluster.start(partner);
            cluster.isolate(cut_off, false);
        }
        let new_leader = elect(&mut cluster);
        assert_ne!(new_leader, old_leader, "seed {seed}");
        // A leader knows what is committed once an entry of its own term is (its first empty one).
        run(&mut cluster, 20);
        let new_leader = cluster.leader().expect("a leader");
        let published_on_new_leader =
            cluster.node(new_leader).and_then(|node| node.machine().queue(QUEUE)).map(|core| core.stats().published).unwrap_or(0);
        let confirmed_enqueues =
            cluster.confirmed.iter().filter(|sequence| matches!(cluster.proposed.get(sequence), Some(support::Kind::Enqueue(_)))).count()
                as u64;
        assert!(
            published_on_new_leader >= confirmed_enqueues,
            "seed {seed}: the new leader applied {published_on_new_leader} of {confirmed_enqueues} confirmed enqueues"
        );
        for _ in 0..10 {
            cluster.publish(1);
            run(&mut cluster, 2);
        }
        cluster.start(old_leader);
        assert_checks_pass(&mut cluster);
    }
}

/// A follower down while the others commit and compact their logs comes back behind the first
/// log index: it is sent a snapshot, installs it, and continues from the log.
#[test]
fn a_follower_behind_the_compacted_log_catches_up_by_snapshot() {
    let mut cluster = Cluster::new(7, 10);
    declare(&mut cluster, true);
    let leader = cluster.leader().expect("a leader");
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster.crash(follower, PowerCut::LoseUnsynced);
    for _ in 0..60 {
        cluster.publish(3);
        cluster.settle_some(2);
        run(&mut cluster, 1);
    }
    run(&mut cluster, 10);
    let first_index = cluster.node(leader).expect("up").store().snapshot_ref().get_metadata().index;
    assert!(first_index > 20, "the leader compacted its log (snapshot at {first_index})");
    cluster.start(follower);
    run(&mut cluster, 100);
    assert!(cluster.coverage.snapshots_delivered >= 1, "the follower was sent a snapshot");
    let restored = cluster.node(follower).expect("up");
    assert!(restored.machine().applied_index() >= first_index, "the follower applied the snapshot");
    assert_checks_pass(&mut cluster);
}

/// A follower down for fewer entries than the snapshot interval, each time while the leader
/// passes a compaction point, catches up from the log: the leader keeps an interval of entries
/// past its snapshot. Compacting up to the applied index sent it the whole machine every time.
#[test]
fn a_follower_briefly_behind_a_compaction_catches_up_from_the_log() {
    let mut cluster = Cluster::new(11, 10);
    declare(&mut cluster, true);
    let leader = cluster.leader().expect("a leader");
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let applied = |cluster: &Cluster| cluster.node(leader).expect("up").machine().applied_index();
    for _ in 0..6 {
        run(&mut cluster, 20);
        cluster.crash(follower, PowerCut::LoseUnsynced);
        let down_at = applied(&cluster);
        while applied(&cluster) < down_at + 8 {
            cluster.publish(1);
            run(&mut cluster, 1);
        }
        cluster.start(follower);
    }
    run(&mut cluster, 50);
    let first_index = cluster.node(leader).expect("up").store().snapshot_ref().get_metadata().index;
    assert!(first_index > 0, "the leader compacted its log");
    assert_eq!(cluster.coverage.snapshots_delivered, 0, "no snapshot was sent");
    assert_checks_pass(&mut cluster);
}

/// A follower acknowledged entries that a second node never got, then its log was damaged on
/// disk (a bit flipped in a synced record). With the leader down, the damaged node and the node
/// that missed the entries could elect a leader without them and lose confirmed messages (the
/// Jepsen NATS JetStream 2025 failure). The damaged node refuses to vote, so no leader is elected
/// until the old one returns; it then repairs the damaged node and nothing is lost.
#[test]
fn a_node_with_a_damaged_log_does_not_vote_until_repaired() {
    let mut cluster = Cluster::new(11, 1_000);
    declare(&mut cluster, false);
    let leader = cluster.leader().expect("a leader");
    let mut others = (1..=3).filter(|id| *id != leader);
    let (damaged, missed) = (others.next().expect("two followers"), others.next().expect("two followers"));
    cluster.isolate(missed, true);
    for _ in 0..20 {
        cluster.publish(2);
        run(&mut cluster, 1);
    }
    run(&mut cluster, 10);
    assert!(cluster.confirmed.len() >= 40, "the leader and the damaged-to-be follower committed");
    // Both lose their power; the follower's disk returns a flipped bit in its first record.
    cluster.crash(leader, PowerCut::LoseUnsynced);
    cluster.crash(damaged, PowerCut::LoseUnsynced);
    let log_path = support::directory().join("log");
    cluster.file_systems[damaged as usize - 1].flip_bit_on_read(&log_path, 12, 3).expect("the log exists");
    let recovery = cluster.start(damaged);
    assert!(recovery.damaged, "recovery reports the damaged record: {recovery:?}");
    assert_eq!(cluster.node(damaged).expect("up").damage(), Damage::AwaitingLeader);
    cluster.isolate(missed, false);
    run(&mut cluster, 300);
    assert_eq!(cluster.leader(), None, "a leader was elected without the entries only the damaged node and the old leader held");
    cluster.start(leader);
    let new_leader = elect(&mut cluster);
    run(&mut cluster, 100);
    assert_eq!(cluster.node(damaged).expect("up").damage(), Damage::None, "the leader ({new_leader}) repaired the damaged log");
    assert_checks_pass(&mut cluster);
}

/// A group of one (a node started without cluster settings): it elects itself, a batch is
/// committed once its own fdatasync returned, and what was committed survives a power cut.
#[test]
fn a_group_of_one_commits_on_its_own_fsync() {
    use replication::command::{Batch, ProposedCommand};
    use replication::node::{NodeConfig, ReplicaNode};
    use replication::state_machine::Outcome;
    use storage::memory_file_system::MemoryFileSystem;
    let config = NodeConfig {
        id: 1,
        voters: vec![1],
        election_tick: 10,
        heartbeat_tick: 2,
        snapshot_entries_interval: 8,
        election_seed: 5,
        checksum_seed: 1,
    };
    let file_system = MemoryFileSystem::new();
    file_system.create_durable_directory(std::path::Path::new("/data/raft"));
    let (mut node, _) = ReplicaNode::open(config.clone(), file_system.shared(), &support::directory()).expect("opens");
    for _ in 0..30 {
        node.tick();
        node.process_ready().expect("persists");
    }
    assert!(node.is_leader(), "a group of one elects itself");
    let mut committed = 0;
    for sequence in 0..20 {
        let body = bytes::Bytes::from(format!("m{sequence}"));
        let mut commands = vec![ProposedCommand {
            queue: QUEUE,
            proposer: 1,
            sequence: sequence + 1,
            command: QueueCommand::Enqueue { persistent: true, own_ttl_ms: None, body, deduplication: None },
        }];
        if sequence == 0 {
            commands.insert(0, ProposedCommand { queue: QUEUE, proposer: 1, sequence: 0, command: declaration() });
        }
        node.propose(&Batch { now_ms: 1, commands }).expect("the leader proposes");
        node.process_ready().expect("persists");
        committed += node.take_outcomes().iter().filter(|outcome| matches!(outcome, Outcome::Committed { .. })).count();
    }
    assert_eq!(committed, 21, "each batch is committed by the ready that persisted it");
    assert!(node.take_messages().is_empty(), "a group of one sends nothing");
    drop(node);
    let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
    let (mut node, recovery) = ReplicaNode::open(config, file_system.shared(), &support::directory()).expect("reopens");
    assert!(!recovery.damaged);
    for _ in 0..30 {
        node.tick();
        node.process_ready().expect("persists");
    }
    let published = node.machine().queue(QUEUE).map(|core| core.stats().published);
    assert_eq!(published, Some(20), "every committed message is back after the power cut");
}
