//! Group commit: one thread writes every log that has buffered records and fdatasyncs them, then
//! runs the callbacks waiting on those records (publisher confirms). Whatever arrives while a sync
//! runs is covered by the next one, so the number of fsyncs per second stays bounded by the disk,
//! not by the message rate.

use crate::file_sync::{DirectSync, FileSync};
use crate::journal::Journal;
use crate::queue_log::{CheckpointFile, QueueLog};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

/// A log shared between its queue and the syncer.
pub type SharedLog = Arc<Mutex<QueueLog>>;

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

/// How long the syncer waits for work before it flushes dirty logs anyway (settle records and
/// publishes without confirms are made durable at least this often).
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
    callback: Option<SyncCallback>,
    /// Publisher confirms, in the order their publishes arrived (a connection hands over those of
    /// one socket read together).
    confirms: Vec<Confirm>,
    /// Run a journal checkpoint before the callback (graceful shutdown).
    checkpoint: bool,
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
    sender: Sender<SyncRequest>,
    stats: Arc<SyncStats>,
}

impl Syncer {
    /// Starts the syncer thread. With a journal, the logs that use it (see
    /// [`QueueLog::use_journal`]) cost one fdatasync per batch together, the journal's.
    pub fn start(policy: SyncPolicy, journal: Option<Journal>) -> Syncer {
        Syncer::start_with_sync(policy, journal, DirectSync)
    }

    /// [`Syncer::start`], with every fdatasync the syncer and its checkpoints make going through
    /// `sync` (the journal's go through the journal's own, see [`Journal::open_with_sync`]).
    pub fn start_with_sync<S: FileSync + Clone>(policy: SyncPolicy, journal: Option<Journal<S>>, sync: S) -> Syncer {
        let (sender, receiver) = mpsc::channel();
        let stats = Arc::new(SyncStats::default());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("lepus-syncer".to_string())
            .spawn(move || run(receiver, policy, journal, sync, &thread_stats))
            .expect("spawning the syncer thread");
        Syncer { sender, stats }
    }

    /// What the syncer has done so far.
    pub fn stats(&self) -> &SyncStats {
        &self.stats
    }

    /// Writes and syncs `logs`, then runs a journal checkpoint (every segment written since the
    /// last one synced, the journal emptied), and waits for it: a graceful shutdown leaves nothing
    /// for the next start to replay. Returns whether everything was made durable.
    pub fn checkpoint(&self, logs: Vec<SharedLog>) -> bool {
        let (done, wait) = mpsc::channel();
        let callback: SyncCallback = Box::new(move |durable| {
            let _ = done.send(durable);
        });
        if self.sender.send(SyncRequest { logs, callback: Some(callback), confirms: Vec::new(), checkpoint: true }).is_err() {
            return false;
        }
        wait.recv().unwrap_or(false)
    }

    /// Makes the records buffered in `logs` durable, then calls `callback`.
    pub fn sync(&self, logs: Vec<SharedLog>, callback: Option<SyncCallback>) {
        if let Err(mpsc::SendError(request)) = self.sender.send(SyncRequest { logs, callback, confirms: Vec::new(), checkpoint: false }) {
            // The syncer only stops when the process does; refuse the confirm rather than lie.
            if let Some(callback) = request.callback {
                callback(false);
            }
        }
    }

    /// Adds `log` to the logs the syncer flushes when idle (at least every
    /// [`IDLE_FLUSH_INTERVAL_MS`]). Every log must be watched from its queue's start: records
    /// appended without a sync request of their own (settles, delivered markers) are otherwise
    /// never written, journaled or synced, and a journaled log keeps every write a page-in made in
    /// memory for the journal (a recovered backlog drained without a publish grew the broker by
    /// the settle and delivered records of every message).
    pub fn watch(&self, log: SharedLog) {
        self.sync(vec![log], None);
    }

    /// Makes the records buffered in `logs` durable (none: only keeps the confirms' place in
    /// line), then hands the confirms to their sinks with the others of the same batch.
    pub fn confirm(&self, logs: Vec<SharedLog>, confirms: Vec<Confirm>) {
        if let Err(mpsc::SendError(request)) = self.sender.send(SyncRequest { logs, callback: None, confirms, checkpoint: false }) {
            for confirm in request.confirms {
                confirm.sink.confirm_batch(&[(confirm.delivery_tag, false)]);
            }
        }
    }
}

