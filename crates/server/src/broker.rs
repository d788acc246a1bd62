//! The broker: vhosts with their topology, users, storage, and the operations that change the
//! topology and must be persisted (declare, bind, delete).

use crate::auth::{Permission, Permissions, User, Users};
use crate::cluster::{Applied, MetadataCommand};
use crate::config::ServerConfig;
use crate::metrics::counters::ChurnCounters;
use crate::policy::Policy;
use crate::queue_type::{capabilities, ClassicStorage, ClassicStorageError, Queue, QuorumStorage, RecoveredLog};
use crate::shared::{ConnectionShared, ConsumerHandle, Outbound};
use crate::vhost_limits::{VhostLimit, VhostLimits};
use amqp_codec::{encode_method_frame, BasicCancel, Method, ShortStr};
use broker_core::exchange::{Binding, Destination, Exchange, ExchangeKind};
use broker_core::vhost::{ExchangeDeclaration, QueueDefinition, QueueType, Vhost};
use broker_core::AmqpError;
use bytes::BytesMut;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use storage::definitions::{
    table_from_hex, table_to_hex, BindingRecord, Definitions, DefinitionsStore, DefinitionsTicket, ExchangeRecord, PermissionRecord,
    QueueRecord, UserRecord, VhostRecord,
};
use storage::definitions_state::{ControlPlaneRecord, DefinitionChange};
use storage::syncer::Syncer;
use storage::StorageError;

/// A queue handle as the topology holds it: any queue type, behind the seam.
pub type QueueHandle = Queue;

/// A vhost's topology, shared by the connections that opened it. A connection keeps its vhost's
/// topology for its life, so the publish path takes no broker-wide lock to find it.
pub type VhostTopology = Arc<RwLock<Vhost<QueueHandle>>>;

/// The most vhosts a broker holds; creating one more is refused (each costs a topology with its
/// predeclared exchanges).
pub const VHOSTS_MAX: usize = 4096;

/// The name of the vhost every broker has from its first start.
pub const DEFAULT_VHOST: &str = "/";

/// A vhost: its topology, what operators wrote about it, and its limits.
struct VhostSlot {
    topology: VhostTopology,
    description: String,
    tags: Vec<String>,
    /// `None` until a limit is first set or deleted (see [`VhostLimits`]).
    limits: Option<VhostLimits>,
    /// The type of a queue declared without `x-queue-type`, when the vhost was created with one.
    default_queue_type: Option<QueueType>,
}

impl VhostSlot {
    fn new(name: &str, description: String, tags: Vec<String>) -> VhostSlot {
        VhostSlot { topology: Arc::new(RwLock::new(Vhost::new(name))), description, tags, limits: None, default_queue_type: None }
    }
}

/// A vhost as listed by the management API.
#[derive(Debug, Clone)]
pub struct VhostInfo {
    /// Name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Free-form tags.
    pub tags: Vec<String>,
    /// Its limits, when any was ever set (see [`VhostLimits`]).
    pub limits: Option<VhostLimits>,
    /// The type of a queue declared without `x-queue-type`, when the vhost was created with one.
    pub default_queue_type: Option<QueueType>,
}

/// The whole broker, shared by every connection.
pub struct Broker {
    /// Settings.
    pub config: ServerConfig,
    /// Users.
    pub users: Users,
    /// Users' permissions in vhosts.
    pub permissions: Permissions,
    /// Users' topic permissions on exchanges (see `topic_permissions.rs`).
    pub topic_permissions: crate::topic_permissions::TopicPermissions,
    /// Group commit.
    pub syncer: Syncer,
    /// Whether queue logs write through the node journal (see storage/src/journal.rs).
    journaled: bool,
    /// Failed logins by client address (AMQP and HTTP).
    pub login_throttle: crate::login_throttle::LoginThrottle,
    /// Vhosts by name. Lock order: this map, then a topology; the map lock is held only to look
    /// up, add or remove an entry.
    vhosts: RwLock<BTreeMap<String, VhostSlot>>,
    /// Policies of every vhost, in no particular order (see `policy.rs`).
    policies: RwLock<Vec<Arc<Policy>>>,
    /// Operator policies: limits merged into whatever policy applies, the stricter value winning.
    operator_policies: RwLock<Vec<Arc<Policy>>>,
    definitions: DefinitionsStore,
    /// Durable queues in the topology whose definition may not be on disk yet: a confirm of a
    /// message routed into one waits for it ([`Broker::await_declared`]).
    pub(crate) declares_in_flight: declares_in_flight::DeclaresInFlight,
    /// Serialises writes of the control plane (users, permissions, vhosts, policies), each read
    /// whole, so the newest is the one on disk.
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
    /// Connections, channels and queues made and gone, for the metrics.
    pub churn: crate::metrics::counters::ChurnCounters,
    /// The message counters of closed channels (see `metrics::counters::RetiredTotals`).
    pub retired_channels: crate::metrics::counters::RetiredTotals,
    /// The RabbitMQ Stream protocol's message, refusal, publisher and subscription counters.
    pub stream_protocol: crate::metrics::counters::StreamProtocolCounters,
    /// Where queues hand their dead letters over (see `dead_letter`).
    dead_letters: crate::dead_letter::DeadLetterSender,
    /// Channels consuming `amq.rabbitmq.reply-to`, by token (see `direct_reply.rs`).
    pub reply_consumers: crate::direct_reply::ReplyConsumers,
    /// Deadlines of unused queues with x-expires (see `queue_expiry.rs`).
    pub expiry_timers: Arc<crate::queue_expiry::ExpiryTimers>,
    /// The node's quorum-queue shards (see `quorum/`).
    pub quorum: Arc<crate::quorum::QuorumHost>,
    /// The quorum shards' transport: the cluster's links once attached (none on a node alone).
    pub quorum_links: Arc<crate::cluster::QuorumLinks>,
    /// The store of messages held back by `x-delayed-message` exchanges (see `delayed`).
    pub delayed: Arc<crate::delayed::DelayedMessages>,
    /// The caches of deduplicating exchanges (see `dedup`).
    pub dedup_exchanges: crate::dedup::ExchangeCaches,
    /// The cluster half, when clustered (set once at start; see `cluster/`): definition changes
    /// are then proposed to the metadata group and applied on every node in log order.
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// The durable classic queues this start restored with their logs not yet recovered, for the
    /// walker (taken when it starts).
    unrecovered_queues: Mutex<Vec<std::sync::Weak<crate::queue_runtime::QueueRuntime>>>,
    /// Recovers those queues' logs in the background (see `recovery_walker.rs`).
    recovery_walker: std::sync::OnceLock<crate::recovery_walker::RecoveryWalker>,
    /// Whether the previous run stopped gracefully (a queue not recovered in this run keeps the
    /// log that run left).
    previous_run_clean: std::sync::atomic::AtomicBool,
}

/// The changes a clustered node applies from its metadata log (a child module: it reaches the
/// broker's private helpers).
#[path = "cluster/broker_apply.rs"]
mod cluster_apply;
pub(crate) mod declares_in_flight;

