//! Read-only views of the broker for the management API, metrics and `lepus ctl`: what queues,
//! exchanges, bindings and connections exist, with their counts. Each view takes the locks it
//! needs one at a time and copies out, so listing never holds up the message path for long.
//! What changes the broker on an operator's behalf (publish, get) is in `operator_messages.rs`.

use crate::broker::Broker;
use crate::queue_type::{ConsumerView, QueueSnapshot};
use crate::shared::SessionInfo;
use amqp_codec::FieldTable;
use broker_core::exchange::Destination;
use broker_core::vhost::QueueType;
use std::sync::atomic::Ordering;

/// A consumer as listed, with its queue.
#[derive(Debug, Clone)]
pub struct ConsumerInfo {
    /// Vhost.
    pub vhost: String,
    /// Queue name.
    pub queue: String,
    /// The consumer.
    pub consumer: ConsumerView,
}

/// A queue as listed.
#[derive(Debug, Clone)]
pub struct QueueInfo {
    /// Vhost.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// Durable flag.
    pub durable: bool,
    /// Exclusive flag.
    pub exclusive: bool,
    /// Auto-delete flag.
    pub auto_delete: bool,
    /// Declaration arguments.
    pub arguments: FieldTable,
    /// Its type.
    pub queue_type: QueueType,
    /// Counts and totals.
    pub snapshot: QueueSnapshot,
    /// The policy that applies to it.
    pub policy: Option<std::sync::Arc<crate::policy::Policy>>,
    /// A quorum queue's leader, members and online members.
    pub replicas: Option<crate::quorum::ReplicaInfo>,
    /// A quorum queue's dead letters held until their targets have them (at least once).
    pub held_dead_letters: Option<crate::quorum::HeldDeadLetterFigures>,
    /// The node holding it, when another node of the cluster does.
    pub home: Option<String>,
}

/// An exchange as listed.
#[derive(Debug, Clone)]
pub struct ExchangeInfo {
    /// Vhost.
    pub vhost: String,
    /// Name ("" is the default exchange).
    pub name: String,
    /// Type name.
    pub kind: &'static str,
    /// Durable flag.
    pub durable: bool,
    /// Auto-delete flag.
    pub auto_delete: bool,
    /// Internal flag.
    pub internal: bool,
    /// Declaration arguments.
    pub arguments: FieldTable,
    /// The name of the policy that applies to it.
    pub policy: Option<String>,
    /// Messages published to it (RabbitMQ's publish_in).
    pub published_in: u64,
    /// Messages it routed into queues, one per queue (publish_out).
    pub published_out: u64,
}

/// A binding as listed.
#[derive(Debug, Clone)]
pub struct BindingInfo {
    /// Vhost.
    pub vhost: String,
    /// Source exchange.
    pub source: String,
    /// Destination name.
    pub destination: String,
    /// Whether the destination is a queue (else an exchange).
    pub destination_is_queue: bool,
    /// Binding key.
    pub routing_key: String,
    /// Binding arguments.
    pub arguments: FieldTable,
}

/// A client connection as listed.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// Broker-unique id.
    pub id: u64,
    /// Client address.
    pub peer: std::net::SocketAddr,
    /// Accepted at, milliseconds since the epoch.
    pub connected_at_ms: u64,
    /// What the handshake learned.
    pub session: SessionInfo,
    /// Whether it has published (and so is blocked by a resource alarm).
    pub has_published: bool,
    /// What TLS negotiated (None: plain AMQP).
    pub tls: Option<crate::tls::TlsInfo>,
    /// Received bytes, socket reads, sent bytes, socket writes (see `ConnectionTraffic`).
    pub traffic: [u64; 4],
}

/// Broker-wide totals.
#[derive(Debug, Clone, Default)]
pub struct Overview {
    /// Open connections.
    pub connections: usize,
    /// Open channels.
    pub channels: usize,
    /// Queues.
    pub queues: usize,
    /// Exchanges.
    pub exchanges: usize,
    /// Consumers.
    pub consumers: u64,
    /// Ready messages (in memory and paged).
    pub messages_ready: u64,
    /// Unacked messages.
    pub messages_unacked: u64,
    /// Messages enqueued, summed over queues.
    pub published: u64,
    /// Deliveries, summed over queues.
    pub delivered: u64,
    /// Acked deliveries, summed over queues.
    pub acked: u64,
    /// Whether the free-disk alarm is raised.
    pub disk_alarm: bool,
}

impl Broker {
    /// A replicated stream's leader, members and the members running, by node name.
    fn stream_replicas(&self, vhost: &str, queue: &crate::queue_type::Queue) -> Option<crate::quorum::ReplicaInfo> {
        let stream = queue.as_stream()?;
        stream.replication()?;
        let cluster = self.cluster.get()?;
        let key = crate::stream::replication::StreamKey { vhost: vhost.to_string(), name: stream.name().to_string_lossy() };
        let leadership = cluster.stream_leadership(&key)?;
        let statuses = cluster.members();
        let name = |id: u64| statuses.iter().find(|member| member.id == id).map(|member| member.name.clone());
        let running = |id: &u64| statuses.iter().any(|member| member.id == *id && member.running);
        Some(crate::quorum::ReplicaInfo {
            leader: name(leadership.leader),
            members: leadership.members.iter().filter_map(|id| name(*id)).collect(),
            online: leadership.members.iter().filter(|id| running(id)).filter_map(|id| name(*id)).collect(),
        })
    }

