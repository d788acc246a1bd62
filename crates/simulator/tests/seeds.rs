//! The simulator in the test command: a few hundred seeds (four tests, so they run in
//! parallel), replay determinism, the crash points the seeds reached, and the deliberate bugs
//! the invariants must catch.

use simulator::{run, Config, Report, Sabotage};
use std::collections::BTreeMap;

/// Seeds per test; four tests run `4 * SEEDS_PER_TEST` seeds.
const SEEDS_PER_TEST: u64 = 60;

/// Runs `seeds`, failing with every failing seed's replay line; returns the reports.
fn run_seeds(seeds: std::ops::Range<u64>, config: &Config) -> Vec<Report> {
    let (mut reports, mut failures) = (Vec::new(), Vec::new());
    for seed in seeds {
        match run(seed, config) {
            Ok(report) => reports.push(report),
            Err(failure) => failures.push(failure.to_string()),
        }
    }
    assert!(failures.is_empty(), "{} seeds failed:\n{}", failures.len(), failures.join("\n"));
    reports
}

#[test]
fn seeds_0_to_59_keep_every_invariant() {
    run_seeds(0..SEEDS_PER_TEST, &Config::default());
}

#[test]
fn seeds_60_to_119_keep_every_invariant() {
    run_seeds(SEEDS_PER_TEST..2 * SEEDS_PER_TEST, &Config::default());
}

#[test]
fn seeds_120_to_179_keep_every_invariant() {
    run_seeds(2 * SEEDS_PER_TEST..3 * SEEDS_PER_TEST, &Config::default());
}

/// The seeds that found the two retired-segment bugs (a checkpoint skipped a segment retired
/// after its last fdatasync; a spare was written into before its retirement was durable; in
/// both a power cut undid the retirement and acked messages came back), and the next ones.
#[test]
fn seeds_found_failing_once_and_180_to_239_keep_every_invariant() {
    let found = [28, 39, 45, 68, 72, 81, 101, 103, 169, 195, 284, 290, 10_029, 11_564, 11_816, 12_073];
    let mut seeds: Vec<u64> = found.to_vec();
    seeds.extend(3 * SEEDS_PER_TEST..4 * SEEDS_PER_TEST);
    for seed in seeds {
        run_seeds(seed..seed + 1, &Config::default());
    }
}

/// A seed replays exactly: the same steps, publishes, confirms, power cuts and crash points.
#[test]
fn a_seed_replays_exactly() {
    for seed in [7, 1_000_003] {
        let first = run(seed, &Config::default()).expect("the seed passes");
        let second = run(seed, &Config::default()).expect("the seed passes");
        let summary = |report: &Report| {
            (
                report.steps,
                report.publishes,
                report.confirmed,
                report.settled,
                report.power_cuts,
                report.torn_writes,
                report.crash_points.clone(),
            )
        };
        assert_eq!(summary(&first), summary(&second), "seed {seed} ran differently twice");
    }
}

/// Over the seeds, the power went at every durability boundary the simulated node has: the
/// journal's append, fdatasync, directory sync and rotation, segment writes, rolls onto a
/// spare, checkpoint fdatasyncs, directory syncs of new segments, spare preparation and
/// recycling. (The definitions store and queue deletion are outside the simulated node.)
#[test]
fn the_seeds_cut_the_power_at_every_durability_boundary() {
    let mut hits: BTreeMap<String, u64> = BTreeMap::new();
    for report in run_seeds(1_000_000..1_000_000 + SEEDS_PER_TEST, &Config::default()) {
        for (point, count) in report.crash_points {
            *hits.entry(point).or_default() += count;
        }
    }
    let required = [
        "Write journal",
        "SyncFile journal",
        "SyncDirectory journal",
        "Write segment",
        "SyncFile segment",
        "Rename segment",
        "SyncDirectory queue directory",
        "Rename spare segment",
        "Write spare segment",
    ];
    let missing: Vec<&str> = required.iter().copied().filter(|point| !hits.contains_key(*point)).collect();
    assert!(missing.is_empty(), "no power cut at {missing:?}; hit: {hits:?}");
}

/// Each deliberate bug is caught, by the first few seeds.
#[test]
fn every_deliberate_bug_is_caught() {
    for sabotage in Sabotage::ALL {
        let config = Config { sabotage, ..Config::default() };
        let caught = (0..10).filter(|seed| run(*seed, &config).is_err()).count();
        assert!(caught > 0, "{} was never caught", sabotage.name());
    }
}
