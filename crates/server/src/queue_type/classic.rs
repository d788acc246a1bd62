//! Classic queues behind the seam: [`QueueRuntime`] holds their messages and consumers; this file
//! makes and recovers them with their logs, and turns what they report into the seam's terms.

use super::{ConfirmTicket, PublishOutcome, Queue};
use crate::dead_letter::DeadLetterSender;
use crate::queue_expiry::ExpiryTimers;
use crate::queue_runtime::{now_ms, Enqueued, ExpiryClock, Pager, QueueRuntime};
use amqp_codec::ShortStr;
use broker_core::queue::QueueState;
use broker_core::vhost::QueueDefinition;
use broker_core::Message;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use storage::queue_log::QueueLog;
use storage::syncer::Syncer;
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

/// A queue's vhost and name, hex-encoded, so any name is a valid file name.
pub(super) fn queue_file_name(vhost: &str, name: &ShortStr) -> String {
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
fn expires_argument_ms(definition: &QueueDefinition) -> Option<u64> {
    definition.arguments.get("x-expires").and_then(|value| value.as_i64()).filter(|expires| *expires > 0).map(|expires| expires as u64)
}

impl ClassicStorage<'_> {
    /// Opens a queue log and hands it to the group commit.
    fn open_log(&self, path: &Path) -> Result<(Arc<Mutex<QueueLog>>, storage::queue_log::Recovery), ClassicStorageError> {
        let (mut log, recovery) = QueueLog::open(path, self.segment_bytes_max)?;
        if self.journaled {
            log.use_journal();
        }
        let log = Arc::new(Mutex::new(log));
        self.syncer.watch(log.clone());
        Ok((log, recovery))
    }

    /// A queue's x-expires clock; a durable queue with an expiry keeps its last use on disk.
    fn expiry_clock(&self, definition: &QueueDefinition, vhost: &str, durable: bool) -> ExpiryClock {
        let argument_ms = expires_argument_ms(definition);
        let file = durable.then(|| self.data_dir.join(EXPIRY_DIRECTORY).join(queue_file_name(vhost, &definition.name)));
        ExpiryClock::new(self.expiry_timers.clone(), file, argument_ms, now_ms())
    }

    /// Makes a newly declared classic queue; a durable, non-exclusive one gets an empty log.
    pub fn create(&self, definition: &QueueDefinition, vhost: &str) -> Result<Queue, ClassicStorageError> {
        let durable = definition.durable && definition.exclusive_owner.is_none();
        let expiry = self.expiry_clock(definition, vhost, durable);
        // A new queue's clock starts now, whatever an older queue of the same name stored.
        expiry.remove_file();
        let log = if durable {
            let path = queue_log_path(self.data_dir, vhost, &definition.name);
            // A queue declared anew starts with an empty log, whatever an older queue of the same
            // name left behind.
            let _ = std::fs::remove_dir_all(&path);
            Some(self.open_log(&path)?.0)
        } else {
            None
        };
        let queue = QueueRuntime::new(definition.clone(), vhost, log, QueueState::new(0), None, self.dead_letters.cloned(), expiry);
        queue.start_expiry_clock(false);
        Ok(Queue::Classic(queue))
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
        let pager = if existed { Pager::recovered(&log.lock(), &recovery, false) } else { None };
        let messages = if existed { QueueState::with_paged(recovery.next_position, recovery.live_count) } else { QueueState::new(0) };
        let expiry = self.expiry_clock(definition, vhost, true);
        if !existed {
            expiry.remove_file();
        }
        let queue = QueueRuntime::new(definition.clone(), vhost, Some(log), messages, pager, self.dead_letters.cloned(), expiry);
        queue.start_expiry_clock(existed);
        Ok(Queue::Classic(queue))
    }

    /// Recovers a durable classic queue from its log; returns it and how many messages it holds.
    pub fn recover(&self, definition: &QueueDefinition, vhost: &str, clean_shutdown: bool) -> Result<(Queue, u64), ClassicStorageError> {
        let path = queue_log_path(self.data_dir, vhost, &definition.name);
        let (log, recovery) = self.open_log(&path)?;
        for (file, offset) in &recovery.truncated {
            tracing::error!(file = %file.display(), offset, queue = %definition.name, "recovered the intact part of a damaged segment");
        }
        // Recovered messages stay on disk; the queue pages them in as consumers need them. After a
        // crash the delivered markers may be missing, so every recovered message may have been
        // delivered: the pager flags them all, as at-least-once allows.
        let pager = Pager::recovered(&log.lock(), &recovery, clean_shutdown);
        let messages = QueueState::with_paged(recovery.next_position, recovery.live_count);
        let expiry = self.expiry_clock(definition, vhost, true);
        let queue = QueueRuntime::new(definition.clone(), vhost, Some(log), messages, pager, self.dead_letters.cloned(), expiry);
        queue.start_expiry_clock(true);
        Ok((Queue::Classic(queue), recovery.live_count))
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
