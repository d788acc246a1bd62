//! Classic queues behind the seam: [`QueueRuntime`] holds their messages and consumers; this file
//! makes and recovers them with their logs, and turns what they report into the seam's terms.

use super::{ConfirmTicket, PublishOutcome, Queue};
use crate::dead_letter::DeadLetterSender;
use crate::dedup::DedupCache;
use crate::queue_expiry::ExpiryTimers;
use crate::queue_runtime::{max_priority, now_ms, Enqueued, ExpiryClock, Pager, QueueRuntime};
use amqp_codec::ShortStr;
use broker_core::queue::QueueState;
use broker_core::vhost::QueueDefinition;
use broker_core::Message;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use storage::queue_log::QueueLog;
use storage::syncer::{SharedLog, Syncer};
use storage::StorageError;

/// Where classic queues keep their logs, and how they are synced.
pub struct ClassicStorage<'a> {
    /// The broker's data directory (logs live under `queues/`).
    pub data_dir: &'a Path,
    /// How large a log segment grows before the next one starts.
    pub segment_bytes_max: u64,
    /// Whether logs write through the node journal (`--sync always`).
    pub journaled: bool,
    /// The group commit every log is synced by.
    pub syncer: &'a Syncer,
    /// Where queues hand their dead letters over (none: they drop them, in tests).
    pub dead_letters: Option<&'a DeadLetterSender>,
    /// Where queues with x-expires wait to be deleted.
    pub expiry_timers: &'a Arc<ExpiryTimers>,
}

/// Why a classic queue's log could not be made or recovered.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ClassicStorageError(#[from] StorageError);

/// Whether `name` is a classic queue's log directory as [`queue_file_name`] names one (lowercase
/// hex of a vhost, a zero byte and a queue name), and not another directory under `queues/`
/// (a deduplication cache's, the delayed messages', a clustered queue's `-incarnation` one).
pub fn is_queue_file_name(name: &str) -> bool {
    let hex = name.len().is_multiple_of(2) && name.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'));
    hex && (0..name.len()).step_by(2).any(|index| &name[index..index + 2] == "00")
}

