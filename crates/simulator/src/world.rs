//! The simulated world: the node, its clients and the power, stepped by one seed.

use crate::catalog::{Catalog, Lifecycle};
use crate::ledger::{violation, Fate, Ledger, Settlement, Violation};
use crate::message::{message, message_id, Simulated, FILLER_BYTES_MAX};
use crate::node::{
    binding_record, data_directory, exchange_record, queue_record, queues_directory, Halt, Node, SharedOutbox, StartOptions,
};
use crate::random::Random;
use crate::{Config, Failure, Report, Sabotage};
use std::sync::Arc;
use storage::definitions::DefinitionsStore;
use storage::definitions_state::DefinitionChange;
use storage::memory_file_system::{CrashPoint, MemoryFileSystem, PowerCut};

/// Percent of steps after which the power goes even without a crash point.
const POWER_CUT_PERCENT_PER_STEP_TENTHS: u64 = 4;
/// Starts in a row that a crash in recovery may interrupt before the run gives up.
const RESTART_ATTEMPTS_MAX: u32 = 20;
/// The most file system changes before an armed crash point (it is armed at 60 % of starts).
const CRASH_POINT_OPERATIONS_MAX: u64 = 400;
/// Rounds the final drain may take.
const DRAIN_ROUNDS_MAX: u32 = 2_000;
/// Steps between the full ledger checks (the cheap ones run after every step).
const FULL_CHECK_INTERVAL_STEPS: u64 = 25;
/// Percent of steps that change the definitions (a declare with its bind, a delete, or a
/// compaction), when the run has dynamic queues.
const DEFINITION_STEP_PERCENT: u64 = 4;
/// Percent of those steps that arm a crash point a few operations ahead (when none is armed), so
/// the power goes inside the definitions write and the queue deletion often.
const DEFINITION_CRASH_PERCENT: u64 = 40;
/// How far ahead that crash point is: a declare with its bind, and a delete, take a handful.
const DEFINITION_CRASH_OPERATIONS_MAX: u64 = 8;
/// The most publishes other channels make into a queue whose declare is in flight (between its
/// definition's submission and declare-ok), each followed by a syncer step half the time.
const PUBLISHES_DURING_DECLARE_MAX: u64 = 3;

pub(crate) struct World {
    seed: u64,
    config: Config,
    random: Random,
    ledger: Ledger,
    outbox: Arc<SharedOutbox>,
    file_system: MemoryFileSystem,
    node: Option<Node>,
    now_ms: u64,
    next_sequence: Vec<u64>,
    next_consumer: u64,
    step: u64,
    report: Report,
    catalog: Catalog,
    /// The step under way that changes the definitions, if any: crash points in it are named
    /// with it.
    acting: &'static str,
    /// Whether a crash point is armed in this life of the node.
    crash_armed: bool,
}

impl World {
    pub(crate) fn new(seed: u64, config: Config) -> World {
        let file_system = MemoryFileSystem::new();
        file_system.create_durable_directory(&queues_directory());
        World {
            seed,
            config,
            random: Random::new(seed),
            ledger: Ledger::new(),
            outbox: Arc::default(),
            file_system,
            node: None,
            now_ms: 1_000_000,
            next_sequence: vec![0; usize::from(config.publishers)],
            next_consumer: 1,
            step: 0,
            report: Report { seed, ..Report::default() },
            catalog: Catalog::default(),
            acting: "",
            crash_armed: false,
        }
    }

    pub(crate) fn run(mut self) -> Result<Report, Failure> {
        let result = self.run_steps();
        result.map(|()| self.report.clone()).map_err(|violation| Failure { seed: self.seed, step: self.step, violation })
    }

    fn run_steps(&mut self) -> Result<(), Violation> {
        self.bootstrap()?;
        self.restart(true)?;
        for step in 0..self.config.steps {
            self.step = step;
            self.report.steps = step + 1;
            self.acting = "";
            let acted = self.act();
            self.take_outbox()?;
            match acted {
                Err(Halt::Violation(violation)) => return Err(violation),
                Err(Halt::Crashed) => {}
                Ok(()) if self.file_system.crashed().is_some() => {}
                Ok(()) => {
                    self.check(step % FULL_CHECK_INTERVAL_STEPS == 0)?;
                    if self.random.below(1000) >= POWER_CUT_PERCENT_PER_STEP_TENTHS {
                        continue;
                    }
                }
            }
            self.power_cut(true)?;
        }
        self.step = self.config.steps;
        // The end: a clean cut, then every queue drained, every settle synced, a last cut and
        // drain; every confirmed message must have been settled.
        self.power_cut(false)?;
        self.drain()?;
        self.power_cut(false)?;
        self.drain()?;
        self.ledger.all_confirmed_settled()
    }

