//! A shard's members follow the cluster's: a node that joins becomes a learner of every shard
//! (it replicates and applies the log, so its clients use every quorum queue, and it never
//! counts toward a commit, so it cannot slow or block the founding majority); a node forgotten is
//! removed; while a shard has fewer voters than it started with, a caught-up learner is promoted
//! (a dead founding node replaced). The shard's leader makes the changes, one at a time (raft-rs
//! `ConfChange`), and never one that leaves the voters without a live majority.
//!
//! Learner first: every change that makes a node a voter (a joined node making up the founding
//! count, `grow`, `add_member`) promotes a learner, and only once it is caught up (it holds the
//! commit index of the leader's previous check, and was heard from lately); a voter added while
//! still catching up would count toward every commit it cannot acknowledge yet. A learner that
//! never catches up stays one: logged every [`HELD_LOG_TICKS`], listed in the cluster status as
//! the shard's learner (and `promotion_pending` when the operator chose it as a voter).
//!
//! An operator may choose a node's role in a shard (`lepus ctl queues grow`, `shrink`,
//! `add_member`, `delete_member`; replicated through the metadata group): a chosen voter is
//! promoted once caught up, a chosen learner demoted (the leader hands its leadership over first
//! when it is the one demoted). A shard with a chosen role is the operator's: no learner is
//! promoted by itself to make up the founding count (it would undo a `shrink`).

use super::ShardWorker;
use raft::eraftpb::{ConfChange, ConfChangeType};

/// Ticks between a leader's looks at the shard's members.
pub const MEMBERSHIP_CHECK_TICKS: u64 = 5;

/// Ticks between log lines saying a change is held back.
const HELD_LOG_TICKS: u64 = 100;

/// What the leader knows of a member's replication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberProgress {
    /// The highest index it holds, as the leader knows.
    pub matched: u64,
    /// Heard from within the last election timeout.
    pub active: bool,
}

/// The next membership change of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipPlan {
    /// The members are the cluster's.
    Settled,
    /// Propose this change.
    Change(ConfChangeType, u64),
    /// A change is due but would leave the voters without a live majority: not made.
    Held(String),
    /// The leader is to be demoted: it hands the leadership to this voter first.
    HandOver(u64),
    /// A learner due to vote does not hold the leader's commit index yet: it stays a learner
    /// (never a voter that cannot acknowledge), and is promoted once it does.
    Waiting(String),
}

/// The shard's members as they are and as the cluster wants them.
#[derive(Debug, Clone)]
pub struct Members<'a> {
    /// Voters now.
    pub voters: &'a [u64],
    /// Learners now.
    pub learners: &'a [u64],
    /// The cluster's members.
    pub target: &'a [u64],
    /// How many voters the shard should have (the founding nodes' count).
    pub voters_wanted: usize,
    /// The leader's commit index at its previous check ([`MEMBERSHIP_CHECK_TICKS`] before): a
    /// learner that holds it is caught up, at most one check of commits behind. The current
    /// commit would be too strict a bar: under steady load a learner whose link is slower than
    /// the voters' always has the newest entries in flight, and would wait for a lull.
    pub commit: u64,
    /// The leader's id.
    pub leader: u64,
    /// The roles the operator chose in this shard: (node, voter).
    pub chosen: &'a [(u64, bool)],
}

/// Decides the next change (pure: the leader's view in, one change out). Removals first (a gone
/// learner, then a gone voter if the remaining voters keep a live majority), then the cluster's
/// new members as learners, then a caught-up learner promoted while voters are missing.
pub fn plan(members: &Members<'_>, progress: impl Fn(u64) -> Option<MemberProgress>) -> MembershipPlan {
    let active = |node: u64| progress(node).is_some_and(|progress| progress.active);
    if let Some(learner) = members.learners.iter().find(|node| !members.target.contains(node)) {
        return MembershipPlan::Change(ConfChangeType::RemoveNode, *learner);
    }
    if let Some(voter) = members.voters.iter().find(|node| !members.target.contains(node)) {
        let remaining: Vec<u64> = members.voters.iter().copied().filter(|node| node != voter).collect();
        let live = remaining.iter().filter(|node| active(**node)).count();
        if remaining.is_empty() || live * 2 <= remaining.len() {
            return MembershipPlan::Held(format!(
                "removing voter {voter:x} would leave {} voters of which {live} are live: not a working majority",
                remaining.len()
            ));
        }
        return MembershipPlan::Change(ConfChangeType::RemoveNode, *voter);
    }
    let is_member = |node: &u64| members.voters.contains(node) || members.learners.contains(node);
    if let Some(new) = members.target.iter().find(|node| !is_member(node)) {
        return MembershipPlan::Change(ConfChangeType::AddLearnerNode, *new);
    }
    if let Some(change) = plan_chosen_roles(members, &progress) {
        return change;
    }
    if members.chosen.is_empty() && members.voters.len() < members.voters_wanted {
        let caught_up = |node: &&u64| progress(**node).is_some_and(|progress| progress.active && progress.matched >= members.commit);
        if let Some(learner) = members.learners.iter().filter(caught_up).min() {
            return MembershipPlan::Change(ConfChangeType::AddNode, *learner);
        }
        if !members.learners.is_empty() {
            return MembershipPlan::Waiting(behind(members.learners, members.commit, &progress));
        }
    }
    MembershipPlan::Settled
}

