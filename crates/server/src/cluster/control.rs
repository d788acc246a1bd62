//! Forming, joining and leaving the cluster, and the control requests nodes send each other.
//!
//! Formation (decided; docs/cluster.md "Bootstrap"): the founding nodes are the seeds. Each
//! founding node's Raft id is derived from the cluster name and its seed address, so every seed
//! computes the same voter set from the same list, and the metadata group starts with those
//! voters on every founding node. Raft then forms the cluster when a majority of the seeds is up:
//! the first leader is elected by a majority, and names the cluster (`CreateCluster`). No node
//! decides alone, so two halves of a seed list can never form two clusters.
//!
//! A fresh node that finds a formed cluster among its links asks to join: a founding seed that
//! never held data takes its place as the voter it was meant to be; any other node is added as a
//! learner (raft-rs `AddLearnerNode`, with its name and address as the change's context), which
//! the leader promotes to voter once it holds the commit index (`promotion.rs`): a voter still
//! catching up would count toward the majority without being able to acknowledge. A fresh node
//! whose id is a voter that once held data (its disk was replaced) is refused until an operator
//! forgets the old one: a voter that lost its log must not vote as if it had it.

use super::command::{MemberContext, MetadataCommand};
use super::group::{GroupEvent, METADATA_GROUP};
use super::link::LinkHandler;
use super::node_state::{random_id, seed_id, Membership, NodeState};
use super::settings::ClusterSettings;
use super::{Cluster, ClusterStartError};
use crate::stream::replication::{StreamKey, STREAM_REPLICATION_CHANNEL};
use bytes::Bytes;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often a fresh node looks at its links to form or join.
const BOOTSTRAP_POLL_MS: u64 = 300;
/// How long a join or forget waits for the membership change to commit.
const MEMBERSHIP_CHANGE_TIMEOUT_MS: u64 = 15_000;

/// A request between nodes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum ControlRequest {
    /// A fresh node asks to become a member.
    Join {
        /// Its Raft id.
        id: u64,
        /// Its name.
        name: String,
        /// Its address.
        address: String,
    },
    /// An election of a stream's leader asks for the end of this node's copy, and fences it
    /// at `epoch` (stream replication).
    StreamTail {
        /// Vhost.
        vhost: String,
        /// Stream queue.
        name: String,
        /// The epoch being elected.
        epoch: u64,
    },
}

/// The answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum ControlAnswer {
    /// Member now (or a founding node that may take its place): start the log from these voters.
    Accepted {
        /// The cluster's id.
        cluster_id: u64,
        /// The voters the log starts from.
        initial_voters: Vec<u64>,
        /// The metadata index applied when the join was accepted (0 from a node before it).
        #[serde(default)]
        history_index: u64,
    },
    /// The end of a stream's copy: its last chunk's epoch and the offset after it.
    StreamTail {
        /// Last epoch.
        last_epoch: u64,
        /// Next offset.
        next_offset: u64,
    },
    /// Refused, and why.
    Refused {
        /// The reason, for the operator.
        reason: String,
    },
}

/// The stored state, or a new one for a node's first clustered start.
pub fn load_or_create_state(data_dir: &Path, settings: &ClusterSettings, advertise: &str) -> Result<NodeState, ClusterStartError> {
    if let Some(state) = NodeState::load(data_dir).map_err(ClusterStartError::Refused)? {
        if state.membership == Membership::Left {
            return Err(ClusterStartError::Refused(format!(
                "this data directory's node left cluster {:x}: remove {} to start a new node",
                state.cluster_id,
                data_dir.display()
            )));
        }
        if state.cluster_name != settings.cluster_name {
            return Err(ClusterStartError::Refused(format!(
                "this data directory belongs to cluster name '{}', not '{}'",
                state.cluster_name, settings.cluster_name
            )));
        }
        return Ok(state);
    }
    let founding = settings.seeds.is_empty() || settings.seeds.iter().any(|seed| seed == advertise);
    let initial_voters: Vec<u64> = if settings.seeds.is_empty() {
        vec![seed_id(&settings.cluster_name, advertise)]
    } else {
        settings.seeds.iter().map(|seed| seed_id(&settings.cluster_name, seed)).collect()
    };
    let node_id = if founding { seed_id(&settings.cluster_name, advertise) } else { random_id() };
    let state = NodeState {
        node_id,
        node_name: settings.node_name.clone(),
        cluster_name: settings.cluster_name.clone(),
        cluster_id: 0,
        initial_voters: if founding { initial_voters } else { Vec::new() },
        membership: Membership::Fresh,
        history_index: 0,
    };
    state.store(data_dir).map_err(ClusterStartError::Refused)?;
    Ok(state)
}