    fn node(&mut self) -> &mut Node {
        self.node.as_mut().expect("the node runs between restarts")
    }

    /// The data directory as a first start leaves it: the exchange and the fixed queues
    /// declared and bound, durably (no crash point is armed yet).
    fn bootstrap(&mut self) -> Result<(), Violation> {
        let failed = |error: storage::StorageError| Violation(format!("writing the first definitions failed: {error}"));
        let (store, _) = DefinitionsStore::open_on(self.file_system.shared(), &data_directory()).map_err(failed)?;
        store.apply(DefinitionChange::PutExchange(exchange_record())).map_err(failed)?;
        for queue in 0..self.config.queues {
            let name = format!("q{queue}");
            let index = self.catalog.declare_started(&name);
            assert_eq!(self.ledger.add_queue(), index, "the ledger and the catalog index queues alike");
            store.apply(DefinitionChange::PutQueue(queue_record(&name))).map_err(failed)?;
            self.catalog.set(index, Lifecycle::Declared);
            store.apply(DefinitionChange::PutBinding(binding_record(&name))).map_err(failed)?;
            self.catalog.bound(index);
        }
        Ok(())
    }

    /// One step, chosen by the seed.
    fn act(&mut self) -> Result<(), Halt> {
        if self.config.dynamic_queues > 0 && self.random.percent(DEFINITION_STEP_PERCENT) {
            return self.change_definitions();
        }
        let roll = self.random.below(100);
        match roll {
            0..30 => self.publish(),
            30..48 => {
                let timer_fired = self.random.percent(30);
                self.node().syncer.step(timer_fired);
                Ok(())
            }
            48..73 => self.consume(),
            73..81 => self.move_clock(),
            81..86 => {
                let queue = self.random_queue();
                self.flush(queue);
                Ok(())
            }
            86..91 => {
                storage::janitor::run_deferred(1);
                Ok(())
            }
            91..96 => {
                self.node().syncer.run_checkpoint();
                Ok(())
            }
            96 => {
                self.checkpoint();
                Ok(())
            }
            _ => self.dispatch_all(),
        }
    }

    /// A declare (with its bind) of a free dynamic name, a delete of a dynamic queue, or a
    /// compaction of the definitions; sometimes with a crash point armed a few operations ahead.
    fn change_definitions(&mut self) -> Result<(), Halt> {
        if !self.crash_armed && self.random.percent(DEFINITION_CRASH_PERCENT) {
            self.file_system.crash_at_operation(self.random.between(1..=DEFINITION_CRASH_OPERATIONS_MAX));
            self.crash_armed = true;
        }
        let free: Vec<String> =
            (0..self.config.dynamic_queues).map(|index| format!("d{index}")).filter(|name| self.catalog.is_free(name)).collect();
        let dynamic: Vec<usize> = {
            let fixed = self.config.queues;
            let queues = &self.node().queues;
            (0..queues.len()).filter(|slot| queues[*slot].index >= fixed).collect()
        };
        let roll = self.random.below(100);
        if roll < 10 {
            self.acting = "definitions compaction";
            self.node().compact_definitions()?;
            self.report.definition_compactions += 1;
        } else if !free.is_empty() && (roll < 55 || dynamic.is_empty()) {
            let name = free[self.random.below(free.len() as u64) as usize].clone();
            let index = self.catalog.declare_started(&name);
            assert_eq!(self.ledger.add_queue(), index, "the ledger and the catalog index queues alike");
            self.acting = "queue.declare";
            self.trace(format_args!("declare {name} (queue {index})"));
            self.node().declare_submitted(&name, index)?;
            let slot = self.node().queues.len() - 1;
            // Other channels see the queue from here on: they publish to it with confirms, and the
            // group commit may sync its log, before its definition is durable.
            for _ in 0..self.random.below(PUBLISHES_DURING_DECLARE_MAX + 1) {
                self.publish_to(slot)?;
                self.report.publishes_during_declare += 1;
                if self.random.percent(50) {
                    let timer_fired = self.random.percent(30);
                    self.node().syncer.step(timer_fired);
                }
            }
            let node = self.node.as_mut().expect("the node runs");
            node.declare_answered(slot, &mut self.catalog)?;
            self.report.declares += 1;
            self.add_consumers_to(slot).map_err(Halt::Violation)?;
        } else if !dynamic.is_empty() {
            let slot = dynamic[self.random.below(dynamic.len() as u64) as usize];
            self.acting = "queue.delete";
            let index = self.node().queues[slot].index;
            self.trace(format_args!("delete queue {index}"));
            let node = self.node.as_mut().expect("the node runs");
            node.delete(slot, &mut self.catalog, &mut self.ledger)?;
            self.report.deletes += 1;
        }
        Ok(())
    }