/// Says how far each of `learners` is behind `commit`, for the log.
fn behind(learners: &[u64], commit: u64, progress: &impl Fn(u64) -> Option<MemberProgress>) -> String {
    let each: Vec<String> = learners
        .iter()
        .map(|node| match progress(*node) {
            Some(progress) => format!("{node:x} holds {} (heard from lately: {})", progress.matched, progress.active),
            None => format!("{node:x} not heard from"),
        })
        .collect();
    format!("learners due to vote not caught up with the commit index {commit}: {}", each.join(", "))
}

/// The next change toward the operator's chosen roles, if one is due: a chosen voter that is a
/// caught-up learner is promoted; a chosen learner that votes is demoted (raft-rs
/// `AddLearnerNode` on a voter), when the voters left keep a live majority, after the leader
/// handed over if it is the one demoted.
fn plan_chosen_roles(members: &Members<'_>, progress: &impl Fn(u64) -> Option<MemberProgress>) -> Option<MembershipPlan> {
    let caught_up = |node: u64| progress(node).is_some_and(|progress| progress.active && progress.matched >= members.commit);
    let mut waiting = Vec::new();
    for &(node, voter) in members.chosen {
        if voter && members.learners.contains(&node) {
            if caught_up(node) {
                return Some(MembershipPlan::Change(ConfChangeType::AddNode, node));
            }
            // Not a voter before it holds the commit: it would count toward every commit
            // while it cannot acknowledge one. A later chosen role may still be due.
            waiting.push(node);
            continue;
        }
        if voter || !members.voters.contains(&node) {
            continue;
        }
        let remaining: Vec<u64> = members.voters.iter().copied().filter(|other| *other != node).collect();
        let live = remaining.iter().filter(|other| **other == members.leader || caught_up(**other)).count();
        if remaining.is_empty() || live * 2 <= remaining.len() {
            return Some(MembershipPlan::Held(format!(
                "making voter {node:x} a learner would leave {} voters of which {live} are live and caught up: not a working majority",
                remaining.len()
            )));
        }
        if node == members.leader {
            return remaining.iter().copied().find(|other| caught_up(*other)).map(MembershipPlan::HandOver);
        }
        return Some(MembershipPlan::Change(ConfChangeType::AddLearnerNode, node));
    }
    (!waiting.is_empty()).then(|| MembershipPlan::Waiting(behind(&waiting, members.commit, progress)))
}