/// A queue's vhost and name, hex-encoded, so any name is a valid file name.
pub fn queue_file_name(vhost: &str, name: &ShortStr) -> String {
    let mut key: Vec<u8> = vhost.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(name.as_bytes());
    key.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Where a queue's log lives.
fn queue_log_path(data_dir: &Path, vhost: &str, name: &ShortStr) -> PathBuf {
    data_dir.join("queues").join(queue_file_name(vhost, name))
}

/// The directory where durable queues with x-expires keep their last use (made at start).
pub const EXPIRY_DIRECTORY: &str = "queue-expiry";

/// The x-expires argument, in milliseconds (checked positive at declaration).
pub(super) fn expires_argument_ms(definition: &QueueDefinition) -> Option<u64> {
    definition.arguments.get("x-expires").and_then(|value| value.as_i64()).filter(|expires| *expires > 0).map(|expires| expires as u64)
}

/// A durable classic queue's log as recovery opened it, before its queue is made.
pub struct RecoveredLog {
    log: QueueLog,
    recovery: storage::queue_log::Recovery,
}

impl RecoveredLog {
    /// Whether recovery wrote seals into the log that the caller must sync (see
    /// [`QueueLog::open_without_syncing_seals`]) before the queue is served.
    pub fn seals_unsynced(&self) -> bool {
        self.recovery.seals_unsynced
    }
}

impl ClassicStorage<'_> {
    /// Opens a queue log and hands it to the group commit.
    fn open_log(&self, path: &Path) -> Result<(Arc<Mutex<QueueLog>>, storage::queue_log::Recovery), ClassicStorageError> {
        let (log, recovery) = QueueLog::open(path, self.segment_bytes_max)?;
        Ok((self.watch(log), recovery))
    }

    /// Hands a log to the group commit (through the journal with `--sync always`).
    fn watch(&self, mut log: QueueLog) -> Arc<Mutex<QueueLog>> {
        if self.journaled {
            log.use_journal();
        }
        let log = Arc::new(Mutex::new(log));
        self.syncer.watch(log.clone());
        log
    }

    /// Opens a durable classic queue's log for recovery, without syncing the seals it writes
    /// (see [`RecoveredLog::seals_unsynced`]). Touches nothing but the queue's own directory, so
    /// a start opens many logs at once on several threads.
    pub fn open_recovered_log(
        data_dir: &Path,
        segment_bytes_max: u64,
        definition: &QueueDefinition,
        vhost: &str,
    ) -> Result<RecoveredLog, ClassicStorageError> {
        let path = queue_log_path(data_dir, vhost, &definition.name);
        let (log, recovery) =
            QueueLog::open_without_syncing_seals(&path, segment_bytes_max, storage::file_cache::FileCache::node().clone())?;
        Ok(RecoveredLog { log, recovery })
    }

    /// A queue's x-expires clock; a durable queue with an expiry keeps its last use on disk.
    fn expiry_clock(&self, definition: &QueueDefinition, vhost: &str, durable: bool) -> ExpiryClock {
        let argument_ms = expires_argument_ms(definition);
        let file = durable.then(|| self.data_dir.join(EXPIRY_DIRECTORY).join(queue_file_name(vhost, &definition.name)));
        ExpiryClock::new(self.expiry_timers.clone(), file, argument_ms, now_ms())
    }

    /// The deduplication cache of a queue with x-message-deduplication (`fresh`: a new queue,
    /// whatever an older queue of the same name left behind). A cache whose log cannot be opened
    /// is one in memory, with an error logged: the queue still deduplicates until a restart.
    fn deduplication(&self, definition: &QueueDefinition, vhost: &str, durable: bool, fresh: bool) -> Option<Arc<DedupCache>> {
        let settings = broker_core::exchange::deduplication::settings(&definition.arguments, false)?;
        if !crate::dedup::persists(&settings, durable) {
            return Some(Arc::new(DedupCache::in_memory(settings)));
        }
        let directory = self.data_dir.join("queues").join(format!("dedup-queue-{}", queue_file_name(vhost, &definition.name)));
        if fresh {
            let _ = std::fs::remove_dir_all(&directory);
        }
        match DedupCache::open(settings.clone(), &directory, self.segment_bytes_max, self.journaled) {
            Ok(cache) => {
                if let Some(log) = cache.log() {
                    self.syncer.watch(log.clone());
                }
                Some(Arc::new(cache))
            }
            Err(error) => {
                tracing::error!(%error, queue = %definition.name, "opening a deduplication cache failed; keeping it in memory");
                Some(Arc::new(DedupCache::in_memory(settings)))
            }
        }
    }

    /// Makes a newly declared classic queue; a durable, non-exclusive one gets an empty log.
    pub fn create(&self, definition: &QueueDefinition, vhost: &str) -> Result<Queue, ClassicStorageError> {
        let durable = definition.durable && definition.exclusive_owner.is_none();
        let expiry = self.expiry_clock(definition, vhost, durable);
        // A new queue's clock starts now, whatever an older queue of the same name stored.
        expiry.remove_file();
        let log = if durable {
            let path = queue_log_path(self.data_dir, vhost, &definition.name);
            self.checkpoint_if_deleted_here(&path)?;
            // A queue declared anew starts with an empty log, whatever an older queue of the same
            // name left behind.
            let _ = std::fs::remove_dir_all(&path);
            Some(self.open_log(&path)?.0)
        } else {
            None
        };
        let messages = QueueState::with_max_priority(0, max_priority(&definition.arguments));
        let queue = QueueRuntime::new(definition.clone(), vhost, log, messages, None, self.dead_letters.cloned(), expiry);
        if let Some(cache) = self.deduplication(definition, vhost, durable, true) {
            queue.set_deduplication(cache);
        }
        queue.start_expiry_clock(false);
        Ok(Queue::Classic(queue))
    }

    /// A queue log deleted since the last journal checkpoint lived in `path`: the journal may
    /// still hold its writes, which a replay after a crash would put into the new log made here
    /// (the deleted queue's messages recovered under the new one). A checkpoint clears them
    /// first (found by the simulator, seed 269 of `crates/simulator`).
    fn checkpoint_if_deleted_here(&self, path: &Path) -> Result<(), ClassicStorageError> {
        let Some(deleted) = self.syncer.take_deleted_logs_if(path) else { return Ok(()) };
        if self.syncer.checkpoint(Vec::new()) {
            return Ok(());
        }
        self.syncer.restore_deleted_logs(deleted);
        let source = std::io::Error::other("the journal checkpoint before reusing a deleted queue's log directory failed");
        Err(ClassicStorageError(StorageError::Io { path: path.display().to_string(), source }))
    }

    /// After a durable classic queue's log was deleted (see `Syncer::note_deleted_log`): a
    /// queue declared anew under its name checkpoints the journal first.
    pub fn note_deleted(&self, definition: &QueueDefinition, vhost: &str) {
        let durable = definition.durable && definition.exclusive_owner.is_none();
        if self.journaled && durable && definition.queue_type == broker_core::vhost::QueueType::Classic {
            self.syncer.note_deleted_log(&queue_log_path(self.data_dir, vhost, &definition.name));
        }
    }

    /// A clustered node's classic queue, declared by the metadata log's entry `incarnation`: a
    /// durable one's log is named by it, so replaying the log after a restart recovers the
    /// queue's messages where the entry that made it is replayed, and the replay of an older
    /// queue of the same name (made and deleted before) never touches this one's log.
    pub fn open_incarnation(&self, definition: &QueueDefinition, vhost: &str, incarnation: u64) -> Result<Queue, ClassicStorageError> {
        let durable = definition.durable && definition.exclusive_owner.is_none();
        if !durable {
            return self.create(definition, vhost);
        }
        let base = queue_log_path(self.data_dir, vhost, &definition.name);
        let path = base.with_file_name(format!("{}-{incarnation}", queue_file_name(vhost, &definition.name)));
        let existed = path.exists();
        let (log, recovery) = self.open_log(&path)?;
        if existed {
            // The metadata log replayed after a restart: the queue comes back as at a start, its
            // priorities and deduplication cache included (every message flagged redelivered).
            return self.recovered_queue(definition, vhost, false, log, recovery).map(|(queue, _)| queue);
        }
        let expiry = self.expiry_clock(definition, vhost, true);
        expiry.remove_file();
        // Made as a single node's declare makes it: x-max-priority and deduplication included.
        let messages = QueueState::with_max_priority(0, max_priority(&definition.arguments));
        let queue = QueueRuntime::new(definition.clone(), vhost, Some(log), messages, None, self.dead_letters.cloned(), expiry);
        if let Some(cache) = self.deduplication(definition, vhost, true, true) {
            queue.set_deduplication(cache);
        }
        queue.start_expiry_clock(false);
        Ok(Queue::Classic(queue))
    }

    /// Makes a durable classic queue from the log [`ClassicStorage::open_recovered_log`] opened
    /// (once its seals are durable); returns it and how many messages it holds.
    pub fn recover_opened(
        &self,
        definition: &QueueDefinition,
        vhost: &str,
        clean_shutdown: bool,
        opened: RecoveredLog,
    ) -> Result<(Queue, u64), ClassicStorageError> {
        let log = self.watch(opened.log);
        self.recovered_queue(definition, vhost, clean_shutdown, log, opened.recovery)
    }

    fn recovered_queue(
        &self,
        definition: &QueueDefinition,
        vhost: &str,
        clean_shutdown: bool,
        log: Arc<Mutex<QueueLog>>,
        recovery: storage::queue_log::Recovery,
    ) -> Result<(Queue, u64), ClassicStorageError> {
        let parts = recovered_parts(definition, clean_shutdown, log, &recovery)?;
        let expiry = self.expiry_clock(definition, vhost, true);
        let queue =
            QueueRuntime::new(definition.clone(), vhost, Some(parts.log), parts.messages, parts.pager, self.dead_letters.cloned(), expiry);
        if let Some(cache) = self.deduplication(definition, vhost, true, false) {
            queue.set_deduplication(cache);
        }
        queue.start_expiry_clock(true);
        Ok((Queue::Classic(queue), recovery.live_count))
    }

    /// Whether a recovered queue may wait for its log to be recovered after the start (see
    /// [`LazyRecovery`]): not one with a deduplication cache, which a publish reads before the
    /// queue's lock, where a first use recovers.
    pub fn recovers_lazily(definition: &QueueDefinition) -> bool {
        broker_core::exchange::deduplication::settings(&definition.arguments, false).is_none()
    }

    /// A durable classic queue restored from its definition with its log not yet recovered: the
    /// first use (under the queue's lock) or the background walker recovers it through
    /// `recovery`. Its x-expires clock runs from now as a recovered queue's does.
    /// `stored_last_uses`: the names of the files in [`EXPIRY_DIRECTORY`], listed once for all the
    /// queues of a start (none when it could not be listed: each queue's file is then read).
    pub fn restore_unrecovered(
        &self,
        definition: &QueueDefinition,
        vhost: &str,
        recovery: Arc<LazyRecovery>,
        stored_last_uses: Option<&std::collections::HashSet<String>>,
    ) -> Queue {
        let expiry = self.expiry_clock(definition, vhost, true);
        let queue = QueueRuntime::unrecovered(definition.clone(), vhost, self.dead_letters.cloned(), expiry, recovery);
        let last_use_stored =
            stored_last_uses.is_none_or(|names| !names.is_empty() && names.contains(&queue_file_name(vhost, &definition.name)));
        queue.start_recovered_expiry_clock(last_use_stored);
        Queue::Classic(queue)
    }

    /// The names of the stored last uses of queues with x-expires, or none when the directory
    /// cannot be listed.
    pub fn stored_last_uses(&self) -> Option<std::collections::HashSet<String>> {
        let directory = self.data_dir.join(EXPIRY_DIRECTORY);
        storage::file_system::real().list_directory(&directory).ok().map(|names| names.into_iter().collect())
    }

    /// What the queues restored unrecovered need to recover their logs later.
    pub fn lazy_recovery(&self, clean_shutdown: bool) -> Arc<LazyRecovery> {
        Arc::new(LazyRecovery {
            data_dir: self.data_dir.to_path_buf(),
            segment_bytes_max: self.segment_bytes_max,
            journaled: self.journaled,
            syncer: self.syncer.clone(),
            clean_shutdown,
        })
    }
}

