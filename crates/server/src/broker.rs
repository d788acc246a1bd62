//! The broker: vhosts with their topology, users, storage, and the operations that change the
//! topology and must be persisted (declare, bind, delete).

use crate::auth::{Permission, Permissions, User, Users};
use crate::config::ServerConfig;
use crate::outbound::{ConnectionShared, ConsumerHandle, Outbound};
use crate::queue_runtime::{Pager, QueueRuntime};
use amqp_codec::{encode_method_frame, BasicCancel, Method, ShortStr};
use broker_core::exchange::{Binding, Destination, Exchange, ExchangeKind};
use broker_core::queue::QueueState;
use broker_core::vhost::{ExchangeDeclaration, QueueDefinition, Vhost};
use broker_core::AmqpError;
use bytes::BytesMut;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use storage::definitions::{
    table_from_hex, table_to_hex, BindingRecord, Definitions, DefinitionsStore, ExchangeRecord, PermissionRecord, QueueRecord, UserRecord,
};
use storage::queue_log::QueueLog;
use storage::syncer::Syncer;

/// A file written after a graceful shutdown flushed every log; its absence at start means a crash.
const CLEAN_SHUTDOWN_MARKER: &str = "clean-shutdown";

/// A queue handle as the topology holds it.
pub type QueueHandle = Arc<QueueRuntime>;

/// The whole broker, shared by every connection.
pub struct Broker {
    /// Settings.
    pub config: ServerConfig,
    /// Users.
    pub users: Users,
    /// Users' permissions in vhosts.
    pub permissions: Permissions,
    /// Group commit.
    pub syncer: Syncer,
    vhosts: HashMap<String, RwLock<Vhost<QueueHandle>>>,
    definitions: DefinitionsStore,
    /// Serialises rewrites of the definitions file, so the newest topology is the one on disk.
    definitions_write: Mutex<()>,
    next_connection_id: AtomicU64,
    /// Raised while free disk space is below the limit (see `disk.rs`).
    pub disk_alarm: std::sync::atomic::AtomicBool,
    /// Raised while the broker's memory is above the high watermark (see `disk.rs`).
    pub memory_alarm: std::sync::atomic::AtomicBool,
    /// Signalled when a resource alarm (disk or memory) is raised.
    pub disk_alarm_raised: tokio::sync::Notify,
    /// Signalled when a resource alarm clears.
    pub disk_alarm_cleared: tokio::sync::Notify,
    /// Open connections, to close them at shutdown (and, later, to list them).
    connections: Mutex<HashMap<u64, Arc<ConnectionShared>>>,
}

fn queue_log_path(data_dir: &std::path::Path, vhost: &str, name: &ShortStr) -> PathBuf {
    let mut key: Vec<u8> = vhost.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(name.as_bytes());
    let hex: String = key.iter().map(|byte| format!("{byte:02x}")).collect();
    data_dir.join("queues").join(hex)
}

impl Broker {
    /// Opens the data directory, recovers definitions and messages, starts the syncer.
    pub fn open(config: ServerConfig) -> Result<Arc<Broker>, String> {
        std::fs::create_dir_all(config.data_dir.join("queues")).map_err(|error| format!("{}: {error}", config.data_dir.display()))?;
        let definitions = DefinitionsStore::new(&config.data_dir);
        let mut broker = Broker {
            users: Users::default(),
            permissions: Permissions::default_for_guest(),
            syncer: Syncer::start(config.sync_policy),
            vhosts: HashMap::new(),
            definitions,
            definitions_write: Mutex::new(()),
            next_connection_id: AtomicU64::new(1),
            connections: Mutex::new(HashMap::new()),
            disk_alarm: std::sync::atomic::AtomicBool::new(false),
            memory_alarm: std::sync::atomic::AtomicBool::new(false),
            disk_alarm_cleared: tokio::sync::Notify::new(),
            disk_alarm_raised: tokio::sync::Notify::new(),
            config,
        };
        broker.vhosts.insert("/".to_string(), RwLock::new(Vhost::new("/")));
        broker.recover()?;
        Ok(Arc::new(broker))
    }