impl ShardWorker {
    /// As leader, every [`MEMBERSHIP_CHECK_TICKS`]: one change toward the cluster's members,
    /// when none is pending and the leader has applied its log.
    pub(super) fn reconcile_membership(&mut self) {
        if !self.node.is_leader() {
            self.commit_at_membership_check = None;
            return;
        }
        if !self.ticks.is_multiple_of(MEMBERSHIP_CHECK_TICKS) {
            return;
        }
        // The bar a learner must reach: the commit of the previous check (a new leader's first
        // check has none, and takes the current one).
        let commit = self.node.commit_index();
        let caught_up_at = self.commit_at_membership_check.replace(commit).unwrap_or(commit);
        if self.node.membership_change_pending() {
            return;
        }
        let Some(target) = self.members_target.read().clone() else { return };
        if !target.contains(&self.config.node_id) || !self.node.caught_up() {
            return;
        }
        let (voters, learners) = (self.node.voters(), self.node.learners());
        let chosen = self.chosen_roles();
        let members = Members {
            voters: &voters,
            learners: &learners,
            target: &target,
            voters_wanted: self.node_config.voters.len().max(1),
            commit: caught_up_at,
            leader: self.config.node_id,
            chosen: &chosen,
        };
        let node = &self.node;
        let progress = |member: u64| node.member_progress(member).map(|(matched, active)| MemberProgress { matched, active });
        match plan(&members, progress) {
            MembershipPlan::Settled => {}
            MembershipPlan::Held(reason) => {
                if self.membership_held_at_tick == 0 || self.ticks >= self.membership_held_at_tick + HELD_LOG_TICKS {
                    self.membership_held_at_tick = self.ticks;
                    tracing::warn!(shard = self.shard, %reason, "a membership change of the quorum shard is held back");
                }
            }
            MembershipPlan::Waiting(reason) => {
                if self.membership_held_at_tick == 0 || self.ticks >= self.membership_held_at_tick + HELD_LOG_TICKS {
                    self.membership_held_at_tick = self.ticks;
                    tracing::info!(shard = self.shard, %reason, "a learner of the quorum shard stays a learner until it catches up");
                }
            }
            MembershipPlan::HandOver(to) => {
                if self.node.transfer_leadership(to) {
                    tracing::info!(shard = self.shard, to = %format!("{to:x}"), "handing the shard's leadership over before this node stops voting");
                }
            }
            MembershipPlan::Change(kind, member) => {
                let mut change = ConfChange { node_id: member, ..Default::default() };
                change.set_change_type(kind);
                tracing::info!(shard = self.shard, change = ?kind, node = %format!("{member:x}"), "changing the quorum shard's members");
                if let Err(error) = self.node.propose_membership_change(change) {
                    tracing::warn!(shard = self.shard, %error, "proposing a membership change failed; tried again later");
                }
            }
        }
    }

    /// The roles the operator chose in this shard: (node, voter).
    pub(super) fn chosen_roles(&self) -> Vec<(u64, bool)> {
        let roles = self.shard_roles.read();
        roles.iter().filter(|((shard, _), _)| *shard == self.shard).map(|(&(_, node), &voter)| (node, voter)).collect()
    }

