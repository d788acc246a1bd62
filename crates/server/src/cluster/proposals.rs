//! This node's metadata proposals on their way into the log, and the proposals already applied.
//!
//! raft-rs does not keep a proposal it hands on: a follower forwards it to the leader it knows
//! (lost when that leader's node has just stopped, or its link is down), and a leader that loses
//! its term may lose the uncommitted tail of its log. So the group's thread keeps each proposal
//! until it sees the entry committed ([`PendingProposals`]) and proposes it again when the
//! leader or the term changes. An entry may then be in the log twice (the first copy did reach
//! the new leader); every node applies only its first copy ([`AppliedProposals`]), decided by
//! the log alone so that every node decides alike.
//!
//! No I/O here: the group's driver (`group.rs`) and the applier (`apply.rs`) feed these.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Proposals held while no leader is known; one more is refused (its waiter times out).
pub const PENDING_PROPOSALS_MAX: usize = 4096;

/// Proposals handed to raft-rs and not yet seen committed; past it the oldest is no longer
/// proposed again (if it was lost, its waiter times out as before).
pub const IN_FLIGHT_PROPOSALS_MAX: usize = 4096;

/// Proposals (proposer, sequence) remembered as applied, on every node alike (and in every
/// metadata snapshot: at most about 720 KiB of its JSON); a copy of a proposal applied more
/// entries than this after its first copy would be applied again. A copy is proposed again at a
/// change of leader, within `metadata_commit_timeout_ms` of the first (10 s), while hardly
/// anything commits (there is no leader): this covers 1,600 definition changes a second for the
/// whole window.
pub const APPLIED_PROPOSALS_REMEMBERED: usize = 16_384;

/// A proposal's entry data and until when it is proposed again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingProposal {
    /// The entry's data.
    pub data: Vec<u8>,
    /// Past this instant the proposal is not proposed again (its waiter has given up).
    retry_until: Instant,
}

/// A proposal handed to raft-rs under one leader and term.
#[derive(Debug)]
struct InFlight {
    proposal: PendingProposal,
    term: u64,
    leader: u64,
}

/// This node's proposals not yet seen committed.
#[derive(Debug)]
pub struct PendingProposals {
    /// How long after it was first held a proposal is still proposed again.
    retry_window: Duration,
    /// Waiting for a leader (or refused by raft-rs, to be proposed again).
    held: VecDeque<PendingProposal>,
    /// Handed to raft-rs, oldest first.
    in_flight: VecDeque<InFlight>,
    /// Proposals proposed again since the last call of [`PendingProposals::take_retried`].
    retried: u64,
}

impl PendingProposals {
    /// Proposals proposed again for `retry_window` after they were first held.
    pub fn new(retry_window: Duration) -> PendingProposals {
        PendingProposals { retry_window, held: VecDeque::new(), in_flight: VecDeque::new(), retried: 0 }
    }

    /// Holds a new proposal until a leader is known; false when [`PENDING_PROPOSALS_MAX`] are
    /// held already (the proposal is dropped).
    pub fn hold(&mut self, data: Vec<u8>, now: Instant) -> bool {
        if self.held.len() >= PENDING_PROPOSALS_MAX {
            return false;
        }
        self.held.push_back(PendingProposal { data, retry_until: now + self.retry_window });
        true
    }

    /// Holds again a proposal that raft-rs refused (no leader after all, a leader transfer), to
    /// be proposed at the next round in the order it was refused.
    pub fn refused(&mut self, proposal: PendingProposal) {
        self.held.push_back(proposal);
    }

    /// What to hand to raft-rs now that `leader` leads `term`: every held proposal, and every
    /// one in flight under another leader or term (which may have been lost with it), oldest
    /// first. Nothing while no leader is known. In-flight proposals past their retry window are
    /// forgotten (they may still commit; nobody waits for them).
    pub fn due(&mut self, term: u64, leader: u64, now: Instant) -> Vec<PendingProposal> {
        if leader == 0 {
            return Vec::new();
        }
        let mut due = Vec::new();
        let mut kept = VecDeque::with_capacity(self.in_flight.len());
        for in_flight in self.in_flight.drain(..) {
            if in_flight.term == term && in_flight.leader == leader {
                kept.push_back(in_flight);
            } else if in_flight.proposal.retry_until > now {
                self.retried += 1;
                due.push(in_flight.proposal);
            }
        }
        self.in_flight = kept;
        due.extend(self.held.drain(..));
        due
    }

