//! Group commit: one thread writes every log that has buffered records and fdatasyncs them, then
//! runs the callbacks waiting on those records (publisher confirms). Whatever arrives while a sync
//! runs is covered by the next one, so the number of fsyncs per second stays bounded by the disk,
//! not by the message rate.
//!
//! The syncer's work follows the logs that have something to do, never the number of queues. A
//! batch takes the logs its requests name and those on the *dirty list*, which a watched log joins
//! once (through its [`DirtyMark`]) when it buffers a record no request names: settles, delivered
//! markers, page-in writes. Between batches the thread blocks on its channel, with a timeout only
//! while something waits for a timer: a dirty log ([`IDLE_FLUSH_INTERVAL_MS`]) or, with `--sync
//! interval`, logs written since the last fdatasync. A node of idle queues never wakes it.

use crate::file_system::SharedFileSystem;
use crate::journal::Journal;
use crate::queue_log::{CheckpointFile, PendingSync, QueueLog, SyncDue};
use crate::stream::Stream;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A log shared between its queue and the syncer.
pub type SharedLog = Arc<Mutex<QueueLog>>;

/// A log the syncer remembers between batches without keeping it alive: a deleted queue's log is
/// freed with its queue. While held it also keeps the log's address unique, so addresses can key
/// the syncer's sets.
type WeakLog = Weak<Mutex<QueueLog>>;

/// A stream shared between its queue, its readers and the syncer. A group commit writes its
/// appends, fdatasyncs its segment and index files, then commits them (readers see them) before
/// the batch's confirms go out.
pub type SharedStream = Arc<Stream>;

/// A stream the syncer remembers between batches (`--sync interval`) without keeping it alive.
type WeakStream = Weak<Stream>;

/// Called once the records it waited for are on disk (`true`) or could not be made durable (`false`).
pub type SyncCallback = Box<dyn FnOnce(bool) + Send>;

/// When records are made durable, and so what a publisher confirm promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// fdatasync before every confirm (group-committed). A confirmed message survives a process
    /// crash, an OS crash and a power loss.
    Always,
    /// Confirm once written to the OS; fdatasync every `interval_ms`. A confirmed message survives
    /// a process crash; an OS crash or power loss can lose the last `interval_ms` of them.
    Interval {
        /// Time between fdatasyncs.
        interval_ms: u64,
    },
    /// Confirm once written to the OS and never fdatasync (the OS writes back when it likes). A
    /// confirmed message survives a process crash; an OS crash or power loss can lose any that
    /// the OS had not written back yet (on Linux typically up to 30 s).
    Never,
}

/// How long a record that no request names (a settle, a delivered marker, a publish without a
/// confirm) waits at most on the dirty list before the syncer writes it, when no batch comes first.
pub const IDLE_FLUSH_INTERVAL_MS: u64 = 200;
/// How many requests one group commit takes at most, so callbacks are not delayed without bound.
pub const SYNC_BATCH_REQUESTS_MAX: usize = 65_536;

/// Receives the publisher confirms a group commit settled, in the order they were asked for.
/// One call per sink per batch lets the sink coalesce them (`basic.ack` with `multiple`).
pub trait ConfirmSink: Send + Sync {
    /// `confirms` are (delivery tag, made durable) pairs, tags increasing.
    fn confirm_batch(&self, confirms: &[(u64, bool)]);
}

/// One publisher confirm waiting on a sync.
pub struct Confirm {
    /// Who to tell.
    pub sink: Arc<dyn ConfirmSink>,
    /// The publish's delivery tag.
    pub delivery_tag: u64,
    /// False when the broker already refused the message (a nack that must keep its place).
    pub accepted: bool,
}

/// A sink and the (delivery tag, durable) pairs one batch settled for it.
type SinkConfirms = (Arc<dyn ConfirmSink>, Vec<(u64, bool)>);

struct SyncRequest {
    logs: Vec<SharedLog>,
    /// Streams whose appends the request waits for.
    streams: Vec<SharedStream>,
    callback: Option<SyncCallback>,
    /// Publisher confirms, in the order their publishes arrived (a connection hands over those of
    /// one socket read together).
    confirms: Vec<Confirm>,
    /// Run a journal checkpoint before the callback (graceful shutdown).
    checkpoint: bool,
}

/// What wakes the syncer thread.
enum Command {
    /// Write and sync logs, then settle callbacks and confirms.
    Sync(SyncRequest),
    /// The dirty list went from empty to not empty: flush it within [`IDLE_FLUSH_INTERVAL_MS`].
    Dirty,
    /// The background checkpoint finished: start the next one if the journal is past its size again.
    CheckpointFinished,
}

/// The watched logs that buffered records since the last batch took the list, each once.
type DirtyList = Arc<Mutex<Vec<WeakLog>>>;

/// What the syncer's handles share with the dirty marks of the logs it watches. Only handles hold
/// it strongly, so the channel closes (and the thread ends) when the last handle is dropped,
/// however many logs are still alive.
struct SyncerShared {
    sender: Sender<Command>,
    dirty: DirtyList,
    /// Directories of journaled logs deleted since the last checkpoint asked for by
    /// [`Syncer::take_deleted_logs_if`] (see there).
    deleted_logs: Mutex<HashSet<PathBuf>>,
}

/// How a watched log tells the syncer it has records to write: installed by [`Syncer::watch`],
/// called by the log whenever it buffers a record, under the log's lock.
pub struct DirtyMark {
    log: WeakLog,
    syncer: Weak<SyncerShared>,
    /// Whether the log is on the dirty list already (so a busy log costs one entry per batch).
    listed: bool,
}

impl DirtyMark {
    /// Puts the log on the syncer's dirty list unless it is there already. Wakes the syncer only
    /// when the list was empty, so it can start the flush timer; later logs join that flush.
    pub fn mark(&mut self) {
        if self.listed {
            return;
        }
        self.listed = true;
        let Some(syncer) = self.syncer.upgrade() else { return };
        let was_empty = {
            let mut dirty = syncer.dirty.lock();
            dirty.push(self.log.clone());
            dirty.len() == 1
        };
        if was_empty {
            // The thread is gone only when the process ends; the records are then flushed by the
            // shutdown path or lost with the process, as before any confirm.
            let _ = syncer.sender.send(Command::Dirty);
        }
    }

    /// The syncer is writing the log now: the next record puts it on the list again.
    pub fn clear(&mut self) {
        self.listed = false;
    }
}

impl std::fmt::Debug for DirtyMark {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("DirtyMark").field("listed", &self.listed).finish_non_exhaustive()
    }
}

/// Upper bounds, in microseconds, of the fsync latency histogram's buckets (Prometheus style:
/// each bucket counts syncs at or below its bound; the last one is everything).
pub const FSYNC_LATENCY_BUCKETS_US: [u64; 12] = [100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, u64::MAX];

/// What the syncer has done, for metrics. Counters only grow.
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Group commits run (batches written, with or without fdatasync).
    pub batches: AtomicU64,
    /// Requests (publishes waiting for durability, or flushes) taken by those batches.
    pub requests: AtomicU64,
    /// Logs those batches wrote: it grows with the logs that had work, not with the logs that exist.
    pub logs_written: AtomicU64,
    /// Times the syncer thread woke up: for requests, a dirty log, a finished checkpoint or a
    /// timer. Idle queues add none.
    pub wakeups: AtomicU64,
    /// fdatasync calls made.
    pub fsyncs: AtomicU64,
    /// Total time spent in fdatasync, in microseconds.
    pub fsync_us_total: AtomicU64,
    /// fdatasync calls per latency bucket (see [`FSYNC_LATENCY_BUCKETS_US`]), not cumulative.
    pub fsync_us_buckets: [AtomicU64; FSYNC_LATENCY_BUCKETS_US.len()],
    /// Batches whose write or sync failed (their confirms were nacked).
    pub failures: AtomicU64,
}

impl SyncStats {
    fn record_fsync(&self, elapsed: Duration) {
        let micros = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_us_total.fetch_add(micros, Ordering::Relaxed);
        let bucket = FSYNC_LATENCY_BUCKETS_US.iter().position(|bound| micros <= *bound).unwrap_or(FSYNC_LATENCY_BUCKETS_US.len() - 1);
        self.fsync_us_buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }
}

/// The handle publishers use to ask for durability.
#[derive(Clone)]
pub struct Syncer {
    shared: Arc<SyncerShared>,
    stats: Arc<SyncStats>,
}

impl Syncer {
    /// Starts the syncer thread. With a journal, the logs that use it (see
    /// [`QueueLog::use_journal`]) cost one fdatasync per batch together, the journal's.
    ///
    /// Every file reaches the disk through the file system of the log or journal it belongs to
    /// (see [`crate::file_system`]).
    pub fn start(policy: SyncPolicy, journal: Option<Journal>) -> Syncer {
        let (syncer, worker, receiver) = Syncer::parts(policy, journal, false);
        std::thread::Builder::new()
            .name("lepus-syncer".to_string())
            .spawn(move || worker.run(&receiver))
            .expect("spawning the syncer thread");
        syncer
    }

