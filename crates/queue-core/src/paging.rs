//! Paging in: asking for a read of the paged tail, and applying what it brought back.
//!
//! At most one read is out at a time. The caller performs it wherever it likes (a blocking thread)
//! and applies the result later; meanwhile the queue goes on delivering from memory, and a result
//! the queue no longer waits for (a purge overtook it) is discarded by its generation.

use crate::{DeadLetterReason, Effect, PagedMessage, Payload, QueueCore, Reply};

impl<M: Payload> QueueCore<M> {
    /// A page-in read, when none is out and either the window has fallen below both low
    /// watermarks with messages paged, or paged messages dropped at the head wait to be settled.
    /// Asking marks the read in flight under a new generation.
    pub(crate) fn page_in_request(&mut self) -> Option<Effect<M>> {
        let paged = self.messages.paged_count();
        let dropped = self.messages.paged_dropped_count();
        if paged == 0 && dropped == 0 {
            return None;
        }
        let window = self.window?;
        if self.page_in.in_flight {
            return None;
        }
        let bytes_in_memory = self.messages.ready_bytes_in_memory();
        let in_memory = self.messages.ready_in_memory();
        let below_watermarks = in_memory < window.low_watermark_messages && bytes_in_memory < window.low_watermark_bytes;
        if !below_watermarks && dropped == 0 {
            return None;
        }
        let room = if below_watermarks { window.messages_max.saturating_sub(in_memory).min(paged as usize) } else { 0 };
        let messages_max = room.saturating_add(dropped.min(usize::MAX as u64) as usize);
        // At least one byte: a read always takes its first message, whatever its size.
        let bytes_max = window.page_in_batch_bytes_max.min(window.bytes_max.saturating_sub(bytes_in_memory)).max(1);
        self.page_in.generation += 1;
        self.page_in.in_flight = true;
        Some(Effect::NeedPageIn { messages_max, bytes_max, generation: self.page_in.generation })
    }

    /// Applies a read: the messages dropped at the head before it are settled and dropped, the
    /// rest become ready in memory, in position order (behind nothing: paged ones are the newest
    /// ready ones, and in-memory ones are older). Asks for the next read when drops are still owed.
    pub(crate) fn paged_in(&mut self, generation: u64, messages: Vec<PagedMessage<M>>, now_ms: u64, effects: &mut Vec<Effect<M>>) -> Reply {
        if !self.awaits_page_in(generation) {
            return Reply::Stale;
        }
        self.page_in.in_flight = false;
        for PagedMessage { position, message, redelivered, own_ttl_ms } in messages {
            if self.messages.settle_dropped_paged(message.size_bytes()) {
                // Logged: the caller settles its record (once dead-lettered, when it is).
                effects.push(Effect::Drop { position, message, reason: DeadLetterReason::MaxLength, logged: true });
                continue;
            }
            if self.messages.paged_count() == 0 {
                // More than was paged: the reader went past the queue's tail. Keep the count right.
                break;
            }
            let expires_at_ms = self.expiry(own_ttl_ms, now_ms);
            self.messages.page_in(position, message, redelivered, expires_at_ms);
        }
        if self.messages.paged_dropped_count() > 0 {
            effects.extend(self.page_in_request());
        }
        Reply::Ok
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
}
