//! Three replicas in one process over a seeded network: elections, replication, crashes that lose
//! unsynced writes, partitions, catch-up by log and by snapshot, and a damaged log. Each test
//! prints the seed of a failing run; `SIMULATION_SEED=n` replays one seed of the random runs and
//! `SIMULATION_SEEDS=first-last` runs a range of them (the long run in bench/results).

mod support;

use replication::command::QueueCommand;
use storage::memory_file_system::{FaultOperation, PowerCut};

/// EIO and ENOSPC, as the kernel numbers them on Linux.
fn libc_eio() -> i32 {
    5
}

fn libc_enospc() -> i32 {
    28
}
use support::{Cluster, CONSUMER, QUEUE};

/// A declaration without a name or limits.
fn declare() -> QueueCommand {
    QueueCommand::Declare { name: bytes::Bytes::new(), incarnation: 0, limits: queue_core::Limits::NONE, single_active_consumer: false }
}

/// Declares the queue and attaches the consumer, once a leader exists.
fn set_up(cluster: &mut Cluster) {
    for _ in 0..200 {
        cluster.step();
        if cluster.leader().is_some() {
            break;
        }
    }
    assert!(cluster.leader().is_some(), "seed {}: no leader after 200 ticks", cluster.seed);
    assert!(cluster.propose(vec![(QUEUE, declare()), (QUEUE, QueueCommand::AddConsumer { consumer: CONSUMER, priority: 0, prefetch: 8 })]));
    for _ in 0..20 {
        cluster.step();
    }
}

/// One random run: publishes, settles and requeues while nodes crash (power cuts, torn writes),
/// links are cut and messages are dropped or reordered; then heals and checks.
fn random_run(seed: u64) -> (Vec<String>, support::Coverage, String) {
    use rand::Rng;
    let mut cluster = Cluster::new(seed, 16);
    set_up(&mut cluster);
    cluster.drop_percent = 2;
    let mut down: Option<(u64, u64)> = None;
    let mut isolated: Option<(u64, u64)> = None;
    for _ in 0..400 {
        let roll = cluster.random.gen_range(0..100);
        if roll < 30 {
            let count = cluster.random.gen_range(1..4);
            cluster.publish(count);
        } else if roll < 50 {
            cluster.settle_some(3);
        }
        match down {
            Some((id, until)) if cluster.tick >= until => {
                cluster.start(id);
                down = None;
            }
            None if cluster.random.gen_range(0..100) < 2 => {
                // Crash the leader half of the time: it holds the newest unsynced writes.
                let id = match (cluster.random.gen_bool(0.5), cluster.leader()) {
                    (true, Some(leader)) => leader,
                    _ => cluster.random.gen_range(1..=3),
                };
                let cut = match cluster.random.gen_bool(0.5) {
                    true => PowerCut::LoseUnsynced,
                    false => PowerCut::TearLastWrite { bytes_kept: cluster.random.gen_range(0..64) },
                };
                cluster.crash(id, cut);
                down = Some((id, cluster.tick + cluster.random.gen_range(5..120)));
            }
            _ => {}
        }
        match isolated {
            Some((id, until)) if cluster.tick >= until => {
                cluster.isolate(id, false);
                isolated = None;
            }
            None if cluster.random.gen_range(0..100) < 1 => {
                let id = cluster.random.gen_range(1..=3);
                cluster.isolate(id, true);
                isolated = Some((id, cluster.tick + cluster.random.gen_range(5..60)));
            }
            _ => {}
        }
        if cluster.random.gen_range(0..100) < 1 {
            // The disk fails one write or sync (EIO, ENOSPC) on one node.
            let index = cluster.random.gen_range(0..3);
            let operation = if cluster.random.gen_bool(0.5) { FaultOperation::Sync } else { FaultOperation::Write };
            let errno = if cluster.random.gen_bool(0.5) { libc_eio() } else { libc_enospc() };
            cluster.file_systems[index].fail(operation, errno, &support::directory(), 1);
        }
        cluster.step();
    }
    cluster.settle_down(2_000);
    cluster.coverage.commands_committed = cluster.committed.len() as u64;
    let fingerprint =
        format!("{:?} {:?} {:?}", cluster.committed, cluster.coverage, cluster.nodes[0].as_ref().map(|node| node.machine().encode_image()));
    (cluster.check(), cluster.coverage, fingerprint)
}

#[test]
fn random_runs_lose_no_committed_command_and_end_equal() {
    // SIMULATION_SEED=n replays one seed; SIMULATION_SEEDS=first-last runs a range (the long run).
    let seeds: Vec<u64> = match (std::env::var("SIMULATION_SEED"), std::env::var("SIMULATION_SEEDS")) {
        (Ok(seed), _) => vec![seed.parse().expect("SIMULATION_SEED is a number")],
        (_, Ok(range)) => {
            let (first, last) = range.split_once('-').expect("SIMULATION_SEEDS is first-last");
            (first.parse().expect("a number")..=last.parse().expect("a number")).collect()
        }
        _ => (1..=300).collect(),
    };
    // Seeds are independent runs: spread them over the cores (each run stays deterministic).
    let threads = std::thread::available_parallelism().map_or(1, |count| count.get()).min(8);
    let results: Vec<(Vec<String>, support::Coverage)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let seeds = &seeds;
                scope.spawn(move || {
                    seeds
                        .iter()
                        .skip(thread)
                        .step_by(threads)
                        .map(|seed| {
                            let (failures, coverage, _) = random_run(*seed);
                            (failures, coverage)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|handle| handle.join().expect("a simulation thread panicked")).collect()
    });
    let mut total = support::Coverage::default();
    let mut failures = Vec::new();
    for (run_failures, coverage) in results {
        failures.extend(run_failures);
        total.elections += coverage.elections;
        total.crashes += coverage.crashes;
        total.leader_crashes += coverage.leader_crashes;
        total.snapshots_delivered += coverage.snapshots_delivered;
        total.messages_dropped += coverage.messages_dropped;
        total.partitions += coverage.partitions;
        total.commands_committed += coverage.commands_committed;
        total.disk_failures += coverage.disk_failures;
        total.client_retries += coverage.client_retries;
    }
    assert!(failures.is_empty(), "{} failures, replay one with SIMULATION_SEED:\n{}", failures.len(), failures.join("\n"));
    if seeds.len() > 1 {
        // The seeds must exercise what the test claims to cover.
        assert!(total.leader_crashes >= 50, "{total:?}");
        assert!(total.snapshots_delivered >= 20, "{total:?}");
        assert!(total.partitions >= 50, "{total:?}");
        assert!(total.elections >= 600, "{total:?}");
        assert!(total.commands_committed >= seeds.len() as u64 * 150, "{total:?}");
        assert!(total.disk_failures >= 300, "{total:?}");
        assert!(total.client_retries >= 300, "{total:?}");
    }
    eprintln!("{} seeds: {total:?}", seeds.len());
}

/// A seed is the whole run: the same seed gives the same commits at the same indexes, the same
/// faults and the same final state (raft-rs's own election randomness is redrawn from the seed).
#[test]
fn a_seed_replays_exactly() {
    for seed in [3, 42] {
        let (_, _, first) = random_run(seed);
        let (_, _, second) = random_run(seed);
        assert!(first == second, "seed {seed} ran two different ways");
    }
}
