//! The transitions: one function per command, each pushing the effects the caller performs.

use crate::{Command, ConsumerId, ConsumerRef, ConsumerSlot, DeadLetterReason, Effect, Limits, Overflow, Payload, QueueCore, Reply};

/// An enqueue's particulars besides the message.
#[derive(Debug, Clone, Copy)]
struct Enqueue {
    persistent: bool,
    own_ttl_ms: Option<u64>,
    now_ms: u64,
}

impl<M: Payload> QueueCore<M> {
    /// Applies `command` at time `now_ms` (milliseconds since the epoch). `can_take` answers, for
    /// a consumer the queue would pick, whether it can take one more message now (channel-wide
    /// prefetch, flow, a full writer: what the queue cannot see); it is asked only while
    /// dispatching. Effects are appended to `effects`, in the order they must be performed.
    pub fn apply<G: FnMut(ConsumerRef) -> bool>(
        &mut self,
        command: Command<M>,
        now_ms: u64,
        can_take: &mut G,
        effects: &mut Vec<Effect<M>>,
    ) -> Reply {
        match command {
            Command::Enqueue { message, persistent, own_ttl_ms } => {
                let enqueue = Enqueue { persistent, own_ttl_ms, now_ms };
                self.enqueue(message, enqueue, can_take, effects)
            }
            Command::PagedIn { generation, messages } => self.paged_in(generation, messages, now_ms, effects),
            Command::PageInFailed { generation } => self.page_in_failed(generation),
            Command::PagedInWithLoss { generation, messages, lost } => self.paged_in_with_loss(generation, messages, lost, now_ms, effects),
            Command::AddConsumer { consumer, priority, exclusive, prefetch, no_ack } => {
                // RabbitMQ refuses an exclusive consumer on a single-active-consumer queue even
                // when it has no consumer, with the same "in exclusive use".
                let exclusive_refused = exclusive && (self.single_active_consumer || !self.consumers.is_empty());
                if self.has_exclusive_consumer || exclusive_refused {
                    return Reply::ExclusiveInUse;
                }
                self.has_exclusive_consumer = exclusive;
                self.consumers.push(ConsumerSlot { id: consumer, priority, prefetch, no_ack, unacked: 0 });
                Reply::Ok
            }
            Command::CancelConsumer { consumer } => {
                if !self.remove_consumer(consumer) {
                    return Reply::ConsumerNotFound;
                }
                self.has_exclusive_consumer = false;
                self.next_consumer = 0;
                Reply::Ok
            }
            Command::ForgetConsumer { consumer } => match self.remove_consumer(consumer) {
                true => Reply::Ok,
                false => Reply::ConsumerNotFound,
            },
            Command::Dispatch => self.dispatch(now_ms, usize::MAX, can_take, effects),
            Command::DispatchOne => match self.dispatch(now_ms, 1, can_take, effects) {
                Reply::Ok if effects.iter().any(|effect| matches!(effect, Effect::Deliver { .. })) => Reply::Delivered,
                reply => reply,
            },
            Command::Get { no_ack } => self.get(no_ack, now_ms, effects),
            Command::Settle { position } => {
                if let Some((queued, holder)) = self.messages.settle_held(position) {
                    self.stats.acked += 1;
                    self.release(holder);
                    if queued.logged {
                        effects.push(Effect::LogSettle { position });
                    }
                }
                Reply::Ok
            }
            Command::Reject { position } => {
                if let Some((queued, holder)) = self.messages.settle_held(position) {
                    self.release(holder);
                    effects.push(Effect::Drop {
                        position,
                        message: queued.message,
                        reason: DeadLetterReason::Rejected,
                        logged: queued.logged,
                    });
                }
                Reply::Ok
            }
            Command::Requeue { position } => {
                // Past x-delivery-limit it leaves instead, as RabbitMQ's quorum queues drop it.
                if let Some((holder, past_limit)) = self.messages.requeue_held(position, self.limits.delivery_limit) {
                    self.stats.requeued += 1;
                    self.release(holder);
                    if let Some(queued) = past_limit {
                        let reason = DeadLetterReason::DeliveryLimit;
                        effects.push(Effect::Drop { position, message: queued.message, reason, logged: queued.logged });
                    } else if self.limits.overflow == Overflow::DropHead {
                        // Limits count ready messages only: a requeue past them drops from the
                        // head at once, as RabbitMQ 3.10.8 does (measured: x-max-length 2, two
                        // unacked requeued behind two ready ones, the requeued two are dropped).
                        return self.drop_head_while_over(0, effects);
                    }
                }
                Reply::Ok
            }
            Command::RequeueToTail { position } => {
                if let Some((new_position, holder)) = self.messages.requeue_to_tail(position) {
                    self.stats.requeued += 1;
                    self.release(holder);
                    if let Some(limit) = self.limits.delivery_limit {
                        self.drop_past_delivery_limit(new_position, limit, effects);
                    }
                }
                Reply::Ok
            }
            Command::Undeliver { position, queued, no_ack } => {
                let holder = self.messages.unpop(position, queued);
                self.release(holder);
                self.stats.delivered -= 1;
                if no_ack {
                    self.stats.acked -= 1;
                }
                Reply::Ok
            }
            Command::Purge => self.purge(effects),
            Command::Expire => {
                // Expiring the window empty brings the paged messages behind it in (those that
                // expired on disk go at once), as RabbitMQ's expiry reads its head from disk;
                // without a consumer nothing else would ask.
                if self.expire_head(now_ms, effects) {
                    effects.extend(self.page_in_request());
                }
                Reply::Ok
            }
            Command::SetLimits(limits) => {
                self.limits = limits;
                // A recovered queue (everything paged) with a TTL reads its head, so what expired
                // while it was down goes now and its count is right, as RabbitMQ's start drops
                // expired messages; a queue without one reads nothing until a consumer asks.
                if limits.message_ttl_ms.is_some() && self.messages.head_is_paged() {
                    effects.extend(self.page_in_request());
                }
                match limits.overflow {
                    Overflow::DropHead => self.drop_head_while_over(0, effects),
                    Overflow::RejectPublish => Reply::Ok,
                }
            }
        }
    }

