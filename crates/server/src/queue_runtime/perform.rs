//! The performer: applies a command to the queue's core under the queue's lock and carries out
//! the effects it returns (log records, deliveries, page-in reads), in order.

use super::{QueueInner, QueueRuntime};
use crate::dead_letter::DeadLetter;
use crate::shared::{ChannelShared, ConsumerHandle, Outbound, Readiness};
use broker_core::queue::QueuedMessage;
use broker_core::Message;
use queue_core::{Command, ConsumerRef, DeadLetterReason, Effect, Reply};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a command needs besides the queue: the queue's `Arc` for deliveries (ledger entries point
/// back at it), the message being published, the channel of a basic.get.
#[derive(Default, Clone, Copy)]
pub(super) struct Context<'a> {
    queue: Option<&'a Arc<QueueRuntime>>,
    message: Option<&'a Arc<Message>>,
    get_channel: Option<&'a ChannelShared>,
}

impl<'a> Context<'a> {
    /// For commands that deliver to consumers.
    pub(super) fn dispatching(queue: &'a Arc<QueueRuntime>) -> Context<'a> {
        Context { queue: Some(queue), ..Context::default() }
    }

    /// For an enqueue of `message`.
    pub(super) fn publishing(queue: &'a Arc<QueueRuntime>, message: &'a Arc<Message>) -> Context<'a> {
        Context { queue: Some(queue), message: Some(message), get_channel: None }
    }

    /// For a basic.get on `channel`.
    pub(super) fn getting(queue: &'a Arc<QueueRuntime>, channel: &'a ChannelShared) -> Context<'a> {
        Context { queue: Some(queue), message: None, get_channel: Some(channel) }
    }
}

/// What running a command gave.
#[derive(Debug)]
pub(super) struct Outcome {
    /// The core's reply.
    pub(super) reply: Reply,
    /// Whether the published message was written to the log as persistent.
    pub(super) logged: bool,
    /// basic.get: delivery tag, redelivered flag and message.
    pub(super) got: Option<(u64, bool, Arc<Message>)>,
}

impl QueueRuntime {
    /// Applies `command` and performs its effects. When a delivery found its channel closed, the
    /// command runs again; each round forgets a consumer, so the rounds are bounded. A page-in
    /// the core asks for starts here and ends later, off this thread.
    pub(super) fn run(&self, inner: &mut QueueInner, command: impl Fn() -> Command<Arc<Message>>, context: Context<'_>) -> Outcome {
        self.run_at(inner, command, context, super::now_ms())
    }

    /// [`QueueRuntime::run`] at a time the caller read: a batch of commands (the deliveries of one
    /// dispatch, the settles of one ack) reads the clock once. A time a little in the past never
    /// expires a message early; the next command sees the later time.
    pub(super) fn run_at(
        &self,
        inner: &mut QueueInner,
        command: impl Fn() -> Command<Arc<Message>>,
        context: Context<'_>,
        now_ms: u64,
    ) -> Outcome {
        let mut outcome = Outcome { reply: Reply::Ok, logged: false, got: None };
        let mut effects = std::mem::take(&mut inner.effects);
        loop {
            effects.clear();
            let QueueInner { core, consumers, .. } = inner;
            let mut can_take = |consumer: ConsumerRef| match context.queue {
                Some(queue) => can_take(queue, &consumers[consumer.index].1),
                None => false,
            };
            outcome.reply = core.apply(command(), now_ms, &mut can_take, &mut effects);
            let again = self.perform(inner, &mut effects, &context, &mut outcome);
            if !again {
                break;
            }
        }
        inner.effects = effects;
        self.note_changed();
        if !inner.dead_letters.is_empty() {
            self.hand_over_dead_letters(inner);
        }
        self.tell_expiry_deadline(inner, now_ms);
        outcome
    }

    /// Applies a command that is not repeated (it moves messages in, such as a page-in's result)
    /// and performs its effects.
    pub(super) fn run_once(&self, inner: &mut QueueInner, command: Command<Arc<Message>>, context: Context<'_>) -> Reply {
        let mut outcome = Outcome { reply: Reply::Ok, logged: false, got: None };
        let mut effects = std::mem::take(&mut inner.effects);
        effects.clear();
        let QueueInner { core, consumers, .. } = inner;
        let mut can_take = |consumer: ConsumerRef| match context.queue {
            Some(queue) => can_take(queue, &consumers[consumer.index].1),
            None => false,
        };
        let now_ms = super::now_ms();
        outcome.reply = core.apply(command, now_ms, &mut can_take, &mut effects);
        self.perform(inner, &mut effects, &context, &mut outcome);
        inner.effects = effects;
        // A page-in's result drops (and may dead-letter) messages dropped at the head before it.
        if !inner.dead_letters.is_empty() {
            self.hand_over_dead_letters(inner);
        }
        // A page-in's result gives the head its expiry.
        self.tell_expiry_deadline(inner, now_ms);
        outcome.reply
    }