    fn recover(&mut self) -> Result<(), String> {
        let marker = self.config.data_dir.join(CLEAN_SHUTDOWN_MARKER);
        let clean_shutdown = marker.exists();
        if clean_shutdown {
            std::fs::remove_file(&marker).map_err(|error| format!("{}: {error}", marker.display()))?;
        }
        let definitions = self.definitions.load().map_err(|error| error.to_string())?;
        if let Some(users) = &definitions.users {
            self.users = Users::from_users(
                users.iter().map(|record| User::new(&record.name, record.password_hash.clone(), record.tags.clone())).collect(),
            );
        }
        if let Some(permissions) = &definitions.permissions {
            let mut entries = Vec::new();
            for record in permissions {
                match Permission::new(&record.user, &record.vhost, &record.configure, &record.write, &record.read) {
                    Ok(permission) => entries.push(permission),
                    Err(error) => tracing::error!(%error, user = %record.user, "a stored permission does not compile; skipped"),
                }
            }
            self.permissions = Permissions::from_entries(entries);
        }
        for record in &definitions.exchanges {
            let Some(vhost) = self.vhosts.get(&record.vhost) else {
                continue;
            };
            let Some(kind) = ExchangeKind::parse(record.kind.as_bytes()) else {
                continue;
            };
            let arguments = table_from_hex(&record.arguments_hex).unwrap_or_default();
            let exchange =
                Exchange::new(ShortStr::truncating(record.name.clone()), kind, true, record.auto_delete, record.internal, arguments);
            vhost.write().restore_exchange(exchange);
        }
        // Logs of queues deleted just before a crash, renamed away but not yet removed.
        storage::queue_log::remove_deleted_logs(&self.config.data_dir.join("queues"));
        let mut restored_messages = 0usize;
        for record in &definitions.queues {
            let Some(vhost) = self.vhosts.get(&record.vhost) else {
                continue;
            };
            let definition = QueueDefinition {
                name: ShortStr::truncating(record.name.clone()),
                durable: true,
                exclusive_owner: None,
                auto_delete: record.auto_delete,
                arguments: table_from_hex(&record.arguments_hex).unwrap_or_default(),
            };
            let path = queue_log_path(&self.config.data_dir, &record.vhost, &definition.name);
            let (log, recovery) = QueueLog::open(&path, self.config.segment_bytes_max).map_err(|error| error.to_string())?;
            for (file, offset) in &recovery.truncated {
                tracing::error!(file = %file.display(), offset, queue = %definition.name, "recovered the intact part of a damaged segment");
            }
            // Recovered messages stay on disk; the queue pages them in as consumers need them. After a
            // crash the delivered markers may be missing, so every recovered message may have been
            // delivered: the pager flags them all, as at-least-once allows.
            let pager = Pager::recovered(&log, &recovery, clean_shutdown);
            let messages = QueueState::with_paged(recovery.next_position, recovery.live_count);
            restored_messages += recovery.live_count as usize;
            let queue = QueueRuntime::new(definition.clone(), &record.vhost, Some(Arc::new(Mutex::new(log))), messages, pager);
            vhost.write().restore_queue(definition, queue);
        }
        for record in &definitions.bindings {
            let Some(vhost) = self.vhosts.get(&record.vhost) else {
                continue;
            };
            let destination_name = ShortStr::truncating(record.destination.clone());
            let destination =
                if record.destination_is_exchange { Destination::Exchange(destination_name) } else { Destination::Queue(destination_name) };
            let binding = Binding {
                destination,
                routing_key: ShortStr::truncating(record.routing_key.clone()),
                arguments: table_from_hex(&record.arguments_hex).unwrap_or_default(),
            };
            if let Err(error) = vhost.write().bind(&ShortStr::truncating(record.source.clone()), binding) {
                tracing::warn!(%error, "a stored binding could not be restored");
            }
        }
        tracing::info!(
            exchanges = definitions.exchanges.len(),
            queues = definitions.queues.len(),
            bindings = definitions.bindings.len(),
            messages = restored_messages,
            "recovered durable state"
        );
        Ok(())
    }

    /// Writes and syncs every queue log (graceful shutdown), so acks and unconfirmed publishes
    /// buffered in memory are not lost.
    pub fn flush_all(&self) {
        for vhost in self.vhosts.values() {
            for entry in vhost.read().queues() {
                let Some(log) = &entry.handle.log else {
                    continue;
                };
                let written = log.lock().write_pending();
                let synced = written
                    .map_err(|error| error.to_string())
                    .and_then(|files| files.iter().try_for_each(|file| file.sync_data()).map_err(|error| error.to_string()));
                if let Err(error) = synced {
                    tracing::error!(%error, "writing or syncing a queue log at shutdown failed");
                }
            }
        }
        if let Err(error) = storage::write_atomically(&self.config.data_dir.join(CLEAN_SHUTDOWN_MARKER), b"") {
            tracing::error!(%error, "writing the clean-shutdown marker failed");
        }
    }

    /// Records an open connection.
    pub fn register_connection(&self, connection: Arc<ConnectionShared>) {
        self.connections.lock().insert(connection.id, connection);
    }

    /// Forgets a closed connection.
    pub fn unregister_connection(&self, id: u64) {
        self.connections.lock().remove(&id);
    }