    fn enqueue<G: FnMut(ConsumerRef) -> bool>(
        &mut self,
        message: M,
        enqueue: Enqueue,
        can_take: &mut G,
        effects: &mut Vec<Effect<M>>,
    ) -> Reply {
        let Enqueue { persistent, own_ttl_ms, now_ms } = enqueue;
        let size_bytes = message.size_bytes();
        let bounded = self.limits.max_length.is_some() || self.limits.max_length_bytes.is_some();
        let mut kept_only_if_delivered = false;
        let mut drop_after_enqueue = false;
        if bounded {
            match self.limits.overflow {
                Overflow::RejectPublish if self.would_overflow(size_bytes) => return Reply::Rejected,
                Overflow::RejectPublish => {}
                // Over the limit on its own (x-max-length 0, a body above x-max-length-bytes):
                // RabbitMQ enqueues it and drops from the head while over, so everything before
                // it goes, then it, unless a consumer takes it at once.
                Overflow::DropHead if self.over_limit_alone(size_bytes) => {
                    while self.drop_oldest(true, effects) {}
                    effects.extend(self.page_in_request());
                    kept_only_if_delivered = true;
                }
                // With priorities the head may be the new message itself: enqueue, then drop the
                // head while over, in RabbitMQ's order.
                Overflow::DropHead if self.messages.max_priority() > 0 => drop_after_enqueue = true,
                // Room for the new message: the same drops as RabbitMQ's enqueue-then-drop-head.
                Overflow::DropHead => drop(self.drop_head_while_over(size_bytes, effects)),
            }
        }
        let expires_at_ms = self.expiry(own_ttl_ms, now_ms);
        let expired_at_once = expires_at_ms.is_some_and(|expires_at_ms| expires_at_ms <= now_ms);
        if kept_only_if_delivered || expired_at_once {
            // As RabbitMQ does (`rabbit_amqqueue_process:deliver_or_enqueue`): a consumer that can
            // take it now gets it; otherwise it is dropped at once, with nothing written.
            let Some(index) = self.deliverable_at_once(can_take) else {
                let reason = if kept_only_if_delivered { DeadLetterReason::MaxLength } else { DeadLetterReason::Expired };
                return self.drop_at_once(message, persistent, reason, effects);
            };
            self.stats.published += 1;
            let logged = persistent && self.window.is_some();
            let position = self.messages.push_expiring(message, expires_at_ms, logged);
            if logged {
                effects.push(Effect::LogAppend { position, persistent, paged: false, expires_at_ms });
            }
            self.deliver(Some(index), effects);
            return Reply::Ok;
        }
        self.stats.published += 1;
        let priority = self.messages.priority_of(&message);
        if self.should_page(priority) {
            let position = self.messages.push_paged(size_bytes, priority);
            effects.push(Effect::LogAppend { position, persistent, paged: true, expires_at_ms });
        } else {
            let logged = persistent && self.window.is_some();
            let position = self.messages.push_expiring(message, expires_at_ms, logged);
            if logged {
                effects.push(Effect::LogAppend { position, persistent, paged: false, expires_at_ms });
            }
        }
        if drop_after_enqueue {
            self.drop_head_while_over(0, effects);
        }
        Reply::Ok
    }

