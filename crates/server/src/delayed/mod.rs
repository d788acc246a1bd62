//! Delayed messages: the store behind `x-delayed-message` exchanges (RabbitMQ's
//! rabbitmq-delayed-message-exchange plugin; the routing rules are in
//! `broker_core::exchange::delayed`).
//!
//! A message a delayed exchange holds back goes to one node-wide *delay store*: a queue log
//! (checksummed segments, group commit, recycling, recovery, the node journal under `--sync
//! always`) in `queues/delayed-messages`, each message a publish record wrapped in an
//! [`envelope`] that says when it is due and where it goes. Memory holds only an index: a binary
//! heap of (due time, record location), 24 bytes a message, so a million pending messages cost
//! about 24 MiB (48 MiB while the heap's vector doubles) and their bodies stay on disk. A restart
//! rebuilds the index with one scan of the store.
//!
//! One thread fires every timer: it sleeps on a condition variable until the earliest due time
//! (woken early when a sooner message arrives), reads the due records at their locations, and
//! routes each from its delayed exchange with `x-delay` negated, as the plugin does. A due message
//! leaves the store only once every queue it went to holds it safely (their confirm tickets are
//! settled): a crash in between routes it again after the restart, a duplicate, never a loss.
//!
//! Durability follows the plugin's and Lepus's rules together: a persistent message published to
//! a durable delayed exchange is written as a persistent record and confirmed once the store is
//! fdatasynced; any other is written as a transient record (its body still on disk, not in
//! memory), confirmed at once, and gone after a restart, like its exchange or its queue's copy.
//!
//! Where the plugin differs, and Lepus follows it: a delayed message routes nowhere at publish, so
//! a mandatory publish gets `basic.return` 312 NO_ROUTE and the exchange's alternate exchange gets
//! a copy at once; at its due time it is routed through the exchange's bindings of that moment
//! (none if the exchange was deleted: it is dropped). Where Lepus does better: the plugin keeps
//! bodies in Mnesia's memory and confirms before they reach the disk.

pub mod envelope;
pub mod replicated;
mod timer;

use crate::queue_type::ConfirmTicket;
use broker_core::vhost::DelayedRoute;
use broker_core::Message;
use envelope::Envelope;
use parking_lot::{Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use storage::queue_log::{QueueLog, RecordLocation};
use storage::syncer::SharedLog;
use storage::StorageError;

pub use timer::start;

/// The delay store's directory under the data directory's `queues/` (not hex, so never a queue's).
pub const DELAYED_DIRECTORY: &str = "delayed-messages";

/// How many records a restart reads at a time while it rebuilds the index.
pub const RECOVERY_BATCH_RECORDS_MAX: usize = 4096;
/// ... and how many bytes.
pub const RECOVERY_BATCH_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Lateness is counted per whole millisecond up to this many; later ones share the last bucket.
pub const LATENESS_BUCKETS_MS: usize = 100;

/// How late the timer routed due messages (routing time minus due time, in whole ms): the timer
/// accuracy the metrics report, counted without a lock.
#[derive(Debug)]
pub struct Lateness {
    /// `buckets[n]`: messages routed `n` ms late; the last, `LATENESS_BUCKETS_MS` or later.
    pub buckets: [AtomicU64; LATENESS_BUCKETS_MS + 1],
    /// The latest of all, in ms.
    pub max_ms: AtomicU64,
    /// The sum, in ms.
    pub total_ms: AtomicU64,
}

impl Lateness {
    fn record(&self, lateness_ms: u64) {
        let bucket = (lateness_ms as usize).min(LATENESS_BUCKETS_MS);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.max_ms.fetch_max(lateness_ms, Ordering::Relaxed);
        self.total_ms.fetch_add(lateness_ms, Ordering::Relaxed);
    }
}

/// A pending message in the index: when it is due, and where its record starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    due_ms: u64,
    segment: u64,
    offset: u64,
}

impl Due {
    fn location(&self) -> RecordLocation {
        RecordLocation { segment: self.segment, offset: self.offset }
    }
}

/// The index and the next position of the store.
#[derive(Debug, Default)]
struct DelayState {
    /// Pending messages, earliest first.
    index: BinaryHeap<Reverse<Due>>,
    /// The position the next stored message gets.
    next_position: u64,
}

/// The node's delay store and its index.
#[derive(Debug)]
pub struct DelayedMessages {
    log: SharedLog,
    state: Mutex<DelayState>,
    /// Wakes the timer thread: a message due sooner than all others arrived, or the store stops.
    wake: Condvar,
    stopped: AtomicBool,
    /// How late due messages were routed.
    pub lateness: Lateness,
    /// On a clustered node: the cluster's replicated store, where new delayed messages go (what
    /// this node's own store held before is still routed from it).
    replicated: std::sync::OnceLock<replicated::ReplicatedDelays>,
}

