//! One life of the simulated node: storage opened and recovered as the broker opens it (journal
//! replay, queue logs, a syncer with the journal), each queue's rules in the real queue core, and
//! the effects performed the way the server's `queue_runtime` performs them.

use crate::catalog::{Catalog, Lifecycle};
use crate::ledger::{violation, Ledger, Settlement, Violation};
use crate::message::{parse_body, MessageId, Simulated};
use crate::Sabotage;
use parking_lot::Mutex;
use queue_core::{Command, ConsumerId, Effect, Limits, PagedExpiry, PagedMessage, QueueCore, QueueState, Reply, Window};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use storage::definitions::{BindingRecord, DefinitionsStore, DefinitionsTicket, ExchangeRecord, QueueRecord};
use storage::definitions_state::DefinitionChange;
use storage::file_cache::FileCache;
use storage::journal::{replay_in, Journal};
use storage::memory_file_system::MemoryFileSystem;
use storage::queue_log::{is_past_every_segment, QueueLog, RecordLocation, TailCursor};
use storage::range_set::RangeSet;
use storage::record::RecordedExpiry;
use storage::syncer::{Confirm, ConfirmSink, SharedLog, SteppedSyncer, SyncPolicy};
use storage::StorageError;

/// A queue keeps this many ready messages in memory before it pages: small, so paging, page-in
/// and recovered tails are exercised all the time.
const WINDOW: Window = Window {
    messages_max: 6,
    bytes_max: u64::MAX / 4,
    low_watermark_messages: 3,
    low_watermark_bytes: u64::MAX / 4,
    page_in_batch_bytes_max: 64 * 1024,
};
/// The most deliveries one dispatch makes, so a step stays bounded.
const DISPATCH_DELIVERIES_MAX: usize = 64;
/// Syncer steps a checkpoint the simulator waits for may take.
const CHECKPOINT_STEPS_MAX: u32 = 64;
/// Open segment files the node's cache keeps.
const OPEN_SEGMENT_FILES_MAX: usize = 8;

/// The data directory's queues.
pub fn queues_directory() -> PathBuf {
    Path::new("/data").join("queues")
}

/// The node journal.
pub fn journal_directory() -> PathBuf {
    Path::new("/data").join("journal")
}

/// The data directory (the definitions store's snapshot and log live there).
pub fn data_directory() -> PathBuf {
    PathBuf::from("/data")
}

/// The vhost of every simulated queue.
const VHOST: &str = "/";
/// The durable exchange every declared queue is bound from.
pub const EXCHANGE: &str = "simulated";

/// A durable classic queue's definition, as the broker stores it.
pub fn queue_record(name: &str) -> QueueRecord {
    QueueRecord {
        vhost: VHOST.to_string(),
        name: name.to_string(),
        auto_delete: false,
        arguments_hex: String::new(),
        queue_type: broker_core::vhost::QueueType::Classic,
    }
}

/// The binding of `queue` from [`EXCHANGE`].
pub fn binding_record(queue: &str) -> BindingRecord {
    BindingRecord {
        vhost: VHOST.to_string(),
        source: EXCHANGE.to_string(),
        destination: queue.to_string(),
        destination_is_exchange: false,
        routing_key: queue.to_string(),
        arguments_hex: String::new(),
    }
}

/// The durable exchange the queues are bound from.
pub fn exchange_record() -> ExchangeRecord {
    ExchangeRecord {
        vhost: VHOST.to_string(),
        name: EXCHANGE.to_string(),
        kind: "direct".to_string(),
        auto_delete: false,
        internal: false,
        arguments_hex: String::new(),
    }
}

/// Why a step stopped before its end.
#[derive(Debug)]
pub enum Halt {
    /// The power went in the middle of it (a crash point was reached).
    Crashed,
    /// An invariant broke.
    Violation(Violation),
}

impl From<Violation> for Halt {
    fn from(violation: Violation) -> Halt {
        Halt::Violation(violation)
    }
}

