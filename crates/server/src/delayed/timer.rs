//! The one timer thread of the delay store: waits for the earliest due message, then routes every
//! message due by then, a batch at a time.

use super::{envelope, DelayedMessages, Due};
use crate::broker::Broker;
use crate::queue_type::{ConfirmTickets, PublishOutcome, Queue};
use amqp_codec::{ContentHeader, ShortStr};
use broker_core::exchange::delayed::{routed_delay_header, DELAY_HEADER};
use broker_core::vhost::DelayedRoute;
use broker_core::Message;
use std::cmp::Reverse;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use storage::queue_log::{RecordLocation, TailCursor};

/// The most due messages one round routes; the rest wait for the next round, a moment later.
pub const FIRE_BATCH_MAX: usize = 1024;

/// The longest the thread sleeps before it looks whether the broker is still there.
const IDLE_WAIT_MS: u64 = 1000;

/// Starts the timer thread of `store`; it ends when the broker is dropped or the store stopped.
pub fn start(store: &Arc<DelayedMessages>, broker: Weak<Broker>) {
    let store = store.clone();
    let spawned = std::thread::Builder::new().name("lepus-delayed".to_string()).spawn(move || run(&store, &broker));
    if let Err(error) = spawned {
        tracing::error!(%error, "the delayed-message thread could not start: delayed messages stay in the store");
    }
}

fn run(store: &DelayedMessages, broker: &Weak<Broker>) {
    loop {
        let due = store.wait_for_due();
        if store.stopped.load(Ordering::Acquire) {
            return;
        }
        let Some(broker) = broker.upgrade() else {
            return;
        };
        if !due.is_empty() {
            store.fire(&broker, due);
        }
    }
}

impl DelayedMessages {
    /// Waits until messages are due (or [`IDLE_WAIT_MS`] passed, or the store stops) and takes up
    /// to [`FIRE_BATCH_MAX`] of them, earliest first.
    pub(super) fn wait_for_due(&self) -> Vec<Due> {
        let mut state = self.state.lock();
        let now_ms = crate::queue_runtime::now_ms();
        let wait_ms = match state.index.peek() {
            Some(Reverse(first)) if first.due_ms <= now_ms => 0,
            Some(Reverse(first)) => (first.due_ms - now_ms).min(IDLE_WAIT_MS),
            None => IDLE_WAIT_MS,
        };
        if wait_ms > 0 && !self.stopped.load(Ordering::Acquire) {
            self.wake.wait_for(&mut state, Duration::from_millis(wait_ms));
        }
        let now_ms = crate::queue_runtime::now_ms();
        let mut due = Vec::new();
        while due.len() < FIRE_BATCH_MAX {
            match state.index.peek() {
                Some(Reverse(first)) if first.due_ms <= now_ms => {
                    if let Some(Reverse(first)) = state.index.pop() {
                        due.push(first);
                    }
                }
                _ => break,
            }
        }
        due
    }

    /// Routes the `due` messages, and settles them in the store once their queues hold them.
    fn fire(&self, broker: &Broker, due: Vec<Due>) {
        let Some(first_segment) = due.iter().map(|due| due.segment).min() else {
            return;
        };
        let plan = match self.log.lock().plan_tail_read(&TailCursor::new(RecordLocation { segment: first_segment, offset: 0 }, 0)) {
            Ok(plan) => plan,
            Err(error) => {
                tracing::error!(%error, count = due.len(), "reading due delayed messages failed; they stay in the store until a restart");
                return;
            }
        };
        let mut tickets = ConfirmTickets::default();
        let mut positions = Vec::with_capacity(due.len());
        let mut queues: Vec<Queue> = Vec::new();
        let mut reader = plan.reader();
        let mut declared = true;
        for due in due {
            let (position, stored) = match reader.read_at(due.location()) {
                Ok(read) => read,
                Err(error) => {
                    tracing::error!(%error, "reading a due delayed message failed; it stays in the store until a restart");
                    continue;
                }
            };
            positions.push(position);
            match self.route_stored(broker, stored, &mut queues, &mut tickets) {
                Some(safe) => declared &= safe,
                None => tracing::error!(position, "a delay-store record is not a delayed message; dropped"),
            }
        }
        let log = self.log.clone();
        release_when_safe(broker, tickets, declared, positions.len(), move || {
            let mut log = log.lock();
            for position in positions {
                log.append_settled(position);
            }
        });
    }