    /// Every queue of every vhost, sorted by vhost and name.
    pub fn list_queues(&self) -> Vec<QueueInfo> {
        let mut queues = Vec::new();
        for (vhost_name, topology) in self.topologies() {
            let handles: Vec<_> = topology.read().queues().map(|entry| entry.handle.clone()).collect();
            for queue in handles {
                let definition = queue.definition();
                queues.push(QueueInfo {
                    vhost: vhost_name.clone(),
                    name: definition.name.to_string_lossy(),
                    durable: definition.durable,
                    exclusive: definition.exclusive_owner.is_some(),
                    auto_delete: definition.auto_delete,
                    arguments: definition.arguments.clone(),
                    queue_type: definition.queue_type,
                    snapshot: queue.snapshot(),
                    policy: queue.policy(),
                    replicas: queue.replicas().or_else(|| self.stream_replicas(&vhost_name, &queue)),
                    held_dead_letters: queue.held_dead_letters(),
                    home: queue.home_node().map(str::to_string),
                });
            }
        }
        queues.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
        queues
    }

    /// Every consumer of every queue, by vhost, queue and tag.
    pub fn list_consumers(&self) -> Vec<ConsumerInfo> {
        let mut consumers = Vec::new();
        for (vhost_name, topology) in self.topologies() {
            let handles: Vec<_> = topology.read().queues().map(|entry| entry.handle.clone()).collect();
            for queue in handles {
                for consumer in queue.consumer_views() {
                    consumers.push(ConsumerInfo { vhost: vhost_name.clone(), queue: queue.name().to_string_lossy(), consumer });
                }
            }
        }
        consumers.sort_by(|a, b| (&a.vhost, &a.queue, &a.consumer.tag).cmp(&(&b.vhost, &b.queue, &b.consumer.tag)));
        consumers
    }

    /// Every exchange of every vhost, sorted by vhost and name.
    pub fn list_exchanges(&self) -> Vec<ExchangeInfo> {
        let mut exchanges = Vec::new();
        for (vhost_name, topology) in self.topologies() {
            let vhost = topology.read();
            for exchange in vhost.exchanges() {
                exchanges.push(ExchangeInfo {
                    vhost: vhost_name.clone(),
                    name: exchange.name.to_string_lossy(),
                    kind: exchange.kind.name(),
                    durable: exchange.durable,
                    auto_delete: exchange.auto_delete,
                    internal: exchange.internal,
                    arguments: exchange.arguments.clone(),
                    policy: self.policy_for_exchange(&vhost_name, &exchange.name).map(|policy| policy.name.clone()),
                    published_in: exchange.stats.0.published_in.load(Ordering::Relaxed),
                    published_out: exchange.stats.0.published_out.load(Ordering::Relaxed),
                });
            }
        }
        exchanges.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
        exchanges
    }

    /// Every explicit binding of every vhost (the default exchange's implicit ones are not listed
    /// here; RabbitMQ's API adds them itself).
    pub fn list_bindings(&self) -> Vec<BindingInfo> {
        let mut bindings = Vec::new();
        for (vhost_name, topology) in self.topologies() {
            let vhost = topology.read();
            for (source, binding) in vhost.bindings() {
                let (destination, destination_is_queue) = match &binding.destination {
                    Destination::Queue(name) => (name.to_string_lossy(), true),
                    Destination::Exchange(name) => (name.to_string_lossy(), false),
                };
                bindings.push(BindingInfo {
                    vhost: vhost_name.clone(),
                    source: source.name.to_string_lossy(),
                    destination,
                    destination_is_queue,
                    routing_key: binding.routing_key.to_string_lossy(),
                    arguments: binding.arguments.clone(),
                });
            }
        }
        bindings
    }

    /// Every open connection, oldest first.
    pub fn list_connections(&self) -> Vec<ConnectionInfo> {
        let mut connections: Vec<ConnectionInfo> = self
            .connection_handles()
            .into_iter()
            .map(|connection| ConnectionInfo {
                id: connection.id,
                peer: connection.peer,
                connected_at_ms: connection.connected_at_ms,
                session: connection.session.lock().clone(),
                has_published: connection.has_published.load(Ordering::Acquire),
                tls: connection.tls.clone(),
                traffic: connection.traffic.read(),
            })
            .collect();
        connections.sort_by_key(|connection| connection.id);
        connections
    }

    /// Broker-wide totals.
    pub fn overview(&self) -> Overview {
        let queues = self.list_queues();
        let connections = self.list_connections();
        let mut overview = Overview {
            connections: connections.len(),
            channels: connections.iter().map(|connection| connection.session.channels).sum(),
            queues: queues.len(),
            exchanges: self.list_exchanges().len(),
            disk_alarm: self.disk_alarm.load(Ordering::Acquire),
            ..Overview::default()
        };
        for queue in &queues {
            overview.consumers += u64::from(queue.snapshot.consumers);
            overview.messages_ready += queue.snapshot.ready;
            overview.messages_unacked += queue.snapshot.unacked;
            overview.published += queue.snapshot.stats.published;
            overview.delivered += queue.snapshot.stats.delivered;
            overview.acked += queue.snapshot.stats.acked;
        }
        overview
    }
}