/// What syncer callbacks hand back to the simulator, read after each step.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Publisher confirms: (message id, acked).
    pub confirms: Vec<(MessageId, bool)>,
    /// Flushes of settles: the settles they covered and whether they became durable.
    pub flushes: Vec<(Vec<MessageId>, bool)>,
}

/// The confirm sink every simulated publisher shares.
#[derive(Debug, Default)]
pub struct SharedOutbox(pub Mutex<Outbox>);

impl ConfirmSink for SharedOutbox {
    fn confirm_batch(&self, confirms: &[(u64, bool)]) {
        self.0.lock().confirms.extend_from_slice(confirms);
    }
}

/// A message handed to a consumer and not settled yet.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    /// Its queue position.
    pub position: u64,
    /// Which publish it is.
    pub id: MessageId,
}

/// A consumer (manual acks, a prefetch).
#[derive(Debug)]
pub struct Consumer {
    /// Its id in the queue core.
    pub id: ConsumerId,
    /// What it holds.
    pub unacked: Vec<Delivery>,
}

/// Where a paging queue's tail continues on disk (the server's `Pager`).
struct Pager {
    cursor: TailCursor,
    delivered: RangeSet,
    all_redelivered: bool,
}

/// One durable queue.
pub struct Queue {
    /// Its incarnation (the ledger's and the catalog's index).
    pub index: usize,
    /// Its name, which is also its log directory's.
    pub name: String,
    /// The node's view of the file system, to tell a power cut from a bug.
    file_system: MemoryFileSystem,
    /// Its log, shared with the syncer.
    pub log: SharedLog,
    /// Its rules.
    pub core: QueueCore<Simulated>,
    pager: Option<Pager>,
    /// Every message in it (ready, paged or unacked), by position.
    pub live: BTreeMap<u64, MessageId>,
    /// Its consumers.
    pub consumers: Vec<Consumer>,
    /// Settles appended since the last flush request.
    pub settles_unflushed: Vec<MessageId>,
    /// While its queue.declare is in flight (the queue visible to other channels, its definition
    /// submitted but not known durable): the definitions ticket a publish's confirm waits for.
    pub definition_pending: Option<DefinitionsTicket>,
}

/// The storage and queues of one run of the node.
pub struct Node {
    /// This life's view of the file system.
    pub file_system: MemoryFileSystem,
    /// The group commit.
    pub syncer: SteppedSyncer,
    /// The queues.
    pub queues: Vec<Queue>,
    /// The definitions store (the broker's `DefinitionsStore`).
    pub definitions: DefinitionsStore,
    segment_bytes: u64,
    cache: Arc<FileCache>,
    /// Log directories without a definition that the start removed.
    pub orphans_removed: u64,
    sabotage: Sabotage,
}

/// What a start needs beyond the file system.
pub struct StartOptions {
    /// Segment size (small: they roll every few messages).
    pub segment_bytes: u64,
    /// Journal size that asks for a checkpoint.
    pub checkpoint_bytes: u64,
    /// The deliberate bug, if any.
    pub sabotage: Sabotage,
}

/// Maps a storage error: the power going explains it, anything else is a bug.
fn storage_failure(file_system: &MemoryFileSystem, what: &str, error: StorageError) -> Halt {
    if file_system.crashed().is_some() {
        return Halt::Crashed;
    }
    Halt::Violation(Violation(format!("{what} failed without a fault: {error}")))
}

