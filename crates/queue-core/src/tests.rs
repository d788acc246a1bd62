//! The queue's rules, driven directly with an injected clock.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};

/// A test message: an id (so order is visible) and a size.
#[derive(Debug, Clone, PartialEq)]
struct TestMessage(u64);

impl Payload for TestMessage {
    fn size_bytes(&self) -> u64 {
        16
    }
}

const WINDOW: Window = Window {
    messages_max: 4,
    bytes_max: 1 << 20,
    low_watermark_messages: 2,
    low_watermark_bytes: 1 << 19,
    page_in_batch_bytes_max: 1 << 20,
};

/// A queue and its effects buffer, with every consumer able to take more unless `blocked`.
struct Harness {
    core: QueueCore<TestMessage>,
    effects: Vec<Effect<TestMessage>>,
    blocked: BTreeSet<ConsumerId>,
    next_id: u64,
}

impl Harness {
    fn new(limits: Limits) -> Harness {
        Harness { core: QueueCore::new(QueueState::new(0), limits, None), effects: Vec::new(), blocked: BTreeSet::new(), next_id: 0 }
    }

    fn apply(&mut self, command: Command<TestMessage>, now_ms: u64) -> Reply {
        self.effects.clear();
        let blocked = &self.blocked;
        self.core.apply(command, now_ms, &mut |consumer: ConsumerRef| !blocked.contains(&consumer.id), &mut self.effects)
    }

    fn publish(&mut self, now_ms: u64) -> (u64, Reply) {
        let id = self.next_id;
        self.next_id += 1;
        (id, self.apply(Command::Enqueue { message: TestMessage(id), persistent: false, own_ttl_ms: None }, now_ms))
    }

    fn consume(&mut self, consumer: ConsumerId, priority: i64, prefetch: u32) -> Reply {
        self.apply(Command::AddConsumer { consumer, priority, exclusive: false, prefetch, no_ack: false }, 0)
    }

