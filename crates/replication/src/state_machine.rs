//! The replicated state machine: quorum queues as `queue_core::QueueCore`s, changed only by
//! committed batches applied in log order. Every replica applies the same batches at the same
//! `now_ms` with the same capacity answer (`can_take` is always yes: the only limit the replicated
//! core sees is each consumer's prefetch, which came through the log), so every replica makes the
//! same deliveries: the delivery plan, performed only by the node hosting the consumer.
//!
//! Consumers and basic.gets belong to the proposer that added them (a proposer is one node
//! incarnation): the machine keeps who owns what, so when a node restarts or goes away its
//! consumers are cancelled and what they held comes back ([`QueueCommand::ReleaseNode`]).

use crate::command::{Batch, Body, DeduplicationKey, ProposedCommand, QueueCommand, QueueId};
use bytes::Bytes;
use queue_core::{Command, ConsumerRef, DeadLetterReason, Effect, Limits, Overflow, QueueCore, QueueState, Reply};
use std::collections::BTreeMap;

pub(crate) mod dead_letters;
pub mod deduplication;
pub mod delayed;
mod owners;

pub use dead_letters::{holds_dead_letters, HeldDeadLetter, HeldDeadLetters};
pub use deduplication::DeduplicationCache;
pub use delayed::{DelayedEntries, DelayedEntry};

/// What applying one command gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandResult {
    /// The queue core's answer (`Rejected`: reject-publish refused the message, a nack;
    /// `ExclusiveInUse`: a consumer was refused).
    Core(Reply),
    /// The queue was created (or existed): its id.
    Declared {
        /// The queue's id, to name it in later commands.
        queue: QueueId,
    },
    /// The queue was removed.
    Deleted,
    /// The queue was used ([`QueueCommand::Touch`]).
    Touched,
    /// basic.get found this message; unless it was `no_ack`, the proposer holds it until it
    /// settles, requeues or rejects it at `position`.
    Got {
        /// The message's position.
        position: u64,
        /// Whether it was handed out before.
        redelivered: bool,
        /// How many times it came back unsettled.
        delivery_count: u32,
        /// Ready messages left.
        message_count: u64,
        /// The message.
        body: Bytes,
    },
    /// No queue has this id (deleted, or never declared): refused.
    NoSuchQueue,
    /// A declaration of a name declared again since (a later incarnation exists): refused; the
    /// queue it declared was deleted, and its proposer's commands for it name no queue.
    Superseded,
    /// The proposer's sequence number is at or below the last one applied for it. Numbers are
    /// applied only in an unbroken run (see [`CommandResult::OutOfOrder`]), so this command was
    /// applied before: a retry. Not applied again; the proposer counts it as confirmed.
    Duplicate,
    /// The proposer's sequence number skips one not applied yet (an earlier batch was lost, or
    /// overtaken on its way to the leader): not applied. The proposer proposes everything
    /// unconfirmed again, in order.
    OutOfOrder,
    /// The proposer was released (its node was found gone): not applied. The proposer's node
    /// starts a new proposer and proposes again.
    Retired,
    /// An enqueue whose deduplication key the queue's cache holds: the message is not enqueued,
    /// and its publish is confirmed (as a classic queue's duplicate is).
    DuplicateMessage,
}

