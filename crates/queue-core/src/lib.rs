//! The rules of one queue as a state machine, in the shape of RabbitMQ's `rabbit_fifo`: a
//! command and the current time go in, the state changes, and the effects the caller must
//! perform (log records, deliveries, page-in reads) come out. No I/O, no clock, no threads, so
//! unit tests, property tests and a future simulator drive the same code as the broker.
//!
//! Effects go into a buffer the caller owns and reuses, so a publish or a delivery allocates
//! nothing here beyond the queue's own containers.

pub mod core_image;
pub mod state;

pub use core_image::{ConsumerImage, CoreImage};
pub use state::{ConsumerId, MessageTally, MessagesImage, Payload, QueueState, QueuedMessage};

/// What a full queue does with one more message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Drop the oldest ready message to make room (RabbitMQ's default).
    #[default]
    DropHead,
    /// Refuse the new message. RabbitMQ's `reject-publish-dlx` is this too: the core refuses, and
    /// the caller dead-letters the refused message.
    RejectPublish,
}

/// A queue's effective limits (arguments merged with its policy by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// x-max-length: the most ready messages.
    pub max_length: Option<u64>,
    /// x-max-length-bytes: the most body bytes of ready messages.
    pub max_length_bytes: Option<u64>,
    /// What happens past either limit.
    pub overflow: Overflow,
    /// x-message-ttl, applied to messages enqueued from now on.
    pub message_ttl_ms: Option<u64>,
    /// x-delivery-limit: a message requeued more often than this leaves (reason delivery_limit).
    pub delivery_limit: Option<u32>,
    /// Whether the caller dead-letters what leaves (the queue has a dead-letter exchange). A
    /// message the queue does not keep (x-max-length 0, TTL 0, no consumer ready) is then enqueued
    /// and logged like any other before it leaves, so its dead-lettering is at least once;
    /// without, it is dropped at once with nothing written.
    pub dead_letters: bool,
    /// Whether what leaves is dead-lettered at least once (a quorum queue's
    /// `x-dead-letter-strategy: at-least-once` with reject-publish): the replicated machine keeps
    /// each dropped message until its dead letter is settled. The core itself ignores it.
    pub dead_letter_at_least_once: bool,
}

/// How many ready messages a queue with a log keeps in memory; past that, new ones are paged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Ready messages in memory before paging starts.
    pub messages_max: usize,
    /// Body bytes of ready messages in memory before paging starts.
    pub bytes_max: u64,
    /// Paging in starts below this many messages in memory ...
    pub low_watermark_messages: usize,
    /// ... and this many bytes.
    pub low_watermark_bytes: u64,
    /// The most bytes one page-in reads.
    pub page_in_batch_bytes_max: u64,
}

/// Why a message left the queue without being consumed: the reason its dead-lettering records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// Dropped at the head by x-max-length or x-max-length-bytes with drop-head (or refused by
    /// reject-publish-dlx, which the caller dead-letters).
    MaxLength,
    /// Its TTL passed.
    Expired,
    /// basic.reject or basic.nack without requeue.
    Rejected,
    /// Requeued more often than x-delivery-limit allows.
    DeliveryLimit,
}

impl DeadLetterReason {
    /// The name RabbitMQ writes in the `reason` of an `x-death` entry.
    pub fn name(self) -> &'static str {
        match self {
            DeadLetterReason::MaxLength => "maxlen",
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::Rejected => "rejected",
            DeadLetterReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// Message totals of a queue (RabbitMQ's message_stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages enqueued.
    pub published: u64,
    /// Deliveries to consumers and basic.get.
    pub delivered: u64,
    /// Deliveries settled by ack (or no-ack).
    pub acked: u64,
    /// Deliveries put back (reject, nack, recover, consumer gone).
    pub requeued: u64,
}

/// A consumer as the caller names it to the gate: its index in the consumer list (stable until
/// the next add or cancel) and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerRef {
    /// Index in the queue's consumer list, in the order consumers were added.
    pub index: usize,
    /// The caller's id.
    pub id: ConsumerId,
}