impl Node {
    /// Starts the node on `file_system` as the broker does after a crash: opens the definitions
    /// (checked against the catalog), replays the journal, opens the log of every queue the
    /// definitions hold and checks what it recovered against the ledger.
    pub fn start(file_system: MemoryFileSystem, options: &StartOptions, ledger: &mut Ledger, catalog: &mut Catalog) -> Result<Node, Halt> {
        let shared = file_system.shared();
        let failure = |what: &str, error| storage_failure(&file_system, what, error);
        // `Broker::open`: the definitions first, then the journal replay.
        let (definitions, recovered) =
            DefinitionsStore::open_on(shared.clone(), &data_directory()).map_err(|error| failure("opening the definitions", error))?;
        let (mut journal, entries) =
            Journal::open_in(shared.clone(), &journal_directory()).map_err(|error| failure("opening the journal", error))?;
        if options.sabotage != Sabotage::SkipJournalReplay {
            replay_in(shared.clone(), &queues_directory(), &entries, is_past_every_segment)
                .map_err(|error| failure("journal replay", error))?;
        }
        journal.start_new_file().map_err(|error| failure("retiring the replayed journal", error))?;
        journal.set_checkpoint_bytes(options.checkpoint_bytes);
        let syncer = SteppedSyncer::new(SyncPolicy::Always, Some(journal));
        let cache = FileCache::with_file_system(OPEN_SEGMENT_FILES_MAX, shared.clone());
        let queue_names: BTreeSet<String> =
            recovered.queues.iter().filter(|queue| queue.vhost == VHOST).map(|queue| queue.name.clone()).collect();
        let bound: BTreeSet<String> = recovered
            .bindings
            .iter()
            .filter(|binding| binding.source == EXCHANGE && !binding.destination_is_exchange)
            .map(|binding| binding.destination.clone())
            .collect();
        // `Broker::recover`: logs of queues deleted just before a crash, renamed away but not yet
        // removed, go to the janitor.
        storage::queue_log::remove_deleted_logs_in(shared.clone(), &queues_directory());
        // Then the logs no definition names (a deletion durable in the definitions, its log's
        // removal undone by the crash) go the same way.
        let keep_orphans = options.sabotage == Sabotage::KeepOrphanedLogs;
        let orphans = storage::queue_log::remove_orphaned_logs_in(shared.clone(), &queues_directory(), |name| {
            keep_orphans || queue_names.contains(name)
        })
        .map_err(|error| failure("removing orphaned logs", error))?;
        let resolved = catalog.recovered(&queue_names, &bound)?;
        for gone in &resolved.gone {
            ledger.queue_gone(*gone);
        }
        for gone in &resolved.never_declared {
            ledger.queue_never_declared(*gone)?;
        }
        check_no_orphaned_logs(&file_system, &queue_names)?;
        // As the broker starts: every log opened, then the seals recovery wrote made durable by
        // one sync of the file system, before any queue is used.
        let mut opened = Vec::with_capacity(resolved.open.len());
        for index in &resolved.open {
            let directory = queues_directory().join(&catalog.get(*index).name);
            opened.push(
                QueueLog::open_without_syncing_seals(&directory, options.segment_bytes, cache.clone())
                    .map_err(|error| failure("queue log recovery", error))?,
            );
        }
        if opened.iter().any(|(_, recovery)| recovery.seals_unsynced) {
            shared.sync_file_system(&queues_directory()).map_err(|source| {
                failure("syncing recovery's seals", StorageError::Io { path: queues_directory().display().to_string(), source })
            })?;
        }
        let mut node = Node {
            file_system,
            syncer,
            queues: Vec::new(),
            definitions,
            segment_bytes: options.segment_bytes,
            cache,
            orphans_removed: orphans.len() as u64,
            sabotage: options.sabotage,
        };
        for (index, (log, recovery)) in resolved.open.into_iter().zip(opened) {
            let queue = node.recovered_queue(index, &catalog.get(index).name, log, &recovery, ledger)?;
            node.queues.push(queue);
        }
        Ok(node)
    }