/// Why the broker could not open its data directory or recover from it. Each names the file or
/// the queue it concerns; the listener reports it and the start stops.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// A file or directory of the data directory could not be made, read or removed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The journal, the definitions or a queue log could not be read or replayed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A queue's log could not be recovered.
    #[error(transparent)]
    QueueLog(#[from] ClassicStorageError),
    /// The quorum queues' shards could not be opened.
    #[error(transparent)]
    Quorum(#[from] crate::quorum::HostError),
    /// The definitions name a queue of a type this build does not run.
    #[error("{file}: queue '{queue}' in vhost '{vhost}' is a {queue_type} queue, which Lepus does not run yet")]
    QueueTypeNotRun {
        /// The definitions file.
        file: std::path::PathBuf,
        /// The queue.
        queue: String,
        /// Its vhost.
        vhost: String,
        /// Its type's name.
        queue_type: &'static str,
    },
    /// A stream queue's stream could not be recovered.
    #[error("a stream could not be recovered: {0}")]
    Stream(String),
}

/// How long a start waits for the quorum shards to apply their logs (a node alone needs
/// milliseconds; a cluster node without a majority goes on without them).
const QUORUM_RECOVERY_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// What queue.declare answers: the queue's name, its ready messages and its consumers.
pub type DeclaredQueue = (ShortStr, u32, u32);

/// The most threads that open queue logs at once during a start (four per core, so reads that
/// wait for a cold disk overlap).
pub const RECOVERY_THREADS_MAX: usize = 16;

/// Replays the node journal the previous run left into the queue segments (before any queue log
/// is opened), then starts a new journal file.
fn replay_journal(data_dir: &std::path::Path) -> Result<storage::journal::Journal, StorageError> {
    let (mut journal, entries) = storage::journal::Journal::open(&data_dir.join("journal"))?;
    if !entries.is_empty() {
        let replayed = storage::journal::replay(&data_dir.join("queues"), &entries, storage::queue_log::is_past_every_segment)?;
        tracing::info!(applied = replayed.applied, skipped = replayed.skipped, "replayed the journal into the queue segments");
    }
    journal.start_new_file()?;
    Ok(journal)
}

impl Broker {
    /// Opens the data directory, recovers definitions and messages, starts the syncer.
    pub fn open(config: ServerConfig) -> Result<Arc<Broker>, RecoveryError> {
        std::fs::create_dir_all(config.data_dir.join("queues"))
            .map_err(|source| RecoveryError::Io { path: config.data_dir.clone(), source })?;
        std::fs::create_dir_all(config.data_dir.join(crate::queue_type::EXPIRY_DIRECTORY))
            .map_err(|source| RecoveryError::Io { path: config.data_dir.clone(), source })?;
        let (definitions, recovered) = DefinitionsStore::open(&config.data_dir)?;
        let journal = replay_journal(&config.data_dir)?;
        // Only `--sync always` syncs before confirms; the other policies write segments directly.
        let journaled = config.sync_policy == storage::syncer::SyncPolicy::Always;
        let (dead_letters, dead_letter_receiver) = crate::dead_letter::channel();
        let (mut quorum_config, quorum_links) =
            crate::cluster::quorum_host_config(&config.cluster, config.bind_address, &config.data_dir, config.quorum_shards)
                .map_err(|error| RecoveryError::Io { path: config.data_dir.clone(), source: std::io::Error::other(error) })?;
        quorum_config.dead_letter_retry_interval_ms = config.dead_letter_retry_interval_ms;
        let quorum = crate::quorum::QuorumHost::start(quorum_config, quorum_links.clone(), Some(dead_letters.clone()))?;
        let delayed = crate::delayed::DelayedMessages::open(&config.data_dir, config.segment_bytes_max, journaled)?;
        let mut broker = Broker {
            quorum,
            quorum_links,
            delayed: Arc::new(delayed),
            dedup_exchanges: crate::dedup::ExchangeCaches::new(config.data_dir.join("queues"), config.segment_bytes_max, journaled),
            dead_letters,
            journaled,
            users: Users::default(),
            permissions: Permissions::default_for_guest(),
            topic_permissions: crate::topic_permissions::TopicPermissions::default(),
            syncer: Syncer::start(config.sync_policy, journaled.then_some(journal)),
            login_throttle: Default::default(),
            vhosts: RwLock::new(BTreeMap::new()),
            policies: RwLock::new(Vec::new()),
            operator_policies: RwLock::new(Vec::new()),
            definitions,
            declares_in_flight: Default::default(),
            definitions_write: Mutex::new(()),
            // A clustered node's exclusive queues name their owner by connection id in the
            // metadata log; ids of a new incarnation must not be those of the last one.
            next_connection_id: AtomicU64::new(if config.cluster.enabled() { cluster_apply::first_connection_id() } else { 1 }),
            connections: Mutex::new(HashMap::new()),
            churn: Default::default(),
            retired_channels: Default::default(),
            stream_protocol: Default::default(),
            disk_alarm: std::sync::atomic::AtomicBool::new(false),
            memory_alarm: std::sync::atomic::AtomicBool::new(false),
            disk_alarm_cleared: tokio::sync::Notify::new(),
            disk_alarm_raised: tokio::sync::Notify::new(),
            expiry_timers: Arc::default(),
            reply_consumers: Default::default(),
            cluster: std::sync::OnceLock::new(),
            unrecovered_queues: Mutex::new(Vec::new()),
            recovery_walker: std::sync::OnceLock::new(),
            previous_run_clean: std::sync::atomic::AtomicBool::new(false),
            config,
        };
        broker.syncer.watch(broker.delayed.log().clone());
        // A clustered node's definitions come from its metadata log, not this file.
        let recovered =
            if broker.config.cluster.enabled() { cluster_apply::clustered_start(&broker.config.data_dir, recovered)? } else { recovered };
        broker.recover(recovered)?;
        let broker = Arc::new(broker);
        let unrecovered = std::mem::take(&mut *broker.unrecovered_queues.lock());
        let _ = broker.recovery_walker.set(crate::recovery_walker::RecoveryWalker::start(unrecovered, broker.config.data_dir.clone()));
        crate::dead_letter::start(Arc::downgrade(&broker), dead_letter_receiver);
        crate::delayed::start(&broker.delayed, Arc::downgrade(&broker));
        if broker.config.cluster.enabled() {
            crate::delayed::replicated::start(&broker);
        }
        Ok(broker)
    }

    fn recover(&mut self, definitions: Definitions) -> Result<(), RecoveryError> {
        let clean_shutdown = storage::take_clean_shutdown_marker(&*storage::file_system::real(), &self.config.data_dir)?;
        self.previous_run_clean.store(clean_shutdown, Ordering::Release);
        {
            let mut vhosts = self.vhosts.write();
            match &definitions.vhosts {
                Some(records) => {
                    for record in records {
                        let mut slot = VhostSlot::new(&record.name, record.description.clone(), record.tags.clone());
                        slot.limits = record.limits.as_ref().and_then(|limits| match VhostLimits::from_map(limits) {
                            Ok(limits) => Some(limits),
                            Err(unknown) => {
                                tracing::error!(vhost = %record.name, limit = %unknown, "a stored vhost limit is unknown; the vhost's limits are skipped");
                                None
                            }
                        });
                        slot.default_queue_type = record.default_queue_type.as_deref().and_then(QueueType::from_name);
                        vhosts.insert(record.name.clone(), slot);
                    }
                }
                None => {
                    vhosts.insert(DEFAULT_VHOST.to_string(), VhostSlot::new(DEFAULT_VHOST, "Default virtual host".to_string(), Vec::new()));
                }
            }
        }
        for record in &definitions.policies {
            match Policy::from_record(record) {
                Ok(policy) => self.policies.write().push(Arc::new(policy)),
                Err(error) => tracing::error!(%error, policy = %record.name, vhost = %record.vhost, "a stored policy is invalid; skipped"),
            }
        }
        for record in &definitions.operator_policies {
            let policy = Policy::new_operator(
                &record.vhost,
                &record.name,
                &record.pattern,
                &record.apply_to,
                record.priority,
                record.definition.clone(),
            );
            match policy {
                Ok(policy) => self.operator_policies.write().push(Arc::new(policy)),
                Err(error) => {
                    tracing::error!(%error, policy = %record.name, vhost = %record.vhost, "a stored operator policy is invalid; skipped")
                }
            }
        }
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
        self.recover_topic_permissions(&definitions.topic_permissions);
        for record in &definitions.exchanges {
            let Some(vhost) = self.vhost(&record.vhost) else {
                tracing::error!(vhost = %record.vhost, "a stored definition names a vhost that does not exist; skipped");
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
        if !self.config.cluster.enabled() {
            self.remove_orphaned_logs(&definitions.queues)?;
        }
        let restored_messages = self.recover_queues(&definitions.queues, clean_shutdown)?;
        // A clustered node's quorum queues come from its metadata log, once its links are up.
        if !self.config.cluster.enabled() && !self.quorum.wait_ready(QUORUM_RECOVERY_WAIT_MAX) {
            tracing::warn!("the quorum shards did not apply their logs within the start's wait; their queues catch up in the background");
        }
        for record in &definitions.bindings {
            let Some(vhost) = self.vhost(&record.vhost) else {
                tracing::error!(vhost = %record.vhost, "a stored definition names a vhost that does not exist; skipped");
                continue;
            };
            let (source, binding) = cluster_apply::binding_from_record(record);
            let bound = vhost.write().bind(&source, binding);
            if let Err(error) = bound {
                tracing::warn!(%error, "a stored binding could not be restored");
            }
        }
        for (vhost, topology) in self.topologies() {
            self.reapply_exchange_policies(&vhost, &topology);
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

    /// Removes the classic queue logs no durable queue definition names: a queue whose deletion
    /// was durable in the definitions, its log's removal cut short by a crash (found by the
    /// simulator, seed 173). Only directories named as a classic queue's log are considered.
    fn remove_orphaned_logs(&self, queues: &[QueueRecord]) -> Result<(), RecoveryError> {
        let defined: std::collections::HashSet<String> = queues
            .iter()
            .filter(|record| record.queue_type == QueueType::Classic)
            .map(|record| crate::queue_type::queue_file_name(&record.vhost, &ShortStr::truncating(record.name.clone())))
            .collect();
        let directory = self.config.data_dir.join("queues");
        storage::queue_log::remove_orphaned_logs_in(storage::file_system::real(), &directory, |name| {
            defined.contains(name) || !crate::queue_type::is_queue_file_name(name)
        })?;
        Ok(())
    }

    /// Recovers the durable queues with their messages; returns how many messages they hold.
    ///
    /// Their logs are opened on up to [`RECOVERY_THREADS_MAX`] threads at once (with a cold page
    /// cache a start waits on the disk, one read at a time per thread), the seals recovery
    /// writes are made durable with one sync of the file system, and then the queues are made.
    fn recover_queues(&self, records: &[QueueRecord], clean_shutdown: bool) -> Result<u64, RecoveryError> {
        let quorum = self.quorum_storage();
        let mut restored_messages = 0;
        // Classic queues' logs are opened together below, on several threads.
        let mut queues = Vec::with_capacity(records.len());
        for record in records {
            let Some(vhost) = self.vhost(&record.vhost) else {
                tracing::error!(vhost = %record.vhost, "a stored definition names a vhost that does not exist; skipped");
                continue;
            };
            // A file that names a type this build does not run was written by another build, and
            // running its queue as another type would break what its type promised.
            if !capabilities(record.queue_type).implemented {
                return Err(RecoveryError::QueueTypeNotRun {
                    file: self.config.data_dir.join("definitions.json"),
                    queue: record.name.clone(),
                    vhost: record.vhost.clone(),
                    queue_type: record.queue_type.name(),
                });
            }
            let definition = QueueDefinition {
                name: ShortStr::truncating(record.name.clone()),
                durable: true,
                exclusive_owner: None,
                auto_delete: record.auto_delete,
                arguments: table_from_hex(&record.arguments_hex).unwrap_or_default(),
                queue_type: record.queue_type,
            };
            let (queue, messages) = match definition.queue_type {
                QueueType::Quorum => (quorum.recover(&definition, &record.vhost, 0), 0),
                QueueType::Stream => {
                    self.stream_storage().recover(&definition, &record.vhost).map_err(|error| RecoveryError::Stream(error.to_string()))?
                }
                QueueType::Classic => {
                    queues.push((record, vhost, definition));
                    continue;
                }
            };
            restored_messages += messages;
            queue.apply_policy(self.policy_for_queue(&record.vhost, &definition));
            vhost.write().restore_queue(definition, queue);
        }
        // On a node alone, a queue's log is recovered after the start (at its first use, or by the
        // walker): the listeners accept connections without waiting for every queue's log.
        let lazy = !self.config.cluster.enabled();
        let (lazily, queues): (Vec<_>, Vec<_>) =
            queues.into_iter().partition(|(_, _, definition)| lazy && ClassicStorage::recovers_lazily(definition));
        let deferred = lazily.len();
        if deferred > 0 {
            let storage = self.classic_storage();
            let recovery = storage.lazy_recovery(clean_shutdown);
            let stored_last_uses = storage.stored_last_uses();
            let mut unrecovered = self.unrecovered_queues.lock();
            for (record, vhost, definition) in lazily {
                let queue = storage.restore_unrecovered(&definition, &record.vhost, recovery.clone(), stored_last_uses.as_ref());
                if let Queue::Classic(runtime) = &queue {
                    runtime.apply_policy(self.policy_for_queue(&record.vhost, &definition));
                    unrecovered.push(Arc::downgrade(runtime));
                }
                vhost.write().restore_queue(definition, queue);
            }
            tracing::info!(queues = deferred, "classic queues restored; their logs are recovered in the background or at first use");
        }
        let opened = self.open_recovered_logs(&queues)?;
        if opened.iter().any(RecoveredLog::seals_unsynced) {
            let data_dir = &self.config.data_dir;
            storage::file_system::real()
                .sync_file_system(data_dir)
                .map_err(|source| RecoveryError::Io { path: data_dir.clone(), source })?;
        }
        let storage = self.classic_storage();
        for ((record, vhost, definition), log) in queues.into_iter().zip(opened) {
            let (queue, messages) = storage.recover_opened(&definition, &record.vhost, clean_shutdown, log)?;
            restored_messages += messages;
            queue.apply_policy(self.policy_for_queue(&record.vhost, &definition));
            vhost.write().restore_queue(definition, queue);
        }
        Ok(restored_messages)
    }

    /// Opens the queues' logs, in their order, on several threads.
    fn open_recovered_logs(&self, queues: &[(&QueueRecord, VhostTopology, QueueDefinition)]) -> Result<Vec<RecoveredLog>, RecoveryError> {
        let threads = std::thread::available_parallelism().map_or(1, |cores| cores.get() * 4).min(RECOVERY_THREADS_MAX).min(queues.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (data_dir, segment_bytes_max) = (&self.config.data_dir, self.config.segment_bytes_max);
        let opened: Vec<Vec<(usize, Result<RecoveredLog, ClassicStorageError>)>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let index = next.fetch_add(1, Ordering::Relaxed);
                            let Some((record, _, definition)) = queues.get(index) else { break };
                            done.push((index, ClassicStorage::open_recovered_log(data_dir, segment_bytes_max, definition, &record.vhost)));
                        }
                        done
                    })
                })
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
        });
        let mut logs: Vec<Option<RecoveredLog>> = std::iter::repeat_with(|| None).take(queues.len()).collect();
        for (index, result) in opened.into_iter().flatten() {
            logs[index] = Some(result?);
        }
        Ok(logs.into_iter().map(|log| log.expect("every queue's log was opened")).collect())
    }

    /// Where classic queues keep their logs.
    fn classic_storage(&self) -> ClassicStorage<'_> {
        ClassicStorage {
            data_dir: &self.config.data_dir,
            segment_bytes_max: self.config.segment_bytes_max,
            journaled: self.journaled,
            syncer: &self.syncer,
            dead_letters: Some(&self.dead_letters),
            expiry_timers: &self.expiry_timers,
        }
    }

    /// Where quorum queues live.
    pub(crate) fn quorum_storage(&self) -> QuorumStorage<'_> {
        QuorumStorage { host: &self.quorum, expiry_timers: &self.expiry_timers, data_dir: &self.config.data_dir }
    }

    /// Where stream queues keep their streams.
    fn stream_storage(&self) -> crate::queue_type::StreamStorage<'_> {
        crate::queue_type::StreamStorage { data_dir: &self.config.data_dir, file_cache: storage::file_cache::FileCache::node() }
    }

    /// Writes and syncs every queue log (graceful shutdown), so acks and unconfirmed publishes
    /// buffered in memory are not lost.
    pub fn flush_all(&self) {
        // No queue's log is opened past this point by the walker (a chunk under way finishes).
        if let Some(walker) = self.recovery_walker.get() {
            walker.stop();
        }
        // No delayed message is routed past this point: its record stays, to be routed after the restart.
        self.delayed.stop();
        // The quorum shards' logs hold everything they committed; their threads stop first, so no
        // commit lands after the marker below.
        self.quorum.stop();
        if self.journaled {
            // Through the syncer, which owns the journal: every log written, journaled and synced,
            // then a checkpoint, so the next start has nothing to replay.
            let mut logs: Vec<_> = self
                .topologies()
                .iter()
                .flat_map(|(_, vhost)| vhost.read().queues().filter_map(|entry| entry.handle.durable_log().cloned()).collect::<Vec<_>>())
                .collect();
            logs.push(self.delayed.log().clone());
            logs.extend(self.queue_deduplication_logs());
            logs.extend(self.dedup_exchanges.logs());
            if !self.syncer.checkpoint(logs) {
                tracing::error!("the final checkpoint failed; the next start replays the journal");
            }
        } else {
            self.flush_all_unjournaled();
        }
        self.flush_streams();
        // The next start then reads one snapshot and an empty log.
        if let Err(error) = self.definitions.compact() {
            tracing::error!(%error, "compacting the definitions log at shutdown failed; the next start replays it");
        }
        // A queue never recovered in this run keeps the log the previous run left: after a crash
        // its delivered markers may be missing, so the next start must take it as a crash too.
        let all_recovered = self.recovery_walker.get().is_none_or(crate::recovery_walker::RecoveryWalker::all_recovered);
        if !all_recovered && !self.previous_run_clean.load(Ordering::Acquire) {
            tracing::warn!("some queue logs were not recovered since the crash before this run; no clean-shutdown marker");
        } else if let Err(error) = storage::write_clean_shutdown_marker(&*storage::file_system::real(), &self.config.data_dir) {
            tracing::error!(%error, "writing the clean-shutdown marker failed");
        }
    }

    /// The logs of the queues' deduplication caches.
    fn queue_deduplication_logs(&self) -> Vec<storage::syncer::SharedLog> {
        let topologies = self.topologies();
        topologies
            .iter()
            .flat_map(|(_, vhost)| vhost.read().queues().filter_map(|entry| entry.handle.deduplication_log()).collect::<Vec<_>>())
            .collect()
    }

    /// Writes, syncs and commits what every stream has appended (with `--sync interval` or
    /// `never` the last group commits did not fdatasync it).
    fn flush_streams(&self) {
        for (_, vhost) in self.topologies() {
            let streams: Vec<_> =
                vhost.read().queues().filter_map(|entry| entry.handle.as_stream().map(|queue| queue.stream.clone())).collect();
            for stream in streams {
                let written = stream.write_pending(storage::queue_log::SyncDue::Now);
                let synced = written.map_err(|error| error.to_string()).and_then(|written| {
                    written.sync_now.iter().try_for_each(|file| file.sync()).map_err(|error| error.to_string())?;
                    Ok(written.commit)
                });
                match synced {
                    Ok(Some(point)) => stream.commit(point),
                    Ok(None) => {}
                    Err(error) => {
                        tracing::error!(%error, directory = %stream.directory().display(), "writing or syncing a stream at shutdown failed")
                    }
                }
            }
        }
    }

    fn flush_all_unjournaled(&self) {
        let delayed = std::iter::once(self.delayed.log().clone()).chain(self.dedup_exchanges.logs()).chain(self.queue_deduplication_logs());
        let queue_logs = self
            .topologies()
            .into_iter()
            .flat_map(|(_, vhost)| vhost.read().queues().filter_map(|entry| entry.handle.durable_log().cloned()).collect::<Vec<_>>());
        for log in delayed.chain(queue_logs) {
            let written = log.lock().write_pending(storage::queue_log::SyncDue::Now).map(|written| written.sync_now);
            let synced = written
                .map_err(|error| error.to_string())
                .and_then(|files| files.iter().try_for_each(|file| file.sync()).map_err(|error| error.to_string()));
            if let Err(error) = synced {
                tracing::error!(%error, "writing or syncing a queue log at shutdown failed");
            }
        }
    }

    /// Records an open connection.
    pub fn register_connection(&self, connection: Arc<ConnectionShared>) {
        self.connections.lock().insert(connection.id, connection);
        ChurnCounters::count(&self.churn.connections_opened);
    }

    /// Forgets a closed connection (its traffic joins the closed connections' totals under the
    /// same lock as [`Broker::traffic_totals`] reads them, so those never go back).
    pub fn unregister_connection(&self, id: u64) {
        let mut connections = self.connections.lock();
        if let Some(connection) = connections.remove(&id) {
            ChurnCounters::count(&self.churn.connections_closed);
            self.churn.retire_traffic(&connection.traffic);
        }
    }

    /// Bytes received, socket reads, bytes sent and socket writes of every connection, open and
    /// closed: counters that never go back.
    pub fn traffic_totals(&self) -> [u64; 4] {
        let connections = self.connections.lock();
        let mut totals = self.churn.retired_traffic();
        for connection in connections.values() {
            for (total, value) in totals.iter_mut().zip(connection.traffic.read()) {
                *total += value;
            }
        }
        totals
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

    /// Every vhost with what operators wrote about it, sorted by name.
    pub fn vhost_infos(&self) -> Vec<VhostInfo> {
        self.vhosts
            .read()
            .iter()
            .map(|(name, slot)| VhostInfo {
                name: name.clone(),
                description: slot.description.clone(),
                tags: slot.tags.clone(),
                limits: slot.limits.clone(),
                default_queue_type: slot.default_queue_type,
            })
            .collect()
    }

    /// Every vhost's topology, sorted by name.
    pub fn topologies(&self) -> Vec<(String, VhostTopology)> {
        self.vhosts.read().iter().map(|(name, slot)| (name.clone(), slot.topology.clone())).collect()
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
        self.vhosts.read().contains_key(name)
    }

    /// A vhost's topology, if the vhost exists.
    pub fn vhost(&self, name: &str) -> Option<VhostTopology> {
        self.vhosts.read().get(name).map(|slot| slot.topology.clone())
    }

    /// A vhost's topology, or 404 when it was deleted (a connection to it is being closed).
    pub fn topology(&self, name: &str) -> Result<VhostTopology, AmqpError> {
        self.vhost(name).ok_or_else(|| AmqpError::new(amqp_codec::constants::NOT_FOUND, format!("no vhost '{name}'")))
    }

    /// Creates a vhost, or updates its description and tags. Returns whether it was created.
    /// `default_queue_type` is taken when the vhost is created, as RabbitMQ 3.10.8 takes it
    /// (`rabbit_vhost:put_vhost` updates only the description and tags of one that exists).
    pub fn put_vhost(
        &self,
        name: &str,
        description: String,
        tags: Vec<String>,
        default_queue_type: Option<QueueType>,
    ) -> Result<bool, AmqpError> {
        if name.is_empty() || name.len() > 255 {
            return Err(AmqpError::precondition("a vhost name must have 1 to 255 bytes"));
        }
        if let Some(cluster) = self.replicating() {
            let default_queue_type = default_queue_type.map(|queue_type| queue_type.name().to_string());
            let command = MetadataCommand::PutVhost { name: name.to_string(), description, tags, default_queue_type };
            return cluster.propose(command).map(Applied::flag);
        }
        let created = {
            let mut vhosts = self.vhosts.write();
            let count = vhosts.len();
            match vhosts.get_mut(name) {
                Some(slot) => {
                    slot.description = description;
                    slot.tags = tags;
                    false
                }
                None if count >= VHOSTS_MAX => {
                    return Err(AmqpError::precondition(format!("the broker holds {VHOSTS_MAX} vhosts, its limit")));
                }
                None => {
                    let slot = VhostSlot { default_queue_type, ..VhostSlot::new(name, description, tags) };
                    vhosts.insert(name.to_string(), slot);
                    true
                }
            }
        };
        self.persist()?;
        if created {
            tracing::info!(vhost = name, "vhost created");
        }
        Ok(created)
    }

    /// A vhost's limits: `None` when the vhost does not exist, `Some(None)` when it never had any.
    pub fn vhost_limits(&self, name: &str) -> Option<Option<VhostLimits>> {
        self.vhosts.read().get(name).map(|slot| slot.limits.clone())
    }

    /// Sets (`Some`) or deletes (`None`) one of a vhost's limits and stores it; as in RabbitMQ, a
    /// deletion leaves the vhost with a (possibly empty) set of limits. Returns whether the vhost
    /// exists. A lowered limit applies to what comes next: nothing open or declared is closed.
    pub fn set_vhost_limit(&self, name: &str, limit: VhostLimit, value: Option<i64>) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            let command = MetadataCommand::SetVhostLimit { vhost: name.to_string(), limit: limit.name().to_string(), value };
            return cluster.propose(command).map(Applied::flag);
        }
        match self.vhosts.write().get_mut(name) {
            Some(slot) => slot.limits.get_or_insert_with(VhostLimits::default).set(limit, value),
            None => return Ok(false),
        }
        self.persist()?;
        tracing::info!(vhost = name, limit = limit.name(), ?value, "vhost limit changed");
        Ok(true)
    }

    /// Replaces every limit of a vhost (definitions import) and stores them. Returns whether the
    /// vhost exists.
    pub fn set_vhost_limits(&self, name: &str, limits: VhostLimits) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            let command = MetadataCommand::SetVhostLimits { vhost: name.to_string(), limits: limits.to_map() };
            return cluster.propose(command).map(Applied::flag);
        }
        match self.vhosts.write().get_mut(name) {
            Some(slot) => slot.limits = Some(limits),
            None => return Ok(false),
        }
        self.persist()?;
        Ok(true)
    }

    /// The bound a vhost's limit puts on a count, when it has one.
    fn vhost_bound(&self, name: &str, limit: VhostLimit) -> Option<u64> {
        self.vhosts.read().get(name).and_then(|slot| slot.limits.as_ref()?.bound(limit))
    }

    /// Lets an authenticated connection into a vhost at connection.open, as RabbitMQ decides it:
    /// refused (530) when the vhost's `max-connections` is reached, then unless the user has a
    /// permission there. The count and the admission happen under the connections' lock, so
    /// connections opening at once cannot together pass the limit. Returns the user's permission.
    pub fn admit_to_vhost(&self, connection_id: u64, vhost: &str, user: &str) -> Result<Arc<Permission>, AmqpError> {
        let bound = self.vhost_bound(vhost, VhostLimit::MaxConnections);
        let connections = self.connections.lock();
        if let Some(bound) = bound {
            let open = connections.values().filter(|connection| connection.session.lock().vhost == vhost).count();
            if open as u64 >= bound {
                return Err(AmqpError::not_allowed(format!(
                    "access to vhost '{vhost}' refused for user '{user}': connection limit ({bound}) is reached"
                )));
            }
        }
        let permission = self
            .permissions
            .get(user, vhost)
            .ok_or_else(|| AmqpError::not_allowed(format!("access to vhost '{vhost}' refused for user '{user}'")))?;
        if let Some(connection) = connections.get(&connection_id) {
            connection.session.lock().vhost = vhost.to_string();
        }
        Ok(permission)
    }

    /// Deletes a vhost: closes its connections (320), deletes its queues with their logs, and
    /// forgets its permissions and policies, as RabbitMQ does. Returns whether it existed.
    pub fn delete_vhost(&self, name: &str) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            return cluster.propose(MetadataCommand::DeleteVhost { name: name.to_string() }).map(Applied::flag);
        }
        // Under the map's lock, so a vhost of the same name created next is stored after this.
        let (slot, ticket) = {
            let mut vhosts = self.vhosts.write();
            let Some(slot) = vhosts.remove(name) else {
                return Ok(false);
            };
            (slot, self.submit_definition(DefinitionChange::DeleteVhost { name: name.to_string() }))
        };
        for connection in self.connection_handles() {
            if connection.session.lock().vhost == name {
                self.close_connection(connection.id, &format!("vhost '{name}' is deleted"));
            }
        }
        let queues: Vec<QueueHandle> = slot.topology.read().queues().map(|entry| entry.handle.clone()).collect();
        for queue in queues {
            let (_, consumers) = queue.delete();
            notify_cancelled(&consumers);
        }
        self.permissions.remove_vhost(name);
        self.topic_permissions.remove_vhost(name);
        self.policies.write().retain(|policy| policy.vhost != name);
        self.operator_policies.write().retain(|policy| policy.vhost != name);
        self.await_definitions(ticket)?;
        self.persist()?;
        tracing::info!(vhost = name, "vhost deleted");
        Ok(true)
    }

    /// The policy that applies to a queue: the matching one of highest priority (ties: by name),
    /// with the limits of the matching operator policy of highest priority merged in.
    pub fn policy_for_queue(&self, vhost: &str, queue: &QueueDefinition) -> Option<Arc<Policy>> {
        let (name, target) = (queue.name.as_bytes(), crate::policy::Target::Queue(queue.queue_type));
        let policy = crate::policy::select(&self.policies.read(), vhost, name, target);
        let operator = crate::policy::select(&self.operator_policies.read(), vhost, name, target);
        crate::policy::merge_operator_policy(policy, operator)
    }

    /// Every operator policy, sorted by vhost and name.
    pub fn operator_policies(&self) -> Vec<Arc<Policy>> {
        let mut policies = self.operator_policies.read().clone();
        policies.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
        policies
    }

    /// Adds or replaces an operator policy and applies it. Returns whether it was new.
    pub fn put_operator_policy(&self, policy: Policy) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            return cluster.propose(MetadataCommand::PutOperatorPolicy(policy.to_record())).map(Applied::flag);
        }
        self.put_policy_in(&self.operator_policies, policy)
    }

    /// Deletes an operator policy and re-applies what remains. Returns whether it existed.
    pub fn delete_operator_policy(&self, vhost: &str, name: &str) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            let command = MetadataCommand::DeleteOperatorPolicy { vhost: vhost.to_string(), name: name.to_string() };
            return cluster.propose(command).map(Applied::flag);
        }
        self.delete_policy_in(&self.operator_policies, vhost, name)
    }

    /// The policy that applies to an exchange (its `alternate-exchange` is the one exchange
    /// setting Lepus implements).
    pub fn policy_for_exchange(&self, vhost: &str, exchange: &ShortStr) -> Option<Arc<Policy>> {
        crate::policy::select(&self.policies.read(), vhost, exchange.as_bytes(), crate::policy::Target::Exchange)
    }

    /// Every policy, sorted by vhost and name.
    pub fn policies(&self) -> Vec<Arc<Policy>> {
        let mut policies = self.policies.read().clone();
        policies.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
        policies
    }

    /// Adds or replaces a policy and applies it to the vhost's queues. Returns whether it was new.
    pub fn put_policy(&self, policy: Policy) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            return cluster.propose(MetadataCommand::PutPolicy(policy.to_record())).map(Applied::flag);
        }
        self.put_policy_in(&self.policies, policy)
    }

    fn put_policy_in(&self, list: &RwLock<Vec<Arc<Policy>>>, policy: Policy) -> Result<bool, AmqpError> {
        let vhost = policy.vhost.clone();
        self.topology(&vhost)?;
        let created = {
            let mut policies = list.write();
            let existed = policies.iter().position(|old| old.vhost == policy.vhost && old.name == policy.name);
            match existed {
                Some(index) => policies[index] = Arc::new(policy),
                None if policies.len() >= crate::policy::POLICIES_MAX => {
                    return Err(AmqpError::precondition(crate::policy::PolicyError::TooMany.to_string()));
                }
                None => policies.push(Arc::new(policy)),
            }
            existed.is_none()
        };
        self.persist()?;
        self.reapply_policies(&vhost);
        Ok(created)
    }

    /// Deletes a policy and re-applies what remains. Returns whether it existed.
    pub fn delete_policy(&self, vhost: &str, name: &str) -> Result<bool, AmqpError> {
        if let Some(cluster) = self.replicating() {
            let command = MetadataCommand::DeletePolicy { vhost: vhost.to_string(), name: name.to_string() };
            return cluster.propose(command).map(Applied::flag);
        }
        self.delete_policy_in(&self.policies, vhost, name)
    }

    fn delete_policy_in(&self, list: &RwLock<Vec<Arc<Policy>>>, vhost: &str, name: &str) -> Result<bool, AmqpError> {
        let removed = {
            let mut policies = list.write();
            let before = policies.len();
            policies.retain(|policy| !(policy.vhost == vhost && policy.name == name));
            policies.len() != before
        };
        if removed {
            self.persist()?;
            self.reapply_policies(vhost);
        }
        Ok(removed)
    }

    fn reapply_policies(&self, vhost: &str) {
        let Some(topology) = self.vhost(vhost) else { return };
        let queues: Vec<QueueHandle> = topology.read().queues().map(|entry| entry.handle.clone()).collect();
        for queue in queues {
            queue.apply_policy(self.policy_for_queue(vhost, queue.definition()));
        }
        self.reapply_exchange_policies(vhost, &topology);
    }

    /// Gives the vhost's exchanges their policies' alternate exchanges. The policies are copied
    /// first, so the policies' lock is never held with a topology's.
    fn reapply_exchange_policies(&self, vhost: &str, topology: &VhostTopology) {
        let policies = self.policies.read().clone();
        topology.write().set_policy_alternate_exchanges(|name| {
            let policy = crate::policy::select(&policies, vhost, name.as_bytes(), crate::policy::Target::Exchange)?;
            policy.alternate_exchange.as_deref().map(ShortStr::truncating)
        });
    }

    /// Writes the control plane: users, permissions, vhosts with their limits, and policies (after
    /// any change of one of them). Exchanges, queues and bindings are stored change by change as
    /// they are made ([`Broker::submit_definition`]).
    pub fn persist(&self) -> Result<(), AmqpError> {
        if self.config.cluster.enabled() {
            // The metadata log holds a clustered node's definitions.
            return Ok(());
        }
        let _serialised = self.definitions_write.lock();
        let vhosts = self
            .vhost_infos()
            .into_iter()
            .map(|info| VhostRecord {
                name: info.name,
                description: info.description,
                tags: info.tags,
                limits: info.limits.map(|limits| limits.to_map()),
                default_queue_type: info.default_queue_type.map(|queue_type| queue_type.name().to_string()),
            })
            .collect();
        let users = self
            .users
            .list()
            .iter()
            .map(|user| UserRecord { name: user.name.clone(), password_hash: user.password_hash(), tags: user.tags.clone() })
            .collect();
        let permissions = self
            .permissions
            .list()
            .iter()
            .map(|entry| PermissionRecord {
                user: entry.user.clone(),
                vhost: entry.vhost.clone(),
                configure: entry.configure.clone(),
                write: entry.write.clone(),
                read: entry.read.clone(),
            })
            .collect();
        let record = ControlPlaneRecord {
            users: Some(users),
            permissions: Some(permissions),
            topic_permissions: self.topic_permissions.list().iter().map(|entry| entry.to_record()).collect(),
            vhosts: Some(vhosts),
            policies: self.policies().iter().map(|policy| policy.to_record()).collect(),
            operator_policies: self.operator_policies().iter().map(|policy| policy.to_record()).collect(),
        };
        let ticket = self.definitions.submit(DefinitionChange::ControlPlane(record));
        self.await_definitions(Some(ticket))
    }

    /// Records a change of the durable definitions in the order the broker made it: call it while
    /// holding the lock under which the change was made (the vhost's topology), and pass the
    /// ticket to [`Broker::await_definitions`] after releasing it.
    fn submit_definition(&self, change: DefinitionChange) -> Option<DefinitionsTicket> {
        // The metadata log holds a clustered node's definitions.
        (!self.config.cluster.enabled()).then(|| self.definitions.submit(change))
    }

    /// Waits until a submitted change is on disk (the answer to the client is sent after).
    /// Waiting for the last of several tickets covers the earlier ones: changes are committed in
    /// the order they were submitted, and a commit that failed is folded into the next one's new
    /// snapshot.
    pub(crate) fn await_definitions(&self, ticket: Option<DefinitionsTicket>) -> Result<(), AmqpError> {
        let Some(ticket) = ticket else { return Ok(()) };
        // The fdatasync is waited for off the async runtime's hands (its other tasks move to
        // another worker meanwhile): a declare must not stall every connection on its worker.
        crate::quorum::block_outside_runtime(|| self.definitions.wait(ticket)).map_err(|error| {
            tracing::error!(%error, "saving definitions failed");
            AmqpError::internal(format!("could not store definitions: {error}"))
        })?;
        if self.declares_in_flight.any() {
            self.declares_in_flight.forget_durable();
        }
        Ok(())
    }

    /// Waits until the definition of each of `queues` whose declaration is in flight is on disk,
    /// before a confirm of a persistent message routed into them may go: the log's fdatasync
    /// alone would leave the message to a power cut that takes the definition (the next start
    /// removes the log as an orphan). Blocks on the definitions' fdatasync, as the declaring
    /// channel does, only in that moment; false when the definition could not be stored (the
    /// publish is then nacked). On a worker of the async runtime the wait is made with
    /// `block_in_place`, so the worker's other tasks move elsewhere meanwhile.
    pub fn await_declared(&self, queues: &[Queue]) -> bool {
        if !self.declares_in_flight.any() {
            return true;
        }
        for queue in queues {
            let Some(ticket) = self.declares_in_flight.ticket_of(queue) else { continue };
            // A failed commit's changes are folded into the next one, which stores them.
            let stored = crate::quorum::block_outside_runtime(|| {
                self.definitions.wait(ticket).or_else(|_| self.definitions.wait_for_everything_submitted())
            });
            if let Err(error) = stored {
                tracing::error!(%error, queue = %queue.name(), "a publish waited for its new queue's definition, which could not be stored");
                return false;
            }
            self.declares_in_flight.forget(queue);
        }
        true
    }

    /// exchange.declare.
    pub fn declare_exchange(&self, vhost: &str, declaration: &ExchangeDeclaration) -> Result<(), AmqpError> {
        let ticket = self.declare_exchange_unwaited(vhost, declaration)?;
        self.await_definitions(ticket)
    }

    /// exchange.declare, returning the ticket of the stored change to wait for before answering
    /// (see [`Broker::await_definitions`]), so pipelined declares can share one fdatasync.
    pub fn declare_exchange_unwaited(
        &self,
        vhost: &str,
        declaration: &ExchangeDeclaration,
    ) -> Result<Option<DefinitionsTicket>, AmqpError> {
        if let Some(cluster) = self.replicating() {
            if !declaration.passive && self.topology(vhost)?.read().exchange(&declaration.name).is_none() {
                return cluster
                    .propose(MetadataCommand::DeclareExchange(cluster_apply::exchange_command(vhost, declaration)))
                    .map(|_| None);
            }
        }
        let policy = self.policy_for_exchange(vhost, &declaration.name);
        let alternate = policy.and_then(|policy| policy.alternate_exchange.as_deref().map(ShortStr::truncating));
        let ticket = {
            let topology = self.topology(vhost)?;
            let mut topology = topology.write();
            let created = topology.declare_exchange(declaration)?;
            if created {
                topology.set_policy_alternate_exchange(&declaration.name, alternate);
                // A new exchange starts with an empty deduplication cache, whatever an older one left.
                self.dedup_exchanges.forget(vhost, &declaration.name);
            }
            let exchange = topology.exchange(&declaration.name).filter(|exchange| created && exchange.durable);
            exchange.and_then(|exchange| self.submit_definition(DefinitionChange::PutExchange(exchange_record(vhost, exchange))))
        };
        Ok(ticket)
    }

    /// exchange.delete.
    pub fn delete_exchange(&self, vhost: &str, name: &ShortStr, if_unused: bool) -> Result<(), AmqpError> {
        if let Some(cluster) = self.replicating() {
            if self.topology(vhost)?.read().exchange(name).is_some() {
                let command = MetadataCommand::DeleteExchange { vhost: vhost.to_string(), name: name.to_string_lossy(), if_unused };
                return cluster.propose(command).map(drop);
            }
        }
        let ticket = {
            let topology = self.topology(vhost)?;
            let mut topology = topology.write();
            // Deleting an exchange unbinds it from its sources; an auto-delete source that loses
            // its last binding that way goes too.
            let before: Vec<ShortStr> =
                topology.exchanges().filter(|exchange| exchange.durable).map(|exchange| exchange.name.clone()).collect();
            let removed = topology.delete_exchange(name, if_unused)?;
            self.dedup_exchanges.forget(vhost, name);
            let gone: Vec<ShortStr> = before.into_iter().filter(|name| topology.exchange(name).is_none()).collect();
            let changes =
                gone.into_iter().map(|name| DefinitionChange::DeleteExchange { vhost: vhost.to_string(), name: name.to_string_lossy() });
            let ticket = changes.filter_map(|change| self.submit_definition(change)).last();
            drop(removed);
            ticket
        };
        self.await_definitions(ticket)
    }

    /// A queue declared without `x-queue-type` in a vhost with a default queue type gets the
    /// argument naming it, when the type can have the queue (quorum queues and streams: durable,
    /// neither exclusive nor auto-delete), as `rabbit_amqqueue:augment_declare_args` in RabbitMQ
    /// 3.10.8 adds it. RabbitMQ does so for a queue.declare that is not passive, the management
    /// API's included (its plugin declares over an AMQP channel), not for a definitions import's
    /// (`rabbit_definitions` declares directly), and so does Lepus.
    pub fn with_default_queue_type(&self, vhost: &str, mut definition: QueueDefinition) -> QueueDefinition {
        let Some(default_type) = self.vhosts.read().get(vhost).and_then(|slot| slot.default_queue_type) else { return definition };
        let compatible =
            default_type == QueueType::Classic || (definition.durable && definition.exclusive_owner.is_none() && !definition.auto_delete);
        if compatible && definition.arguments.get(broker_core::vhost::QUEUE_TYPE_ARGUMENT).is_none() {
            let name = bytes::Bytes::from_static(default_type.name().as_bytes());
            definition.arguments.insert(broker_core::vhost::QUEUE_TYPE_ARGUMENT, amqp_codec::FieldValue::LongStr(name));
        }
        definition
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
        let (declared, ticket) = self.declare_queue_unwaited(vhost_name, definition, passive, server_named, connection_id)?;
        self.await_definitions(ticket)?;
        Ok(declared)
    }

    /// queue.declare, returning (name, ready messages, consumers) and the ticket of the stored
    /// change to wait for before answering (see [`Broker::await_definitions`]).
    pub fn declare_queue_unwaited(
        &self,
        vhost_name: &str,
        definition: QueueDefinition,
        passive: bool,
        server_named: bool,
        connection_id: u64,
    ) -> Result<(DeclaredQueue, Option<DefinitionsTicket>), AmqpError> {
        if let Some(cluster) = self.replicating() {
            if !passive && self.topology(vhost_name)?.read().queue(&definition.name).is_none() {
                return self.declare_queue_in_cluster(cluster, vhost_name, definition, server_named).map(|declared| (declared, None));
            }
        }
        let storage = self.classic_storage();
        let quorum = self.quorum_storage();
        let topology = self.topology(vhost_name)?;
        let queue_bound = self.vhost_bound(vhost_name, VhostLimit::MaxQueues);
        let (queue, created, ticket) = {
            let mut vhost = topology.write();
            if let Some(bound) = queue_bound {
                check_queue_limit(&vhost, &definition, passive, server_named, bound)?;
            }
            let (entry, created) = vhost.declare_queue(definition, passive, server_named, connection_id, |definition| {
                crate::queue_type::check_server_named(definition.queue_type, server_named)?;
                capabilities(definition.queue_type).check_declare(definition, vhost_name)?;
                if definition.queue_type == QueueType::Quorum {
                    return Ok(quorum.create(definition, vhost_name, 0));
                }
                if definition.queue_type == QueueType::Stream {
                    return self.stream_storage().create(definition, vhost_name).map_err(|error| {
                        tracing::error!(%error, "creating a stream failed");
                        AmqpError::internal(format!("could not create the stream: {error}"))
                    });
                }
                storage.create(definition, vhost_name).map_err(|error| {
                    tracing::error!(%error, "creating a queue log failed");
                    AmqpError::internal(format!("could not create the queue's log: {error}"))
                })
            })?;
            // A queue whose log could not be made was refused above, and is not in the topology.
            let stored = created && entry.definition.durable && entry.definition.exclusive_owner.is_none();
            let ticket =
                stored.then(|| self.submit_definition(DefinitionChange::PutQueue(queue_record(vhost_name, &entry.definition)))).flatten();
            // Under the write lock: whoever routes to the queue from now on sees it in flight.
            if let Some(ticket) = &ticket {
                self.declares_in_flight.add(&entry.handle, ticket.clone());
            }
            (entry.handle.clone(), created, ticket)
        };
        ChurnCounters::count(&self.churn.queues_declared);
        if created {
            ChurnCounters::count(&self.churn.queues_created);
            queue.apply_policy(self.policy_for_queue(vhost_name, queue.definition()));
        }
        if !created {
            queue.mark_used();
        }
        let (messages, consumers) = queue.counts();
        Ok(((queue.name().clone(), messages, consumers), ticket))
    }

    /// Removes a queue: from the topology, its log, and its consumers (told with basic.cancel).
    /// Returns the ready messages it held.
    pub fn remove_queue(&self, vhost_name: &str, name: &ShortStr) -> u32 {
        let (count, consumers) = self.remove_queue_quietly(vhost_name, name, None);
        notify_cancelled(&consumers);
        count
    }

    /// Removes a connection's exclusive queue, if it is still the one that connection owns: the
    /// queue may have been deleted meanwhile (auto-delete, the management API) and its name taken
    /// by another connection's queue, which must survive this connection's close.
    pub fn remove_exclusive_queue(&self, vhost_name: &str, name: &ShortStr, owner: u64) {
        let (_, consumers) = self.remove_queue_quietly(vhost_name, name, Some(owner));
        notify_cancelled(&consumers);
    }

    /// Removes a queue (only if `owner`, when given, owns it exclusively) and returns its ready
    /// messages and the consumers it had, which the caller tells of the cancel when it should:
    /// queue.delete answers delete-ok before the deleting channel's own consumers hear of it, as
    /// RabbitMQ orders them.
    pub fn remove_queue_quietly(&self, vhost_name: &str, name: &ShortStr, owner: Option<u64>) -> (u32, Vec<Arc<ConsumerHandle>>) {
        if let Some(cluster) = self.replicating() {
            return self.remove_queue_in_cluster(cluster, vhost_name, name, owner);
        }
        let Some(topology) = self.vhost(vhost_name) else { return (0, Vec::new()) };
        let removed = {
            let mut topology = topology.write();
            let owned = |owner: u64| topology.queue(name).is_some_and(|entry| entry.definition.exclusive_owner == Some(owner));
            if owner.is_some_and(|owner| !owned(owner)) {
                return (0, Vec::new());
            }
            let removed = topology.remove_queue(name);
            let ticket = removed.as_ref().and_then(|(entry, removed_exchanges)| {
                let durable = entry.definition.durable && entry.definition.exclusive_owner.is_none();
                let queue = durable.then(|| DefinitionChange::DeleteQueue { vhost: vhost_name.to_string(), name: name.to_string_lossy() });
                let exchanges = removed_exchanges.iter().filter(|exchange| exchange.durable).map(|exchange| {
                    DefinitionChange::DeleteExchange { vhost: vhost_name.to_string(), name: exchange.name.to_string_lossy() }
                });
                queue.into_iter().chain(exchanges).filter_map(|change| self.submit_definition(change)).last()
            });
            removed.map(|(entry, _)| (entry, ticket))
        };
        let Some((entry, ticket)) = removed else {
            return (0, Vec::new());
        };
        ChurnCounters::count(&self.churn.queues_deleted);
        // The deletion is durable in the definitions before the log goes: the other way round, a
        // crash between the two brought the queue back without its messages (found by the
        // simulator, seed 261). A log a crash leaves without its definition is removed at start.
        if let Err(error) = self.await_definitions(ticket) {
            tracing::error!(%error, "persisting a queue deletion failed");
        }
        let (count, consumers) = entry.handle.delete();
        self.classic_storage().note_deleted(&entry.definition, vhost_name);
        (count, consumers)
    }

    /// queue.bind / exchange.bind.
    pub fn bind(&self, vhost_name: &str, source: &ShortStr, binding: Binding) -> Result<(), AmqpError> {
        let ticket = self.bind_unwaited(vhost_name, source, binding)?;
        self.await_definitions(ticket)
    }

    /// queue.bind / exchange.bind, returning the ticket to wait for (see [`Broker::await_definitions`]).
    pub fn bind_unwaited(&self, vhost_name: &str, source: &ShortStr, binding: Binding) -> Result<Option<DefinitionsTicket>, AmqpError> {
        if let Some(cluster) = self.replicating() {
            return cluster.propose(MetadataCommand::Bind(binding_record(vhost_name, source, &binding))).map(|_| None);
        }
        let ticket = {
            let topology = self.topology(vhost_name)?;
            let mut topology = topology.write();
            let record = binding_record(vhost_name, source, &binding);
            let added = topology.bind(source, binding)?;
            let durable = added && binding_is_durable(&topology, source, &record);
            durable.then(|| self.submit_definition(DefinitionChange::PutBinding(record))).flatten()
        };
        Ok(ticket)
    }

    /// queue.unbind / exchange.unbind.
    pub fn unbind(&self, vhost_name: &str, source: &ShortStr, binding: &Binding) -> Result<(), AmqpError> {
        let ticket = self.unbind_unwaited(vhost_name, source, binding)?;
        self.await_definitions(ticket)
    }

    /// queue.unbind / exchange.unbind, returning the ticket to wait for (see [`Broker::await_definitions`]).
    pub fn unbind_unwaited(&self, vhost_name: &str, source: &ShortStr, binding: &Binding) -> Result<Option<DefinitionsTicket>, AmqpError> {
        if let Some(cluster) = self.replicating() {
            return cluster.propose(MetadataCommand::Unbind(binding_record(vhost_name, source, binding))).map(|_| None);
        }
        let ticket = {
            let topology = self.topology(vhost_name)?;
            let mut topology = topology.write();
            let (removed, removed_source) = topology.unbind(source, binding)?;
            // Deleting a record that was never stored (an end was not durable) changes nothing.
            let unbound = removed.then(|| DefinitionChange::DeleteBinding(binding_record(vhost_name, source, binding)));
            let source_gone = removed_source
                .filter(|exchange| exchange.durable)
                .map(|exchange| DefinitionChange::DeleteExchange { vhost: vhost_name.to_string(), name: exchange.name.to_string_lossy() });
            unbound.into_iter().chain(source_gone).filter_map(|change| self.submit_definition(change)).last()
        };
        Ok(ticket)
    }
}

