//! Publishing: assembling content frames into a message, routing it, and confirming it.

use super::{Channel, Context, Publish, Routed, PENDING_CONFIRMS_MAX, TRANSACTION_OPERATIONS_MAX};
use crate::metrics::counters::bump_single_writer;
use crate::queue_type::{ConfirmSink, ConfirmTicket, ConfirmTickets, PendingConfirm, PublishOutcome, Queue};
use crate::shared::{ChannelShared, Outbound};
use crate::topic_permissions::TopicAccessKind;
use amqp_codec::{constants, encode_method_frame, BasicAck, BasicNack, ContentHeader, Method, ShortStr};
use broker_core::vhost::{DelayedRoute, Vhost};
use broker_core::{AmqpError, Message};
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Channel {
    pub(super) fn handle_header(&mut self, context: &Context, header: ContentHeader) -> Result<(), AmqpError> {
        let Some(content) = self.content.as_mut() else {
            return Err(AmqpError::unexpected_frame("expected method frame, got non method frame instead"));
        };
        if content.header.is_some() {
            return Err(AmqpError::unexpected_frame("expected content body, got non content body frame instead").during(60, 40));
        }
        if header.class_id != amqp_codec::class_id::BASIC {
            return Err(
                AmqpError::unexpected_frame(format!("content header for class {} does not match class 60", header.class_id)).during(60, 40)
            );
        }
        if header.body_size > context.broker.config.message_bytes_max {
            return Err(AmqpError::precondition(format!(
                "message size {} is larger than configured max size {}",
                header.body_size, context.broker.config.message_bytes_max
            ))
            .during(60, 40));
        }
        let complete = header.body_size == 0;
        content.header = Some(header);
        if complete {
            self.finish_publish(context)?;
        }
        Ok(())
    }

    pub(super) fn handle_body(&mut self, context: &Context, body: Bytes) -> Result<(), AmqpError> {
        let Some(content) = self.content.as_mut() else {
            return Err(AmqpError::unexpected_frame("expected method frame, got non method frame instead"));
        };
        let Some(header) = &content.header else {
            return Err(
                AmqpError::unexpected_frame("expected content header for class 60, got non content header frame instead").during(60, 40)
            );
        };
        let expected = header.body_size;
        content.body_received += body.len() as u64;
        if content.body_received > expected {
            return Err(AmqpError::new(
                constants::FRAME_ERROR,
                format!("body frames carry {} bytes, more than the announced {expected}", content.body_received),
            ));
        }
        // A body in one frame stays the frame's own bytes; only multi-frame bodies are copied.
        if content.first_body_frame.is_none() && content.body.is_empty() {
            content.first_body_frame = Some(body);
        } else {
            if let Some(first) = content.first_body_frame.take() {
                content.body.reserve(expected as usize);
                content.body.extend_from_slice(&first);
            }
            content.body.extend_from_slice(&body);
        }
        if content.body_received == expected {
            self.finish_publish(context)?;
        }
        Ok(())
    }

    pub(super) fn finish_publish(&mut self, context: &Context) -> Result<(), AmqpError> {
        let content = self.content.take().expect("called with content present");
        let header = content.header.expect("header arrived");
        let body = match content.first_body_frame {
            Some(body) => body,
            None => content.body.freeze(),
        };
        // The channel's own list, kept empty between publishes: no allocation per publish.
        let mut queues = std::mem::take(&mut self.routed_queues);
        let mut delayed: Vec<(DelayedRoute, bool)> = Vec::new();
        let mut deduplicated = Deduplicated::Routed(None);
        let mut has_bcc = false;
        let message;
        {
            let vhost = context.topology()?.read();
            // RabbitMQ 3.10.8's order (`rabbit_channel`, basic.publish): the write permission, the
            // exchange, internal, the topic permission, then the message's own properties.
            // One regex match per exchange per channel: a publisher's exchange rarely changes.
            if self.publish_allowed.as_ref() != Some(&content.exchange) {
                context.check(crate::auth::Access::Write, "exchange", content.exchange.as_bytes()).map_err(|error| error.during(60, 40))?;
                self.publish_allowed = Some(content.exchange.clone());
            }
            let exchange = vhost.require_exchange(&content.exchange).map_err(|error| error.during(60, 40))?;
            if exchange.internal {
                return Err(AmqpError::access_refused(format!(
                    "cannot publish to internal exchange '{}' in vhost '{}'",
                    content.exchange, context.vhost
                ))
                .during(60, 40));
            }
            context.check_topic(exchange, TopicAccessKind::Write, content.routing_key.as_bytes()).map_err(|error| error.during(60, 40))?;
            let header = self.checked_properties(context, header)?;
            message = Arc::new(Message {
                exchange: content.exchange,
                routing_key: content.routing_key,
                header,
                body,
                published_at_ns: context.read_at_ns,
                bcc_routing_keys: None,
            });
            // Outside a transaction the message is routed under the same read lock as the checks.
            if self.transaction.is_none() {
                if exchange.deduplication.is_some() {
                    deduplicated = deduplicate(context, exchange, &message);
                }
                if !matches!(deduplicated, Deduplicated::Dropped) {
                    has_bcc = route_to_queues(&vhost, &message, &mut queues, &mut delayed);
                }
                self.exchange_counts.count(&exchange.stats.0, queues.len());
            }
        }
        let message = if has_bcc { super::header_routes::without_bcc(&message) } else { message };
        let publish = Publish { mandatory: content.mandatory, message };
        let counters = &self.shared.publish_counters;
        bump_single_writer(&counters.received);
        if self.confirm_sequence.is_some() {
            bump_single_writer(&counters.received_confirm);
        }
        if let Some(transaction) = self.transaction.as_mut() {
            if transaction.publishes.len() + transaction.settles.len() >= TRANSACTION_OPERATIONS_MAX {
                return Err(AmqpError::precondition(format!("transaction holds more than {TRANSACTION_OPERATIONS_MAX} operations")));
            }
            transaction.publishes.push(publish);
            return Ok(());
        }
        count_routing(&self.shared, &publish, &queues);
        // The tickets join this socket read's batch directly: one group commit waits for them all.
        self.pending_sync.tickets.set_message_tag(self.confirm_sequence.map_or(0, |sequence| sequence + 1));
        let Routed { mut waits, rejected } = enqueue(context, self.id(), &publish, &queues, &mut self.pending_sync.tickets);
        if !delayed.is_empty() {
            waits |= delay(context, &publish.message, delayed, &mut self.pending_sync.tickets);
        }
        if let Deduplicated::Routed(Some(log)) = deduplicated {
            waits |= self.pending_sync.tickets.add(ConfirmTicket::LogSynced(log));
        }
        queues.clear();
        self.routed_queues = queues;
        if let Some(sequence) = self.confirm_sequence.as_mut() {
            *sequence += 1;
            let delivery_tag = *sequence;
            // A queue at its x-max-length with reject-publish refused it: nack, as RabbitMQ does.
            let accepted = !rejected;
            if !waits && self.shared.confirms_in_syncer.load(Ordering::Acquire) == 0 {
                send_confirm(&self.shared, delivery_tag, accepted);
            } else {
                // Behind an earlier confirm still waiting for its ticket, even a confirm that
                // waits for nothing goes through the group commit, so a channel's confirms stay
                // in order and can be coalesced (basic.ack with multiple).
                self.shared.confirms_in_syncer.fetch_add(1, Ordering::AcqRel);
                self.shared.connection.begin_pending();
                let sink: Arc<dyn ConfirmSink> = self.shared.clone();
                self.pending_sync.confirms.push(PendingConfirm { sink, delivery_tag, accepted });
                if self.pending_sync.confirms.len() >= PENDING_CONFIRMS_MAX {
                    self.flush_syncs(context);
                }
            }
        }
        Ok(())
    }

    /// The message's own properties checked in RabbitMQ 3.10.8's order (fast reply-to, user-id,
    /// expiration, then the delivery mode as `rabbit_basic:message_no_id` checks it), with the
    /// reply-to rewritten for direct reply-to.
    fn checked_properties(&self, context: &Context, header: ContentHeader) -> Result<ContentHeader, AmqpError> {
        let header = if header.has_reply_to() { self.direct_reply_to(header)? } else { header };
        // Decoding every property costs an allocation per message; only a user-id needs it.
        if let Some(properties) = header.has_user_id().then(|| header.properties().ok()).flatten() {
            if let Some(user_id) = &properties.user_id {
                if user_id.as_bytes() != context.user.as_bytes() {
                    return Err(AmqpError::precondition(format!(
                        "user_id property set to '{}' but authenticated user was '{}'",
                        user_id, context.user
                    ))
                    .during(60, 40));
                }
            }
        }
        if header.has_expiration() {
            check_expiration(&header)?;
        }
        if let Some(mode) = header.delivery_mode() {
            if mode != 1 && mode != 2 {
                return Err(AmqpError::precondition(format!("invalid message: {{delivery_mode_unknown,{mode}}}")).during(60, 40));
            }
        }
        Ok(header)
    }

    /// Direct reply-to: a request whose `reply_to` is `amq.rabbitmq.reply-to` gets the channel's
    /// reply address instead; a channel not consuming its replies is refused, as in RabbitMQ.
    fn direct_reply_to(&self, header: ContentHeader) -> Result<ContentHeader, AmqpError> {
        let Ok(mut properties) = header.properties() else { return Ok(header) };
        if properties.reply_to.as_ref().is_none_or(|reply_to| reply_to.as_bytes() != crate::direct_reply::REPLY_TO_QUEUE.as_bytes()) {
            return Ok(header);
        }
        let Some((token, _)) = &self.reply_consumer else {
            return Err(crate::direct_reply::no_reply_consumer());
        };
        properties.reply_to = Some(ShortStr::from(format!("{}{token}", crate::direct_reply::REPLY_TO_PREFIX)));
        Ok(ContentHeader::from_properties(header.class_id, header.body_size, &properties))
    }

    /// Routes a publish into its queues (a transaction's, at commit), adding the confirm tickets
    /// to wait for to `tickets`.
    pub(super) fn route(&mut self, context: &Context, publish: &Publish, tickets: &mut ConfirmTickets) -> Routed {
        let mut queues: Vec<Queue> = Vec::new();
        let mut delayed: Vec<(DelayedRoute, bool)> = Vec::new();
        let mut deduplicated = Deduplicated::Routed(None);
        let mut has_bcc = false;
        // Channels exist only after connection.open set the topology.
        if let Ok(topology) = context.topology() {
            let vhost = topology.read();
            if let Some(exchange) = vhost.exchange(&publish.message.exchange).filter(|exchange| exchange.deduplication.is_some()) {
                deduplicated = deduplicate(context, exchange, &publish.message);
            }
            if !matches!(deduplicated, Deduplicated::Dropped) {
                has_bcc = route_to_queues(&vhost, &publish.message, &mut queues, &mut delayed);
                if let Ok(exchange) = vhost.require_exchange(&publish.message.exchange) {
                    self.exchange_counts.count(&exchange.stats.0, queues.len());
                }
            }
        }
        let stripped;
        let publish = if has_bcc {
            stripped = Publish { mandatory: publish.mandatory, message: super::header_routes::without_bcc(&publish.message) };
            &stripped
        } else {
            publish
        };
        count_routing(&self.shared, publish, &queues);
        let mut routed = enqueue(context, self.id(), publish, &queues, tickets);
        if let Deduplicated::Routed(Some(log)) = deduplicated {
            routed.waits |= tickets.add(ConfirmTicket::LogSynced(log));
        }
        if !delayed.is_empty() {
            routed.waits |= delay(context, &publish.message, delayed, tickets);
        }
        routed
    }
}

