//! x-max-priority: higher priorities first, first in first out within one, requeued messages back
//! to their place, a priority above the maximum counted as the maximum, a plain queue unchanged;
//! each priority paged on its own, and a paged head read before anything lower is delivered.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap, VecDeque};

/// A test message: an id (its position when published in order) and its priority property.
#[derive(Debug, Clone, PartialEq)]
struct TestMessage {
    id: u64,
    priority: u8,
}

impl Payload for TestMessage {
    fn size_bytes(&self) -> u64 {
        16
    }

    fn priority(&self) -> u8 {
        self.priority
    }
}

/// Four messages in memory at most; reads start below two.
const WINDOW: Window = Window {
    messages_max: 4,
    bytes_max: 1 << 20,
    low_watermark_messages: 2,
    low_watermark_bytes: 1 << 19,
    page_in_batch_bytes_max: 1 << 20,
};

/// A queue with the log its paged messages went to, one tail per priority.
struct Queue {
    core: QueueCore<TestMessage>,
    effects: Vec<Effect<TestMessage>>,
    /// Paged messages not read yet, per priority as the queue counts it.
    logs: HashMap<u8, VecDeque<TestMessage>>,
    next_id: u64,
    /// The page-in asked for and not served yet: (messages_max, generation, priority).
    asked: Option<(usize, u64, u8)>,
}

impl Queue {
    fn new(max_priority: u8, limits: Limits, window: Option<Window>) -> Queue {
        let core = QueueCore::new(QueueState::with_max_priority(0, max_priority), limits, window);
        Queue { core, effects: Vec::new(), logs: HashMap::new(), next_id: 0, asked: None }
    }

    fn apply(&mut self, command: Command<TestMessage>) -> Reply {
        self.effects.clear();
        let reply = self.core.apply(command, 0, &mut |_| true, &mut self.effects);
        for effect in &self.effects {
            if let Effect::NeedPageIn { messages_max, generation, priority, .. } = effect {
                self.asked = Some((*messages_max, *generation, *priority));
            }
        }
        reply
    }

    fn publish(&mut self, priority: u8) -> Reply {
        let message = TestMessage { id: self.next_id, priority };
        self.next_id += 1;
        let queue_priority = self.core.messages().priority_of(&message);
        let reply = self.apply(Command::Enqueue { message: message.clone(), persistent: true, own_ttl_ms: None });
        if self.effects.iter().any(|effect| matches!(effect, Effect::LogAppend { paged: true, .. })) {
            self.logs.entry(queue_priority).or_default().push_back(message);
        }
        reply
    }

    /// Serves the page-in asked for, if any (its effects stay in `effects`); true when it did.
    fn serve_read(&mut self) -> bool {
        let Some((messages_max, generation, priority)) = self.asked.take() else { return false };
        let log = self.logs.entry(priority).or_default();
        let count = messages_max.min(log.len());
        let messages = log
            .drain(..count)
            .map(|message| PagedMessage { position: message.id, message, redelivered: false, expiry: PagedExpiry::Fixed(None) })
            .collect();
        self.apply(Command::PagedIn { generation, messages });
        true
    }

    /// Message ids taken by basic.get (no-ack) until the queue is empty, serving reads as asked.
    fn get_all(&mut self) -> Vec<u64> {
        let mut got = Vec::new();
        for _ in 0..1000 {
            match self.apply(Command::Get { no_ack: true }) {
                Reply::Got { .. } => got.extend(self.delivered()),
                Reply::PageInFirst => assert!(self.serve_read(), "waits for a read never asked"),
                _ => return got,
            }
        }
        panic!("the queue never emptied");
    }

    fn delivered(&self) -> Vec<u64> {
        self.effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Deliver { queued, .. } => Some(queued.message.id),
                _ => None,
            })
            .collect()
    }

    fn dropped(&self) -> Vec<u64> {
        self.effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Drop { message, .. } => Some(message.id),
                _ => None,
            })
            .collect()
    }
}