    /// A recovered queue: its log's messages checked against the ledger.
    fn recovered_queue(
        &self,
        index: usize,
        name: &str,
        mut log: QueueLog,
        recovery: &storage::queue_log::Recovery,
        ledger: &mut Ledger,
    ) -> Result<Queue, Halt> {
        log.use_journal();
        let mut cursor = log.recovered_tail(recovery);
        let recovered = log
            .read_tail(&mut cursor, usize::MAX, usize::MAX)
            .map_err(|error| storage_failure(&self.file_system, "reading the recovered messages", error))?;
        if recovered.len() as u64 != recovery.live_count {
            violation!("queue {index}: recovery counted {} live messages, its tail holds {}", recovery.live_count, recovered.len());
        }
        let mut live = BTreeMap::new();
        for (position, message) in &recovered {
            let Some((id, _)) = parse_body(&message.body) else {
                violation!("queue {index}: position {position} recovered a body never published")
            };
            if ledger.get(id).is_none_or(|publish| publish.queue != index) {
                let owner = ledger.get(id).map(|publish| publish.queue);
                violation!("queue {index} ({name}): recovered {id:x}, never published to it (published to queue {owner:?})");
            }
            if live.insert(*position, id).is_some() {
                violation!("queue {index}: position {position} recovered twice");
            }
        }
        let mut ids: Vec<MessageId> = live.values().copied().collect();
        ids.sort_unstable();
        if ids.windows(2).any(|pair| pair[0] == pair[1]) {
            violation!("queue {index}: a message recovered at two positions");
        }
        ledger.recovered(index, &ids)?;
        let pager = (recovery.live_count > 0).then(|| Pager {
            cursor: log.recovered_tail(recovery),
            delivered: recovery.delivered.clone(),
            all_redelivered: true,
        });
        let core = QueueCore::new(QueueState::with_paged(recovery.next_position, recovery.live_count), Limits::NONE, Some(WINDOW));
        Ok(self.queue(index, name, log, core, pager, live))
    }

    fn queue(
        &self,
        index: usize,
        name: &str,
        log: QueueLog,
        core: QueueCore<Simulated>,
        pager: Option<Pager>,
        live: BTreeMap<u64, MessageId>,
    ) -> Queue {
        let log: SharedLog = Arc::new(Mutex::new(log));
        self.syncer.handle().watch(log.clone());
        Queue {
            index,
            name: name.to_string(),
            file_system: self.file_system.clone(),
            log,
            core,
            pager,
            live,
            consumers: Vec::new(),
            settles_unflushed: Vec::new(),
            definition_pending: None,
        }
    }

    fn failure(&self, what: &str, error: StorageError) -> Halt {
        storage_failure(&self.file_system, what, error)
    }

    /// queue.declare of a new durable classic queue `name` (incarnation `index`), as the broker
    /// starts one (`Broker::declare_queue_unwaited` with `ClassicStorage::create`): the log made,
    /// the queue in the node (other channels publish to it from now on), its definition
    /// submitted. [`Node::declare_answered`] waits for the definition and answers.
    pub fn declare_submitted(&mut self, name: &str, index: usize) -> Result<(), Halt> {
        let directory = queues_directory().join(name);
        // `ClassicStorage::create`: a queue deleted since the last checkpoint left writes in the
        // journal that a replay would put into this directory; a checkpoint clears them first.
        let taken = match self.sabotage {
            Sabotage::ReuseWithoutCheckpoint => None,
            _ => self.syncer.handle().take_deleted_logs_if(&directory),
        };
        if let Some(deleted) = taken {
            if !self.checkpoint_journal()? {
                self.syncer.handle().restore_deleted_logs(deleted);
                violation!("a checkpoint failed without a fault");
            }
        }
        // A new queue starts with an empty log, whatever an older queue of the same name left
        // behind (the broker ignores the outcome of this removal).
        let _ = self.file_system.shared().remove_dir_all(&directory);
        let (mut log, _) = QueueLog::open_with_cache(&directory, self.segment_bytes, self.cache.clone())
            .map_err(|error| self.failure("creating a queue log", error))?;
        let core = QueueCore::new(QueueState::new(0), Limits::NONE, Some(WINDOW));
        log.use_journal();
        let mut queue = self.queue(index, name, log, core, None, BTreeMap::new());
        queue.definition_pending = Some(self.definitions.submit(DefinitionChange::PutQueue(queue_record(name))));
        self.queues.push(queue);
        Ok(())
    }

