//! A deterministic simulator of one Lepus node (issue 15). One `u64` seed drives everything:
//! publishers with confirms, consumers with a prefetch that ack, requeue and reject, a clock
//! that moves and jumps (TTL), power cuts at any file system operation (unsynced writes lost,
//! the last write torn) and restarts. The storage is the real one (queue logs, the node journal
//! and its replay, the group-commit syncer and its checkpoints, the janitor's spares) over the
//! in-memory file system, and each queue's rules are the real queue core, all driven
//! step by step on one thread: no tokio, no threads, no wall clock, so a seed replays exactly.
//!
//! After every step the simulator checks its invariants (see [`ledger`] and [`node`]): every
//! confirmed message is in its queue or was settled, never lost; a message whose settle was
//! durable never comes back; each publisher's messages reach the only consumer of a queue in
//! order; no message expires before its TTL; nothing comes back that was never published.

pub mod catalog;
pub mod ledger;
pub mod message;
pub mod node;
pub mod random;
mod world;

use std::collections::BTreeMap;

/// A deliberate bug, to show that the invariants catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// No bug.
    None,
    /// A broker that confirms a publish before its fdatasync.
    ConfirmBeforeSync,
    /// A restart that skips the journal replay.
    SkipJournalReplay,
    /// Settles and expiries that never write their log record, though the syncer says the log
    /// was synced.
    ForgetSettleRecords,
    /// A queue core that expires messages 250 ms early.
    ExpireEarly,
    /// A queue.delete that removes the log before the definitions' deletion is durable (the
    /// broker's order before the simulator found it wrong).
    DeleteLogFirst,
    /// A start that leaves the logs no definition names.
    KeepOrphanedLogs,
    /// A declare that makes its log where a queue was deleted since the last checkpoint,
    /// without a checkpoint first.
    ReuseWithoutCheckpoint,
    /// A publish into a queue whose declare is in flight confirmed once the queue's log is
    /// synced, without waiting for the queue's definition (the broker's order before the
    /// simulator's in-flight declares showed the confirmed message lost with its queue).
    ConfirmBeforeDefinition,
    /// A page-in that counts a paged message's TTL again from the read, not from its publish
    /// (the broker before its publish records kept the expiry): a message that spent its TTL on
    /// disk is delivered.
    ExpiryFromPageIn,
}

impl Sabotage {
    /// Every deliberate bug.
    pub const ALL: [Sabotage; 9] = [
        Sabotage::ConfirmBeforeSync,
        Sabotage::SkipJournalReplay,
        Sabotage::ForgetSettleRecords,
        Sabotage::ExpireEarly,
        Sabotage::DeleteLogFirst,
        Sabotage::KeepOrphanedLogs,
        Sabotage::ReuseWithoutCheckpoint,
        Sabotage::ConfirmBeforeDefinition,
        Sabotage::ExpiryFromPageIn,
    ];

    /// How far ahead of the clock the queue core is told the time when it expires messages.
    pub fn expiry_shift_ms(self) -> u64 {
        if self == Sabotage::ExpireEarly {
            250
        } else {
            0
        }
    }

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Sabotage::None => "none",
            Sabotage::ConfirmBeforeSync => "confirm-before-sync",
            Sabotage::SkipJournalReplay => "skip-journal-replay",
            Sabotage::ForgetSettleRecords => "forget-settle-records",
            Sabotage::ExpireEarly => "expire-early",
            Sabotage::DeleteLogFirst => "delete-log-first",
            Sabotage::KeepOrphanedLogs => "keep-orphaned-logs",
            Sabotage::ReuseWithoutCheckpoint => "reuse-without-checkpoint",
            Sabotage::ConfirmBeforeDefinition => "confirm-before-definition",
            Sabotage::ExpiryFromPageIn => "expiry-from-page-in",
        }
    }

    /// The sabotage named `name` on the command line.
    pub fn from_name(name: &str) -> Option<Sabotage> {
        [Sabotage::None].into_iter().chain(Sabotage::ALL).find(|sabotage| sabotage.name() == name)
    }
}

/// What one run simulates.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Steps before the final drain.
    pub steps: u64,
    /// Durable queues declared at the start and never deleted (the first has one consumer, so its
    /// order is checked; the others two).
    pub queues: usize,
    /// Names of durable queues that the seed declares and deletes along the run (each with two
    /// consumers and a binding from the simulator's exchange); 0 for none.
    pub dynamic_queues: usize,
    /// Publishers.
    pub publishers: u16,
    /// A deliberate bug, or none.
    pub sabotage: Sabotage,
}

impl Default for Config {
    fn default() -> Config {
        Config { steps: 1_500, queues: 2, dynamic_queues: 2, publishers: 3, sabotage: Sabotage::None }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Steps run.
    pub steps: u64,
    /// Messages published.
    pub publishes: u64,
    /// Publisher confirms that said ack.
    pub confirmed: u64,
    /// Deliveries settled by consumers (acks and rejects) and expiries.
    pub settled: u64,
    /// Power cuts, and how many of them tore the last write.
    pub power_cuts: u64,
    /// Power cuts that tore the last write.
    pub torn_writes: u64,
    /// Power cuts during a restart's recovery.
    pub crashes_in_recovery: u64,
    /// Power cuts at a file system operation, by operation and file kind; those inside a
    /// queue.declare (with its bind), a queue.delete or a definitions compaction are prefixed
    /// with it (`queue.delete: Rename deleted queue directory`).
    pub crash_points: BTreeMap<String, u64>,
    /// queue.declare (with its queue.bind) answered.
    pub declares: u64,
    /// queue.delete answered.
    pub deletes: u64,
    /// Publishes (with confirms, from other channels) into a queue whose declare was in flight.
    pub publishes_during_declare: u64,
    /// Definitions compactions done.
    pub definition_compactions: u64,
    /// Log directories without a definition that starts found and removed.
    pub orphans_removed: u64,
}

/// A seed that broke an invariant.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// The step at which the invariant broke.
    pub step: u64,
    /// What broke.
    pub violation: ledger::Violation,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "seed {} failed at step {}: {} (replay: scripts/simulate.sh --seed {})",
            self.seed, self.step, self.violation, self.seed
        )
    }
}

/// Runs the world of `seed`. Storage's random numbers and its janitor are made this thread's
/// for the run, so the same seed gives the same file system operations every time.
pub fn run(seed: u64, config: &Config) -> Result<Report, Failure> {
    storage::entropy::seed_this_thread(Some(seed ^ 0x005E_ED0F_1E9B_5EED));
    storage::janitor::defer_on_this_thread(true);
    let result = world::World::new(seed, *config).run();
    storage::janitor::defer_on_this_thread(false);
    storage::entropy::seed_this_thread(None);
    result
}
