//! What a publisher confirm (or tx.commit) of a message to a quorum queue waits for: its
//! enqueue committed, that is fdatasynced by a majority of the shard's members and applied.
//!
//! A publish gets a [`CommitSlot`] that the shard's thread fills when the enqueue is applied
//! (accepted, or rejected by x-overflow reject-publish: a nack). The channel hands a socket
//! read's confirms to its [`ConfirmGate`], which releases them to the group commit (for the
//! classic queues' logs the same confirms wait for) only when every slot they name is filled,
//! in the order they came: a channel's confirms stay in order, so a later read whose messages
//! went only to classic queues never overtakes an earlier one still waiting for a commit.

use crate::queue_type::PendingConfirm;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use storage::syncer::{SharedLog, SharedStream, SyncCallback, Syncer};

/// How a replicated enqueue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotOutcome {
    /// Committed and kept (or dropped by the queue's own rules, which RabbitMQ confirms too).
    Accepted,
    /// Committed and refused by x-overflow reject-publish: the confirm is a nack.
    Rejected,
    /// Never committed (the node stopped): the confirm is a nack.
    Failed,
}

#[derive(Debug, Default)]
struct SlotState {
    outcome: Option<SlotOutcome>,
    /// The gate to wake when the outcome is set. Held strongly: a gate made for one wait
    /// (`ConfirmTickets::when_settled`: dead letters, delayed messages, the management API's
    /// publish) has no other owner, and would be dropped with its callback before the commit.
    /// Taken when the slot is filled (which the shard does for every slot, if only as failed).
    gate: Option<Arc<ConfirmGate>>,
}

/// The commit one publish to one quorum queue waits for.
#[derive(Debug, Default)]
pub struct CommitSlot {
    state: Mutex<SlotState>,
}

impl CommitSlot {
    /// A slot waiting for its commit.
    pub fn new() -> Arc<CommitSlot> {
        Arc::new(CommitSlot::default())
    }

    /// Sets the outcome (once; a later call changes nothing) and returns the gate to wake.
    pub fn fill(&self, outcome: SlotOutcome) -> Option<Arc<ConfirmGate>> {
        let mut state = self.state.lock();
        if state.outcome.is_some() {
            return None;
        }
        state.outcome = Some(outcome);
        state.gate.take()
    }

    /// The outcome, once set.
    pub fn outcome(&self) -> Option<SlotOutcome> {
        self.state.lock().outcome
    }

    /// Asks to wake `gate` when the outcome is set; false when it is set already.
    fn wake_on_fill(&self, gate: &Arc<ConfirmGate>) -> bool {
        let mut state = self.state.lock();
        if state.outcome.is_some() {
            return false;
        }
        state.gate = Some(gate.clone());
        true
    }
}

/// The slots of one socket read's (or one transaction's) publishes, each with the delivery tag
/// of its publish (0 outside confirm mode).
pub type Slots = Vec<(u64, Arc<CommitSlot>)>;

/// What waits behind the slots: confirms for the group commit, or a callback.
enum Release {
    Confirms(Vec<PendingConfirm>),
    Callback(SyncCallback),
}

struct Waiting {
    slots: Slots,
    logs: Vec<SharedLog>,
    /// Streams the same publishes appended to (their commit is the group commit's too).
    streams: Vec<SharedStream>,
    release: Release,
    syncer: Syncer,
}

impl Waiting {
    fn is_ready(&self) -> bool {
        self.slots.iter().all(|(_, slot)| slot.outcome().is_some())
    }

    /// Hands the confirms (each a nack when a slot of its publish was refused) or the callback
    /// to the group commit, which then syncs the classic logs the same publishes wrote.
    fn release(self) {
        match self.release {
            Release::Confirms(mut confirms) => {
                for (tag, slot) in &self.slots {
                    if slot.outcome() == Some(SlotOutcome::Accepted) {
                        continue;
                    }
                    if let Some(confirm) = confirms.iter_mut().find(|confirm| confirm.delivery_tag == *tag) {
                        confirm.accepted = false;
                    }
                }
                match self.streams.is_empty() {
                    true => self.syncer.confirm(self.logs, confirms),
                    false => self.syncer.confirm_with_streams(self.logs, self.streams, confirms),
                }
            }
            Release::Callback(callback) => {
                let committed = self.slots.iter().all(|(_, slot)| slot.outcome() != Some(SlotOutcome::Failed));
                let callback: SyncCallback = Box::new(move |durable| callback(durable && committed));
                match self.streams.is_empty() {
                    true => self.syncer.sync(self.logs, Some(callback)),
                    false => self.syncer.sync_with_streams(self.logs, self.streams, Some(callback)),
                }
            }
        }
    }
}

