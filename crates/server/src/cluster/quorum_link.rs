//! Quorum queues over the cluster's links: the quorum host's `PeerTransport` (docs/replication.md)
//! is the links' Raft frames, with the shard number as the frame's group (the metadata group is
//! `u32::MAX`, so the two never meet); frames of other groups that arrive are handed to the host
//! (`control::Handler::raft`).
//!
//! Decision: the quorum shards start with the cluster's founding nodes as voters (the seeds'
//! derived ids, the metadata group's initial voters), known from the settings before anything
//! runs, so the host starts with the broker, before the links exist: it sends nothing until they
//! are attached (Raft resends). A node that joins later opens its shards empty; once it knows the
//! founding voters (the join's answer) its shards start from them, and every shard's leader adds
//! it as a learner (`quorum/shard/membership.rs`), so it serves every quorum queue.

use super::link::Links;
use super::settings::ClusterSettings;
use crate::quorum::HostConfig;
use protobuf::Message as _;
use replication::transport::{PeerTransport, ShardId};
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The quorum host's transport on a clustered node: the links, once the cluster started.
#[derive(Default)]
pub struct QuorumLinks {
    links: OnceLock<Arc<Links>>,
    /// Whether this node runs the quorum shards with other nodes (every clustered node does).
    member: bool,
}

impl std::fmt::Debug for QuorumLinks {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("QuorumLinks").field("member", &self.member).field("attached", &self.links.get().is_some()).finish()
    }
}

impl QuorumLinks {
    /// Whether this node runs the quorum shards with the cluster's other nodes.
    pub fn is_member(&self) -> bool {
        self.member
    }

    /// From now on Raft messages of the shards leave through `links`.
    pub(super) fn attach(&self, links: Arc<Links>) {
        let _ = self.links.set(links);
    }
}

impl PeerTransport for QuorumLinks {
    fn send(&self, shard: ShardId, message: replication::Message) -> bool {
        let Some(links) = self.links.get() else { return false };
        if shard == super::group::METADATA_GROUP {
            return false;
        }
        match message.write_to_bytes() {
            Ok(bytes) => links.send_raft(message.to, shard, bytes.into()),
            Err(error) => {
                tracing::error!(%error, shard, "a quorum Raft message did not encode; dropped");
                false
            }
        }
    }
}

/// The quorum host's settings and transport: a node alone runs every shard as a group of one;
/// a clustered node runs them from the founding nodes as voters (a node that joined later learns
/// them at its join: `QuorumHost::set_initial_voters`).
pub fn host_config(
    settings: &ClusterSettings,
    bind_address: std::net::IpAddr,
    data_dir: &Path,
    shards: u32,
) -> Result<(HostConfig, Arc<QuorumLinks>), String> {
    let mut config = HostConfig::single_node(data_dir.to_path_buf(), shards);
    if !settings.enabled() {
        return Ok((config, Arc::new(QuorumLinks::default())));
    }
    let advertise = settings.advertised_address(bind_address)?;
    let state = super::control::load_or_create_state(data_dir, settings, &advertise).map_err(|error| error.to_string())?;
    config.node_id = state.node_id;
    config.voters = state.initial_voters.clone();
    Ok((config, Arc::new(QuorumLinks { links: OnceLock::new(), member: true })))
}