    /// With `LEPUS_SIMULATOR_TRACE` set, prints what a replayed seed does to its definitions and
    /// power.
    fn trace(&self, what: std::fmt::Arguments<'_>) {
        if std::env::var_os("LEPUS_SIMULATOR_TRACE").is_some() {
            eprintln!("seed {} step {}: {what}", self.seed, self.step);
        }
    }

    /// A queue of the node, by slot.
    fn random_queue(&mut self) -> usize {
        let count = self.node().queues.len() as u64;
        self.random.below(count) as usize
    }

    fn publish(&mut self) -> Result<(), Halt> {
        let publisher = self.random.below(u64::from(self.config.publishers)) as u16;
        let queue = self.random_queue();
        self.publish_from(publisher, queue)
    }

    /// A publisher chosen by the seed publishes to the queue at slot `queue`, with confirms.
    fn publish_to(&mut self, queue: usize) -> Result<(), Halt> {
        let publisher = self.random.below(u64::from(self.config.publishers)) as u16;
        self.publish_from(publisher, queue)
    }

    /// `publisher` publishes to the queue at slot `queue`, with confirms.
    fn publish_from(&mut self, publisher: u16, queue: usize) -> Result<(), Halt> {
        let sequence = self.next_sequence[usize::from(publisher)];
        self.next_sequence[usize::from(publisher)] += 1;
        let id = message_id(publisher, sequence);
        let ttl_ms = self.random.percent(15).then(|| self.random.between(100..=3_000));
        let filler_bytes = self.random.below(FILLER_BYTES_MAX);
        let simulated = Simulated { id, ttl_ms, message: Arc::new(message(id, ttl_ms, filler_bytes)) };
        let index = self.node().queues[queue].index;
        self.ledger.publish(id, index, ttl_ms, self.now_ms);
        self.report.publishes += 1;
        let (now_ms, outbox, sabotage) = (self.now_ms, self.outbox.clone(), self.config.sabotage);
        let node = self.node.as_mut().expect("the node runs");
        node.queues[queue].publish(simulated, now_ms, (&node.syncer, &node.definitions), outbox, sabotage)?;
        if sabotage == Sabotage::ConfirmBeforeSync {
            self.ledger.confirm(id, true)?;
            self.report.confirmed += 1;
        }
        self.dispatch(queue)
    }

    fn dispatch(&mut self, queue: usize) -> Result<(), Halt> {
        let (now_ms, sabotage) = (self.now_ms, self.config.sabotage);
        let node = self.node.as_mut().expect("the node runs");
        node.queues[queue].dispatch(now_ms, &mut self.ledger, sabotage)
    }

    fn dispatch_all(&mut self) -> Result<(), Halt> {
        (0..self.node().queues.len()).try_for_each(|queue| self.dispatch(queue))
    }

    /// A consumer acks (75 %), requeues (12 %) or rejects (13 %) one of its deliveries.
    fn consume(&mut self) -> Result<(), Halt> {
        let queue = self.random_queue();
        let holders: Vec<usize> = {
            let consumers = &self.node().queues[queue].consumers;
            (0..consumers.len()).filter(|index| !consumers[*index].unacked.is_empty()).collect()
        };
        if holders.is_empty() {
            return self.dispatch(queue);
        }
        let consumer = holders[self.random.below(holders.len() as u64) as usize];
        let held = self.node().queues[queue].consumers[consumer].unacked.len();
        let index = self.random.below(held as u64) as usize;
        let how = match self.random.below(100) {
            0..75 => Some(Settlement::Acked),
            75..87 => None,
            _ => Some(Settlement::Rejected),
        };
        if how.is_some() {
            self.report.settled += 1;
        }
        let (now_ms, sabotage) = (self.now_ms, self.config.sabotage);
        let node = self.node.as_mut().expect("the node runs");
        node.queues[queue].settle(consumer, index, how, now_ms, &mut self.ledger, sabotage)?;
        self.dispatch(queue)
    }