/// Priorities of messages 0..8: 3 has none (0); 4 is above the maximum of 5 and counts as 5.
const PUBLISHED: [u8; 8] = [0, 0, 5, 1, 9, 5, 1, 2];
/// Their delivery order.
const EXPECTED: [u64; 8] = [2, 4, 5, 7, 3, 6, 0, 1];

#[test]
fn higher_priorities_go_first_fifo_within_one_and_above_the_maximum_counts_as_it() {
    let mut queue = Queue::new(5, Limits::NONE, None);
    for priority in PUBLISHED {
        queue.publish(priority);
    }
    assert_eq!(queue.core.messages().ready_positions().collect::<Vec<_>>(), EXPECTED);
    assert_eq!(queue.get_all(), EXPECTED);
}

#[test]
fn a_plain_queue_ignores_the_property() {
    let mut queue = Queue::new(0, Limits::NONE, None);
    for priority in PUBLISHED {
        queue.publish(priority);
    }
    assert_eq!(queue.get_all(), (0..8).collect::<Vec<_>>());
}

#[test]
fn requeued_messages_go_back_to_their_place_within_their_priority() {
    let mut queue = Queue::new(5, Limits::NONE, None);
    for priority in PUBLISHED {
        queue.publish(priority);
    }
    queue.apply(Command::AddConsumer { consumer: 1, priority: 0, exclusive: false, prefetch: 3, no_ack: false });
    queue.apply(Command::Dispatch);
    assert_eq!(queue.delivered(), EXPECTED[..3]);
    queue.apply(Command::CancelConsumer { consumer: 1 });
    for position in [5, 2, 4] {
        queue.apply(Command::Requeue { position });
    }
    assert_eq!(queue.get_all(), EXPECTED);
}

#[test]
fn drop_head_drops_the_highest_priority_first_as_rabbitmq_does() {
    let limits = Limits { max_length: Some(3), overflow: Overflow::DropHead, ..Limits::NONE };
    let mut queue = Queue::new(5, limits, None);
    for priority in [1, 3, 2] {
        queue.publish(priority);
    }
    queue.publish(0);
    assert_eq!(queue.dropped(), vec![1], "the head is the highest priority's oldest");
    // RabbitMQ enqueues, then drops the head: a new message above every other is itself dropped.
    queue.publish(5);
    assert_eq!(queue.dropped(), vec![4]);
    assert_eq!(queue.get_all(), vec![2, 0, 3]);
}

#[test]
fn the_delivery_limit_still_drops_a_message_requeued_too_often() {
    let limits = Limits { delivery_limit: Some(0), ..Limits::NONE };
    let mut queue = Queue::new(5, limits, None);
    queue.publish(3);
    queue.publish(4);
    queue.apply(Command::Get { no_ack: false });
    assert_eq!(queue.delivered(), vec![1]);
    queue.apply(Command::Requeue { position: 1 });
    assert_eq!(queue.dropped(), vec![1]);
    assert_eq!(queue.get_all(), vec![0]);
}

