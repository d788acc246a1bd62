//! A queue's messages: ready ones in queue order, and unacknowledged ones waiting for a settle.
//!
//! Every message gets a position when it enters the queue. Ready messages are ordered by position,
//! so a message that is requeued (reject, nack, a consumer going away) goes back to its place
//! rather than to the tail, as RabbitMQ does.

use crate::message::Message;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A message in a queue.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    /// The shared message.
    pub message: Arc<Message>,
    /// Whether it was handed out before.
    pub redelivered: bool,
    /// When it expires (per-message expiration or the queue's x-message-ttl), in milliseconds
    /// since the epoch.
    pub expires_at_ms: Option<u64>,
    /// Whether the message has a record in the queue's log (to settle there too).
    pub logged: bool,
}

/// The messages of one queue. Ready messages are either in memory or *paged*: on disk only,
/// behind every in-memory one (paged positions are always the newest), to be paged in in order.
#[derive(Debug, Default)]
pub struct QueueState {
    next_position: u64,
    ready: BTreeMap<u64, QueuedMessage>,
    ready_bytes: u64,
    paged: u64,
    unacked: HashMap<u64, QueuedMessage>,
}

impl QueueState {
    /// An empty queue whose positions start at `next_position` (after recovery, past the last one used).
    pub fn new(next_position: u64) -> QueueState {
        QueueState::with_paged(next_position, 0)
    }

    /// A queue recovered from disk: `paged` ready messages, all still on disk.
    pub fn with_paged(next_position: u64, paged: u64) -> QueueState {
        QueueState { next_position, ready: BTreeMap::new(), ready_bytes: 0, paged, unacked: HashMap::new() }
    }

    fn insert_ready(&mut self, position: u64, queued: QueuedMessage) {
        self.ready_bytes += queued.message.body.len() as u64;
        self.ready.insert(position, queued);
    }

    fn take_first_ready(&mut self) -> Option<(u64, QueuedMessage)> {
        let (position, queued) = self.ready.pop_first()?;
        self.ready_bytes -= queued.message.body.len() as u64;
        Some((position, queued))
    }

    /// Appends a message; returns its position.
    pub fn push(&mut self, message: Arc<Message>) -> u64 {
        self.push_expiring(message, None, false)
    }