    /// The handle, the worker that runs its batches and the worker's end of the request channel;
    /// `stepped` workers (the simulator's) run only when stepped.
    fn parts(policy: SyncPolicy, journal: Option<Journal>, stepped: bool) -> (Syncer, Worker, Receiver<Command>) {
        let (sender, receiver) = mpsc::channel();
        let dirty = DirtyList::default();
        let shared = Arc::new(SyncerShared { sender, dirty: dirty.clone(), deleted_logs: Mutex::default() });
        let stats = Arc::new(SyncStats::default());
        let checkpoint = Checkpoint::start(stats.clone(), Arc::downgrade(&shared), stepped);
        let worker = Worker {
            policy,
            journal,
            checkpoint,
            stats: stats.clone(),
            dirty,
            flush_due: None,
            unsynced: HashMap::new(),
            unsynced_streams: HashMap::new(),
            last_sync: Instant::now(),
            stepped,
        };
        (Syncer { shared, stats }, worker, receiver)
    }

    /// What the syncer has done so far.
    pub fn stats(&self) -> &SyncStats {
        &self.stats
    }

    /// Hands a request to the syncer thread; gives it back if that thread is gone.
    fn send(&self, request: SyncRequest) -> Result<(), SyncRequest> {
        match self.shared.sender.send(Command::Sync(request)) {
            Ok(()) => Ok(()),
            Err(mpsc::SendError(Command::Sync(request))) => Err(request),
            Err(mpsc::SendError(_)) => unreachable!("a sync request comes back as one"),
        }
    }

    /// Writes and syncs `logs`, then runs a journal checkpoint (every segment written since the
    /// last one synced, the journal emptied), and waits for it: a graceful shutdown leaves nothing
    /// for the next start to replay. Returns whether everything was made durable.
    pub fn checkpoint(&self, logs: Vec<SharedLog>) -> bool {
        let (done, wait) = mpsc::channel();
        let callback: SyncCallback = Box::new(move |durable| {
            let _ = done.send(durable);
        });
        if self.send(SyncRequest { logs, streams: Vec::new(), callback: Some(callback), confirms: Vec::new(), checkpoint: true }).is_err() {
            return false;
        }
        wait.recv().unwrap_or(false)
    }

    /// Notes that the journaled log in `directory` was deleted: until the next checkpoint the
    /// journal holds its writes, and a replay after a crash would write them into a new log made
    /// in the same directory (a queue declared anew under the deleted one's name would recover
    /// the deleted queue's messages).
    pub fn note_deleted_log(&self, directory: &Path) {
        self.shared.deleted_logs.lock().insert(directory.to_path_buf());
    }

    /// Before a new log is made in `directory`: if a deleted log lived there (see
    /// [`Syncer::note_deleted_log`]), takes every noted directory, which the caller clears of the
    /// journal with a checkpoint ([`Syncer::checkpoint`]) before it makes the log; it hands
    /// them back with [`Syncer::restore_deleted_logs`] if that checkpoint fails.
    pub fn take_deleted_logs_if(&self, directory: &Path) -> Option<HashSet<PathBuf>> {
        let mut deleted = self.shared.deleted_logs.lock();
        deleted.contains(directory).then(|| std::mem::take(&mut *deleted))
    }

    /// Hands back directories [`Syncer::take_deleted_logs_if`] took, whose checkpoint failed.
    pub fn restore_deleted_logs(&self, directories: HashSet<PathBuf>) {
        self.shared.deleted_logs.lock().extend(directories);
    }

    /// As [`Syncer::checkpoint`], without waiting: `callback` gets whether everything was made
    /// durable.
    pub fn checkpoint_then(&self, logs: Vec<SharedLog>, callback: SyncCallback) {
        if let Err(request) =
            self.send(SyncRequest { logs, streams: Vec::new(), callback: Some(callback), confirms: Vec::new(), checkpoint: true })
        {
            if let Some(callback) = request.callback {
                callback(false);
            }
        }
    }

    /// Makes the records buffered in `logs` durable, then calls `callback`.
    pub fn sync(&self, logs: Vec<SharedLog>, callback: Option<SyncCallback>) {
        if let Err(request) = self.send(SyncRequest { logs, streams: Vec::new(), callback, confirms: Vec::new(), checkpoint: false }) {
            // The syncer only stops when the process does; refuse the confirm rather than lie.
            if let Some(callback) = request.callback {
                callback(false);
            }
        }
    }

    /// Makes the syncer write `log` whenever it buffers records no request names (at least every
    /// [`IDLE_FLUSH_INTERVAL_MS`], or with the next batch), and whatever it holds now. Every log
    /// must be watched from its queue's start: records appended without a sync request of their
    /// own (settles, delivered markers) are otherwise never written, journaled or synced, and a
    /// journaled log keeps every write a page-in made in memory for the journal (a recovered
    /// backlog drained without a publish grew the broker by the settle and delivered records of
    /// every message). Costs nothing while the log stays idle.
    pub fn watch(&self, log: SharedLog) {
        let mark = DirtyMark { log: Arc::downgrade(&log), syncer: Arc::downgrade(&self.shared), listed: false };
        log.lock().set_dirty_mark(mark);
    }

    /// Makes the records buffered in `logs` durable (none: only keeps the confirms' place in
    /// line), then hands the confirms to their sinks with the others of the same batch.
    pub fn confirm(&self, logs: Vec<SharedLog>, confirms: Vec<Confirm>) {
        if let Err(request) = self.send(SyncRequest { logs, streams: Vec::new(), callback: None, confirms, checkpoint: false }) {
            for confirm in request.confirms {
                confirm.sink.confirm_batch(&[(confirm.delivery_tag, false)]);
            }
        }
    }
}

impl Syncer {
    /// As [`Syncer::sync`], also writing, syncing and committing the appends of `streams`.
    pub fn sync_with_streams(&self, logs: Vec<SharedLog>, streams: Vec<SharedStream>, callback: Option<SyncCallback>) {
        if let Err(request) = self.send(SyncRequest { logs, streams, callback, confirms: Vec::new(), checkpoint: false }) {
            if let Some(callback) = request.callback {
                callback(false);
            }
        }
    }

    /// As [`Syncer::confirm`], also writing, syncing and committing the appends of `streams`
    /// before the confirms go out.
    pub fn confirm_with_streams(&self, logs: Vec<SharedLog>, streams: Vec<SharedStream>, confirms: Vec<Confirm>) {
        if let Err(request) = self.send(SyncRequest { logs, streams, callback: None, confirms, checkpoint: false }) {
            for confirm in request.confirms {
                confirm.sink.confirm_batch(&[(confirm.delivery_tag, false)]);
            }
        }
    }
}

/// A syncer without threads, for the simulator: the same batches, journal and checkpoints as
/// [`Syncer::start`]'s, each run when the driver calls [`SteppedSyncer::step`] or
/// [`SteppedSyncer::run_checkpoint`], on the driver's thread, so one seed gives one order of
/// file system operations. Its timers never fire on their own: `step(true)` is the timer.
#[cfg(any(test, feature = "test-support"))]
pub struct SteppedSyncer {
    handle: Syncer,
    worker: Worker,
    receiver: Receiver<Command>,
}

#[cfg(any(test, feature = "test-support"))]
impl SteppedSyncer {
    /// A stepped syncer with `journal` (see [`Syncer::start`]).
    pub fn new(policy: SyncPolicy, journal: Option<Journal>) -> SteppedSyncer {
        let (handle, worker, receiver) = Syncer::parts(policy, journal, true);
        SteppedSyncer { handle, worker, receiver }
    }

    /// The handle queues and publishers use, as with a threaded syncer (except
    /// [`Syncer::checkpoint`], which would wait forever: use [`Syncer::checkpoint_then`]).
    pub fn handle(&self) -> &Syncer {
        &self.handle
    }

    /// One wakeup of the syncer: takes the requests waiting and runs their batch; with
    /// `timer_fired`, also flushes the dirty logs (the idle flush). Returns whether it had
    /// anything to take.
    pub fn step(&mut self, timer_fired: bool) -> bool {
        let first = self.receiver.try_recv().ok();
        if first.is_none() && !timer_fired {
            return false;
        }
        self.worker.wake(first, timer_fired, &self.receiver);
        true
    }

    /// Runs the background checkpoint started last, if one waits; returns whether one ran.
    pub fn run_checkpoint(&mut self) -> bool {
        self.worker.checkpoint.run_stepped_job()
    }
}

/// Why the syncer thread stopped waiting.
enum Woken {
    Command(Command),
    Timer,
    /// Every handle is gone.
    Stopped,
}

/// One log of a batch.
struct BatchLog {
    log: SharedLog,
    /// Named by a request, or due for an interval's fdatasync: written and synced even with
    /// nothing buffered. A log only on the dirty list is skipped when a request took its records first.
    unconditional: bool,
}

/// What happened to one log of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogOutcome {
    Skipped,
    Written,
    Failed,
}

/// The syncer thread's state.
struct Worker {
    policy: SyncPolicy,
    journal: Option<Journal>,
    checkpoint: Checkpoint,
    stats: Arc<SyncStats>,
    dirty: DirtyList,
    /// When the dirty list must be flushed at the latest; `None` while it is empty as far as this
    /// thread knows (a [`Command::Dirty`] follows every time it stops being empty).
    flush_due: Option<Instant>,
    /// `--sync interval`: the logs written since the last fdatasync (by address), which the next
    /// one covers.
    unsynced: HashMap<usize, WeakLog>,
    /// The same for streams.
    unsynced_streams: HashMap<usize, WeakStream>,
    last_sync: Instant,
    /// Driven by [`SteppedSyncer`] rather than its own thread.
    stepped: bool,
}

/// The address that identifies a log in the syncer's sets.
fn log_key(log: &SharedLog) -> usize {
    Arc::as_ptr(log) as usize
}