    /// A message the queue does not keep: it takes a position (so a dead letter can name one)
    /// and leaves at once through a `Drop` effect. Dead-lettered, it is first logged as any message
    /// is (the publish waits for that, and its source record is settled once the dead letter is
    /// safe); otherwise nothing is written and the publish is answered `Dropped`.
    fn drop_at_once(&mut self, message: M, persistent: bool, reason: DeadLetterReason, effects: &mut Vec<Effect<M>>) -> Reply {
        let logged = self.limits.dead_letters && persistent && self.window.is_some();
        let position = self.messages.skip_position();
        if logged {
            self.stats.published += 1;
            effects.push(Effect::LogAppend { position, persistent, paged: false, expires_at_ms: None });
        }
        effects.push(Effect::Drop { position, message, reason, logged });
        if logged {
            Reply::Ok
        } else {
            Reply::Dropped
        }
    }

    /// Whether a message of `size_bytes` is over a limit even in an empty queue.
    fn over_limit_alone(&self, size_bytes: u64) -> bool {
        self.limits.max_length == Some(0) || self.limits.max_length_bytes.is_some_and(|max| size_bytes > max)
    }

    /// Whether one more message of `size_bytes` would take the queue past a limit.
    fn would_overflow(&self, size_bytes: u64) -> bool {
        let ready = self.messages.ready_count() as u64;
        self.limits.max_length.is_some_and(|max| ready + 1 > max)
            || self.limits.max_length_bytes.is_some_and(|max| self.messages.ready_bytes() + size_bytes > max)
    }

    /// Whether the queue is past a limit, counting `incoming_bytes` more bytes and, when that is
    /// not zero, one more message.
    fn over_limit(&self, incoming_bytes: u64) -> bool {
        if incoming_bytes > 0 {
            return self.would_overflow(incoming_bytes);
        }
        self.over_length_limit(0) || self.limits.max_length_bytes.is_some_and(|max| self.messages.ready_bytes() > max)
    }

    /// Whether the queue is past x-max-length, counting `incoming` more messages.
    fn over_length_limit(&self, incoming: u64) -> bool {
        self.limits.max_length.is_some_and(|max| self.messages.ready_count() as u64 + incoming > max)
    }

    /// When a message enqueued (or paged in) now expires: the sooner of its own TTL and the queue's.
    pub(crate) fn expiry(&self, own_ttl_ms: Option<u64>, now_ms: u64) -> Option<u64> {
        let ttl_ms = match (own_ttl_ms, self.limits.message_ttl_ms) {
            (Some(own), Some(queue)) => Some(own.min(queue)),
            (own, queue) => own.or(queue),
        }?;
        Some(now_ms.saturating_add(ttl_ms))
    }

    /// Whether a message of `priority` enqueued now stays in the log only: messages of its
    /// priority are paged already (order), or the window is full.
    fn should_page(&self, priority: u8) -> bool {
        self.window.is_some_and(|window| {
            self.messages.paged_count_at(priority) > 0
                || self.messages.ready_in_memory() >= window.messages_max
                || self.messages.ready_bytes_in_memory() >= window.bytes_max
        })
    }

