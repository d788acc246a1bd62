//! A queue's messages: ready ones in queue order, and unacknowledged ones waiting for a settle.
//!
//! Every message gets a position when it enters the queue. Ready messages are ordered by position,
//! so a message that is requeued (reject, nack, a consumer going away) goes back to its place
//! rather than to the tail, as RabbitMQ does. In a queue with priorities (x-max-priority) they are
//! ordered by priority first, higher first, then by position (see `state/priority.rs`).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

mod image;
mod priority;
pub use image::MessagesImage;
use priority::PagedLevel;

/// What a queue needs to know about the messages it holds: their size, and in a queue with
/// priorities their priority.
pub trait Payload: Clone {
    /// Body bytes, for the queue's byte counts.
    fn size_bytes(&self) -> u64;

    /// The message's priority property (0 when it has none); read only by queues with
    /// x-max-priority, so a plain queue never decodes it.
    fn priority(&self) -> u8 {
        0
    }
}

impl<T: Payload> Payload for Arc<T> {
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }

    fn priority(&self) -> u8 {
        (**self).priority()
    }
}

/// Which consumer a delivery went to: an id the caller chose, unique for the queue's life.
pub type ConsumerId = u64;

/// A message in a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedMessage<M> {
    /// The message.
    pub message: M,
    /// Whether it was handed out before.
    pub redelivered: bool,
    /// When it expires (per-message expiration or the queue's x-message-ttl), in milliseconds
    /// since the epoch.
    pub expires_at_ms: Option<u64>,
    /// Whether the message has a record in the queue's log (to settle there too).
    pub logged: bool,
    /// How many times it came back unsettled (requeued): quorum queues' delivery count, which
    /// `x-delivery-limit` bounds. Kept in memory only: a restart starts it again at 0.
    pub delivery_count: u32,
}

/// A count of messages and of their body bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MessageTally {
    /// Messages.
    pub count: u64,
    /// Their body bytes.
    pub bytes: u64,
}

impl MessageTally {
    /// Counts `queued` in, when it has no record in the log.
    fn add<M: Payload>(&mut self, queued: &QueuedMessage<M>) {
        if !queued.logged {
            self.count += 1;
            self.bytes += queued.message.size_bytes();
        }
    }

    /// Counts `queued` out, when it has no record in the log.
    fn remove<M: Payload>(&mut self, queued: &QueuedMessage<M>) {
        if !queued.logged {
            self.count -= 1;
            self.bytes -= queued.message.size_bytes();
        }
    }
}

/// An unacked message and the consumer holding it (none for basic.get).
/// Hashes a queue position. Positions are distinct integers the queue hands out in sequence, never
/// chosen by a client, so a multiplicative (Fibonacci) hash spreads them over the table, high and
/// low bits alike, and SipHash's defence against crafted keys would only cost time on every
/// delivery and ack.
#[derive(Debug, Default, Clone, Copy)]
pub struct PositionHasher(u64);

/// 2^64 divided by the golden ratio, odd: multiplying by it is a bijection that mixes high bits.
const FIBONACCI_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for PositionHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(FIBONACCI_MULTIPLIER);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(FIBONACCI_MULTIPLIER);
    }
}

/// A map keyed by queue position.
type PositionMap<V> = HashMap<u64, V, BuildHasherDefault<PositionHasher>>;

#[derive(Debug)]
struct Unacked<M> {
    queued: QueuedMessage<M>,
    consumer: Option<ConsumerId>,
}

