//! `consumer_timeout` (and a queue's own x-consumer-timeout or `consumer-timeout` policy key, which
//! win over it): a delivery left unacked too long. RabbitMQ closes the channel with 406; with
//! `consumer_timeout_mode = cancel` Lepus cancels only the consumer that holds it.
//!
//! Sampled, so deliveries and acks pay no clock read: at each tick of its connection the channel
//! counts the tick in its delivery ledger, and every delivery notes the count it was made under
//! (`Unacked::delivered_after_tick`). A delivery made after tick k came before tick k + 1, so at
//! tick n it has been unacked at least n - k - 1 tick periods: the oldest unacked delivery has
//! timed out once those periods cover the timeout. A timeout so fires between the timeout and the
//! timeout plus one tick after the delivery, never before it, whatever happened to older
//! deliveries (RabbitMQ 3.10.8 keeps each delivery's time and checks once a minute: measured, a
//! 2 s timeout closed the channel after 60 s).

use super::Channel;
use crate::config::ConsumerTimeoutMode;
use crate::connection::context::Context;
use crate::queue_type::ConsumerRemoval;
use amqp_codec::{encode_method_frame, BasicCancel, Method};
use broker_core::AmqpError;
use bytes::BytesMut;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a channel's timeout check remembers between ticks.
#[derive(Debug, Default)]
pub(super) struct TimeoutWatch {
    /// Deliveries up to this tag already timed out (cancel mode): they may still be acked.
    timed_out_up_to: u64,
}

/// How often a connection samples its channels: often enough for short timeouts (tests, eager
/// operators), and at most once a second.
/// Without a node-wide timeout (0) queues may still have their own: once a minute, as RabbitMQ.
pub fn tick_interval(consumer_timeout_ms: u64) -> Duration {
    match consumer_timeout_ms {
        0 => Duration::from_secs(60),
        timeout_ms => Duration::from_millis((timeout_ms / 4).clamp(1000, 60_000)),
    }
}

/// RabbitMQ 3.10.8's text for a channel closed by the timeout.
fn timed_out(channel: u16, consumer_timeout_ms: u64) -> AmqpError {
    AmqpError::precondition(format!(
        "delivery acknowledgement on channel {channel} timed out. Timeout value used: {consumer_timeout_ms} ms. \
         This timeout value can be configured, see consumers doc guide to learn more"
    ))
}

impl Channel {
    /// Counts a tick and acts on the oldest unacked delivery if it timed out (see the module
    /// comment).
    pub fn check_consumer_timeout(&mut self, context: &mut Context) {
        if self.closing {
            return;
        }
        let (oldest, tick) = {
            let mut ledger = self.shared.ledger.lock();
            ledger.timeout_ticks += 1;
            let first_live = self.timeout_watch.timed_out_up_to + 1;
            let oldest = ledger
                .unacked
                .first_from(first_live)
                .map(|(tag, unacked)| (tag, unacked.consumer.clone(), unacked.queue.clone(), unacked.delivered_after_tick));
            (oldest, ledger.timeout_ticks)
        };
        let Some((tag, consumer, queue, delivered_after_tick)) = oldest else {
            return;
        };
        // The queue's own timeout (x-consumer-timeout, policy) before the node's.
        let node_timeout_ms = context.broker.config.consumer_timeout_ms;
        let consumer_timeout_ms = queue.consumer_timeout_ms().unwrap_or(node_timeout_ms);
        if consumer_timeout_ms == 0 {
            return;
        }
        let whole_periods = tick.saturating_sub(delivered_after_tick).saturating_sub(1);
        let unacked_at_least = tick_interval(node_timeout_ms).saturating_mul(u32::try_from(whole_periods).unwrap_or(u32::MAX));
        if unacked_at_least < Duration::from_millis(consumer_timeout_ms) {
            return;
        }
        match context.broker.config.consumer_timeout_mode {
            ConsumerTimeoutMode::Close => {
                let error = timed_out(self.id(), consumer_timeout_ms);
                tracing::info!(channel = self.id(), "closing a channel: a delivery was not acknowledged within consumer_timeout");
                self.fail(context, &error);
            }
            ConsumerTimeoutMode::Cancel => {
                self.timeout_watch.timed_out_up_to = tag;
                if let Some(consumer) = consumer {
                    self.cancel_timed_out(context, &consumer);
                }
            }
        }
    }

    /// Cancels a consumer whose delivery timed out, telling its client with basic.cancel when it
    /// understands one (consumer_cancel_notify), as when its queue is deleted.
    fn cancel_timed_out(&mut self, context: &mut Context, consumer: &std::sync::Arc<crate::shared::ConsumerHandle>) {
        let Some((handle, queue)) = self.consumers.remove(&consumer.tag) else { return };
        self.shared.consumer_count.store(self.consumers.len() as u32, Ordering::Relaxed);
        handle.cancelled.store(true, Ordering::Release);
        tracing::info!(channel = self.id(), consumer = %handle.tag, "cancelling a consumer: a delivery was not acknowledged within consumer_timeout");
        if queue.cancel(&handle) == ConsumerRemoval::DeleteQueue {
            context.broker.remove_queue(&context.vhost, queue.name());
        }
        if context.connection.consumer_cancel_notify.load(Ordering::Acquire) {
            let mut frames = BytesMut::new();
            let cancel = Method::BasicCancel(BasicCancel { consumer_tag: handle.tag.clone(), nowait: true });
            encode_method_frame(&mut frames, self.id(), &cancel);
            context.connection.send(crate::shared::Outbound::Frames(frames.freeze()));
        }
    }
}
