//! The shard's dealings with the other nodes: their Raft messages, checked before they are
//! stepped; nodes gone quiet, whose consumers' messages the leader gives back; and queues whose
//! ids are found once the shard caught up.

use super::{Proposed, ShardWorker, Submission, Waiter, BATCH_BYTES_MAX, UNCONFIRMED_COMMANDS_MAX};
use replication::batcher::Batcher;
use replication::command::QueueCommand;
use replication::Message;

impl ShardWorker {
    /// A Raft message from a peer: stepped once it passed the node's checks (raft-rs panics on
    /// some impossible inputs, which a faulty or foreign peer could send).
    pub(super) fn step_peer(&mut self, message: Message) {
        let from = message.from;
        if self.node.voters().is_empty() && self.node.learners().is_empty() {
            // A node that joined and does not know the founding voters yet: its log cannot start.
            return;
        }
        let known = self.node.is_member(from)
            || self.config.voters.contains(&from)
            || self.members_target.read().as_ref().is_some_and(|members| members.contains(&from));
        if from == self.config.node_id || !known {
            tracing::warn!(shard = self.shard, from, "a raft message from a node that is not a member was dropped");
            return;
        }
        self.last_heard.insert(from, self.ticks);
        self.released.remove(&from);
        if self.take_write_notice(&message) || self.refuse_while_held(&message) {
            return;
        }
        if let Err(refused) = self.node.step_checked(message) {
            tracing::warn!(shard = self.shard, from, %refused, "a raft message was refused");
        }
    }

    /// As leader: releases the consumers and basic.gets of nodes not heard from for
    /// `node_down_ticks`, so their unacked messages are redelivered to consumers elsewhere (as
    /// RabbitMQ's quorum queues return a gone node's checked-out messages).
    pub(super) fn release_gone_nodes(&mut self) {
        if !self.node.is_leader() || self.ticks < self.config.node_down_ticks {
            return;
        }
        let machine = self.node.machine();
        let mut gone = Vec::new();
        for (proposer, node) in machine.proposers() {
            if node == self.config.node_id || self.released.contains_key(&node) || gone.contains(&node) {
                continue;
            }
            let heard = self.last_heard.get(&node).copied().unwrap_or(0);
            if self.ticks >= heard + self.config.node_down_ticks && machine.proposer_holds_anything(proposer) {
                gone.push(node);
            }
        }
        for node in gone {
            tracing::warn!(shard = self.shard, node, "a node went quiet: its consumers' messages are given back");
            self.released.insert(node, self.ticks);
            if self.batcher.push(0, QueueCommand::ReleaseNode { node, keep: 0 }).is_err() {
                self.released.remove(&node);
            }
        }
    }

    /// The leader released this node while it was cut off (longer than `node_down_ticks`, with
    /// consumers or basic.gets): its consumers were cancelled, their messages given back, and the
    /// machine refuses this proposer's commands for good. The node carries on under a new
    /// proposer, registered first, with every unconfirmed command proposed again in order under
    /// new numbers, each keeping its waiter (a publisher's confirm, a declare's answer).
    pub(super) fn renew_retired_proposer(&mut self) {
        // Learnt from the machine as soon as the release is applied here (a node with nothing to
        // propose would not hear it from a refused command; a `Retired` result comes from this
        // node's own apply of the release, so the machine knows it first).
        if !self.node.machine().is_retired(self.proposer) {
            return;
        }
        let proposer = rand::random::<u64>() | 1;
        tracing::warn!(
            shard = self.shard,
            old = self.batcher.proposer(),
            new = proposer,
            "this node was released as gone by the shard's leader; it goes on under a new proposer"
        );
        let mut old = std::mem::replace(&mut self.batcher, Batcher::new(proposer, BATCH_BYTES_MAX, UNCONFIRMED_COMMANDS_MAX));
        self.proposer = proposer;
        self.batcher.push(0, QueueCommand::RegisterProposer { node: self.config.node_id }).expect("an empty batcher has room");
        let mut waiting: std::collections::HashMap<u64, Proposed> =
            self.proposed.drain(..).map(|proposed| (proposed.sequence, proposed)).collect();
        for command in old.take_unconfirmed() {
            let waiter = waiting.remove(&command.sequence);
            match self.batcher.push(command.queue, command.command) {
                Ok(sequence) => {
                    if let Some(Proposed { queue, waiter, .. }) = waiter {
                        self.proposed.push_back(Proposed { sequence, queue, waiter });
                    }
                }
                Err(_) => {
                    if let Some(proposed) = waiter {
                        super::fail(proposed.waiter);
                    }
                }
            }
        }
        // Waiters whose command the old batcher no longer held (none expected): told it failed.
        for (_, proposed) in waiting {
            super::fail(proposed.waiter);
        }
        self.proposed_to = (None, 0);
        // The release cancelled this node's consumers in the machine and gave their messages
        // back; their clients are told, as for a deleted queue, and may consume again.
        let released: Vec<_> =
            self.queues.values().filter_map(|queue| queue.upgrade()).flat_map(|queue| queue.release_local_consumers()).collect();
        crate::broker::notify_cancelled(&released);
    }

    /// Commands parked until their queue's id was known, and queues recovered at start: once the
    /// shard applied its log, a recovered queue is found by name (or declared again, empty, if
    /// the shard never committed its declaration).
    pub(super) fn resolve(&mut self) {
        if !self.recovered.is_empty() && self.node.caught_up() {
            for queue in std::mem::take(&mut self.recovered) {
                if queue.is_deleted() {
                    // A cluster's replayed declaration whose deletion was replayed too.
                    continue;
                }
                match self.node.machine().queue_by_name(queue.name_key()).filter(|(_, incarnation)| queue.is_incarnation(*incarnation)) {
                    Some((id, _)) => self.bind(&queue, id),
                    None => {
                        // Or the shard holds an earlier incarnation of the name, whose deletion did
                        // not commit: the declaration replaces it.
                        tracing::warn!(queue = %queue.name(), "a quorum queue of the definitions is not in its shard; declared again, empty");
                        let command = queue.declaration();
                        self.admit(Submission { queue, command, waiter: Waiter::Nothing });
                    }
                }
            }
        }
        if self.unresolved.iter().any(|submission| submission.queue.id() != 0) {
            let (ready, waiting): (Vec<Submission>, Vec<Submission>) =
                std::mem::take(&mut self.unresolved).into_iter().partition(|submission| submission.queue.id() != 0);
            self.unresolved = waiting;
            for submission in ready {
                self.admit(submission);
            }
        }
    }
}
