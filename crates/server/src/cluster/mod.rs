//! The cluster: this node's links to the others, its membership, and the metadata Raft group
//! that replicates definitions (docs/cluster.md).
//!
//! ```text
//! settings.rs      --node-name, --cluster-port, --cluster-seeds, limits
//! frame.rs         the links' frames (no I/O)
//! link.rs          one TCP link per node pair: handshake, heartbeats, backoff, bounded queues
//! node_state.rs    DATA_DIR/cluster/node.json: id, membership, initial voters
//! group.rs         the metadata group's Raft driver (its own thread)
//! proposals.rs     proposals until committed (proposed again at a new leader), applied once
//! command.rs       the metadata commands (definition changes, membership)
//! apply.rs         applying committed commands to the broker, in log order, on every node
//! snapshot.rs      the metadata group's snapshots: the applied definitions as an image
//! control.rs       join, leave, forget and status between nodes; bootstrap
//! remote_queue.rs  a classic queue of another node
//! quorum_link.rs   the quorum shards' transport: their Raft messages over the links
//! shard_roles.rs   quorum shard membership by hand (grow, shrink, add_member, delete_member)
//! ```
//!
//! A node started without a cluster port never builds any of this, and runs as it always did.

mod apply;
mod command;
mod control;
mod frame;
mod group;
mod link;
pub mod metrics;
mod node_state;
mod promotion;
mod proposals;
mod quorum_link;
mod remote_queue;
mod settings;
mod shard_roles;
mod snapshot;
mod stream_links;
mod transfer;

pub use apply::Applied;
pub use command::{ExchangeDeclarationRecord, MetadataCommand, QueueDeclaration};
pub use group::GroupView;
pub use quorum_link::{host_config as quorum_host_config, QuorumLinks};
pub use remote_queue::RemoteQueue;
pub use settings::ClusterSettings;
pub use shard_roles::{ShardRoleError, ShardSelection};

use crate::broker::Broker;
use crate::stream::replication::{Leadership, StreamKey};
use broker_core::AmqpError;
use command::Proposal;
use group::GroupEvent;
use link::Links;
use node_state::{Membership, NodeState};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

thread_local! {
    /// Set while the metadata group applies a committed command on this thread: the broker's
    /// methods then change the node's state instead of proposing the change again.
    static APPLYING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is applying a committed metadata command.
pub fn applying() -> bool {
    APPLYING.with(|flag| flag.get())
}

/// What the replicated state says about a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRecord {
    /// Node name.
    pub name: String,
    /// Advertised cluster address.
    pub address: String,
}

/// A member as listed by `/api/nodes` and `lepus ctl cluster status`.
#[derive(Debug, Clone)]
pub struct MemberStatus {
    /// Raft id.
    pub id: u64,
    /// Node name (empty until it said it).
    pub name: String,
    /// Advertised cluster address.
    pub address: String,
    /// Whether it votes in the metadata group.
    pub voter: bool,
    /// Whether it runs: this node, or a node linked to it now.
    pub running: bool,
    /// Whether it leads the metadata group.
    pub leader: bool,
}

/// The replicated membership this node has applied.
#[derive(Debug, Default)]
struct ClusterState {
    members: BTreeMap<u64, MemberRecord>,
    /// Definition changes applied (a node that applied none may join another cluster).
    definition_changes: u64,
    /// The operator's choices of nodes' roles in quorum shards: (shard, node) -> voter.
    shard_roles: crate::quorum::ShardRoleMap,
    /// Who leads each stream queue, and its members.
    stream_leaders: BTreeMap<StreamKey, Leadership>,
}

