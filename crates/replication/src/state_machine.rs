//! The replicated state machine: quorum queues as `queue_core::QueueCore`s, changed only by
//! committed batches applied in log order. Every replica applies the same batches at the same
//! `now_ms` with the same capacity answer (`can_take` is always yes: the only limit the replicated
//! core sees is each consumer's prefetch, which came through the log), so every replica makes the
//! same deliveries: the delivery plan, performed only by the node hosting the consumer.

use crate::command::{Batch, Body, QueueCommand, QueueId};
use queue_core::{Command, ConsumerRef, Effect, Limits, QueueCore, QueueState, Reply};
use std::collections::BTreeMap;

/// What applying one command gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandResult {
    /// The queue core's answer (`Rejected`: reject-publish refused the message, a nack).
    Core(Reply),
    /// The queue was created (or existed).
    Declared,
    /// The queue was removed.
    Deleted,
    /// No queue has this id (deleted, or never declared): refused.
    NoSuchQueue,
    /// The proposer's sequence number is not above the last one applied for it: a retried
    /// command already applied (or one overtaken by a later command, hence never to be applied).
    /// Not applied again; the proposer treats a retry answered so as done.
    Duplicate,
}

/// What the host learns from applying a committed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A command is committed and applied: its proposer confirms it (publisher confirm, settle
    /// done, consumer registered).
    Committed {
        /// The entry holding it.
        index: u64,
        /// Who proposed it.
        proposer: u64,
        /// The proposer's sequence number.
        sequence: u64,
        /// Its result.
        result: CommandResult,
    },
    /// The plan hands this message to this consumer; the consumer's node sends it.
    Delivered {
        /// The entry whose commands made the delivery.
        index: u64,
        /// The queue.
        queue: QueueId,
        /// The consumer.
        consumer: u64,
        /// The message's position (the key of its later settle).
        position: u64,
        /// Whether it was handed out before.
        redelivered: bool,
        /// The message (a shared slice: no copy).
        body: bytes::Bytes,
    },
}

/// Every quorum queue of one Raft group.
#[derive(Debug, Default)]
pub struct QueueStateMachine {
    /// Ordered, so iteration (snapshots) is the same on every replica.
    pub(crate) queues: BTreeMap<QueueId, QueueCore<Body>>,
    /// The last entry applied.
    pub(crate) applied_index: u64,
    /// The highest sequence number applied per proposer. A proposer numbers its commands in
    /// the order it proposes them and retries a lost one under the same number; once a higher
    /// number is committed, a lower one not yet committed never will be (it was in an entry a new
    /// leader overwrote), so anything at or below the highest is a duplicate. Bounded by the
    /// number of proposers (one per node incarnation); pruning departed ones is a next step.
    pub(crate) last_sequences: BTreeMap<u64, u64>,
    /// Reused between commands.
    effects: Vec<Effect<Body>>,
}

impl QueueStateMachine {
    /// An empty machine (no queue, nothing applied).
    pub fn new() -> QueueStateMachine {
        QueueStateMachine::default()
    }

    /// The last entry applied.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// A queue's core, to read.
    pub fn queue(&self, queue: QueueId) -> Option<&QueueCore<Body>> {
        self.queues.get(&queue)
    }

    /// The ids of the queues.
    pub fn queue_ids(&self) -> impl Iterator<Item = QueueId> + '_ {
        self.queues.keys().copied()
    }

    /// Marks an entry without commands (a leader's empty entry, a configuration change) applied.
    pub fn skip(&mut self, index: u64) {
        self.check_order(index);
        self.applied_index = index;
    }

    /// Applies the committed entry `index`, appending what the host must do to `outcomes`.
    pub fn apply(&mut self, index: u64, batch: Batch, outcomes: &mut Vec<Outcome>) {
        self.check_order(index);
        for proposed in batch.commands {
            let result = match proposed.sequence {
                0 => self.apply_command(index, proposed.queue, proposed.command, batch.now_ms, outcomes),
                sequence => {
                    let last = self.last_sequences.entry(proposed.proposer).or_insert(0);
                    if sequence <= *last {
                        CommandResult::Duplicate
                    } else {
                        *last = sequence;
                        self.apply_command(index, proposed.queue, proposed.command, batch.now_ms, outcomes)
                    }
                }
            };
            outcomes.push(Outcome::Committed { index, proposer: proposed.proposer, sequence: proposed.sequence, result });
        }
        self.applied_index = index;
    }

    /// Applying out of order or twice would make replicas diverge: refuse loudly.
    fn check_order(&self, index: u64) {
        assert!(index > self.applied_index, "entry {index} applied after entry {}", self.applied_index);
    }

    fn apply_command(
        &mut self,
        index: u64,
        queue: QueueId,
        command: QueueCommand,
        now_ms: u64,
        outcomes: &mut Vec<Outcome>,
    ) -> CommandResult {
        let core_command = match command {
            QueueCommand::Declare => {
                self.queues.entry(queue).or_insert_with(|| QueueCore::new(QueueState::default(), Limits::NONE, None));
                return CommandResult::Declared;
            }
            QueueCommand::Delete => {
                return match self.queues.remove(&queue) {
                    Some(_) => CommandResult::Deleted,
                    None => CommandResult::NoSuchQueue,
                };
            }
            QueueCommand::Enqueue { persistent, own_ttl_ms, body } => Command::Enqueue { message: Body(body), persistent, own_ttl_ms },
            QueueCommand::AddConsumer { consumer, priority, prefetch } => {
                Command::AddConsumer { consumer, priority, exclusive: false, prefetch, no_ack: false }
            }
            QueueCommand::CancelConsumer { consumer } => Command::CancelConsumer { consumer },
            QueueCommand::Settle { position } => Command::Settle { position },
            QueueCommand::Requeue { position } => Command::Requeue { position },
            QueueCommand::Purge => Command::Purge,
        };
        let Some(core) = self.queues.get_mut(&queue) else {
            return CommandResult::NoSuchQueue;
        };
        let mut can_take = |_: ConsumerRef| true;
        let reply = core.apply(core_command, now_ms, &mut can_take, &mut self.effects);
        core.apply(Command::Dispatch, now_ms, &mut can_take, &mut self.effects);
        for effect in self.effects.drain(..) {
            if let Effect::Deliver { consumer: Some(consumer), position, queued, .. } = effect {
                outcomes.push(Outcome::Delivered {
                    index,
                    queue,
                    consumer: consumer.id,
                    position,
                    redelivered: queued.redelivered,
                    body: queued.message.0,
                });
            }
        }
        CommandResult::Core(reply)
    }
}
