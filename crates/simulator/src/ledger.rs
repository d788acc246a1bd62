//! What the simulated clients know: every publish, its confirm, and what became of it. The
//! invariants are checked against it.

use crate::message::{publisher_of, sequence_of, MessageId};
use std::collections::BTreeMap;

/// How a message left its queue for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// A consumer acked it.
    Acked,
    /// A consumer rejected it without requeue.
    Rejected,
    /// Its TTL passed.
    Expired,
    /// Its queue was deleted (delete-ok received, or recovery showed the queue gone).
    QueueDeleted,
}

/// What became of a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// In its queue (ready, unacked or paged).
    Live,
    /// Settled; `durable` once a sync of its queue's log that came after the settle succeeded,
    /// so it must never come back.
    Settled { how: Settlement, durable: bool },
    /// Never confirmed, and lost with a power cut (allowed).
    Lost,
}

/// One publish.
#[derive(Debug, Clone)]
pub struct Publish {
    /// The queue it went to.
    pub queue: usize,
    /// Its TTL.
    pub ttl_ms: Option<u64>,
    /// The simulated clock when it was published.
    pub published_at_ms: u64,
    /// The publisher confirm: none yet, ack (`true`) or nack.
    pub confirmed: Option<bool>,
    /// What became of it.
    pub fate: Fate,
}

/// A broken invariant, with what the simulator knew at the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl std::fmt::Display for Violation {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// Fails with a [`Violation`] built from the format arguments.
macro_rules! violation {
    ($($argument:tt)*) => { return Err($crate::ledger::Violation(format!($($argument)*)).into()) };
}
pub(crate) use violation;

/// Every publish of the run, by id.
#[derive(Debug, Default)]
pub struct Ledger {
    publishes: BTreeMap<MessageId, Publish>,
    /// Per queue and publisher, the sequence number of the last first delivery (not redelivered).
    first_deliveries: BTreeMap<(usize, u16), u64>,
    /// Messages whose fate is [`Fate::Live`], per queue.
    live_per_queue: Vec<u64>,
}

impl Ledger {
    /// A ledger without queues.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// A queue is declared (a new incarnation, as the catalog indexes it).
    pub fn add_queue(&mut self) -> usize {
        self.live_per_queue.push(0);
        self.live_per_queue.len() - 1
    }

    /// `queue` is gone for good (deleted): its messages are settled, durably, and none of them
    /// may come back, under that queue or any other.
    pub fn queue_gone(&mut self, queue: usize) {
        for publish in self.publishes.values_mut().filter(|publish| publish.queue == queue) {
            match publish.fate {
                Fate::Live => publish.fate = Fate::Settled { how: Settlement::QueueDeleted, durable: true },
                Fate::Settled { how, .. } => publish.fate = Fate::Settled { how, durable: true },
                Fate::Lost => {}
            }
        }
        self.live_per_queue[queue] = 0;
    }

    /// `queue`'s declare was never answered and recovery shows it gone: its confirmed messages
    /// are lost (a confirm promised them); the unconfirmed ones went with the power.
    pub fn queue_never_declared(&mut self, queue: usize) -> Result<(), Violation> {
        for (id, publish) in self.publishes.iter().filter(|(_, publish)| publish.queue == queue) {
            if publish.fate == Fate::Live && publish.confirmed == Some(true) {
                violation!(
                    "queue {queue}: confirmed message {id:x} lost in a power cut with its queue, whose declare never reached the disk"
                );
            }
        }
        self.queue_gone(queue);
        Ok(())
    }

    /// Records a publish (live until it is settled or lost).
    pub fn publish(&mut self, id: MessageId, queue: usize, ttl_ms: Option<u64>, now_ms: u64) {
        let publish = Publish { queue, ttl_ms, published_at_ms: now_ms, confirmed: None, fate: Fate::Live };
        assert!(self.publishes.insert(id, publish).is_none(), "message id {id:x} published twice");
        self.live_per_queue[queue] += 1;
    }

