//! Learner first in the metadata group: a node that joins is added as a learner (raft-rs
//! `AddLearnerNode`), which receives the log or the leader's snapshot and never counts toward a
//! commit or an election, and the leader promotes it to voter (`AddNode` on the learner) only
//! once it is caught up and was heard from within the last election timeout. A voter added
//! before it holds the log would count toward every commit while it cannot acknowledge one: with
//! three voters of which one is down, a fourth still catching up makes the majority three of
//! four, and definition changes stall until it has caught up.
//!
//! Caught up: its matched index has reached the commit index the leader had at its previous
//! look, [`PROMOTION_CHECK_INTERVAL`] before. So a promoted learner is at most one interval of
//! commits behind. The leader's current commit would be too strict a bar: under steady changes a
//! learner whose link is slower than the voters' always has the newest entries in flight, and
//! was seen to wait nearly two minutes (`interop/cluster/tests/test_learner_first.py`).
//!
//! A learner that never catches up stays a learner (it is a member, listed with `voter: false`
//! in `lepus ctl cluster status`); the leader says so in its log every
//! [`LEARNER_BEHIND_LOG_MS`]. There is no timeout after which it is removed or promoted anyway:
//! promoting it would put a member that cannot acknowledge into the majority, and removing it is
//! the operator's choice (`lepus ctl cluster forget`).

use std::time::Duration;

/// How often the metadata leader looks at its learners.
pub const PROMOTION_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// How often the leader logs that a learner is not caught up yet (it stays a learner).
pub const LEARNER_BEHIND_LOG_MS: u64 = 10_000;

/// What the leader knows of a learner's replication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnerProgress {
    /// The highest index it holds, as the leader knows.
    pub matched: u64,
    /// Heard from within the last election timeout.
    pub active: bool,
}

/// The leader's next step with its learners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Promotion {
    /// No learner.
    Nothing,
    /// This learner is caught up: promote it.
    Promote(u64),
    /// Learners not caught up yet: (learner, matched index, heard from lately).
    Behind(Vec<(u64, u64, bool)>),
}

/// The lowest-id learner that is caught up (holds `caught_up_at`, the commit index of the
/// leader's previous look, and is active), else the learners still behind. Pure: the leader's
/// view in, one step out.
pub fn next_promotion(learners: &[u64], caught_up_at: u64, progress: impl Fn(u64) -> Option<LearnerProgress>) -> Promotion {
    let mut behind = Vec::new();
    let mut caught_up = Vec::new();
    for &learner in learners {
        match progress(learner) {
            Some(progress) if progress.active && progress.matched >= caught_up_at => caught_up.push(learner),
            Some(progress) => behind.push((learner, progress.matched, progress.active)),
            None => behind.push((learner, 0, false)),
        }
    }
    if let Some(learner) = caught_up.into_iter().min() {
        return Promotion::Promote(learner);
    }
    if behind.is_empty() {
        Promotion::Nothing
    } else {
        Promotion::Behind(behind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(matched: u64, active: bool) -> Option<LearnerProgress> {
        Some(LearnerProgress { matched, active })
    }

    #[test]
    fn a_learner_is_promoted_only_once_it_holds_the_commit_index() {
        assert_eq!(next_promotion(&[], 10, |_| None), Promotion::Nothing);
        assert_eq!(next_promotion(&[4], 10, |_| at(9, true)), Promotion::Behind(vec![(4, 9, true)]));
        assert_eq!(next_promotion(&[4], 10, |_| at(10, true)), Promotion::Promote(4));
    }

    #[test]
    fn a_learner_not_heard_from_lately_is_not_promoted_even_when_it_held_the_commit() {
        assert_eq!(next_promotion(&[4], 10, |_| at(10, false)), Promotion::Behind(vec![(4, 10, false)]));
        assert_eq!(next_promotion(&[4], 10, |_| None), Promotion::Behind(vec![(4, 0, false)]));
    }

    #[test]
    fn the_lowest_caught_up_learner_goes_first_and_one_behind_does_not_hold_it_back() {
        let progress = |node: u64| if node == 5 { at(3, true) } else { at(10, true) };
        assert_eq!(next_promotion(&[7, 5, 6], 10, progress), Promotion::Promote(6));
    }
}
