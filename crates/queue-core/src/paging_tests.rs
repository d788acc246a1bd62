//! Page-in as a read in flight: the queue asks once, goes on serving memory, answers basic.get,
//! purge and drop-head meanwhile, and discards a read that a purge overtook.

use super::*;

/// A test message: its id is its position, so order is visible.
#[derive(Debug, Clone, PartialEq)]
struct TestMessage(u64);

impl Payload for TestMessage {
    fn size_bytes(&self) -> u64 {
        16
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

struct Queue {
    core: QueueCore<TestMessage>,
    effects: Vec<Effect<TestMessage>>,
    /// What the log holds past the window: positions of paged messages not read yet, with the
    /// expiry each record keeps.
    log: std::collections::VecDeque<(u64, Option<u64>)>,
    /// The clock commands are applied at.
    now_ms: u64,
}

impl Queue {
    /// A queue that took `count` messages: the first four in memory, the rest paged.
    fn with_messages(count: u64, limits: Limits) -> Queue {
        let mut queue = Queue {
            core: QueueCore::new(QueueState::new(0), limits, Some(WINDOW)),
            effects: Vec::new(),
            log: Default::default(),
            now_ms: 0,
        };
        for _ in 0..count {
            queue.publish();
        }
        queue
    }

    fn apply(&mut self, command: Command<TestMessage>) -> Reply {
        self.effects.clear();
        self.core.apply(command, self.now_ms, &mut |_| true, &mut self.effects)
    }

    fn publish(&mut self) -> Reply {
        let position = self.core.messages().next_position();
        let reply = self.apply(Command::Enqueue { message: TestMessage(position), persistent: true, own_ttl_ms: None });
        let paged = self.effects.iter().find_map(|effect| match effect {
            Effect::LogAppend { paged: true, expires_at_ms, .. } => Some(*expires_at_ms),
            _ => None,
        });
        if let Some(expires_at_ms) = paged {
            self.log.push_back((position, expires_at_ms));
        }
        reply
    }

    /// The page-in asked for by the last command: (messages_max, generation).
    fn page_in_asked(&self) -> Option<(usize, u64)> {
        self.effects.iter().find_map(|effect| match effect {
            Effect::NeedPageIn { messages_max, generation, .. } => Some((*messages_max, *generation)),
            _ => None,
        })
    }

    /// Reads what a page-in asked for from the log, redelivered flagged for `redelivered`.
    fn read(&mut self, messages_max: usize, redelivered: &[u64]) -> Vec<PagedMessage<TestMessage>> {
        let count = messages_max.min(self.log.len());
        self.log
            .drain(..count)
            .map(|(position, expires_at_ms)| PagedMessage {
                position,
                message: TestMessage(position),
                redelivered: redelivered.contains(&position),
                expiry: PagedExpiry::Fixed(expires_at_ms),
            })
            .collect()
    }

    fn delivered(&self) -> Vec<(u64, bool)> {
        self.effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Deliver { queued, .. } => Some((queued.message.0, queued.redelivered)),
                _ => None,
            })
            .collect()
    }

    fn dropped(&self) -> Vec<u64> {
        self.dropped_for(DeadLetterReason::MaxLength)
    }

    fn dropped_for(&self, wanted: DeadLetterReason) -> Vec<u64> {
        self.effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Drop { message, reason, .. } if *reason == wanted => Some(message.0),
                _ => None,
            })
            .collect()
    }

    fn consume(&mut self, prefetch: u32) {
        self.apply(Command::AddConsumer { consumer: 1, priority: 0, exclusive: false, prefetch, no_ack: false });
    }
}

#[test]
fn a_page_in_in_flight_is_asked_for_once_and_memory_keeps_being_delivered() {
    let mut queue = Queue::with_messages(10, Limits::NONE);
    assert_eq!((queue.core.messages().ready_in_memory(), queue.core.messages().paged_count()), (4, 6));
    queue.consume(3);
    queue.apply(Command::Dispatch);
    // Three delivered leaves one in memory, below the watermark: one read is asked for, once.
    let (messages_max, generation) = queue.page_in_asked().expect("a read asked for");
    assert_eq!(queue.delivered(), vec![(0, false), (1, false), (2, false)]);
    assert!(queue.core.page_in_in_flight());
    queue.apply(Command::Settle { position: 0 });
    queue.apply(Command::Dispatch);
    assert_eq!(queue.delivered(), vec![(3, false)], "memory is served while the read runs");
    assert_eq!(queue.page_in_asked(), None, "no second read while one is out");
    queue.apply(Command::Settle { position: 1 });
    assert_eq!(queue.apply(Command::Dispatch), Reply::Ok);
    assert_eq!(queue.page_in_asked(), None);
    assert!(queue.delivered().is_empty(), "nothing in memory: the consumer waits for the read");
    // The read comes back: its messages follow in position order, redelivered flags kept.
    let messages = queue.read(messages_max, &[5]);
    assert_eq!(messages.len(), 3, "room for three beside the one in memory when asked");
    assert_eq!(queue.apply(Command::PagedIn { generation, messages }), Reply::Ok);
    assert!(!queue.core.page_in_in_flight());
    queue.apply(Command::Settle { position: 2 });
    queue.apply(Command::Dispatch);
    assert_eq!(queue.delivered(), vec![(4, false), (5, true)]);
}

