//! The transitions: one function per command, each pushing the effects the caller performs.

use crate::{Command, ConsumerId, ConsumerRef, ConsumerSlot, DeadLetterReason, Effect, Limits, Overflow, Payload, QueueCore, Reply};

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
            Command::Enqueue { message, persistent, own_ttl_ms } => self.enqueue(message, persistent, own_ttl_ms, now_ms, effects),
            Command::PagedIn { position, message, redelivered, own_ttl_ms } => {
                let expires_at_ms = self.expiry(own_ttl_ms, now_ms);
                let priority = self.priority_of(&message);
                self.messages.page_in(position, message, redelivered, expires_at_ms, priority);
                Reply::Ok
            }
            Command::ForgetPaged => {
                self.messages.take_paged();
                Reply::Ok
            }
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
            Command::Requeue { position } => {
                if let Some(holder) = self.messages.requeue_held(position) {
                    self.stats.requeued += 1;
                    self.release(holder);
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
                self.expire_head(now_ms, effects);
                Reply::Ok
            }
            Command::SetLimits(limits) => {
                self.limits = limits;
                match limits.length_limit {
                    Some((limit, Overflow::DropHead)) => self.drop_head_to(limit, effects),
                    _ => Reply::Ok,
                }
            }
        }
    }

    fn enqueue(&mut self, message: M, persistent: bool, own_ttl_ms: Option<u64>, now_ms: u64, effects: &mut Vec<Effect<M>>) -> Reply {
        if let Some((limit, overflow)) = self.limits.length_limit {
            if self.messages.ready_count() as u64 >= limit {
                match overflow {
                    Overflow::RejectPublish => return Reply::Rejected,
                    Overflow::DropHead => {
                        // Room for the new message.
                        if self.drop_head_to(limit.max(1) - 1, effects) == Reply::PageInFirst {
                            return Reply::PageInFirst;
                        }
                        if limit == 0 {
                            return Reply::Ok;
                        }
                    }
                }
            }
        }
        if self.max_priority.is_some() && self.messages.paged_count() > 0 {
            // A recovered priority queue reads its tail back before it takes new messages.
            if let Some(request) = self.page_in_request() {
                effects.push(request);
                return Reply::PageInFirst;
            }
        }
        self.stats.published += 1;
        if self.should_page() {
            let position = self.messages.push_paged();
            effects.push(Effect::LogAppend { position, persistent, paged: true });
            return Reply::Ok;
        }
        let expires_at_ms = self.expiry(own_ttl_ms, now_ms);
        let logged = persistent && self.window.is_some();
        let priority = self.priority_of(&message);
        let position = self.messages.push_expiring(message, expires_at_ms, logged, priority);
        if logged {
            effects.push(Effect::LogAppend { position, persistent, paged: false });
        }
        Reply::Ok
    }

    /// When a message enqueued (or paged in) now expires: the sooner of its own TTL and the queue's.
    fn expiry(&self, own_ttl_ms: Option<u64>, now_ms: u64) -> Option<u64> {
        let ttl_ms = match (own_ttl_ms, self.limits.message_ttl_ms) {
            (Some(own), Some(queue)) => Some(own.min(queue)),
            (own, queue) => own.or(queue),
        }?;
        Some(now_ms.saturating_add(ttl_ms))
    }

    /// Whether a message enqueued now stays in the log only: the queue already pages (order), or
    /// its window is full.
    fn should_page(&self) -> bool {
        if self.max_priority.is_some() {
            return false;
        }
        self.window.is_some_and(|window| {
            self.messages.paged_count() > 0
                || self.messages.ready_in_memory() >= window.messages_max
                || self.messages.ready_bytes_in_memory() >= window.bytes_max
        })
    }

    /// A page-in read, when the window has fallen below both low watermarks and messages are paged.
    fn page_in_request(&self) -> Option<Effect<M>> {
        let window = self.window?;
        let bytes_in_memory = self.messages.ready_bytes_in_memory();
        let in_memory = self.messages.ready_in_memory();
        if self.messages.paged_count() == 0 {
            return None;
        }
        if self.max_priority.is_some() {
            // Priority order needs every ready message in memory: read the whole tail, batch by batch.
            let messages_max = self.messages.paged_count().min(usize::MAX as u64) as usize;
            return Some(Effect::NeedPageIn { messages_max, bytes_max: window.page_in_batch_bytes_max });
        }
        if in_memory >= window.low_watermark_messages || bytes_in_memory >= window.low_watermark_bytes {
            return None;
        }
        let room = window.messages_max.saturating_sub(in_memory);
        let messages_max = room.min(self.messages.paged_count() as usize);
        let bytes_max = window.page_in_batch_bytes_max.min(window.bytes_max.saturating_sub(bytes_in_memory));
        Some(Effect::NeedPageIn { messages_max, bytes_max })
    }

    /// Drops the oldest ready messages until at most `count` are ready.
    fn drop_head_to(&mut self, count: u64, effects: &mut Vec<Effect<M>>) -> Reply {
        while self.messages.ready_count() as u64 > count {
            if self.messages.ready_in_memory() == 0 {
                // Only paged ones are left: they must be read to be dropped in order.
                if let Some(request) = self.page_in_request() {
                    effects.push(request);
                    return Reply::PageInFirst;
                }
            }
            let Some((position, dropped)) = self.messages.pop(false) else {
                break;
            };
            if dropped.logged {
                effects.push(Effect::LogSettle { position });
            }
            effects.push(Effect::Drop { position, message: dropped.message, reason: DeadLetterReason::MaxLength });
        }
        Reply::Ok
    }

    /// Drops expired messages at the head.
    fn expire_head(&mut self, now_ms: u64, effects: &mut Vec<Effect<M>>) {
        while let Some((position, expired)) = self.messages.pop_expired_head(now_ms) {
            if expired.logged {
                effects.push(Effect::LogSettle { position });
            }
            effects.push(Effect::Drop { position, message: expired.message, reason: DeadLetterReason::Expired });
        }
    }

    fn dispatch<G: FnMut(ConsumerRef) -> bool>(
        &mut self,
        now_ms: u64,
        deliveries_max: usize,
        can_take: &mut G,
        effects: &mut Vec<Effect<M>>,
    ) -> Reply {
        for _ in 0..deliveries_max {
            if let Some(request) = self.page_in_request() {
                effects.push(request);
                return Reply::PageInFirst;
            }
            self.expire_head(now_ms, effects);
            if self.messages.ready_in_memory() == 0 {
                return Reply::Ok;
            }
            let Some(index) = self.pick_consumer(can_take) else {
                return Reply::Ok;
            };
            self.deliver(Some(index), effects);
        }
        Reply::Ok
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
        if let Some(request) = self.page_in_request() {
            effects.push(request);
            return Reply::PageInFirst;
        }
        self.expire_head(now_ms, effects);
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
        let paged = self.messages.take_paged();
        if paged > 0 {
            effects.push(Effect::SettlePaged { count: paged });
            count += paged;
        }
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

    /// A message's priority in this queue: its property capped at x-max-priority (RabbitMQ treats
    /// a higher one as the maximum); 0 without x-max-priority, which never reads the property.
    fn priority_of(&self, message: &M) -> u8 {
        match self.max_priority {
            Some(max_priority) => message.priority().min(max_priority),
            None => 0,
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
    pub const NONE: Limits = Limits { length_limit: None, message_ttl_ms: None };
}
