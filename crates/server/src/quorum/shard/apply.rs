//! What this node does with the outcomes of committed entries: its own commands' waiters, its
//! consumers' deliveries, dead letters (as leader), and the figures of the queues touched.

use super::{Proposed, ShardWorker, Submission, Waiter};
use crate::dead_letter::DeadLetterScope;
use crate::quorum::queue::{Dispatched, QuorumQueue};
use crate::quorum::tickets::SlotOutcome;
use queue_core::Reply;
use replication::command::{QueueCommand, QueueId};
use replication::state_machine::{CommandResult, Outcome};
use std::sync::Arc;

impl ShardWorker {
    /// Handles one round's outcomes, in log order.
    pub(super) fn apply(&mut self, outcomes: Vec<Outcome>) {
        // The figures first: whoever waits for one of these commands (a consume, a purge) reads
        // them as soon as it is told, and must see its own command in them.
        let mut touched: Vec<QueueId> = Vec::new();
        for outcome in &outcomes {
            match outcome {
                Outcome::Committed { queue, result, .. } => {
                    note(&mut touched, *queue);
                    // A basic.get or a redeclare on any node is a use of the queue (x-expires)
                    // on every node: whichever node leads when the lease runs out must have seen it.
                    if matches!(result, CommandResult::Got { .. } | CommandResult::Core(Reply::Empty) | CommandResult::Touched) {
                        if let Some(queue) = self.queue(*queue) {
                            queue.mark_used();
                        }
                    }
                }
                Outcome::Delivered { queue, .. } | Outcome::Dropped { queue, .. } => note(&mut touched, *queue),
                Outcome::ConsumerRemoved { .. } => {}
            }
        }
        for id in touched {
            if let Some(queue) = self.queue(id) {
                queue.update_figures(self.node.machine(), id, self.proposer);
            }
        }
        for (sequence, result) in self.batcher.confirm(&outcomes) {
            self.progress_at_tick = self.ticks;
            self.time_commit(sequence);
            self.confirmed(sequence, result);
        }
        // Held (at-least-once) dead letters this node publishes as leader, once the whole round is
        // applied: a letter whose settle the same round applied (a log replayed) is not published.
        let mut held_drops: Vec<(QueueId, u64, queue_core::DeadLetterReason, bytes::Bytes)> = Vec::new();
        for outcome in outcomes {
            match outcome {
                Outcome::Committed { .. } => {}
                Outcome::Delivered { queue, owner, consumer, position, redelivered, delivery_count, body, .. } => {
                    if owner == self.proposer {
                        self.deliver(queue, consumer, position, redelivered, delivery_count, body);
                    }
                }
                Outcome::Dropped { queue, position, reason, body, held: true, .. } if self.node.is_leader() => {
                    // Published below once caught up; while a restarted node replays its log, the
                    // leader's scan publishes what is still held when the replay is done.
                    held_drops.push((queue, position, reason, body));
                }
                Outcome::Dropped { queue, position, reason, body, .. } => {
                    // At most once, as RabbitMQ's quorum queues dead-letter by default: the node
                    // that leads the shard when it applies the drop publishes the dead letter,
                    // except to other nodes' classic queues, which their own node publishes to
                    // when it applies the drop (classic queues take nothing through another node).
                    let scope = match self.node.is_leader() {
                        true => DeadLetterScope::ShardLeader,
                        false => DeadLetterScope::ShardFollower,
                    };
                    if let (Some(queue), Some(sender)) = (self.queue(queue), &self.dead_letters) {
                        queue.dead_letter(position, reason, &body, sender, scope);
                    }
                }
                Outcome::ConsumerRemoved { queue, owner, consumer } => {
                    if owner == self.proposer {
                        if let Some(handle) = self.queue(queue).and_then(|queue| queue.remove_local_consumer(consumer)) {
                            crate::broker::notify_cancelled(&[handle]);
                        }
                    }
                }
            }
        }
        self.publish_held_drops(held_drops);
        // After the outcomes: the release that retired the proposer cancelled its consumers above.
        self.renew_retired_proposer();
    }

    /// Hands the held dead letters of this round to the worker, those still held, per queue.
    fn publish_held_drops(&mut self, held_drops: Vec<(QueueId, u64, queue_core::DeadLetterReason, bytes::Bytes)>) {
        let Some(sender) = &self.dead_letters else { return };
        if held_drops.is_empty() || !self.node.caught_up() {
            return;
        }
        let mut held_drops = held_drops.into_iter().peekable();
        while let Some((id, position, reason, body)) = held_drops.next() {
            let mut letters = vec![(position, reason, body)];
            while let Some(next) = held_drops.next_if(|next| next.0 == id) {
                letters.push((next.1, next.2, next.3));
            }
            let (Some(queue), Some(held)) = (self.queue(id), self.node.machine().held_dead_letters(id)) else { continue };
            letters.retain(|(position, _, _)| held.contains(*position));
            if !letters.is_empty() {
                queue.publish_new_held_dead_letters(letters, sender);
            }
        }
    }