    /// The clock moves a little, or jumps (TTLs pass); expired messages go.
    fn move_clock(&mut self) -> Result<(), Halt> {
        self.now_ms += if self.random.percent(10) { self.random.between(500..=5_000) } else { self.random.between(1..=50) };
        let (now_ms, sabotage) = (self.now_ms, self.config.sabotage);
        for queue in 0..self.node().queues.len() {
            let node = self.node.as_mut().expect("the node runs");
            node.queues[queue].expire(now_ms, &mut self.ledger, sabotage)?;
            self.dispatch(queue)?;
        }
        Ok(())
    }

    /// Asks the syncer to sync `queue`'s log: once it says so, the settles appended before are
    /// durable.
    fn flush(&mut self, queue: usize) {
        let outbox = self.outbox.clone();
        let node = self.node();
        let settles = std::mem::take(&mut node.queues[queue].settles_unflushed);
        let log = node.queues[queue].log.clone();
        node.syncer.handle().sync(vec![log], Some(Box::new(move |durable| outbox.0.lock().flushes.push((settles, durable)))));
    }

    /// A checkpoint as a graceful shutdown runs it (without stopping).
    fn checkpoint(&mut self) {
        let outbox = self.outbox.clone();
        let node = self.node();
        let settles: Vec<u64> = node.queues.iter_mut().flat_map(|queue| std::mem::take(&mut queue.settles_unflushed)).collect();
        let logs = node.queues.iter().map(|queue| queue.log.clone()).collect();
        node.syncer.handle().checkpoint_then(logs, Box::new(move |durable| outbox.0.lock().flushes.push((settles, durable))));
    }

    /// Hands the confirms and flush outcomes the syncer produced to the ledger.
    fn take_outbox(&mut self) -> Result<(), Violation> {
        let outbox = std::mem::take(&mut *self.outbox.0.lock());
        if self.config.sabotage != Sabotage::ConfirmBeforeSync {
            for (id, acked) in outbox.confirms {
                self.ledger.confirm(id, acked)?;
                self.report.confirmed += u64::from(acked);
            }
        }
        for (settles, durable) in outbox.flushes {
            if durable {
                self.ledger.settles_durable(&settles);
            }
        }
        Ok(())
    }

    /// The invariants between steps: counts always, every live message's place at times.
    fn check(&mut self, full: bool) -> Result<(), Violation> {
        let node = self.node.as_ref().expect("the node runs");
        for queue in &node.queues {
            queue.check_counts(&self.ledger)?;
        }
        if full {
            for queue in &node.queues {
                let index = queue.index;
                for (position, id) in &queue.live {
                    match self.ledger.get(*id) {
                        Some(publish) if publish.queue == index && publish.fate == Fate::Live => {}
                        other => violation!("queue {index}: position {position} holds {id:x}, which the ledger has as {other:?}"),
                    }
                }
            }
        }
        Ok(())
    }

    /// The power goes: unsynced writes are lost (or the last one torn), the node restarts.
    fn power_cut(&mut self, arm_crash_points: bool) -> Result<(), Violation> {
        self.node = None;
        self.cut_power();
        self.restart(arm_crash_points)
    }

    fn cut_power(&mut self) {
        self.trace(format_args!("power cut ({}; crash point {:?})", self.acting, self.file_system.crashed()));
        if let Some(point) = self.file_system.crashed() {
            let name = match self.acting {
                "" => crash_point_name(&point),
                acting => format!("{acting}: {}", crash_point_name(&point)),
            };
            *self.report.crash_points.entry(name).or_default() += 1;
        }
        self.acting = "";
        self.crash_armed = false;
        let cut = if self.random.percent(30) {
            self.report.torn_writes += 1;
            PowerCut::TearLastWrite { bytes_kept: self.random.below(64) as usize }
        } else {
            PowerCut::LoseUnsynced
        };
        self.report.power_cuts += 1;
        self.file_system = self.file_system.power_cut(cut);
        // The dead node's pending janitor jobs die with it; its syncer's callbacks never run.
        storage::janitor::defer_on_this_thread(true);
        *self.outbox.0.lock() = Default::default();
    }