/// The messages of one queue. Ready messages are either in memory or *paged*: on disk only,
/// behind every in-memory one (paged positions are always the newest), to be paged in in order.
/// With priorities this holds per priority: each priority pages on its own, its paged messages
/// the newest of that priority.
#[derive(Debug)]
pub struct QueueState<M> {
    next_position: u64,
    /// Ready messages in memory by key: the position, above it the priority's rank (see
    /// `state/priority.rs`); a plain queue's key is the position.
    ready: BTreeMap<u64, QueuedMessage<M>>,
    ready_bytes: u64,
    paged: u64,
    /// The oldest paged messages, dropped at the head (x-max-length) before they were read: not
    /// ready any more, but their records are settled only once a page-in reads their positions.
    paged_dropped: u64,
    /// Body bytes of the paged messages, dropped ones included until a page-in reads them.
    /// Unknown for messages recovered from disk (counted as 0 until they are paged in, so a byte
    /// limit may let a recovered queue grow past it once).
    paged_bytes: u64,
    unacked: PositionMap<Unacked<M>>,
    /// Body bytes of the unacked messages.
    unacked_bytes: u64,
    /// The messages in memory (ready and unacked) without a record in the queue's log: what
    /// management's `messages_persistent` leaves out.
    unlogged: MessageTally,
    /// x-max-priority (0: a plain queue, whatever the messages say).
    max_priority: u8,
    /// With priorities, the paged and dropped counts of each priority (index = priority); empty
    /// in a plain queue, whose totals above are its only level.
    levels: Vec<PagedLevel>,
}

impl<M: Payload> Default for QueueState<M> {
    fn default() -> Self {
        QueueState::new(0)
    }
}

impl<M: Payload> QueueState<M> {
    /// An empty queue whose positions start at `next_position` (after recovery, past the last one used).
    pub fn new(next_position: u64) -> QueueState<M> {
        QueueState::with_paged(next_position, 0)
    }

    /// A queue recovered from disk: `paged` ready messages, all still on disk.
    pub fn with_paged(next_position: u64, paged: u64) -> QueueState<M> {
        QueueState {
            next_position,
            ready: BTreeMap::new(),
            ready_bytes: 0,
            paged,
            paged_dropped: 0,
            paged_bytes: 0,
            unacked: PositionMap::default(),
            unacked_bytes: 0,
            unlogged: MessageTally::default(),
            max_priority: 0,
            levels: Vec::new(),
        }
    }

    fn insert_ready(&mut self, position: u64, queued: QueuedMessage<M>) {
        self.ready_bytes += queued.message.size_bytes();
        self.unlogged.add(&queued);
        let key = self.ready_key(position, &queued.message);
        self.ready.insert(key, queued);
    }

    fn take_first_ready(&mut self) -> Option<(u64, QueuedMessage<M>)> {
        let (key, queued) = self.ready.pop_first()?;
        self.ready_bytes -= queued.message.size_bytes();
        self.unlogged.remove(&queued);
        Some((priority::position_of(key), queued))
    }

    /// Appends a message; returns its position.
    pub fn push(&mut self, message: M) -> u64 {
        self.push_expiring(message, None, false)
    }

    /// Appends a message that expires at `expires_at_ms`; returns its position.
    pub fn push_expiring(&mut self, message: M, expires_at_ms: Option<u64>, logged: bool) -> u64 {
        let priority = self.priority_of(&message);
        assert_eq!(self.paged_count_at(priority), 0, "a queue paging priority {priority} takes its new messages on disk");
        let position = self.next_position;
        self.next_position += 1;
        self.insert_ready(position, QueuedMessage { message, redelivered: false, expires_at_ms, logged, delivery_count: 0 });
        position
    }

    /// Takes the next position for a message that is never ready (dropped as it arrives).
    pub fn skip_position(&mut self) -> u64 {
        let position = self.next_position;
        self.next_position += 1;
        position
    }

    /// Appends a message of `size_bytes` and `priority` (0 in a plain queue) that stays on disk
    /// (the caller writes it); returns its position.
    pub fn push_paged(&mut self, size_bytes: u64, priority: u8) -> u64 {
        let position = self.next_position;
        self.next_position += 1;
        self.paged += 1;
        self.paged_bytes += size_bytes;
        if let Some(level) = self.levels.get_mut(usize::from(priority)) {
            level.paged += 1;
        }
        position
    }

    /// Brings the oldest paged message of `priority` into memory, read back from disk.
    pub fn page_in(&mut self, position: u64, message: M, redelivered: bool, expires_at_ms: Option<u64>, priority: u8) {
        assert!(self.paged_count_at(priority) > 0, "page-in with nothing paged at priority {priority}");
        assert!(position < self.next_position, "paged-in position {position} was never pushed");
        self.paged -= 1;
        if let Some(level) = self.levels.get_mut(usize::from(priority)) {
            level.paged -= 1;
        }
        self.paged_bytes = self.paged_bytes.saturating_sub(message.size_bytes());
        self.insert_ready(position, QueuedMessage { message, redelivered, expires_at_ms, logged: true, delivery_count: 0 });
    }