    /// The timed batch is committed once its last command is (a proposer's commands are
    /// confirmed in number order): the time since its proposal, retries included, is the sample.
    fn time_commit(&mut self, sequence: u64) {
        if let Some((last, proposed_at)) = self.latency_probe {
            if sequence >= last {
                let micros = u64::try_from(proposed_at.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.handle.figures.commit_latency_us.store(micros, std::sync::atomic::Ordering::Relaxed);
                self.latency_probe = None;
            }
        }
    }

    /// This node's `queue` is the machine's queue `id`: found by its commands' outcomes from now on.
    pub(super) fn bind(&mut self, queue: &Arc<QuorumQueue>, id: QueueId) {
        queue.set_id(id);
        self.queues.insert(id, Arc::downgrade(queue));
        queue.update_figures(self.node.machine(), id, self.proposer);
    }

    /// This node's queue with machine id `id`, if it has one.
    pub(super) fn queue(&self, id: QueueId) -> Option<Arc<QuorumQueue>> {
        self.queues.get(&id).and_then(|queue| queue.upgrade())
    }

    /// A command of this node's proposer was committed (or found a duplicate of one that was).
    fn confirmed(&mut self, sequence: u64, result: CommandResult) {
        // Commands are confirmed in number order, but for those a snapshot installed here holds:
        // their outcomes never came out, and they are confirmed when their retry comes back
        // `Duplicate`, after later ones. Failing them then (as this did) nacked committed publishes.
        let place = match self.proposed.front() {
            Some(front) if front.sequence == sequence => 0,
            _ => match self.proposed.binary_search_by_key(&sequence, |proposed| proposed.sequence) {
                Ok(place) => place,
                // A command without a waiter (the proposer's registration, a release).
                Err(_) => return,
            },
        };
        let Some(Proposed { queue, waiter, .. }) = self.proposed.remove(place) else { return };
        match result {
            CommandResult::Declared { queue: id } => self.bind(&queue, id),
            CommandResult::Superseded => {
                // This node applied the declaration late: the name was deleted and declared again
                // since. Its commands parked for the id (the deletion) now name no queue.
                tracing::debug!(shard = self.shard, queue = %queue.name(), "a quorum queue's declaration was superseded by a later one");
                queue.mark_superseded();
            }
            CommandResult::Duplicate if queue.id() == 0 => {
                // Only a queue's declaration is proposed before its id is known: this one was
                // applied in entries a snapshot installed here covered. Found by name instead.
                let found =
                    self.node.machine().queue_by_name(queue.name_key()).filter(|(_, incarnation)| queue.is_incarnation(*incarnation));
                if let Some((id, _)) = found {
                    self.bind(&queue, id);
                }
            }
            _ => {}
        }
        match waiter {
            Waiter::Nothing => {}
            Waiter::Publish(slot) => {
                let outcome = match result {
                    CommandResult::Core(Reply::Rejected) => SlotOutcome::Rejected,
                    _ => SlotOutcome::Accepted,
                };
                if let Some(gate) = slot.fill(outcome) {
                    if !self.gates.iter().any(|known| Arc::ptr_eq(known, &gate)) {
                        self.gates.push(gate);
                    }
                }
            }
            Waiter::Completion(completion) => completion.complete(result),
            Waiter::Get(request) => {
                if let Some(position) = request.queue().and_then(|queue| queue.answer_get(&request, &result)) {
                    self.admit(Submission { queue, command: QueueCommand::Requeue { position }, waiter: Waiter::Nothing });
                }
            }
        }
    }

    /// Hands a delivery of the plan to this node's consumer.
    pub(super) fn deliver(
        &mut self,
        id: QueueId,
        consumer: u64,
        position: u64,
        redelivered: bool,
        delivery_count: u32,
        body: bytes::Bytes,
    ) {
        let Some(queue) = self.queue(id) else {
            // The queue is gone from this node (deleted here): its deletion takes the message too.
            return;
        };
        match queue.deliver_local(consumer, position, redelivered, delivery_count, body) {
            Ok(None) => {}
            Ok(Some(Dispatched { settle, requeue })) => {
                for position in settle {
                    self.admit(Submission { queue: queue.clone(), command: QueueCommand::Settle { position }, waiter: Waiter::Nothing });
                }
                for position in requeue {
                    self.admit(Submission { queue: queue.clone(), command: QueueCommand::Requeue { position }, waiter: Waiter::Nothing });
                }
            }
            Err(consumer) => {
                let command = QueueCommand::CancelConsumer { consumer };
                self.admit(Submission { queue: queue.clone(), command, waiter: Waiter::Nothing });
                self.admit(Submission { queue, command: QueueCommand::Requeue { position }, waiter: Waiter::Nothing });
            }
        }
    }
}

fn note(touched: &mut Vec<QueueId>, queue: QueueId) {
    if queue != 0 && !touched.contains(&queue) {
        touched.push(queue);
    }
}
