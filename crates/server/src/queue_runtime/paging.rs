//! Paging: a durable queue keeps a bounded window of ready messages in memory; past it, new
//! messages stay in the queue's log only and are read back in order (sequential reads of its
//! segments) as consumers drain the window. A backlog therefore costs disk, not memory, and a
//! restart scans the log without loading bodies.
//!
//! Paged messages are always the newest ready ones, so the queue's order holds: the window is
//! the head, the log the tail. Once a queue pages, every message it takes goes to the log
//! (transient ones as records that recovery ignores) until the tail is drained again.
//!
//! A priority queue (x-max-priority) pages each priority on its own, all in its one log: the
//! pager keeps a cursor per priority being paged, which yields only that priority's records (see
//! `queue_core`'s paging for which priority is read when). A cursor skips the other priorities'
//! records, so where priorities interleave, each priority's reads pass over the others' records:
//! the price of one log per queue (RabbitMQ runs one backing queue per priority instead).
//!
//! A page-in is a read off the async workers: the core asks for it once ([`queue_core::Effect::NeedPageIn`]),
//! a blocking thread plans it under the log's lock and reads without it, and its result comes back
//! under the queue's lock as `PagedIn` or `PageInFailed` with the generation it was asked under.
//! Meanwhile the queue delivers from memory, and a purge or delete makes the result stale.

use super::{perform, QueueInner, QueueRuntime};
use broker_core::Message;
use queue_core::{Command, PagedExpiry, PagedMessage, Window};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use storage::quarantine::Quarantined;
use storage::queue_log::{QueueLog, Recovery, TailCursor};
use storage::range_set::RangeSet;
use storage::record::RecordedExpiry;
use storage::syncer::SharedLog;
use storage::StorageError;

/// Ready messages a queue keeps in memory before it pages new ones to its log.
pub const QUEUE_MEMORY_MESSAGES_MAX: usize = 8192;
/// Body bytes of ready messages a queue keeps in memory before it pages.
pub const QUEUE_MEMORY_BYTES_MAX: u64 = 32 * 1024 * 1024;
/// Paging in starts when the window falls below this many messages, so reads come in batches.
pub const PAGE_IN_LOW_WATERMARK_MESSAGES: usize = QUEUE_MEMORY_MESSAGES_MAX / 2;
/// ... and below this many body bytes: a window of few large messages is full by its bytes.
pub const PAGE_IN_LOW_WATERMARK_BYTES: u64 = QUEUE_MEMORY_BYTES_MAX / 2;
/// The most bytes one page-in reads.
pub const PAGE_IN_BATCH_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The window as the core applies it.
pub(super) const WINDOW: Window = Window {
    messages_max: QUEUE_MEMORY_MESSAGES_MAX,
    bytes_max: QUEUE_MEMORY_BYTES_MAX,
    low_watermark_messages: PAGE_IN_LOW_WATERMARK_MESSAGES,
    low_watermark_bytes: PAGE_IN_LOW_WATERMARK_BYTES,
    page_in_batch_bytes_max: PAGE_IN_BATCH_BYTES_MAX as u64,
};

/// Where a paging queue's tail continues on disk.
#[derive(Debug)]
pub struct Pager {
    /// The cursor of each priority being paged (index = priority; a plain queue has one): a
    /// priority's cursor exists while it has paged messages, or dropped ones to settle.
    cursors: Vec<Option<TailCursor>>,
    /// Positions delivered before a restart (they come back redelivered).
    delivered: RangeSet,
    /// After a crash every recovered message may have been delivered.
    all_redelivered: bool,
}

impl Pager {
    /// The pager of a queue recovered with `recovery.live_count` messages on disk.
    pub fn recovered(log: &QueueLog, recovery: &Recovery, clean_shutdown: bool) -> Option<Pager> {
        (recovery.live_count > 0).then(|| Pager {
            cursors: vec![Some(log.recovered_tail(recovery).quarantining())],
            delivered: recovery.delivered.clone(),
            all_redelivered: !clean_shutdown,
        })
    }

    /// The pager of a priority queue recovered from `log`, and how many messages each priority
    /// has on disk (index = priority): one scan of the recovered tail counts them, reading no
    /// body into memory.
    pub fn recovered_with_priorities(
        log: &mut QueueLog,
        recovery: &Recovery,
        clean_shutdown: bool,
        max_priority: u8,
    ) -> Result<(Option<Pager>, Vec<u64>), StorageError> {
        if max_priority == 0 {
            return Ok((Pager::recovered(log, recovery, clean_shutdown), vec![recovery.live_count]));
        }
        let mut counting = log.recovered_tail(recovery);
        let counts = log.plan_tail_read(&counting)?.count_priorities(&mut counting, max_priority)?;
        let cursors: Vec<Option<TailCursor>> = counts
            .iter()
            .enumerate()
            .map(|(priority, count)| {
                (*count > 0).then(|| log.recovered_tail(recovery).of_priority(priority as u8, max_priority).quarantining())
            })
            .collect();
        let pager = cursors.iter().any(Option::is_some).then(|| Pager {
            cursors,
            delivered: recovery.delivered.clone(),
            all_redelivered: !clean_shutdown,
        });
        Ok((pager, counts))
    }
}