    /// Forgets the paged messages, dropped ones included (purged, or lost to a disk error);
    /// returns how many there were.
    pub fn take_paged(&mut self) -> u64 {
        self.paged_bytes = 0;
        self.levels.iter_mut().for_each(|level| *level = PagedLevel::default());
        std::mem::take(&mut self.paged) + std::mem::take(&mut self.paged_dropped)
    }

    /// Drops the oldest paged message of the highest priority that has one, before it is read
    /// (see [`QueueState::paged_dropped_count`]); false when none is paged. Its bytes stay
    /// counted until the page-in reads it.
    pub fn drop_paged_head(&mut self) -> bool {
        let Some(priority) = self.highest_paged_priority() else {
            return false;
        };
        self.paged -= 1;
        self.paged_dropped += 1;
        if let Some(level) = self.levels.get_mut(usize::from(priority)) {
            level.paged -= 1;
            level.dropped += 1;
        }
        true
    }

    /// Takes one dropped paged message of `priority` and `size_bytes` off the count, now that a
    /// page-in read it; false when none is owed (the message read is a ready one).
    pub fn settle_dropped_paged(&mut self, size_bytes: u64, priority: u8) -> bool {
        if self.paged_dropped_at(priority) == 0 {
            return false;
        }
        self.paged_dropped -= 1;
        if let Some(level) = self.levels.get_mut(usize::from(priority)) {
            level.dropped -= 1;
        }
        self.paged_bytes = self.paged_bytes.saturating_sub(size_bytes);
        true
    }

    /// Takes up to `count` paged messages of `priority` off the counts, lost to damage on disk
    /// before they were read: dropped ones first (they are the oldest), then paged ones. Returns
    /// how many were taken.
    pub fn lose_paged(&mut self, count: u64, priority: u8) -> u64 {
        let dropped = count.min(self.paged_dropped_at(priority));
        let paged = (count - dropped).min(self.paged_count_at(priority));
        self.paged_dropped -= dropped;
        self.paged -= paged;
        if let Some(level) = self.levels.get_mut(usize::from(priority)) {
            level.dropped -= dropped;
            level.paged -= paged;
        }
        if self.paged + self.paged_dropped == 0 {
            self.paged_bytes = 0;
        }
        dropped + paged
    }

    /// Paged messages dropped at the head before they were read, whose records a page-in must
    /// still settle.
    pub fn paged_dropped_count(&self) -> u64 {
        self.paged_dropped
    }

    /// Ready messages on disk only.
    pub fn paged_count(&self) -> u64 {
        self.paged
    }

    /// Ready messages in memory.
    pub fn ready_in_memory(&self) -> usize {
        self.ready.len()
    }

    /// Body bytes of the ready messages in memory.
    pub fn ready_bytes_in_memory(&self) -> u64 {
        self.ready_bytes
    }

    /// Body bytes of every ready message, paged ones included (see `paged_bytes`).
    pub fn ready_bytes(&self) -> u64 {
        self.ready_bytes + self.paged_bytes
    }

    /// Removes the first ready message in memory if it expired by `now_ms`, as RabbitMQ does: a
    /// message expires when it reaches the head past its time, never from the middle.
    /// With priorities the head is the first message of the highest priority: while that
    /// priority's messages are all paged, nothing in memory is at the head.
    pub fn pop_expired_head(&mut self, now_ms: u64) -> Option<(u64, QueuedMessage<M>)> {
        if !self.levels.is_empty() && self.head_is_paged() {
            return None;
        }
        let entry = self.ready.first_entry()?;
        match entry.get().expires_at_ms {
            Some(expires_at_ms) if expires_at_ms <= now_ms => {
                let (key, queued) = entry.remove_entry();
                self.ready_bytes -= queued.message.size_bytes();
                self.unlogged.remove(&queued);
                Some((priority::position_of(key), queued))
            }
            _ => None,
        }
    }