/// A clustered node's cluster half.
pub struct Cluster {
    /// Its settings.
    pub settings: ClusterSettings,
    /// This node's Raft id.
    pub node_id: u64,
    /// The address other nodes dial.
    pub advertise: String,
    data_dir: PathBuf,
    links: Arc<Links>,
    node_state: Mutex<NodeState>,
    state: Mutex<ClusterState>,
    view: Arc<Mutex<GroupView>>,
    events: Mutex<Option<SyncSender<GroupEvent>>>,
    waiters: Mutex<HashMap<u64, SyncSender<Result<Applied, AmqpError>>>>,
    next_sequence: AtomicU64,
    broker: OnceLock<Weak<Broker>>,
    /// Set when this node left its cluster (the process shuts down).
    left: AtomicBool,
    /// The metadata log's entry that declared each queue held here.
    declared_here: Mutex<HashMap<(String, amqp_codec::ShortStr), u64>>,
    /// The last index of the metadata log when this run opened it (0: it had none).
    last_index_at_start: AtomicU64,
    /// Every queue's declaration as applied here, with the index of its entry: a snapshot keeps
    /// them (a queue's incarnation names its classic log and its quorum declaration).
    queue_declarations: Mutex<snapshot::QueueDeclarations>,
    /// Set while a snapshot image is installed: what it holds was applied by the cluster already
    /// (as a replay of this node's own log is).
    restoring: AtomicBool,
}

