//! The broker's side of the metadata group (a child module of `broker.rs`, for its private
//! helpers): proposing a change when clustered, and applying committed ones on every node.
//!
//! Applying goes through the same broker methods a single node runs, with
//! [`crate::cluster::applying`] set so they change the node's state instead of proposing again.
//! Two things differ per node, both decided by the command and not by the node's own state, so
//! every node ends with the same topology: a classic queue is made with its log on the node that
//! declared it (`home`), and as a [`RemoteQueue`] placeholder everywhere else; an exclusive
//! queue's owner is that node's connection there, and [`REMOTE_OWNER`] elsewhere.

use super::{check_queue_limit, Broker, RecoveryError};
use crate::auth::{Permission, User};
use crate::cluster::{Applied, Cluster, ExchangeDeclarationRecord, MetadataCommand, QueueDeclaration, RemoteQueue};
use crate::metrics::counters::ChurnCounters;
use crate::policy::Policy;
use crate::queue_type::{capabilities, Queue};
use crate::shared::ConsumerHandle;
use crate::topic_permissions::{TopicPermission, TopicPermissions};
use crate::vhost_limits::{VhostLimit, VhostLimits};
use amqp_codec::ShortStr;
use broker_core::exchange::{Binding, Destination};
use broker_core::vhost::{ExchangeDeclaration, QueueDefinition, QueueType};
use broker_core::AmqpError;
use std::sync::Arc;
use storage::definitions::{table_from_hex, table_to_hex, BindingRecord, Definitions, PermissionRecord, TopicPermissionRecord, UserRecord};

/// The exclusive owner a queue owned by a connection of another node has here: no connection
/// id of this node is ever this, so every connection here gets 405 RESOURCE_LOCKED, as on
/// RabbitMQ.
pub const REMOTE_OWNER: u64 = u64::MAX;

/// The first connection id of a clustered node's run: random, so that a connection of this run
/// never takes the id that owned an exclusive queue in the last one (the metadata log names
/// owners by id; those queues are deleted once the node is back, see `stale_queues`).
pub fn first_connection_id() -> u64 {
    (rand::random::<u64>() >> 24).max(1) << 16
}

/// A clustered node starts from the embedded defaults and its metadata log; a data directory
/// that holds a single node's definitions is refused rather than silently ignored.
pub fn clustered_start(data_dir: &std::path::Path, recovered: Definitions) -> Result<Definitions, RecoveryError> {
    let single_node_definitions = !recovered.exchanges.is_empty()
        || !recovered.queues.is_empty()
        || !recovered.bindings.is_empty()
        || !recovered.policies.is_empty()
        || recovered.users.is_some()
        || !recovered.topic_permissions.is_empty()
        || recovered.vhosts.is_some();
    if single_node_definitions {
        return Err(RecoveryError::Io {
            path: data_dir.join("definitions.json"),
            source: std::io::Error::other(
                "this data directory holds a single node's definitions, which a clustered node does not take over: export them (lepus ctl export_definitions), start the cluster on new data directories, and import them there",
            ),
        });
    }
    Ok(Definitions::default())
}

/// The replicated form of exchange.declare.
pub fn exchange_command(vhost: &str, declaration: &ExchangeDeclaration) -> ExchangeDeclarationRecord {
    ExchangeDeclarationRecord {
        vhost: vhost.to_string(),
        name: declaration.name.to_string_lossy(),
        kind: declaration.kind.to_string_lossy(),
        durable: declaration.durable,
        auto_delete: declaration.auto_delete,
        internal: declaration.internal,
        arguments_hex: table_to_hex(&declaration.arguments),
    }
}

/// A stored or replicated binding: its source and the binding.
pub fn binding_from_record(record: &BindingRecord) -> (ShortStr, Binding) {
    let destination_name = ShortStr::truncating(record.destination.clone());
    let destination =
        if record.destination_is_exchange { Destination::Exchange(destination_name) } else { Destination::Queue(destination_name) };
    let binding = Binding {
        destination,
        routing_key: ShortStr::truncating(record.routing_key.clone()),
        arguments: table_from_hex(&record.arguments_hex).unwrap_or_default(),
    };
    (ShortStr::truncating(record.source.clone()), binding)
}

