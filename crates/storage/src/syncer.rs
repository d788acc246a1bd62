//! Group commit: one thread writes every log that has buffered records and fdatasyncs them, then
//! runs the callbacks waiting on those records (publisher confirms). Whatever arrives while a sync
//! runs is covered by the next one, so the number of fsyncs per second stays bounded by the disk,
//! not by the message rate.

use crate::queue_log::QueueLog;
use parking_lot::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

/// A log shared between its queue and the syncer.
pub type SharedLog = Arc<Mutex<QueueLog>>;

/// Called once the records it waited for are on disk (`true`) or could not be made durable (`false`).
pub type SyncCallback = Box<dyn FnOnce(bool) + Send>;

/// How long the syncer waits for work before it flushes dirty logs anyway (settle records and
/// publishes without confirms are made durable at least this often).
pub const IDLE_FLUSH_INTERVAL_MS: u64 = 200;
/// How many requests one group commit takes at most, so callbacks are not delayed without bound.
pub const SYNC_BATCH_REQUESTS_MAX: usize = 65_536;

struct SyncRequest {
    logs: Vec<SharedLog>,
    callback: Option<SyncCallback>,
}

/// The handle publishers use to ask for durability.
#[derive(Clone)]
pub struct Syncer {
    sender: Sender<SyncRequest>,
}

impl Syncer {
    /// Starts the syncer thread.
    pub fn start() -> Syncer {
        let (sender, receiver) = mpsc::channel();
        std::thread::Builder::new().name("lepus-syncer".to_string()).spawn(move || run(receiver)).expect("spawning the syncer thread");
        Syncer { sender }
    }

    /// Makes the records buffered in `logs` durable, then calls `callback`.
    pub fn sync(&self, logs: Vec<SharedLog>, callback: Option<SyncCallback>) {
        if let Err(mpsc::SendError(request)) = self.sender.send(SyncRequest { logs, callback }) {
            // The syncer only stops when the process does; refuse the confirm rather than lie.
            if let Some(callback) = request.callback {
                callback(false);
            }
        }
    }
}

fn run(receiver: Receiver<SyncRequest>) {
    let mut known_logs: Vec<SharedLog> = Vec::new();
    loop {
        let first = match receiver.recv_timeout(Duration::from_millis(IDLE_FLUSH_INTERVAL_MS)) {
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
        let durable = sync_all(&logs);
        for request in requests {
            if let Some(callback) = request.callback {
                callback(durable);
            }
        }
    }
}

fn sync_all(logs: &[SharedLog]) -> bool {
    let mut all_durable = true;
    for log in logs {
        let written = log.lock().write_pending();
        let result = match written {
            Ok(files) => files.iter().try_for_each(|file| file.sync_data()).map_err(|error| error.to_string()),
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = result {
            tracing::error!(%error, "writing or syncing a queue log failed; confirms for it are nacked");
            all_durable = false;
        }
    }
    all_durable
}

/// Registers a log with the syncer for periodic flushing without waiting on it.
pub fn note_dirty(syncer: &Syncer, log: &SharedLog) {
    syncer.sync(vec![log.clone()], None);
}