    /// (consumer, message id) of every delivery in the last command's effects.
    fn deliveries(&self) -> Vec<(Option<ConsumerId>, u64, u64)> {
        self.effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Deliver { consumer, position, queued, .. } => {
                    Some((consumer.map(|consumer| consumer.id), *position, queued.message.0))
                }
                _ => None,
            })
            .collect()
    }

    fn dropped(&self) -> Vec<(u64, DeadLetterReason)> {
        self.effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Drop { message, reason, .. } => Some((message.0, *reason)),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn one_consumer_gets_messages_in_order() {
    let mut queue = Harness::new(Limits::NONE);
    for _ in 0..5 {
        queue.publish(0);
    }
    queue.consume(1, 0, 0);
    assert_eq!(queue.apply(Command::Dispatch, 0), Reply::Ok);
    let ids: Vec<u64> = queue.deliveries().iter().map(|(_, _, id)| *id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
}

#[test]
fn requeue_returns_to_the_original_place_marked_redelivered() {
    let mut queue = Harness::new(Limits::NONE);
    for _ in 0..3 {
        queue.publish(0);
    }
    queue.consume(1, 0, 2);
    queue.apply(Command::Dispatch, 0);
    let first = queue.deliveries()[0].1;
    queue.apply(Command::Requeue { position: first }, 0);
    queue.apply(Command::Dispatch, 0);
    let again = &queue.effects[0];
    match again {
        Effect::Deliver { position, queued, .. } => {
            assert_eq!(*position, first, "the requeued message comes before message 2");
            assert!(queued.redelivered);
        }
        other => panic!("expected a delivery, got {other:?}"),
    }
}

#[test]
fn higher_priority_first_then_round_robin_among_equals() {
    let mut queue = Harness::new(Limits::NONE);
    queue.consume(1, 0, 0);
    queue.consume(2, 5, 0);
    queue.consume(3, 5, 0);
    for _ in 0..4 {
        queue.publish(0);
    }
    queue.apply(Command::Dispatch, 0);
    let consumers: Vec<Option<u64>> = queue.deliveries().iter().map(|(consumer, _, _)| *consumer).collect();
    assert_eq!(consumers, vec![Some(2), Some(3), Some(2), Some(3)]);
    // Blocked high-priority consumers let the low one have it.
    queue.blocked.extend([2, 3]);
    queue.publish(0);
    queue.apply(Command::Dispatch, 0);
    assert_eq!(queue.deliveries().iter().map(|(consumer, _, _)| *consumer).collect::<Vec<_>>(), vec![Some(1)]);
}

#[test]
fn prefetch_is_respected_and_freed_by_settle() {
    let mut queue = Harness::new(Limits::NONE);
    queue.consume(1, 0, 2);
    for _ in 0..5 {
        queue.publish(0);
    }
    queue.apply(Command::Dispatch, 0);
    let delivered = queue.deliveries();
    assert_eq!(delivered.len(), 2);
    queue.apply(Command::Settle { position: delivered[0].1 }, 0);
    queue.apply(Command::Dispatch, 0);
    assert_eq!(queue.deliveries().len(), 1, "one settle frees one slot");
    assert_eq!(queue.core.consumer_unacked(1), Some(2));
}

#[test]
fn dispatch_one_delivers_one_and_says_so() {
    let mut queue = Harness::new(Limits::NONE);
    queue.consume(1, 0, 0);
    assert_eq!(queue.apply(Command::DispatchOne, 0), Reply::Ok, "nothing to deliver");
    queue.publish(0);
    queue.publish(0);
    assert_eq!(queue.apply(Command::DispatchOne, 0), Reply::Delivered);
    assert_eq!(queue.deliveries().len(), 1, "one message per DispatchOne");
    // A gate that learns of deliveries only between commands (a channel-wide prefetch) is asked again.
    queue.blocked.insert(1);
    assert_eq!(queue.apply(Command::DispatchOne, 0), Reply::Ok);
    assert!(queue.deliveries().is_empty());
}

#[test]
fn exclusive_consumer_refuses_others_until_cancelled() {
    let mut queue = Harness::new(Limits::NONE);
    let exclusive = Command::AddConsumer { consumer: 1, priority: 0, exclusive: true, prefetch: 0, no_ack: false };
    assert_eq!(queue.apply(exclusive, 0), Reply::Ok);
    assert_eq!(queue.consume(2, 0, 0), Reply::ExclusiveInUse);
    assert_eq!(queue.apply(Command::CancelConsumer { consumer: 1 }, 0), Reply::Ok);
    assert_eq!(queue.consume(2, 0, 0), Reply::Ok);
    let exclusive_late = Command::AddConsumer { consumer: 3, priority: 0, exclusive: true, prefetch: 0, no_ack: false };
    assert_eq!(queue.apply(exclusive_late, 0), Reply::ExclusiveInUse, "exclusive needs an empty queue of consumers");
}

#[test]
fn cancel_requeues_nothing_by_itself() {
    let mut queue = Harness::new(Limits::NONE);
    queue.consume(1, 0, 0);
    queue.publish(0);
    queue.apply(Command::Dispatch, 0);
    queue.apply(Command::CancelConsumer { consumer: 1 }, 0);
    assert_eq!(queue.core.messages().unacked_count(), 1);
    assert_eq!(queue.core.messages().ready_count(), 0);
    assert!(queue.effects.is_empty());
}

#[test]
fn ttl_expires_at_the_deadline_not_before() {
    let mut queue = Harness::new(Limits { message_ttl_ms: Some(100), ..Limits::NONE });
    queue.publish(1_000);
    assert_eq!(queue.apply(Command::Expire, 1_099), Reply::Ok);
    assert!(queue.dropped().is_empty(), "not before its time");
    queue.apply(Command::Expire, 1_100);
    assert_eq!(queue.dropped(), vec![(0, DeadLetterReason::Expired)]);
    // The message's own TTL wins when shorter.
    let id = queue.publish(2_000).0;
    queue.apply(Command::Enqueue { message: TestMessage(99), persistent: false, own_ttl_ms: Some(10) }, 2_000);
    queue.apply(Command::Get { no_ack: true }, 2_050);
    assert_eq!(queue.deliveries().iter().map(|(_, _, id)| *id).collect::<Vec<_>>(), vec![id]);
}

#[test]
fn the_head_tells_when_it_expires_and_only_the_head() {
    let mut queue = Harness::new(Limits { message_ttl_ms: Some(100), ..Limits::NONE });
    assert_eq!(queue.core.messages().head_expires_at_ms(), None, "an empty queue has nothing to expire");
    queue.publish(1_000);
    queue.apply(Command::Enqueue { message: TestMessage(9), persistent: false, own_ttl_ms: Some(10) }, 1_050);
    // RabbitMQ expires at the head only: the second message's earlier time waits for the head.
    assert_eq!(queue.core.messages().head_expires_at_ms(), Some(1_100));
    queue.apply(Command::Expire, 1_100);
    assert_eq!(queue.dropped().len(), 2, "the head, then the one behind it that was already due");
    assert_eq!(queue.core.messages().head_expires_at_ms(), None);
    let mut no_ttl = Harness::new(Limits::NONE);
    no_ttl.publish(1_000);
    assert_eq!(no_ttl.core.messages().head_expires_at_ms(), None, "no TTL, no deadline");
}

#[test]
fn max_length_drop_head_drops_the_oldest() {
    let mut queue = Harness::new(Limits { max_length: Some(2), ..Limits::NONE });
    queue.publish(0);
    queue.publish(0);
    let (_, reply) = queue.publish(0);
    assert_eq!(reply, Reply::Ok);
    assert_eq!(queue.dropped(), vec![(0, DeadLetterReason::MaxLength)]);
    assert_eq!(queue.core.messages().ready_count(), 2);
    // A lower limit from a policy drops at once.
    queue.apply(Command::SetLimits(Limits { max_length: Some(1), ..Limits::NONE }), 0);
    assert_eq!(queue.dropped(), vec![(1, DeadLetterReason::MaxLength)]);
}

#[test]
fn max_length_reject_publish_refuses_the_new_one() {
    let mut queue = Harness::new(Limits { max_length: Some(1), overflow: Overflow::RejectPublish, ..Limits::NONE });
    assert_eq!(queue.publish(0).1, Reply::Ok);
    assert_eq!(queue.publish(0).1, Reply::Rejected);
    assert!(queue.dropped().is_empty());
    assert_eq!(queue.core.messages().ready_count(), 1);
    assert_eq!(queue.core.stats().published, 1);
}

#[test]
fn max_length_bytes_drop_head_drops_the_oldest_until_the_bytes_fit() {
    // Test messages are 16 bytes: 40 bytes hold two.
    let mut queue = Harness::new(Limits { max_length_bytes: Some(40), ..Limits::NONE });
    queue.publish(0);
    queue.publish(0);
    assert!(queue.dropped().is_empty());
    queue.publish(0);
    assert_eq!(queue.dropped(), vec![(0, DeadLetterReason::MaxLength)]);
    assert_eq!(queue.core.messages().ready_count(), 2);
    assert_eq!(queue.core.messages().ready_bytes(), 32);
    // A lower byte limit from a policy drops at once.
    queue.apply(Command::SetLimits(Limits { max_length_bytes: Some(20), ..Limits::NONE }), 0);
    assert_eq!(queue.dropped(), vec![(1, DeadLetterReason::MaxLength)]);
}

#[test]
fn a_message_over_the_limit_on_its_own_is_dropped_at_once() {
    let mut queue = Harness::new(Limits { max_length_bytes: Some(10), ..Limits::NONE });
    queue.publish(0);
    queue.publish(0);
    // Without a consumer to take it at once, it leaves at once through the dead-letter hook.
    assert_eq!(queue.publish(0).1, Reply::Dropped, "the message takes a position, then is dropped");
    assert_eq!(queue.dropped(), vec![(2, DeadLetterReason::MaxLength)]);
    assert_eq!(queue.core.messages().ready_count(), 0);
    let mut zero = Harness::new(Limits { max_length: Some(0), ..Limits::NONE });
    assert_eq!(zero.publish(0).1, Reply::Dropped);
    assert_eq!(zero.dropped(), vec![(0, DeadLetterReason::MaxLength)], "x-max-length 0 dead-letters every message");
}

#[test]
fn max_length_bytes_reject_publish_refuses_what_does_not_fit() {
    let mut queue = Harness::new(Limits { max_length_bytes: Some(40), overflow: Overflow::RejectPublish, ..Limits::NONE });
    assert_eq!(queue.publish(0).1, Reply::Ok);
    assert_eq!(queue.publish(0).1, Reply::Ok);
    assert_eq!(queue.publish(0).1, Reply::Rejected);
    assert!(queue.dropped().is_empty());
    // Either limit refuses: the length one here, with bytes to spare.
    let mut both =
        Harness::new(Limits { max_length: Some(1), max_length_bytes: Some(1000), overflow: Overflow::RejectPublish, ..Limits::NONE });
    assert_eq!(both.publish(0).1, Reply::Ok);
    assert_eq!(both.publish(0).1, Reply::Rejected);
}

#[test]
fn reject_without_requeue_drops_with_reason_rejected() {
    let mut queue = Harness::new(Limits::NONE);
    queue.publish(0);
    queue.apply(Command::Get { no_ack: false }, 0);
    let position = queue.deliveries()[0].1;
    queue.apply(Command::Reject { position }, 0);
    assert_eq!(queue.dropped(), vec![(0, DeadLetterReason::Rejected)]);
    assert!(queue.core.messages().is_empty());
    queue.apply(Command::Reject { position }, 0);
    assert!(queue.dropped().is_empty(), "a second reject of the same position finds nothing");
}

#[test]
fn a_message_requeued_past_the_delivery_limit_leaves_with_reason_delivery_limit() {
    let mut queue = Harness::new(Limits { delivery_limit: Some(1), ..Limits::NONE });
    queue.publish(0);
    for round in 0..2 {
        queue.apply(Command::Get { no_ack: false }, 0);
        let delivered = queue.deliveries();
        assert_eq!(delivered.len(), 1, "delivery {round}");
        assert_eq!(
            queue.effects.iter().find_map(|effect| match effect {
                Effect::Deliver { queued, .. } => Some(queued.delivery_count),
                _ => None,
            }),
            Some(round)
        );
        queue.apply(Command::Requeue { position: delivered[0].1 }, 0);
    }
    assert_eq!(queue.dropped(), vec![(0, DeadLetterReason::DeliveryLimit)], "a limit of 1 delivers twice");
    assert!(queue.core.messages().is_empty());
    // Without a limit the count only grows.
    let mut unlimited = Harness::new(Limits::NONE);
    unlimited.publish(0);
    for _ in 0..5 {
        unlimited.apply(Command::Get { no_ack: false }, 0);
        let position = unlimited.deliveries()[0].1;
        unlimited.apply(Command::Requeue { position }, 0);
        assert!(unlimited.dropped().is_empty());
    }
}

#[test]
fn purge_drops_ready_and_keeps_unacked() {
    let mut queue = Harness::new(Limits::NONE);
    for _ in 0..3 {
        queue.publish(0);
    }
    queue.apply(Command::Get { no_ack: false }, 0);
    assert_eq!(queue.apply(Command::Purge, 0), Reply::Purged { count: 2 });
    assert_eq!(queue.core.messages().unacked_count(), 1);
}

#[test]
fn paging_asks_for_page_in_before_dispatch() {
    let mut core = QueueCore::new(QueueState::with_paged(10, 3), Limits::NONE, Some(WINDOW));
    let mut effects = Vec::new();
    core.apply(
        Command::AddConsumer { consumer: 1, priority: 0, exclusive: false, prefetch: 0, no_ack: false },
        0,
        &mut |_| true,
        &mut effects,
    );
    assert_eq!(core.apply(Command::Dispatch, 0, &mut |_| true, &mut effects), Reply::Ok);
    let [Effect::NeedPageIn { messages_max: 3, generation, .. }] = effects[..] else { panic!("one page-in asked: {effects:?}") };
    let messages = (7..10)
        .map(|position| PagedMessage { position, message: TestMessage(position), redelivered: false, expiry: PagedExpiry::Fixed(None) })
        .collect();
    assert_eq!(core.apply(Command::PagedIn { generation, messages }, 0, &mut |_| true, &mut effects), Reply::Ok);
    effects.clear();
    assert_eq!(core.apply(Command::Dispatch, 0, &mut |_| true, &mut effects), Reply::Ok);
    let positions: Vec<u64> = effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Deliver { position, .. } => Some(*position),
            _ => None,
        })
        .collect();
    assert_eq!(positions, vec![7, 8, 9]);
}