fn run<S: FileSync + Clone>(
    receiver: Receiver<SyncRequest>,
    policy: SyncPolicy,
    mut journal: Option<Journal<S>>,
    sync: S,
    stats: &Arc<SyncStats>,
) {
    let mut checkpoint = Checkpoint::start(stats.clone(), sync);
    let mut last_sync = std::time::Instant::now();
    let mut known_logs: Vec<SharedLog> = Vec::new();
    loop {
        let wait_ms = match policy {
            SyncPolicy::Interval { interval_ms } => interval_ms.clamp(1, IDLE_FLUSH_INTERVAL_MS),
            _ => IDLE_FLUSH_INTERVAL_MS,
        };
        let first = match receiver.recv_timeout(Duration::from_millis(wait_ms)) {
            Ok(request) => Some(request),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut requests: Vec<SyncRequest> = first.into_iter().collect();
        while requests.len() < SYNC_BATCH_REQUESTS_MAX {
            match receiver.try_recv() {
                Ok(request) => requests.push(request),
                Err(_) => break,
            }
        }
        let mut logs: Vec<SharedLog> = Vec::new();
        for request in &requests {
            for log in &request.logs {
                if !logs.iter().any(|known| Arc::ptr_eq(known, log)) {
                    logs.push(log.clone());
                }
                if !known_logs.iter().any(|known| Arc::ptr_eq(known, log)) {
                    known_logs.push(log.clone());
                }
            }
        }
        // Logs only ever touched by settle records still get flushed now and then.
        known_logs.retain(|log| Arc::strong_count(log) > 1);
        for log in &known_logs {
            if log.lock().has_pending() && !logs.iter().any(|known| Arc::ptr_eq(known, log)) {
                logs.push(log.clone());
            }
        }
        let fsync_now = match policy {
            SyncPolicy::Always => true,
            SyncPolicy::Interval { interval_ms } => last_sync.elapsed() >= Duration::from_millis(interval_ms),
            SyncPolicy::Never => false,
        };
        if fsync_now && policy != SyncPolicy::Always {
            // The periodic sync covers every log written since the last one.
            for log in &known_logs {
                if !logs.iter().any(|known| Arc::ptr_eq(known, log)) {
                    logs.push(log.clone());
                }
            }
        }
        if fsync_now {
            last_sync = std::time::Instant::now();
        }
        // A log that failed (say, no descriptor for its segment) fails only the requests that
        // named it; a failed journal or checkpoint fails the whole batch.
        let (mut durable, failed_logs) = sync_all(&logs, fsync_now, journal.as_mut(), &mut checkpoint, stats);
        if requests.iter().any(|request| request.checkpoint) {
            if let Some(journal) = journal.as_mut() {
                durable &= checkpoint.run_now(journal, stats);
            }
        }
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats.requests.fetch_add(requests.len() as u64, Ordering::Relaxed);
        if !durable || !failed_logs.is_empty() {
            stats.failures.fetch_add(1, Ordering::Relaxed);
        }
        let mut confirms: Vec<SinkConfirms> = Vec::new();
        for request in requests {
            let durable = durable && !request.logs.iter().any(|log| failed_logs.iter().any(|failed| Arc::ptr_eq(failed, log)));
            if let Some(callback) = request.callback {
                callback(durable);
            }
            for confirm in request.confirms {
                let settled = (confirm.delivery_tag, confirm.accepted && durable);
                match confirms.iter_mut().find(|(sink, _)| Arc::ptr_eq(sink, &confirm.sink)) {
                    Some((_, tags)) => tags.push(settled),
                    None => confirms.push((confirm.sink, vec![settled])),
                }
            }
        }
        for (sink, tags) in confirms {
            sink.confirm_batch(&tags);
        }
        if let Some(journal) = journal.as_mut() {
            if journal.needs_checkpoint() {
                checkpoint.start_background(journal);
            }
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
struct Checkpoint<S: FileSync> {
    logs: Vec<SharedLog>,
    in_flight: Arc<std::sync::atomic::AtomicBool>,
    failed_files: Arc<Mutex<Vec<CheckpointFile>>>,
    jobs: Sender<CheckpointJob>,
    /// How the syncer thread (segments, directories) and the checkpoint thread reach fdatasync.
    sync: S,
}

/// Segment files to sync, then journal files older than `sequence` to delete.
struct CheckpointJob {
    files: Vec<CheckpointFile>,
    sequence: u64,
    directory: std::path::PathBuf,
}

impl<S: FileSync + Clone> Checkpoint<S> {
    fn start(stats: Arc<SyncStats>, sync: S) -> Checkpoint<S> {
        let (jobs, receiver) = mpsc::channel::<CheckpointJob>();
        let in_flight = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let failed_files = Arc::new(Mutex::new(Vec::new()));
        let (thread_in_flight, thread_failed, thread_sync) = (in_flight.clone(), failed_files.clone(), sync.clone());
        std::thread::Builder::new()
            .name("lepus-checkpoint".to_string())
            .spawn(move || {
                for job in receiver {
                    let failed = sync_files(job.files, &stats, &thread_sync);
                    if failed.is_empty() {
                        if let Err(error) = crate::journal::remove_files_before(&job.directory, job.sequence, &thread_sync) {
                            tracing::error!(%error, "deleting checkpointed journal files failed; a later checkpoint deletes them");
                        }
                    } else {
                        thread_failed.lock().extend(failed);
                    }
                    thread_in_flight.store(false, Ordering::Release);
                }
            })
            .expect("spawning the checkpoint thread");
        Checkpoint { logs: Vec::new(), in_flight, failed_files, jobs, sync }
    }

    fn note(&mut self, log: &SharedLog) {
        if !self.logs.iter().any(|known| Arc::ptr_eq(known, log)) {
            self.logs.push(log.clone());
        }
    }

    /// The segment files written since the last checkpoint, and those a failed one left.
    fn take_files(&mut self) -> Vec<CheckpointFile> {
        let mut files = std::mem::take(&mut *self.failed_files.lock());
        for log in self.logs.drain(..) {
            let taken = log.lock().take_checkpoint_files();
            files.extend(taken);
        }
        files
    }

    /// Starts a background checkpoint unless one is running.
    fn start_background(&mut self, journal: &mut Journal<S>) {
        if self.in_flight.load(Ordering::Acquire) {
            return;
        }
        let files = self.take_files();
        match journal.rotate() {
            Ok(sequence) => {
                self.in_flight.store(true, Ordering::Release);
                let job = CheckpointJob { files, sequence, directory: journal.directory().to_path_buf() };
                if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
                    self.in_flight.store(false, Ordering::Release);
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
    fn run_now(&mut self, journal: &mut Journal<S>, stats: &SyncStats) -> bool {
        while self.in_flight.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let files = self.take_files();
        let failed = sync_files(files, stats, &self.sync);
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
fn sync_files(files: Vec<CheckpointFile>, stats: &SyncStats, sync: &impl FileSync) -> Vec<CheckpointFile> {
    let mut failed = Vec::new();
    for file in files {
        if let Err(error) = file.sync_with(|opened| timed_sync(opened, stats, sync)) {
            tracing::error!(%error, "syncing a segment at a journal checkpoint failed; the journal keeps its entries");
            failed.push(file);
        }
    }
    failed
}

/// fdatasyncs a file, counting the call and its time in the stats.
fn timed_sync(file: &std::fs::File, stats: &SyncStats, sync: &impl FileSync) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let synced = sync.sync_data(file);
    stats.record_fsync(started.elapsed());
    synced
}

/// Writes every log's buffered records; then, when `fsync`, appends the journaled logs' writes to
/// the journal and syncs it once, and syncs what the others (and directory changes) need.
/// Returns whether the journal (if any) was made durable, and the logs that failed.
fn sync_all<S: FileSync + Clone>(
    logs: &[SharedLog],
    fsync: bool,
    mut journal: Option<&mut Journal<S>>,
    checkpoint: &mut Checkpoint<S>,
    stats: &SyncStats,
) -> (bool, Vec<SharedLog>) {
    let mut journal_durable = true;
    let mut failed_logs = Vec::new();
    for log in logs {
        let written = log.lock().write_pending();
        let written = written.map(|written| {
            if !written.journal.is_empty() {
                checkpoint.note(log);
            }
            match journal.as_deref_mut() {
                Some(journal) => written.journal.iter().for_each(|write| journal.append(&write.target, write.offset, &write.bytes)),
                None => assert!(written.journal.is_empty(), "a journaled log needs the syncer's journal"),
            }
            written.sync_now
        });
        let result = match written {
            Ok(files) if fsync => {
                files.iter().try_for_each(|file| timed_sync(file, stats, &checkpoint.sync)).map_err(|error| error.to_string())
            }
            Ok(_) => Ok(()),
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = result {
            tracing::error!(%error, "writing or syncing a queue log failed; confirms for it are nacked");
            failed_logs.push(log.clone());
        }
    }
    if let Some(journal) = journal.filter(|journal| journal.has_pending()) {
        let started = std::time::Instant::now();
        let synced = journal.write_and_sync();
        stats.record_fsync(started.elapsed());
        if let Err(error) = synced {
            tracing::error!(%error, "writing or syncing the journal failed; this batch's confirms are nacked");
            journal_durable = false;
        }
    }
    (journal_durable, failed_logs)
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
                log.append_publish(position, &message(position), true);
            }
            log.write_pending().expect("write");
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
}

/// The syncer and the journal through a recording [`FileSync`]: what a confirm waits for, what a
/// failed sync does to it, and in which order a checkpoint syncs segments and retires journal files.
#[cfg(test)]
mod sync_order_tests {
    use super::*;
    use crate::journal::{replay, Journal};
    use crate::queue_log::{is_past_every_segment, Recovery};
    use amqp_codec::{BasicProperties, ContentHeader, ShortStr};
    use broker_core::Message;
    use bytes::Bytes;
    use std::os::fd::AsRawFd;
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

        fn record(&self, file: &std::fs::File, real_sync: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
            let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("the path of an open file");
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

    impl FileSync for RecordingSync {
        fn sync_data(&self, file: &std::fs::File) -> std::io::Result<()> {
            self.record(file, || file.sync_data())
        }

        fn sync_directory(&self, directory: &std::fs::File) -> std::io::Result<()> {
            self.record(directory, || directory.sync_all())
        }
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
        log.lock().append_publish(position, &message(position), true);
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
        let (journal, _) = Journal::open_with_sync(&journal_directory, recorder.clone()).expect("journal");
        let syncer = Syncer::start_with_sync(SyncPolicy::Always, Some(journal), recorder.clone());
        let log_directory = root.join("queues").join("q");
        let (mut log, _) = QueueLog::open(&log_directory, 1 << 20).expect("open");
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

    /// A log without the journal (the syncer has none): the confirm callback runs only after its
    /// segment's fdatasync returned, and gets `false` when that sync fails.
    #[test]
    fn an_unjournaled_confirm_follows_the_segment_sync_and_a_failed_sync_is_false() {
        let root = temporary_root("unjournaled");
        let recorder = RecordingSync::new(root.join("journal"));
        let syncer = Syncer::start_with_sync(SyncPolicy::Always, None::<Journal<RecordingSync>>, recorder.clone());
        let log_directory = root.join("queues").join("q");
        let (log, _) = QueueLog::open(&log_directory, 1 << 20).expect("open");
        let log: SharedLog = Arc::new(Mutex::new(log));
        recorder.take_events();
        let callback_events = recorder.events.clone();
        let callback = move |delivery_tag: u64| -> SyncCallback {
            let events = callback_events.clone();
            Box::new(move |durable| events.lock().push(Event::Confirmed { delivery_tag, durable }))
        };
        let segment = log_directory.join(format!("{:020}.seg", 0));

        log.lock().append_publish(0, &message(0), true);
        syncer.sync(vec![log.clone()], Some(callback(1)));
        assert!(wait_for_confirm(&recorder, 1), "a working sync is durable");
        let events = recorder.take_events();
        let before_confirm = &events[..confirm_index(&events, 1)];
        assert!(synced_under(before_confirm, &segment, true), "the callback ran before the segment sync returned: {events:#?}");
        assert!(synced_under(before_confirm, &log_directory, true), "{events:#?}");

        recorder.fail(Failing::Under(segment.clone()));
        log.lock().append_publish(1, &message(1), true);
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
        let syncer = Syncer::start_with_sync(SyncPolicy::Always, None::<Journal<RecordingSync>>, recorder.clone());
        let failing_directory = root.join("queues").join("failing");
        let (failing, _) = QueueLog::open(&failing_directory, 1 << 20).expect("open");
        let (working, _) = QueueLog::open(&root.join("queues").join("working"), 1 << 20).expect("open");
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
        let (mut journal, _) = Journal::open_with_sync(&journal_directory, recorder.clone()).expect("journal");
        journal.set_checkpoint_bytes(1);
        let syncer = Syncer::start_with_sync(SyncPolicy::Always, Some(journal), recorder.clone());
        let (mut log, _) = QueueLog::open(&queues.join("q"), 512).expect("open");
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
        let (journal, _) = Journal::open_with_sync(&journal_directory, recorder.clone()).expect("journal");
        let syncer = Syncer::start_with_sync(SyncPolicy::Always, Some(journal), recorder.clone());
        let (mut log, _) = QueueLog::open(&queues.join("q"), 512).expect("open");
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
        let (mut journal, _) = Journal::open_with_sync(&journal_directory, recorder.clone()).expect("journal");
        journal.set_checkpoint_bytes(512);
        let syncer = Syncer::start_with_sync(SyncPolicy::Always, Some(journal), recorder.clone());
        let directory = queues.join("q");
        let (mut log, _) = QueueLog::open(&directory, 1024).expect("open");
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

    fn recovered_positions(log: &mut QueueLog, recovery: &Recovery) -> Vec<u64> {
        let mut cursor = log.recovered_tail(recovery);
        let messages = log.read_tail(&mut cursor, usize::MAX, usize::MAX).expect("read tail");
        messages.into_iter().map(|(position, _)| position).collect()
    }
}