impl Worker {
    fn run(mut self, receiver: &Receiver<Command>) {
        loop {
            let first = match self.wait(receiver) {
                Woken::Stopped => return,
                Woken::Timer => None,
                Woken::Command(command) => Some(command),
            };
            let timer_fired = first.is_none();
            self.wake(first, timer_fired, receiver);
        }
    }

    /// One wakeup: takes `first` and every command waiting behind it, runs a batch when requests
    /// came or a timer is due, and starts a checkpoint when one ended and another is due.
    fn wake(&mut self, first: Option<Command>, timer_fired: bool, receiver: &Receiver<Command>) {
        self.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        let (mut requests, mut dirty_woke, mut checkpoint_finished) = (Vec::new(), false, false);
        let mut take = |command: Command| match command {
            Command::Sync(request) => requests.push(request),
            Command::Dirty => dirty_woke = true,
            Command::CheckpointFinished => checkpoint_finished = true,
        };
        first.into_iter().for_each(&mut take);
        let mut taken = 0;
        while taken < SYNC_BATCH_REQUESTS_MAX {
            match receiver.try_recv() {
                Ok(command) => take(command),
                Err(_) => break,
            }
            taken += 1;
        }
        // A stepped syncer's timers fire when its driver says so, never by the wall clock.
        let timer_due = timer_fired || (!self.stepped && self.deadline().is_some_and(|deadline| deadline <= Instant::now()));
        if !requests.is_empty() || timer_due {
            self.run_batch(requests);
        } else if dirty_woke && self.flush_due.is_none() && !self.dirty.lock().is_empty() {
            self.flush_due = Some(Instant::now() + Duration::from_millis(IDLE_FLUSH_INTERVAL_MS));
        }
        if checkpoint_finished {
            self.start_checkpoint_if_due();
        }
    }

    /// Blocks until a command arrives or, when something waits for a timer, until it is due.
    fn wait(&self, receiver: &Receiver<Command>) -> Woken {
        let received = match self.deadline() {
            None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(deadline) => receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())),
        };
        match received {
            Ok(command) => Woken::Command(command),
            Err(RecvTimeoutError::Timeout) => Woken::Timer,
            Err(RecvTimeoutError::Disconnected) => Woken::Stopped,
        }
    }

    /// The earliest timer: the dirty list's flush, or the interval's fdatasync of written logs.
    fn deadline(&self) -> Option<Instant> {
        let interval_sync = match self.policy {
            SyncPolicy::Interval { interval_ms } if !self.unsynced.is_empty() || !self.unsynced_streams.is_empty() => {
                Some(self.last_sync + Duration::from_millis(interval_ms))
            }
            _ => None,
        };
        self.flush_due.into_iter().chain(interval_sync).min()
    }

    /// One group commit: writes (and, by policy, syncs) the batch's logs, runs a requested
    /// checkpoint, then settles every request with the outcome.
    fn run_batch(&mut self, requests: Vec<SyncRequest>) {
        let due = match self.policy {
            SyncPolicy::Always => SyncDue::Now,
            SyncPolicy::Interval { interval_ms } if self.last_sync.elapsed() >= Duration::from_millis(interval_ms) => SyncDue::Now,
            SyncPolicy::Interval { .. } => SyncDue::Later,
            SyncPolicy::Never => SyncDue::Never,
        };
        let fsync_now = due == SyncDue::Now;
        let logs = self.batch_logs(&requests, fsync_now);
        let streams = self.batch_streams(&requests, fsync_now);
        let journal_pending = self.journal.as_ref().is_some_and(Journal::has_pending);
        if logs.is_empty() && streams.is_empty() && requests.is_empty() && !journal_pending {
            return;
        }
        if fsync_now {
            self.last_sync = Instant::now();
        }
        let (outcomes, journal_synced) = sync_all(&logs, due, self.journal.as_mut(), &mut self.checkpoint, &self.stats);
        // A log that failed (say, no descriptor for its segment) fails only the requests that
        // named it; a failed journal or checkpoint fails the whole batch.
        let failed_logs: HashSet<usize> = logs
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| **outcome == LogOutcome::Failed)
            .map(|(entry, _)| log_key(&entry.log))
            .collect();
        let mut failed_logs = failed_logs;
        for (stream, written) in streams.iter().zip(write_streams(&streams, due, &self.stats)) {
            match written {
                StreamOutcome::Failed => {
                    failed_logs.insert(stream_key(stream));
                }
                StreamOutcome::Written if due == SyncDue::Later => {
                    self.unsynced_streams.insert(stream_key(stream), Arc::downgrade(stream));
                }
                StreamOutcome::Written => {}
            }
        }
        let mut durable = journal_synced;
        if self.journal.as_ref().is_some_and(Journal::has_pending) {
            // The journal keeps the entries of a failed write: try again at the next flush.
            self.flush_due.get_or_insert_with(|| Instant::now() + Duration::from_millis(IDLE_FLUSH_INTERVAL_MS));
        }
        if requests.iter().any(|request| request.checkpoint) {
            if let Some(journal) = self.journal.as_mut() {
                durable &= self.checkpoint.run_now(journal, &self.stats);
            }
        }
        self.remember(&logs, &outcomes, fsync_now);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.requests.fetch_add(requests.len() as u64, Ordering::Relaxed);
        if !durable || !failed_logs.is_empty() {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
        }
        settle(requests, durable, &failed_logs);
        self.start_checkpoint_if_due();
    }

    /// The logs this batch writes, each once: those the requests name, at an interval's
    /// fdatasync those written since the last one, and those on the dirty list (taken, so the
    /// list starts empty again).
    fn batch_logs(&mut self, requests: &[SyncRequest], fsync_now: bool) -> Vec<BatchLog> {
        let mut seen = HashSet::new();
        let mut logs = Vec::new();
        for log in requests.iter().flat_map(|request| &request.logs) {
            if seen.insert(log_key(log)) {
                logs.push(BatchLog { log: log.clone(), unconditional: true });
            }
        }
        let unsynced = if fsync_now { std::mem::take(&mut self.unsynced) } else { HashMap::new() };
        let dirty = std::mem::take(&mut *self.dirty.lock());
        self.flush_due = None;
        let remembered = unsynced.into_values().map(|log| (log, true)).chain(dirty.into_iter().map(|log| (log, false)));
        for (log, unconditional) in remembered {
            // A log dropped since (its queue deleted) has nothing left to write.
            if let Some(log) = log.upgrade() {
                if seen.insert(log_key(&log)) {
                    logs.push(BatchLog { log, unconditional });
                }
            }
        }
        logs
    }

    /// The streams this batch writes, each once: those the requests name and, at an interval's
    /// fdatasync, those written since the last one.
    fn batch_streams(&mut self, requests: &[SyncRequest], fsync_now: bool) -> Vec<SharedStream> {
        let mut seen = HashSet::new();
        let mut streams = Vec::new();
        for stream in requests.iter().flat_map(|request| &request.streams) {
            if seen.insert(stream_key(stream)) {
                streams.push(stream.clone());
            }
        }
        if fsync_now {
            for stream in std::mem::take(&mut self.unsynced_streams).into_values().filter_map(|stream| stream.upgrade()) {
                if seen.insert(stream_key(&stream)) {
                    streams.push(stream);
                }
            }
        }
        streams
    }

    /// Keeps what a later batch owes the batch's logs: with `--sync interval`, the fdatasync of
    /// those written without one; for those whose write failed, another attempt.
    fn remember(&mut self, logs: &[BatchLog], outcomes: &[LogOutcome], fsync_now: bool) {
        let interval = matches!(self.policy, SyncPolicy::Interval { .. });
        for (entry, outcome) in logs.iter().zip(outcomes) {
            match outcome {
                LogOutcome::Written if interval && !fsync_now => {
                    self.unsynced.insert(log_key(&entry.log), Arc::downgrade(&entry.log));
                }
                LogOutcome::Failed => {
                    // Its records stay buffered; try again at the next flush.
                    self.dirty.lock().push(Arc::downgrade(&entry.log));
                    self.flush_due.get_or_insert_with(|| Instant::now() + Duration::from_millis(IDLE_FLUSH_INTERVAL_MS));
                }
                _ => {}
            }
        }
    }

    /// Starts a background checkpoint when the journal is past its size (unless one runs; its
    /// end wakes this thread to look again).
    fn start_checkpoint_if_due(&mut self) {
        if let Some(journal) = self.journal.as_mut() {
            // Not while a failed write keeps entries pending: they belong to the current file,
            // and rotating under them broke the journal's invariant (a panic of this thread).
            if journal.needs_checkpoint() && !journal.has_pending() {
                self.checkpoint.start_background(journal);
            }
        }
    }
}

/// The address that identifies a stream in the syncer's sets (never a log's: both are live
/// allocations while the batch holds them).
fn stream_key(stream: &SharedStream) -> usize {
    Arc::as_ptr(stream) as *const () as usize
}

/// What happened to one stream of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamOutcome {
    Written,
    Failed,
}