    /// The end of the declare of the queue at `slot` (see [`Node::declare_submitted`]): its
    /// definition waited for, declare-ok; then its queue.bind from [`EXCHANGE`] (`Broker::bind`),
    /// the binding submitted and waited for, bind-ok.
    pub fn declare_answered(&mut self, slot: usize, catalog: &mut Catalog) -> Result<(), Halt> {
        let (index, name) = (self.queues[slot].index, self.queues[slot].name.clone());
        if let Some(ticket) = self.queues[slot].definition_pending.take() {
            self.definitions.wait(ticket).map_err(|error| self.failure("writing a queue's definition", error))?;
        }
        catalog.set(index, Lifecycle::Declared);
        self.definitions
            .apply(DefinitionChange::PutBinding(binding_record(&name)))
            .map_err(|error| self.failure("writing a binding's definition", error))?;
        catalog.bound(index);
        Ok(())
    }

    /// queue.delete of the queue at `slot`, as `Broker::remove_queue_quietly` and
    /// `QueueRuntime::delete` do it; delete-ok once it returns.
    pub fn delete(&mut self, slot: usize, catalog: &mut Catalog, ledger: &mut Ledger) -> Result<(), Halt> {
        let queue = self.queues.remove(slot);
        catalog.set(queue.index, Lifecycle::Deleting);
        let change = DefinitionChange::DeleteQueue { vhost: VHOST.to_string(), name: queue.name.clone() };
        let ticket = self.definitions.submit(change);
        if self.sabotage == Sabotage::DeleteLogFirst {
            queue.log.lock().delete().map_err(|error| self.failure("deleting a queue's log", error))?;
        }
        // The deletion is durable in the definitions before the log goes: the other way round, a
        // crash between the two brought the queue back without its messages.
        self.definitions.wait(ticket).map_err(|error| self.failure("writing a queue's deletion", error))?;
        // The broker logs a failed log deletion and carries on; the power going explains one here.
        if self.sabotage != Sabotage::DeleteLogFirst {
            queue.log.lock().delete().map_err(|error| self.failure("deleting a queue's log", error))?;
        }
        self.syncer.handle().note_deleted_log(&queues_directory().join(&queue.name));
        catalog.set(queue.index, Lifecycle::Deleted);
        ledger.queue_gone(queue.index);
        Ok(())
    }

    /// A journal checkpoint of every log, waited for as `Syncer::checkpoint` waits (stepped):
    /// whether it made everything durable; a crash point on the way halts the step.
    fn checkpoint_journal(&mut self) -> Result<bool, Halt> {
        let outcome = Arc::new(Mutex::new(None));
        let reported = outcome.clone();
        let logs = self.queues.iter().map(|queue| queue.log.clone()).collect();
        self.syncer.handle().checkpoint_then(logs, Box::new(move |durable| *reported.lock() = Some(durable)));
        for _ in 0..CHECKPOINT_STEPS_MAX {
            if let Some(durable) = *outcome.lock() {
                if !durable && self.file_system.crashed().is_some() {
                    return Err(Halt::Crashed);
                }
                return Ok(durable);
            }
            if !self.syncer.step(false) && !self.syncer.run_checkpoint() && self.file_system.crashed().is_some() {
                return Err(Halt::Crashed);
            }
        }
        violation!("a checkpoint did not finish in {CHECKPOINT_STEPS_MAX} steps of the syncer")
    }

    /// A new snapshot of the definitions and a fresh change log, as a graceful shutdown writes.
    pub fn compact_definitions(&mut self) -> Result<(), Halt> {
        self.definitions.compact().map_err(|error| self.failure("compacting the definitions", error))
    }
}