    /// Whether a resource alarm (disk or memory) blocks publishers now, and which.
    pub fn publishers_blocked_by(&self) -> Option<&'static str> {
        if self.disk_alarm.load(Ordering::Acquire) {
            Some("low on disk")
        } else if self.memory_alarm.load(Ordering::Acquire) {
            Some("low on memory")
        } else {
            None
        }
    }

    /// The names of every vhost.
    pub fn vhost_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.vhosts.keys().cloned().collect();
        names.sort();
        names
    }

    /// Every open connection's shared half.
    pub fn connection_handles(&self) -> Vec<Arc<ConnectionShared>> {
        self.connections.lock().values().cloned().collect()
    }

    /// Closes one connection with 320 CONNECTION_FORCED and `reason` (management API, ctl).
    /// Returns whether it was open.
    pub fn close_connection(&self, id: u64, reason: &str) -> bool {
        let connections = self.connections.lock();
        let Some(connection) = connections.get(&id) else { return false };
        *connection.close_reason.lock() = Some(reason.to_string());
        connection.force_close.notify_one();
        true
    }

    /// How many connections are open.
    pub fn connection_count(&self) -> usize {
        self.connections.lock().len()
    }

    /// Asks every connection to close with 320 CONNECTION_FORCED (graceful shutdown).
    pub fn close_all_connections(&self) {
        for connection in self.connections.lock().values() {
            connection.force_close.notify_one();
        }
    }

    /// A new connection id.
    pub fn next_connection_id(&self) -> u64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether a vhost exists.
    pub fn has_vhost(&self, name: &str) -> bool {
        self.vhosts.contains_key(name)
    }

    /// A vhost's topology.
    pub fn vhost(&self, name: &str) -> &RwLock<Vhost<QueueHandle>> {
        self.vhosts.get(name).expect("connections only hold vhosts that exist")
    }

    /// Writes every durable definition (also after a change of users or permissions).
    pub fn persist(&self) -> Result<(), AmqpError> {
        let _serialised = self.definitions_write.lock();
        let mut definitions = Definitions::default();
        for (vhost_name, vhost) in &self.vhosts {
            let vhost = vhost.read();
            let durable_exchange = |name: &ShortStr| vhost.exchange(name).is_some_and(|exchange| exchange.durable);
            for exchange in vhost.exchanges() {
                if exchange.durable && !exchange.name.is_empty() && !exchange.name.as_bytes().starts_with(b"amq.") {
                    definitions.exchanges.push(ExchangeRecord {
                        vhost: vhost_name.clone(),
                        name: exchange.name.to_string_lossy(),
                        kind: exchange.kind.name().to_string(),
                        auto_delete: exchange.auto_delete,
                        internal: exchange.internal,
                        arguments_hex: table_to_hex(&exchange.arguments),
                    });
                }
            }
            for entry in vhost.queues() {
                let definition = &entry.definition;
                if definition.durable && definition.exclusive_owner.is_none() {
                    definitions.queues.push(QueueRecord {
                        vhost: vhost_name.clone(),
                        name: definition.name.to_string_lossy(),
                        auto_delete: definition.auto_delete,
                        arguments_hex: table_to_hex(&definition.arguments),
                    });
                }
            }
            for (source, binding) in vhost.bindings() {
                let (destination, is_exchange, durable) = match &binding.destination {
                    Destination::Queue(name) => {
                        (name, false, vhost.queue(name).is_some_and(|q| q.definition.durable && q.definition.exclusive_owner.is_none()))
                    }
                    Destination::Exchange(name) => (name, true, durable_exchange(name)),
                };
                if source.durable && durable {
                    definitions.bindings.push(BindingRecord {
                        vhost: vhost_name.clone(),
                        source: source.name.to_string_lossy(),
                        destination: destination.to_string_lossy(),
                        destination_is_exchange: is_exchange,
                        routing_key: binding.routing_key.to_string_lossy(),
                        arguments_hex: table_to_hex(&binding.arguments),
                    });
                }
            }
        }
        definitions.users = Some(
            self.users
                .list()
                .iter()
                .map(|user| UserRecord { name: user.name.clone(), password_hash: user.password_hash(), tags: user.tags.clone() })
                .collect(),
        );
        definitions.permissions = Some(
            self.permissions
                .list()
                .iter()
                .map(|entry| PermissionRecord {
                    user: entry.user.clone(),
                    vhost: entry.vhost.clone(),
                    configure: entry.configure.clone(),
                    write: entry.write.clone(),
                    read: entry.read.clone(),
                })
                .collect(),
        );
        self.definitions.save(&definitions).map_err(|error| {
            tracing::error!(%error, "saving definitions failed");
            AmqpError::internal(format!("could not store definitions: {error}"))
        })
    }

    /// exchange.declare.
    pub fn declare_exchange(&self, vhost: &str, declaration: &ExchangeDeclaration) -> Result<(), AmqpError> {
        let created = self.vhost(vhost).write().declare_exchange(declaration)?;
        if created && declaration.durable {
            self.persist()?;
        }
        Ok(())
    }

    /// exchange.delete.
    pub fn delete_exchange(&self, vhost: &str, name: &ShortStr, if_unused: bool) -> Result<(), AmqpError> {
        let removed = self.vhost(vhost).write().delete_exchange(name, if_unused)?;
        if removed.is_some_and(|exchange| exchange.durable) {
            self.persist()?;
        }
        Ok(())
    }

    /// queue.declare; returns (name, ready messages, consumers).
    pub fn declare_queue(
        &self,
        vhost_name: &str,
        definition: QueueDefinition,
        passive: bool,
        server_named: bool,
        connection_id: u64,
    ) -> Result<(ShortStr, u32, u32), AmqpError> {
        let data_dir = self.config.data_dir.clone();
        let segment_bytes_max = self.config.segment_bytes_max;
        let mut log_error = None;
        let (queue, created) = {
            let mut vhost = self.vhost(vhost_name).write();
            let (entry, created) = vhost.declare_queue(definition, passive, server_named, connection_id, |definition| {
                let log = if definition.durable && definition.exclusive_owner.is_none() {
                    let path = queue_log_path(&data_dir, vhost_name, &definition.name);
                    // A queue declared anew starts with an empty log, whatever an older queue of
                    // the same name left behind.
                    let _ = std::fs::remove_dir_all(&path);
                    match QueueLog::open(&path, segment_bytes_max) {
                        Ok((log, _)) => Some(Arc::new(Mutex::new(log))),
                        Err(error) => {
                            log_error = Some(error.to_string());
                            None
                        }
                    }
                } else {
                    None
                };
                QueueRuntime::new(definition.clone(), vhost_name, log, QueueState::new(0), None)
            })?;
            (entry.handle.clone(), created)
        };
        if let Some(error) = log_error {
            tracing::error!(%error, "creating a queue log failed");
            self.remove_queue(vhost_name, queue.name());
            return Err(AmqpError::internal(format!("could not create the queue's log: {error}")));
        }
        if created && queue.definition.durable && queue.definition.exclusive_owner.is_none() {
            self.persist()?;
        }
        let (messages, consumers) = queue.counts();
        Ok((queue.name().clone(), messages, consumers))
    }

    /// Removes a queue: from the topology, its log, and its consumers (told with basic.cancel).
    /// Returns the ready messages it held.
    pub fn remove_queue(&self, vhost_name: &str, name: &ShortStr) -> u32 {
        let removed = self.vhost(vhost_name).write().remove_queue(name);
        let Some((entry, removed_exchanges)) = removed else {
            return 0;
        };
        let (count, consumers) = entry.handle.delete();
        notify_cancelled(&consumers);
        let durable = entry.definition.durable && entry.definition.exclusive_owner.is_none();
        if durable || removed_exchanges.iter().any(|exchange| exchange.durable) {
            if let Err(error) = self.persist() {
                tracing::error!(%error, "persisting a queue deletion failed");
            }
        }
        count
    }

    /// queue.bind / exchange.bind.
    pub fn bind(&self, vhost_name: &str, source: &ShortStr, binding: Binding) -> Result<(), AmqpError> {
        let added = self.vhost(vhost_name).write().bind(source, binding)?;
        if added {
            self.persist()?;
        }
        Ok(())
    }

    /// queue.unbind / exchange.unbind.
    pub fn unbind(&self, vhost_name: &str, source: &ShortStr, binding: &Binding) -> Result<(), AmqpError> {
        let (removed, _) = self.vhost(vhost_name).write().unbind(source, binding)?;
        if removed {
            self.persist()?;
        }
        Ok(())
    }
}

/// Tells each consumer's client that the broker cancelled it (queue deleted), when the client
/// said it understands basic.cancel from the broker.
pub fn notify_cancelled(consumers: &[Arc<ConsumerHandle>]) {
    for consumer in consumers {
        consumer.cancelled.store(true, Ordering::Release);
        let connection = &consumer.channel.connection;
        if connection.consumer_cancel_notify.load(Ordering::Acquire) && consumer.channel.ledger.lock().open {
            let mut frames = BytesMut::new();
            let cancel = Method::BasicCancel(BasicCancel { consumer_tag: consumer.tag.clone(), nowait: true });
            encode_method_frame(&mut frames, consumer.channel.id, &cancel);
            connection.send(Outbound::Frames(frames.freeze()));
        }
    }
}
