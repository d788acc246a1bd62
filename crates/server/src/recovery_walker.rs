//! The background walker that recovers the logs of the durable classic queues a start restored
//! unrecovered (issue 17 items 3 and 6: a start accepts connections once the definitions are
//! loaded, not once every queue's log is read).
//!
//! A queue recovers itself under its own lock at its first use; the walker recovers the others, on
//! up to [`crate::broker::RECOVERY_THREADS_MAX`] threads, a chunk of queues at a time: it locks
//! each free queue of the chunk that still waits, opens its log without syncing the seals the
//! recovery writes, makes every seal of the chunk durable with one `syncfs`, then installs each
//! log and unlocks the queue. A queue is served only once its seals are durable, as at a start.

use crate::queue_runtime::QueueRuntime;
use crate::queue_type::ClassicStorageError;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Queues a walker thread locks and opens before one sync of the file system makes their seals
/// durable: 100,000 queues cost about 400 syncs over all threads, and a user of a queue of the
/// chunk waits at most for the chunk's reads (a few hundred small reads).
const CHUNK_QUEUES: usize = 256;

/// The walker over the queues restored unrecovered.
#[derive(Debug)]
pub struct RecoveryWalker {
    queues: Arc<Vec<Weak<QueueRuntime>>>,
    stop: Arc<AtomicBool>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl RecoveryWalker {
    /// Starts recovering `queues` (their logs under `data_dir`) in the background.
    pub fn start(queues: Vec<Weak<QueueRuntime>>, data_dir: PathBuf) -> RecoveryWalker {
        let queues = Arc::new(queues);
        let stop = Arc::new(AtomicBool::new(false));
        let (walked, stopped) = (queues.clone(), stop.clone());
        let thread = (!queues.is_empty())
            .then(|| std::thread::Builder::new().name("lepus-recovery".into()).spawn(move || walk(&walked, &data_dir, &stopped)))
            .and_then(|spawned| {
                spawned.map_err(|error| tracing::error!(%error, "starting the recovery walker failed; queues recover at first use")).ok()
            });
        RecoveryWalker { queues, stop, thread: parking_lot::Mutex::new(thread) }
    }

    /// Stops the walk after the chunks under way (graceful shutdown) and waits for it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }

    /// Whether every queue restored unrecovered was recovered (or is gone).
    pub fn all_recovered(&self) -> bool {
        self.queues.iter().all(|queue| queue.upgrade().is_none_or(|queue| queue.is_recovered()))
    }
}

/// Delays the walk by this many milliseconds, when set: for tests that touch queues the walker has
/// not reached yet (`interop/python/tests/test_restart_lazy_recovery.py`).
const PAUSE_ENVIRONMENT_VARIABLE: &str = "LEPUS_RECOVERY_WALKER_PAUSE_MS";

/// How long the walk waits between looks at the stop flag while paused.
const PAUSE_STEP_MS: u64 = 50;

fn walk(queues: &[Weak<QueueRuntime>], data_dir: &std::path::Path, stop: &AtomicBool) {
    let started = Instant::now();
    let pause_ms = std::env::var(PAUSE_ENVIRONMENT_VARIABLE).ok().and_then(|value| value.parse::<u64>().ok()).unwrap_or(0);
    if pause_ms > 0 {
        tracing::warn!(pause_ms, "the recovery walker waits ({PAUSE_ENVIRONMENT_VARIABLE})");
        let resume = started + std::time::Duration::from_millis(pause_ms);
        while Instant::now() < resume {
            if stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(PAUSE_STEP_MS));
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, |cores| cores.get() * 4).clamp(1, crate::broker::RECOVERY_THREADS_MAX);
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    let first = next.fetch_add(CHUNK_QUEUES, Ordering::Relaxed);
                    let Some(chunk) = queues.get(first..queues.len().min(first + CHUNK_QUEUES)).filter(|chunk| !chunk.is_empty()) else {
                        break;
                    };
                    let chunk: Vec<Arc<QueueRuntime>> = chunk.iter().filter_map(Weak::upgrade).collect();
                    recover_chunk(&chunk, data_dir);
                }
            });
        }
    });
    if stop.load(Ordering::Acquire) {
        return;
    }
    // The queues that were locked when their chunk came (their users recovered them, or do now).
    for queue in queues.iter().filter_map(Weak::upgrade) {
        if stop.load(Ordering::Acquire) {
            return;
        }
        queue.recover_now();
    }
    tracing::info!(
        queues = queues.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "recovered every restored classic queue's log in the background"
    );
}

fn recover_chunk(chunk: &[Arc<QueueRuntime>], data_dir: &std::path::Path) {
    let mut opened = Vec::with_capacity(chunk.len());
    for queue in chunk {
        if let Some(locked) = queue.try_lock_unrecovered() {
            let log = locked.open_log();
            opened.push((locked, log));
        }
    }
    let seals_unsynced = opened.iter().any(|(_, log)| log.as_ref().is_ok_and(|log| log.seals_unsynced()));
    let synced = if seals_unsynced { storage::file_system::real().sync_file_system(data_dir) } else { Ok(()) };
    for (locked, log) in opened {
        let log = match &synced {
            Ok(()) => log,
            Err(error) => Err(ClassicStorageError::from(storage::StorageError::Io {
                path: data_dir.display().to_string(),
                source: std::io::Error::new(error.kind(), error.to_string()),
            })),
        };
        locked.install(log);
    }
}