/// After the start's clean-up, every log directory belongs to a queue the definitions hold, or
/// is a deleted one the janitor removes: a log without its definition is found, never left.
fn check_no_orphaned_logs(file_system: &MemoryFileSystem, queue_names: &BTreeSet<String>) -> Result<(), Halt> {
    use storage::file_system::FileSystem;
    let names = match file_system.list_directory(&queues_directory()) {
        Ok(names) => names,
        Err(source) => {
            let error = StorageError::Io { path: queues_directory().display().to_string(), source };
            return Err(storage_failure(file_system, "listing the queues", error));
        }
    };
    for name in names {
        if !queue_names.contains(&name) && !name.ends_with(".deleted") {
            violation!("the log directory {name} has no definition and was left after the start");
        }
    }
    Ok(())
}

impl Queue {
    /// Enqueues a publish and asks the syncer for its confirm, as a channel does: into a queue
    /// whose declare is in flight, once its definition is durable too (the channel waits for the
    /// declare's ticket, `publish.rs`'s `enqueue`).
    pub fn publish(
        &mut self,
        message: Simulated,
        now_ms: u64,
        node: (&SteppedSyncer, &DefinitionsStore),
        sink: Arc<SharedOutbox>,
        sabotage: Sabotage,
    ) -> Result<(), Halt> {
        let (syncer, definitions) = node;
        let id = message.id;
        let ttl_ms = message.ttl_ms;
        let mut effects = Vec::new();
        let enqueue = Command::Enqueue { message: message.clone(), persistent: true, own_ttl_ms: ttl_ms };
        let reply = self.core.apply(enqueue, now_ms, &mut |_| true, &mut effects);
        if reply != Reply::Ok {
            violation!("queue {}: enqueue answered {reply:?} without limits", self.index);
        }
        for effect in effects {
            match effect {
                Effect::LogAppend { position, persistent: true, paged, expires_at_ms } => {
                    let location: RecordLocation = self.log.lock().append_publish(position, &message.message, true, expires_at_ms);
                    if paged && self.pager.is_none() {
                        self.pager =
                            Some(Pager { cursor: TailCursor::new(location, position), delivered: RangeSet::new(), all_redelivered: false });
                    }
                    self.live.insert(position, id);
                }
                other => violation!("queue {}: enqueue asked for {other:?}", self.index),
            }
        }
        if sabotage != Sabotage::ConfirmBeforeDefinition {
            if let Some(ticket) = self.definition_pending.as_ref().filter(|ticket| !ticket.is_durable()) {
                definitions
                    .wait(ticket.clone())
                    .map_err(|error| storage_failure(&self.file_system, "writing the definition of a queue published to", error))?;
            }
        }
        let confirm = Confirm { sink, delivery_tag: id, accepted: true };
        syncer.handle().confirm(vec![self.log.clone()], vec![confirm]);
        Ok(())
    }

    /// Delivers what the consumers can take.
    pub fn dispatch(&mut self, now_ms: u64, ledger: &mut Ledger, sabotage: Sabotage) -> Result<(), Halt> {
        let core_now_ms = now_ms + sabotage.expiry_shift_ms();
        for _ in 0..DISPATCH_DELIVERIES_MAX {
            let mut effects = Vec::new();
            let reply = self.core.apply(Command::DispatchOne, core_now_ms, &mut |_| true, &mut effects);
            self.perform(effects, now_ms, ledger, sabotage)?;
            if !matches!(reply, Reply::Delivered | Reply::PageInFirst) {
                break;
            }
        }
        Ok(())
    }

    /// Drops the expired messages at the head.
    pub fn expire(&mut self, now_ms: u64, ledger: &mut Ledger, sabotage: Sabotage) -> Result<(), Halt> {
        let mut effects = Vec::new();
        self.core.apply(Command::Expire, now_ms + sabotage.expiry_shift_ms(), &mut |_| true, &mut effects);
        self.perform(effects, now_ms, ledger, sabotage)
    }