/// Enqueues a routed publish in its queues (returning it when mandatory and unroutable), adding
/// the tickets its confirm waits for to `tickets`.
fn enqueue(context: &Context, channel: u16, publish: &Publish, queues: &[Queue], tickets: &mut ConfirmTickets) -> Routed {
    let message = &publish.message;
    // A reply to a direct reply-to request names no queue; checked only for what routed nowhere.
    // One that reaches no channel is unroutable: returned below when mandatory.
    if queues.is_empty()
        && message.exchange.is_empty()
        && context.broker.reply_consumers.deliver(message) == crate::direct_reply::ReplyDelivery::Delivered
    {
        return Routed { waits: false, rejected: false };
    }
    if queues.is_empty() {
        if publish.mandatory {
            context.connection.send(Outbound::Return {
                channel,
                reply_code: constants::NO_ROUTE,
                reply_text: ShortStr::from("NO_ROUTE"),
                message: message.clone(),
            });
        }
        return Routed { waits: false, rejected: false };
    }
    let mut routed = Routed { waits: false, rejected: false };
    for queue in queues {
        match queue.publish(message.clone()) {
            PublishOutcome::Accepted(ticket) => {
                routed.waits |= tickets.add(ticket);
                // A deduplicating queue's key is made durable with the message.
                if let Some(log) = queue.deduplication_log() {
                    routed.waits |= tickets.add(ConfirmTicket::LogSynced(log));
                }
            }
            PublishOutcome::Rejected => routed.rejected = true,
            PublishOutcome::Dropped => {}
        }
    }
    // A queue another channel is declaring has its log synced by the confirm's group commit, but
    // not its definition: the confirm waits for that too (one load while no declare is in flight).
    if context.broker.declares_in_flight.any() && message.is_persistent() && !context.broker.await_declared(queues) {
        routed.rejected = true;
    }
    routed
}