#[test]
fn a_read_overtaken_by_a_purge_is_discarded() {
    let mut queue = Queue::with_messages(10, Limits::NONE);
    queue.apply(Command::Get { no_ack: true });
    queue.apply(Command::Get { no_ack: true });
    queue.apply(Command::Get { no_ack: true });
    queue.apply(Command::Dispatch);
    let (messages_max, stale_generation) = queue.page_in_asked().expect("a read asked for");
    let stale = queue.read(messages_max, &[]);
    assert_eq!(queue.apply(Command::Purge), Reply::Purged { count: 7 });
    assert!(
        matches!(queue.effects[..], [Effect::LogSettle { position: 3 }, Effect::SettlePaged { count: 6, priority: 0 }]),
        "{:?}",
        queue.effects
    );
    assert_eq!(queue.apply(Command::PagedIn { generation: stale_generation, messages: stale }), Reply::Stale);
    assert_eq!(queue.core.messages().ready_count(), 0, "purged messages do not come back");
    assert_eq!(queue.apply(Command::PageInFailed { generation: stale_generation }), Reply::Stale);
    // A new backlog pages again under a new generation; the old one stays stale.
    queue.log.clear();
    for _ in 0..6 {
        queue.publish();
    }
    queue.apply(Command::Get { no_ack: true });
    queue.apply(Command::Get { no_ack: true });
    queue.apply(Command::Get { no_ack: true });
    queue.apply(Command::Dispatch);
    let (_, generation) = queue.page_in_asked().expect("a read asked for");
    assert_ne!(generation, stale_generation);
    assert_eq!(queue.apply(Command::PagedIn { generation: stale_generation, messages: Vec::new() }), Reply::Stale);
    assert!(queue.core.page_in_in_flight(), "the current read is still awaited");
}

#[test]
fn basic_get_on_an_all_paged_queue_waits_for_the_read_and_gets_the_oldest() {
    let mut queue = Queue {
        core: QueueCore::new(QueueState::with_paged(100, 5), Limits::NONE, Some(WINDOW)),
        effects: Vec::new(),
        log: (95..100).map(|position| (position, None)).collect(),
        now_ms: 0,
    };
    assert_eq!(queue.apply(Command::Get { no_ack: false }), Reply::PageInFirst);
    let (messages_max, generation) = queue.page_in_asked().expect("the get asks for a read");
    assert_eq!(queue.apply(Command::Get { no_ack: false }), Reply::PageInFirst);
    assert_eq!(queue.page_in_asked(), None, "a second get waits for the same read");
    let messages = queue.read(messages_max, &[95]);
    queue.apply(Command::PagedIn { generation, messages });
    assert_eq!(queue.apply(Command::Get { no_ack: false }), Reply::Got { message_count: 4 });
    assert_eq!(queue.delivered(), vec![(95, true)]);
}

/// A recovered queue (everything paged) given its policy at start reads nothing while no
/// consumer asks; with a length limit it is over, it reads to drop from the head.
#[test]
fn a_recovered_queue_pages_in_only_when_asked_or_over_a_limit() {
    let mut queue = Queue {
        core: QueueCore::new(QueueState::with_paged(100, 5), Limits::NONE, Some(WINDOW)),
        effects: Vec::new(),
        log: (95..100).map(|position| (position, None)).collect(),
        now_ms: 0,
    };
    queue.apply(Command::SetLimits(Limits::NONE));
    assert_eq!(queue.page_in_asked(), None, "no limit, no consumer: nothing read");
    queue.apply(Command::SetLimits(Limits { max_length: Some(2), overflow: Overflow::DropHead, ..Limits::NONE }));
    assert!(queue.page_in_asked().is_some(), "over x-max-length: the head is read to be dropped");
}