/// Writes each stream's appends, fdatasyncs its files when `due` is now, then commits them.
/// A failed write keeps the appends for the next batch; a failed sync keeps the files for it.
fn write_streams(streams: &[SharedStream], due: SyncDue, stats: &SyncStats) -> Vec<StreamOutcome> {
    let mut outcomes = Vec::with_capacity(streams.len());
    for stream in streams {
        stats.logs_written.fetch_add(1, Ordering::Relaxed);
        let written = match stream.write_pending(due) {
            Ok(written) => written,
            Err(error) => {
                tracing::error!(%error, directory = %stream.directory().display(), "writing a stream failed; confirms for it are nacked");
                outcomes.push(StreamOutcome::Failed);
                continue;
            }
        };
        let synced = written.sync_now.iter().try_for_each(|file| timed(stats, || file.sync()));
        match synced {
            Ok(()) => {
                if let Some(point) = written.commit {
                    stream.commit(point);
                }
                outcomes.push(StreamOutcome::Written);
            }
            Err(error) => {
                tracing::error!(%error, directory = %stream.directory().display(), "syncing a stream failed; confirms for it are nacked");
                stream.sync_failed(written.sync_now);
                outcomes.push(StreamOutcome::Failed);
            }
        }
    }
    outcomes
}

/// Runs the callbacks and hands each sink its confirms, one call per sink, in request order. A
/// request is durable when the batch is and none of the logs it names failed.
fn settle(requests: Vec<SyncRequest>, batch_durable: bool, failed_logs: &HashSet<usize>) {
    let mut confirms: Vec<SinkConfirms> = Vec::new();
    // A sink's index in `confirms`, by address: a batch may carry thousands of channels' confirms.
    let mut sink_indexes: HashMap<usize, usize> = HashMap::new();
    for request in requests {
        let durable = batch_durable
            && !request.logs.iter().any(|log| failed_logs.contains(&log_key(log)))
            && !request.streams.iter().any(|stream| failed_logs.contains(&stream_key(stream)));
        if let Some(callback) = request.callback {
            callback(durable);
        }
        for confirm in request.confirms {
            let settled = (confirm.delivery_tag, confirm.accepted && durable);
            let key = Arc::as_ptr(&confirm.sink) as *const () as usize;
            match sink_indexes.entry(key) {
                std::collections::hash_map::Entry::Occupied(index) => confirms[*index.get()].1.push(settled),
                std::collections::hash_map::Entry::Vacant(index) => {
                    index.insert(confirms.len());
                    confirms.push((confirm.sink, vec![settled]));
                }
            }
        }
    }
    for (sink, tags) in confirms {
        sink.confirm_batch(&tags);
    }
}

/// Whether a background checkpoint runs; the syncer's shutdown checkpoint waits for it to end.
#[derive(Default)]
struct InFlight {
    running: Mutex<bool>,
    finished: Condvar,
}

impl InFlight {
    fn is_running(&self) -> bool {
        *self.running.lock()
    }

    fn set_running(&self, running: bool) {
        *self.running.lock() = running;
        if !running {
            self.finished.notify_all();
        }
    }

    fn wait_until_finished(&self) {
        let mut running = self.running.lock();
        while *running {
            self.finished.wait(&mut running);
        }
    }
}

/// The logs whose segment writes are in the current journal file and not yet synced, and the
/// checkpoint running in the background, if any.
///
/// A periodic checkpoint must not stall confirms: syncing 64 MiB of segments takes tens of
/// milliseconds. So the syncer rotates the journal (new entries go to a new file), hands the
/// segment files of the finished period to the checkpoint thread, and goes on; that thread syncs
/// them and only then deletes the journal files of the period. One runs at a time; files that did
/// not sync come back and join the next one, whose success deletes every older journal file.
struct Checkpoint {
    /// In the order they were first noted (so a checkpoint syncs its files in an order a
    /// simulator's seed can replay), each once: `noted` holds their addresses, so noting a log
    /// costs the same however many were noted.
    logs: Vec<SharedLog>,
    noted: HashSet<usize>,
    in_flight: Arc<InFlight>,
    failed_files: Arc<Mutex<Vec<CheckpointFile>>>,
    jobs: Sender<CheckpointJob>,
    /// A stepped syncer's jobs, run when its driver says (or before a checkpoint it waits for).
    stepped_jobs: Option<(Receiver<CheckpointJob>, CheckpointRunner)>,
}

/// What runs a checkpoint job and reports its end.
struct CheckpointRunner {
    stats: Arc<SyncStats>,
    in_flight: Arc<InFlight>,
    failed_files: Arc<Mutex<Vec<CheckpointFile>>>,
    syncer: Weak<SyncerShared>,
}

impl CheckpointRunner {
    /// Syncs the job's segment files, then deletes the journal files they make redundant; files
    /// that did not sync wait for the next checkpoint. Tells the syncer it ended.
    fn run(&self, job: CheckpointJob) {
        let failed = sync_files(job.files, &self.stats);
        if failed.is_empty() {
            if let Err(error) = crate::journal::remove_files_before(&*job.file_system, &job.directory, job.sequence) {
                tracing::error!(%error, "deleting checkpointed journal files failed; a later checkpoint deletes them");
            }
        } else {
            self.failed_files.lock().extend(failed);
        }
        self.in_flight.set_running(false);
        if let Some(syncer) = self.syncer.upgrade() {
            let _ = syncer.sender.send(Command::CheckpointFinished);
        }
    }
}

/// Segment files to sync, then journal files older than `sequence` to delete.
struct CheckpointJob {
    files: Vec<CheckpointFile>,
    sequence: u64,
    directory: std::path::PathBuf,
    file_system: SharedFileSystem,
}

impl Checkpoint {
    /// Starts the checkpoint thread, which tells the syncer (while it has handles) when a
    /// checkpoint ends, so a journal already past its size again gets the next one.
    fn start(stats: Arc<SyncStats>, syncer: Weak<SyncerShared>, stepped: bool) -> Checkpoint {
        let (jobs, receiver) = mpsc::channel::<CheckpointJob>();
        let in_flight = Arc::new(InFlight::default());
        let failed_files = Arc::new(Mutex::new(Vec::new()));
        let runner = CheckpointRunner { stats, in_flight: in_flight.clone(), failed_files: failed_files.clone(), syncer };
        let stepped_jobs = if stepped {
            Some((receiver, runner))
        } else {
            std::thread::Builder::new()
                .name("lepus-checkpoint".to_string())
                .spawn(move || receiver.into_iter().for_each(|job| runner.run(job)))
                .expect("spawning the checkpoint thread");
            None
        };
        Checkpoint { logs: Vec::new(), noted: HashSet::new(), in_flight, failed_files, jobs, stepped_jobs }
    }

    fn note(&mut self, log: &SharedLog) {
        if self.noted.insert(log_key(log)) {
            self.logs.push(log.clone());
        }
    }

    /// A stepped syncer's queued background checkpoint, run now; whether there was one.
    fn run_stepped_job(&self) -> bool {
        let Some((jobs, runner)) = self.stepped_jobs.as_ref() else { return false };
        match jobs.try_recv() {
            Ok(job) => {
                runner.run(job);
                true
            }
            Err(_) => false,
        }
    }

    /// The segment files written since the last checkpoint, and those a failed one left.
    fn take_files(&mut self) -> Vec<CheckpointFile> {
        let mut files = std::mem::take(&mut *self.failed_files.lock());
        self.noted.clear();
        for log in self.logs.drain(..) {
            let taken = log.lock().take_checkpoint_files();
            files.extend(taken);
        }
        files
    }

    /// Starts a background checkpoint unless one is running.
    fn start_background(&mut self, journal: &mut Journal) {
        if self.in_flight.is_running() {
            return;
        }
        let files = self.take_files();
        match journal.rotate() {
            Ok(sequence) => {
                self.in_flight.set_running(true);
                let job = CheckpointJob {
                    files,
                    sequence,
                    directory: journal.directory().to_path_buf(),
                    file_system: journal.file_system().clone(),
                };
                if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
                    self.in_flight.set_running(false);
                    self.failed_files.lock().extend(job.files);
                }
            }
            Err(error) => {
                tracing::error!(%error, "starting a new journal file failed; the current one keeps growing until it works");
                self.failed_files.lock().extend(files);
            }
        }
    }

    /// A checkpoint the caller waits for (graceful shutdown): after the running one, every
    /// segment synced and every older journal file deleted.
    fn run_now(&mut self, journal: &mut Journal, stats: &SyncStats) -> bool {
        // A stepped syncer has no thread to end the running one: it runs here, first.
        while self.run_stepped_job() {}
        self.in_flight.wait_until_finished();
        let files = self.take_files();
        let failed = sync_files(files, stats);
        if !failed.is_empty() {
            self.failed_files.lock().extend(failed);
            return false;
        }
        if let Err(error) = journal.start_new_file() {
            tracing::error!(%error, "starting a new journal file failed; the current one keeps growing until it works");
            return false;
        }
        true
    }
}

/// fdatasyncs every file (each opened for its sync unless cached); returns those that failed.
fn sync_files(files: Vec<CheckpointFile>, stats: &SyncStats) -> Vec<CheckpointFile> {
    let mut failed = Vec::new();
    for file in files {
        if let Err(error) = file.sync_with(|opened| timed(stats, || opened.sync_data())) {
            tracing::error!(%error, "syncing a segment at a journal checkpoint failed; the journal keeps its entries");
            failed.push(file);
        }
    }
    failed
}

/// Makes a sync, counting the call and its time in the stats.
fn timed(stats: &SyncStats, sync: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let synced = sync();
    stats.record_fsync(started.elapsed());
    synced
}