    /// A consumer settles (`Some`: ack or reject) or requeues (`None`) the delivery at `index`.
    pub fn settle(
        &mut self,
        consumer: usize,
        index: usize,
        how: Option<Settlement>,
        now_ms: u64,
        ledger: &mut Ledger,
        sabotage: Sabotage,
    ) -> Result<(), Halt> {
        let delivery = self.consumers[consumer].unacked.remove(index);
        let command = match how {
            Some(how) => {
                ledger.settle(delivery.id, how)?;
                self.live.remove(&delivery.position);
                self.settles_unflushed.push(delivery.id);
                Command::Settle { position: delivery.position }
            }
            None => Command::Requeue { position: delivery.position },
        };
        let mut effects = Vec::new();
        self.core.apply(command, now_ms, &mut |_| true, &mut effects);
        self.perform(effects, now_ms, ledger, sabotage)
    }

    /// Adds a consumer with `prefetch`.
    pub fn add_consumer(&mut self, id: ConsumerId, prefetch: u32) -> Result<(), Halt> {
        let add = Command::AddConsumer { consumer: id, priority: 0, exclusive: false, prefetch, no_ack: false };
        let reply = self.core.apply(add, 0, &mut |_| true, &mut Vec::new());
        if reply != Reply::Ok {
            violation!("queue {}: basic.consume answered {reply:?}", self.index);
        }
        self.consumers.push(Consumer { id, unacked: Vec::new() });
        Ok(())
    }

    /// The cheap invariants, after every step: the core holds exactly the messages the
    /// simulator knows to be in the queue, and so does the ledger.
    pub fn check_counts(&self, ledger: &Ledger) -> Result<(), Violation> {
        let messages = self.core.messages();
        let held = (messages.ready_count() + messages.unacked_count()) as u64;
        if held != self.live.len() as u64 || ledger.live_in(self.index) != held {
            violation!(
                "queue {}: the core holds {held} messages, the simulator knows {} in the queue and the ledger {} live",
                self.index,
                self.live.len(),
                ledger.live_in(self.index)
            );
        }
        let unacked: usize = self.consumers.iter().map(|consumer| consumer.unacked.len()).sum();
        if unacked != messages.unacked_count() {
            violation!("queue {}: consumers hold {unacked} deliveries, the core {} unacked", self.index, messages.unacked_count());
        }
        Ok(())
    }