/// The stored form of a durable exchange.
fn exchange_record(vhost: &str, exchange: &Exchange) -> ExchangeRecord {
    ExchangeRecord {
        vhost: vhost.to_string(),
        name: exchange.name.to_string_lossy(),
        kind: exchange.kind.name().to_string(),
        auto_delete: exchange.auto_delete,
        internal: exchange.internal,
        arguments_hex: table_to_hex(&exchange.arguments),
    }
}

/// The stored form of a durable queue.
fn queue_record(vhost: &str, definition: &QueueDefinition) -> QueueRecord {
    QueueRecord {
        vhost: vhost.to_string(),
        name: definition.name.to_string_lossy(),
        auto_delete: definition.auto_delete,
        arguments_hex: table_to_hex(&definition.arguments),
        queue_type: definition.queue_type,
    }
}

/// The stored form of a binding (stored only when both ends are durable).
fn binding_record(vhost: &str, source: &ShortStr, binding: &Binding) -> BindingRecord {
    let (destination, destination_is_exchange) = match &binding.destination {
        Destination::Queue(name) => (name, false),
        Destination::Exchange(name) => (name, true),
    };
    BindingRecord {
        vhost: vhost.to_string(),
        source: source.to_string_lossy(),
        destination: destination.to_string_lossy(),
        destination_is_exchange,
        routing_key: binding.routing_key.to_string_lossy(),
        arguments_hex: table_to_hex(&binding.arguments),
    }
}