/// Something that changes the queue.
#[derive(Debug, Clone)]
pub enum Command<M> {
    /// A published message: `own_ttl_ms` is its expiration property, if any.
    Enqueue { message: M, persistent: bool, own_ttl_ms: Option<u64> },
    /// The page-in `generation` asked for ([`Effect::NeedPageIn`]) read these paged messages back
    /// from the log, oldest first. Discarded ([`Reply::Stale`]) when the queue no longer waits
    /// for that read (a purge overtook it).
    PagedIn { generation: u64, messages: Vec<PagedMessage<M>> },
    /// The page-in `generation` asked for failed: forget the paged messages (they stay on disk
    /// until a restart). Discarded ([`Reply::Stale`]) like a stale [`Command::PagedIn`].
    PageInFailed { generation: u64 },
    /// [`Command::PagedIn`] for a read that stepped over damaged records (quarantined: see
    /// `storage::quarantine`): `lost` paged messages of the read's priority are gone with them
    /// and leave the queue's counts (at most as many as it has paged).
    PagedInWithLoss { generation: u64, messages: Vec<PagedMessage<M>>, lost: u64 },
    /// basic.consume.
    AddConsumer { consumer: ConsumerId, priority: i64, exclusive: bool, prefetch: u32, no_ack: bool },
    /// basic.cancel or the channel closing: removes the consumer. Its unacked messages stay
    /// unacked: the channel settles or requeues them.
    CancelConsumer { consumer: ConsumerId },
    /// Removes a consumer found cancelled, keeping the exclusive flag and the round-robin place
    /// (the channel's cleanup cancels it properly later).
    ForgetConsumer { consumer: ConsumerId },
    /// Deliver what consumers can take now. The gate must see the deliveries this command
    /// makes (a channel-wide prefetch); a caller whose gate only learns of a delivery once its
    /// effect is performed uses [`Command::DispatchOne`] in a loop instead.
    Dispatch,
    /// Deliver at most one message: [`Reply::Delivered`] when it did.
    DispatchOne,
    /// basic.get.
    Get { no_ack: bool },
    /// Ack of an unacked message.
    Settle { position: u64 },
    /// Reject or nack without requeue: the message leaves as [`Effect::Drop`] (reason rejected).
    Reject { position: u64 },
    /// Reject, nack or recover with requeue: back to its place, marked redelivered.
    Requeue { position: u64 },
    /// Requeue to the back of the queue, marked redelivered, under a new position (RabbitMQ 3.10's
    /// quorum queues do this with a nack, reject or recover that requeues).
    RequeueToTail { position: u64 },
    /// A delivery the caller could not hand over (its channel had closed): back, unchanged.
    Undeliver { position: u64, queued: QueuedMessage<M>, no_ack: bool },
    /// queue.purge: drop every ready message.
    Purge,
    /// Time moved: drop expired messages at the head.
    Expire,
    /// New limits (a policy changed); a lower drop-head length limit drops at once.
    SetLimits(Limits),
}

/// What the caller must do after a command.
#[derive(Debug, Clone)]
pub enum Effect<M> {
    /// Send this message to a consumer (none: the basic.get that asked). `queued` is handed over so a failed send can be undone
    /// with [`Command::Undeliver`].
    Deliver { consumer: Option<ConsumerRef>, position: u64, queued: QueuedMessage<M>, no_ack: bool },
    /// Append the message just enqueued to the log; `paged` means it exists only there.
    /// `expires_at_ms` is its expiry, fixed now, for the record to keep: a page-in or a restart
    /// reads it back with it ([`PagedExpiry::Fixed`]).
    LogAppend { position: u64, persistent: bool, paged: bool, expires_at_ms: Option<u64> },
    /// Record in the log that the message left the queue.
    LogSettle { position: u64 },
    /// Record in the log that the message was handed out (a restart marks it redelivered).
    LogDelivered { position: u64 },
    /// A message left the queue unconsumed: the caller dead-letters it or only drops it, and when
    /// `logged` settles it in the log (a dead-lettered one once its new queues hold it safely).
    Drop { position: u64, message: M, reason: DeadLetterReason, logged: bool },
    /// Read up to this many paged messages (and bytes) of `priority` (0 in a plain queue) from
    /// the log and apply them with [`Command::PagedIn`] (or [`Command::PageInFailed`]) naming
    /// `generation`. The queue counts the read as in flight until then: it keeps serving what is
    /// in memory and asks for no other read, so the read may take its time off the caller's thread.
    NeedPageIn { messages_max: usize, bytes_max: u64, generation: u64, priority: u8 },
    /// Settle this many paged messages of `priority` in the log, reading them in order from that
    /// priority's tail.
    SettlePaged { count: u64, priority: u8 },
}

/// The answer to a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Done.
    Ok,
    /// [`Command::DispatchOne`] delivered a message.
    Delivered,
    /// basic.get found only paged messages: nothing changed; a page-in is under way (asked now
    /// with [`Effect::NeedPageIn`], or earlier). Ask again once it has been applied.
    PageInFirst,
    /// A [`Command::PagedIn`] or [`Command::PageInFailed`] for a read the queue no longer waits
    /// for: ignored (the caller drops the messages and keeps its read position).
    Stale,
    /// The message was taken and dropped at once, with nothing kept or written (x-max-length 0
    /// with drop-head): it counts as routed and its confirm needs nothing.
    Dropped,
    /// basic.consume refused: the queue is in exclusive use.
    ExclusiveInUse,
    /// The consumer was not on this queue.
    ConsumerNotFound,
    /// The queue is full and refuses the message (reject-publish).
    Rejected,
    /// basic.get found a message: it is the [`Effect::Deliver`] just emitted; `message_count` is
    /// what is left ready.
    Got { message_count: u64 },
    /// basic.get found nothing.
    Empty,
    /// queue.purge dropped this many messages.
    Purged { count: u64 },
}