    /// `proposal` was handed to raft-rs under `leader` in `term`.
    pub fn proposed(&mut self, proposal: PendingProposal, term: u64, leader: u64) {
        if self.in_flight.len() >= IN_FLIGHT_PROPOSALS_MAX {
            self.in_flight.pop_front();
        }
        self.in_flight.push_back(InFlight { proposal, term, leader });
    }

    /// A normal entry with `data` was committed: the proposal of that data (the oldest, when
    /// the same data was proposed twice) is done.
    pub fn committed(&mut self, data: &[u8]) {
        if let Some(position) = self.in_flight.iter().position(|in_flight| in_flight.proposal.data == data) {
            self.in_flight.remove(position);
        }
    }

    /// How many proposals were proposed again since the last call.
    pub fn take_retried(&mut self) -> u64 {
        std::mem::take(&mut self.retried)
    }

    /// Proposals held and in flight.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held.len() + self.in_flight.len()
    }
}

/// The proposals applied, as (proposer, sequence): the first copy of a proposal in the log is
/// applied, a later copy (proposed again after a change of leader) is not. Built from the log
/// alone, in log order, so every node and every replay skips the same entries.
#[derive(Debug, Default)]
pub struct AppliedProposals {
    seen: HashSet<(u64, u64)>,
    order: VecDeque<(u64, u64)>,
}