    /// Drops the oldest ready messages while the queue is past a limit (with room for a message
    /// of `incoming_bytes` when that is not zero).
    fn drop_head_while_over(&mut self, incoming_bytes: u64, effects: &mut Vec<Effect<M>>) -> Reply {
        if self.limits.max_length.is_none() && self.limits.max_length_bytes.is_none() {
            // Nothing to be over, and nothing to read: a recovered queue given its (limitless)
            // policy at start must not page its window in with no consumer asking (100,000
            // recovered queues read their messages back at every start).
            return Reply::Ok;
        }
        let incoming = u64::from(incoming_bytes > 0);
        // Past only the byte limit, paged messages' sizes are unknown until read: the queue stays
        // over it until the page-in asked for below brings them.
        while self.over_limit(incoming_bytes) && self.drop_oldest(self.over_length_limit(incoming), effects) {}
        effects.extend(self.page_in_request());
        Reply::Ok
    }

    /// Drops the head, the oldest ready message (of the highest priority, as RabbitMQ's priority
    /// queues drop), reason maxlen; false when there is none to drop. When the head is paged (the
    /// newest are paged, so in a plain queue only paged ones are left) it is dropped only if
    /// `paged_too`: it stops counting now, and the page-in that reads it drops it.
    fn drop_oldest(&mut self, paged_too: bool, effects: &mut Vec<Effect<M>>) -> bool {
        if self.messages.ready_count() == 0 {
            return false;
        }
        if self.messages.head_is_paged() {
            return paged_too && self.messages.drop_paged_head();
        }
        let Some((position, dropped)) = self.messages.pop(false) else {
            return false;
        };
        effects.push(Effect::Drop { position, message: dropped.message, reason: DeadLetterReason::MaxLength, logged: dropped.logged });
        true
    }

    /// Drops a message requeued to the tail past x-delivery-limit (quorum queues' requeue).
    fn drop_past_delivery_limit(&mut self, position: u64, limit: u32, effects: &mut Vec<Effect<M>>) {
        if self.messages.ready_delivery_count(position).is_some_and(|count| count > limit) {
            if let Some(queued) = self.messages.take_ready(position) {
                effects.push(Effect::Drop {
                    position,
                    message: queued.message,
                    reason: DeadLetterReason::DeliveryLimit,
                    logged: queued.logged,
                });
            }
        }
    }

    /// Drops expired messages at the head.
    /// Drops the expired messages at the head; whether there were any.
    fn expire_head(&mut self, now_ms: u64, effects: &mut Vec<Effect<M>>) -> bool {
        let mut expired_any = false;
        while let Some((position, expired)) = self.messages.pop_expired_head(now_ms) {
            effects.push(Effect::Drop { position, message: expired.message, reason: DeadLetterReason::Expired, logged: expired.logged });
            expired_any = true;
        }
        expired_any
    }

    fn dispatch<G: FnMut(ConsumerRef) -> bool>(
        &mut self,
        now_ms: u64,
        deliveries_max: usize,
        can_take: &mut G,
        effects: &mut Vec<Effect<M>>,
    ) -> Reply {
        for _ in 0..deliveries_max {
            // The read runs while the messages in memory go on being delivered.
            effects.extend(self.page_in_request());
            self.expire_head(now_ms, effects);
            // A head on disk (a higher priority all paged) waits for its read.
            if self.messages.ready_in_memory() == 0 || self.messages.head_is_paged() {
                return Reply::Ok;
            }
            let Some(index) = self.pick_consumer(can_take) else {
                return Reply::Ok;
            };
            self.deliver(Some(index), effects);
        }
        Reply::Ok
    }

    /// The consumer a message enqueued now would go to at once: nothing is ready before it, and a
    /// consumer can take it.
    fn deliverable_at_once<G: FnMut(ConsumerRef) -> bool>(&mut self, can_take: &mut G) -> Option<usize> {
        if self.messages.ready_count() > 0 || self.messages.paged_dropped_count() > 0 {
            return None;
        }
        self.pick_consumer(can_take)
    }