/// A channel's confirms (or tx.commits) waiting for quorum commits, released in order.
#[derive(Default)]
pub struct ConfirmGate {
    waiting: Mutex<VecDeque<Waiting>>,
}

impl std::fmt::Debug for ConfirmGate {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("ConfirmGate").field("waiting", &self.waiting.lock().len()).finish()
    }
}

impl ConfirmGate {
    /// A gate with nothing waiting.
    pub fn new() -> Arc<ConfirmGate> {
        Arc::new(ConfirmGate::default())
    }

    /// Whether confirms wait here (later ones must queue behind them).
    pub fn is_busy(&self) -> bool {
        !self.waiting.lock().is_empty()
    }

    /// Releases `confirms` to the group commit once `slots` are filled and everything before
    /// them is released.
    pub fn confirm(
        self: &Arc<Self>,
        syncer: &Syncer,
        slots: Slots,
        logs: Vec<SharedLog>,
        streams: Vec<SharedStream>,
        confirms: Vec<PendingConfirm>,
    ) {
        self.enter(Waiting { slots, logs, streams, release: Release::Confirms(confirms), syncer: syncer.clone() });
    }

    /// Calls `callback` (through the group commit of `logs`) once `slots` are filled and
    /// everything before them is released: true when all were committed and the logs synced.
    pub fn when_settled(
        self: &Arc<Self>,
        syncer: &Syncer,
        slots: Slots,
        logs: Vec<SharedLog>,
        streams: Vec<SharedStream>,
        callback: SyncCallback,
    ) {
        self.enter(Waiting { slots, logs, streams, release: Release::Callback(callback), syncer: syncer.clone() });
    }

    fn enter(self: &Arc<Self>, waiting: Waiting) {
        let mut queue = self.waiting.lock();
        if queue.is_empty() && waiting.is_ready() {
            // Released under the lock: a wake-up of the shard thread cannot slip another
            // release in front of it.
            waiting.release();
            return;
        }
        // Registered before it is queued and checked again after: a slot filled in between
        // finds no gate to wake, but the check below sees it.
        for (_, slot) in &waiting.slots {
            slot.wake_on_fill(self);
        }
        queue.push_back(waiting);
        Self::release_ready(&mut queue);
    }

    /// Releases what is ready at the front (the shard thread calls it after filling slots).
    pub fn wake(&self) {
        Self::release_ready(&mut self.waiting.lock());
    }

    fn release_ready(queue: &mut VecDeque<Waiting>) {
        while queue.front().is_some_and(Waiting::is_ready) {
            if let Some(waiting) = queue.pop_front() {
                waiting.release();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue_type::ConfirmSink;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u64, bool)>>);

    impl ConfirmSink for Recorder {
        fn confirm_batch(&self, confirms: &[(u64, bool)]) {
            self.0.lock().extend_from_slice(confirms);
        }
    }

    fn confirm(sink: &Arc<Recorder>, delivery_tag: u64) -> PendingConfirm {
        let sink: Arc<dyn ConfirmSink> = sink.clone();
        PendingConfirm { sink, delivery_tag, accepted: true }
    }

    fn wait_for(sink: &Recorder, count: usize) -> Vec<(u64, bool)> {
        for _ in 0..500 {
            if sink.0.lock().len() >= count {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        sink.0.lock().clone()
    }

    /// A read whose confirm waits for nothing still waits behind an earlier read's commit, and
    /// a rejected enqueue turns its own confirm (only) into a nack.
    #[test]
    fn confirms_leave_in_order_and_a_rejected_enqueue_is_nacked() {
        let syncer = Syncer::start(storage::syncer::SyncPolicy::Always, None);
        let gate = ConfirmGate::new();
        let sink = Arc::new(Recorder::default());
        let (first, second) = (CommitSlot::new(), CommitSlot::new());
        gate.confirm(
            &syncer,
            vec![(1, first.clone()), (2, second.clone())],
            Vec::new(),
            Vec::new(),
            vec![confirm(&sink, 1), confirm(&sink, 2)],
        );
        gate.confirm(&syncer, Vec::new(), Vec::new(), Vec::new(), vec![confirm(&sink, 3)]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(sink.0.lock().is_empty(), "nothing leaves before the commits");
        assert!(first.fill(SlotOutcome::Accepted).is_some(), "the filled slot names its gate");
        gate.wake();
        assert!(sink.0.lock().is_empty());
        if let Some(gate) = second.fill(SlotOutcome::Rejected) {
            gate.wake();
        }
        assert_eq!(wait_for(&sink, 3), vec![(1, true), (2, false), (3, true)]);
    }
}