impl AppliedProposals {
    /// Whether the entry of `proposer`'s `sequence` is its first copy (to apply); records it.
    /// Sequence 0 (nobody waits for it: a member's name, the cluster's id) is never a duplicate:
    /// those commands are the same applied twice.
    pub fn first_copy(&mut self, proposer: u64, sequence: u64) -> bool {
        if sequence == 0 {
            return true;
        }
        if !self.seen.insert((proposer, sequence)) {
            return false;
        }
        if self.order.len() >= APPLIED_PROPOSALS_REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                self.seen.remove(&oldest);
            }
        }
        self.order.push_back((proposer, sequence));
        assert_eq!(self.seen.len(), self.order.len(), "applied proposals: set and order disagree");
        true
    }

    /// What is remembered, oldest first (for a snapshot's image).
    pub fn remembered(&self) -> Vec<(u64, u64)> {
        self.order.iter().copied().collect()
    }

    /// What an image remembered, oldest first (the bound kept: the newest stay).
    pub fn from_remembered(remembered: Vec<(u64, u64)>) -> AppliedProposals {
        let mut applied = AppliedProposals::default();
        let skip = remembered.len().saturating_sub(APPLIED_PROPOSALS_REMEMBERED);
        for (proposer, sequence) in remembered.into_iter().skip(skip) {
            applied.first_copy(proposer, sequence);
        }
        applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);

    fn data(pending: &[PendingProposal]) -> Vec<&[u8]> {
        pending.iter().map(|proposal| proposal.data.as_slice()).collect()
    }

    #[test]
    fn held_proposals_wait_for_a_leader() {
        let now = Instant::now();
        let mut proposals = PendingProposals::new(WINDOW);
        assert!(proposals.hold(b"a".to_vec(), now));
        assert!(proposals.due(1, 0, now).is_empty());
        let due = proposals.due(1, 7, now);
        assert_eq!(data(&due), vec![b"a".as_slice()]);
        assert_eq!(proposals.take_retried(), 0);
    }

    #[test]
    fn a_proposal_not_committed_is_proposed_again_when_the_leader_or_term_changes() {
        let now = Instant::now();
        let mut proposals = PendingProposals::new(WINDOW);
        proposals.hold(b"a".to_vec(), now);
        proposals.hold(b"b".to_vec(), now);
        for proposal in proposals.due(3, 1, now) {
            proposals.proposed(proposal, 3, 1);
        }
        // The same leader in the same term: nothing again.
        assert!(proposals.due(3, 1, now).is_empty());
        proposals.committed(b"a");
        // The leader's node stopped; none known: nothing yet.
        assert!(proposals.due(4, 0, now).is_empty());
        // A new leader: what was not committed goes again, once.
        let due = proposals.due(4, 2, now);
        assert_eq!(data(&due), vec![b"b".as_slice()]);
        assert_eq!(proposals.take_retried(), 1);
        for proposal in due {
            proposals.proposed(proposal, 4, 2);
        }
        assert!(proposals.due(4, 2, now).is_empty());
        // The same node leading again in a later term: again.
        assert_eq!(data(&proposals.due(5, 2, now)), vec![b"b".as_slice()]);
    }

    #[test]
    fn a_committed_proposal_is_not_proposed_again_and_one_past_its_window_is_forgotten() {
        let now = Instant::now();
        let mut proposals = PendingProposals::new(WINDOW);
        proposals.hold(b"a".to_vec(), now);
        proposals.hold(b"a".to_vec(), now);
        proposals.hold(b"late".to_vec(), now);
        for proposal in proposals.due(1, 1, now) {
            proposals.proposed(proposal, 1, 1);
        }
        // The same data twice (a member's record said twice): one commit settles one of them.
        proposals.committed(b"a");
        assert_eq!(proposals.len(), 2);
        proposals.committed(b"a");
        let due = proposals.due(2, 2, now + WINDOW);
        assert!(due.is_empty(), "past the window nobody waits: {due:?}");
        assert_eq!(proposals.len(), 0);
    }

    #[test]
    fn a_refused_proposal_is_held_first_and_the_bounds_hold() {
        let now = Instant::now();
        let mut proposals = PendingProposals::new(WINDOW);
        for index in 0..PENDING_PROPOSALS_MAX {
            assert!(proposals.hold(index.to_le_bytes().to_vec(), now));
        }
        assert!(!proposals.hold(b"one too many".to_vec(), now));
        let mut due = proposals.due(1, 1, now);
        assert_eq!(due.len(), PENDING_PROPOSALS_MAX);
        let first = due.remove(0);
        proposals.refused(first.clone());
        for proposal in due {
            proposals.proposed(proposal, 1, 1);
        }
        for index in 0..IN_FLIGHT_PROPOSALS_MAX {
            proposals.proposed(PendingProposal { data: format!("x{index}").into_bytes(), retry_until: now + WINDOW }, 1, 1);
        }
        assert_eq!(proposals.len(), 1 + IN_FLIGHT_PROPOSALS_MAX);
        let due = proposals.due(2, 2, now);
        assert_eq!(due.len(), 1 + IN_FLIGHT_PROPOSALS_MAX);
        // The in-flight ones (oldest first), then the refused one.
        assert_eq!(due[0].data, b"x0".to_vec());
        assert_eq!(due.last(), Some(&first));
    }

    #[test]
    fn only_the_first_copy_of_a_proposal_applies() {
        let mut applied = AppliedProposals::default();
        assert!(applied.first_copy(1, 10));
        assert!(applied.first_copy(2, 10));
        assert!(!applied.first_copy(1, 10));
        assert!(applied.first_copy(1, 0));
        assert!(applied.first_copy(1, 0));
        for sequence in 11..(11 + APPLIED_PROPOSALS_REMEMBERED as u64) {
            assert!(applied.first_copy(1, sequence));
        }
        // Forgotten past the bound, oldest first.
        assert!(applied.first_copy(1, 10));
        assert!(!applied.first_copy(1, 11 + APPLIED_PROPOSALS_REMEMBERED as u64 - 1));
    }

    #[test]
    fn a_snapshot_remembers_the_same_proposals_in_the_same_order() {
        let mut applied = AppliedProposals::default();
        for sequence in 1..=(APPLIED_PROPOSALS_REMEMBERED as u64 + 5) {
            applied.first_copy(sequence % 3, sequence);
        }
        let mut restored = AppliedProposals::from_remembered(applied.remembered());
        assert_eq!(restored.remembered(), applied.remembered());
        assert!(!restored.first_copy(2, 8));
        // The next one past the bound forgets the same oldest on both.
        assert!(restored.first_copy(9, 1));
        assert!(applied.first_copy(9, 1));
        assert_eq!(restored.remembered(), applied.remembered());
        assert!(restored.first_copy(0, 6) && applied.first_copy(0, 6));
    }
}