fn policy_error(error: impl std::fmt::Display) -> AmqpError {
    AmqpError::precondition(error.to_string())
}

impl Broker {
    /// The cluster to propose a change to: `None` on a single node, and while applying one.
    pub(super) fn replicating(&self) -> Option<&Arc<Cluster>> {
        if crate::cluster::applying() {
            return None;
        }
        self.cluster.get()
    }

    /// Adds or replaces a user. Returns whether it was new.
    pub fn put_user(&self, user: User) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            let record = UserRecord { name: user.name.clone(), password_hash: user.password_hash(), tags: user.tags.clone() };
            return cluster.propose(MetadataCommand::PutUser(record)).map(Applied::flag);
        }
        let created = self.users.put(user);
        self.persist()?;
        Ok(created)
    }

    /// Deletes a user with its permissions. Returns whether it existed.
    pub fn delete_user(&self, name: &str) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            return cluster.propose(MetadataCommand::DeleteUser { name: name.to_string() }).map(Applied::flag);
        }
        if !self.users.delete(name) {
            return Ok(false);
        }
        self.permissions.delete_user(name);
        self.topic_permissions.delete_user(name);
        self.persist()?;
        Ok(true)
    }

    /// Sets a user's permissions in a vhost.
    pub fn put_permission(&self, permission: Permission) -> Result<(), AmqpError> {
        if let Some(cluster) = self.replicating() {
            let record = PermissionRecord {
                user: permission.user.clone(),
                vhost: permission.vhost.clone(),
                configure: permission.configure.clone(),
                write: permission.write.clone(),
                read: permission.read.clone(),
            };
            return cluster.propose(MetadataCommand::PutPermission(record)).map(drop);
        }
        self.permissions.put(permission);
        self.persist()
    }

    /// Clears a user's permissions in a vhost. Returns whether there were any.
    pub fn delete_permission(&self, user: &str, vhost: &str) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            let command = MetadataCommand::DeletePermission { user: user.to_string(), vhost: vhost.to_string() };
            return cluster.propose(command).map(Applied::flag);
        }
        if !self.permissions.delete(user, vhost) {
            return Ok(false);
        }
        self.persist()?;
        Ok(true)
    }

    /// Sets a user's topic permission on an exchange of a vhost.
    pub fn put_topic_permission(&self, permission: TopicPermission) -> Result<(), AmqpError> {
        if let Some(cluster) = self.replicating() {
            return cluster.propose(MetadataCommand::PutTopicPermission(permission.to_record())).map(drop);
        }
        self.topic_permissions.put(permission).map_err(|error| AmqpError::precondition(error.to_string()))?;
        self.persist()
    }

    /// Clears a user's topic permissions in a vhost: on `exchange`, or on every exchange. Returns
    /// whether there were any.
    pub fn delete_topic_permissions(&self, user: &str, vhost: &str, exchange: Option<&str>) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            let command = MetadataCommand::DeleteTopicPermissions {
                user: user.to_string(),
                vhost: vhost.to_string(),
                exchange: exchange.map(str::to_string),
            };
            return cluster.propose(command).map(Applied::flag);
        }
        if !self.topic_permissions.delete(user, vhost, exchange) {
            return Ok(false);
        }
        self.persist()?;
        Ok(true)
    }

    /// Topic permissions as stored; one that does not compile (written by hand) is skipped.
    pub(super) fn recover_topic_permissions(&mut self, records: &[TopicPermissionRecord]) {
        let mut entries = Vec::with_capacity(records.len());
        for record in records {
            match TopicPermission::from_record(record) {
                Ok(permission) => entries.push(permission),
                Err(error) => tracing::error!(%error, user = %record.user, "a stored topic permission does not compile; skipped"),
            }
        }
        self.topic_permissions = TopicPermissions::from_entries(entries);
    }

    /// queue.declare of a new queue on a clustered node: proposed, then answered from this
    /// node's topology once applied here.
    pub(super) fn declare_queue_in_cluster(
        &self,
        cluster: &Cluster,
        vhost: &str,
        definition: QueueDefinition,
        server_named: bool,
    ) -> Result<(ShortStr, u32, u32), AmqpError> {
        let name = definition.name.clone();
        let queue_type = QueueType::from_arguments(&name, vhost, &definition.arguments)?;
        crate::queue_type::check_server_named(queue_type, server_named)?;
        let stream_members = match queue_type {
            QueueType::Stream => stream_members_at_declaration(cluster, &definition.arguments),
            _ => Vec::new(),
        };
        let declaration = QueueDeclaration {
            vhost: vhost.to_string(),
            name: name.to_string_lossy(),
            durable: definition.durable,
            exclusive_connection: definition.exclusive_owner,
            auto_delete: definition.auto_delete,
            arguments_hex: table_to_hex(&definition.arguments),
            server_named,
            home: cluster.node_id,
            stream_members,
        };
        cluster.propose(MetadataCommand::DeclareQueue(declaration))?;
        let queue = self.topology(vhost)?.read().queue(&name).map(|entry| entry.handle.clone());
        let queue =
            queue.ok_or_else(|| AmqpError::new(amqp_codec::constants::NOT_FOUND, format!("no queue '{name}' in vhost '{vhost}'")))?;
        let (messages, consumers) = queue.counts();
        Ok((name, messages, consumers))
    }

    /// Deletes a queue through the metadata group; this node's consumers of it come back.
    pub(super) fn remove_queue_in_cluster(
        &self,
        cluster: &Cluster,
        vhost: &str,
        name: &ShortStr,
        owner: Option<u64>,
    ) -> (u32, Vec<Arc<ConsumerHandle>>) {
        if self.vhost(vhost).is_none_or(|topology| topology.read().queue(name).is_none()) {
            return (0, Vec::new());
        }
        let command = MetadataCommand::DeleteQueue {
            vhost: vhost.to_string(),
            name: name.to_string_lossy(),
            owner_connection: owner,
            owner_node: cluster.node_id,
        };
        match cluster.propose(command) {
            Ok(Applied::Removed { ready, consumers }) => (ready, consumers),
            Ok(_) => (0, Vec::new()),
            Err(error) => {
                tracing::error!(%error, queue = %name, vhost, "deleting a queue through the cluster failed");
                (0, Vec::new())
            }
        }
    }

    /// Every quorum queue this node lists, as `'name' in vhost 'vhost'` (a cluster of one that holds one
    /// may not give its cluster up for another: `Cluster::join`).
    pub fn quorum_queue_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for (vhost, topology) in self.topologies() {
            let topology = topology.read();
            let quorum = topology.queues().filter(|entry| entry.definition.queue_type == QueueType::Quorum);
            names.extend(quorum.map(|entry| format!("'{}' in vhost '{vhost}'", entry.definition.name.to_string_lossy())));
        }
        names
    }

    /// The exclusive and transient queues this node held before it restarted (declared at or
    /// below `last_index_at_start` of its log): they went with the process, as on RabbitMQ, and
    /// the node deletes them through the cluster once it is back.
    pub fn stale_queues(
        &self,
        declared_here: &std::collections::HashMap<(String, ShortStr), u64>,
        last_index_at_start: u64,
    ) -> Vec<(String, ShortStr)> {
        let mut stale = Vec::new();
        for (vhost, topology) in self.topologies() {
            for entry in topology.read().queues() {
                let transient = !entry.definition.durable || entry.definition.exclusive_owner.is_some();
                let key = (vhost.clone(), entry.definition.name.clone());
                let before = declared_here.get(&key).is_some_and(|index| *index <= last_index_at_start);
                if transient && before && matches!(entry.handle, Queue::Classic(_)) {
                    stale.push(key);
                }
            }
        }
        stale
    }

    /// Removes the classic queues a forgotten member held (their messages went with it).
    pub fn forget_queues_of(&self, node: u64) {
        for (vhost, topology) in self.topologies() {
            let names: Vec<ShortStr> = topology
                .read()
                .queues()
                .filter(|entry| matches!(&entry.handle, Queue::Remote(queue) if queue.home_id == node))
                .map(|entry| entry.definition.name.clone())
                .collect();
            for name in names {
                self.remove_queue(&vhost, &name);
            }
        }
    }

    /// Applies one committed definition change (on every node, in log order). `index` is the
    /// entry's, which names the incarnation of a classic queue's log.
    pub fn apply_metadata(&self, index: u64, command: MetadataCommand, node_id: u64, cluster: &Cluster) -> Result<Applied, AmqpError> {
        let flag = Applied::Flag;
        match command {
            MetadataCommand::CreateCluster { .. }
            | MetadataCommand::Member { .. }
            | MetadataCommand::ShardRole { .. }
            | MetadataCommand::StreamLeader { .. } => Ok(Applied::Done),
            MetadataCommand::PutVhost { name, description, tags, default_queue_type } => {
                let default_queue_type = default_queue_type.as_deref().and_then(QueueType::from_name);
                self.put_vhost(&name, description, tags, default_queue_type).map(flag)
            }
            MetadataCommand::DeleteVhost { name } => self.delete_vhost(&name).map(flag),
            MetadataCommand::SetVhostLimit { vhost, limit, value } => {
                let limit = VhostLimit::parse(&limit).ok_or_else(|| AmqpError::precondition(format!("unknown vhost limit '{limit}'")))?;
                self.set_vhost_limit(&vhost, limit, value).map(flag)
            }
            MetadataCommand::SetVhostLimits { vhost, limits } => {
                let limits = VhostLimits::from_map(&limits).map_err(policy_error)?;
                self.set_vhost_limits(&vhost, limits).map(flag)
            }
            MetadataCommand::PutPolicy(record) => self.put_policy(Policy::from_record(&record).map_err(policy_error)?).map(flag),
            MetadataCommand::DeletePolicy { vhost, name } => self.delete_policy(&vhost, &name).map(flag),
            MetadataCommand::PutOperatorPolicy(record) => {
                let policy = Policy::new_operator(
                    &record.vhost,
                    &record.name,
                    &record.pattern,
                    &record.apply_to,
                    record.priority,
                    record.definition,
                )
                .map_err(policy_error)?;
                self.put_operator_policy(policy).map(flag)
            }
            MetadataCommand::DeleteOperatorPolicy { vhost, name } => self.delete_operator_policy(&vhost, &name).map(flag),
            MetadataCommand::PutUser(record) => self.put_user(User::new(&record.name, record.password_hash, record.tags)).map(flag),
            MetadataCommand::DeleteUser { name } => self.delete_user(&name).map(flag),
            MetadataCommand::PutPermission(record) => {
                let permission = Permission::new(&record.user, &record.vhost, &record.configure, &record.write, &record.read)
                    .map_err(|error| AmqpError::precondition(error.to_string()))?;
                self.put_permission(permission).map(|()| Applied::Done)
            }
            MetadataCommand::DeletePermission { user, vhost } => self.delete_permission(&user, &vhost).map(flag),
            MetadataCommand::PutTopicPermission(record) => {
                let permission = TopicPermission::from_record(&record).map_err(|error| AmqpError::precondition(error.to_string()))?;
                self.put_topic_permission(permission).map(|()| Applied::Done)
            }
            MetadataCommand::DeleteTopicPermissions { user, vhost, exchange } => {
                self.delete_topic_permissions(&user, &vhost, exchange.as_deref()).map(flag)
            }
            MetadataCommand::DeclareExchange(record) => {
                let declaration = ExchangeDeclaration {
                    name: ShortStr::truncating(record.name),
                    kind: ShortStr::truncating(record.kind),
                    passive: false,
                    durable: record.durable,
                    auto_delete: record.auto_delete,
                    internal: record.internal,
                    arguments: table_from_hex(&record.arguments_hex).unwrap_or_default(),
                };
                self.declare_exchange(&record.vhost, &declaration).map(|()| Applied::Done)
            }
            MetadataCommand::DeleteExchange { vhost, name, if_unused } => {
                self.delete_exchange(&vhost, &ShortStr::truncating(name), if_unused).map(|()| Applied::Done)
            }
            MetadataCommand::DeclareQueue(declaration) => self.apply_queue_declaration(index, declaration, node_id, cluster),
            MetadataCommand::DeleteQueue { vhost, name, owner_connection, owner_node } => {
                let owner = owner_connection.map(|connection| if owner_node == node_id { connection } else { REMOTE_OWNER });
                if cluster.replaying(index) {
                    // Its shard applied the deletion in an earlier run: not proposed again.
                    self.forget_replayed_quorum_queue(&vhost, &ShortStr::truncating(name.clone()));
                }
                cluster.forget_stream(&crate::stream::replication::StreamKey { vhost: vhost.clone(), name: name.clone() });
                let (ready, consumers) = self.remove_queue_quietly(&vhost, &ShortStr::truncating(name), owner);
                Ok(Applied::Removed { ready, consumers })
            }
            MetadataCommand::Bind(record) => {
                let (source, binding) = binding_from_record(&record);
                self.bind(&record.vhost, &source, binding).map(|()| Applied::Done)
            }
            MetadataCommand::Unbind(record) => {
                let (source, binding) = binding_from_record(&record);
                self.unbind(&record.vhost, &source, &binding).map(|()| Applied::Done)
            }
        }
    }

    fn apply_queue_declaration(
        &self,
        index: u64,
        declaration: QueueDeclaration,
        node_id: u64,
        cluster: &Cluster,
    ) -> Result<Applied, AmqpError> {
        let recorded = declaration.clone();
        let home_here = declaration.home == node_id;
        let owner = declaration.exclusive_connection.map(|connection| if home_here { connection } else { REMOTE_OWNER });
        let vhost_name = declaration.vhost.as_str();
        let definition = QueueDefinition {
            name: ShortStr::truncating(declaration.name.clone()),
            durable: declaration.durable,
            exclusive_owner: owner,
            auto_delete: declaration.auto_delete,
            arguments: table_from_hex(&declaration.arguments_hex).unwrap_or_default(),
            queue_type: QueueType::default(),
        };
        let storage = self.classic_storage();
        let replaying = cluster.replaying(index);
        let topology = self.topology(vhost_name)?;
        let queue_bound = self.vhost_bound(vhost_name, VhostLimit::MaxQueues);
        let home_name = cluster.member_name(declaration.home).unwrap_or_else(|| format!("{:x}", declaration.home));
        if home_here {
            cluster.declared_here(vhost_name, &ShortStr::truncating(declaration.name.clone()), index);
        }
        let (queue, created) = {
            let mut vhost = topology.write();
            if let Some(bound) = queue_bound {
                check_queue_limit(&vhost, &definition, false, declaration.server_named, bound)?;
            }
            let connection_id = owner.unwrap_or(0);
            let (entry, created) = vhost.declare_queue(definition, false, declaration.server_named, connection_id, |definition| {
                capabilities(definition.queue_type).check_declare(definition, vhost_name)?;
                if definition.queue_type == QueueType::Quorum {
                    return self.quorum_queue_of_cluster(definition, vhost_name, replaying, index);
                }
                if definition.queue_type == QueueType::Stream {
                    return self.stream_queue_of_cluster(definition, vhost_name, &declaration, replaying, cluster);
                }
                if !home_here {
                    let remote = RemoteQueue::new(definition.clone(), vhost_name, declaration.home, home_name.clone());
                    return Ok(Queue::Remote(Arc::new(remote)));
                }
                storage.open_incarnation(definition, vhost_name, index).map_err(|error| {
                    tracing::error!(%error, "creating a queue log failed");
                    AmqpError::internal(format!("could not create the queue's log: {error}"))
                })
            })?;
            (entry.handle.clone(), created)
        };
        ChurnCounters::count(&self.churn.queues_declared);
        if created {
            cluster.record_queue_declaration(index, &recorded);
            ChurnCounters::count(&self.churn.queues_created);
            queue.apply_policy(self.policy_for_queue(vhost_name, queue.definition()));
        }
        Ok(Applied::Flag(created))
    }

    /// A stream queue's copy on this node: its first leader is the declaring node, in epoch 1,
    /// unless the metadata group recorded a later one (a replay at start finds the latest by
    /// the `StreamLeader` entries that follow).
    fn stream_queue_of_cluster(
        &self,
        definition: &QueueDefinition,
        vhost_name: &str,
        declaration: &QueueDeclaration,
        replaying: bool,
        cluster: &Cluster,
    ) -> Result<Queue, AmqpError> {
        let key = crate::stream::replication::StreamKey { vhost: vhost_name.to_string(), name: declaration.name.clone() };
        let mut members = declaration.stream_members.clone();
        if members.is_empty() {
            members = cluster.members().iter().map(|member| member.id).collect();
        }
        members.sort_unstable();
        members.dedup();
        let leadership = crate::stream::replication::Leadership { epoch: 1, leader: declaration.home, members };
        cluster.record_new_stream(key, leadership.clone());
        let Some(arc_cluster) = self.cluster.get() else { return Err(AmqpError::internal("the node is not clustered")) };
        let setup = crate::queue_type::StreamReplicaSetup {
            leadership,
            live: !replaying,
            transport: arc_cluster.stream_transport(),
            syncer: self.syncer.clone(),
        };
        self.stream_storage().replicated(definition, vhost_name, replaying, setup).map_err(|error| {
            tracing::error!(%error, queue = %definition.name, "creating a stream's copy failed");
            AmqpError::internal(format!("could not create the stream: {error}"))
        })
    }

    /// A quorum queue, on every node alike: a live declaration is proposed to its shard by every
    /// node (the machine declares by name once, the others get the same id); one replayed from
    /// the metadata log at start is found by name once the shard applied its log (so is one a
    /// node that joined finds committed before its join). The declaration's log index is its
    /// incarnation, the same on every node.
    fn quorum_queue_of_cluster(
        &self,
        definition: &QueueDefinition,
        vhost_name: &str,
        replaying: bool,
        index: u64,
    ) -> Result<Queue, AmqpError> {
        let quorum = self.quorum_storage();
        Ok(match replaying {
            true => quorum.recover(definition, vhost_name, index),
            false => quorum.create(definition, vhost_name, index),
        })
    }

    /// A quorum queue whose deletion is replayed from the metadata log: its shard deleted it
    /// already, so its handle here is dropped without proposing the deletion again (which would
    /// find, by name, a later queue of the same name).
    fn forget_replayed_quorum_queue(&self, vhost: &str, name: &ShortStr) {
        let Some(topology) = self.vhost(vhost) else { return };
        let handle = topology.read().queue(name).map(|entry| entry.handle.clone());
        if let Some(Queue::Quorum(queue)) = handle {
            queue.forget_replayed_deletion();
        }
    }
}

/// A new stream's members, led first by this node: `x-initial-cluster-size` of them (every node
/// without it, as RabbitMQ's default), this node and then the running nodes before the others,
/// in id order. Every other node still keeps a copy, as a learner: it serves its own readers but
/// does not count toward the commit and is never elected (docs/streams.md, "Replication").
fn stream_members_at_declaration(cluster: &Cluster, arguments: &amqp_codec::FieldTable) -> Vec<u64> {
    let mut nodes = cluster.members();
    nodes.sort_by_key(|node| (node.id != cluster.node_id, !node.running, node.id));
    // The argument was checked already: a positive integer.
    let size = arguments.get("x-initial-cluster-size").and_then(|value| value.as_i64()).map_or(nodes.len(), |size| size.max(1) as usize);
    nodes.into_iter().take(size).map(|node| node.id).collect()
}
