//! Applying committed metadata commands, in log order, on every node: membership to the
//! cluster's state, definition changes to the broker (whose methods take the local path while
//! [`super::applying`] is set). The node that proposed a command gets what applying it answered.

use super::command::{MemberContext, MetadataCommand, Proposal};
use super::group::{Applier, GroupEvent, GroupView};
use super::node_state::Membership;
use super::proposals::AppliedProposals;
use super::snapshot::{ImageEntry, ImageMember, MetadataImage};
use super::{Cluster, MemberRecord, APPLYING};
use crate::shared::ConsumerHandle;
use broker_core::AmqpError;
use raft::eraftpb::{ConfChange, ConfChangeType, ConfState};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a member repeats its name and address until the log has them.
const MEMBER_RECORD_RETRY_MS: u64 = 3_000;

/// What applying a command answered.
#[derive(Debug)]
pub enum Applied {
    /// Done.
    Done,
    /// Done; whether something was created (or existed).
    Flag(bool),
    /// A queue removed: its ready messages and this node's consumers of it (to tell).
    Removed {
        /// Ready messages it held.
        ready: u32,
        /// Its consumers on this node.
        consumers: Vec<Arc<ConsumerHandle>>,
    },
}

impl Applied {
    /// The flag of [`Applied::Flag`] (false for the others).
    pub fn flag(self) -> bool {
        matches!(self, Applied::Flag(true))
    }
}

/// The metadata group's [`Applier`].
pub struct MetadataApplier {
    cluster: Arc<Cluster>,
    create_proposed: bool,
    member_proposed_at: Option<Instant>,
    stale_queues_deleted: bool,
    /// The proposals applied: a copy proposed again after a change of leader applies once.
    applied_proposals: AppliedProposals,
}

impl MetadataApplier {
    /// For `cluster`.
    pub fn new(cluster: Arc<Cluster>) -> MetadataApplier {
        MetadataApplier {
            cluster,
            create_proposed: false,
            member_proposed_at: None,
            stale_queues_deleted: false,
            applied_proposals: AppliedProposals::default(),
        }
    }

    fn propose_quietly(&self, command: MetadataCommand) {
        let proposal = Proposal { proposer: self.cluster.node_id, sequence: 0, command };
        if let Some(events) = self.cluster.events.lock().as_ref() {
            let _ = events.try_send(GroupEvent::Propose(proposal.encode()));
        }
    }

    fn apply_command(&mut self, index: u64, command: MetadataCommand) -> Result<Applied, AmqpError> {
        match command {
            MetadataCommand::CreateCluster { cluster_id } => {
                let known = self.cluster.cluster_id();
                if known == 0 {
                    self.cluster.update_node_state(|state| state.cluster_id = cluster_id);
                    self.cluster.links.set_cluster_id(cluster_id);
                    tracing::info!(cluster = %format!("{cluster_id:x}"), "the cluster is formed");
                } else if known != cluster_id {
                    tracing::error!(known, cluster_id, "the log names this cluster again, differently; the first name stays");
                }
                Ok(Applied::Done)
            }
            MetadataCommand::Member { id, name, address } => {
                if id != self.cluster.node_id {
                    self.cluster.links.dial(&address);
                }
                self.cluster.state.lock().members.insert(id, MemberRecord { name, address });
                Ok(Applied::Done)
            }
            MetadataCommand::ShardRole { node, shards, voter } => {
                let mut state = self.cluster.state.lock();
                for shard in shards {
                    state.shard_roles.insert((shard, node), voter);
                }
                let roles = state.shard_roles.clone();
                drop(state);
                if let Some(broker) = self.cluster.broker() {
                    broker.quorum.set_shard_roles(roles);
                }
                Ok(Applied::Done)
            }
            MetadataCommand::StreamLeader { vhost, name, epoch, leader, members } => {
                let leadership = crate::stream::replication::Leadership { epoch, leader, members };
                let key = crate::stream::replication::StreamKey { vhost, name };
                Ok(Applied::Flag(self.cluster.apply_stream_leader(index, key, leadership)))
            }
            command => {
                self.cluster.state.lock().definition_changes += 1;
                let Some(broker) = self.cluster.broker() else { return Err(AmqpError::internal("the broker is shutting down")) };
                APPLYING.with(|flag| flag.set(true));
                let answer = broker.apply_metadata(index, command, self.cluster.node_id, &self.cluster);
                APPLYING.with(|flag| flag.set(false));
                answer
            }
        }
    }
}