#[test]
fn single_active_consumer_delivers_to_the_first_subscriber_only() {
    let mut queue = Harness::new(Limits::NONE);
    queue.core = QueueCore::new(QueueState::new(0), Limits::NONE, None).with_single_active_consumer(true);
    assert_eq!(queue.core.single_active_consumer(), None);
    let exclusive = Command::AddConsumer { consumer: 9, priority: 0, exclusive: true, prefetch: 0, no_ack: false };
    assert_eq!(queue.apply(exclusive, 0), Reply::ExclusiveInUse, "RabbitMQ refuses exclusive consumers on a SAC queue");
    // The second subscriber has the higher priority: RabbitMQ 3.10's classic queues still pick
    // the first one.
    queue.consume(1, 0, 0);
    queue.consume(2, 5, 0);
    assert_eq!(queue.core.single_active_consumer(), Some(1));
    for _ in 0..3 {
        queue.publish(0);
    }
    queue.apply(Command::Dispatch, 0);
    assert_eq!(
        queue.deliveries().iter().map(|(consumer, _, id)| (*consumer, *id)).collect::<Vec<_>>(),
        vec![(Some(1), 0), (Some(1), 1), (Some(1), 2)]
    );
}

#[test]
fn single_active_consumer_waits_for_the_active_one_and_never_falls_back() {
    let mut queue = Harness::new(Limits::NONE);
    queue.core = QueueCore::new(QueueState::new(0), Limits::NONE, None).with_single_active_consumer(true);
    queue.consume(1, 0, 1);
    queue.consume(2, 0, 0);
    queue.publish(0);
    queue.publish(0);
    queue.apply(Command::Dispatch, 0);
    // The active consumer's prefetch is full: the waiting one gets nothing.
    assert_eq!(queue.deliveries().iter().map(|(consumer, _, _)| *consumer).collect::<Vec<_>>(), vec![Some(1)]);
    queue.blocked.insert(1);
    queue.apply(Command::Settle { position: 0 }, 0);
    queue.apply(Command::Dispatch, 0);
    assert!(queue.deliveries().is_empty(), "a blocked active consumer passed its turn on");
}

