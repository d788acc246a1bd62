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
}

/// The messages of one queue.
#[derive(Debug, Default)]
pub struct QueueState {
    next_position: u64,
    ready: BTreeMap<u64, QueuedMessage>,
    unacked: HashMap<u64, QueuedMessage>,
}

impl QueueState {
    /// An empty queue whose positions start at `next_position` (after recovery, past the last one used).
    pub fn new(next_position: u64) -> QueueState {
        QueueState {
            next_position,
            ready: BTreeMap::new(),
            unacked: HashMap::new(),
        }
    }

    /// Appends a message; returns its position.
    pub fn push(&mut self, message: Arc<Message>) -> u64 {
        self.push_expiring(message, None)
    }

    /// Appends a message that expires at `expires_at_ms`; returns its position.
    pub fn push_expiring(&mut self, message: Arc<Message>, expires_at_ms: Option<u64>) -> u64 {
        let position = self.next_position;
        self.next_position += 1;
        self.ready.insert(
            position,
            QueuedMessage {
                message,
                redelivered: false,
                expires_at_ms,
            },
        );
        position
    }

    /// Removes expired messages from the head of the queue, as RabbitMQ does: a message expires
    /// when it reaches the head past its time, never from the middle.
    pub fn drop_expired_head(&mut self, now_ms: u64) -> Vec<(u64, QueuedMessage)> {
        let mut dropped = Vec::new();
        while let Some(entry) = self.ready.first_entry() {
            match entry.get().expires_at_ms {
                Some(expires_at_ms) if expires_at_ms <= now_ms => {
                    dropped.push(entry.remove_entry())
                }
                _ => break,
            }
        }
        dropped
    }

    /// Puts back a message recovered from disk at its old position.
    pub fn restore(&mut self, position: u64, message: Arc<Message>, redelivered: bool) {
        assert!(
            !self.unacked.contains_key(&position),
            "restored position {position} is unacked"
        );
        self.next_position = self.next_position.max(position + 1);
        self.ready.insert(
            position,
            QueuedMessage {
                message,
                redelivered,
                expires_at_ms: None,
            },
        );
    }

    /// The position the next message will get.
    pub fn next_position(&self) -> u64 {
        self.next_position
    }

    /// Takes the first ready message. With `track`, it waits in the unacked set for a settle or a
    /// requeue; without, it leaves the queue (no-ack delivery).
    pub fn pop(&mut self, track: bool) -> Option<(u64, QueuedMessage)> {
        let (position, queued) = self.ready.pop_first()?;
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
                self.ready.insert(position, queued);
                true
            }
            None => false,
        }
    }

    /// Drops every ready message; returns their positions (unacked ones stay, as in RabbitMQ).
    pub fn purge(&mut self) -> Vec<u64> {
        let positions = self.ready.keys().copied().collect();
        self.ready.clear();
        positions
    }

    /// Messages ready for delivery.
    pub fn ready_count(&self) -> usize {
        self.ready.len()
    }

    /// Messages delivered and not settled.
    pub fn unacked_count(&self) -> usize {
        self.unacked.len()
    }

    /// Whether the queue holds no message at all.
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.unacked.is_empty()
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
                        prop_assert_eq!(queue.purge(), model_ready.clone());
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