/// What a classic queue is built on once its log is recovered.
pub struct RecoveredParts {
    /// The log, handed to the group commit.
    pub log: SharedLog,
    /// The recovered messages, all paged.
    pub messages: QueueState,
    /// Where the paged messages are read from.
    pub pager: Option<Pager>,
}

/// Builds the pager and the paged message counts over a recovered log.
fn recovered_parts(
    definition: &QueueDefinition,
    clean_shutdown: bool,
    log: SharedLog,
    recovery: &storage::queue_log::Recovery,
) -> Result<RecoveredParts, ClassicStorageError> {
    for (file, offset) in &recovery.truncated {
        tracing::error!(file = %file.display(), offset, queue = %definition.name, "recovered the intact part of a damaged segment");
    }
    // Recovered messages stay on disk; the queue pages them in as consumers need them. After a
    // crash the delivered markers may be missing, so every recovered message may have been
    // delivered: the pager flags them all, as at-least-once allows.
    // A priority queue counts its messages by priority first, with one scan of the log.
    let (pager, paged) = Pager::recovered_with_priorities(&mut log.lock(), recovery, clean_shutdown, max_priority(&definition.arguments))?;
    let messages = QueueState::with_paged_priorities(recovery.next_position, &paged);
    Ok(RecoveredParts { log, messages, pager })
}