    /// Performs `effects` in order; true when a delivery was undone and the command must run again.
    fn perform(
        &self,
        inner: &mut QueueInner,
        effects: &mut Vec<Effect<Arc<Message>>>,
        context: &Context<'_>,
        outcome: &mut Outcome,
    ) -> bool {
        let mut undelivered = None;
        let counts_deliveries = inner.limits.delivery_limit.is_some();
        for mut effect in effects.drain(..) {
            if counts_deliveries {
                // A queue with a delivery limit tells each delivery its count, as quorum queues do.
                if let Effect::Deliver { queued, .. } = &mut effect {
                    queued.message = crate::dead_letter::message::with_delivery_count(&queued.message, queued.delivery_count);
                }
            }
            match effect {
                Effect::Deliver { consumer: Some(consumer), position, queued, no_ack } => {
                    let queue = context.queue.expect("only commands with the queue's Arc deliver");
                    let (id, handle) = &inner.consumers[consumer.index];
                    assert_eq!(*id, consumer.id, "the runtime's consumers follow the core's order");
                    if let Err(queued) = deliver_to(queue, handle, position, queued) {
                        // The channel closed under us: its cleanup removes the consumer; try the others.
                        handle.cancelled.store(true, Ordering::Release);
                        let undeliver = Command::Undeliver { position, queued, no_ack };
                        inner.core.apply(undeliver, 0, &mut |_| false, &mut Vec::new());
                        undelivered = Some(position);
                    }
                }
                Effect::Deliver { consumer: None, position, queued, no_ack } => {
                    let queue = context.queue.expect("basic.get runs with the queue's Arc");
                    let channel = context.get_channel.expect("basic.get runs with its channel");
                    let mut ledger = channel.ledger.lock();
                    ledger.last_tag += 1;
                    let delivery_tag = ledger.last_tag;
                    ledger.counters.count_delivery(true, no_ack, queued.redelivered);
                    if !no_ack {
                        ledger.track(delivery_tag, queue.clone().into(), position, None);
                    }
                    outcome.got = Some((delivery_tag, queued.redelivered, queued.message));
                }
                Effect::LogAppend { position, persistent, paged, expires_at_ms } => {
                    let message = context.message.expect("only an enqueue appends");
                    let log = self.log().expect("only queues with a log append");
                    let location = log.lock().append_publish(position, message, persistent, expires_at_ms);
                    if paged {
                        let messages = inner.core.messages();
                        let (priority, max_priority) = (messages.priority_of(message), messages.max_priority());
                        super::Pager::note_paged(&mut inner.pager, location, position, priority, max_priority);
                    }
                    outcome.logged = persistent;
                }
                Effect::LogSettle { position } if undelivered != Some(position) => {
                    if let Some(log) = self.log() {
                        log.lock().append_settled(position);
                    }
                }
                // Not synced on its own: losing it in a crash only means a duplicate.
                Effect::LogDelivered { position } if undelivered != Some(position) => {
                    if let Some(log) = self.log() {
                        log.lock().append_delivered(position);
                    }
                }
                Effect::NeedPageIn { messages_max, bytes_max, generation, priority } => {
                    self.start_page_in(inner, messages_max, bytes_max, generation, priority)
                }
                Effect::SettlePaged { count, priority } => self.settle_paged(inner, count, priority),
                Effect::Drop { position, message, reason, logged } => self.drop_message(inner, position, message, reason, logged),
                Effect::LogSettle { .. } | Effect::LogDelivered { .. } => {}
            }
        }
        undelivered.is_some()
    }
}

impl QueueRuntime {
    /// A message that left unconsumed: dead-lettered when the queue has a dead-letter exchange
    /// (settled in the log by the dead-letter worker once its new queues hold it), else dropped.
    fn drop_message(&self, inner: &mut QueueInner, position: u64, message: Arc<Message>, reason: DeadLetterReason, logged: bool) {
        match &inner.limits.dead_letter {
            Some(target) => inner.dead_letters.push(DeadLetter { position, logged, held: false, message, reason, target: target.clone() }),
            None if logged => {
                if let Some(log) = self.log() {
                    log.lock().append_settled(position);
                }
            }
            None => {}
        }
    }
}

/// Whether `consumer` can take one more message now; a full writer asks to be woken.
fn can_take(queue: &Arc<QueueRuntime>, consumer: &ConsumerHandle) -> bool {
    match consumer.readiness() {
        Readiness::Ready => true,
        Readiness::WriterFull => {
            consumer.channel.connection.note_stalled(queue);
            // The writer may have drained between the check and the note, and found no queue to
            // wake then: look once more, or a consumer without acks could wait forever.
            consumer.readiness() == Readiness::Ready
        }
        Readiness::Blocked => false,
    }
}

/// Hands a message to `consumer`; gives it back when the consumer's channel has closed.
fn deliver_to(
    queue: &Arc<QueueRuntime>,
    consumer: &Arc<ConsumerHandle>,
    position: u64,
    queued: QueuedMessage,
) -> Result<(), QueuedMessage> {
    let channel = &consumer.channel;
    let mut ledger = channel.ledger.lock();
    if !ledger.open {
        return Err(queued);
    }
    ledger.last_tag += 1;
    let delivery_tag = ledger.last_tag;
    ledger.counters.count_delivery(false, consumer.no_ack, queued.redelivered);
    if !consumer.no_ack {
        ledger.track(delivery_tag, queue.clone().into(), position, Some(consumer.clone()));
        consumer.count_delivery();
    }
    channel.connection.outbound_deliveries.fetch_add(1, Ordering::AcqRel);
    channel.connection.send(Outbound::Deliver {
        channel: channel.id,
        consumer_tag: consumer.tag.clone(),
        delivery_tag,
        redelivered: queued.redelivered,
        message: queued.message,
    });
    Ok(())
}