/// A paged message read back from the log.
#[derive(Debug, Clone)]
pub struct PagedMessage<M> {
    /// Its position in the queue.
    pub position: u64,
    /// The message.
    pub message: M,
    /// Whether it was handed out before (a delivered marker, or a crash).
    pub redelivered: bool,
    /// When it expires.
    pub expiry: PagedExpiry,
}

/// When a paged message expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagedExpiry {
    /// As fixed when it was enqueued (milliseconds since the epoch; none: it never expires), as
    /// RabbitMQ fixes it: the time it spent on disk counts.
    Fixed(Option<u64>),
    /// Not known (its record was written by a build that kept no expiry): counted from the read,
    /// from its expiration property (`own_ttl_ms`) and the queue's TTL.
    FromRead { own_ttl_ms: Option<u64> },
}

/// The page-in the queue waits for, if any.
#[derive(Debug, Clone, Copy, Default)]
struct PageIn {
    /// The number of the last read asked for; a result naming another is stale.
    generation: u64,
    /// Whether that read is still out.
    in_flight: bool,
    /// The priority it reads (0 in a plain queue).
    priority: u8,
}

/// A consumer as the queue sees it.
#[derive(Debug, Clone)]
struct ConsumerSlot {
    id: ConsumerId,
    priority: i64,
    prefetch: u32,
    no_ack: bool,
    unacked: u32,
}

/// One queue's rules and state.
#[derive(Debug)]
pub struct QueueCore<M> {
    messages: QueueState<M>,
    consumers: Vec<ConsumerSlot>,
    /// Where the round robin resumes among consumers of equal priority.
    next_consumer: usize,
    has_exclusive_consumer: bool,
    /// x-single-active-consumer: only the first consumer in subscription order gets messages;
    /// when it goes, the next one takes over.
    single_active_consumer: bool,
    limits: Limits,
    /// Set for queues with a log: they page past the window.
    window: Option<Window>,
    page_in: PageIn,
    stats: QueueStats,
}

mod apply;
mod paging;

impl<M: Payload> QueueCore<M> {
    /// A queue over `messages`; `window` is set for queues with a log (they page).
    pub fn new(messages: QueueState<M>, limits: Limits, window: Option<Window>) -> QueueCore<M> {
        QueueCore {
            messages,
            consumers: Vec::new(),
            next_consumer: 0,
            has_exclusive_consumer: false,
            single_active_consumer: false,
            limits,
            window,
            page_in: PageIn::default(),
            stats: QueueStats::default(),
        }
    }

    /// x-max-priority (0: a plain queue), fixed by the state the queue was made over
    /// ([`QueueState::with_max_priority`], [`QueueState::with_paged_priorities`]).
    pub fn max_priority(&self) -> u8 {
        self.messages.max_priority()
    }

    /// The same queue with x-single-active-consumer on or off (an argument fixed at declaration).
    pub fn with_single_active_consumer(mut self, single_active_consumer: bool) -> QueueCore<M> {
        self.single_active_consumer = single_active_consumer;
        self
    }

    /// With x-single-active-consumer, the consumer that gets the messages: the earliest
    /// subscribed one still there (RabbitMQ 3.10's classic queues ignore consumer priorities
    /// here). `None` without the argument, or without consumers.
    pub fn single_active_consumer(&self) -> Option<ConsumerId> {
        match self.single_active_consumer {
            true => self.consumers.first().map(|slot| slot.id),
            false => None,
        }
    }

    /// Whether the queue has x-single-active-consumer.
    pub fn is_single_active_consumer(&self) -> bool {
        self.single_active_consumer
    }

    /// The messages.
    pub fn messages(&self) -> &QueueState<M> {
        &self.messages
    }

    /// Totals.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether a consumer holds the queue exclusively.
    pub fn has_exclusive_consumer(&self) -> bool {
        self.has_exclusive_consumer
    }

    /// Consumers, in the order they were added.
    pub fn consumer_ids(&self) -> impl Iterator<Item = ConsumerId> + '_ {
        self.consumers.iter().map(|slot| slot.id)
    }

    /// Whether a page-in was asked for and its result not applied yet.
    pub fn page_in_in_flight(&self) -> bool {
        self.page_in.in_flight
    }

    /// Whether a page-in result naming `generation` would be applied now.
    pub fn awaits_page_in(&self, generation: u64) -> bool {
        self.page_in.in_flight && self.page_in.generation == generation
    }

    /// Unacked deliveries the core counts against a consumer's prefetch.
    pub fn consumer_unacked(&self, consumer: ConsumerId) -> Option<u32> {
        self.consumers.iter().find(|slot| slot.id == consumer).map(|slot| slot.unacked)
    }
}

#[cfg(test)]
mod paging_tests;
#[cfg(test)]
mod priority_tests;
#[cfg(test)]
mod tests;
