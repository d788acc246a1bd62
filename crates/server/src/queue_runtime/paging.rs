//! Paging: a durable queue keeps a bounded window of ready messages in memory; past it, new
//! messages stay in the queue's log only and are read back in order (sequential reads of its
//! segments) as consumers drain the window. A backlog therefore costs disk, not memory, and a
//! restart scans the log without loading bodies.
//!
//! Paged messages are always the newest ready ones, so the queue's order holds: the window is
//! the head, the log the tail. Once a queue pages, every message it takes goes to the log
//! (transient ones as records that recovery ignores) until the tail is drained again.

use super::{Enqueued, QueueInner, QueueRuntime};
use broker_core::Message;
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

impl QueueRuntime {
    /// Whether a message published now goes to the log only.
    pub(super) fn should_page(&self, inner: &QueueInner) -> bool {
        self.log.is_some()
            && (inner.messages.paged_count() > 0
                || inner.messages.ready_in_memory() >= QUEUE_MEMORY_MESSAGES_MAX
                || inner.messages.ready_bytes_in_memory() >= QUEUE_MEMORY_BYTES_MAX)
    }

    /// Appends a message to the tail on disk.
    pub(super) fn page_out(&self, inner: &mut QueueInner, message: &Message) -> Enqueued {
        let log = self.log.as_ref().expect("only queues with a log page");
        let persistent = message.is_persistent();
        let position = inner.messages.push_paged();
        let location = log.lock().append_publish(position, message, persistent);
        if inner.pager.is_none() {
            inner.pager = Some(Pager { cursor: TailCursor::new(location, position), delivered: RangeSet::new(), all_redelivered: false });
        }
        if persistent {
            Enqueued::Logged(log.clone())
        } else {
            Enqueued::InMemory
        }
    }

    /// Refills the window from the tail when it has fallen below both low watermarks, up to the
    /// window's bounds in messages and in bytes (a message is read even when it alone exceeds the
    /// byte room, so an empty window always makes progress).
    pub(super) fn page_in(&self, inner: &mut QueueInner) {
        let bytes_in_memory = inner.messages.ready_bytes_in_memory();
        if inner.messages.paged_count() == 0
            || inner.messages.ready_in_memory() >= PAGE_IN_LOW_WATERMARK_MESSAGES
            || bytes_in_memory >= PAGE_IN_LOW_WATERMARK_BYTES
        {
            return;
        }
        let (Some(log), Some(pager)) = (self.log.as_ref(), inner.pager.as_mut()) else { return };
        let room = QUEUE_MEMORY_MESSAGES_MAX - inner.messages.ready_in_memory();
        let wanted = room.min(inner.messages.paged_count() as usize);
        let bytes_room = (QUEUE_MEMORY_BYTES_MAX - bytes_in_memory) as usize;
        let batch = log.lock().read_tail(&mut pager.cursor, wanted, PAGE_IN_BATCH_BYTES_MAX.min(bytes_room));
        match batch {
            Ok(batch) if !batch.is_empty() => {
                for (position, message) in batch {
                    let redelivered = pager.all_redelivered || pager.delivered.contains(position);
                    let message = Arc::new(message);
                    let expires_at_ms = super::expiry(&message, inner.limits.message_ttl_ms);
                    inner.messages.page_in(position, message, redelivered, expires_at_ms);
                }
            }
            Ok(_) => {
                // The count says more is paged than the log holds: a bug or a lost segment.
                tracing::error!(queue = %self.name(), paged = inner.messages.paged_count(), "paged messages missing from the log; dropping the count");
                inner.messages.take_paged();
            }
            Err(error) => {
                tracing::error!(queue = %self.name(), %error, "reading paged messages failed; they stay on disk until a restart");
                inner.messages.take_paged();
            }
        }
        if inner.messages.paged_count() == 0 {
            inner.pager = None;
        }
    }

    /// Settles every paged message (purge): reads the tail through and records each as settled.
    pub(super) fn purge_paged(&self, inner: &mut QueueInner) -> u64 {
        let paged = inner.messages.paged_count();
        if let (Some(log), Some(pager)) = (self.log.as_ref(), inner.pager.as_mut()) {
            let mut log = log.lock();
            let mut left = paged;
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
        inner.pager = None;
        inner.messages.take_paged();
        paged
    }
}