    /// When the head in memory expires (see [`QueueState::pop_expired_head`]), in milliseconds
    /// since the epoch: none when it has no expiry, the queue is empty, or the head is paged
    /// (it gets its expiry when a page-in reads it).
    pub fn head_expires_at_ms(&self) -> Option<u64> {
        if !self.levels.is_empty() && self.head_is_paged() {
            return None;
        }
        self.ready.first_key_value().and_then(|(_, queued)| queued.expires_at_ms)
    }

    /// Removes expired messages from the head of the queue (see [`QueueState::pop_expired_head`]).
    pub fn drop_expired_head(&mut self, now_ms: u64) -> Vec<(u64, QueuedMessage<M>)> {
        std::iter::from_fn(|| self.pop_expired_head(now_ms)).collect()
    }

    /// The position the next message will get.
    pub fn next_position(&self) -> u64 {
        self.next_position
    }

    /// Takes the first ready message. With `track`, it waits in the unacked set for a settle or a
    /// requeue; without, it leaves the queue (no-ack delivery).
    pub fn pop(&mut self, track: bool) -> Option<(u64, QueuedMessage<M>)> {
        self.pop_for(track, None)
    }

    /// [`QueueState::pop`], remembering which consumer holds a tracked message.
    pub fn pop_for(&mut self, track: bool, consumer: Option<ConsumerId>) -> Option<(u64, QueuedMessage<M>)> {
        let (position, queued) = self.take_first_ready()?;
        if track {
            self.track_unacked(position, Unacked { queued: queued.clone(), consumer });
        }
        Some((position, queued))
    }

    /// Adds a delivered message to the unacked set.
    fn track_unacked(&mut self, position: u64, unacked: Unacked<M>) {
        self.unacked_bytes += unacked.queued.message.size_bytes();
        self.unlogged.add(&unacked.queued);
        self.unacked.insert(position, unacked);
    }

    /// Takes a message off the unacked set.
    fn untrack_unacked(&mut self, position: u64) -> Option<Unacked<M>> {
        let unacked = self.unacked.remove(&position)?;
        self.unacked_bytes -= unacked.queued.message.size_bytes();
        self.unlogged.remove(&unacked.queued);
        Some(unacked)
    }

    /// Body bytes of the unacked messages.
    pub fn unacked_bytes(&self) -> u64 {
        self.unacked_bytes
    }

    /// Body bytes of the paged messages (see the field for what a recovered queue counts).
    pub fn paged_bytes(&self) -> u64 {
        self.paged_bytes
    }

    /// The messages (ready in memory and unacked) that have no record in the queue's log: the
    /// transient ones, and every one of a transient queue. Paged messages are all logged.
    pub fn unlogged(&self) -> MessageTally {
        self.unlogged
    }

    /// Puts back a message that was popped but never reached its consumer, unchanged.
    pub fn unpop(&mut self, position: u64, queued: QueuedMessage<M>) -> Option<ConsumerId> {
        let holder = self.untrack_unacked(position).and_then(|unacked| unacked.consumer);
        self.insert_ready(position, queued);
        holder
    }

    /// Removes an unacked message for good (ack, or reject without requeue).
    pub fn settle(&mut self, position: u64) -> Option<QueuedMessage<M>> {
        self.settle_held(position).map(|(queued, _)| queued)
    }

    /// [`QueueState::settle`], also saying which consumer held it.
    pub fn settle_held(&mut self, position: u64) -> Option<(QueuedMessage<M>, Option<ConsumerId>)> {
        self.untrack_unacked(position).map(|unacked| (unacked.queued, unacked.consumer))
    }

    /// Puts an unacked message back at its position, marked redelivered.
    pub fn requeue(&mut self, position: u64) -> bool {
        self.requeue_held(position, None).is_some()
    }