impl Pager {
    /// Notes a message of `priority` paged at `position`, written at `location`: the first one of
    /// its priority (since that priority last drained) starts its cursor, and the pager itself.
    pub(super) fn note_paged(
        pager: &mut Option<Pager>,
        location: storage::queue_log::RecordLocation,
        position: u64,
        priority: u8,
        max_priority: u8,
    ) {
        let pager = pager.get_or_insert_with(|| Pager {
            cursors: vec![None; usize::from(max_priority) + 1],
            delivered: RangeSet::new(),
            all_redelivered: false,
        });
        let Some(slot) = pager.cursors.get_mut(usize::from(priority)) else {
            tracing::error!(priority, max_priority, "a paged message above the queue's maximum priority");
            return;
        };
        if slot.is_none() {
            let cursor = TailCursor::new(location, position).quarantining();
            *slot = Some(match max_priority {
                0 => cursor,
                _ => cursor.of_priority(priority, max_priority),
            });
        }
    }

    /// Drops the cursors of priorities with nothing paged or dropped left; true when none is left
    /// (the queue no longer pages).
    fn release_drained(&mut self, messages: &broker_core::queue::QueueState) -> bool {
        for (priority, slot) in self.cursors.iter_mut().enumerate() {
            let priority = priority as u8;
            if messages.paged_count_at(priority) == 0 && messages.paged_dropped_at(priority) == 0 {
                *slot = None;
            }
        }
        self.cursors.iter().all(Option::is_none)
    }
}

/// Drops what the queue no longer pages (see [`Pager::release_drained`]).
pub(super) fn release_drained(inner: &mut QueueInner) {
    if inner.pager.as_mut().is_some_and(|pager| pager.release_drained(inner.core.messages())) {
        inner.pager = None;
    }
}

/// How often a page-in read starts over when a segment it was reading was retired under it
/// (settled through and recycled by acks that ran meanwhile); past that the error stands.
const PAGE_IN_ATTEMPTS_MAX: u32 = 3;

/// How long a basic.get waits for a page-in before it asks the queue again (a read that never
/// ends must not stall its connection for good).
pub const GET_PAGE_IN_WAIT_MAX: Duration = Duration::from_secs(1);

/// How many page-ins one basic.get waits for before it answers get-empty (each wait ends when a
/// read is applied, or after [`GET_PAGE_IN_WAIT_MAX`]): a get that consumers keep overtaking, or
/// a read that never ends, must not hold its connection for good.
pub const GET_PAGE_IN_ROUNDS_MAX: u32 = 30;

/// A page-in read handed to a blocking thread: a copy of the pager's cursor, advanced there and
/// handed back with the messages, so the queue's lock is not held while the disk is read.
struct PageInRead {
    queue: Weak<QueueRuntime>,
    /// For the log line of a quarantine.
    queue_name: String,
    log: SharedLog,
    cursor: TailCursor,
    messages_max: usize,
    bytes_max: usize,
    generation: u64,
    priority: u8,
}

/// What a page-in read brought back: the cursor past what it read, the messages, and the bad
/// ranges it stepped over (already set aside and reported).
type PageInResult = Result<(TailCursor, Vec<(u64, Message, RecordedExpiry)>, Vec<Quarantined>), StorageError>;

impl PageInRead {
    fn run(self) {
        let result = self.read();
        if let Some(queue) = self.queue.upgrade() {
            queue.finish_page_in(self.generation, self.priority, result);
        }
    }

