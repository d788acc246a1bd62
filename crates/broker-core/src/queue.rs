//! A queue's messages: ready ones in queue order, and unacknowledged ones waiting for a settle.
//!
//! The rules live in the `queue-core` crate, generic over the message type; this module names
//! them for the broker's [`Message`], so there is one home for queue rules.

use crate::message::Message;
use std::sync::Arc;

/// The messages of one queue, holding shared broker messages.
pub type QueueState = queue_core::QueueState<Arc<Message>>;

/// A message in a queue.
pub type QueuedMessage = queue_core::QueuedMessage<Arc<Message>>;

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
            published_at_ns: 0,
            bcc_routing_keys: None,
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
