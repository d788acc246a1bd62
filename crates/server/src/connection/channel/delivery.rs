//! Consumers, acknowledgements, recovery and transactions: what happens after a delivery.

use super::{random_name, Channel, Context, PendingSettle, Transaction};
use crate::queue_type::{ConfirmTickets, Queue, Settlement};
use crate::shared::{ChannelShared, ConsumerHandle, Outbound, Unacked};
use amqp_codec::{constants, encode_method_frame, BasicConsumeOk, ChannelClose, ShortStr, TxCommitOk};
use broker_core::AmqpError;
use bytes::BytesMut;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Channel {
    /// An empty queue name means the last queue declared on this channel, as in RabbitMQ.
    pub(super) fn queue_name(&self, name: &ShortStr) -> Result<ShortStr, AmqpError> {
        if !name.is_empty() {
            return Ok(name.clone());
        }
        self.last_declared_queue.clone().ok_or_else(|| AmqpError::new(constants::NOT_FOUND, "no previously declared queue"))
    }

    pub(super) fn require_queue(&self, context: &Context, name: &ShortStr) -> Result<Queue, AmqpError> {
        let vhost = context.topology()?.read();
        Ok(vhost.require_queue(name, context.connection.id)?.handle.clone())
    }

    pub(super) fn consume(&mut self, context: &Context, consume: amqp_codec::BasicConsume) -> Result<(), AmqpError> {
        // Checked first, with the text and code of RabbitMQ's `consumer_max_per_channel` (3.11+):
        // a connection error, as a client that leaks consumers is not one to keep serving.
        let consumers_max = context.broker.config.consumer_max_per_channel;
        if self.consumers.len() >= consumers_max && !self.consumers.contains_key(&consume.consumer_tag) {
            return Err(AmqpError::not_allowed(format!("reached maximum ({consumers_max}) of consumers per channel")));
        }
        if consume.queue.as_bytes() == crate::direct_reply::REPLY_TO_QUEUE.as_bytes() {
            return self.consume_replies(context, consume);
        }
        let name = self.queue_name(&consume.queue)?;
        context.check(crate::auth::Access::Read, "queue", name.as_bytes())?;
        let queue = self.require_queue(context, &name)?;
        let tag = if consume.consumer_tag.is_empty() { random_name("amq.ctag-") } else { consume.consumer_tag.clone() };
        if self.consumers.contains_key(&tag) {
            return Err(AmqpError::not_allowed(format!("attempt to reuse consumer tag '{tag}'")));
        }
        let capabilities = queue.capabilities();
        let global_qos_active = self.shared.prefetch_global.load(Ordering::Acquire) != 0;
        // RabbitMQ checks the values of the consume arguments a queue's type takes, then refuses
        // those it does not: x-stream-offset is a stream's only.
        let stream_offset = match queue.as_stream() {
            Some(_) => {
                crate::stream::arguments::consume_offset(&consume.arguments, queue.name(), &context.vhost, storage::stream::now_ms())?
            }
            None => {
                crate::stream::arguments::refuse_offset_off_streams(
                    &consume.arguments,
                    queue.name(),
                    &context.vhost,
                    queue.definition().queue_type,
                )?;
                storage::stream::OffsetSpec::Next
            }
        };
        if queue.as_stream().is_some() {
            let (arguments, prefetch) = (&consume.arguments, self.consumer_prefetch);
            capabilities.check_stream_consume(queue.name(), &context.vhost, arguments, prefetch, consume.no_ack, global_qos_active)?;
        }
        capabilities.check_consume(queue.name(), &context.vhost, consume.no_ack, global_qos_active)?;
        let priority = match consume.arguments.get("x-priority") {
            None => 0,
            Some(value) => value.as_i64().ok_or_else(|| AmqpError::precondition("invalid arg 'x-priority': expected an integer"))?,
        };
        let priority = if capabilities.consumer_priorities { priority } else { 0 };
        let consumer = Arc::new(ConsumerHandle {
            tag: tag.clone(),
            channel: self.shared.clone(),
            no_ack: consume.no_ack,
            prefetch: self.consumer_prefetch,
            unacked: Default::default(),
            priority,
            cancelled: Default::default(),
        });
        let id = self.id();
        let reply = (!consume.nowait).then(|| {
            let mut frames = BytesMut::new();
            encode_method_frame(&mut frames, id, &BasicConsumeOk { consumer_tag: tag.clone() }.into());
            frames.freeze()
        });
        let connection = context.connection.clone();
        queue.consume_from(consumer.clone(), consume.exclusive, stream_offset, move || {
            if let Some(frames) = reply {
                connection.send(Outbound::Frames(frames));
            }
        })?;
        self.consumers.insert(tag, (consumer, queue));
        self.shared.consumer_count.store(self.consumers.len() as u32, Ordering::Relaxed);
        Ok(())
    }

    /// basic.consume on `amq.rabbitmq.reply-to` (direct reply-to): no-ack only, once per channel.
    fn consume_replies(&mut self, context: &Context, consume: amqp_codec::BasicConsume) -> Result<(), AmqpError> {
        if !consume.no_ack {
            return Err(crate::direct_reply::acknowledging_consumer_refused());
        }
        if self.reply_consumer.is_some() {
            return Err(crate::direct_reply::consumer_already_set());
        }
        let tag = if consume.consumer_tag.is_empty() { random_name("amq.ctag-") } else { consume.consumer_tag.clone() };
        if !consume.nowait {
            context.reply(self.id(), BasicConsumeOk { consumer_tag: tag.clone() }.into());
        }
        let token = context.broker.reply_consumers.register(&self.shared, tag.clone());
        self.reply_consumer = Some((token, tag));
        Ok(())
    }

    /// Takes deliveries off the ledger: one tag, every tag up to it (`multiple`), or all (tag 0
    /// with `multiple`). An unknown tag is a 406, as in RabbitMQ. `acknowledged` counts them as
    /// acked (basic.ack) in the channel's metrics, under the lock taken here anyway.
    pub(super) fn take_deliveries(&self, delivery_tag: u64, multiple: bool, acknowledged: bool) -> Result<Vec<Unacked>, AmqpError> {
        let mut taken = Vec::new();
        take_deliveries_into(&self.shared, delivery_tag, multiple, acknowledged, &mut taken)?;
        Ok(taken)
    }

    /// basic.ack (`requeue` None), basic.nack and basic.reject.
    pub(super) fn settle(&mut self, _context: &Context, delivery_tag: u64, multiple: bool, requeue: Option<bool>) -> Result<(), AmqpError> {
        if let Some(transaction) = self.transaction.as_mut() {
            let known = delivery_tag == 0 && multiple || self.shared.ledger.lock().unacked.contains_key(&delivery_tag);
            if !known {
                return Err(AmqpError::precondition(format!("unknown delivery tag {delivery_tag}")));
            }
            transaction.settles.push(PendingSettle { delivery_tag, multiple, requeue });
            return Ok(());
        }
        if requeue.is_none() {
            // Acks wait for the end of the socket read (or the channel's next other method), so a
            // read full of acks settles each queue under one lock and dispatches once. They go
            // straight onto the pending list: no list allocated per ack.
            return take_deliveries_into(&self.shared, delivery_tag, multiple, true, &mut self.pending_acks);
        }
        let taken = self.take_deliveries(delivery_tag, multiple, false)?;
        refuse_stream_nack(&taken)?;
        self.flush_acks();
        finish_grouped(taken.into_iter(), Settlement::from_requeue(requeue));
        if self.shared.prefetch_global.load(Ordering::Acquire) != 0 {
            self.dispatch_consumed_queues();
        }
        Ok(())
    }

    /// Whether acks wait to be applied to their queues (see [`Channel::flush_acks`]).
    pub fn has_pending_acks(&self) -> bool {
        !self.pending_acks.is_empty()
    }

    /// Settles the acks gathered since the last flush in their queues, each queue locked once.
    pub fn flush_acks(&mut self) {
        if self.pending_acks.is_empty() {
            return;
        }
        finish_grouped(self.pending_acks.drain(..), Settlement::Ack);
        if self.shared.prefetch_global.load(Ordering::Acquire) != 0 {
            self.dispatch_consumed_queues();
        }
    }

    pub(super) fn recover(&mut self, requeue: bool) -> Result<(), AmqpError> {
        if !requeue {
            return Err(AmqpError::not_implemented("requeue=false"));
        }
        let taken: Vec<Unacked> = std::mem::take(&mut self.shared.ledger.lock().unacked).into_values().collect();
        if taken.iter().any(|delivery| delivery.queue.as_stream().is_some()) {
            // RabbitMQ 3.10.8's channel crashes on a recover of stream deliveries (measured).
            return Err(crate::stream::arguments::internal_error());
        }
        finish_grouped(taken.into_iter(), Settlement::Requeue);
        Ok(())
    }

    pub(super) fn commit(&mut self, context: &Context) -> Result<(), AmqpError> {
        let Some(transaction) = self.transaction.as_mut() else {
            return Err(AmqpError::precondition("channel is not transactional"));
        };
        let Transaction { publishes, settles } = std::mem::take(transaction);
        let mut tickets = ConfirmTickets::default();
        for publish in &publishes {
            self.route(context, publish, &mut tickets);
        }
        for settle in settles {
            // A tag settled twice in one transaction is already gone; RabbitMQ ignores it too.
            if let Ok(taken) = self.take_deliveries(settle.delivery_tag, settle.multiple, settle.requeue.is_none()) {
                finish_grouped(taken.into_iter(), Settlement::from_requeue(settle.requeue));
            }
        }
        self.dispatch_consumed_queues();
        let id = self.id();
        if tickets.is_empty() {
            context.reply(id, TxCommitOk {}.into());
        } else {
            // commit-ok waits for what a confirm would: the transaction's tickets.
            let channel = self.shared.clone();
            tickets.when_settled_in_order(&self.shared, &context.broker.syncer, Box::new(move |durable| answer_commit(&channel, durable)));
        }
        Ok(())
    }

    pub(super) fn dispatch_consumed_queues(&self) {
        let mut seen: Vec<*const ()> = Vec::new();
        for (_, queue) in self.consumers.values() {
            if !seen.contains(&queue.address()) {
                seen.push(queue.address());
                queue.dispatch();
            }
        }
    }
}