impl DelayedMessages {
    /// Opens (creating) the delay store under `data_dir` and rebuilds its index from what it
    /// holds; `journaled` routes its writes through the node journal (`--sync always`).
    pub fn open(data_dir: &Path, segment_bytes_max: u64, journaled: bool) -> Result<DelayedMessages, StorageError> {
        let (mut log, recovery) = QueueLog::open(&data_dir.join("queues").join(DELAYED_DIRECTORY), segment_bytes_max)?;
        for (file, offset) in &recovery.truncated {
            tracing::error!(file = %file.display(), offset, "recovered the intact part of a damaged delay-store segment");
        }
        if journaled {
            log.use_journal();
        }
        let mut state = DelayState { index: BinaryHeap::new(), next_position: recovery.next_position };
        if recovery.live_count > 0 {
            let mut cursor = log.recovered_tail(&recovery);
            loop {
                let plan = log.plan_tail_read(&cursor)?;
                let batch = plan.read_located(&mut cursor, RECOVERY_BATCH_RECORDS_MAX, RECOVERY_BATCH_BYTES_MAX)?;
                if batch.is_empty() {
                    break;
                }
                for (position, location, stored) in batch {
                    match envelope::unwrap(stored) {
                        Some((envelope, _)) => {
                            state.index.push(Reverse(Due { due_ms: envelope.due_ms, segment: location.segment, offset: location.offset }))
                        }
                        None => {
                            tracing::error!(position, "a delay-store record is not a delayed message; dropped");
                            log.append_settled(position);
                        }
                    }
                }
            }
            tracing::info!(pending = state.index.len(), "recovered delayed messages");
        }
        Ok(DelayedMessages {
            log: Arc::new(Mutex::new(log)),
            state: Mutex::new(state),
            wake: Condvar::new(),
            stopped: AtomicBool::new(false),
            lateness: Lateness {
                buckets: std::array::from_fn(|_| AtomicU64::new(0)),
                max_ms: AtomicU64::new(0),
                total_ms: AtomicU64::new(0),
            },
            replicated: std::sync::OnceLock::new(),
        })
    }

    /// Holds new delayed messages in the cluster's replicated store from now on.
    pub fn replicate_through(&self, store: replicated::ReplicatedDelays) {
        if self.replicated.set(store).is_err() {
            tracing::error!("the cluster's delay store was set twice; the first is kept");
        }
    }

    /// The cluster's replicated store, on a clustered node.
    pub fn replicated(&self) -> Option<&replicated::ReplicatedDelays> {
        self.replicated.get()
    }

    /// The store's log (for the group commit and for flushing at shutdown).
    pub fn log(&self) -> &SharedLog {
        &self.log
    }

    /// Messages waiting for their delay (in a cluster, the replicated store's too).
    pub fn pending(&self) -> u64 {
        let replicated = self.replicated.get().map_or(0, |store| store.held.load(Ordering::Relaxed));
        self.state.lock().index.len() as u64 + replicated
    }

    /// Holds `message` back for `route.delay_ms`, to be routed from `route.exchange` in `vhost`
    /// then. The ticket says when a confirm may go: once the store is synced for a persistent
    /// message to a durable exchange, at once for any other.
    pub fn delay(&self, vhost: &str, route: &DelayedRoute, message: &Message, durable_exchange: bool) -> ConfirmTicket {
        let due_ms = now_ms_rounded_up().saturating_add(route.delay_ms);
        let envelope = Envelope { due_ms, delay_ms: route.delay_ms, vhost: vhost.to_string(), exchange: route.exchange.clone() };
        let stored = envelope::wrap(&envelope, message);
        if let Some(store) = self.replicated.get() {
            // Replicated whatever its persistence: the store is the cluster's, not this node's.
            return store.queue.hold_delayed(due_ms, store.node, crate::quorum::envelope::encode(&stored));
        }
        let persistent = durable_exchange && message.is_persistent();
        let mut state = self.state.lock();
        let position = state.next_position;
        state.next_position += 1;
        let location = self.log.lock().append_publish(position, &stored, persistent, None);
        let sooner = state.index.peek().is_none_or(|Reverse(first)| due_ms < first.due_ms);
        state.index.push(Reverse(Due { due_ms, segment: location.segment, offset: location.offset }));
        drop(state);
        if sooner {
            self.wake.notify_one();
        }
        match persistent {
            true => ConfirmTicket::LogSynced(self.log.clone()),
            false => ConfirmTicket::Immediate,
        }
    }

    /// Stops the timer thread (at shutdown; pending messages stay in the store).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let _state = self.state.lock();
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests;

/// The wall clock in milliseconds, rounded up: the timer fires once the floored clock reaches a
/// due time, so a due time made from the floored clock could route a message up to a millisecond
/// before its delay had passed (the million-message bench saw 6 % arrive early by the client's
/// clock). Rounded up, a message is never routed before its delay.
fn now_ms_rounded_up() -> u64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    since_epoch.as_micros().div_ceil(1000) as u64
}