/// Counts where a publish went: to queues, returned, or dropped as unroutable.
fn count_routing(channel: &ChannelShared, publish: &Publish, queues: &[Queue]) {
    let counters = &channel.publish_counters;
    let counter = match (queues.is_empty(), publish.mandatory) {
        (false, _) => &counters.routed,
        (true, true) => &counters.unroutable_returned,
        (true, false) => &counters.unroutable_dropped,
    };
    bump_single_writer(counter);
}

/// The queues the message's exchange and routing key lead to, and the delayed exchanges on the
/// way that hold it back (with whether each is durable).
/// Routes a message by its routing key and its CC and BCC keys; true when its BCC header must be
/// taken out before a queue holds it (see `header_routes`).
fn route_to_queues(vhost: &Vhost<Queue>, message: &Message, queues: &mut Vec<Queue>, delayed: &mut Vec<(DelayedRoute, bool)>) -> bool {
    let mut properties = || message.header.properties().ok();
    let mut routes: Vec<DelayedRoute> = Vec::new();
    vhost.route(&message.exchange, &message.routing_key, &mut properties, queues, &mut routes);
    let (header_keys, has_bcc) = super::header_routes::header_routes(message);
    for key in &header_keys {
        let mut more: Vec<Queue> = Vec::new();
        vhost.route(&message.exchange, key, &mut properties, &mut more, &mut routes);
        for queue in more {
            if !queues.iter().any(|routed| routed.same(&queue)) {
                queues.push(queue);
            }
        }
    }
    for route in routes {
        let durable = vhost.exchange(&route.exchange).is_some_and(|exchange| exchange.durable);
        delayed.push((route, durable));
    }
    has_bcc
}