#[test]
fn each_priority_pages_on_its_own_and_a_paged_head_is_read_before_anything_lower_goes() {
    let mut queue = Queue::new(9, Limits::NONE, Some(WINDOW));
    // Four low-priority messages fill the window; the rest of every priority is paged.
    for priority in [0, 0, 0, 0, 9, 0, 9, 5] {
        queue.publish(priority);
    }
    let messages = queue.core.messages();
    assert_eq!((messages.ready_in_memory(), messages.paged_count()), (4, 4));
    assert_eq!((messages.paged_count_at(9), messages.paged_count_at(5), messages.paged_count_at(0)), (2, 1, 1));
    assert!(messages.head_is_paged());
    // A consumer gets nothing until priority 9 is read, though memory holds four messages.
    queue.apply(Command::AddConsumer { consumer: 1, priority: 0, exclusive: false, prefetch: 0, no_ack: true });
    queue.apply(Command::Dispatch);
    assert!(queue.delivered().is_empty(), "a lower priority overtook the paged head");
    assert!(matches!(queue.effects[..], [Effect::NeedPageIn { priority: 9, .. }]), "{:?}", queue.effects);
    assert!(queue.serve_read());
    queue.apply(Command::Dispatch);
    assert_eq!(queue.delivered(), vec![4, 6], "the read's messages go out first");
    assert_eq!(queue.asked.map(|(_, _, priority)| priority), Some(5), "then priority 5 is read");
    assert!(queue.serve_read());
    queue.apply(Command::Dispatch);
    let mut rest = queue.delivered();
    assert_eq!(rest[0], 7);
    while queue.serve_read() {
        queue.apply(Command::Dispatch);
        rest.extend(queue.delivered());
    }
    assert_eq!(rest, vec![7, 0, 1, 2, 3, 5]);
    assert!(queue.core.messages().is_empty());
}

#[test]
fn a_recovered_priority_queue_reads_its_highest_priority_first() {
    // Recovered: positions 0..6 on disk, priorities 0, 2, 0, 2, 1, 2.
    let mut queue = Queue::new(2, Limits::NONE, Some(WINDOW));
    queue.core = QueueCore::new(QueueState::with_paged_priorities(6, &[2, 1, 3]), Limits::NONE, Some(WINDOW));
    for (id, priority) in [0u8, 2, 0, 2, 1, 2].into_iter().enumerate() {
        queue.logs.entry(priority).or_default().push_back(TestMessage { id: id as u64, priority });
    }
    queue.next_id = 6;
    // A message published after the restart takes its place among the recovered ones.
    queue.publish(1);
    assert_eq!(queue.core.messages().paged_count_at(1), 2, "behind the recovered priority-1 message");
    assert_eq!(queue.get_all(), vec![1, 3, 5, 4, 6, 0, 2]);
}

#[test]
fn purge_settles_the_paged_messages_of_each_priority() {
    let mut queue = Queue::new(3, Limits::NONE, Some(WINDOW));
    for priority in [0, 0, 0, 0, 3, 0, 3] {
        queue.publish(priority);
    }
    assert_eq!(queue.apply(Command::Purge), Reply::Purged { count: 7 });
    let settled: Vec<(u8, u64)> = queue
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::SettlePaged { count, priority } => Some((*priority, *count)),
            _ => None,
        })
        .collect();
    assert_eq!(settled, vec![(0, 1), (3, 2)]);
    assert_eq!(queue.core.messages().ready_count(), 0);
}

/// What a random run does.
#[derive(Debug, Clone)]
enum Step {
    Publish(u8),
    Dispatch,
    Get,
    Settle(usize),
    Requeue(usize),
    ServeRead,
    Purge,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0u8..12).prop_map(Step::Publish),
        2 => Just(Step::Dispatch),
        1 => Just(Step::Get),
        2 => any::<usize>().prop_map(Step::Settle),
        1 => any::<usize>().prop_map(Step::Requeue),
        3 => Just(Step::ServeRead),
        1 => Just(Step::Purge),
    ]
}

