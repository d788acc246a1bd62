//! Messages published and taken on an operator's behalf (the management API's publish, get
//! messages and aliveness test): they change queues, so they are apart from the read-only views
//! of `introspect.rs`, and they go through the same queue-type seam as a client's.

use crate::broker::Broker;
use crate::queue_type::{ConfirmTickets, PublishOutcome};

/// A message taken by [`Broker::get_messages`] (the management API's "get messages").
#[derive(Debug, Clone)]
pub struct GotMessage {
    /// The message.
    pub message: std::sync::Arc<broker_core::Message>,
    /// Whether it had been delivered before.
    pub redelivered: bool,
    /// Ready messages left in the queue after this one was taken.
    pub message_count: u32,
}

/// Where a publish through [`Broker::publish_message`] went.
#[derive(Debug)]
pub struct Published {
    /// Whether at least one queue took it.
    pub routed: bool,
    /// What the message's confirm would wait for (its queues' tickets).
    pub tickets: ConfirmTickets,
}

impl Broker {
    /// Routes a message from the broker itself (management API publish) through `exchange` ("" is
    /// the default exchange) into its queues, as a client's basic.publish would.
    pub fn publish_message(&self, vhost: &str, message: broker_core::Message) -> Result<Published, broker_core::AmqpError> {
        let Some(topology) = self.vhost(vhost) else {
            return Err(broker_core::AmqpError::not_allowed(format!("vhost '{vhost}' not found")));
        };
        let message = std::sync::Arc::new(message);
        let mut queues = Vec::new();
        let mut delayed_tickets = Vec::new();
        {
            let topology = topology.read();
            topology.require_exchange(&message.exchange)?;
            let mut properties = || message.header.properties().ok();
            let mut delayed = Vec::new();
            topology.route(&message.exchange, &message.routing_key, &mut properties, &mut queues, &mut delayed);
            // Counted as a channel's publish is (RabbitMQ's API publishes on a channel too).
            if let Some(exchange) = topology.exchange(&message.exchange) {
                exchange.stats.0.add(1, queues.len() as u64);
            }
            for route in delayed {
                let durable = topology.exchange(&route.exchange).is_some_and(|exchange| exchange.durable);
                delayed_tickets.push(self.delayed.delay(vhost, &route, &message, durable));
            }
        }
        let mut published = Published { routed: false, tickets: ConfirmTickets::default() };
        for ticket in delayed_tickets {
            published.tickets.add(ticket);
        }
        for queue in &queues {
            match queue.publish(message.clone()) {
                PublishOutcome::Accepted(ticket) => {
                    published.routed = true;
                    published.tickets.add(ticket);
                }
                PublishOutcome::Dropped => published.routed = true,
                PublishOutcome::Rejected => {}
            }
        }
        // "routed" waits for what a confirm waits for: also the definition of a queue whose
        // declaration is in flight (`Broker::await_declared`).
        if self.declares_in_flight.any() && message.is_persistent() && !self.await_declared(&queues) {
            return Err(broker_core::AmqpError::internal("could not store the definition of a queue the message was routed to"));
        }
        Ok(published)
    }

    /// Takes up to `count` ready messages from a queue, as basic.get on a private channel would,
    /// then either settles them (`requeue == false`) or puts them back, marked redelivered. The
    /// messages are all taken before any is requeued, so one call never returns a message twice.
    /// A get that finds the ready messages on disk waits for their page-in, as basic.get does.
    pub async fn get_messages(
        &self,
        vhost: &str,
        queue: &str,
        count: usize,
        requeue: bool,
    ) -> Result<Vec<GotMessage>, broker_core::AmqpError> {
        use crate::queue_type::GetAnswer;
        use crate::shared::{ChannelShared, ConnectionShared, Outbound};
        let Some(topology) = self.vhost(vhost) else {
            return Err(broker_core::AmqpError::not_allowed(format!("vhost '{vhost}' not found")));
        };
        let handle = {
            let topology = topology.read();
            topology.require_queue(&amqp_codec::ShortStr::truncating(queue), 0)?.handle.clone()
        };
        // A channel that belongs to no socket: get-ok comes back as a value, never through a writer.
        let (sender, _receiver) = tokio::sync::mpsc::unbounded_channel();
        let connection = std::sync::Arc::new(ConnectionShared::detached(0, sender));
        let channel = std::sync::Arc::new(ChannelShared::new(1, connection));
        let mut got = Vec::new();
        let mut page_in_rounds = 0;
        while got.len() < count {
            match handle.get(&channel, false) {
                GetAnswer::Message(Outbound::GetOk { redelivered, message_count, message, .. }) => {
                    got.push(GotMessage { message, redelivered, message_count });
                }
                GetAnswer::PageInPending if page_in_rounds < crate::queue_type::GET_PAGE_IN_ROUNDS_MAX => {
                    page_in_rounds += 1;
                    handle.wait_for_page_in().await;
                }
                _ => break,
            }
        }
        let positions: Vec<u64> =
            std::mem::take(&mut channel.ledger.lock().unacked).into_values().map(|unacked| unacked.position).collect();
        if !positions.is_empty() {
            handle.settle(&positions, if requeue { crate::queue_type::Settlement::Requeue } else { crate::queue_type::Settlement::Ack });
        }
        Ok(got)
    }
}