/// A recovered queue with a TTL reads its head at start: messages that expired while the broker
/// was down are dropped as the read brings them (RabbitMQ's start drops them too), and the rest
/// keep the expiry their records fixed at publish.
#[test]
fn a_recovered_queue_with_a_ttl_reads_its_head_and_drops_what_expired_meanwhile() {
    let mut queue = Queue {
        core: QueueCore::new(QueueState::with_paged(100, 4), Limits::NONE, Some(WINDOW)),
        effects: Vec::new(),
        log: [(96, Some(1_000)), (97, Some(1_000)), (98, Some(5_000)), (99, Some(5_000))].into(),
        now_ms: 2_000,
    };
    queue.apply(Command::SetLimits(Limits { message_ttl_ms: Some(60_000), ..Limits::NONE }));
    let (messages_max, generation) = queue.page_in_asked().expect("a TTL reads the head");
    let messages = queue.read(messages_max, &[]);
    queue.apply(Command::PagedIn { generation, messages });
    queue.apply(Command::Expire);
    assert_eq!(queue.dropped_for(DeadLetterReason::Expired), vec![96, 97]);
    assert_eq!(queue.core.messages().ready_count(), 2);
    assert_eq!(queue.core.messages().head_expires_at_ms(), Some(5_000), "the expiry fixed at publish, not the queue's TTL from now");
}

#[test]
fn drop_head_during_a_read_drops_the_oldest_paged_when_they_are_read() {
    let limits = Limits { max_length: Some(3), overflow: Overflow::DropHead, ..Limits::NONE };
    let mut queue = Queue {
        core: QueueCore::new(QueueState::with_paged(100, 3), limits, Some(WINDOW)),
        effects: Vec::new(),
        log: (97..100).map(|position| (position, None)).collect(),
        now_ms: 0,
    };
    assert_eq!(queue.apply(Command::Get { no_ack: false }), Reply::PageInFirst);
    let (messages_max, generation) = queue.page_in_asked().expect("a read asked for");
    // Two publishes past the limit drop the two oldest, which only the log holds.
    queue.publish();
    queue.publish();
    assert_eq!(queue.core.messages().ready_count(), 3);
    assert!(queue.dropped().is_empty(), "dropped once read");
    let messages = queue.read(messages_max, &[]);
    assert_eq!(queue.apply(Command::PagedIn { generation, messages }), Reply::Ok);
    assert_eq!(queue.dropped(), vec![97, 98]);
    assert!(queue.effects.iter().any(|effect| matches!(effect, Effect::Drop { position: 97, logged: true, .. })), "settled once dropped");
    let mut got = Vec::new();
    let mut asked = None;
    loop {
        let reply = queue.apply(Command::Get { no_ack: true });
        asked = queue.page_in_asked().or(asked);
        match reply {
            Reply::Got { .. } => got.extend(queue.delivered().into_iter().map(|(id, _)| id)),
            Reply::PageInFirst => {
                let (messages_max, generation) = asked.take().expect("a read asked for");
                let messages = queue.read(messages_max, &[]);
                queue.apply(Command::PagedIn { generation, messages });
            }
            _ => break,
        }
    }
    assert_eq!(got, vec![99, 100, 101]);
}

#[test]
fn a_failed_read_forgets_the_paged_messages() {
    let mut queue = Queue::with_messages(6, Limits::NONE);
    for _ in 0..3 {
        queue.apply(Command::Get { no_ack: true });
    }
    queue.apply(Command::Dispatch);
    let (_, generation) = queue.page_in_asked().expect("a read asked for");
    assert_eq!(queue.apply(Command::PageInFailed { generation }), Reply::Ok);
    assert_eq!(queue.core.messages().paged_count(), 0);
    assert!(!queue.core.page_in_in_flight());
}

#[test]
fn a_zero_length_queue_drops_a_publish_without_writing_it() {
    let limits = Limits { max_length: Some(0), overflow: Overflow::DropHead, ..Limits::NONE };
    let mut queue = Queue::with_messages(0, limits);
    assert_eq!(queue.publish(), Reply::Dropped);
    // Nothing to write or settle: only the dead-letter hook, unlogged.
    assert!(matches!(queue.effects[..], [Effect::Drop { logged: false, reason: DeadLetterReason::MaxLength, .. }]), "{:?}", queue.effects);
    assert_eq!(queue.core.messages().ready_count(), 0);
}

#[test]
fn a_message_the_queue_would_not_keep_goes_to_a_ready_consumer_or_is_dropped() {
    for limits in
        [Limits { max_length: Some(0), overflow: Overflow::DropHead, ..Limits::NONE }, Limits { message_ttl_ms: Some(0), ..Limits::NONE }]
    {
        let mut queue = Queue::with_messages(0, limits);
        queue.consume(1);
        assert_eq!(queue.publish(), Reply::Ok, "{limits:?}");
        assert_eq!(queue.delivered(), vec![(0, false)], "the ready consumer gets it at once ({limits:?})");
        assert!(matches!(queue.effects[0], Effect::LogAppend { position: 0, paged: false, .. }), "written before it is delivered");
        // The consumer's prefetch of one is now full: the next one is dropped, nothing written.
        assert_eq!(queue.publish(), Reply::Dropped, "{limits:?}");
        assert!(matches!(queue.effects[..], [Effect::Drop { logged: false, .. }]), "{:?}", queue.effects);
        assert_eq!(queue.core.messages().ready_count(), 0);
    }
}