    /// Plans the read under the log's lock (the buffered records are written first, so the read
    /// sees them), then reads without it.
    fn read(&self) -> PageInResult {
        let mut attempt = 1;
        loop {
            let plan = self.log.lock().plan_tail_read(&self.cursor)?;
            let mut cursor = self.cursor.clone();
            match plan.read_with_expiries(&mut cursor, self.messages_max, self.bytes_max) {
                Ok(messages) => {
                    let quarantined = cursor.take_quarantined();
                    if quarantined.is_empty() {
                        return Ok((cursor, messages, quarantined));
                    }
                    if plan.overtaken_by(self.log.lock().segments_retired()) {
                        // Not damage, maybe: a segment retired under the read was reused.
                        if attempt < PAGE_IN_ATTEMPTS_MAX {
                            tracing::debug!(attempt, "a segment was retired under a page-in that met bad records; reading again");
                            attempt += 1;
                            continue;
                        }
                        return Err(StorageError::Corrupt {
                            path: quarantined[0].path.display().to_string(),
                            detail: format!("bad records at offset {} while segments were retired", quarantined[0].offsets.start),
                        });
                    }
                    let file_system = self.log.lock().file_system();
                    for bad in &quarantined {
                        bad.set_aside_and_report(&*file_system, &self.queue_name);
                    }
                    return Ok((cursor, messages, quarantined));
                }
                Err(error) if attempt < PAGE_IN_ATTEMPTS_MAX && plan.overtaken_by(self.log.lock().segments_retired()) => {
                    tracing::debug!(%error, attempt, "a segment was retired under a page-in; reading again");
                    attempt += 1;
                }
                Err(error) => {
                    if matches!(error, StorageError::Corrupt { .. }) {
                        // Damage recovery did not see, maybe because the segment's index entry
                        // kept it from reading it: the next start reads every segment and ends
                        // the damaged one's replay there, reporting it, as for damage it finds.
                        self.log.lock().forget_index();
                    }
                    return Err(error);
                }
            }
        }
    }
}

/// A purge's read stepped over damage: reported, and the lost positions known exactly settled
/// with the rest (the purge took them off the counts already).
fn settle_lost(log: &mut QueueLog, cursor: &mut TailCursor, queue: &amqp_codec::ShortStr) {
    for bad in cursor.take_quarantined() {
        bad.set_aside_and_report(&*log.file_system(), &queue.to_string());
        if bad.exact {
            for (start, end) in bad.positions.ranges() {
                (start..end).for_each(|position| log.append_settled(position));
            }
        }
    }
}

/// The messages of a read as the core takes them, with their redelivered flags and expiries.
fn paged_messages(pager: &Pager, batch: Vec<(u64, Message, RecordedExpiry)>) -> Vec<PagedMessage<Arc<Message>>> {
    batch
        .into_iter()
        .map(|(position, message, expiry)| PagedMessage {
            position,
            redelivered: pager.all_redelivered || pager.delivered.contains(position),
            expiry: match expiry {
                RecordedExpiry::Never => PagedExpiry::Fixed(None),
                RecordedExpiry::AtMs(expires_at_ms) => PagedExpiry::Fixed(Some(expires_at_ms)),
                RecordedExpiry::Unrecorded => PagedExpiry::FromRead { own_ttl_ms: super::own_ttl_ms(&message) },
            },
            message: Arc::new(message),
        })
        .collect()
}

/// Runs `read` on tokio's blocking pool (bounded by its thread limit; at most one read per
/// queue is out), or on a thread of its own outside a runtime.
fn spawn_read(read: PageInRead) -> std::io::Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn_blocking(move || read.run());
            Ok(())
        }
        Err(_) => std::thread::Builder::new().name("page-in".into()).spawn(move || read.run()).map(|_| ()),
    }
}

impl QueueRuntime {
    /// Starts the read a page-in asked for (up to `messages_max` paged messages and `bytes_max`
    /// bytes; a message is read even when it alone exceeds that, so an empty window always
    /// makes progress). The core counts it in flight until [`QueueRuntime::finish_page_in`].
    pub(super) fn start_page_in(&self, inner: &mut QueueInner, messages_max: usize, bytes_max: u64, generation: u64, priority: u8) {
        let cursor = inner.pager.as_ref().and_then(|pager| pager.cursors.get(usize::from(priority))).and_then(Option::as_ref);
        let (Some(log), Some(cursor)) = (self.log(), cursor) else {
            tracing::error!(queue = %self.name(), priority, "paged messages without a pager; dropping the count");
            inner.core.apply(Command::PageInFailed { generation }, 0, &mut |_| false, &mut Vec::new());
            return;
        };
        let read = PageInRead {
            queue: self.self_reference.clone(),
            queue_name: self.name().to_string(),
            log: log.clone(),
            cursor: cursor.clone(),
            messages_max,
            bytes_max: usize::try_from(bytes_max).unwrap_or(usize::MAX),
            generation,
            priority,
        };
        if let Err(error) = spawn_read(read) {
            tracing::error!(queue = %self.name(), %error, "starting a page-in failed; the paged messages stay on disk until a restart");
            inner.core.apply(Command::PageInFailed { generation }, 0, &mut |_| false, &mut Vec::new());
        }
    }

