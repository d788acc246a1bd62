//! The commands of the metadata group: every change of definitions made anywhere in the cluster,
//! applied in log order on every node (`apply.rs`). Entries are JSON (definition changes are
//! few and small; the readable log is worth more than the bytes).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use storage::definitions::{BindingRecord, PermissionRecord, PolicyRecord, TopicPermissionRecord, UserRecord};

/// One entry's data: who proposed it (to answer it) and what it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The node that proposed it.
    pub proposer: u64,
    /// Its number among that node's proposals (0: nobody waits for it).
    pub sequence: u64,
    /// The change.
    pub command: MetadataCommand,
}

/// A queue declaration as replicated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueDeclaration {
    /// Vhost.
    pub vhost: String,
    /// Name (a server-named queue's name is chosen by the proposer).
    pub name: String,
    /// Durable.
    pub durable: bool,
    /// The owning connection on `home`, for an exclusive queue.
    pub exclusive_connection: Option<u64>,
    /// Auto-delete.
    pub auto_delete: bool,
    /// Arguments, as `storage::definitions::table_to_hex` writes them.
    pub arguments_hex: String,
    /// Whether the name was chosen by the server (an `amq.` name is allowed then).
    pub server_named: bool,
    /// The node that declared it: a classic queue lives there (and a stream's first leader).
    pub home: u64,
    /// A stream queue's members (node ids), chosen by the declaring node: every member it knew.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stream_members: Vec<u64>,
}

/// An exchange declaration as replicated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExchangeDeclarationRecord {
    /// Vhost.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// Type name as sent.
    pub kind: String,
    /// Durable.
    pub durable: bool,
    /// Auto-delete.
    pub auto_delete: bool,
    /// Internal.
    pub internal: bool,
    /// Arguments (hex).
    pub arguments_hex: String,
}

/// A change of the cluster's definitions or membership.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum MetadataCommand {
    /// The first leader names the cluster.
    CreateCluster {
        /// A random id, said in every handshake from now on.
        cluster_id: u64,
    },
    /// An operator's choice of a node's role in quorum shards (`lepus ctl queues grow`,
    /// `shrink`, `add_member`, `delete_member`): a voter, or a learner that replicates and
    /// serves the shards without voting. Every shard's leader makes it so (`shard_roles.rs`).
    ShardRole {
        /// The node's Raft id.
        node: u64,
        /// The shards it applies to.
        shards: Vec<u32>,
        /// Voter (true) or learner (false).
        voter: bool,
    },
    /// A stream queue's leader, elected by a member when the last one fell silent (or given
    /// by the snapshot): applied only if its epoch is above the one in force.
    StreamLeader {
        /// Vhost.
        vhost: String,
        /// Queue name.
        name: String,
        /// The new epoch.
        epoch: u64,
        /// The new leader's node id.
        leader: u64,
        /// The members.
        members: Vec<u64>,
    },
    /// A member says who it is (its name and address), once it has a log.
    Member {
        /// Raft id.
        id: u64,
        /// Node name.
        name: String,
        /// Advertised cluster address.
        address: String,
    },
    /// Creates a vhost or changes its description and tags.
    PutVhost {
        /// Name.
        name: String,
        /// Description.
        description: String,
        /// Tags.
        tags: Vec<String>,
        /// The type of a queue declared without `x-queue-type` (taken when the vhost is created).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        default_queue_type: Option<String>,
    },
    /// Deletes a vhost and what is in it.
    DeleteVhost {
        /// Name.
        name: String,
    },
    /// Sets (or, with `None`, deletes) one limit of a vhost.
    SetVhostLimit {
        /// Vhost.
        vhost: String,
        /// The limit's name (`max-connections`, `max-queues`).
        limit: String,
        /// Its value.
        value: Option<i64>,
    },
    /// Replaces every limit of a vhost.
    SetVhostLimits {
        /// Vhost.
        vhost: String,
        /// Limits by name.
        limits: BTreeMap<String, i64>,
    },
    /// Adds or replaces a policy.
    PutPolicy(PolicyRecord),
    /// Deletes a policy.
    DeletePolicy {
        /// Vhost.
        vhost: String,
        /// Name.
        name: String,
    },
    /// Adds or replaces an operator policy.
    PutOperatorPolicy(PolicyRecord),
    /// Deletes an operator policy.
    DeleteOperatorPolicy {
        /// Vhost.
        vhost: String,
        /// Name.
        name: String,
    },
    /// Adds or replaces a user.
    PutUser(UserRecord),
    /// Deletes a user and its permissions.
    DeleteUser {
        /// Name.
        name: String,
    },
    /// Sets a user's permissions in a vhost.
    PutPermission(PermissionRecord),
    /// Clears a user's permissions in a vhost.
    DeletePermission {
        /// User.
        user: String,
        /// Vhost.
        vhost: String,
    },
    /// Sets a user's topic permission on an exchange of a vhost.
    PutTopicPermission(TopicPermissionRecord),
    /// Clears a user's topic permissions in a vhost.
    DeleteTopicPermissions {
        /// User.
        user: String,
        /// Vhost.
        vhost: String,
        /// The exchange; `None`: every exchange.
        exchange: Option<String>,
    },
    /// exchange.declare.
    DeclareExchange(ExchangeDeclarationRecord),
    /// exchange.delete.
    DeleteExchange {
        /// Vhost.
        vhost: String,
        /// Name.
        name: String,
        /// Only when it has no bindings from it.
        if_unused: bool,
    },
    /// queue.declare (not passive).
    DeclareQueue(QueueDeclaration),
    /// Deletes a queue.
    DeleteQueue {
        /// Vhost.
        vhost: String,
        /// Name.
        name: String,
        /// Only if this connection of `owner_node` owns it exclusively.
        owner_connection: Option<u64>,
        /// The node whose connection that is.
        owner_node: u64,
    },
    /// queue.bind / exchange.bind.
    Bind(BindingRecord),
    /// queue.unbind / exchange.unbind.
    Unbind(BindingRecord),
}

impl Proposal {
    /// The entry's data.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a proposal always serialises")
    }

    /// An entry's data back (an error is a bug of the proposer, not input to trust).
    pub fn decode(data: &[u8]) -> Result<Proposal, serde_json::Error> {
        serde_json::from_slice(data)
    }
}

/// The context of a configuration change: who joins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberContext {
    /// Node name.
    pub name: String,
    /// Advertised cluster address.
    pub address: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposals_round_trip() {
        let proposal = Proposal {
            proposer: 9,
            sequence: 4,
            command: MetadataCommand::DeclareQueue(QueueDeclaration {
                vhost: "/".into(),
                name: "q".into(),
                durable: true,
                exclusive_connection: None,
                auto_delete: false,
                arguments_hex: String::new(),
                server_named: false,
                home: 9,
                stream_members: Vec::new(),
            }),
        };
        assert_eq!(Proposal::decode(&proposal.encode()).expect("decodes"), proposal);
        assert!(Proposal::decode(b"{\"proposer\":1}").is_err());
    }
}