/// Forms or joins the cluster in the background (a fresh node).
pub fn start_bootstrap(cluster: &Arc<Cluster>) {
    let cluster = cluster.clone();
    let spawned = std::thread::Builder::new().name("cluster-bootstrap".to_string()).spawn(move || bootstrap(&cluster));
    if let Err(error) = spawned {
        tracing::error!(%error, "starting the cluster bootstrap failed");
    }
}

fn bootstrap(cluster: &Arc<Cluster>) {
    let mut last_refusal = Instant::now() - Duration::from_secs(60);
    loop {
        if cluster.is_member() || cluster.left.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let founding = !cluster.node_state.lock().initial_voters.is_empty();
        let peers: Vec<_> = cluster.links.peers().into_iter().filter(|peer| peer.connected).collect();
        let formed: Vec<_> = peers.iter().filter(|peer| peer.hello.cluster_id != 0).collect();
        if let Some(peer) = formed.first() {
            match ask_to_join(cluster, peer.hello.node_id) {
                Ok((cluster_id, initial_voters, history_index)) => {
                    return become_member(cluster, cluster_id, initial_voters, history_index);
                }
                Err(reason) if last_refusal.elapsed() > Duration::from_secs(10) => {
                    last_refusal = Instant::now();
                    tracing::error!(peer = %peer.hello.node_name, %reason, "joining the cluster was refused; retrying");
                }
                Err(_) => {}
            }
        } else if founding && (cluster.settings.seeds.len() <= 1 || !peers.is_empty()) {
            // Every founding node starts the log from the same voters; Raft elects the first
            // leader once a majority of them is up.
            let initial_voters = cluster.node_state.lock().initial_voters.clone();
            return become_member(cluster, 0, initial_voters, 0);
        }
        std::thread::sleep(Duration::from_millis(BOOTSTRAP_POLL_MS));
    }
}

fn become_member(cluster: &Arc<Cluster>, cluster_id: u64, initial_voters: Vec<u64>, history_index: u64) {
    cluster.update_node_state(|state| {
        state.membership = Membership::Member;
        state.cluster_id = cluster_id;
        state.initial_voters = initial_voters;
        state.history_index = history_index;
    });
    cluster.links.set_cluster_id(cluster_id);
    match cluster.open_group() {
        Ok(()) => tracing::info!(cluster = %format!("{cluster_id:x}"), "this node is a member of its cluster"),
        Err(error) => tracing::error!(%error, "opening the metadata group failed"),
    }
}

fn ask_to_join(cluster: &Cluster, peer: u64) -> Result<(u64, Vec<u64>, u64), String> {
    let request =
        ControlRequest::Join { id: cluster.node_id, name: cluster.settings.node_name.clone(), address: cluster.advertise.clone() };
    let body = Bytes::from(serde_json::to_vec(&request).map_err(|error| error.to_string())?);
    let answer = cluster
        .links
        .request_blocking(peer, body, Duration::from_millis(MEMBERSHIP_CHANGE_TIMEOUT_MS + 2_000))
        .map_err(|error| error.to_string())?;
    match serde_json::from_slice(&answer).map_err(|error| error.to_string())? {
        ControlAnswer::Accepted { cluster_id, initial_voters, history_index } => Ok((cluster_id, initial_voters, history_index)),
        ControlAnswer::Refused { reason } => Err(reason),
        ControlAnswer::StreamTail { .. } => Err("an answer to another question".to_string()),
    }
}

impl Cluster {
    /// Answers a fresh node's join (on a member).
    fn answer_join(&self, id: u64, name: String, address: String) -> ControlAnswer {
        let refused = |reason: String| ControlAnswer::Refused { reason };
        let cluster_id = self.cluster_id();
        if cluster_id == 0 || !self.is_member() {
            return refused("the cluster has not formed yet".to_string());
        }
        let accepted = || ControlAnswer::Accepted {
            cluster_id,
            initial_voters: self.node_state.lock().initial_voters.clone(),
            history_index: self.group_view().applied,
        };
        let view = self.group_view();
        let members = self.state.lock().members.clone();
        if view.voters.contains(&id) {
            if members.contains_key(&id) {
                return refused(format!(
                    "node {name} (id {id:x}) is a member that held data, and this node is new: run `lepus ctl cluster forget {name}` on a running node first"
                ));
            }
            return accepted();
        }
        if let Some((other, _)) = members.iter().find(|(other, member)| member.name == name && **other != id) {
            return refused(format!("a node named {name} is a member already (id {other:x}): forget it first"));
        }
        // A learner first: it votes once the leader saw it hold the commit index (a learner that
        // asks again, its answer lost, is answered again: it never voted).
        let context = MemberContext { name, address };
        if let Err(reason) = self.change_membership(ConfChangeType::AddLearnerNode, id, Some(context)) {
            return refused(reason);
        }
        accepted()
    }

