//! A queue's messages: ready ones in queue order, and unacknowledged ones waiting for a settle.
//!
//! Every message gets a position when it enters the queue. Ready messages are ordered by position,
//! so a message that is requeued (reject, nack, a consumer going away) goes back to its place
//! rather than to the tail, as RabbitMQ does.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// What a queue needs to know about the messages it holds: only their size.
pub trait Payload: Clone {
    /// Body bytes, for the queue's byte counts.
    fn size_bytes(&self) -> u64;

    /// The message's priority property (0 when absent); read only by queues with x-max-priority.
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

/// Positions take the low 56 bits of a ready key; the priority, inverted, the high 8, so the
/// ready map's order is: higher priority first, then queue order. A queue without priorities has
/// every message at 0 and keeps plain queue order. 2^56 positions outlast any queue.
const POSITION_BITS: u32 = 56;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;

fn ready_key(position: u64, priority: u8) -> u64 {
    (u64::from(u8::MAX - priority) << POSITION_BITS) | (position & POSITION_MASK)
}

fn position_of(key: u64) -> u64 {
    key & POSITION_MASK
}

/// Which consumer a delivery went to: an id the caller chose, unique for the queue's life.
pub type ConsumerId = u64;

/// A message in a queue.
#[derive(Debug, Clone)]
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
    /// Its priority in a queue with x-max-priority (capped at the maximum); 0 elsewhere.
    pub priority: u8,
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
#[derive(Debug)]
pub struct QueueState<M> {
    next_position: u64,
    ready: BTreeMap<u64, QueuedMessage<M>>,
    ready_bytes: u64,
    paged: u64,
    unacked: PositionMap<Unacked<M>>,
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
        QueueState { next_position, ready: BTreeMap::new(), ready_bytes: 0, paged, unacked: PositionMap::default() }
    }

    fn insert_ready(&mut self, position: u64, queued: QueuedMessage<M>) {
        assert!(position <= POSITION_MASK, "queue position {position} past 2^56");
        self.ready_bytes += queued.message.size_bytes();
        self.ready.insert(ready_key(position, queued.priority), queued);
    }

    fn take_first_ready(&mut self) -> Option<(u64, QueuedMessage<M>)> {
        let (key, queued) = self.ready.pop_first()?;
        self.ready_bytes -= queued.message.size_bytes();
        Some((position_of(key), queued))
    }

    /// Appends a message; returns its position.
    pub fn push(&mut self, message: M) -> u64 {
        self.push_expiring(message, None, false, 0)
    }

    /// Appends a message that expires at `expires_at_ms`; returns its position.
    pub fn push_expiring(&mut self, message: M, expires_at_ms: Option<u64>, logged: bool, priority: u8) -> u64 {
        assert_eq!(self.paged, 0, "a queue that pages takes new messages on disk");
        let position = self.next_position;
        self.next_position += 1;
        self.insert_ready(position, QueuedMessage { message, redelivered: false, expires_at_ms, logged, priority });
        position
    }

    /// Appends a message that stays on disk (the caller writes it); returns its position.
    pub fn push_paged(&mut self) -> u64 {
        let position = self.next_position;
        self.next_position += 1;
        self.paged += 1;
        position
    }

    /// Brings the oldest paged message into memory, read back from disk.
    pub fn page_in(&mut self, position: u64, message: M, redelivered: bool, expires_at_ms: Option<u64>, priority: u8) {
        assert!(self.paged > 0, "page-in with nothing paged");
        assert!(position < self.next_position, "paged-in position {position} was never pushed");
        self.paged -= 1;
        self.insert_ready(position, QueuedMessage { message, redelivered, expires_at_ms, logged: true, priority });
    }

    /// Forgets the paged messages (purged, or lost to a disk error); returns how many there were.
    pub fn take_paged(&mut self) -> u64 {
        std::mem::take(&mut self.paged)
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

    /// Removes the first ready message in memory if it expired by `now_ms`, as RabbitMQ does: a
    /// message expires when it reaches the head past its time, never from the middle.
    pub fn pop_expired_head(&mut self, now_ms: u64) -> Option<(u64, QueuedMessage<M>)> {
        let entry = self.ready.first_entry()?;
        match entry.get().expires_at_ms {
            Some(expires_at_ms) if expires_at_ms <= now_ms => {
                let (key, queued) = entry.remove_entry();
                self.ready_bytes -= queued.message.size_bytes();
                Some((position_of(key), queued))
            }
            _ => None,
        }
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
            self.unacked.insert(position, Unacked { queued: queued.clone(), consumer });
        }
        Some((position, queued))
    }

    /// Puts back a message that was popped but never reached its consumer, unchanged.
    pub fn unpop(&mut self, position: u64, queued: QueuedMessage<M>) -> Option<ConsumerId> {
        let holder = self.unacked.remove(&position).and_then(|unacked| unacked.consumer);
        self.insert_ready(position, queued);
        holder
    }

    /// Removes an unacked message for good (ack, or reject without requeue).
    pub fn settle(&mut self, position: u64) -> Option<QueuedMessage<M>> {
        self.settle_held(position).map(|(queued, _)| queued)
    }

    /// [`QueueState::settle`], also saying which consumer held it.
    pub fn settle_held(&mut self, position: u64) -> Option<(QueuedMessage<M>, Option<ConsumerId>)> {
        self.unacked.remove(&position).map(|unacked| (unacked.queued, unacked.consumer))
    }

    /// Puts an unacked message back at its position, marked redelivered.
    pub fn requeue(&mut self, position: u64) -> bool {
        self.requeue_held(position).is_some()
    }

    /// [`QueueState::requeue`]; `Some(holder)` when the message was unacked.
    pub fn requeue_held(&mut self, position: u64) -> Option<Option<ConsumerId>> {
        let Unacked { mut queued, consumer } = self.unacked.remove(&position)?;
        queued.redelivered = true;
        self.insert_ready(position, queued);
        Some(consumer)
    }

    /// Drops every ready message in memory; returns them (unacked ones stay, as in RabbitMQ).
    /// Paged ones are the caller's to settle on disk, then [`QueueState::take_paged`].
    pub fn purge(&mut self) -> Vec<(u64, QueuedMessage<M>)> {
        self.ready_bytes = 0;
        std::mem::take(&mut self.ready).into_iter().map(|(key, queued)| (position_of(key), queued)).collect()
    }

    /// Messages ready for delivery.
    pub fn ready_count(&self) -> usize {
        self.ready.len() + self.paged as usize
    }

    /// Messages delivered and not settled.
    pub fn unacked_count(&self) -> usize {
        self.unacked.len()
    }

    /// Positions of the ready messages in memory, in queue order (for tests and listings).
    pub fn ready_positions(&self) -> impl Iterator<Item = u64> + '_ {
        self.ready.keys().map(|key| position_of(*key))
    }

    /// Positions of the unacked messages, in no order.
    pub fn unacked_positions(&self) -> impl Iterator<Item = u64> + '_ {
        self.unacked.keys().copied()
    }

    /// Whether the queue holds no message at all.
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.paged == 0 && self.unacked.is_empty()
    }
}