/// Writes every log's buffered records, appends the journaled logs' writes to the journal and
/// syncs it once; when `due` is [`SyncDue::Now`], also syncs what the others (and directory
/// changes) need. Returns each log's outcome and whether the journal (if it had anything to
/// write) was written and synced.
fn sync_all(
    logs: &[BatchLog],
    due: SyncDue,
    mut journal: Option<&mut Journal>,
    checkpoint: &mut Checkpoint,
    stats: &SyncStats,
) -> (Vec<LogOutcome>, bool) {
    let mut outcomes = Vec::with_capacity(logs.len());
    let mut directories = BatchDirectories::default();
    for (index, entry) in logs.iter().enumerate() {
        let written = {
            let mut log = entry.log.lock();
            if !entry.unconditional && !log.has_pending() {
                outcomes.push(LogOutcome::Skipped);
                continue;
            }
            log.write_pending(due)
        };
        stats.logs_written.fetch_add(1, Ordering::Relaxed);
        let written = written.map(|written| {
            if !written.journal.is_empty() {
                checkpoint.note(&entry.log);
            }
            match journal.as_deref_mut() {
                Some(journal) => written.journal.iter().for_each(|write| journal.append(&write.target, write.offset, &write.bytes)),
                None => assert!(written.journal.is_empty(), "a journaled log needs the syncer's journal"),
            }
            written.sync_now
        });
        // Empty unless `due` is `Now`: the log keeps (or, with `--sync never`, forgets) them.
        let result = match written {
            Ok(syncs) => {
                let files = directories.take_directories(index, syncs);
                match files.iter().try_for_each(|file: &PendingSync| timed(stats, || file.sync())) {
                    Ok(()) => Ok(()),
                    Err(error) => {
                        // Owed again: the retry must sync them before it confirms anything.
                        entry.log.lock().sync_failed(files);
                        Err(error.to_string())
                    }
                }
            }
            Err(error) => Err(error.to_string()),
        };
        outcomes.push(match result {
            Ok(()) => LogOutcome::Written,
            Err(error) => {
                tracing::error!(%error, "writing or syncing a queue log failed; confirms for it are nacked");
                LogOutcome::Failed
            }
        });
    }
    directories.sync(logs, &mut outcomes, stats);
    if let Some(journal) = journal.filter(|journal| journal.has_pending()) {
        let started = std::time::Instant::now();
        let synced = journal.write_and_sync();
        stats.record_fsync(started.elapsed());
        if let Err(error) = synced {
            tracing::error!(%error, "writing or syncing the journal failed; this batch's confirms are nacked");
            return (outcomes, false);
        }
    }
    (outcomes, true)
}

/// The directories a batch's logs need synced, each synced once after every log of the batch
/// has written: the first message of each of many new queues creates its directory in the one
/// directory of queues, which was synced once per queue (two directory fsyncs a new queue, one
/// of a directory of 100,000 entries), so publishing to 100,000 fresh queues ran at the speed of
/// those fsyncs. A directory's name changes made by any log of the batch are made before it is
/// synced, and nothing of the batch is confirmed before it is.
/// The most directories a batch syncs one by one; past it, one `syncfs` of their file system
/// (each directory fsync of a new queue's directory waits for the device, about 1 ms here: 16 of
/// them cost more than one file-system sync of what the batch and the page cache hold).
const BATCH_DIRECTORY_SYNCS_MAX: usize = 16;

#[derive(Default)]
struct BatchDirectories {
    /// Each directory, its sync, and the indexes (in the batch) of the logs that need it. Ordered,
    /// so that a batch's file system operations come in the same order every time (the power-cut
    /// simulator replays a seed by counting them).
    pending: BTreeMap<PathBuf, (PendingSync, Vec<usize>)>,
}

impl BatchDirectories {
    /// Keeps the directory syncs of log `index`, returns its file syncs.
    fn take_directories(&mut self, index: usize, syncs: Vec<PendingSync>) -> Vec<PendingSync> {
        let mut files = Vec::with_capacity(syncs.len());
        for sync in syncs {
            match &sync {
                PendingSync::Directory(_, directory) => {
                    let owners = &mut self.pending.entry(directory.clone()).or_insert_with(|| (sync, Vec::new())).1;
                    owners.push(index);
                }
                PendingSync::File(_) => files.push(sync),
            }
        }
        files
    }

