//! Classic queues behind the seam: [`QueueRuntime`] holds their messages and consumers; this file
//! makes and recovers them with their logs, and turns what they report into the seam's terms.

use super::{ConfirmTicket, PublishOutcome, Queue};
use crate::dead_letter::DeadLetterSender;
use crate::queue_runtime::{Enqueued, Pager, QueueRuntime};
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
}

/// Why a classic queue's log could not be made or recovered.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ClassicStorageError(#[from] StorageError);

/// Where a queue's log lives: its vhost and name, hex-encoded, so any name is a valid file name.
fn queue_log_path(data_dir: &Path, vhost: &str, name: &ShortStr) -> PathBuf {
    let mut key: Vec<u8> = vhost.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(name.as_bytes());
    let hex: String = key.iter().map(|byte| format!("{byte:02x}")).collect();
    data_dir.join("queues").join(hex)
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

    /// Makes a newly declared classic queue; a durable, non-exclusive one gets an empty log.
    pub fn create(&self, definition: &QueueDefinition, vhost: &str) -> Result<Queue, ClassicStorageError> {
        let log = if definition.durable && definition.exclusive_owner.is_none() {
            let path = queue_log_path(self.data_dir, vhost, &definition.name);
            // A queue declared anew starts with an empty log, whatever an older queue of the same
            // name left behind.
            let _ = std::fs::remove_dir_all(&path);
            Some(self.open_log(&path)?.0)
        } else {
            None
        };
        Ok(Queue::Classic(QueueRuntime::new(definition.clone(), vhost, log, QueueState::new(0), None, self.dead_letters.cloned())))
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
        let queue = QueueRuntime::new(definition.clone(), vhost, Some(log), messages, pager, self.dead_letters.cloned());
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