    /// The publish `id`, if there was one.
    pub fn get(&self, id: MessageId) -> Option<&Publish> {
        self.publishes.get(&id)
    }

    /// Every publish.
    pub fn publishes(&self) -> impl Iterator<Item = (&MessageId, &Publish)> {
        self.publishes.iter()
    }

    /// Live messages in `queue`, by the ledger.
    pub fn live_in(&self, queue: usize) -> u64 {
        self.live_per_queue[queue]
    }

    /// A publisher confirm arrived.
    pub fn confirm(&mut self, id: MessageId, acked: bool) -> Result<(), Violation> {
        let Some(publish) = self.publishes.get_mut(&id) else { violation!("a confirm for {id:x}, never published") };
        if publish.confirmed.is_some() {
            violation!("message {id:x} confirmed twice");
        }
        publish.confirmed = Some(acked);
        Ok(())
    }

    /// A message left its queue for good.
    pub fn settle(&mut self, id: MessageId, how: Settlement) -> Result<(), Violation> {
        let Some(publish) = self.publishes.get_mut(&id) else { violation!("settled {id:x}, never published") };
        if publish.fate != Fate::Live {
            violation!("message {id:x} settled ({how:?}) while {:?}", publish.fate);
        }
        publish.fate = Fate::Settled { how, durable: false };
        self.live_per_queue[publish.queue] -= 1;
        Ok(())
    }

    /// A sync that followed these settles succeeded: they must never come back.
    pub fn settles_durable(&mut self, ids: &[MessageId]) {
        for id in ids {
            if let Some(Publish { fate: Fate::Settled { durable, .. }, .. }) = self.publishes.get_mut(id) {
                *durable = true;
            }
        }
    }

    /// A first delivery (not flagged redelivered) to the only consumer of `queue`: each
    /// publisher's messages come in the order they were published.
    pub fn first_delivery_in_order(&mut self, queue: usize, id: MessageId) -> Result<(), Violation> {
        let key = (queue, publisher_of(id));
        let sequence = sequence_of(id);
        if let Some(last) = self.first_deliveries.insert(key, sequence) {
            if sequence <= last {
                violation!("queue {queue}: publisher {} message {sequence} delivered first after its message {last}", key.1);
            }
        }
        Ok(())
    }

    /// After a restart: `recovered` (sorted ids) is what `queue`'s log gave back. Every confirmed
    /// live message must be there, no durably settled one may be, and one settled without a
    /// durable record may come back (at-least-once): it is live again. Unconfirmed live ones
    /// that are missing were lost with the power, as allowed.
    pub fn recovered(&mut self, queue: usize, recovered: &[MessageId]) -> Result<(), Violation> {
        for (id, publish) in self.publishes.iter_mut().filter(|(_, publish)| publish.queue == queue) {
            let found = recovered.binary_search(id).is_ok();
            match (publish.fate, found) {
                (Fate::Live, false) if publish.confirmed == Some(true) => {
                    violation!("queue {queue}: confirmed message {id:x} lost in a power cut")
                }
                (Fate::Live, false) => {
                    publish.fate = Fate::Lost;
                    self.live_per_queue[queue] -= 1;
                }
                (Fate::Settled { how, durable: true }, true) => {
                    violation!("queue {queue}: message {id:x} came back after its settle ({how:?}) was durable")
                }
                (Fate::Settled { .. }, true) => {
                    publish.fate = Fate::Live;
                    self.live_per_queue[queue] += 1;
                }
                (Fate::Lost, true) => violation!("queue {queue}: message {id:x} came back after it was lost"),
                _ => {}
            }
        }
        Ok(())
    }

    /// At the end, once every queue was drained: every confirmed message was settled.
    pub fn all_confirmed_settled(&self) -> Result<(), Violation> {
        for (id, publish) in &self.publishes {
            if publish.confirmed == Some(true) && !matches!(publish.fate, Fate::Settled { .. }) {
                violation!("confirmed message {id:x} never settled ({:?})", publish.fate);
            }
        }
        Ok(())
    }
}