    /// Appends a message that expires at `expires_at_ms`; returns its position.
    pub fn push_expiring(&mut self, message: Arc<Message>, expires_at_ms: Option<u64>, logged: bool) -> u64 {
        assert_eq!(self.paged, 0, "a queue that pages takes new messages on disk");
        let position = self.next_position;
        self.next_position += 1;
        self.insert_ready(position, QueuedMessage { message, redelivered: false, expires_at_ms, logged });
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
    pub fn page_in(&mut self, position: u64, message: Arc<Message>, redelivered: bool, expires_at_ms: Option<u64>) {
        assert!(self.paged > 0, "page-in with nothing paged");
        assert!(position < self.next_position, "paged-in position {position} was never pushed");
        self.paged -= 1;
        self.insert_ready(position, QueuedMessage { message, redelivered, expires_at_ms, logged: true });
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

    /// Removes expired messages from the head of the queue, as RabbitMQ does: a message expires
    /// when it reaches the head past its time, never from the middle.
    pub fn drop_expired_head(&mut self, now_ms: u64) -> Vec<(u64, QueuedMessage)> {
        let mut dropped = Vec::new();
        while let Some(entry) = self.ready.first_entry() {
            match entry.get().expires_at_ms {
                Some(expires_at_ms) if expires_at_ms <= now_ms => {
                    let (position, queued) = entry.remove_entry();
                    self.ready_bytes -= queued.message.body.len() as u64;
                    dropped.push((position, queued));
                }
                _ => break,
            }
        }
        dropped
    }

    /// The position the next message will get.
    pub fn next_position(&self) -> u64 {
        self.next_position
    }

    /// Takes the first ready message. With `track`, it waits in the unacked set for a settle or a
    /// requeue; without, it leaves the queue (no-ack delivery).
    pub fn pop(&mut self, track: bool) -> Option<(u64, QueuedMessage)> {
        let (position, queued) = self.take_first_ready()?;
        if track {
            self.unacked.insert(position, queued.clone());
        }
        Some((position, queued))
    }

    /// Removes an unacked message for good (ack, or reject without requeue).
    pub fn settle(&mut self, position: u64) -> Option<QueuedMessage> {
        self.unacked.remove(&position)
    }

    /// Puts an unacked message back at its position, marked redelivered.
    pub fn requeue(&mut self, position: u64) -> bool {
        match self.unacked.remove(&position) {
            Some(mut queued) => {
                queued.redelivered = true;
                self.insert_ready(position, queued);
                true
            }
            None => false,
        }
    }

    /// Drops every ready message in memory; returns them (unacked ones stay, as in RabbitMQ).
    /// Paged ones are the caller's to settle on disk, then [`QueueState::take_paged`].
    pub fn purge(&mut self) -> Vec<(u64, QueuedMessage)> {
        self.ready_bytes = 0;
        std::mem::take(&mut self.ready).into_iter().collect()
    }

    /// Messages ready for delivery.
    pub fn ready_count(&self) -> usize {
        self.ready.len() + self.paged as usize
    }

    /// Messages delivered and not settled.
    pub fn unacked_count(&self) -> usize {
        self.unacked.len()
    }

    /// Whether the queue holds no message at all.
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.paged == 0 && self.unacked.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::{BasicProperties, ContentHeader, ShortStr};
    use bytes::Bytes;
    use proptest::prelude::*;

    fn message(body: u8) -> Arc<Message> {
        Arc::new(Message {
            exchange: ShortStr::from(""),
            routing_key: ShortStr::from("q"),
            header: ContentHeader::from_properties(60, 1, &BasicProperties::default()),
            body: Bytes::from(vec![body]),
        })
    }

    #[test]
    fn requeued_message_keeps_its_place() {
        let mut queue = QueueState::new(0);
        for body in 0..3 {
            queue.push(message(body));
        }
        let (first, _) = queue.pop(true).expect("first");
        let (second, _) = queue.pop(true).expect("second");
        assert!(queue.requeue(first));
        let (again, queued) = queue.pop(true).expect("requeued first");
        assert_eq!(again, first);
        assert!(queued.redelivered);
        assert!(queue.settle(second).is_some());
        assert_eq!(queue.ready_count(), 1);
        assert_eq!(queue.unacked_count(), 1);
    }

    #[derive(Debug, Clone)]
    enum Operation {
        Push,
        Pop { track: bool },
        Settle(usize),
        Requeue(usize),
        Purge,
    }

    fn operation() -> impl Strategy<Value = Operation> {
        prop_oneof![
            3 => Just(Operation::Push),
            2 => any::<bool>().prop_map(|track| Operation::Pop { track }),
            1 => any::<usize>().prop_map(Operation::Settle),
            1 => any::<usize>().prop_map(Operation::Requeue),
            1 => Just(Operation::Purge),
        ]
    }

    proptest! {
        /// The queue against a model of two sorted lists: delivery order is always the lowest
        /// ready position, and no message is lost or duplicated.
        #[test]
        fn behaves_like_the_model(operations in proptest::collection::vec(operation(), 0..200)) {
            let mut queue = QueueState::new(0);
            let mut model_ready: Vec<u64> = Vec::new();
            let mut model_unacked: Vec<u64> = Vec::new();
            let mut next = 0u64;
            for operation in operations {
                match operation {
                    Operation::Push => {
                        prop_assert_eq!(queue.push(message(0)), next);
                        model_ready.push(next);
                        next += 1;
                    }
                    Operation::Pop { track } => {
                        let expected = if model_ready.is_empty() { None } else { Some(model_ready.remove(0)) };
                        let got = queue.pop(track).map(|(position, _)| position);
                        prop_assert_eq!(got, expected);
                        if let (Some(position), true) = (got, track) {
                            model_unacked.push(position);
                        }
                    }
                    Operation::Settle(index) if !model_unacked.is_empty() => {
                        let position = model_unacked.remove(index % model_unacked.len());
                        prop_assert!(queue.settle(position).is_some());
                    }
                    Operation::Requeue(index) if !model_unacked.is_empty() => {
                        let position = model_unacked.remove(index % model_unacked.len());
                        prop_assert!(queue.requeue(position));
                        model_ready.push(position);
                        model_ready.sort_unstable();
                    }
                    Operation::Purge => {
                        let purged: Vec<u64> = queue.purge().into_iter().map(|(position, _)| position).collect();
                        prop_assert_eq!(purged, model_ready.clone());
                        model_ready.clear();
                    }
                    _ => {}
                }
                prop_assert_eq!(queue.ready_count(), model_ready.len());
                prop_assert_eq!(queue.unacked_count(), model_unacked.len());
            }
        }
    }
}