#[test]
fn single_active_consumer_fails_over_in_subscription_order_with_requeued_messages_first() {
    let mut queue = Harness::new(Limits::NONE);
    queue.core = QueueCore::new(QueueState::new(0), Limits::NONE, None).with_single_active_consumer(true);
    queue.consume(1, 0, 0);
    queue.consume(2, 0, 0);
    queue.consume(3, 0, 0);
    for _ in 0..4 {
        queue.publish(0);
    }
    queue.apply(Command::Dispatch, 0);
    assert_eq!(queue.deliveries().len(), 4);
    // The active consumer's channel closes: it is cancelled and its unacked messages requeued.
    assert_eq!(queue.apply(Command::CancelConsumer { consumer: 1 }, 0), Reply::Ok);
    assert_eq!(queue.core.single_active_consumer(), Some(2));
    for position in [2, 0, 3, 1] {
        queue.apply(Command::Requeue { position }, 0);
    }
    queue.apply(Command::Dispatch, 0);
    let delivered: Vec<_> = queue.deliveries().iter().map(|(consumer, position, _)| (*consumer, *position)).collect();
    assert_eq!(delivered, vec![(Some(2), 0), (Some(2), 1), (Some(2), 2), (Some(2), 3)]);
    // A waiting consumer that cancels changes nothing; the active one going hands over to 3.
    queue.apply(Command::CancelConsumer { consumer: 3 }, 0);
    assert_eq!(queue.core.single_active_consumer(), Some(2));
    queue.consume(4, 0, 0);
    queue.apply(Command::CancelConsumer { consumer: 2 }, 0);
    assert_eq!(queue.core.single_active_consumer(), Some(4));
}

