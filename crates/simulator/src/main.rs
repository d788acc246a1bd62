//! `lepus-simulator`: runs seeds of the deterministic simulator (see the library). A failing
//! seed prints itself and how to replay it; the exit status is 1 if any seed failed.
//!
//! ```text
//! lepus-simulator [--seeds N] [--first S] [--seed S] [--steps K] [--sabotage NAME]
//! ```

use simulator::{run, Config, Sabotage};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

fn usage() -> ExitCode {
    eprintln!("usage: lepus-simulator [--seeds N] [--first S] [--seed S] [--steps K] [--sabotage NAME]");
    let names: Vec<&str> = [Sabotage::None].into_iter().chain(Sabotage::ALL).map(Sabotage::name).collect();
    eprintln!("sabotage: {}", names.join(", "));
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let (mut seeds, mut first, mut config) = (100u64, 0u64, Config::default());
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let mut index = 0;
    while index < arguments.len() {
        let value = arguments.get(index + 1);
        let number = value.and_then(|value| value.parse::<u64>().ok());
        match (arguments[index].as_str(), number) {
            ("--seeds", Some(count)) => seeds = count,
            ("--first", Some(seed)) => first = seed,
            ("--seed", Some(seed)) => (first, seeds) = (seed, 1),
            ("--steps", Some(steps)) => config.steps = steps,
            ("--sabotage", _) => match value.and_then(|name| Sabotage::from_name(name)) {
                Some(sabotage) => config.sabotage = sabotage,
                None => return usage(),
            },
            _ => return usage(),
        }
        index += 2;
    }
    let started = Instant::now();
    let (mut failures, mut crash_points) = (Vec::new(), BTreeMap::<String, u64>::new());
    let (mut steps, mut publishes, mut confirmed, mut power_cuts, mut torn, mut recovery_crashes) = (0, 0, 0, 0, 0, 0);
    let mut publishes_during_declare = 0;
    for seed in first..first.saturating_add(seeds) {
        match run(seed, &config) {
            Ok(report) => {
                steps += report.steps;
                publishes += report.publishes;
                confirmed += report.confirmed;
                power_cuts += report.power_cuts;
                torn += report.torn_writes;
                recovery_crashes += report.crashes_in_recovery;
                publishes_during_declare += report.publishes_during_declare;
                for (point, count) in report.crash_points {
                    *crash_points.entry(point).or_default() += count;
                }
            }
            Err(failure) => {
                println!("FAIL {failure}");
                failures.push(failure.seed);
            }
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{seeds} seeds from {first} ({} sabotage), {:.1} s: {} failed; {steps} steps, {publishes} publishes, {confirmed} confirmed, \
         {power_cuts} power cuts ({torn} tearing the last write, {recovery_crashes} during recovery); \
         {publishes_during_declare} publishes into a queue whose declare was in flight",
        config.sabotage.name(),
        elapsed.as_secs_f64(),
        failures.len()
    );
    println!("crash points hit (operation, file): {crash_points:?}");
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failing seeds: {failures:?}");
        ExitCode::FAILURE
    }
}