    /// Routes one due message as stored (its delay envelope around it), counting how late it is;
    /// `None` when it has no envelope, else what [`DelayedMessages::route`] says.
    pub(super) fn route_stored(
        &self,
        broker: &Broker,
        stored: Message,
        queues: &mut Vec<Queue>,
        tickets: &mut ConfirmTickets,
    ) -> Option<bool> {
        let (envelope, message) = envelope::unwrap(stored)?;
        self.lateness.record(crate::queue_runtime::now_ms().saturating_sub(envelope.due_ms));
        Some(self.route(broker, &envelope, message, queues, tickets))
    }

    /// Routes one due message from its delayed exchange with `x-delay` negated (none if its vhost
    /// is gone), and publishes it into the queues it reaches. False when a queue it reached is
    /// being declared and its definition could not be stored ([`Broker::await_declared`]): a
    /// synced log alone does not make the message safe then, so it stays in the store.
    pub(super) fn route(
        &self,
        broker: &Broker,
        envelope: &envelope::Envelope,
        message: Message,
        queues: &mut Vec<Queue>,
        tickets: &mut ConfirmTickets,
    ) -> bool {
        let Some(topology) = broker.vhost(&envelope.vhost) else {
            return true;
        };
        let message = Arc::new(with_routed_delay(message, envelope.delay_ms));
        queues.clear();
        let mut delayed_again: Vec<(DelayedRoute, bool)> = Vec::new();
        {
            let vhost = topology.read();
            let mut properties = || message.header.properties().ok();
            let mut delayed: Vec<DelayedRoute> = Vec::new();
            vhost.route(&envelope.exchange, &message.routing_key, &mut properties, queues, &mut delayed);
            // Only a delayed exchange further on with a delay of its own holds it back again.
            for route in delayed {
                let durable = vhost.exchange(&route.exchange).is_some_and(|exchange| exchange.durable);
                delayed_again.push((route, durable));
            }
        }
        for queue in queues.iter() {
            // A refusal (a full queue with reject-publish) drops the message, as the plugin's
            // delivery does.
            if let PublishOutcome::Accepted(ticket) = queue.publish(message.clone()) {
                tickets.add(ticket);
            }
        }
        for (route, durable) in delayed_again {
            tickets.add(self.delay(&envelope.vhost, &route, &message, durable));
        }
        !message.is_persistent() || broker.await_declared(queues)
    }
}

/// Runs `release` (the due messages leave their store) once `tickets` are settled, if every queue
/// they reached holds them safely (`declared`: see [`DelayedMessages::route`]); otherwise they
/// stay in the store, to be routed again (a duplicate at worst).
pub(super) fn release_when_safe(
    broker: &Broker,
    tickets: ConfirmTickets,
    declared: bool,
    count: usize,
    release: impl FnOnce() + Send + 'static,
) {
    let settle = move |durable: bool| {
        if !durable || !declared {
            tracing::warn!(count, "delayed messages were not made durable in their queues; kept in the store");
            return;
        }
        release();
    };
    if tickets.is_empty() {
        settle(true);
    } else {
        tickets.when_settled(&broker.syncer, Box::new(settle));
    }
}

/// The message with its `x-delay` header replaced by the negated delay, as the plugin routes it.
pub(super) fn with_routed_delay(message: Message, delay_ms: u64) -> Message {
    let Ok(mut properties) = message.header.properties() else {
        return message;
    };
    let headers = properties.headers.get_or_insert_with(Default::default);
    let value = routed_delay_header(delay_ms);
    match headers.0.iter_mut().find(|(name, _)| name.as_bytes() == DELAY_HEADER.as_bytes()) {
        Some((_, existing)) => *existing = value,
        None => headers.0.push((ShortStr::from(DELAY_HEADER), value)),
    }
    let header = ContentHeader::from_properties(message.header.class_id, message.header.body_size, &properties);
    Message { header, ..message }
}