/// What the host learns from applying a committed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A command is committed and applied: its proposer confirms it (publisher confirm, settle
    /// done, consumer registered). Comes before the deliveries the same command made.
    Committed {
        /// The entry holding it.
        index: u64,
        /// The queue it named (0 for commands of no queue).
        queue: QueueId,
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
        /// The proposer owning the consumer.
        owner: u64,
        /// The consumer, as its owner names it.
        consumer: u64,
        /// The message's position (the key of its later settle).
        position: u64,
        /// Whether it was handed out before.
        redelivered: bool,
        /// How many times it came back unsettled (quorum queues' `x-delivery-count`).
        delivery_count: u32,
        /// The message (a shared slice: no copy).
        body: Bytes,
    },
    /// A message left its queue unconsumed (rejected, expired, over a length or delivery
    /// limit): the node that leads the shard dead-letters it when the queue has a dead-letter
    /// exchange (at most once, as RabbitMQ's quorum queues by default; at least once when
    /// `held`).
    Dropped {
        /// The entry whose commands dropped it.
        index: u64,
        /// The queue.
        queue: QueueId,
        /// Its position.
        position: u64,
        /// Why it left.
        reason: DeadLetterReason,
        /// The message.
        body: Bytes,
        /// The queue keeps it until a `SettleDeadLetter` of its position is applied (at-least-once
        /// dead-lettering, [`holds_dead_letters`]).
        held: bool,
    },
    /// A consumer is gone without its owner asking (its queue was deleted): its node tells the
    /// client (basic.cancel).
    ConsumerRemoved {
        /// The queue.
        queue: QueueId,
        /// The proposer owning the consumer.
        owner: u64,
        /// The consumer, as its owner names it.
        consumer: u64,
    },
}

/// One replicated queue.
#[derive(Debug)]
pub(crate) struct ReplicatedQueue {
    pub(crate) core: QueueCore<Body>,
    /// The limits as declared (and set by policies); the core gets [`core_limits`] of them.
    pub(crate) limits: Limits,
    /// The name it was declared with (empty: none), which finds it after a restart.
    pub(crate) name: Bytes,
    /// Which declaration of the name made it (see [`QueueCommand::Declare`]; 0: unordered).
    pub(crate) incarnation: u64,
    /// Dead letters kept until they are settled (at least once).
    pub(crate) held: HeldDeadLetters,
    /// With x-message-deduplication, the keys it enqueued (made at its first keyed message).
    pub(crate) deduplication: Option<Box<DeduplicationCache>>,
    /// The cluster's delay store's queue: the messages it holds back (made at the first one).
    pub(crate) delayed: Option<Box<DelayedEntries>>,
}

/// A declaration's fields (see [`QueueCommand::Declare`]).
struct Declaration {
    name: Bytes,
    incarnation: u64,
    limits: Limits,
    single_active_consumer: bool,
}

/// Who owns a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConsumerOwner {
    pub(crate) queue: QueueId,
    pub(crate) proposer: u64,
    /// The proposer's name for the consumer.
    pub(crate) local: u64,
}

/// A message handed to a consumer and not settled yet (see [`QueueStateMachine::checked_out_to`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedOut {
    /// Its queue.
    pub queue: QueueId,
    /// The owning proposer's name for the consumer.
    pub consumer: u64,
    /// Its position in the queue.
    pub position: u64,
    /// Whether the plan delivered it as a redelivery.
    pub redelivered: bool,
    /// How many times it came back before.
    pub delivery_count: u32,
    /// The message.
    pub body: Bytes,
}

/// Every quorum queue of one Raft group.
#[derive(Debug, Default)]
pub struct QueueStateMachine {
    /// Ordered, so iteration (snapshots) is the same on every replica.
    pub(crate) queues: BTreeMap<QueueId, ReplicatedQueue>,
    /// Queue ids by name.
    pub(crate) names: BTreeMap<Bytes, QueueId>,
    /// The last entry applied.
    pub(crate) applied_index: u64,
    /// The highest sequence number applied per proposer, applied without a gap from 1: so a
    /// number at or below it was applied, and a number past it + 1 waits for the ones before it.
    /// Bounded by the live proposers (one per node incarnation): [`QueueCommand::ReleaseNode`]
    /// forgets the released ones.
    pub(crate) last_sequences: BTreeMap<u64, u64>,
    /// The node of each registered proposer.
    pub(crate) proposers: BTreeMap<u64, u64>,
    /// Released proposers (their late commands are refused), the newest [`RETIRED_PROPOSERS_MAX`].
    pub(crate) retired: BTreeMap<u64, u64>,
    /// Consumers by the core's id.
    pub(crate) consumers: BTreeMap<u64, ConsumerOwner>,
    /// The core's consumer id by (owner, its name for the consumer, queue).
    pub(crate) consumer_ids: BTreeMap<(u64, u64, QueueId), u64>,
    /// The next consumer id the machine gives.
    pub(crate) next_consumer_id: u64,
    /// Messages basic.get handed out with an ack to come: (queue, position) -> proposer.
    pub(crate) get_holders: BTreeMap<(QueueId, u64), u64>,
    /// Reused between commands.
    effects: Vec<Effect<Body>>,
}