/// Why a clustered node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterStartError {
    /// The settings or the node's stored state say it cannot.
    #[error("cluster: {0}")]
    Refused(String),
    /// The cluster port could not be bound.
    #[error("cannot listen on {address} for the cluster links (--cluster-port): {source}")]
    Listen {
        /// The address.
        address: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

impl Cluster {
    /// Starts the links, and the metadata group when the node is a member (else the bootstrap,
    /// which forms or joins the cluster in the background). Waits until a member has applied its
    /// own log, so clients see the definitions it had.
    pub fn start(broker: &Arc<Broker>) -> Result<Arc<Cluster>, ClusterStartError> {
        let config = &broker.config;
        let settings = config.cluster.clone();
        let advertise = settings.advertised_address(config.bind_address).map_err(ClusterStartError::Refused)?;
        let node_state = control::load_or_create_state(&config.data_dir, &settings, &advertise)?;
        let address = std::net::SocketAddr::new(config.bind_address, settings.cluster_port);
        let listener = std::net::TcpListener::bind(address).map_err(|source| ClusterStartError::Listen { address, source })?;
        // The links' own runtime: broker workers may block on a commit these links must carry.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cluster-link")
            .enable_all()
            .build()
            .map_err(|error| ClusterStartError::Refused(format!("starting the links' runtime: {error}")))?;
        let hello = frame::Hello {
            version: frame::LINK_PROTOCOL_VERSION,
            cluster_name: settings.cluster_name.clone(),
            cluster_id: node_state.cluster_id,
            node_name: settings.node_name.clone(),
            node_id: node_state.node_id,
            advertise: advertise.clone(),
            stream_host: crate::stream_protocol::advertised_host(config),
            stream_port: config.stream_port,
        };
        let links = Links::new(settings.clone(), hello, runtime.handle().clone());
        // Kept for the process's life: dropping a runtime inside another one's context panics.
        std::mem::forget(runtime);
        let cluster = Arc::new(Cluster {
            node_id: node_state.node_id,
            advertise,
            data_dir: config.data_dir.clone(),
            links: links.clone(),
            node_state: Mutex::new(node_state.clone()),
            state: Mutex::new(ClusterState::default()),
            view: Arc::new(Mutex::new(GroupView::default())),
            events: Mutex::new(None),
            waiters: Mutex::new(HashMap::new()),
            next_sequence: AtomicU64::new(rand::random::<u64>() >> 2),
            broker: OnceLock::new(),
            left: AtomicBool::new(false),
            declared_here: Mutex::new(HashMap::new()),
            last_index_at_start: AtomicU64::new(0),
            queue_declarations: Mutex::new(HashMap::new()),
            restoring: AtomicBool::new(false),
            settings,
        });
        let _ = cluster.broker.set(Arc::downgrade(broker));
        // Before anything runs that may change definitions (the group, the bootstrap): a change
        // made on this node must go through the cluster from the first one on.
        let _ = broker.cluster.set(cluster.clone());
        links.set_handler(Arc::new(control::Handler { cluster: Arc::downgrade(&cluster) }));
        broker.quorum.set_member_name(cluster.node_id, cluster.settings.node_name.clone());
        broker.quorum_links.attach(links.clone());
        links.listen(listener).map_err(|source| ClusterStartError::Listen { address, source })?;
        for seed in &cluster.settings.seeds {
            links.dial(seed);
        }
        tracing::info!(node = %cluster.settings.node_name, id = %format!("{:x}", cluster.node_id), address = %cluster.advertise, "cluster links listening");
        match node_state.membership {
            Membership::Member => {
                cluster.open_group().map_err(ClusterStartError::Refused)?;
                cluster.wait_for_local_replay();
            }
            Membership::Fresh => control::start_bootstrap(&cluster),
            Membership::Left => unreachable!("refused by load_or_create_state"),
        }
        Ok(cluster)
    }

    /// This node's name.
    pub fn node_name(&self) -> &str {
        &self.settings.node_name
    }

    fn broker(&self) -> Option<Arc<Broker>> {
        self.broker.get().and_then(Weak::upgrade)
    }

    /// The cluster's id (0 until formed).
    pub fn cluster_id(&self) -> u64 {
        self.node_state.lock().cluster_id
    }

    /// Whether the node is a member with a running metadata group.
    pub fn is_member(&self) -> bool {
        self.events.lock().is_some()
    }

    /// The metadata group as this node sees it.
    pub fn group_view(&self) -> GroupView {
        self.view.lock().clone()
    }

    /// The name of a member, if known.
    pub fn member_name(&self, id: u64) -> Option<String> {
        if id == self.node_id {
            return Some(self.settings.node_name.clone());
        }
        self.state.lock().members.get(&id).map(|member| member.name.clone())
    }

    /// Every member, with whether it runs.
    pub fn members(&self) -> Vec<MemberStatus> {
        let view = self.group_view();
        let members = self.state.lock().members.clone();
        let mut ids: Vec<u64> = view.voters.iter().chain(view.learners.iter()).copied().collect();
        ids.extend(members.keys().copied());
        ids.push(self.node_id);
        ids.sort_unstable();
        ids.dedup();
        let peers = self.links.peers();
        ids.into_iter()
            .map(|id| {
                let record = members.get(&id);
                let peer = peers.iter().find(|peer| peer.hello.node_id == id);
                let name = record.map(|record| record.name.clone()).or_else(|| peer.map(|peer| peer.hello.node_name.clone()));
                let name = if id == self.node_id { self.settings.node_name.clone() } else { name.unwrap_or_default() };
                let address = record.map(|record| record.address.clone()).or_else(|| peer.map(|peer| peer.hello.advertise.clone()));
                MemberStatus {
                    id,
                    name,
                    address: if id == self.node_id { self.advertise.clone() } else { address.unwrap_or_default() },
                    voter: view.voters.contains(&id),
                    running: id == self.node_id || peer.is_some_and(|peer| peer.connected),
                    leader: view.leader == Some(id),
                }
            })
            .collect()
    }

    /// Proposes a definition change and waits until it is committed and applied here; returns
    /// what applying it answered.
    pub fn propose(&self, command: MetadataCommand) -> Result<Applied, AmqpError> {
        let Some(events) = self.events.lock().clone() else {
            return Err(AmqpError::internal(format!(
                "node {} has not joined its cluster yet: definitions cannot change on it",
                self.settings.node_name
            )));
        };
        if self.view.lock().write_held {
            // This node could not make the change durable: it must not answer it as done, nor
            // hand it on to commit without it. Answered as when no majority can commit.
            return Err(AmqpError::internal(format!(
                "the change was not made: the metadata log of node {} cannot be written (is its disk full?), so it takes \
                 no part in committing changes with a majority of the cluster; make it through another node, or once this \
                 one has room",
                self.settings.node_name
            )));
        }
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.waiters.lock().insert(sequence, sender);
        let proposal = Proposal { proposer: self.node_id, sequence, command };
        if events.try_send(GroupEvent::Propose(proposal.encode())).is_err() {
            self.waiters.lock().remove(&sequence);
            return Err(AmqpError::internal("the metadata group is overloaded; try again"));
        }
        let timeout = Duration::from_millis(self.settings.metadata_commit_timeout_ms);
        let answer = receiver.recv_timeout(timeout);
        self.waiters.lock().remove(&sequence);
        answer.unwrap_or_else(|_| {
            Err(AmqpError::internal(format!(
                "the change was not committed by a majority of the cluster within {} ms (it may still be applied)",
                self.settings.metadata_commit_timeout_ms
            )))
        })
    }

    /// Hands a committed command's answer to the thread that proposed it here.
    fn answer(&self, sequence: u64, answer: Result<Applied, AmqpError>) {
        if let Some(waiter) = self.waiters.lock().remove(&sequence) {
            let _ = waiter.try_send(answer);
        }
    }

    /// Opens the metadata group from `cluster/metadata` and starts its thread.
    fn open_group(self: &Arc<Self>) -> Result<(), String> {
        let node_state = self.node_state.lock().clone();
        if let Some(broker) = self.broker() {
            // A node that joined learns the founding voters here: its shards start from them.
            broker.quorum.set_initial_voters(node_state.initial_voters.clone());
        }
        let directory = self.data_dir.join("cluster").join("metadata");
        let config = raft::Config {
            id: self.node_id,
            election_tick: group::ELECTION_TICKS,
            heartbeat_tick: group::HEARTBEAT_TICKS,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..raft::Config::default()
        };
        let storage = group::GroupStorage {
            directory: directory.clone(),
            file_system: storage::file_system::real(),
            checksum_seed: (node_state.cluster_name.len() as u32).wrapping_mul(0x9E37_79B9) ^ 0x4D45_5441,
            initial_voters: node_state.initial_voters.clone(),
            config,
        };
        let (raw, recovery) = storage.open(None)?;
        self.last_index_at_start.store(raw.store().last_index_now(), Ordering::Release);
        let snapshot = raw.store().snapshot_ref();
        // A snapshot file that fails its checksum was refused by `LogStore::open`; an image that
        // does not decode (damaged before it was written, another version) is refused here: the
        // node must not start from definitions it cannot read.
        let start_image = match snapshot.get_metadata().index {
            0 => None,
            _ => Some(
                snapshot::MetadataImage::decode(&snapshot.data)
                    .map_err(|error| format!("the metadata snapshot in {} cannot be used: {error}", directory.display()))?,
            ),
        };
        if recovery.damaged {
            tracing::error!(directory = %directory.display(), records = recovery.records, "the metadata log is damaged: this node neither votes nor campaigns until a leader has repaired it");
        } else if recovery.hard_state_copies_damaged > 0 {
            tracing::warn!(directory = %directory.display(), "a copy of the metadata group's hard state fails its checksum; the other copy was read");
        }
        let opened = group::OpenedGroup { raw, storage, damaged: recovery.damaged, start_image };
        let (sender, receiver) = std::sync::mpsc::sync_channel(group::GROUP_EVENTS_MAX);
        let applier = apply::MetadataApplier::new(self.clone());
        let interval = self.settings.metadata_snapshot_entries_interval;
        let retry_window = Duration::from_millis(self.settings.metadata_commit_timeout_ms);
        let driver =
            group::GroupDriver::new(opened, self.links.clone(), applier, self.view.clone(), interval).retry_proposals_for(retry_window);
        let runtime = tokio::runtime::Handle::try_current().ok();
        std::thread::Builder::new()
            .name("metadata-group".to_string())
            .spawn(move || {
                // Applying a change may spawn tasks (queue timers) on the broker's runtime.
                let _guard = runtime.as_ref().map(|runtime| runtime.enter());
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| driver.run(receiver)));
                if !matches!(run, Ok(true)) {
                    // A node without its metadata group would serve stale definitions and never
                    // learn new ones: it stops, and restarts from what its log holds durably. (A
                    // write that fails does not end the group: it is held, `group/write_hold.rs`.)
                    tracing::error!("the metadata group stopped on a failure: the node shuts down");
                    // SAFETY: signalling our own process; SIGTERM starts the graceful shutdown.
                    unsafe {
                        libc::kill(libc::getpid(), libc::SIGTERM);
                    }
                }
            })
            .map_err(|error| error.to_string())?;
        *self.events.lock() = Some(sender);
        Ok(())
    }

    /// Waits (a bounded time) until the group has applied the commit index its log recorded.
    fn wait_for_local_replay(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let view = self.group_view();
            if view.applied >= view.commit && view.commit > 0 || std::time::Instant::now() > deadline {
                tracing::info!(applied = view.applied, commit = view.commit, "metadata log replayed");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Records the declaration of a queue applied here (made by it) at the metadata log's `index`.
    pub fn record_queue_declaration(&self, index: u64, declaration: &QueueDeclaration) {
        let key = (declaration.vhost.clone(), declaration.name.clone());
        self.queue_declarations.lock().insert(key, (index, declaration.clone()));
    }

    /// Records that the metadata log's entry `index` declared a queue held here.
    pub fn declared_here(&self, vhost: &str, name: &amqp_codec::ShortStr, index: u64) {
        self.declared_here.lock().insert((vhost.to_string(), name.clone()), index);
    }

    /// Deletes, through the cluster, the exclusive and transient queues this node held before
    /// it restarted (in the background, once a leader is known).
    fn delete_stale_queues(self: &Arc<Self>) {
        let last_index = self.last_index_at_start.load(Ordering::Acquire);
        let Some(broker) = self.broker() else { return };
        let stale = broker.stale_queues(&self.declared_here.lock(), last_index);
        if stale.is_empty() {
            return;
        }
        tracing::info!(queues = stale.len(), "deleting the exclusive and transient queues of this node's last run");
        let spawned = std::thread::Builder::new().name("stale-queues".to_string()).spawn(move || {
            for (vhost, name) in stale {
                broker.remove_queue(&vhost, &name);
            }
        });
        if let Err(error) = spawned {
            tracing::error!(%error, "starting the deletion of stale queues failed");
        }
    }

    /// Records the node's stored state.
    fn update_node_state(&self, change: impl FnOnce(&mut NodeState)) {
        let mut state = self.node_state.lock();
        change(&mut state);
        if let Err(error) = state.store(&self.data_dir) {
            tracing::error!(%error, "storing the node's cluster state failed");
        }
    }

    /// Raft messages of quorum-queue shards and other protocols arrive here later; the metadata
    /// group's go to its thread (dropped when it is busy: Raft resends).
    fn deliver_raft(&self, message: raft::eraftpb::Message) {
        if let Some(events) = self.events.lock().as_ref() {
            let _ = events.try_send(GroupEvent::Raft(message));
        }
    }

    /// Whether the metadata log's entry `index` was in the log when this run opened it (applying
    /// it replays what an earlier run applied already).
    /// A node that joined treats the entries committed before its join the same way: the quorum
    /// shards applied their queue declarations and deletions already (proposing them again would
    /// delete a later queue of a name declared, deleted and declared again).
    pub fn replaying(&self, index: u64) -> bool {
        self.restoring.load(Ordering::Acquire)
            || index <= self.last_index_at_start.load(Ordering::Acquire).max(self.node_state.lock().history_index)
    }

    /// The links' counters.
    pub fn link_counters(&self) -> &link::LinkCounters {
        &self.links.counters
    }
}