/// What a random run does.
#[derive(Debug, Clone)]
enum Step {
    Publish { ttl_ms: Option<u64> },
    AddConsumer { priority: i64, prefetch: u32, no_ack: bool },
    Cancel(usize),
    Block(usize),
    Dispatch,
    Get { no_ack: bool },
    Settle(usize),
    Requeue(usize),
    Reject(usize),
    Purge,
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => proptest::option::of(0u64..50).prop_map(|ttl_ms| Step::Publish { ttl_ms }),
        1 => (0i64..3, 0u32..4, any::<bool>()).prop_map(|(priority, prefetch, no_ack)| Step::AddConsumer { priority, prefetch, no_ack }),
        1 => any::<usize>().prop_map(Step::Cancel),
        1 => any::<usize>().prop_map(Step::Block),
        3 => Just(Step::Dispatch),
        1 => any::<bool>().prop_map(|no_ack| Step::Get { no_ack }),
        2 => any::<usize>().prop_map(Step::Settle),
        2 => any::<usize>().prop_map(Step::Requeue),
        1 => any::<usize>().prop_map(Step::Reject),
        1 => Just(Step::Purge),
        2 => (0u64..40).prop_map(Step::Advance),
    ]
}

/// Where a message is, by the effects seen so far.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Whereabouts {
    Ready,
    Unacked,
    Settled,
    Dropped,
}