/// How many released proposers the machine remembers, refusing their commands; older ones are
/// forgotten (a command of a proposer released that long ago cannot still be in flight).
pub const RETIRED_PROPOSERS_MAX: usize = 4096;

/// Commands one batch may hold, as a power of two: the machine names a declared queue by its
/// entry index and its place in the batch.
const BATCH_PLACE_BITS: u32 = 12;

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
        self.queues.get(&queue).map(|queue| &queue.core)
    }

    /// With x-single-active-consumer, the consumer getting a queue's messages: its proposer and
    /// the proposer's name for it (management shows which one is active, as RabbitMQ does).
    pub fn single_active_consumer(&self, queue: QueueId) -> Option<(u64, u64)> {
        let active = self.queues.get(&queue)?.core.single_active_consumer()?;
        self.consumers.get(&active).map(|owner| (owner.proposer, owner.local))
    }

    /// The dead letters a queue keeps until they are settled (at-least-once dead-lettering).
    pub fn held_dead_letters(&self, queue: QueueId) -> Option<&HeldDeadLetters> {
        self.queues.get(&queue).map(|queue| &queue.held)
    }

    /// The id of the queue declared with `name`, and its incarnation.
    pub fn queue_by_name(&self, name: &[u8]) -> Option<(QueueId, u64)> {
        let id = self.names.get(name).copied()?;
        Some((id, self.queues.get(&id).map_or(0, |replicated| replicated.incarnation)))
    }

    /// Every queue's name (its shard's key: vhost, 0, name) and id.
    pub fn queue_names(&self) -> impl Iterator<Item = (&[u8], QueueId)> + '_ {
        self.names.iter().map(|(name, id)| (name.as_ref(), *id))
    }

    /// The ids of the queues.
    pub fn queue_ids(&self) -> impl Iterator<Item = QueueId> + '_ {
        self.queues.keys().copied()
    }

    /// The registered proposers and their nodes.
    pub fn proposers(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.proposers.iter().map(|(proposer, node)| (*proposer, *node))
    }

    /// Whether a proposer was released (its node gone): its commands are refused `Retired`.
    pub fn is_retired(&self, proposer: u64) -> bool {
        self.retired.contains_key(&proposer)
    }

    /// Whether a proposer owns a consumer or a basic.get's message.
    pub fn proposer_holds_anything(&self, proposer: u64) -> bool {
        self.consumers.values().any(|owner| owner.proposer == proposer) || self.get_holders.values().any(|holder| *holder == proposer)
    }

    /// Every message the delivery plan handed to a consumer of `proposer` and that is still
    /// unacked, by queue and position. The node of that proposer performs deliveries from the
    /// outcomes of the entries it applies; one that installed a snapshot skipped the entries it
    /// covers, and finds here the deliveries it never performed.
    pub fn checked_out_to(&self, proposer: u64) -> Vec<CheckedOut> {
        let mut checked_out = Vec::new();
        for (queue, replicated) in &self.queues {
            for (position, consumer, queued) in replicated.core.messages().unacked_held_by_consumers() {
                let Some(owner) = self.consumers.get(&consumer).filter(|owner| owner.proposer == proposer) else { continue };
                checked_out.push(CheckedOut {
                    queue: *queue,
                    consumer: owner.local,
                    position,
                    redelivered: queued.redelivered,
                    delivery_count: queued.delivery_count,
                    body: queued.message.0.clone(),
                });
            }
        }
        checked_out.sort_unstable_by_key(|message| (message.queue, message.position));
        checked_out
    }

    /// Marks an entry without commands (a leader's empty entry, a configuration change) applied.
    pub fn skip(&mut self, index: u64) {
        self.check_order(index);
        self.applied_index = index;
    }

    /// Applies the committed entry `index`, appending what the host must do to `outcomes`.
    pub fn apply(&mut self, index: u64, batch: Batch, outcomes: &mut Vec<Outcome>) {
        self.check_order(index);
        for (place, proposed) in batch.commands.into_iter().enumerate() {
            let ProposedCommand { queue, proposer, sequence, command } = proposed;
            let committed = outcomes.len();
            outcomes.push(Outcome::Committed { index, queue, proposer, sequence, result: CommandResult::Duplicate });
            let result = match self.admit(proposer, sequence) {
                Some(refusal) => refusal,
                None => {
                    let name = (index << BATCH_PLACE_BITS) | place as u64;
                    let context = Context { index, now_ms: batch.now_ms, proposer, fresh_id: name };
                    self.apply_command(context, queue, command, outcomes)
                }
            };
            if let Outcome::Committed { result: slot, .. } = &mut outcomes[committed] {
                *slot = result;
            }
        }
        self.applied_index = index;
    }

    /// Whether a command of `proposer` numbered `sequence` is applied now; the refusal if not.
    fn admit(&mut self, proposer: u64, sequence: u64) -> Option<CommandResult> {
        if self.retired.contains_key(&proposer) {
            return Some(CommandResult::Retired);
        }
        if sequence == 0 {
            return None;
        }
        let last = self.last_sequences.entry(proposer).or_insert(0);
        if sequence <= *last {
            return Some(CommandResult::Duplicate);
        }
        if sequence > *last + 1 {
            return Some(CommandResult::OutOfOrder);
        }
        *last = sequence;
        None
    }

    /// Applying out of order or twice would make replicas diverge: refuse loudly.
    fn check_order(&self, index: u64) {
        assert!(index > self.applied_index, "entry {index} applied after entry {}", self.applied_index);
    }

    fn apply_command(&mut self, context: Context, queue: QueueId, command: QueueCommand, outcomes: &mut Vec<Outcome>) -> CommandResult {
        let core_command = match command {
            QueueCommand::Declare { name, incarnation, limits, single_active_consumer } => {
                let declaration = Declaration { name, incarnation, limits, single_active_consumer };
                return self.declare(queue, context.fresh_id, declaration, outcomes);
            }
            QueueCommand::Delete => return self.delete(queue, outcomes),
            QueueCommand::Touch => {
                return match self.queues.contains_key(&queue) {
                    true => CommandResult::Touched,
                    false => CommandResult::NoSuchQueue,
                };
            }
            QueueCommand::RegisterProposer { node } => {
                self.proposers.insert(context.proposer, node);
                return CommandResult::Core(Reply::Ok);
            }
            QueueCommand::ReleaseNode { node, keep } => {
                self.release_node(context, node, keep, outcomes);
                return CommandResult::Core(Reply::Ok);
            }
            QueueCommand::AddConsumer { consumer, priority, prefetch } => {
                return self.add_consumer(context, queue, consumer, priority, prefetch, outcomes)
            }
            QueueCommand::CancelConsumer { consumer } => return self.cancel_consumer(context, queue, consumer, outcomes),
            QueueCommand::Get { no_ack } => return self.get(context, queue, no_ack, outcomes),
            QueueCommand::Enqueue { persistent, own_ttl_ms, body, deduplication } => {
                let enqueue = Command::Enqueue { message: Body(body), persistent, own_ttl_ms };
                if let Some(key) = deduplication {
                    return self.enqueue_deduplicated(context, queue, enqueue, key, outcomes);
                }
                if self.queues.get(&queue).is_some_and(ReplicatedQueue::refuses_publishes) {
                    return CommandResult::Core(Reply::Rejected);
                }
                enqueue
            }
            QueueCommand::Settle { position } => self.settling(queue, position, Command::Settle { position }),
            QueueCommand::Requeue { position } => self.settling(queue, position, Command::Requeue { position }),
            QueueCommand::RequeueToTail { position } => self.settling(queue, position, Command::RequeueToTail { position }),
            QueueCommand::Reject { position } => self.settling(queue, position, Command::Reject { position }),
            QueueCommand::Purge => {
                // RabbitMQ's purge drops the dead letters waiting too (`rabbit_fifo_dlx:purge`).
                if let Some(replicated) = self.queues.get_mut(&queue) {
                    replicated.held.take_all();
                }
                Command::Purge
            }
            QueueCommand::SetLimits { limits } => match self.queues.get_mut(&queue) {
                Some(replicated) => {
                    replicated.limits = limits;
                    replicated.release_held_dead_letters(context.index, queue, outcomes);
                    Command::SetLimits(core_limits(limits))
                }
                None => return CommandResult::NoSuchQueue,
            },
            QueueCommand::SettleDeadLetter { position } => {
                return match self.queues.get_mut(&queue) {
                    Some(replicated) => {
                        replicated.held.settle(position);
                        CommandResult::Core(Reply::Ok)
                    }
                    None => CommandResult::NoSuchQueue,
                };
            }
            QueueCommand::Expire => Command::Expire,
            QueueCommand::HoldDelayed { due_ms, origin, body } => {
                return self.hold_delayed(context, queue, DelayedEntry { due_ms, origin, body });
            }
            QueueCommand::ReleaseDelayed { id } => {
                return match self.queues.get_mut(&queue) {
                    Some(replicated) => {
                        if let Some(delayed) = replicated.delayed.as_mut() {
                            delayed.release(id);
                        }
                        CommandResult::Core(Reply::Ok)
                    }
                    None => CommandResult::NoSuchQueue,
                };
            }
        };
        match self.run(context, queue, core_command, outcomes) {
            Some(reply) => CommandResult::Core(reply),
            None => CommandResult::NoSuchQueue,
        }
    }

    /// Creates a queue, or answers with the one of its name. Of two incarnations of a name, the
    /// later wins: an earlier one still here was deleted before the later was declared (its
    /// deletion not committed yet), and an earlier declaration arriving late is refused.
    fn declare(&mut self, queue: QueueId, fresh_id: QueueId, declaration: Declaration, outcomes: &mut Vec<Outcome>) -> CommandResult {
        let Declaration { name, incarnation, limits, single_active_consumer } = declaration;
        if let Some(existing) = self.names.get(&name).copied().filter(|_| !name.is_empty()) {
            let existing_incarnation = self.queues.get(&existing).map_or(0, |replicated| replicated.incarnation);
            if incarnation == 0 || existing_incarnation == 0 || incarnation == existing_incarnation {
                return CommandResult::Declared { queue: existing };
            }
            if incarnation < existing_incarnation {
                return CommandResult::Superseded;
            }
            self.delete(existing, outcomes);
        }
        let id = if queue != 0 { queue } else { fresh_id };
        if let std::collections::btree_map::Entry::Vacant(slot) = self.queues.entry(id) {
            let core = QueueCore::new(QueueState::default(), core_limits(limits), None).with_single_active_consumer(single_active_consumer);
            let held = HeldDeadLetters::default();
            slot.insert(ReplicatedQueue { core, limits, name: name.clone(), incarnation, held, deduplication: None, delayed: None });
            if !name.is_empty() {
                self.names.insert(name, id);
            }
        }
        CommandResult::Declared { queue: id }
    }

    /// Enqueues a keyed message unless the queue's cache holds its key; records the key once the
    /// message is in (a message the queue did not take leaves no key). A duplicate is answered
    /// before reject-publish looks at the queue, as on classic queues (confirmed, not nacked).
    fn enqueue_deduplicated(
        &mut self,
        context: Context,
        queue: QueueId,
        enqueue: Command<Body>,
        key: DeduplicationKey,
        outcomes: &mut Vec<Outcome>,
    ) -> CommandResult {
        let Some(replicated) = self.queues.get_mut(&queue) else {
            return CommandResult::NoSuchQueue;
        };
        if replicated.deduplication.get_or_insert_with(Box::default).is_duplicate(&key.key, context.now_ms) {
            return CommandResult::DuplicateMessage;
        }
        if replicated.refuses_publishes() {
            return CommandResult::Core(Reply::Rejected);
        }
        let reply = self.run(context, queue, enqueue, outcomes);
        if let (Some(Reply::Ok), Some(cache)) =
            (&reply, self.queues.get_mut(&queue).and_then(|replicated| replicated.deduplication.as_mut()))
        {
            cache.record(&key, context.now_ms);
        }
        match reply {
            Some(reply) => CommandResult::Core(reply),
            None => CommandResult::NoSuchQueue,
        }
    }

    /// Holds a delayed message under the command's own id, unless the store is full.
    fn hold_delayed(&mut self, context: Context, queue: QueueId, entry: DelayedEntry) -> CommandResult {
        let Some(replicated) = self.queues.get_mut(&queue) else {
            return CommandResult::NoSuchQueue;
        };
        let delayed = replicated.delayed.get_or_insert_with(Box::default);
        if delayed.bytes() + entry.body.len() as u64 > crate::command::DELAYED_BYTES_MAX {
            return CommandResult::Core(Reply::Rejected);
        }
        delayed.hold(context.fresh_id, entry);
        CommandResult::Core(Reply::Ok)
    }

    /// The messages a queue holds back (the cluster's delay store), when it has held any.
    pub fn delayed(&self, queue: QueueId) -> Option<&DelayedEntries> {
        self.queues.get(&queue)?.delayed.as_deref()
    }

    /// A queue's deduplication cache, when it has had a keyed message.
    pub fn deduplication(&self, queue: QueueId) -> Option<&DeduplicationCache> {
        self.queues.get(&queue)?.deduplication.as_deref()
    }

    /// Settle, requeue and reject free a basic.get's message from its holder.
    fn settling(&mut self, queue: QueueId, position: u64, command: Command<Body>) -> Command<Body> {
        self.get_holders.remove(&(queue, position));
        command
    }

    /// Applies a core command to `queue`, then delivers what consumers can take; `None` when the
    /// queue does not exist.
    pub(crate) fn run(&mut self, context: Context, queue: QueueId, command: Command<Body>, outcomes: &mut Vec<Outcome>) -> Option<Reply> {
        let replicated = self.queues.get_mut(&queue)?;
        let mut can_take = |_: ConsumerRef| true;
        let reply = replicated.core.apply(command, context.now_ms, &mut can_take, &mut self.effects);
        replicated.core.apply(Command::Dispatch, context.now_ms, &mut can_take, &mut self.effects);
        self.emit(context.index, queue, outcomes);
        Some(reply)
    }

    /// Turns the effects of the last commands into outcomes.
    fn emit(&mut self, index: u64, queue: QueueId, outcomes: &mut Vec<Outcome>) {
        for effect in self.effects.drain(..) {
            match effect {
                Effect::Deliver { consumer: Some(consumer), position, queued, .. } => {
                    let Some(owner) = self.consumers.get(&consumer.id) else { continue };
                    outcomes.push(Outcome::Delivered {
                        index,
                        queue,
                        owner: owner.proposer,
                        consumer: owner.local,
                        position,
                        redelivered: queued.redelivered,
                        delivery_count: queued.delivery_count,
                        body: queued.message.0,
                    });
                }
                Effect::Drop { position, message, reason, .. } => {
                    let held = match self.queues.get_mut(&queue) {
                        Some(replicated) if holds_dead_letters(&replicated.limits) => {
                            replicated.held.hold(position, reason, message.0.clone());
                            true
                        }
                        _ => false,
                    };
                    outcomes.push(Outcome::Dropped { index, queue, position, reason, body: message.0, held });
                }
                _ => {}
            }
        }
    }

    fn get(&mut self, context: Context, queue: QueueId, no_ack: bool, outcomes: &mut Vec<Outcome>) -> CommandResult {
        let Some(replicated) = self.queues.get_mut(&queue) else {
            return CommandResult::NoSuchQueue;
        };
        let mut can_take = |_: ConsumerRef| true;
        let reply = replicated.core.apply(Command::Get { no_ack }, context.now_ms, &mut can_take, &mut self.effects);
        let mut got = None;
        self.effects.retain(|effect| match effect {
            Effect::Deliver { consumer: None, position, queued, .. } => {
                got = Some((*position, queued.redelivered, queued.delivery_count, queued.message.0.clone()));
                false
            }
            _ => true,
        });
        self.emit(context.index, queue, outcomes);
        match (reply, got) {
            (Reply::Got { message_count }, Some((position, redelivered, delivery_count, body))) => {
                if !no_ack {
                    self.get_holders.insert((queue, position), context.proposer);
                }
                CommandResult::Got { position, redelivered, delivery_count, message_count, body }
            }
            (reply, _) => CommandResult::Core(reply),
        }
    }

    fn delete(&mut self, queue: QueueId, outcomes: &mut Vec<Outcome>) -> CommandResult {
        let Some(removed) = self.queues.remove(&queue) else {
            return CommandResult::NoSuchQueue;
        };
        if !removed.name.is_empty() {
            self.names.remove(&removed.name);
        }
        self.get_holders.retain(|(holder_queue, _), _| *holder_queue != queue);
        let gone: Vec<u64> = self.consumers.iter().filter(|(_, owner)| owner.queue == queue).map(|(id, _)| *id).collect();
        for id in gone {
            if let Some(owner) = self.consumers.remove(&id) {
                self.consumer_ids.remove(&(owner.proposer, owner.local, queue));
                outcomes.push(Outcome::ConsumerRemoved { queue, owner: owner.proposer, consumer: owner.local });
            }
        }
        CommandResult::Deleted
    }
}

