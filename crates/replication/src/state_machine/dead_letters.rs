//! At-least-once dead-lettering (RabbitMQ's `rabbit_fifo_dlx`): a quorum queue with
//! `x-dead-letter-strategy: at-least-once` and `x-overflow: reject-publish` keeps each message it
//! drops (rejected, expired, over its delivery limit) in its replicated state until a
//! [`QueueCommand::SettleDeadLetter`](crate::command::QueueCommand::SettleDeadLetter) says every
//! queue it was dead-lettered to holds it. A leader change or a crash between the drop and the
//! settle leaves the letter here, and the next leader publishes it again (a duplicate, never a loss).
//! Held letters count toward the queue's length limits, as RabbitMQ counts its `messages_dlx`.

use super::{Outcome, ReplicatedQueue};
use crate::command::Body;
use bytes::Bytes;
use queue_core::{DeadLetterReason, Limits, Overflow};
use std::collections::BTreeMap;

/// One dead letter a queue keeps until it is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldDeadLetter {
    /// Why it left the queue.
    pub reason: DeadLetterReason,
    /// The message as the queue held it.
    pub body: Bytes,
}

/// A queue's dead letters waiting for their settle, by their position in the queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldDeadLetters {
    letters: BTreeMap<u64, HeldDeadLetter>,
    /// Their payload bytes (as `x-max-length-bytes` counts them).
    payload_bytes: u64,
}

impl HeldDeadLetters {
    /// Keeps the letter at `position`.
    pub(crate) fn hold(&mut self, position: u64, reason: DeadLetterReason, body: Bytes) {
        let bytes = Body(body.clone()).payload_bytes();
        if let Some(replaced) = self.letters.insert(position, HeldDeadLetter { reason, body }) {
            // Positions are never reused within a queue; keep the count right all the same.
            self.payload_bytes -= Body(replaced.body).payload_bytes();
        }
        self.payload_bytes += bytes;
    }

    /// Forgets the letter at `position` (its new queues hold it); false when it was not held.
    pub(crate) fn settle(&mut self, position: u64) -> bool {
        match self.letters.remove(&position) {
            Some(letter) => {
                self.payload_bytes -= Body(letter.body).payload_bytes();
                true
            }
            None => false,
        }
    }

    /// Takes every letter out, in position order.
    pub(crate) fn take_all(&mut self) -> BTreeMap<u64, HeldDeadLetter> {
        self.payload_bytes = 0;
        std::mem::take(&mut self.letters)
    }

    /// Whether the letter at `position` waits.
    pub fn contains(&self, position: u64) -> bool {
        self.letters.contains_key(&position)
    }

    /// How many letters wait.
    pub fn len(&self) -> usize {
        self.letters.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.letters.is_empty()
    }

    /// Their payload bytes.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }

    /// The letters, in position order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &HeldDeadLetter)> + '_ {
        self.letters.iter().map(|(position, letter)| (*position, letter))
    }
}

/// Whether a queue with `limits` keeps its dead letters until they are settled: at least once
/// is asked for, and effective only with reject-publish (RabbitMQ falls back to at most once
/// otherwise: the server logs that when it sets the limits).
pub fn holds_dead_letters(limits: &Limits) -> bool {
    limits.dead_letters && limits.dead_letter_at_least_once && limits.overflow == Overflow::RejectPublish
}

impl ReplicatedQueue {
    /// New limits no longer keep dead letters: what is held leaves at most once, as RabbitMQ's
    /// quorum queues do when their strategy changes.
    pub(crate) fn release_held_dead_letters(&mut self, index: u64, queue: u64, outcomes: &mut Vec<Outcome>) {
        if holds_dead_letters(&self.limits) || self.held.is_empty() {
            return;
        }
        for (position, letter) in self.held.take_all() {
            outcomes.push(Outcome::Dropped { index, queue, position, reason: letter.reason, body: letter.body, held: false });
        }
    }
}

/// A reason's number in snapshot images.
pub(crate) fn reason_code(reason: DeadLetterReason) -> u8 {
    match reason {
        DeadLetterReason::MaxLength => 0,
        DeadLetterReason::Expired => 1,
        DeadLetterReason::Rejected => 2,
        DeadLetterReason::DeliveryLimit => 3,
    }
}

/// See [`reason_code`].
pub(crate) fn reason_from_code(code: u8) -> Option<DeadLetterReason> {
    match code {
        0 => Some(DeadLetterReason::MaxLength),
        1 => Some(DeadLetterReason::Expired),
        2 => Some(DeadLetterReason::Rejected),
        3 => Some(DeadLetterReason::DeliveryLimit),
        _ => None,
    }
}