    /// Starts the node, again after every crash that interrupts recovery; adds the consumers.
    fn restart(&mut self, arm_crash_points: bool) -> Result<(), Violation> {
        let options = StartOptions {
            segment_bytes: self.random.between(512..=4096),
            checkpoint_bytes: self.random.between(2_048..=65_536),
            sabotage: self.config.sabotage,
        };
        for _ in 0..RESTART_ATTEMPTS_MAX {
            if arm_crash_points && self.random.percent(60) {
                self.file_system.crash_at_operation(self.random.between(1..=CRASH_POINT_OPERATIONS_MAX));
                self.crash_armed = true;
            }
            match Node::start(self.file_system.clone(), &options, &mut self.ledger, &mut self.catalog) {
                Ok(node) => {
                    self.report.orphans_removed += node.orphans_removed;
                    self.node = Some(node);
                    return self.add_consumers();
                }
                Err(Halt::Crashed) => {
                    self.report.crashes_in_recovery += 1;
                    self.cut_power();
                }
                Err(Halt::Violation(violation)) => return Err(violation),
            }
        }
        violation!("{RESTART_ATTEMPTS_MAX} restarts in a row crashed in recovery")
    }

    /// One consumer on the first queue (its order is checked), two on the others.
    fn add_consumers(&mut self) -> Result<(), Violation> {
        (0..self.node().queues.len()).try_for_each(|slot| self.add_consumers_to(slot))
    }

    /// The consumers of the queue at `slot`.
    fn add_consumers_to(&mut self, queue: usize) -> Result<(), Violation> {
        let count = if self.node().queues[queue].index == 0 { 1 } else { 2 };
        for _ in 0..count {
            let prefetch = self.random.between(1..=8) as u32;
            let id = self.next_consumer;
            self.next_consumer += 1;
            match self.node().queues[queue].add_consumer(id, prefetch) {
                Ok(()) => {}
                Err(Halt::Violation(violation)) => return Err(violation),
                Err(Halt::Crashed) => unreachable!("adding a consumer does no I/O"),
            }
        }
        Ok(())
    }

    /// Consumers ack everything, the clock runs TTLs out, until every queue is empty; then every
    /// settle is synced.
    fn drain(&mut self) -> Result<(), Violation> {
        let halted = |halt: Halt| match halt {
            Halt::Violation(violation) => violation,
            Halt::Crashed => Violation("the power went during the final drain, with no crash point armed".to_string()),
        };
        for _ in 0..DRAIN_ROUNDS_MAX {
            self.now_ms += 100;
            self.node().syncer.step(true);
            self.take_outbox()?;
            let (now_ms, sabotage) = (self.now_ms, self.config.sabotage);
            for queue in 0..self.node().queues.len() {
                let node = self.node.as_mut().expect("the node runs");
                node.queues[queue].expire(now_ms, &mut self.ledger, sabotage).map_err(halted)?;
                node.queues[queue].dispatch(now_ms, &mut self.ledger, sabotage).map_err(halted)?;
                for consumer in 0..node.queues[queue].consumers.len() {
                    while !node.queues[queue].consumers[consumer].unacked.is_empty() {
                        self.report.settled += 1;
                        node.queues[queue]
                            .settle(consumer, 0, Some(Settlement::Acked), now_ms, &mut self.ledger, sabotage)
                            .map_err(halted)?;
                    }
                }
            }
            self.check(true)?;
            if self.node().queues.iter().all(|queue| queue.live.is_empty()) {
                return self.flush_everything();
            }
        }
        violation!("the queues did not drain in {DRAIN_ROUNDS_MAX} rounds")
    }

    /// Syncs every queue's settles and waits (in steps) for the outcome.
    fn flush_everything(&mut self) -> Result<(), Violation> {
        for queue in 0..self.node().queues.len() {
            self.flush(queue);
        }
        while self.node().syncer.step(false) {}
        self.take_outbox()
    }
}

/// A crash point's name in the report: the operation and what kind of file it was on.
fn crash_point_name(point: &CrashPoint) -> String {
    let path = point.path.to_string_lossy();
    let file = if path.contains("definitions") {
        "definitions"
    } else if point.path.parent() == Some(queues_directory().as_path()) && path.ends_with(".deleted") {
        "deleted queue directory"
    } else if point.path == queues_directory() {
        "queues directory"
    } else if point.path == data_directory() {
        "data directory"
    } else if path.contains("/journal") {
        "journal"
    } else if path.ends_with(".seg") {
        "segment"
    } else if path.ends_with(".spare") || path.ends_with(".preparing") {
        "spare segment"
    } else if path.contains(".deleted") {
        "retired segment"
    } else {
        "queue directory"
    };
    format!("{:?} {file}", point.operation)
}