    /// [`QueueState::requeue`]; `Some((holder, None))` when the message was unacked. One that
    /// came back more often than `delivery_limit` allows (x-delivery-limit: a limit of 1
    /// delivers a message twice) is not put back but handed back: `Some((holder, Some(it)))`.
    pub fn requeue_held(&mut self, position: u64, delivery_limit: Option<u32>) -> Option<(Option<ConsumerId>, Option<QueuedMessage<M>>)> {
        let Unacked { mut queued, consumer } = self.untrack_unacked(position)?;
        queued.redelivered = true;
        queued.delivery_count = queued.delivery_count.saturating_add(1);
        if delivery_limit.is_some_and(|limit| queued.delivery_count > limit) {
            return Some((consumer, Some(queued)));
        }
        self.insert_ready(position, queued);
        Some((consumer, None))
    }

    /// Takes an unacked message back as the newest ready one, marked redelivered, under a new
    /// position (RabbitMQ's quorum queues put a nacked or rejected message at the back); returns
    /// the new position and the consumer that held it.
    pub fn requeue_to_tail(&mut self, position: u64) -> Option<(u64, Option<ConsumerId>)> {
        let Unacked { mut queued, consumer } = self.untrack_unacked(position)?;
        queued.redelivered = true;
        queued.delivery_count = queued.delivery_count.saturating_add(1);
        let new_position = self.next_position;
        self.next_position += 1;
        self.insert_ready(new_position, queued);
        Some((new_position, consumer))
    }

    /// Removes a ready message in memory by position (one requeued past its delivery limit).
    /// For plain queues only (quorum queues have no priorities), whose ready keys are positions.
    pub fn take_ready(&mut self, position: u64) -> Option<QueuedMessage<M>> {
        let queued = self.ready.remove(&position)?;
        self.ready_bytes -= queued.message.size_bytes();
        self.unlogged.remove(&queued);
        Some(queued)
    }

    /// The delivery count of a ready message in memory.
    pub fn ready_delivery_count(&self, position: u64) -> Option<u32> {
        self.ready.get(&position).map(|queued| queued.delivery_count)
    }

    /// Drops every ready message in memory; returns them (unacked ones stay, as in RabbitMQ).
    /// Paged ones are the caller's to settle on disk, then [`QueueState::take_paged`].
    pub fn purge(&mut self) -> Vec<(u64, QueuedMessage<M>)> {
        self.ready_bytes = 0;
        // What stays unlogged is what is unacked.
        self.unlogged = MessageTally::default();
        self.unacked.values().for_each(|unacked| self.unlogged.add(&unacked.queued));
        std::mem::take(&mut self.ready).into_iter().map(|(key, queued)| (priority::position_of(key), queued)).collect()
    }

    /// Messages ready for delivery.
    pub fn ready_count(&self) -> usize {
        self.ready.len() + self.paged as usize
    }

    /// Messages delivered and not settled.
    pub fn unacked_count(&self) -> usize {
        self.unacked.len()
    }

    /// Positions of the ready messages in memory, in delivery order (for tests and listings).
    pub fn ready_positions(&self) -> impl Iterator<Item = u64> + '_ {
        self.ready.keys().map(|key| priority::position_of(*key))
    }

    /// Positions of the unacked messages, in no order.
    pub fn unacked_positions(&self) -> impl Iterator<Item = u64> + '_ {
        self.unacked.keys().copied()
    }

    /// The unacked messages a consumer holds (basic.get's are left out), in no order: a replica
    /// that skipped the entries which delivered them (a snapshot installed) performs them again.
    pub fn unacked_held_by_consumers(&self) -> impl Iterator<Item = (u64, ConsumerId, &QueuedMessage<M>)> + '_ {
        self.unacked.iter().filter_map(|(position, unacked)| unacked.consumer.map(|consumer| (*position, consumer, &unacked.queued)))
    }

    /// Positions of the unacked messages `consumer` holds, in position order (a replicated
    /// queue requeues them when the consumer's node goes away).
    pub fn unacked_positions_held_by(&self, consumer: ConsumerId) -> Vec<u64> {
        let mut positions: Vec<u64> =
            self.unacked.iter().filter(|(_, unacked)| unacked.consumer == Some(consumer)).map(|(position, _)| *position).collect();
        positions.sort_unstable();
        positions
    }

    /// Whether the queue holds no message at all.
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.paged == 0 && self.unacked.is_empty()
    }
}