impl Applier for MetadataApplier {
    fn apply(&mut self, index: u64, data: &[u8]) {
        let proposal = match Proposal::decode(data) {
            Ok(proposal) => proposal,
            Err(error) => return tracing::error!(index, %error, "a committed metadata entry does not decode; skipped on every node alike"),
        };
        let proposer = proposal.proposer;
        let sequence = proposal.sequence;
        if !self.applied_proposals.first_copy(proposer, sequence) {
            // Its first copy was applied (and answered) already: the proposer proposed it again
            // after a change of leader, not knowing the first had reached the new leader.
            return tracing::debug!(index, sequence, "a metadata proposal's second copy, skipped");
        }
        let answer = self.apply_command(index, proposal.command);
        if proposer == self.cluster.node_id && sequence != 0 {
            self.cluster.answer(sequence, answer);
        } else if let Ok(Applied::Removed { consumers, .. }) = answer {
            // The proposing node tells its own consumers after its answer; the others at once.
            crate::broker::notify_cancelled(&consumers);
        }
    }

    fn conf_changed(&mut self, index: u64, change: &ConfChange, members: &ConfState) {
        let id = change.node_id;
        match change.get_change_type() {
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                if let Ok(context) = serde_json::from_slice::<MemberContext>(&change.context) {
                    if id != self.cluster.node_id {
                        self.cluster.links.dial(&context.address);
                    }
                    self.cluster.state.lock().members.insert(id, MemberRecord { name: context.name, address: context.address });
                }
                match change.get_change_type() {
                    ConfChangeType::AddLearnerNode => {
                        tracing::info!(index, node = %format!("{id:x}"), learners = ?members.learners, "a member joined the cluster as a learner")
                    }
                    _ => tracing::info!(index, node = %format!("{id:x}"), voters = ?members.voters, "a member votes in the metadata group"),
                }
            }
            ConfChangeType::RemoveNode => {
                let name = self.cluster.state.lock().members.remove(&id).map(|member| member.name);
                tracing::info!(index, node = ?name, voters = ?members.voters, "a member left the cluster");
                if id == self.cluster.node_id {
                    self.leave_now();
                } else if let Some(broker) = self.cluster.broker() {
                    APPLYING.with(|flag| flag.set(true));
                    broker.forget_queues_of(id);
                    APPLYING.with(|flag| flag.set(false));
                }
            }
        }
    }

    fn image(&mut self, index: u64) -> MetadataImage {
        let mut entries = match self.cluster.broker() {
            Some(broker) => super::snapshot::image_entries(&broker, index, &mut self.cluster.queue_declarations.lock()),
            None => Vec::new(),
        };
        // After the queues: each applies to its stream's copy, made by the declaration.
        entries.extend(self.cluster.stream_leader_commands().into_iter().map(|command| super::snapshot::ImageEntry { index, command }));
        let state = self.cluster.state.lock();
        MetadataImage {
            index,
            cluster_id: self.cluster.cluster_id(),
            members: state
                .members
                .iter()
                .map(|(id, member)| ImageMember { id: *id, name: member.name.clone(), address: member.address.clone() })
                .collect(),
            definition_changes: state.definition_changes,
            entries,
            applied_proposals: self.applied_proposals.remembered(),
            shard_roles: state.shard_roles.iter().map(|(&(shard, node), &voter)| (shard, node, voter)).collect(),
        }
    }

    fn install(&mut self, image: MetadataImage) {
        let MetadataImage { index, cluster_id, members, definition_changes, entries, applied_proposals, shard_roles } = image;
        self.applied_proposals = AppliedProposals::from_remembered(applied_proposals);
        if cluster_id != 0 {
            self.apply_logged(index, MetadataCommand::CreateCluster { cluster_id });
        }
        // Members first: a queue's placeholder names its home node.
        let known: Vec<u64> = self.cluster.state.lock().members.keys().copied().collect();
        for id in known {
            if !members.iter().any(|member| member.id == id) {
                self.cluster.state.lock().members.remove(&id);
            }
        }
        for member in members {
            self.apply_logged(index, MetadataCommand::Member { id: member.id, name: member.name, address: member.address });
        }
        // What the image holds is what the cluster applied already: its quorum queues' shards have
        // their declarations and deletions, so nothing of it is proposed to them again.
        self.cluster.restoring.store(true, Ordering::Release);
        let current = match self.cluster.broker() {
            Some(broker) => super::snapshot::image_entries(&broker, index, &mut self.cluster.queue_declarations.lock()),
            None => Vec::new(),
        };
        let removals = super::snapshot::removals(&current, &entries, self.cluster.node_id);
        let removed = removals.len();
        for command in removals {
            self.apply_logged(index, command);
        }
        let applied = entries.len();
        for ImageEntry { index, command } in entries {
            self.apply_logged(index, command);
        }
        self.cluster.restoring.store(false, Ordering::Release);
        let mut state = self.cluster.state.lock();
        state.definition_changes = state.definition_changes.max(definition_changes);
        state.shard_roles = shard_roles.into_iter().map(|(shard, node, voter)| ((shard, node), voter)).collect();
        let roles = state.shard_roles.clone();
        drop(state);
        if let Some(broker) = self.cluster.broker() {
            broker.quorum.set_shard_roles(roles);
        }
        tracing::info!(index, removed, applied, "the definitions are those of the metadata snapshot");
    }

    fn after_round(&mut self, view: &GroupView) {
        let Some(leader) = view.leader else { return };
        if leader == self.cluster.node_id && self.cluster.cluster_id() == 0 && !self.create_proposed {
            self.create_proposed = true;
            self.propose_quietly(MetadataCommand::CreateCluster { cluster_id: rand::random::<u64>().max(1) });
        }
        let recorded = self.cluster.state.lock().members.get(&self.cluster.node_id).cloned();
        let expected = MemberRecord { name: self.cluster.settings.node_name.clone(), address: self.cluster.advertise.clone() };
        let due = self.member_proposed_at.is_none_or(|at| at.elapsed() > Duration::from_millis(MEMBER_RECORD_RETRY_MS));
        let is_member = view.voters.contains(&self.cluster.node_id) || view.learners.contains(&self.cluster.node_id);
        self.share_members_with_quorum_shards(view, is_member);
        // Once per run the member says who it is, even when the log has it: that entry, past
        // the log this run started with, is what tells the node its last run's log is applied.
        let announced = self.member_proposed_at.is_some();
        let last_run = self.cluster.last_index_at_start.load(std::sync::atomic::Ordering::Acquire);
        if !self.stale_queues_deleted && is_member && announced && view.applied > last_run && self.cluster.cluster_id() != 0 {
            self.stale_queues_deleted = true;
            self.cluster.delete_stale_queues();
        }
        if (recorded.as_ref() != Some(&expected) || !announced) && due && is_member {
            self.member_proposed_at = Some(Instant::now());
            self.propose_quietly(super::control::member_command(&self.cluster));
        }
    }
}