    /// Syncs each directory once; a failed one fails every log that needed it, which owes it again.
    /// Past [`BATCH_DIRECTORY_SYNCS_MAX`] directories, one `syncfs` makes them all durable.
    fn sync(self, logs: &[BatchLog], outcomes: &mut [LogOutcome], stats: &SyncStats) {
        if self.pending.len() > BATCH_DIRECTORY_SYNCS_MAX {
            if let Some((directory, (PendingSync::Directory(cache, _), _))) = self.pending.iter().next() {
                let synced = cache.with_a_descriptor(|| cache.file_system().sync_file_system(directory));
                if timed(stats, || synced).is_ok() {
                    return;
                }
            }
        }
        for (directory, (sync, owners)) in self.pending {
            let Err(error) = timed(stats, || sync.sync()) else { continue };
            tracing::error!(%error, directory = %directory.display(), "syncing a queue directory failed; confirms for its logs are nacked");
            let PendingSync::Directory(cache, _) = &sync else { continue };
            for owner in owners {
                logs[owner].log.lock().sync_failed(vec![PendingSync::Directory(cache.clone(), directory.clone())]);
                outcomes[owner] = LogOutcome::Failed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::{BasicProperties, ContentHeader, ShortStr};
    use broker_core::Message;
    use bytes::Bytes;

    fn message(position: u64) -> Message {
        let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
        let body = format!("m{position}");
        Message {
            exchange: ShortStr::from("x"),
            routing_key: ShortStr::from("k"),
            header: ContentHeader::from_properties(60, body.len() as u64, &properties),
            body: Bytes::from(body),
            published_at_ns: 0,
            bcc_routing_keys: None,
        }
    }

    /// A recovered backlog drained without any publish: the log never comes with a sync request,
    /// only settles and page-ins touch it. Watched, it is still flushed when the syncer is idle,
    /// so the writes kept for the journal do not grow with every message drained.
    #[test]
    fn a_watched_log_that_only_settles_is_flushed_when_idle() {
        let root = std::env::temp_dir().join(format!("lepus-syncer-test-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let directory = root.join("queues").join("q");
        {
            let (mut log, _) = QueueLog::open(&directory, 4096).expect("open");
            for position in 0..200u64 {
                log.append_publish(position, &message(position), true, None);
            }
            log.write_pending(crate::queue_log::SyncDue::Now).expect("write");
        }
        let (journal, _) = Journal::open(&root.join("journal")).expect("journal");
        let syncer = Syncer::start(SyncPolicy::Always, Some(journal));
        let (mut log, recovery) = QueueLog::open(&directory, 4096).expect("reopen");
        log.use_journal();
        let mut cursor = log.recovered_tail(&recovery);
        let log: SharedLog = Arc::new(Mutex::new(log));
        syncer.watch(log.clone());
        loop {
            let mut locked = log.lock();
            let batch = locked.read_tail(&mut cursor, 10, usize::MAX).expect("read");
            if batch.is_empty() {
                break;
            }
            for (position, _) in batch {
                locked.append_delivered(position);
                locked.append_settled(position);
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(20 * IDLE_FLUSH_INTERVAL_MS);
        while log.lock().has_pending() {
            assert!(std::time::Instant::now() < deadline, "the idle syncer never flushed the watched log");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(syncer);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The first writes of new queues in one batch each create a directory in the one directory
    /// of queues: the batch syncs that shared directory once, not once per queue, and confirms
    /// after every sync. Up to [`BATCH_DIRECTORY_SYNCS_MAX`] directories are synced one by one
    /// (each queue's own and the shared one); past it, one `syncfs` covers them all.
    #[test]
    fn a_batch_syncs_the_directories_of_its_new_queues_once() {
        // (queues, syncs expected): per queue its segment's fdatasync, then the directories.
        for (queues, syncs) in [(10u64, 2 * 10 + 1), (40, 40 + 1)] {
            let root = std::env::temp_dir().join(format!("lepus-syncer-test-new-queues-{}-{queues}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            let logs: Vec<SharedLog> = (0..queues)
                .map(|index| {
                    let (mut log, _) = QueueLog::open(&root.join("queues").join(format!("q{index}")), 4096).expect("open");
                    log.append_publish(0, &message(index), true, None);
                    Arc::new(Mutex::new(log))
                })
                .collect();
            let syncer = Syncer::start(SyncPolicy::Always, None);
            let (sender, receiver) = mpsc::channel();
            syncer.sync(logs.clone(), Some(Box::new(move |durable| sender.send(durable).expect("send"))));
            assert!(receiver.recv_timeout(Duration::from_secs(30)).expect("the batch ended"), "the batch is durable");
            assert_eq!(syncer.stats().fsyncs.load(Ordering::Relaxed), syncs, "syncs for {queues} new queues");
            for (index, log) in logs.iter().enumerate() {
                assert!(!log.lock().has_pending(), "queue {index} has nothing left to write or sync");
            }
            drop(syncer);
            let _ = std::fs::remove_dir_all(&root);
        }
    }

    /// Waits (bounded) until `condition` holds.
    fn wait_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Idle queues cost no CPU: once every watched log is written, the syncer thread sleeps until
    /// something happens, under every policy, however many logs it watches. A record no request
    /// names then wakes it for that log alone: the flush writes one log, not all of them.
    #[test]
    fn idle_watched_logs_never_wake_the_syncer_and_a_flush_writes_only_the_dirty_log() {
        const LOGS: usize = 200;
        let policies = [SyncPolicy::Always, SyncPolicy::Interval { interval_ms: 20 }, SyncPolicy::Never];
        for (index, policy) in policies.into_iter().enumerate() {
            let root = std::env::temp_dir().join(format!("lepus-syncer-test-idle-{index}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            let journal = (policy == SyncPolicy::Always).then(|| Journal::open(&root.join("journal")).expect("journal").0);
            let syncer = Syncer::start(policy, journal);
            let logs: Vec<SharedLog> = (0..LOGS)
                .map(|number| {
                    let (mut log, _) = QueueLog::open(&root.join("queues").join(format!("q{number}")), 4096).expect("open");
                    if policy == SyncPolicy::Always {
                        log.use_journal();
                    }
                    let log = Arc::new(Mutex::new(log));
                    syncer.watch(log.clone());
                    log
                })
                .collect();
            let stats = syncer.stats();
            wait_until("every new log is written", || logs.iter().all(|log| !log.lock().has_pending()));
            // Long enough for the interval policy's fdatasync of what the flush wrote.
            std::thread::sleep(Duration::from_millis(3 * IDLE_FLUSH_INTERVAL_MS));
            let (wakeups, batches) = (stats.wakeups.load(Ordering::Relaxed), stats.batches.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(3 * IDLE_FLUSH_INTERVAL_MS));
            let idle_wakeups = stats.wakeups.load(Ordering::Relaxed) - wakeups;
            assert_eq!(idle_wakeups, 0, "{policy:?}: the syncer woke {idle_wakeups} times with {LOGS} idle logs");
            assert_eq!(stats.batches.load(Ordering::Relaxed), batches, "{policy:?}: batches ran with nothing to do");

            let written = stats.logs_written.load(Ordering::Relaxed);
            logs[LOGS / 2].lock().append_delivered(0);
            wait_until("the dirty log is written", || stats.logs_written.load(Ordering::Relaxed) > written);
            assert!(!logs[LOGS / 2].lock().has_pending(), "{policy:?}");
            std::thread::sleep(Duration::from_millis(3 * IDLE_FLUSH_INTERVAL_MS));
            let flush_wakeups = stats.wakeups.load(Ordering::Relaxed) - wakeups;
            assert_eq!(stats.logs_written.load(Ordering::Relaxed) - written, 1, "{policy:?}: one dirty log, one log written");
            // One to start the flush timer, one when it fires.
            assert!(flush_wakeups <= 2, "{policy:?}: {flush_wakeups} wake-ups to flush one log");
            drop(syncer);
            drop(logs);
            let _ = std::fs::remove_dir_all(&root);
        }
    }
}

/// The syncer and the journal through a recording [`FileSystem`] on the real disk: what a confirm waits for, what a
/// failed sync does to it, and in which order a checkpoint syncs segments and retires journal files.
#[cfg(test)]
mod sync_order_tests {
    use super::*;
    use crate::file_cache::FileCache;
    use crate::file_system::{FileSystem, OpenMode, RealFileSystem, StorageFile};
    use crate::journal::{replay, Journal};
    use crate::queue_log::{is_past_every_segment, Recovery};
    use amqp_codec::{BasicProperties, ContentHeader, ShortStr};
    use broker_core::Message;
    use bytes::Bytes;
    use std::path::{Path, PathBuf};
    use std::time::Instant;

    /// Which syncs the recorder fails (with EIO) instead of making.
    #[derive(Debug, Clone, PartialEq)]
    enum Failing {
        Nothing,
        /// Files and directories at or under this path.
        Under(PathBuf),
        /// Every sync made by the background checkpoint thread.
        CheckpointThread,
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// A sync returned: what it synced, whether it succeeded, on which thread, and the journal
        /// files (sequences) that existed when it was called.
        Synced { path: PathBuf, succeeded: bool, thread: String, journal_files: Vec<u64> },
        /// A confirm callback or sink ran.
        Confirmed { delivery_tag: u64, durable: bool },
    }

    #[derive(Debug, Clone)]
    struct RecordingSync {
        events: Arc<Mutex<Vec<Event>>>,
        failing: Arc<Mutex<Failing>>,
        journal_directory: PathBuf,
    }

    impl RecordingSync {
        fn new(journal_directory: PathBuf) -> RecordingSync {
            RecordingSync { events: Arc::default(), failing: Arc::new(Mutex::new(Failing::Nothing)), journal_directory }
        }

        fn shared(&self) -> SharedFileSystem {
            Arc::new(self.clone())
        }

        fn record(&self, path: &Path, real_sync: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
            let path = path.to_path_buf();
            let thread = std::thread::current().name().unwrap_or_default().to_string();
            let journal_files = journal_sequences(&self.journal_directory);
            let fails = match &*self.failing.lock() {
                Failing::Nothing => false,
                Failing::Under(prefix) => path.starts_with(prefix),
                Failing::CheckpointThread => thread == "lepus-checkpoint",
            };
            let result = if fails { Err(std::io::Error::from_raw_os_error(libc::EIO)) } else { real_sync() };
            self.events.lock().push(Event::Synced { path, succeeded: result.is_ok(), thread, journal_files });
            result
        }

        fn fail(&self, failing: Failing) {
            *self.failing.lock() = failing;
        }

        fn take_events(&self) -> Vec<Event> {
            std::mem::take(&mut *self.events.lock())
        }
    }

    /// A real file whose syncs the recorder sees (and may fail).
    #[derive(Debug)]
    struct RecordingFile {
        inner: Arc<dyn StorageFile>,
        path: PathBuf,
        recorder: RecordingSync,
    }

    impl StorageFile for RecordingFile {
        fn write_all_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
            self.inner.write_all_at(bytes, offset)
        }

        fn read_at(&self, buffer: &mut [u8], offset: u64) -> std::io::Result<usize> {
            self.inner.read_at(buffer, offset)
        }

        fn len(&self) -> std::io::Result<u64> {
            self.inner.len()
        }

        fn set_len(&self, bytes: u64) -> std::io::Result<()> {
            self.inner.set_len(bytes)
        }

        fn sync_data(&self) -> std::io::Result<()> {
            self.recorder.record(&self.path, || self.inner.sync_data())
        }
    }

    /// The real disk, with every file and directory sync recorded.
    impl FileSystem for RecordingSync {
        fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Arc<dyn StorageFile>> {
            let inner = RealFileSystem.open(path, mode)?;
            Ok(Arc::new(RecordingFile { inner, path: path.to_path_buf(), recorder: self.clone() }))
        }

        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            RealFileSystem.rename(from, to)
        }

        fn sync_directory(&self, directory: &Path) -> std::io::Result<()> {
            self.record(directory, || RealFileSystem.sync_directory(directory))
        }

        fn remove_file(&self, path: &Path) -> std::io::Result<()> {
            RealFileSystem.remove_file(path)
        }

        fn remove_dir_all(&self, path: &Path) -> std::io::Result<()> {
            RealFileSystem.remove_dir_all(path)
        }

        fn list_directory(&self, directory: &Path) -> std::io::Result<Vec<String>> {
            RealFileSystem.list_directory(directory)
        }

        fn create_dir_all(&self, directory: &Path) -> std::io::Result<()> {
            RealFileSystem.create_dir_all(directory)
        }

        fn exists(&self, path: &Path) -> bool {
            RealFileSystem.exists(path)
        }

        fn is_dir(&self, path: &Path) -> bool {
            RealFileSystem.is_dir(path)
        }

        fn sync_file_system(&self, path: &Path) -> std::io::Result<()> {
            self.record(path, || RealFileSystem.sync_file_system(path))
        }
    }

    /// Opens a queue log whose files go through `recorder`.
    fn open_log(recorder: &RecordingSync, directory: &Path, segment_bytes_max: u64) -> QueueLog {
        let cache = FileCache::with_file_system(64, recorder.shared());
        QueueLog::open_with_cache(directory, segment_bytes_max, cache).expect("open").0
    }

    /// A sink that records its confirms among the sync events, in the order they happen.
    struct RecordingSink(Arc<Mutex<Vec<Event>>>);

    impl ConfirmSink for RecordingSink {
        fn confirm_batch(&self, confirms: &[(u64, bool)]) {
            let mut events = self.0.lock();
            for (delivery_tag, durable) in confirms {
                events.push(Event::Confirmed { delivery_tag: *delivery_tag, durable: *durable });
            }
        }
    }

    /// The sequences of the journal files (`*.wal`) in `directory`.
    fn journal_sequences(directory: &Path) -> Vec<u64> {
        let mut sequences: Vec<u64> = std::fs::read_dir(directory)
            .map(|entries| entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_suffix(".wal")?.parse().ok()).collect())
            .unwrap_or_default();
        sequences.sort_unstable();
        sequences
    }

    fn message(position: u64) -> Message {
        let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
        let body = format!("m{position}:{}", "x".repeat(100));
        Message {
            exchange: ShortStr::from("x"),
            routing_key: ShortStr::from("k"),
            header: ContentHeader::from_properties(60, body.len() as u64, &properties),
            body: Bytes::from(body),
            published_at_ns: 0,
            bcc_routing_keys: None,
        }
    }

    fn temporary_root(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("lepus-sync-order-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("queues")).expect("create");
        root
    }

    /// Publishes `position` to `log` and asks the syncer to confirm it, as a channel does.
    fn publish_and_confirm(syncer: &Syncer, log: &SharedLog, sink: &Arc<dyn ConfirmSink>, position: u64) {
        log.lock().append_publish(position, &message(position), true, None);
        let confirm = Confirm { sink: sink.clone(), delivery_tag: position, accepted: true };
        syncer.confirm(vec![log.clone()], vec![confirm]);
    }

    /// Waits (bounded) until the recorder saw the confirm of `delivery_tag`; returns whether it was
    /// positive.
    fn wait_for_confirm(recorder: &RecordingSync, delivery_tag: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = recorder.events.lock().iter().find_map(|event| match event {
                Event::Confirmed { delivery_tag: tag, durable } if *tag == delivery_tag => Some(*durable),
                _ => None,
            });
            if let Some(durable) = found {
                return durable;
            }
            assert!(Instant::now() < deadline, "no confirm for delivery tag {delivery_tag}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops the syncer and waits (bounded) until its thread let go of `log`, so nothing writes
    /// or syncs behind the test's back.
    fn stop(syncer: Syncer, log: &SharedLog) {
        drop(syncer);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(log) > 1 {
            assert!(Instant::now() < deadline, "the syncer thread did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The index of the first event that confirms `delivery_tag`.
    fn confirm_index(events: &[Event], delivery_tag: u64) -> usize {
        events
            .iter()
            .position(|event| matches!(event, Event::Confirmed { delivery_tag: tag, .. } if *tag == delivery_tag))
            .expect("the confirm was recorded")
    }

    /// Whether a sync of a file at or under `prefix` returned with `succeeded` among `events`.
    fn synced_under(events: &[Event], prefix: &Path, succeeded: bool) -> bool {
        events
            .iter()
            .any(|event| matches!(event, Event::Synced { path, succeeded: ok, .. } if path.starts_with(prefix) && *ok == succeeded))
    }

    /// `--sync always`: a confirm is sent only after the journal's fdatasync returned, and the
    /// new segment's directory entry is synced before it too; a failed journal sync nacks, and
    /// the next batch (sync working again) confirms.
    #[test]
    fn a_journaled_confirm_follows_the_journal_sync_and_a_failed_sync_nacks() {
        let root = temporary_root("journaled");
        let journal_directory = root.join("journal");
        let recorder = RecordingSync::new(journal_directory.clone());
        let (journal, _) = Journal::open_in(recorder.shared(), &journal_directory).expect("journal");
        let syncer = Syncer::start(SyncPolicy::Always, Some(journal));
        let log_directory = root.join("queues").join("q");
        let mut log = open_log(&recorder, &log_directory, 1 << 20);
        log.use_journal();
        let log: SharedLog = Arc::new(Mutex::new(log));
        let sink: Arc<dyn ConfirmSink> = Arc::new(RecordingSink(recorder.events.clone()));
        recorder.take_events();

        publish_and_confirm(&syncer, &log, &sink, 1);
        assert!(wait_for_confirm(&recorder, 1), "a working sync confirms");
        let events = recorder.take_events();
        let before_confirm = &events[..confirm_index(&events, 1)];
        assert!(synced_under(before_confirm, &journal_directory, true), "confirmed before the journal sync returned: {events:#?}");
        assert!(synced_under(before_confirm, &log_directory, true), "confirmed before the new segment's name was synced: {events:#?}");

        recorder.fail(Failing::Under(journal_directory.clone()));
        publish_and_confirm(&syncer, &log, &sink, 2);
        assert!(!wait_for_confirm(&recorder, 2), "a failed journal sync must nack");
        let events = recorder.take_events();
        assert!(synced_under(&events[..confirm_index(&events, 2)], &journal_directory, false), "{events:#?}");

        recorder.fail(Failing::Nothing);
        publish_and_confirm(&syncer, &log, &sink, 3);
        assert!(wait_for_confirm(&recorder, 3), "the next batch, sync working again, confirms");
        let events = recorder.take_events();
        assert!(synced_under(&events[..confirm_index(&events, 3)], &journal_directory, true), "{events:#?}");
        stop(syncer, &log);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A new log's directory whose sync fails (EIO here; EMFILE when the node is out of
    /// descriptors) nacks the publish, and stays owed: the next batch syncs it successfully
    /// before it confirms the next publish. Before, the failed sync was forgotten and the retry
    /// confirmed with the new segment's name never made durable.
    #[test]
    fn a_failed_directory_sync_nacks_and_is_made_before_the_next_confirm() {
        let root = temporary_root("directory-owed");
        let journal_directory = root.join("journal");
        let recorder = RecordingSync::new(journal_directory.clone());
        let (journal, _) = Journal::open_in(recorder.shared(), &journal_directory).expect("journal");
        let syncer = Syncer::start(SyncPolicy::Always, Some(journal));
        let queues = root.join("queues");
        let log_directory = queues.join("q");
        let mut log = open_log(&recorder, &log_directory, 1 << 20);
        log.use_journal();
        let log: SharedLog = Arc::new(Mutex::new(log));
        let sink: Arc<dyn ConfirmSink> = Arc::new(RecordingSink(recorder.events.clone()));
        recorder.take_events();
        // The first write makes the log's directory: it and its parent are synced with the batch.
        recorder.fail(Failing::Under(queues.clone()));
        publish_and_confirm(&syncer, &log, &sink, 1);
        assert!(!wait_for_confirm(&recorder, 1), "a failed directory sync must nack");
        recorder.take_events();
        recorder.fail(Failing::Nothing);
        publish_and_confirm(&syncer, &log, &sink, 2);
        assert!(wait_for_confirm(&recorder, 2), "the next batch confirms");
        let events = recorder.take_events();
        let before_confirm = &events[..confirm_index(&events, 2)];
        let synced = |path: &Path| {
            before_confirm.iter().any(|event| matches!(event, Event::Synced { path: synced, succeeded: true, .. } if synced == path))
        };
        assert!(synced(&log_directory) && synced(&queues), "the owed directory syncs were not made before the confirm: {events:#?}");
        stop(syncer, &log);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A log without the journal (the syncer has none): the confirm callback runs only after its
    /// segment's fdatasync returned, and gets `false` when that sync fails.
    #[test]
    fn an_unjournaled_confirm_follows_the_segment_sync_and_a_failed_sync_is_false() {
        let root = temporary_root("unjournaled");
        let recorder = RecordingSync::new(root.join("journal"));
        let syncer = Syncer::start(SyncPolicy::Always, None);
        let log_directory = root.join("queues").join("q");
        let log = open_log(&recorder, &log_directory, 1 << 20);
        let log: SharedLog = Arc::new(Mutex::new(log));
        recorder.take_events();
        let callback_events = recorder.events.clone();
        let callback = move |delivery_tag: u64| -> SyncCallback {
            let events = callback_events.clone();
            Box::new(move |durable| events.lock().push(Event::Confirmed { delivery_tag, durable }))
        };
        let segment = log_directory.join(format!("{:020}.seg", 0));

        log.lock().append_publish(0, &message(0), true, None);
        syncer.sync(vec![log.clone()], Some(callback(1)));
        assert!(wait_for_confirm(&recorder, 1), "a working sync is durable");
        let events = recorder.take_events();
        let before_confirm = &events[..confirm_index(&events, 1)];
        assert!(synced_under(before_confirm, &segment, true), "the callback ran before the segment sync returned: {events:#?}");
        assert!(synced_under(before_confirm, &log_directory, true), "{events:#?}");

        recorder.fail(Failing::Under(segment.clone()));
        log.lock().append_publish(1, &message(1), true, None);
        syncer.sync(vec![log.clone()], Some(callback(2)));
        assert!(!wait_for_confirm(&recorder, 2), "a failed segment sync must report not durable");
        let events = recorder.take_events();
        assert!(synced_under(&events[..confirm_index(&events, 2)], &segment, false), "{events:#?}");
        recorder.fail(Failing::Nothing);
        stop(syncer, &log);
        let _ = std::fs::remove_dir_all(&root);
    }
    /// Two queues' publishes in one batch, one queue's segment failing its sync (as when no
    /// descriptor is left for it): only that queue's confirm is a nack.
    #[test]
    fn a_failed_log_nacks_only_its_own_confirms_in_a_shared_batch() {
        let root = temporary_root("failed-log-alone");
        let recorder = RecordingSync::new(root.join("journal"));
        let syncer = Syncer::start(SyncPolicy::Always, None);
        let failing_directory = root.join("queues").join("failing");
        let failing = open_log(&recorder, &failing_directory, 1 << 20);
        let working = open_log(&recorder, &root.join("queues").join("working"), 1 << 20);
        let (failing, working): (SharedLog, SharedLog) = (Arc::new(Mutex::new(failing)), Arc::new(Mutex::new(working)));
        let sink: Arc<dyn ConfirmSink> = Arc::new(RecordingSink(recorder.events.clone()));
        // Hold the syncer thread in a callback, so both publishes wait for the same next batch.
        let (entered, wait_entered) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        let hold: SyncCallback = Box::new(move |_| {
            let _ = entered.send(());
            let _ = wait_release.recv_timeout(Duration::from_secs(10));
        });
        syncer.sync(Vec::new(), Some(hold));
        wait_entered.recv_timeout(Duration::from_secs(10)).expect("the syncer ran the holding callback");
        recorder.fail(Failing::Under(failing_directory.clone()));
        publish_and_confirm(&syncer, &failing, &sink, 1);
        publish_and_confirm(&syncer, &working, &sink, 2);
        release.send(()).expect("release");
        assert!(!wait_for_confirm(&recorder, 1), "the failed log's confirm must be a nack");
        assert!(wait_for_confirm(&recorder, 2), "another queue's confirm was nacked for the failed log");
        recorder.fail(Failing::Nothing);
        stop(syncer, &failing);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Waits (bounded) until `directory` holds exactly `count` journal files.
    fn wait_for_journal_files(directory: &Path, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while journal_sequences(directory).len() != count {
            assert!(Instant::now() < deadline, "journal files: {:?}", journal_sequences(directory));
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The segment syncs among `events` made on `thread`, with the journal files present at each.
    fn segment_syncs(events: &[Event], queues: &Path, on_thread: &str) -> Vec<(PathBuf, Vec<u64>)> {
        events
            .iter()
            .filter_map(|event| match event {
                Event::Synced { path, thread, journal_files, .. }
                    if thread == on_thread && path.starts_with(queues) && path.extension().is_some_and(|extension| extension == "seg") =>
                {
                    Some((path.clone(), journal_files.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// A background checkpoint (the journal past its size) fdatasyncs the segments of the finished
    /// period while that period's journal file still exists, and retires the file only after.
    #[test]
    fn a_background_checkpoint_syncs_segments_before_it_retires_their_journal_file() {
        let root = temporary_root("background-checkpoint");
        let (journal_directory, queues) = (root.join("journal"), root.join("queues"));
        let recorder = RecordingSync::new(journal_directory.clone());
        let (mut journal, _) = Journal::open_in(recorder.shared(), &journal_directory).expect("journal");
        journal.set_checkpoint_bytes(1);
        let syncer = Syncer::start(SyncPolicy::Always, Some(journal));
        let mut log = open_log(&recorder, &queues.join("q"), 512);
        log.use_journal();
        let log: SharedLog = Arc::new(Mutex::new(log));
        let sink: Arc<dyn ConfirmSink> = Arc::new(RecordingSink(recorder.events.clone()));
        // Every batch starts a checkpoint unless one still runs; a few are enough.
        let checkpoint_syncs = || segment_syncs(&recorder.events.lock(), &queues, "lepus-checkpoint").len();
        for position in 0..200 {
            publish_and_confirm(&syncer, &log, &sink, position);
            assert!(wait_for_confirm(&recorder, position));
            wait_for_journal_files(&journal_directory, 1);
            if checkpoint_syncs() >= 4 {
                break;
            }
        }
        stop(syncer, &log);
        let syncs = segment_syncs(&recorder.take_events(), &queues, "lepus-checkpoint");
        assert!(syncs.len() >= 4, "checkpoints synced segments: {syncs:?}");
        for (segment, journal_files) in &syncs {
            assert!(
                journal_files.len() >= 2,
                "{} was synced after the journal file holding its writes was retired (journal files then: {journal_files:?})",
                segment.display()
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The checkpoint of a graceful shutdown, which the caller waits for: segments synced while
    /// the journal file holding their writes exists, then that file retired.
    #[test]
    fn a_shutdown_checkpoint_syncs_segments_before_it_retires_their_journal_file() {
        let root = temporary_root("shutdown-checkpoint");
        let (journal_directory, queues) = (root.join("journal"), root.join("queues"));
        let recorder = RecordingSync::new(journal_directory.clone());
        let (journal, _) = Journal::open_in(recorder.shared(), &journal_directory).expect("journal");
        let syncer = Syncer::start(SyncPolicy::Always, Some(journal));
        let mut log = open_log(&recorder, &queues.join("q"), 512);
        log.use_journal();
        let log: SharedLog = Arc::new(Mutex::new(log));
        let sink: Arc<dyn ConfirmSink> = Arc::new(RecordingSink(recorder.events.clone()));
        for position in 0..8 {
            publish_and_confirm(&syncer, &log, &sink, position);
            assert!(wait_for_confirm(&recorder, position));
        }
        let written = journal_sequences(&journal_directory);
        assert_eq!(written.len(), 1, "no background checkpoint at the default size");
        recorder.take_events();
        assert!(syncer.checkpoint(vec![log.clone()]), "the checkpoint succeeds");
        let syncs = segment_syncs(&recorder.take_events(), &queues, "lepus-syncer");
        assert!(syncs.len() >= 2, "the checkpoint synced every segment written: {syncs:?}");
        for (segment, journal_files) in &syncs {
            assert!(
                journal_files.contains(&written[0]),
                "{} was synced after journal file {} was retired (journal files then: {journal_files:?})",
                segment.display(),
                written[0]
            );
        }
        assert!(!journal_sequences(&journal_directory).contains(&written[0]), "the checkpoint retires the journal file");
        stop(syncer, &log);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Confirmed messages whose segment writes never reached the disk come back from the journal
    /// when it spans several files: the journal rotates every few batches and every checkpoint
    /// fails (the segment syncs return EIO), so no file is retired; then every segment loses its
    /// content, as unsynced writes can at a power loss, and replay rebuilds it from all the files.
    #[test]
    fn replay_across_several_journal_files_restores_every_confirmed_message() {
        let root = temporary_root("replay-files");
        let (journal_directory, queues) = (root.join("journal"), root.join("queues"));
        let recorder = RecordingSync::new(journal_directory.clone());
        recorder.fail(Failing::CheckpointThread);
        let (mut journal, _) = Journal::open_in(recorder.shared(), &journal_directory).expect("journal");
        journal.set_checkpoint_bytes(512);
        let syncer = Syncer::start(SyncPolicy::Always, Some(journal));
        let directory = queues.join("q");
        let mut log = open_log(&recorder, &directory, 1024);
        log.use_journal();
        let log: SharedLog = Arc::new(Mutex::new(log));
        let sink: Arc<dyn ConfirmSink> = Arc::new(RecordingSink(recorder.events.clone()));
        let mut settled = Vec::new();
        for position in 0..40 {
            if position % 3 == 1 {
                log.lock().append_settled(position - 1);
                settled.push(position - 1);
            }
            publish_and_confirm(&syncer, &log, &sink, position);
            assert!(wait_for_confirm(&recorder, position));
        }
        stop(syncer, &log);
        let segments = log.lock().segment_count();
        drop(log);
        assert!(segments >= 3, "segments roll: {segments}");
        let sequences = journal_sequences(&journal_directory);
        assert!(sequences.len() >= 3, "the journal rotated through several files: {sequences:?}");
        assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>(), "a failed checkpoint retires nothing");
        for entry in std::fs::read_dir(&directory).expect("list") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|extension| extension == "seg") {
                std::fs::write(&path, b"").expect("empty the segment");
            }
        }
        let (_, entries) = Journal::open(&journal_directory).expect("reopen the journal");
        replay(&queues, &entries, is_past_every_segment).expect("replay");
        let (mut log, recovery) = QueueLog::open(&directory, 1024).expect("reopen");
        assert!(recovery.truncated.is_empty(), "{:?}", recovery.truncated);
        let expected: Vec<u64> = (0..40).filter(|position| !settled.contains(position)).collect();
        assert_eq!(recovered_positions(&mut log, &recovery), expected);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// `--sync interval`: the periodic fdatasync covers the logs written since the last one, not
    /// every log the syncer watches (which cost one fdatasync per idle queue per interval).
    #[test]
    fn an_interval_fdatasync_covers_only_the_logs_written_since_the_last_one() {
        const INTERVAL_MS: u64 = 30;
        let root = temporary_root("interval");
        let queues = root.join("queues");
        let recorder = RecordingSync::new(root.join("journal"));
        let syncer = Syncer::start(SyncPolicy::Interval { interval_ms: INTERVAL_MS }, None);
        let logs: Vec<SharedLog> = (0..100)
            .map(|number| {
                let log = open_log(&recorder, &queues.join(format!("q{number}")), 1 << 20);
                let log = Arc::new(Mutex::new(log));
                syncer.watch(log.clone());
                log
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while logs.iter().any(|log| log.lock().has_pending()) {
            assert!(Instant::now() < deadline, "the new logs were never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(5 * INTERVAL_MS));
        recorder.take_events();
        let busy = queues.join("q7");
        let sink: Arc<dyn ConfirmSink> = Arc::new(RecordingSink(recorder.events.clone()));
        for position in 0..3 {
            publish_and_confirm(&syncer, &logs[7], &sink, position);
            assert!(wait_for_confirm(&recorder, position));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !synced_under(&recorder.events.lock(), &busy, true) {
            assert!(Instant::now() < deadline, "the written log was never synced");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(5 * INTERVAL_MS));
        let events = recorder.take_events();
        let others: Vec<&PathBuf> = events
            .iter()
            .filter_map(|event| match event {
                // The busy log's first write made its directory, so their parent is synced too.
                Event::Synced { path, .. } if !path.starts_with(&busy) && *path != queues => Some(path),
                _ => None,
            })
            .collect();
        assert!(others.is_empty(), "idle logs were synced: {} syncs, e.g. {:?}", others.len(), others.first());
        drop(syncer);
        drop(logs);
        let _ = std::fs::remove_dir_all(&root);
    }

    fn recovered_positions(log: &mut QueueLog, recovery: &Recovery) -> Vec<u64> {
        let mut cursor = log.recovered_tail(recovery);
        let messages = log.read_tail(&mut cursor, usize::MAX, usize::MAX).expect("read tail");
        messages.into_iter().map(|(position, _)| position).collect()
    }
}
