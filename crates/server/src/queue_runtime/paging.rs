//! Paging: a durable queue keeps a bounded window of ready messages in memory; past it, new
//! messages stay in the queue's log only and are read back in order (sequential reads of its
//! segments) as consumers drain the window. A backlog therefore costs disk, not memory, and a
//! restart scans the log without loading bodies.
//!
//! Paged messages are always the newest ready ones, so the queue's order holds: the window is
//! the head, the log the tail. Once a queue pages, every message it takes goes to the log
//! (transient ones as records that recovery ignores) until the tail is drained again.

use super::{QueueInner, QueueRuntime};
use queue_core::{Command, Window};
use std::sync::Arc;
use storage::queue_log::{QueueLog, Recovery, TailCursor};
use storage::range_set::RangeSet;

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
    cursor: TailCursor,
    /// Positions delivered before a restart (they come back redelivered).
    delivered: RangeSet,
    /// After a crash every recovered message may have been delivered.
    all_redelivered: bool,
}

impl Pager {
    /// The pager of a queue recovered with `recovery.live_count` messages on disk.
    pub fn recovered(log: &QueueLog, recovery: &Recovery, clean_shutdown: bool) -> Option<Pager> {
        (recovery.live_count > 0).then(|| Pager {
            cursor: log.recovered_tail(recovery),
            delivered: recovery.delivered.clone(),
            all_redelivered: !clean_shutdown,
        })
    }
}

impl Pager {
    /// The pager of a queue that starts paging at `position`, written at `location`.
    pub(super) fn starting_at(location: storage::queue_log::RecordLocation, position: u64) -> Pager {
        Pager { cursor: TailCursor::new(location, position), delivered: RangeSet::new(), all_redelivered: false }
    }
}

impl QueueRuntime {
    /// Reads up to `messages_max` paged messages (and `bytes_max` bytes; a message is read even
    /// when it alone exceeds that, so an empty window always makes progress) into the core.
    pub(super) fn read_page(&self, inner: &mut QueueInner, messages_max: usize, bytes_max: u64) {
        let QueueInner { core, pager, .. } = inner;
        let (Some(log), Some(reader)) = (self.log.as_ref(), pager.as_mut()) else {
            tracing::error!(queue = %self.name(), "paged messages without a pager; dropping the count");
            core.apply(Command::ForgetPaged, 0, &mut |_| false, &mut Vec::new());
            return;
        };
        let batch = log.lock().read_tail(&mut reader.cursor, messages_max, bytes_max as usize);
        match batch {
            Ok(batch) if !batch.is_empty() => {
                for (position, message) in batch {
                    let redelivered = reader.all_redelivered || reader.delivered.contains(position);
                    let own_ttl_ms = super::own_ttl_ms(&message);
                    let paged_in = Command::PagedIn { position, message: Arc::new(message), redelivered, own_ttl_ms };
                    core.apply(paged_in, super::now_ms(), &mut |_| false, &mut Vec::new());
                }
            }
            Ok(_) => {
                // The count says more is paged than the log holds: a bug or a lost segment.
                tracing::error!(queue = %self.name(), paged = core.messages().paged_count(), "paged messages missing from the log; dropping the count");
                core.apply(Command::ForgetPaged, 0, &mut |_| false, &mut Vec::new());
            }
            Err(error) => {
                tracing::error!(queue = %self.name(), %error, "reading paged messages failed; they stay on disk until a restart");
                core.apply(Command::ForgetPaged, 0, &mut |_| false, &mut Vec::new());
            }
        }
        if core.messages().paged_count() == 0 {
            *pager = None;
        }
    }

    /// Settles the first `count` paged messages (purge): reads the tail through and records each
    /// as settled.
    pub(super) fn settle_paged(&self, inner: &mut QueueInner, count: u64) {
        if let (Some(log), Some(pager)) = (self.log.as_ref(), inner.pager.as_mut()) {
            let mut log = log.lock();
            let mut left = count;
            while left > 0 {
                match log.read_tail(&mut pager.cursor, left.min(65_536) as usize, PAGE_IN_BATCH_BYTES_MAX) {
                    Ok(batch) if !batch.is_empty() => {
                        left -= batch.len() as u64;
                        for (position, _) in batch {
                            log.append_settled(position);
                        }
                    }
                    Ok(_) => break,
                    Err(error) => {
                        tracing::error!(queue = %self.name(), %error, "reading paged messages to purge them failed");
                        break;
                    }
                }
            }
        }
        if inner.core.messages().paged_count() == 0 {
            inner.pager = None;
        }
    }
}