    fn perform(&mut self, effects: Vec<Effect<Simulated>>, now_ms: u64, ledger: &mut Ledger, sabotage: Sabotage) -> Result<(), Halt> {
        for effect in effects {
            match effect {
                Effect::Deliver { consumer: Some(consumer), position, queued, .. } => {
                    let id = queued.message.id;
                    if self.live.get(&position) != Some(&id) {
                        violation!(
                            "queue {}: delivered {id:x} at position {position}, which holds {:x?}",
                            self.index,
                            self.live.get(&position)
                        );
                    }
                    if self.consumers.len() == 1 && !queued.redelivered {
                        ledger.first_delivery_in_order(self.index, id)?;
                    }
                    let published_at_ms = ledger.get(id).map_or(0, |publish| publish.published_at_ms);
                    if let Some(ttl_ms) = queued.message.ttl_ms.filter(|ttl_ms| now_ms >= published_at_ms + ttl_ms) {
                        violation!(
                            "queue {}: {id:x} delivered at {now_ms} ms, published at {published_at_ms} ms with a TTL of {ttl_ms} ms",
                            self.index
                        );
                    }
                    let Some(holder) = self.consumers.iter_mut().find(|held| held.id == consumer.id) else {
                        violation!("queue {}: delivered to unknown consumer {}", self.index, consumer.id)
                    };
                    holder.unacked.push(Delivery { position, id });
                }
                Effect::LogSettle { position } => {
                    if sabotage != Sabotage::ForgetSettleRecords {
                        self.log.lock().append_settled(position);
                    }
                }
                Effect::LogDelivered { position } => self.log.lock().append_delivered(position),
                Effect::Drop { position, message, reason: queue_core::DeadLetterReason::Expired, logged } => {
                    // The core leaves a dropped message's settle record to its caller.
                    if logged && sabotage != Sabotage::ForgetSettleRecords {
                        self.log.lock().append_settled(position);
                    }
                    let published_at_ms = ledger.get(message.id).map_or(0, |publish| publish.published_at_ms);
                    let ttl_ms = message.ttl_ms.unwrap_or(0);
                    if now_ms < published_at_ms + ttl_ms {
                        violation!(
                            "queue {}: {:x} expired at {now_ms} ms, published at {published_at_ms} ms with a TTL of {ttl_ms} ms",
                            self.index,
                            message.id
                        );
                    }
                    self.live.remove(&position);
                    ledger.settle(message.id, Settlement::Expired)?;
                    self.settles_unflushed.push(message.id);
                }
                Effect::NeedPageIn { messages_max, bytes_max, generation, .. } => {
                    self.page_in(messages_max, bytes_max, generation, now_ms, ledger, sabotage)?
                }
                other => violation!("queue {}: unexpected effect {other:?}", self.index),
            }
        }
        Ok(())
    }

    /// Reads paged messages back into the core, as the server's pager does (at once here: the
    /// simulator is one thread, so the read the core counts as in flight ends before the next step).
    fn page_in(
        &mut self,
        messages_max: usize,
        bytes_max: u64,
        generation: u64,
        now_ms: u64,
        ledger: &mut Ledger,
        sabotage: Sabotage,
    ) -> Result<(), Halt> {
        let Some(pager) = self.pager.as_mut() else { violation!("queue {}: paged messages without a pager", self.index) };
        let batch = {
            let mut log = self.log.lock();
            log.plan_tail_read(&pager.cursor).and_then(|plan| plan.read_with_expiries(&mut pager.cursor, messages_max, bytes_max as usize))
        };
        let batch = match batch {
            Ok(batch) if !batch.is_empty() => batch,
            Ok(_) => violation!("queue {}: {} paged messages missing from the log", self.index, self.core.messages().paged_count()),
            Err(error) => return Err(storage_failure(&self.file_system, "reading paged messages", error)),
        };
        let mut messages = Vec::with_capacity(batch.len());
        for (position, message, recorded) in batch {
            let Some((id, ttl_ms)) = parse_body(&message.body) else { violation!("queue {}: paged in a body never published", self.index) };
            if self.live.get(&position) != Some(&id) {
                violation!("queue {}: paged in {id:x} at position {position}, which holds {:x?}", self.index, self.live.get(&position));
            }
            let redelivered = pager.all_redelivered || pager.delivered.contains(position);
            let simulated = Simulated { id, ttl_ms, message: Arc::new(message) };
            let expiry = match recorded {
                _ if sabotage == Sabotage::ExpiryFromPageIn => PagedExpiry::FromRead { own_ttl_ms: ttl_ms },
                RecordedExpiry::Never => PagedExpiry::Fixed(None),
                RecordedExpiry::AtMs(expires_at_ms) => PagedExpiry::Fixed(Some(expires_at_ms)),
                RecordedExpiry::Unrecorded => violation!("queue {}: {id:x} read back without the expiry its record keeps", self.index),
            };
            messages.push(PagedMessage { position, message: simulated, redelivered, expiry });
        }
        let mut effects = Vec::new();
        self.core.apply(Command::PagedIn { generation, messages }, now_ms, &mut |_| false, &mut effects);
        if self.core.messages().paged_count() == 0 {
            self.pager = None;
        }
        self.perform(effects, now_ms, ledger, sabotage)
    }
}