/// Answers a tx.commit once the syncer has run: commit-ok when its messages are on disk; when a
/// write or sync failed, what RabbitMQ answers a commit whose messages a queue rejected, a channel
/// error 406 "partial tx completion" (`rabbit_channel:complete_tx`), so the client never takes an
/// unsynced message for committed. The commit-ok of a later commit that was already pipelined
/// behind it is not sent either.
fn answer_commit(channel: &ChannelShared, durable: bool) {
    // Under the ledger lock, so the reader cannot release the channel (and the client reuse its
    // number) between the check and the send.
    let ledger = channel.ledger.lock();
    if !ledger.open || channel.closed_by_broker.load(Ordering::Acquire) {
        return;
    }
    let mut frames = BytesMut::new();
    if durable {
        encode_method_frame(&mut frames, channel.id, &TxCommitOk {}.into());
    } else {
        let error = AmqpError::precondition("partial tx completion").during(90, 20);
        tracing::warn!(channel = channel.id, "tx.commit: its messages could not be written or synced; closing the channel");
        channel.closed_by_broker.store(true, Ordering::Release);
        let close = ChannelClose {
            reply_code: error.code,
            reply_text: ShortStr::truncating(error.text),
            class_id: error.class_id,
            method_id: error.method_id,
        };
        encode_method_frame(&mut frames, channel.id, &close.into());
    }
    channel.connection.send(Outbound::Frames(frames.freeze()));
    drop(ledger);
}