/// Whether a binding survives a restart: its source is a durable exchange, and its destination a
/// durable exchange or a durable queue no connection owns.
fn binding_is_durable(vhost: &Vhost<QueueHandle>, source: &ShortStr, record: &BindingRecord) -> bool {
    let destination = ShortStr::truncating(record.destination.clone());
    let destination_durable = if record.destination_is_exchange {
        vhost.exchange(&destination).is_some_and(|exchange| exchange.durable)
    } else {
        vhost.queue(&destination).is_some_and(|entry| entry.definition.durable && entry.definition.exclusive_owner.is_none())
    };
    destination_durable && vhost.exchange(source).is_some_and(|exchange| exchange.durable)
}

/// Refuses a queue.declare that would create a queue in a vhost holding its `max-queues` (406),
/// checked where RabbitMQ checks it: after the reserved-name check and before the arguments.
pub(crate) fn check_queue_limit<Q: Clone>(
    vhost: &Vhost<Q>,
    definition: &QueueDefinition,
    passive: bool,
    server_named: bool,
    bound: u64,
) -> Result<(), AmqpError> {
    let reserved_name = !server_named && definition.name.as_bytes().starts_with(b"amq.");
    if passive || reserved_name || vhost.queue(&definition.name).is_some() {
        return Ok(());
    }
    // The map's length, not a walk of it: this runs on every declare in a vhost with a limit.
    if (vhost.queues().len() as u64) < bound {
        return Ok(());
    }
    Err(AmqpError::precondition(format!(
        "cannot declare queue '{}': queue limit in vhost '{}' ({bound}) is reached",
        definition.name, vhost.name
    )))
}

/// Tells each consumer's client that the broker cancelled it (queue deleted), when the client
/// said it understands basic.cancel from the broker.
pub fn notify_cancelled(consumers: &[Arc<ConsumerHandle>]) {
    for consumer in consumers {
        consumer.cancelled.store(true, Ordering::Release);
        // The channel forgets the consumer at its next method, so its tag is free to use again.
        consumer.channel.consumers_cancelled_by_broker.store(true, Ordering::Release);
        let connection = &consumer.channel.connection;
        if connection.consumer_cancel_notify.load(Ordering::Acquire) && consumer.channel.ledger.lock().open {
            let mut frames = BytesMut::new();
            let cancel = Method::BasicCancel(BasicCancel { consumer_tag: consumer.tag.clone(), nowait: true });
            encode_method_frame(&mut frames, consumer.channel.id, &cancel);
            connection.send(Outbound::Frames(frames.freeze()));
        }
    }
}
