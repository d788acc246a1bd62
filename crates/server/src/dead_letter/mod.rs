//! Dead-lettering: a message a queue rejects, expires or drops for its length is published again,
//! by the broker, through the queue's dead-letter exchange, as RabbitMQ 3.10 does
//! (`rabbit_dead_letter`), with the `x-death` header of `message.rs`.
//!
//! A queue never publishes while it holds its own lock (the target may be the queue itself, or a
//! queue dead-lettering back to it): it hands its dead letters to one worker thread, which routes
//! them in the vhost and publishes them into their new queues.
//!
//! At least once, where RabbitMQ's classic queues are at most once: a dead-lettered message that
//! sits in its source queue's log is settled there only once every new queue holds it safely
//! (the confirm tickets of its publish are settled, as a publisher confirm would wait). A crash in
//! between leaves it in both queues (a duplicate), never in neither.
//!
//! A quorum queue with `x-dead-letter-strategy: at-least-once` (and reject-publish) keeps its
//! dead letters in its replicated state (`replication::state_machine::HeldDeadLetters`): the node
//! leading its shard publishes them here, and proposes their settle once every new queue holds
//! them. One that routes nowhere (no queue bound, no exchange, every target refused it) stays in
//! its source and is published again after the retry interval, as RabbitMQ's
//! `rabbit_fifo_dlx_worker` retries after its `dead_letter_worker_publisher_confirm_timeout`.
//!
//! The worker also expires messages whose TTL passes without a consumer or a publish: each queue
//! that dead-letters tells it when its head next expires (`deadlines.rs`), and the worker visits a
//! queue only when that time comes. Idle queues cost no CPU between deadlines.

pub mod deadlines;
pub mod message;

use crate::broker::{Broker, VhostTopology};
use crate::queue_type::{ConfirmTickets, PublishOutcome, Queue};
use amqp_codec::ShortStr;
use broker_core::Message;
use deadlines::{DeadlineKey, DeadlineQueue, ExpiryDeadlines};
use queue_core::DeadLetterReason;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::time::Duration;
use storage::syncer::{SharedLog, Syncer};

/// How many batches of dead letters wait for the worker at most. When the backlog is full, a
/// queue keeps its dead letters and hands them over with its next command or the next sweep.
pub const DEAD_LETTER_BATCHES_MAX: usize = 4096;

/// The most queues the worker visits for their deadlines before it looks at its backlog of dead
/// letters again.
pub const DUE_QUEUES_PER_ROUND_MAX: usize = 1024;

/// The longest the worker sleeps without looking at the clock (a wall clock set back or forward
/// moves deadlines; this bounds how late that makes one).
pub const WORKER_SLEEP_MS_MAX: u64 = 60_000;

/// Where a queue dead-letters: its `x-dead-letter-exchange` and `x-dead-letter-routing-key` (or
/// the policy's `dead-letter-exchange` and `dead-letter-routing-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterTarget {
    /// The exchange dead letters are published to (may be the default exchange, "").
    pub exchange: ShortStr,
    /// The routing key they get; none keeps their own.
    pub routing_key: Option<ShortStr>,
}

/// One message a queue dead-letters.
#[derive(Debug)]
pub struct DeadLetter {
    /// Its position in the source queue (to settle in the source's log).
    pub position: u64,
    /// Whether the source's log holds it: settled there once its new queues hold it.
    pub logged: bool,
    /// Whether the source (a quorum queue dead-lettering at least once) keeps it until told
    /// that its new queues hold it: settled there then, kept (and published again later) when it
    /// routes nowhere.
    pub held: bool,
    /// The message as the source queue held it.
    pub message: Arc<Message>,
    /// Why it left.
    pub reason: DeadLetterReason,
    /// Where the source dead-lettered when it left.
    pub target: DeadLetterTarget,
}

/// The queue dead letters come from: made once per queue, shared by its batches.
#[derive(Debug)]
pub struct DeadLetterSource {
    /// Its vhost, where the dead-letter exchange is looked up.
    pub vhost: String,
    /// Its name, for `x-death`.
    pub queue: ShortStr,
    /// Its log, where logged dead letters are settled.
    pub log: Option<SharedLog>,
    /// The quorum queue held dead letters are settled in.
    pub quorum: Option<Weak<crate::quorum::QuorumQueue>>,
}