    /// The highest-priority consumer that can take a message, round robin among equals.
    fn pick_consumer<G: FnMut(ConsumerRef) -> bool>(&mut self, can_take: &mut G) -> Option<usize> {
        // With a single active consumer, the others wait: only the first may take a message.
        let count = if self.single_active_consumer { self.consumers.len().min(1) } else { self.consumers.len() };
        let mut best: Option<(usize, i64)> = None;
        for offset in 0..count {
            let index = (self.next_consumer + offset) % count;
            let slot = &self.consumers[index];
            let prefetch_full = !slot.no_ack && slot.prefetch != 0 && slot.unacked >= slot.prefetch;
            if prefetch_full || !can_take(ConsumerRef { index, id: slot.id }) {
                continue;
            }
            if best.is_none_or(|(_, priority)| slot.priority > priority) {
                best = Some((index, slot.priority));
            }
        }
        let (index, _) = best?;
        self.next_consumer = (index + 1) % count;
        Some(index)
    }

    /// Hands the first ready message to the consumer at `index` (none: basic.get, acked unless `no_ack`).
    fn deliver(&mut self, index: Option<usize>, effects: &mut Vec<Effect<M>>) -> Option<u64> {
        self.deliver_as(index, None, effects)
    }

    fn deliver_as(&mut self, index: Option<usize>, get_no_ack: Option<bool>, effects: &mut Vec<Effect<M>>) -> Option<u64> {
        let (consumer, no_ack) = match index {
            Some(index) => {
                let slot = &self.consumers[index];
                (Some(ConsumerRef { index, id: slot.id }), slot.no_ack)
            }
            None => (None, get_no_ack.unwrap_or(false)),
        };
        let (position, queued) = self.messages.pop_for(!no_ack, consumer.map(|consumer| consumer.id))?;
        self.stats.delivered += 1;
        if no_ack {
            self.stats.acked += 1;
        } else if let Some(index) = index {
            self.consumers[index].unacked += 1;
        }
        let log = match (queued.logged, no_ack, queued.redelivered) {
            (false, _, _) => None,
            (true, true, _) => Some(Effect::LogSettle { position }),
            (true, false, false) => Some(Effect::LogDelivered { position }),
            (true, false, true) => None,
        };
        effects.push(Effect::Deliver { consumer, position, queued, no_ack });
        effects.extend(log);
        Some(position)
    }

    fn get(&mut self, no_ack: bool, now_ms: u64, effects: &mut Vec<Effect<M>>) -> Reply {
        effects.extend(self.page_in_request());
        self.expire_head(now_ms, effects);
        if self.messages.head_is_paged() {
            // RabbitMQ answers with the head, not get-empty: the get waits for the read.
            return Reply::PageInFirst;
        }
        match self.deliver_as(None, Some(no_ack), effects) {
            Some(_) => Reply::Got { message_count: self.messages.ready_count() as u64 },
            None => Reply::Empty,
        }
    }

    fn purge(&mut self, effects: &mut Vec<Effect<M>>) -> Reply {
        let purged = self.messages.purge();
        let mut count = purged.len() as u64;
        for (position, queued) in purged {
            if queued.logged {
                effects.push(Effect::LogSettle { position });
            }
        }
        let dropped = self.messages.paged_dropped_count();
        for (priority, count) in self.messages.paged_by_priority() {
            effects.push(Effect::SettlePaged { count, priority });
        }
        let paged = self.messages.take_paged();
        count += paged - dropped;
        // A read still out would bring back purged messages.
        self.page_in.in_flight = false;
        Reply::Purged { count }
    }

    fn remove_consumer(&mut self, consumer: ConsumerId) -> bool {
        match self.consumers.iter().position(|slot| slot.id == consumer) {
            Some(index) => {
                self.consumers.remove(index);
                true
            }
            None => false,
        }
    }

    /// Frees a prefetch slot of the consumer that held a settled or requeued message.
    fn release(&mut self, holder: Option<ConsumerId>) {
        if let Some(slot) = holder.and_then(|id| self.consumers.iter_mut().find(|slot| slot.id == id)) {
            slot.unacked = slot.unacked.saturating_sub(1);
        }
    }
}

/// Limits without any length limit or TTL.
impl Limits {
    /// No limits.
    pub const NONE: Limits = Limits {
        max_length: None,
        max_length_bytes: None,
        overflow: Overflow::DropHead,
        message_ttl_ms: None,
        delivery_limit: None,
        dead_letters: false,
        dead_letter_at_least_once: false,
    };
}