    /// Applies a page-in's result (unless the queue no longer waits for it: a purge or delete
    /// overtook it), delivers what consumers can now take, and wakes the gets that waited.
    fn finish_page_in(self: &Arc<Self>, generation: u64, priority: u8, result: PageInResult) {
        let mut inner = self.lock();
        if !self.deleted.load(Ordering::Acquire) && inner.core.awaits_page_in(generation) {
            let command = self.page_in_command(&mut inner, generation, priority, result);
            self.run_once(&mut inner, command, perform::Context::dispatching(self));
            release_drained(&mut inner);
            self.dispatch_locked(&mut inner);
        }
        drop(inner);
        self.page_in_done.notify_waiters();
    }

    /// The command a read's result makes: its messages with their redelivered flags (the pager's
    /// cursor moves past them), or the failure.
    fn page_in_command(&self, inner: &mut QueueInner, generation: u64, priority: u8, result: PageInResult) -> Command<Arc<Message>> {
        let pager = inner.pager.as_mut();
        match (result, pager) {
            (Ok((cursor, batch, quarantined)), Some(pager)) if !quarantined.is_empty() => {
                if let Some(slot) = pager.cursors.get_mut(usize::from(priority)) {
                    *slot = Some(cursor);
                }
                let messages = paged_messages(pager, batch);
                let lost = self.settle_quarantined(&quarantined);
                Command::PagedInWithLoss { generation, messages, lost }
            }
            (Ok((cursor, batch, _)), Some(pager)) if !batch.is_empty() => {
                if let Some(slot) = pager.cursors.get_mut(usize::from(priority)) {
                    *slot = Some(cursor);
                }
                Command::PagedIn { generation, messages: paged_messages(pager, batch) }
            }
            (Ok(_), _) => {
                // The count says more is paged than the log holds: a bug or a lost segment.
                let paged = inner.core.messages().paged_count_at(priority);
                tracing::error!(queue = %self.name(), paged, priority, "paged messages missing from the log; dropping the count");
                Command::PageInFailed { generation }
            }
            (Err(error), _) => {
                tracing::error!(queue = %self.name(), %error, "reading paged messages failed; they stay on disk until a restart");
                Command::PageInFailed { generation }
            }
        }
    }

    /// Settles in the log the positions a page-in lost to damage, where they are known exactly
    /// (recovered ones), so the next start agrees with the counts; returns how many were lost.
    fn settle_quarantined(&self, quarantined: &[Quarantined]) -> u64 {
        let Some(log) = self.log() else { return 0 };
        let mut log = log.lock();
        let mut lost = 0u64;
        for bad in quarantined {
            lost = lost.saturating_add(bad.count());
            if bad.exact {
                for (start, end) in bad.positions.ranges() {
                    (start..end).for_each(|position| log.append_settled(position));
                }
            }
        }
        lost
    }

    /// Waits (without blocking the thread) until the page-in under way has been applied, or
    /// [`GET_PAGE_IN_WAIT_MAX`] passed; returns at once when none is.
    pub async fn wait_for_page_in(&self) {
        let done = self.page_in_done.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        if !self.inner.lock().core.page_in_in_flight() {
            return;
        }
        let _ = tokio::time::timeout(GET_PAGE_IN_WAIT_MAX, done).await;
    }

    /// Settles the first `count` paged messages of `priority` (purge): reads its tail through and
    /// records each as settled.
    pub(super) fn settle_paged(&self, inner: &mut QueueInner, count: u64, priority: u8) {
        let cursor = inner.pager.as_mut().and_then(|pager| pager.cursors.get_mut(usize::from(priority))).and_then(Option::as_mut);
        if let (Some(log), Some(cursor)) = (self.log(), cursor) {
            let mut log = log.lock();
            let mut left = count;
            while left > 0 {
                match log.read_tail(cursor, left.min(65_536) as usize, PAGE_IN_BATCH_BYTES_MAX) {
                    Ok(batch) if !batch.is_empty() => {
                        left = left.saturating_sub(batch.len() as u64);
                        for (position, _) in batch {
                            log.append_settled(position);
                        }
                        settle_lost(&mut log, cursor, self.name());
                    }
                    Ok(_) => {
                        settle_lost(&mut log, cursor, self.name());
                        break;
                    }
                    Err(error) => {
                        tracing::error!(queue = %self.name(), %error, "reading paged messages to purge them failed");
                        break;
                    }
                }
            }
        }
        // The purge takes every priority's paged count once all are settled.
        if let Some(pager) = inner.pager.as_mut() {
            if let Some(slot) = pager.cursors.get_mut(usize::from(priority)) {
                *slot = None;
            }
            if pager.cursors.iter().all(Option::is_none) {
                inner.pager = None;
            }
        }
    }
}
