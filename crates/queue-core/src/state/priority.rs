//! Priorities (x-max-priority): RabbitMQ's `rabbit_priority_queue` runs one backing queue per
//! priority and always serves the highest non-empty one; Lepus keeps one ordered map whose keys put
//! the priority above the position, and pages each priority on its own.
//!
//! A ready key is `rank << 56 | position`, where the rank is `max_priority - priority`: the map's
//! order is higher priority first, then queue order, and a plain queue (rank 0 for every message)
//! keys by position alone, so it pays nothing for priorities. 2^56 positions outlast any queue.
//!
//! Paging per priority keeps the rule that a priority's paged messages are its newest, so its
//! in-memory messages go first and a page-in reads its oldest paged ones. The *head* is the first
//! message of the highest priority that has any ready: when that priority's messages are all
//! paged, the head is on disk, and nothing of a lower priority in memory may overtake it.

use super::QueueState;
use crate::Payload;

/// Bits of a ready key that hold the position.
const POSITION_BITS: u32 = 56;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;

/// The position a ready key holds.
pub(super) fn position_of(key: u64) -> u64 {
    key & POSITION_MASK
}

/// One priority's paged messages (its counts are also in the queue's totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PagedLevel {
    /// Ready messages of this priority on disk only.
    pub(super) paged: u64,
    /// Its oldest paged messages, dropped at the head before they were read.
    pub(super) dropped: u64,
}

impl<M: Payload> QueueState<M> {
    /// An empty queue with x-max-priority `max_priority` (0: a plain queue).
    pub fn with_max_priority(next_position: u64, max_priority: u8) -> QueueState<M> {
        QueueState::with_paged_priorities(next_position, &vec![0; usize::from(max_priority) + 1])
    }

    /// A queue with priorities recovered from disk: `paged[p]` ready messages of priority `p`, all
    /// still on disk; its x-max-priority is `paged.len() - 1` (a single count: a plain queue).
    pub fn with_paged_priorities(next_position: u64, paged: &[u64]) -> QueueState<M> {
        let total = paged.iter().sum();
        let mut state = QueueState::with_paged(next_position, total);
        let max_priority = u8::try_from(paged.len().saturating_sub(1)).expect("at most 256 priorities");
        if max_priority > 0 {
            state.max_priority = max_priority;
            state.levels = paged.iter().map(|&paged| PagedLevel { paged, dropped: 0 }).collect();
        }
        state
    }

    /// x-max-priority (0 for a plain queue).
    pub fn max_priority(&self) -> u8 {
        self.max_priority
    }

    /// A message's priority in this queue: its property capped at x-max-priority, as RabbitMQ
    /// counts a higher one as the maximum; 0 in a plain queue, which never reads the property.
    pub fn priority_of(&self, message: &M) -> u8 {
        match self.max_priority {
            0 => 0,
            max_priority => message.priority().min(max_priority),
        }
    }

    /// The key a ready message is kept under (see the module's comment).
    pub(super) fn ready_key(&self, position: u64, message: &M) -> u64 {
        if self.max_priority == 0 {
            return position;
        }
        assert!(position <= POSITION_MASK, "queue position {position} past 2^56");
        let rank = self.max_priority - self.priority_of(message);
        (u64::from(rank) << POSITION_BITS) | position
    }

    /// Ready messages of `priority` on disk only (a plain queue has only priority 0).
    pub fn paged_count_at(&self, priority: u8) -> u64 {
        match self.levels.get(usize::from(priority)) {
            Some(level) => level.paged,
            None if self.levels.is_empty() && priority == 0 => self.paged,
            None => 0,
        }
    }

    /// Paged messages of `priority` dropped before they were read.
    pub fn paged_dropped_at(&self, priority: u8) -> u64 {
        match self.levels.get(usize::from(priority)) {
            Some(level) => level.dropped,
            None if self.levels.is_empty() && priority == 0 => self.paged_dropped,
            None => 0,
        }
    }

    /// The highest priority with messages paged.
    pub fn highest_paged_priority(&self) -> Option<u8> {
        if self.paged == 0 {
            return None;
        }
        if self.levels.is_empty() {
            return Some(0);
        }
        self.levels.iter().rposition(|level| level.paged > 0).map(|priority| priority as u8)
    }

    /// The highest priority a page-in has to read: messages paged, or dropped ones to settle.
    pub fn highest_paged_or_dropped_priority(&self) -> Option<u8> {
        if self.paged == 0 && self.paged_dropped == 0 {
            return None;
        }
        if self.levels.is_empty() {
            return Some(0);
        }
        self.levels.iter().rposition(|level| level.paged > 0 || level.dropped > 0).map(|priority| priority as u8)
    }

    /// The highest priority with a ready message in memory.
    pub fn highest_priority_in_memory(&self) -> Option<u8> {
        let (key, _) = self.ready.first_key_value()?;
        let rank = (key >> POSITION_BITS) as u8;
        Some(self.max_priority - rank)
    }

    /// Whether the head of the queue is on disk: messages are paged and none in memory comes
    /// before them (in a plain queue: nothing ready is in memory).
    pub fn head_is_paged(&self) -> bool {
        if self.paged == 0 {
            return false;
        }
        if self.levels.is_empty() {
            return self.ready.is_empty();
        }
        match (self.highest_priority_in_memory(), self.highest_paged_priority()) {
            (Some(in_memory), Some(paged)) => paged > in_memory,
            _ => true,
        }
    }

    /// The paged messages (dropped ones included) of each priority that has any, for a purge to
    /// settle on disk.
    pub fn paged_by_priority(&self) -> Vec<(u8, u64)> {
        if self.levels.is_empty() {
            let count = self.paged + self.paged_dropped;
            return if count > 0 { vec![(0, count)] } else { Vec::new() };
        }
        let counts = self.levels.iter().enumerate().map(|(priority, level)| (priority as u8, level.paged + level.dropped));
        counts.filter(|(_, count)| *count > 0).collect()
    }
}
