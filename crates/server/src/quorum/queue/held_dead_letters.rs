//! At-least-once dead-lettering on the node that leads a quorum queue's shard: the letters the
//! replicated machine holds ([`replication::state_machine::HeldDeadLetters`]) are handed to the
//! dead-letter worker, which proposes their settle ([`QuorumQueue::settle_dead_letters`]) once
//! every queue they were routed to holds them. A letter not settled (it routed nowhere, a target
//! refused it, a target's commit failed) stays held and is published again once the retry
//! interval passed since its last publish, as RabbitMQ's `rabbit_fifo_dlx_worker` does after its
//! `dead_letter_worker_publisher_confirm_timeout`.

use super::{envelope, now_ms, QuorumQueue, Submission, Waiter};
use crate::dead_letter::{DeadLetter, DeadLetterBatch, DeadLetterScope, DeadLetterSender};
use crate::quorum::shard::ShardInput;
use bytes::Bytes;
use queue_core::DeadLetterReason;
use replication::command::QueueCommand;
use replication::state_machine::HeldDeadLetters;

/// The most held letters one batch hands the worker.
pub const HELD_LETTERS_PER_BATCH_MAX: usize = 256;

/// The most held letters of one queue a scan publishes again; the rest wait for the next scan.
pub const HELD_LETTERS_PER_SCAN_MAX: usize = 16_384;

impl QuorumQueue {
    /// Letters the shard just held (this node leads it): handed to the worker now.
    pub(crate) fn publish_new_held_dead_letters(&self, letters: Vec<(u64, DeadLetterReason, Bytes)>, sender: &DeadLetterSender) {
        self.publish_held(letters.into_iter(), now_ms(), sender);
    }

    /// A scan of the letters `held` (this node leads the shard): publishes those not in flight,
    /// or in flight for `retry_interval_ms` and more. Forgets in-flight entries no longer held.
    pub(crate) fn publish_due_held_dead_letters(&self, held: &HeldDeadLetters, retry_interval_ms: u64, sender: &DeadLetterSender) {
        let now = now_ms();
        let due: Vec<(u64, DeadLetterReason, Bytes)> = {
            let mut in_flight = self.dead_letters_in_flight.lock();
            in_flight.retain(|position, _| held.contains(*position));
            held.iter()
                .filter(|(position, _)| in_flight.get(position).is_none_or(|sent_ms| sent_ms.saturating_add(retry_interval_ms) <= now))
                .take(HELD_LETTERS_PER_SCAN_MAX)
                .map(|(position, letter)| (position, letter.reason, letter.body.clone()))
                .collect()
        };
        self.publish_held(due.into_iter(), now, sender);
    }

    /// Forgets what is in flight (this node no longer leads the shard: when it leads again, it
    /// publishes everything held).
    pub(crate) fn forget_dead_letters_in_flight(&self) {
        self.dead_letters_in_flight.lock().clear();
    }

    /// Proposes the settle of held letters every new queue holds.
    pub(crate) fn settle_dead_letters(&self, positions: &[u64]) {
        {
            let mut in_flight = self.dead_letters_in_flight.lock();
            for position in positions {
                in_flight.remove(position);
            }
        }
        let queue = self.strong();
        let submissions = positions
            .iter()
            .map(|&position| Submission {
                queue: queue.clone(),
                command: QueueCommand::SettleDeadLetter { position },
                waiter: Waiter::Nothing,
            })
            .collect();
        self.shard.send(ShardInput::SubmitMany(submissions));
    }

    fn publish_held(&self, letters: impl Iterator<Item = (u64, DeadLetterReason, Bytes)>, now: u64, sender: &DeadLetterSender) {
        // The target as the queue's limits have it now (a policy may have changed it since).
        let Some(target) = self.limits.lock().dead_letter.clone() else { return };
        let mut batch = Vec::new();
        let mut letters = letters.peekable();
        while letters.peek().is_some() {
            batch.clear();
            for (position, reason, body) in letters.by_ref().take(HELD_LETTERS_PER_BATCH_MAX) {
                match envelope::decode(&body) {
                    Ok(message) => batch.push(DeadLetter { position, logged: false, held: true, message, reason, target: target.clone() }),
                    Err(error) => tracing::error!(queue = %self.name(), %error, "a held dead letter cannot be decoded; it stays held"),
                }
            }
            let positions: Vec<u64> = batch.iter().map(|letter| letter.position).collect();
            // In flight before the worker may settle them (a settle removes the entry).
            {
                let mut in_flight = self.dead_letters_in_flight.lock();
                for position in &positions {
                    in_flight.insert(*position, now);
                }
            }
            let letters = std::mem::take(&mut batch);
            let handed = DeadLetterBatch { source: self.dead_letter_source.clone(), letters, scope: DeadLetterScope::ShardLeader };
            if sender.try_send(handed).is_err() {
                // The worker's backlog is full: these wait for the next scan.
                let mut in_flight = self.dead_letters_in_flight.lock();
                for position in positions {
                    in_flight.remove(&position);
                }
                return;
            }
        }
    }
}