proptest! {
    /// Every enqueued message is exactly once ready, unacked, settled or dropped; each delivery
    /// is the lowest ready position (FIFO, requeued ones back in their place); a blocked or full
    /// consumer gets nothing; nothing expires early, and after a command that looks at the head
    /// (dispatch, get, expire) the head is not expired.
    #[test]
    fn conservation_order_prefetch_and_ttl(
        steps in proptest::collection::vec(step(), 0..150),
        queue_ttl_ms in proptest::option::of(0u64..60),
        single_active_consumer in any::<bool>(),
    ) {
        // Test messages are 16 bytes: the byte limit (15 messages) bites before the length limit.
        let limits = Limits { max_length: Some(20), max_length_bytes: Some(16 * 15), message_ttl_ms: queue_ttl_ms, delivery_limit: Some(3), ..Limits::NONE };
        let mut queue = Harness::new(limits);
        queue.core = QueueCore::new(QueueState::new(0), limits, None).with_single_active_consumer(single_active_consumer);
        let mut now_ms = 0u64;
        let mut whereabouts: HashMap<u64, Whereabouts> = HashMap::new();
        let mut deadline_of_position: HashMap<u64, u64> = HashMap::new();
        let mut ready_positions: BTreeSet<u64> = BTreeSet::new();
        let mut unacked: Vec<(u64, u64)> = Vec::new(); // (position, message id)
        let mut consumers: Vec<(ConsumerId, u32, bool)> = Vec::new();
        let mut held: HashMap<ConsumerId, u32> = HashMap::new();
        let mut holder_of: HashMap<u64, ConsumerId> = HashMap::new();
        let mut next_consumer = 0u64;
        for step in steps {
            let mut published = None;
            let command = match step {
                Step::Publish { ttl_ms } => {
                    let id = queue.next_id;
                    queue.next_id += 1;
                    let ttl = match (ttl_ms, queue_ttl_ms) { (Some(a), Some(b)) => Some(a.min(b)), (a, b) => a.or(b) };
                    published = Some((id, ttl.map(|ttl| now_ms + ttl)));
                    Command::Enqueue { message: TestMessage(id), persistent: false, own_ttl_ms: ttl_ms }
                }
                Step::AddConsumer { priority, prefetch, no_ack } => {
                    next_consumer += 1;
                    consumers.push((next_consumer, prefetch, no_ack));
                    Command::AddConsumer { consumer: next_consumer, priority, exclusive: false, prefetch, no_ack }
                }
                Step::Cancel(index) if !consumers.is_empty() => {
                    let (consumer, _, _) = consumers.remove(index % consumers.len());
                    queue.blocked.remove(&consumer);
                    Command::CancelConsumer { consumer }
                }
                Step::Block(index) if !consumers.is_empty() => {
                    let consumer = consumers[index % consumers.len()].0;
                    if !queue.blocked.remove(&consumer) { queue.blocked.insert(consumer); }
                    continue;
                }
                Step::Dispatch => Command::Dispatch,
                Step::Get { no_ack } => Command::Get { no_ack },
                Step::Settle(index) | Step::Requeue(index) | Step::Reject(index) if !unacked.is_empty() => {
                    let (position, id) = unacked.remove(index % unacked.len());
                    if let Some(consumer) = holder_of.remove(&position) { *held.entry(consumer).or_default() -= 1; }
                    if matches!(step, Step::Settle(_)) {
                        whereabouts.insert(id, Whereabouts::Settled);
                        Command::Settle { position }
                    } else if matches!(step, Step::Reject(_)) {
                        whereabouts.insert(id, Whereabouts::Dropped);
                        Command::Reject { position }
                    } else {
                        whereabouts.insert(id, Whereabouts::Ready);
                        ready_positions.insert(position);
                        Command::Requeue { position }
                    }
                }
                Step::Purge => Command::Purge,
                Step::Advance(ms) => { now_ms += ms; continue; }
                _ => continue,
            };
            let looks_at_head = matches!(command, Command::Dispatch | Command::Get { .. });
            let is_purge = matches!(command, Command::Purge);
            let expired_head = ready_positions.first().copied().filter(|head| deadline_of_position.get(head).is_some_and(|deadline| *deadline <= now_ms));
            let reply = queue.apply(command, now_ms);
            if is_purge {
                ready_positions.clear();
                for state in whereabouts.values_mut() {
                    if *state == Whereabouts::Ready { *state = Whereabouts::Dropped; }
                }
            }
            // A publish a consumer took at once is delivered by the enqueue itself (RabbitMQ hands
            // a message that would not be kept, TTL 0 or x-max-length 0, to a ready consumer).
            let delivered_at_once = published.is_some();
            // A message dropped at once (TTL 0, no consumer ready) still took a position: its Drop
            // effect names it.
            if let (Some((id, deadline)), Reply::Ok | Reply::Dropped) = (published, &reply) {
                let position = queue.core.messages().next_position() - 1;
                whereabouts.insert(id, Whereabouts::Ready);
                ready_positions.insert(position);
                if let Some(deadline) = deadline { deadline_of_position.insert(position, deadline); }
            }
            for effect in &queue.effects {
                match effect {
                    Effect::Deliver { position, queued, no_ack, consumer } => {
                        let id = queued.message.0;
                        prop_assert_eq!(whereabouts.get(&id), Some(&Whereabouts::Ready), "delivered twice: {}", id);
                        prop_assert_eq!(ready_positions.pop_first(), Some(*position), "not the lowest ready position");
                        if let Some(deadline) = deadline_of_position.get(position) { prop_assert!(*deadline > now_ms || delivered_at_once, "an expired message was delivered"); }
                        if *no_ack {
                            whereabouts.insert(id, Whereabouts::Settled);
                        } else {
                            whereabouts.insert(id, Whereabouts::Unacked);
                            unacked.push((*position, id));
                        }
                        if let Some(consumer) = consumer {
                            let (_, prefetch, consumer_no_ack) = consumers.iter().find(|(c, _, _)| *c == consumer.id).copied().expect("delivered to a live consumer");
                            prop_assert!(!queue.blocked.contains(&consumer.id), "a blocked consumer got a message");
                            if single_active_consumer {
                                prop_assert_eq!(Some(consumer.id), consumers.first().map(|(c, _, _)| *c), "a waiting consumer got a message");
                            }
                            if !consumer_no_ack {
                                let count = held.entry(consumer.id).or_default();
                                *count += 1;
                                holder_of.insert(*position, consumer.id);
                                prop_assert!(prefetch == 0 || *count <= prefetch, "prefetch {} exceeded", prefetch);
                            }
                        }
                    }
                    Effect::Drop { message, reason: DeadLetterReason::Rejected, .. } => {
                        prop_assert_eq!(whereabouts.get(&message.0), Some(&Whereabouts::Dropped), "only a rejected unacked message drops as rejected");
                    }
                    Effect::Drop { position, message, reason, .. } => {
                        prop_assert_eq!(whereabouts.get(&message.0), Some(&Whereabouts::Ready));
                        prop_assert!(ready_positions.remove(position), "dropped a message that was not ready");
                        if *reason == DeadLetterReason::Expired {
                            let deadline = deadline_of_position.get(position).copied();
                            prop_assert!(deadline.is_some_and(|deadline| deadline <= now_ms), "expired early");
                        }
                        whereabouts.insert(message.0, Whereabouts::Dropped);
                    }
                    _ => {}
                }
            }
            // Drop-head makes room before it enqueues: after a publish both limits hold (requeues
            // may go past them in between, as in RabbitMQ).
            if published.is_some() {
                prop_assert!(queue.core.messages().ready_count() <= 20, "x-max-length passed after a publish");
                prop_assert!(queue.core.messages().ready_bytes() <= 16 * 15, "x-max-length-bytes passed after a publish");
            }
            // Conservation: the core's counts match the model's.
            let ready = whereabouts.values().filter(|state| **state == Whereabouts::Ready).count();
            let unacked_model = whereabouts.values().filter(|state| **state == Whereabouts::Unacked).count();
            prop_assert_eq!(queue.core.messages().ready_count(), ready);
            prop_assert_eq!(queue.core.messages().unacked_count(), unacked_model);
            prop_assert_eq!(queue.core.messages().unacked_bytes(), 16 * unacked_model as u64, "unacked body bytes");
            prop_assert_eq!(queue.core.messages().ready_positions().collect::<Vec<_>>(), ready_positions.iter().copied().collect::<Vec<_>>());
            let expected_active = consumers.first().map(|(consumer, _, _)| *consumer).filter(|_| single_active_consumer);
            prop_assert_eq!(queue.core.single_active_consumer(), expected_active, "the active consumer is not the earliest subscribed");
            // TTL never later than the next command that looks at the head: a head that had
            // expired before a dispatch or get is gone after it.
            if let (true, Some(head)) = (looks_at_head, expired_head) {
                prop_assert!(!ready_positions.contains(&head), "an expired head outlived a dispatch or get");
            }
        }
    }
}

#[test]
fn the_unlogged_tally_follows_transient_messages_through_delivery_requeue_and_purge() {
    let mut state: QueueState<TestMessage> = QueueState::new(0);
    let tally = |state: &QueueState<TestMessage>| (state.unlogged().count, state.unlogged().bytes);
    state.push_expiring(TestMessage(0), None, false);
    state.push_expiring(TestMessage(1), None, true);
    state.push_expiring(TestMessage(2), None, false);
    assert_eq!(tally(&state), (2, 32), "the logged one is not counted");
    let (first, _) = state.pop(true).expect("a ready message");
    assert_eq!(tally(&state), (2, 32), "an unacked transient message still counts");
    assert!(state.requeue(first));
    let (first, _) = state.pop(true).expect("a ready message");
    state.purge();
    assert_eq!(tally(&state), (1, 16), "the purge leaves the unacked one");
    state.settle(first);
    assert_eq!(tally(&state), (0, 0));
    let expiring = state.push_expiring(TestMessage(3), Some(10), false);
    assert_eq!(state.drop_expired_head(20).first().map(|(position, _)| *position), Some(expiring));
    assert_eq!(tally(&state), (0, 0), "an expired one leaves the tally");
}