/// basic.nack and basic.reject of a stream's delivery: a connection error, as RabbitMQ 3.10.8
/// answers (a stream keeps every message: there is nothing to requeue or dead-letter).
fn refuse_stream_nack(taken: &[Unacked]) -> Result<(), AmqpError> {
    match taken.iter().find_map(|delivery| delivery.queue.as_stream()) {
        Some(stream) => Err(AmqpError::not_implemented(format!(
            "basic.nack and basic.reject not supported by stream queues queue '{}' in vhost '{}'",
            stream.name(),
            stream.vhost
        ))),
        None => Ok(()),
    }
}

/// Takes deliveries off the ledger into `taken` (see [`Channel::take_deliveries`]).
fn take_deliveries_into(
    channel: &ChannelShared,
    delivery_tag: u64,
    multiple: bool,
    acknowledged: bool,
    taken: &mut Vec<Unacked>,
) -> Result<(), AmqpError> {
    let mut ledger = channel.ledger.lock();
    let before = taken.len();
    if multiple && delivery_tag == 0 {
        if !ledger.unacked.is_empty() {
            taken.extend(std::mem::take(&mut ledger.unacked).into_values());
        }
    } else if multiple {
        ledger.unacked.take_through(delivery_tag, taken);
    } else {
        taken.extend(ledger.unacked.remove(&delivery_tag));
    }
    let count = taken.len() - before;
    if count == 0 && !(multiple && delivery_tag == 0) {
        return Err(AmqpError::precondition(format!("unknown delivery tag {delivery_tag}")));
    }
    if acknowledged {
        ledger.counters.acknowledged += count as u64;
    }
    Ok(())
}

/// Settles (or requeues) deliveries in their queues, grouped per queue so each is locked once.
pub(super) fn finish_grouped(deliveries: impl Iterator<Item = Unacked>, settlement: Settlement) {
    let mut groups: Vec<(Queue, Vec<u64>)> = Vec::new();
    for delivery in deliveries {
        if let Some(consumer) = &delivery.consumer {
            consumer.release_delivery();
        }
        match groups.iter_mut().find(|(queue, _)| queue.same(&delivery.queue)) {
            Some((_, positions)) => positions.push(delivery.position),
            None => groups.push((delivery.queue, vec![delivery.position])),
        }
    }
    for (queue, positions) in groups {
        queue.settle(&positions, settlement);
    }
}