/// Dead letters of one queue, handed over together.
#[derive(Debug)]
pub struct DeadLetterBatch {
    /// The queue they come from.
    pub source: Arc<DeadLetterSource>,
    /// The messages.
    pub letters: Vec<DeadLetter>,
    /// Which of the queues they route to this node publishes to.
    pub scope: DeadLetterScope,
}

/// Which queues a node publishes a batch's dead letters to. A quorum queue's drop is applied on
/// every node of its shard: each node publishes to the classic queues it holds (classic queues
/// take no messages through another node), the node leading the shard to the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterScope {
    /// A classic queue's letters: every queue they route to.
    Everywhere,
    /// A quorum queue's, on the node leading its shard: every queue but other nodes' classic
    /// queues (their own node publishes to those).
    ShardLeader,
    /// A quorum queue's, on a node not leading its shard: only this node's classic queues.
    ShardFollower,
}

impl DeadLetterScope {
    /// Whether this node publishes the letter to `queue`.
    fn takes(self, queue: &Queue) -> bool {
        match self {
            DeadLetterScope::Everywhere => true,
            DeadLetterScope::ShardLeader => !matches!(queue, Queue::Remote(_)),
            DeadLetterScope::ShardFollower => matches!(queue, Queue::Classic(_)),
        }
    }
}

/// What the worker is handed.
#[derive(Debug)]
enum WorkerInput {
    /// Dead letters to publish.
    Batch(DeadLetterBatch),
    /// A queue has a deadline earlier than any the worker waits for.
    Wake,
}

/// Where queues hand their dead letters over, and tell when their head next expires.
#[derive(Debug, Clone)]
pub struct DeadLetterSender {
    sender: SyncSender<WorkerInput>,
    deadlines: Arc<ExpiryDeadlines>,
}

/// The worker's end, until the broker starts it.
pub struct DeadLetterReceiver {
    receiver: Receiver<WorkerInput>,
    deadlines: Arc<ExpiryDeadlines>,
}

/// A sender and the receiver the worker will read.
pub fn channel() -> (DeadLetterSender, DeadLetterReceiver) {
    let (sender, receiver) = sync_channel(DEAD_LETTER_BATCHES_MAX);
    let deadlines = Arc::new(ExpiryDeadlines::default());
    (DeadLetterSender { sender, deadlines: deadlines.clone() }, DeadLetterReceiver { receiver, deadlines })
}

/// A queue's entry in the worker's deadlines: the key it holds, if any.
#[derive(Debug, Default)]
pub struct ExpiryDeadline {
    key: Option<DeadlineKey>,
}

impl ExpiryDeadline {
    /// The deadline the queue holds, in milliseconds since the epoch.
    pub fn deadline_ms(&self) -> Option<u64> {
        self.key.map(|(deadline_ms, _)| deadline_ms)
    }

    /// The worker took the entry (it is visiting the queue).
    pub fn taken(&mut self, key: DeadlineKey) {
        if self.key == Some(key) {
            self.key = None;
        }
    }
}

impl DeadLetterSender {
    /// Hands `batch` to the worker; gives it back when the backlog is full (to keep and retry).
    /// When the worker is gone (the broker is stopping) the letters are dropped: their messages
    /// stay in the source's log, so a restart finds them there.
    pub fn try_send(&self, batch: DeadLetterBatch) -> Result<(), DeadLetterBatch> {
        match self.sender.try_send(WorkerInput::Batch(batch)) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => Ok(()),
            Err(TrySendError::Full(WorkerInput::Batch(batch))) => Err(batch),
            Err(TrySendError::Full(WorkerInput::Wake)) => Ok(()),
        }
    }

    /// Tells the worker the queue's head next expires at `deadline_ms` (none: nothing to
    /// expire). Only an earlier deadline than the one `entry` holds costs an operation; a later
    /// one waits for the held entry to fire. Called under the queue's lock.
    pub fn schedule_expiry(&self, entry: &mut ExpiryDeadline, deadline_ms: Option<u64>, queue: impl FnOnce() -> DeadlineQueue) {
        let Some(deadline_ms) = deadline_ms else { return };
        if entry.deadline_ms().is_some_and(|held_ms| held_ms <= deadline_ms) {
            return;
        }
        let (key, earliest) = self.deadlines.schedule(entry.key, deadline_ms, queue());
        entry.key = Some(key);
        if earliest {
            // A full backlog means the worker is awake and looks at the deadlines after it.
            let _ = self.sender.try_send(WorkerInput::Wake);
        }
    }

    /// Forgets the queue's entry (the queue is deleted).
    pub fn cancel_expiry(&self, entry: &mut ExpiryDeadline) {
        if let Some(key) = entry.key.take() {
            self.deadlines.cancel(key);
        }
    }
}