/// The limits the core enforces. With reject-publish, a quorum queue refuses a message only
/// while it is already over a limit (RabbitMQ 3.10.8, measured: x-max-length 1 takes two
/// messages and refuses the third), which the machine checks itself; the core enforces none.
pub(crate) fn core_limits(limits: Limits) -> Limits {
    match limits.overflow {
        Overflow::DropHead => limits,
        Overflow::RejectPublish => Limits { max_length: None, max_length_bytes: None, ..limits },
    }
}

impl ReplicatedQueue {
    /// Whether reject-publish refuses a message now: the queue is over a length limit. Dead
    /// letters it keeps count, as RabbitMQ's `is_over_limit` counts its discards.
    fn refuses_publishes(&self) -> bool {
        let limits = &self.limits;
        let messages = self.core.messages();
        let held = &self.held;
        limits.overflow == Overflow::RejectPublish
            && (limits.max_length.is_some_and(|max| messages.ready_count() as u64 + held.len() as u64 > max)
                || limits.max_length_bytes.is_some_and(|max| messages.ready_bytes() + held.payload_bytes() > max))
    }
}

/// Where and when a command is applied, and by whom.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context {
    pub(crate) index: u64,
    pub(crate) now_ms: u64,
    pub(crate) proposer: u64,
    /// An id no other command gets (entry index and place in the batch).
    pub(crate) fresh_id: u64,
}