    /// Proposes a membership change and waits until it is applied here.
    fn change_membership(&self, kind: ConfChangeType, id: u64, context: Option<MemberContext>) -> Result<(), String> {
        let Some(events) = self.events.lock().clone() else { return Err("this node is not a member".to_string()) };
        let mut change = ConfChange { node_id: id, ..Default::default() };
        change.set_change_type(kind);
        if let Some(context) = context {
            change.context = serde_json::to_vec(&context).map_err(|error| error.to_string())?.into();
        }
        let deadline = Instant::now() + Duration::from_millis(MEMBERSHIP_CHANGE_TIMEOUT_MS);
        let done = |view: &super::GroupView| match kind {
            ConfChangeType::RemoveNode => !view.voters.contains(&id) && !view.learners.contains(&id),
            ConfChangeType::AddLearnerNode => view.voters.contains(&id) || view.learners.contains(&id),
            ConfChangeType::AddNode => view.voters.contains(&id),
        };
        let mut next_try = Instant::now();
        while Instant::now() < deadline {
            let view = self.group_view();
            if done(&view) {
                return Ok(());
            }
            // A leader drops a change proposed while another is in flight: ask again, slowly.
            if Instant::now() >= next_try && !view.conf_change_pending {
                let _ = events.try_send(GroupEvent::ConfChange(change.clone()));
                next_try = Instant::now() + Duration::from_millis(2_000);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("the membership change was not committed in time (is a majority up?)".to_string())
    }

    /// `lepus ctl cluster forget NODE`: removes a member that is not running.
    pub fn forget(&self, name: &str) -> Result<(), String> {
        let member = self.members().into_iter().find(|member| member.name == name);
        let Some(member) = member else { return Err(format!("node {name} is not a member of this cluster")) };
        if member.running {
            return Err(format!("node {name} is running: stop it first, or run `lepus ctl cluster leave` on it"));
        }
        if let Some(broker) = self.broker() {
            let members = self.members();
            let connected = |id: u64| members.iter().any(|other| other.id == id && other.running);
            broker.quorum.check_removal(member.id, connected).map_err(|reason| format!("node {name} is not forgotten: {reason}"))?;
        }
        self.change_membership(ConfChangeType::RemoveNode, member.id, None)
    }

    /// `lepus ctl cluster leave`: this node leaves its cluster; once the others agree it stops.
    pub fn leave(&self) -> Result<(), String> {
        if self.group_view().voters.len() <= 1 {
            return Err("this node is the cluster's only member: stop it instead".to_string());
        }
        self.change_membership(ConfChangeType::RemoveNode, self.node_id, None)
    }

    /// `lepus ctl cluster join ADDRESS`: a node that never held definitions joins the cluster
    /// at `address` (it forms one of its own otherwise, or when it has seeds).
    pub fn join(self: &Arc<Self>, address: &str) -> Result<(), String> {
        if self.is_member() {
            self.check_may_give_up_own_cluster()?;
            self.discard_own_cluster()?;
        }
        self.links.dial(address);
        let deadline = Instant::now() + Duration::from_millis(MEMBERSHIP_CHANGE_TIMEOUT_MS + 5_000);
        while Instant::now() < deadline {
            if self.is_member() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("no answer from a cluster at {address} in time"))
    }

    /// Only a cluster of one that holds nothing is given up for another: its definitions and
    /// its quorum queues' messages would be discarded, not carried over (a join brings nothing;
    /// the node takes the cluster's definitions and shards as they are).
    fn check_may_give_up_own_cluster(&self) -> Result<(), String> {
        let quorum_queues = self.broker().map(|broker| broker.quorum_queue_names()).unwrap_or_default();
        if !quorum_queues.is_empty() {
            return Err(format!(
                "this node holds quorum queues ({}) in its own cluster {:x}: joining another cluster would discard them; only a node that never held definitions joins (delete them, or export the definitions and import them into the other cluster, then join from a new data directory)",
                quorum_queues.join(", "),
                self.cluster_id()
            ));
        }
        let view = self.group_view();
        let changes = self.state.lock().definition_changes;
        // A learner that joined this node's cluster is a member too.
        let members = view.voters.len() + view.learners.len();
        if members > 1 || changes > 0 {
            return Err(format!(
                "this node is a member of cluster {:x} already (with {} members, {} definition changes); only a new node joins",
                self.cluster_id(),
                members,
                changes
            ));
        }
        Ok(())
    }

    /// Gives up a one-node cluster that holds nothing, to join another: the metadata group stops
    /// (no definition can change from now on), the quorum shards leave the groups they formed
    /// alone and wait, empty, for the founding voters the join's answer names, then the metadata
    /// log goes and the node is fresh again. The shards go first: a crash before the node is
    /// recorded fresh restarts it as the cluster of one it was, with empty shards (a new group of
    /// one each), never as a fresh node whose shards still lead their own groups.
    fn discard_own_cluster(self: &Arc<Self>) -> Result<(), String> {
        if let Some(events) = self.events.lock().take() {
            let _ = events.send(GroupEvent::Stop);
        }
        std::thread::sleep(Duration::from_millis(200));
        if let Some(broker) = self.broker() {
            if let Err(reason) = broker.quorum.leave_own_shards() {
                // Nothing was given up: the node goes on as the cluster it was (its log holds no
                // definition, so opening it again applies nothing twice).
                if let Err(error) = self.open_group() {
                    tracing::error!(%error, "opening the metadata group again failed: restart the node");
                }
                return Err(reason);
            }
        }
        let directory = self.data_dir.join("cluster").join("metadata");
        std::fs::remove_dir_all(&directory).map_err(|error| format!("{}: {error}", directory.display()))?;
        self.update_node_state(|state| {
            state.membership = Membership::Fresh;
            state.cluster_id = 0;
            state.initial_voters = Vec::new();
        });
        *self.state.lock() = super::ClusterState::default();
        self.links.set_cluster_id(0);
        *self.view.lock() = super::GroupView::default();
        start_bootstrap(self);
        Ok(())
    }
}

/// What the links hand the node.
pub struct Handler {
    /// The node's cluster half.
    pub cluster: Weak<Cluster>,
}

impl LinkHandler for Handler {
    fn raft(&self, from: u64, group: u32, message: Bytes) {
        let Some(cluster) = self.cluster.upgrade() else { return };
        let quorum = match cluster.broker() {
            Some(broker) if group != METADATA_GROUP && broker.quorum_links.is_member() => Some(broker),
            _ if group != METADATA_GROUP => {
                return tracing::debug!(from, group, "a Raft message for a group this node does not run; dropped");
            }
            _ => None,
        };
        match raft::eraftpb::Message::parse_from_bytes(&message) {
            // A quorum shard's message: the host checks it before stepping it.
            Ok(message) if message.from == from && quorum.is_some() => {
                if let Some(broker) = quorum {
                    broker.quorum.receive(group, message);
                }
            }
            Ok(message) if message.from == from => cluster.deliver_raft(message),
            Ok(message) => tracing::warn!(link = from, claimed = message.from, "a Raft message claims another sender; dropped"),
            Err(error) => tracing::warn!(from, %error, "a Raft message did not parse; dropped"),
        }
    }

    fn request(&self, from: u64, body: Bytes) -> Bytes {
        let answer = match (self.cluster.upgrade(), serde_json::from_slice::<ControlRequest>(&body)) {
            (Some(cluster), Ok(ControlRequest::Join { id, name, address })) if id == from => cluster.answer_join(id, name, address),
            (Some(cluster), Ok(ControlRequest::StreamTail { vhost, name, epoch })) => match cluster.broker() {
                Some(broker) => super::stream_links::answer_tail(&broker, &StreamKey { vhost, name }, epoch),
                None => ControlAnswer::Refused { reason: "shutting down".to_string() },
            },
            (_, Ok(_)) => ControlAnswer::Refused { reason: "a request on behalf of another node".to_string() },
            (None, _) => ControlAnswer::Refused { reason: "shutting down".to_string() },
            (_, Err(error)) => ControlAnswer::Refused { reason: format!("unknown request: {error}") },
        };
        Bytes::from(serde_json::to_vec(&answer).unwrap_or_default())
    }

    fn payload(&self, from: u64, channel: u8, body: Bytes) {
        let broker = self.cluster.upgrade().and_then(|cluster| cluster.broker());
        match (channel, broker) {
            (STREAM_REPLICATION_CHANNEL, Some(broker)) => super::stream_links::receive(&broker, from, body),
            _ => tracing::debug!(from, channel, "a payload for a protocol this node does not run; dropped"),
        }
    }

    fn peer_up(&self, peer: &super::frame::Hello) {
        // Management names the quorum shards' members after the nodes.
        if let Some(broker) = self.cluster.upgrade().and_then(|cluster| cluster.broker()) {
            broker.quorum.set_member_name(peer.node_id, peer.node_name.clone());
        }
    }

    fn peer_down(&self, _id: u64) {}
}

/// The metadata command that records this node's name and address (proposed once it has a log).
pub fn member_command(cluster: &Cluster) -> MetadataCommand {
    MetadataCommand::Member { id: cluster.node_id, name: cluster.settings.node_name.clone(), address: cluster.advertise.clone() }
}