/// What a durable classic queue restored at start without its messages needs to recover its log
/// later: on its first use, under its lock, or from the background walker (`recovery_walker.rs`).
/// One for all the queues of a start.
pub struct LazyRecovery {
    data_dir: PathBuf,
    segment_bytes_max: u64,
    journaled: bool,
    syncer: Syncer,
    /// Whether the previous run stopped gracefully (its delivered markers decide `redelivered`).
    clean_shutdown: bool,
}

impl std::fmt::Debug for LazyRecovery {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("LazyRecovery").field("data_dir", &self.data_dir).field("clean_shutdown", &self.clean_shutdown).finish()
    }
}

impl LazyRecovery {
    /// Opens a queue's log: `sync_seals` false leaves the seals it writes unsynced, for the caller
    /// to make durable (one sync of the file system for many logs) before the queue is served.
    pub fn open_log(&self, definition: &QueueDefinition, vhost: &str, sync_seals: bool) -> Result<RecoveredLog, ClassicStorageError> {
        let path = queue_log_path(&self.data_dir, vhost, &definition.name);
        let (log, recovery) = if sync_seals {
            QueueLog::open(&path, self.segment_bytes_max)?
        } else {
            QueueLog::open_without_syncing_seals(&path, self.segment_bytes_max, storage::file_cache::FileCache::node().clone())?
        };
        Ok(RecoveredLog { log, recovery })
    }

    /// Hands an opened log (its seals durable) to the group commit and builds the queue's parts.
    pub fn parts(&self, definition: &QueueDefinition, opened: RecoveredLog) -> Result<RecoveredParts, ClassicStorageError> {
        let mut log = opened.log;
        if self.journaled {
            log.use_journal();
        }
        let log = Arc::new(Mutex::new(log));
        self.syncer.watch(log.clone());
        recovered_parts(definition, self.clean_shutdown, log, &opened.recovery)
    }
}

/// Enqueues a message in a classic queue: a persistent message in a durable queue is confirmed
/// once its log is synced.
#[inline]
pub(super) fn publish(queue: &Arc<QueueRuntime>, message: Arc<Message>) -> PublishOutcome {
    match queue.publish(message) {
        Enqueued::Logged(log) => PublishOutcome::Accepted(ConfirmTicket::LogSynced(log)),
        Enqueued::InMemory => PublishOutcome::Accepted(ConfirmTicket::Immediate),
        // A zero length limit with drop-head, or a queue being deleted: RabbitMQ confirms both and
        // returns neither (the message was routed), and nothing was written to wait for.
        Enqueued::Dropped => PublishOutcome::Dropped,
        Enqueued::Rejected => PublishOutcome::Rejected,
    }
}