proptest! {
    /// With priorities and paging, against a model of ready messages ordered by (priority
    /// descending, position): every delivery is the model's head, every drop-head drop removes
    /// the model's head, counts match, and memory never holds more than the window, a batch and one message per
    /// priority (besides requeued ones).
    #[test]
    fn deliveries_follow_priority_then_position_through_paging(
        steps in proptest::collection::vec(step(), 0..200),
        max_priority in prop_oneof![Just(0u8), 1u8..10],
        max_length in proptest::option::of(3u64..12),
        prefetch in 1u32..4,
    ) {
        let limits = Limits { max_length, overflow: Overflow::DropHead, ..Limits::NONE };
        let mut queue = Queue::new(max_priority, limits, Some(WINDOW));
        queue.apply(Command::AddConsumer { consumer: 1, priority: 0, exclusive: false, prefetch, no_ack: false });
        // (rank = max - priority, position): the model's ready messages in delivery order.
        let mut ready: BTreeSet<(u8, u64)> = BTreeSet::new();
        let mut priority_of: HashMap<u64, u8> = HashMap::new();
        let mut unacked: Vec<u64> = Vec::new();
        // Dropped while paged: their Drop effect comes when a read reaches them.
        let mut dropped_unread: BTreeSet<u64> = BTreeSet::new();
        let mut pending_read = false;
        // Requeued messages come back to memory whatever the window (as in a plain queue).
        let mut requeued = 0usize;
        for step in steps {
            let mut effects_to_check = Vec::new();
            match step {
                Step::Publish(property) => {
                    let id = queue.next_id;
                    let priority = property.min(max_priority);
                    priority_of.insert(id, priority);
                    ready.insert((max_priority - priority, id));
                    // RabbitMQ's drop-head: enqueue, then drop the head while over the limit.
                    if let Some(max) = max_length {
                        while ready.len() as u64 > max {
                            let (_, head) = ready.pop_first().expect("over a limit means not empty");
                            dropped_unread.insert(head);
                        }
                    }
                    queue.publish(property);
                }
                Step::Dispatch => { queue.apply(Command::Dispatch); }
                Step::Get => { queue.apply(Command::Get { no_ack: false }); }
                Step::Settle(index) | Step::Requeue(index) if !unacked.is_empty() => {
                    let position = unacked.remove(index % unacked.len());
                    if matches!(step, Step::Settle(_)) {
                        queue.apply(Command::Settle { position });
                    } else {
                        ready.insert((max_priority - priority_of[&position], position));
                        requeued += 1;
                        // Limits count ready messages: a requeue past them drops from the head.
                        if let Some(max) = max_length {
                            while ready.len() as u64 > max {
                                let (_, head) = ready.pop_first().expect("over a limit means not empty");
                                dropped_unread.insert(head);
                            }
                        }
                        queue.apply(Command::Requeue { position });
                    }
                }
                Step::ServeRead if pending_read => {
                    pending_read = false;
                    queue.serve_read();
                }
                Step::Purge => {
                    ready.clear();
                    dropped_unread.clear();
                    queue.logs.clear();
                    queue.asked = None;
                    pending_read = false;
                    queue.apply(Command::Purge);
                    continue;
                }
                _ => continue,
            }
            effects_to_check.append(&mut queue.effects);
            for effect in &effects_to_check {
                match effect {
                    Effect::Deliver { queued, position, .. } => {
                        let head = ready.pop_first().map(|(_, head)| head);
                        prop_assert_eq!(head, Some(*position), "delivered {} out of priority order", queued.message.id);
                        unacked.push(*position);
                    }
                    Effect::Drop { position, reason: DeadLetterReason::MaxLength, .. } => {
                        prop_assert!(dropped_unread.remove(position), "dropped {} that was not the head", position);
                    }
                    Effect::NeedPageIn { .. } => pending_read = true,
                    _ => {}
                }
            }
            // Drops of in-memory heads come at once: those left are paged ones not read yet.
            let messages = queue.core.messages();
            prop_assert_eq!(messages.ready_count(), ready.len(), "ready count");
            prop_assert_eq!(messages.unacked_count(), unacked.len());
            prop_assert_eq!(messages.paged_dropped_count(), dropped_unread.len() as u64, "dropped paged count");
            let memory_max = WINDOW.messages_max + WINDOW.low_watermark_messages + usize::from(max_priority) + requeued;
            prop_assert!(messages.ready_in_memory() <= memory_max, "memory past the window, a batch and one per priority");
            prop_assert_eq!(queue.core.page_in_in_flight(), pending_read);
        }
    }
}
