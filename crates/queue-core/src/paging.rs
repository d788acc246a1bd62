//! Paging in: asking for a read of the paged tail, and applying what it brought back.
//!
//! At most one read is out at a time. The caller performs it wherever it likes (a blocking thread)
//! and applies the result later; meanwhile the queue goes on delivering from memory, and a result
//! the queue no longer waits for (a purge overtook it) is discarded by its generation.
//!
//! With priorities each priority pages on its own and a read takes one priority: the highest that
//! has paged messages (or dropped ones to settle), since its messages go out before any lower
//! one's. When that priority is the head and has nothing in memory, the read is asked for even
//! with the window full (up to one batch past it, then one message per read), or a backlog of low
//! priorities in memory would hold the high ones on disk.

use crate::{DeadLetterReason, Effect, PagedExpiry, PagedMessage, Payload, QueueCore, Reply};

impl<M: Payload> QueueCore<M> {
    /// A page-in read, when none is out and either the window has fallen below both low
    /// watermarks with messages paged, or the head is paged, or paged messages dropped at the
    /// head wait to be settled. Asking marks the read in flight under a new generation.
    pub(crate) fn page_in_request(&mut self) -> Option<Effect<M>> {
        let priority = self.messages.highest_paged_or_dropped_priority()?;
        let window = self.window?;
        if self.page_in.in_flight {
            return None;
        }
        let paged = self.messages.paged_count_at(priority);
        let dropped = self.messages.paged_dropped_at(priority);
        let bytes_in_memory = self.messages.ready_bytes_in_memory();
        let in_memory = self.messages.ready_in_memory();
        let below_watermarks = in_memory < window.low_watermark_messages && bytes_in_memory < window.low_watermark_bytes;
        // In a plain queue a paged head means nothing in memory, below the watermarks already.
        let head_waits = !below_watermarks && self.messages.head_is_paged();
        if !below_watermarks && !head_waits && dropped == 0 {
            return None;
        }
        let room = match (below_watermarks, head_waits) {
            (true, _) => window.messages_max.saturating_sub(in_memory),
            // Up to one batch past the window, and one message at a time beyond that: each such
            // read brings the head, which leaves before anything else in memory, so memory holds
            // at most the window, a batch and one message per priority.
            (false, true) => (window.messages_max + window.low_watermark_messages).saturating_sub(in_memory).max(1),
            (false, false) => 0,
        };
        let messages_max = room.min(paged.min(usize::MAX as u64) as usize).saturating_add(dropped.min(usize::MAX as u64) as usize);
        // At least one byte: a read always takes its first message, whatever its size.
        let bytes_max = match head_waits {
            true => window.page_in_batch_bytes_max.max(1),
            false => window.page_in_batch_bytes_max.min(window.bytes_max.saturating_sub(bytes_in_memory)).max(1),
        };
        self.page_in.generation += 1;
        self.page_in.in_flight = true;
        self.page_in.priority = priority;
        Some(Effect::NeedPageIn { messages_max, bytes_max, generation: self.page_in.generation, priority })
    }

    /// Applies a read: the messages dropped at the head before it are settled and dropped, the
    /// rest become ready in memory, in position order (behind nothing of their priority: paged
    /// ones are its newest ready ones, and in-memory ones are older). Asks for the next read when
    /// drops are still owed.
    pub(crate) fn paged_in(&mut self, generation: u64, messages: Vec<PagedMessage<M>>, now_ms: u64, effects: &mut Vec<Effect<M>>) -> Reply {
        if !self.awaits_page_in(generation) {
            return Reply::Stale;
        }
        self.page_in.in_flight = false;
        let priority = self.page_in.priority;
        for PagedMessage { position, message, redelivered, expiry } in messages {
            if self.messages.settle_dropped_paged(message.size_bytes(), priority) {
                // Logged: the caller settles its record (once dead-lettered, when it is).
                effects.push(Effect::Drop { position, message, reason: DeadLetterReason::MaxLength, logged: true });
                continue;
            }
            if self.messages.paged_count_at(priority) == 0 {
                // More than was paged: the reader went past the queue's tail. Keep the count right.
                break;
            }
            let expires_at_ms = match expiry {
                PagedExpiry::Fixed(expires_at_ms) => expires_at_ms,
                PagedExpiry::FromRead { own_ttl_ms } => self.expiry(own_ttl_ms, now_ms),
            };
            self.messages.page_in(position, message, redelivered, expires_at_ms, priority);
        }
        if self.messages.paged_dropped_count() > 0 {
            effects.extend(self.page_in_request());
        }
        Reply::Ok
    }

    /// Applies a read that lost `lost` paged messages to damage on disk: the messages read, then
    /// the lost ones off the counts (the oldest first: dropped ones owed a settle, then paged).
    pub(crate) fn paged_in_with_loss(
        &mut self,
        generation: u64,
        messages: Vec<PagedMessage<M>>,
        lost: u64,
        now_ms: u64,
        effects: &mut Vec<Effect<M>>,
    ) -> Reply {
        let priority = self.page_in.priority;
        let reply = self.paged_in(generation, messages, now_ms, effects);
        if reply == Reply::Ok {
            self.messages.lose_paged(lost, priority);
        }
        reply
    }

    /// A read failed: the paged messages are forgotten (they stay on disk until a restart).
    pub(crate) fn page_in_failed(&mut self, generation: u64) -> Reply {
        if !self.awaits_page_in(generation) {
            return Reply::Stale;
        }
        self.page_in.in_flight = false;
        self.messages.take_paged();
        Reply::Ok
    }

    /// The priority the page-in in flight reads (0 in a plain queue, or with none in flight).
    pub fn page_in_priority(&self) -> u8 {
        self.page_in.priority
    }
}