    /// The founding voters, learnt by a node that joined after its shards opened: a shard that
    /// holds nothing yet is opened again with them (its log starts where the founders' did).
    pub(super) fn learn_initial_voters(&mut self, voters: Vec<u64>) {
        self.config.voters = voters.clone();
        let fresh = self.node.voters().is_empty() && self.node.learners().is_empty();
        if self.node_config.voters == voters || !fresh {
            return;
        }
        self.node_config.voters = voters;
        let directory = self.config.data_dir.join("raft").join(format!("shard-{}", self.shard));
        match replication::node::ReplicaNode::open(self.node_config.clone(), self.config.file_system.clone(), &directory) {
            Ok((node, _)) => {
                self.node = node;
                self.proposed_to = (None, 0);
            }
            Err(error) => tracing::error!(shard = self.shard, %error, "opening the quorum shard with the cluster's voters failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(matched: u64) -> Option<MemberProgress> {
        Some(MemberProgress { matched, active: true })
    }

    #[test]
    fn a_joined_node_becomes_a_learner_and_is_not_promoted_while_the_voters_are_complete() {
        let members =
            Members { voters: &[1, 2, 3], learners: &[], target: &[1, 2, 3, 4], voters_wanted: 3, commit: 10, leader: 1, chosen: &[] };
        assert_eq!(plan(&members, |_| live(10)), MembershipPlan::Change(ConfChangeType::AddLearnerNode, 4));
        let members = Members { learners: &[4], ..members };
        assert_eq!(plan(&members, |_| live(10)), MembershipPlan::Settled);
    }

    #[test]
    fn a_forgotten_voter_is_removed_then_a_caught_up_learner_promoted() {
        let progress = |node: u64| if node == 3 { Some(MemberProgress { matched: 4, active: false }) } else { live(10) };
        let members =
            Members { voters: &[1, 2, 3], learners: &[4], target: &[1, 2, 4], voters_wanted: 3, commit: 10, leader: 1, chosen: &[] };
        assert_eq!(plan(&members, progress), MembershipPlan::Change(ConfChangeType::RemoveNode, 3));
        let members = Members { voters: &[1, 2], ..members };
        assert_eq!(plan(&members, progress), MembershipPlan::Change(ConfChangeType::AddNode, 4));
        // A learner behind the commit is not promoted yet: it stays a learner, said in the log.
        assert!(matches!(plan(&members, |node| if node == 4 { live(9) } else { live(10) }), MembershipPlan::Waiting(_)));
    }

    #[test]
    fn a_removal_that_leaves_no_live_majority_is_held() {
        let progress = |node: u64| if node == 1 { live(10) } else { Some(MemberProgress { matched: 4, active: false }) };
        let members = Members { voters: &[1, 2, 3], learners: &[], target: &[1, 2], voters_wanted: 3, commit: 10, leader: 1, chosen: &[] };
        assert!(matches!(plan(&members, progress), MembershipPlan::Held(_)));
    }

    #[test]
    fn a_chosen_learner_is_demoted_and_not_promoted_back_and_a_chosen_voter_promoted_once_caught_up() {
        let members = Members {
            voters: &[1, 2, 3],
            learners: &[],
            target: &[1, 2, 3],
            voters_wanted: 3,
            commit: 10,
            leader: 1,
            chosen: &[(3, false)],
        };
        assert_eq!(plan(&members, |_| live(10)), MembershipPlan::Change(ConfChangeType::AddLearnerNode, 3));
        // Demoted: the shard is the operator's, the learner stays one.
        let members = Members { voters: &[1, 2], learners: &[3], ..members };
        assert_eq!(plan(&members, |_| live(10)), MembershipPlan::Settled);
        let members = Members { chosen: &[(3, true)], ..members };
        assert!(matches!(plan(&members, |node| if node == 3 { live(9) } else { live(10) }), MembershipPlan::Waiting(_)));
        // Nor while it was not heard from lately, even at the commit index.
        let quiet = |node: u64| if node == 3 { Some(MemberProgress { matched: 10, active: false }) } else { live(10) };
        assert!(matches!(plan(&members, quiet), MembershipPlan::Waiting(_)));
        assert_eq!(plan(&members, |_| live(10)), MembershipPlan::Change(ConfChangeType::AddNode, 3));
    }

    #[test]
    fn a_demoted_leader_hands_over_first_and_a_demotion_without_a_live_majority_is_held() {
        let members = Members {
            voters: &[1, 2, 3],
            learners: &[],
            target: &[1, 2, 3],
            voters_wanted: 3,
            commit: 10,
            leader: 1,
            chosen: &[(1, false)],
        };
        assert_eq!(plan(&members, |_| live(10)), MembershipPlan::HandOver(2));
        let members = Members { leader: 2, chosen: &[(1, false)], ..members };
        let dead_third = |node: u64| if node == 3 { Some(MemberProgress { matched: 4, active: false }) } else { live(10) };
        assert!(matches!(plan(&members, dead_third), MembershipPlan::Held(_)));
        let members = Members { voters: &[1], target: &[1], chosen: &[(1, false)], leader: 1, ..members };
        assert!(matches!(plan(&members, |_| live(10)), MembershipPlan::Held(_)));
    }

    #[test]
    fn a_chosen_voter_still_catching_up_stays_a_learner_and_does_not_hold_back_another_change() {
        let members = Members {
            voters: &[1, 2, 3],
            learners: &[4],
            target: &[1, 2, 3, 4],
            voters_wanted: 3,
            commit: 5_000,
            leader: 1,
            chosen: &[(4, true), (3, false)],
        };
        let catching_up = |node: u64| if node == 4 { live(1_200) } else { live(5_000) };
        assert_eq!(plan(&members, catching_up), MembershipPlan::Change(ConfChangeType::AddLearnerNode, 3));
        let members = Members { voters: &[1, 2], learners: &[3, 4], ..members };
        assert!(matches!(plan(&members, catching_up), MembershipPlan::Waiting(reason) if reason.contains("4 holds 1200")));
        assert_eq!(plan(&members, |_| live(5_000)), MembershipPlan::Change(ConfChangeType::AddNode, 4));
    }

    #[test]
    fn a_forgotten_learner_is_removed_first() {
        let members = Members {
            voters: &[1, 2, 3],
            learners: &[4, 5],
            target: &[1, 2, 3, 5, 6],
            voters_wanted: 3,
            commit: 10,
            leader: 1,
            chosen: &[],
        };
        assert_eq!(plan(&members, |_| live(10)), MembershipPlan::Change(ConfChangeType::RemoveNode, 4));
    }
}