/// What an exchange's deduplication made of a publish.
enum Deduplicated {
    /// A duplicate: routed nowhere (returned if mandatory, confirmed), as LavinMQ and the plugin do.
    Dropped,
    /// Routed; its key went into this cache log, which its confirm waits for too.
    Routed(Option<storage::syncer::SharedLog>),
}

/// Looks a message up in its exchange's deduplication cache (recording it when new).
fn deduplicate(context: &Context, exchange: &broker_core::exchange::Exchange, message: &Message) -> Deduplicated {
    let Some(cache) = context.broker.dedup_exchanges.cache(&context.vhost, exchange, &context.broker.syncer) else {
        return Deduplicated::Routed(None);
    };
    match cache.check(message, crate::queue_runtime::now_ms()) {
        crate::dedup::Verdict::Duplicate => Deduplicated::Dropped,
        crate::dedup::Verdict::Recorded(log) if message.is_persistent() => Deduplicated::Routed(log),
        _ => Deduplicated::Routed(None),
    }
}

/// Hands a message the delayed exchanges held back to the delay store (it routed nowhere now, so
/// a mandatory one was returned, as with RabbitMQ's plugin); true when its confirm must wait for
/// the store's sync.
fn delay(context: &Context, message: &Message, delayed: Vec<(DelayedRoute, bool)>, tickets: &mut ConfirmTickets) -> bool {
    let mut waits = false;
    for (route, durable) in delayed {
        waits |= tickets.add(context.broker.delayed.delay(&context.vhost, &route, message, durable));
    }
    waits
}

/// Sends basic.ack (or basic.nack when the message could not be made durable) to a publisher.
pub(super) fn send_confirm(channel: &ChannelShared, delivery_tag: u64, durable: bool) {
    let method: Method = if durable {
        channel.publish_counters.confirmed.fetch_add(1, Ordering::Relaxed);
        BasicAck { delivery_tag, multiple: false }.into()
    } else {
        BasicNack { delivery_tag, multiple: false, requeue: false }.into()
    };
    let mut frames = BytesMut::with_capacity(32);
    encode_method_frame(&mut frames, channel.id, &method);
    channel.connection.send(Outbound::Frames(frames.freeze()));
}

/// A per-message expiration must be a whole number of milliseconds from 0 to ten years: RabbitMQ
/// 3.10.8 closes the channel otherwise, with `rabbit_basic:parse_expiration`'s reason (measured:
/// `no_integer`, `{value_negative,-1}`; `string:to_integer` leaves `{leftover_string,...}`).
fn check_expiration(header: &amqp_codec::ContentHeader) -> Result<(), AmqpError> {
    let Some(expiration) = header.properties().ok().and_then(|properties| properties.expiration) else {
        return Ok(());
    };
    let text = expiration.to_string_lossy();
    let sign_bytes = usize::from(text.starts_with(['-', '+']));
    let digits_end = sign_bytes + text[sign_bytes..].bytes().take_while(u8::is_ascii_digit).count();
    let problem = match text[..digits_end].parse::<i128>() {
        Err(_) => "no_integer".to_string(),
        Ok(_) if digits_end < text.len() => format!("{{leftover_string,\"{}\"}}", &text[digits_end..]),
        Ok(value) if value < 0 => format!("{{value_negative,{value}}}"),
        Ok(value) if value > i128::from(broker_core::vhost::QUEUE_EXPIRES_MS_MAX) => format!("{{value_too_large,{value}}}"),
        Ok(_) => return Ok(()),
    };
    Err(AmqpError::precondition(format!("invalid expiration '{text}': {problem}")).during(60, 40))
}