#[test]
fn a_read_that_lost_messages_to_damage_takes_them_off_the_counts_and_the_rest_is_served() {
    let mut queue = Queue::with_messages(10, Limits::NONE);
    queue.consume(10);
    queue.apply(Command::Dispatch);
    let (messages_max, generation) = queue.page_in_asked().expect("a read asked for");
    assert_eq!(queue.core.messages().paged_count(), 6);
    // The read met a bad record holding its second message (position 5): it brings the others
    // and says one is lost.
    let mut messages = queue.read(messages_max, &[]);
    assert!(messages.len() >= 3, "{} read", messages.len());
    assert_eq!(messages.remove(1).position, 5);
    let served: Vec<u64> = messages.iter().map(|message| message.position).collect();
    let left_on_disk = queue.log.len() as u64;
    assert_eq!(queue.apply(Command::PagedInWithLoss { generation, messages, lost: 1 }), Reply::Ok);
    assert_eq!(queue.core.messages().paged_count(), left_on_disk, "the lost one left the count");
    queue.apply(Command::Dispatch);
    assert_eq!(queue.delivered().iter().map(|(position, _)| *position).collect::<Vec<_>>(), served);
    // A loss larger than what is paged (damage past the recovered backlog is counted by the
    // gap) takes at most what is paged.
    let (_, generation) = queue.page_in_asked().expect("the next read");
    assert_eq!(queue.apply(Command::PagedInWithLoss { generation, messages: Vec::new(), lost: u64::MAX }), Reply::Ok);
    assert_eq!(queue.core.messages().paged_count(), 0);
    let messages = queue.core.messages();
    assert_eq!((messages.ready_count(), messages.unacked_count()), (0, 4 + served.len()), "the unacked ones stay, nothing else is counted");
    // A stale result changes nothing.
    assert_eq!(queue.apply(Command::PagedInWithLoss { generation, messages: Vec::new(), lost: 3 }), Reply::Stale);
}

/// RabbitMQ fixes a message's expiry when it is enqueued: a paged message's record keeps it, so
/// the time it spent on disk counts, and one that expired there is dropped as the read brings it,
/// never delivered (before records kept it, the TTL counted again from the read).
#[test]
fn a_paged_message_expires_from_its_publish_not_from_its_page_in() {
    let mut queue = Queue::with_messages(10, Limits { message_ttl_ms: Some(1_000), ..Limits::NONE });
    assert_eq!(queue.log.iter().map(|(_, expires_at_ms)| *expires_at_ms).collect::<Vec<_>>(), vec![Some(1_000); 6]);
    queue.now_ms = 1_500;
    queue.apply(Command::Expire);
    assert_eq!(queue.dropped_for(DeadLetterReason::Expired), vec![0, 1, 2, 3]);
    let (messages_max, generation) = queue.page_in_asked().expect("the emptied window asks for a read");
    queue.consume(10);
    let messages = queue.read(messages_max, &[]);
    assert_eq!(queue.apply(Command::PagedIn { generation, messages }), Reply::Ok);
    queue.apply(Command::Dispatch);
    assert!(queue.delivered().is_empty(), "expired on disk, delivered after its TTL: {:?}", queue.delivered());
    assert_eq!(queue.dropped_for(DeadLetterReason::Expired), vec![4, 5, 6, 7]);
}

/// A record of an older build keeps no expiry: its TTL counts from the read, the only time left.
#[test]
fn a_paged_message_without_a_recorded_expiry_counts_its_ttl_from_the_read() {
    let mut queue = Queue::with_messages(6, Limits { message_ttl_ms: Some(1_000), ..Limits::NONE });
    queue.now_ms = 1_500;
    queue.apply(Command::Expire);
    let (_, generation) = queue.page_in_asked().expect("a read");
    let unrecorded = |position| PagedMessage {
        position,
        message: TestMessage(position),
        redelivered: false,
        expiry: PagedExpiry::FromRead { own_ttl_ms: Some(200) },
    };
    queue.apply(Command::PagedIn { generation, messages: vec![unrecorded(4), unrecorded(5)] });
    assert_eq!(queue.core.messages().head_expires_at_ms(), Some(1_700), "its own TTL, shorter than the queue's, from the read");
    queue.now_ms = 1_700;
    queue.apply(Command::Expire);
    assert_eq!(queue.dropped_for(DeadLetterReason::Expired), vec![4, 5]);
}