impl MetadataApplier {
    /// Applies one command of a snapshot image; an error is logged (the image was applied on
    /// the node that took it, so it should apply here alike).
    fn apply_logged(&mut self, index: u64, command: MetadataCommand) {
        // Its kind, as the log spells it (never a password hash).
        let kind =
            serde_json::to_value(&command).ok().and_then(|value| value.get("command").and_then(|kind| kind.as_str().map(String::from)));
        match self.apply_command(index, command) {
            Ok(Applied::Removed { consumers, .. }) => crate::broker::notify_cancelled(&consumers),
            Ok(_) => {}
            Err(error) => tracing::warn!(index, %error, command = ?kind, "a command of the metadata snapshot did not apply"),
        }
    }

    /// The quorum shards' leaders make the cluster's members their shards' members: told once
    /// this node has applied its whole metadata log (during a restart's replay the membership
    /// passes through older states, which must not remove anyone from a shard).
    fn share_members_with_quorum_shards(&self, view: &GroupView, is_member: bool) {
        let last_run = self.cluster.last_index_at_start.load(std::sync::atomic::Ordering::Acquire);
        if !is_member || view.leader.is_none() || view.applied < view.commit || view.applied < last_run {
            return;
        }
        if let Some(broker) = self.cluster.broker() {
            broker.quorum.set_cluster_members(view.voters.iter().chain(&view.learners).copied().collect());
        }
    }

    /// This node was removed from the cluster: it records that and shuts down gracefully.
    fn leave_now(&self) {
        self.cluster.left.store(true, std::sync::atomic::Ordering::Release);
        self.cluster.update_node_state(|state| state.membership = Membership::Left);
        self.cluster.events.lock().take();
        tracing::warn!("this node left its cluster: shutting down (its data directory is not used again)");
        // SAFETY: signalling our own process; SIGTERM starts the graceful shutdown.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGTERM);
        }
    }
}
