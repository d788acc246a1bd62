//! Consumers and their owners: adding and cancelling them by the owner's own names, and releasing
//! everything a gone node's proposers held.

use super::{CommandResult, ConsumerOwner, Context, Outcome, QueueStateMachine, RETIRED_PROPOSERS_MAX};
use crate::command::QueueId;
use queue_core::{Command, Reply};

impl QueueStateMachine {
    pub(super) fn add_consumer(
        &mut self,
        context: Context,
        queue: QueueId,
        local: u64,
        priority: i64,
        prefetch: u32,
        outcomes: &mut Vec<Outcome>,
    ) -> CommandResult {
        if !self.queues.contains_key(&queue) {
            return CommandResult::NoSuchQueue;
        }
        let key = (context.proposer, local, queue);
        if self.consumer_ids.contains_key(&key) {
            // The same consumer twice: the first stands.
            return CommandResult::Core(Reply::Ok);
        }
        let id = self.next_consumer_id;
        self.next_consumer_id += 1;
        // Registered before the core runs, so the deliveries of this very command find their owner.
        self.consumers.insert(id, ConsumerOwner { queue, proposer: context.proposer, local });
        self.consumer_ids.insert(key, id);
        let command = Command::AddConsumer { consumer: id, priority, exclusive: false, prefetch, no_ack: false };
        let reply = self.run(context, queue, command, outcomes).unwrap_or(Reply::ConsumerNotFound);
        if reply != Reply::Ok {
            self.consumers.remove(&id);
            self.consumer_ids.remove(&key);
        }
        CommandResult::Core(reply)
    }

    pub(super) fn cancel_consumer(&mut self, context: Context, queue: QueueId, local: u64, outcomes: &mut Vec<Outcome>) -> CommandResult {
        let Some(id) = self.consumer_ids.remove(&(context.proposer, local, queue)) else {
            return match self.queues.contains_key(&queue) {
                true => CommandResult::Core(Reply::ConsumerNotFound),
                false => CommandResult::NoSuchQueue,
            };
        };
        self.consumers.remove(&id);
        match self.run(context, queue, Command::CancelConsumer { consumer: id }, outcomes) {
            Some(reply) => CommandResult::Core(reply),
            None => CommandResult::NoSuchQueue,
        }
    }

    /// Releases every proposer of `node` but `keep`: consumers cancelled, held messages back.
    pub(super) fn release_node(&mut self, context: Context, node: u64, keep: u64, outcomes: &mut Vec<Outcome>) {
        let released: Vec<u64> = self
            .proposers
            .iter()
            .filter(|(proposer, owner_node)| **owner_node == node && **proposer != keep)
            .map(|(proposer, _)| *proposer)
            .collect();
        for proposer in released {
            self.release_proposer(context, proposer, outcomes);
        }
    }

    fn release_proposer(&mut self, context: Context, proposer: u64, outcomes: &mut Vec<Outcome>) {
        let owned: Vec<(u64, ConsumerOwner)> =
            self.consumers.iter().filter(|(_, owner)| owner.proposer == proposer).map(|(id, owner)| (*id, *owner)).collect();
        for (id, owner) in owned {
            self.consumers.remove(&id);
            self.consumer_ids.remove(&(owner.proposer, owner.local, owner.queue));
            let held = match self.queues.get(&owner.queue) {
                Some(queue) => queue.core.messages().unacked_positions_held_by(id),
                None => continue,
            };
            self.run(context, owner.queue, Command::CancelConsumer { consumer: id }, outcomes);
            for position in held {
                self.run(context, owner.queue, Command::Requeue { position }, outcomes);
            }
        }
        let gets: Vec<(QueueId, u64)> = self.get_holders.iter().filter(|(_, holder)| **holder == proposer).map(|(key, _)| *key).collect();
        for (queue, position) in gets {
            self.get_holders.remove(&(queue, position));
            self.run(context, queue, Command::Requeue { position }, outcomes);
        }
        self.proposers.remove(&proposer);
        self.last_sequences.remove(&proposer);
        self.retired.insert(proposer, context.index);
        while self.retired.len() > RETIRED_PROPOSERS_MAX {
            // The oldest release goes first: the lowest entry index.
            let oldest = self.retired.iter().min_by_key(|(_, index)| **index).map(|(proposer, _)| *proposer);
            match oldest {
                Some(oldest) => self.retired.remove(&oldest),
                None => break,
            };
        }
    }
}