/// Starts the worker thread; it stops when the broker is dropped.
pub fn start(broker: Weak<Broker>, receiver: DeadLetterReceiver) {
    let spawned = std::thread::Builder::new().name("lepus-dead-letters".to_string()).spawn(move || run(broker, receiver));
    if let Err(error) = spawned {
        tracing::error!(%error, "the dead-letter thread could not start: dead letters stay in their queues' logs");
    }
}

fn run(broker: Weak<Broker>, receiver: DeadLetterReceiver) {
    let DeadLetterReceiver { receiver, deadlines } = receiver;
    loop {
        let received = receive(&receiver, &deadlines);
        let Some(broker) = broker.upgrade() else {
            return;
        };
        match received {
            Ok(WorkerInput::Batch(batch)) => publish_batch(
                broker.vhost(&batch.source.vhost),
                &broker.syncer,
                &broker.delayed,
                &|queues| broker.await_declared(queues),
                batch,
            ),
            Ok(WorkerInput::Wake) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        visit_due(&broker, &deadlines);
    }
}

/// Waits for a batch, a wake-up or the earliest deadline, whichever comes first.
fn receive(receiver: &Receiver<WorkerInput>, deadlines: &ExpiryDeadlines) -> Result<WorkerInput, RecvTimeoutError> {
    let now_ms = crate::queue_runtime::now_ms();
    let wait_ms = match deadlines.next_deadline_ms() {
        Some(deadline_ms) => deadline_ms.saturating_sub(now_ms).min(WORKER_SLEEP_MS_MAX),
        None => WORKER_SLEEP_MS_MAX,
    };
    receiver.recv_timeout(Duration::from_millis(wait_ms))
}

/// Visits the queues whose deadline passed: each expires its head, hands over its dead letters
/// and tells its next deadline.
fn visit_due(broker: &Broker, deadlines: &ExpiryDeadlines) {
    let now_ms = crate::queue_runtime::now_ms();
    for (key, queue) in deadlines.take_due(now_ms, DUE_QUEUES_PER_ROUND_MAX) {
        let batch = match queue {
            DeadlineQueue::Classic(queue) => queue.upgrade().and_then(|queue| queue.expire_due(key)),
            DeadlineQueue::Quorum(queue) => queue.upgrade().and_then(|queue| queue.expire_due(key)),
        };
        if let Some(batch) = batch {
            publish_batch(
                broker.vhost(&batch.source.vhost),
                &broker.syncer,
                &broker.delayed,
                &|queues| broker.await_declared(queues),
                batch,
            );
        }
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|elapsed| elapsed.as_secs()).unwrap_or(0)
}

/// Routes and publishes a batch in its vhost's `topology` (none: the vhost is gone, the letters
/// are dropped), then settles the logged letters in their source once the new queues hold them
/// safely. `await_declared` waits for the definitions of new queues among them
/// ([`crate::broker::Broker::await_declared`]): a synced log alone is not safe while its queue's
/// definition is not on disk, and a letter whose definition could not be stored stays in its source.
fn publish_batch(
    topology: Option<VhostTopology>,
    syncer: &Syncer,
    delayed_store: &crate::delayed::DelayedMessages,
    await_declared: &dyn Fn(&[Queue]) -> bool,
    batch: DeadLetterBatch,
) {
    let DeadLetterBatch { source, letters, scope } = batch;
    let now_s = now_s();
    let mut tickets = ConfirmTickets::default();
    let mut settled_positions: Vec<u64> = Vec::new();
    let mut held_positions: Vec<u64> = Vec::new();
    let mut queues: Vec<Queue> = Vec::new();
    for letter in letters {
        if letter.logged {
            settled_positions.push(letter.position);
        }
        let Some(topology) = &topology else {
            continue;
        };
        let Some(dead) = message::dead_lettered(&letter.message, &source.queue, letter.reason, &letter.target, now_s) else {
            if letter.held {
                // Properties that cannot be read never will be: keeping it would retry forever.
                tracing::error!(queue = %source.queue, "a held dead letter's properties are unreadable; it is dropped");
                held_positions.push(letter.position);
            }
            continue;
        };
        let dead_message = Arc::new(dead.message);
        queues.clear();
        {
            let vhost = topology.read();
            let mut properties = || dead_message.header.properties().ok();
            let mut delayed = Vec::new();
            // Every key routes (the CC keys too); a queue two keys reach holds the letter once.
            for routing_key in &dead.routing_keys {
                vhost.route(&dead_message.exchange, routing_key, &mut properties, &mut queues, &mut delayed);
            }
            dedup_queues(&mut queues);
            queues.retain(|queue| scope.takes(queue));
            if scope == DeadLetterScope::ShardFollower {
                delayed.clear();
            }
            // A dead-letter exchange that is a delayed one holds the letter back, as the plugin does.
            for route in delayed {
                let durable = vhost.exchange(&route.exchange).is_some_and(|exchange| exchange.durable);
                tickets.add(delayed_store.delay(&source.vhost, &route, &dead_message, durable));
            }
        }
        let mut published = false;
        let mut refused = false;
        for queue in &queues {
            let automatic = letter.reason != DeadLetterReason::Rejected;
            if automatic && message::is_cycle(queue.name().as_bytes(), &dead.deaths) {
                tracing::debug!(queue = %queue.name(), "a dead-letter cycle was cut");
                continue;
            }
            // A refusal (the new queue is full with reject-publish) drops the letter, as RabbitMQ
            // does at most once; a held letter stays in its source and is published again later.
            match queue.publish(dead_message.clone()) {
                PublishOutcome::Accepted(ticket) => {
                    tickets.add(ticket);
                    published = true;
                }
                PublishOutcome::Dropped => published = true,
                PublishOutcome::Rejected => refused = true,
            }
        }
        if published && dead_message.is_persistent() && !await_declared(&queues) {
            // Kept in its source: a logged letter comes back after a restart, a held one is
            // published again after the retry interval.
            if letter.logged {
                settled_positions.pop();
            }
            continue;
        }
        if letter.held && published && !refused {
            held_positions.push(letter.position);
        }
    }
    if held_positions.is_empty() {
        settle_when_held(syncer, &source, tickets, settled_positions);
    } else {
        settle_held_when_held(syncer, &source, tickets, held_positions);
    }
}

/// Settles held dead letters in their quorum source once `tickets` are settled (their new queues
/// hold them: a classic queue's log synced, a quorum queue's enqueue committed); not at all when
/// one failed: they stay held and are published again after the retry interval.
fn settle_held_when_held(syncer: &Syncer, source: &Arc<DeadLetterSource>, tickets: ConfirmTickets, positions: Vec<u64>) {
    let Some(queue) = source.quorum.clone() else {
        return;
    };
    let settle = move |durable: bool| {
        if !durable {
            tracing::warn!(count = positions.len(), "dead letters were not made durable in their new queues; kept in their quorum source");
            return;
        }
        if let Some(queue) = queue.upgrade() {
            queue.settle_dead_letters(&positions);
        }
    };
    if tickets.is_empty() {
        settle(true);
    } else {
        tickets.when_settled(syncer, Box::new(settle));
    }
}

/// Keeps the first of each queue in `queues` (few: the queues of one letter's keys).
fn dedup_queues(queues: &mut Vec<Queue>) {
    let mut index = 1;
    while index < queues.len() {
        if queues[..index].iter().any(|earlier| earlier.same(&queues[index])) {
            queues.remove(index);
        } else {
            index += 1;
        }
    }
}

/// Settles `positions` in the source's log once `tickets` are settled; not at all when they
/// failed (the messages stay in the source's log: a restart brings them back, a duplicate).
fn settle_when_held(syncer: &Syncer, source: &Arc<DeadLetterSource>, tickets: ConfirmTickets, positions: Vec<u64>) {
    let Some(log) = source.log.clone() else {
        return;
    };
    if positions.is_empty() {
        return;
    }
    let settle = move |durable: bool| {
        if !durable {
            tracing::warn!(count = positions.len(), "dead letters were not made durable in their new queues; kept in their source's log");
            return;
        }
        let mut log = log.lock();
        for position in positions {
            log.append_settled(position);
        }
    };
    if tickets.is_empty() {
        settle(true);
    } else {
        tickets.when_settled(syncer, Box::new(settle));
    }
}

#[cfg(test)]
mod tests;
