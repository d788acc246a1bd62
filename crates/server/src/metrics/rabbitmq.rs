//! RabbitMQ's Prometheus families (rabbitmq_prometheus 3.10), with its names and labels, so that
//! its published Grafana dashboards and the alert rules people run work against Lepus:
//!
//! - `/metrics`: aggregated, as RabbitMQ's default (`return_per_object_metrics = false`);
//! - `/metrics/per-object`: the same families with one sample per queue, channel or connection;
//! - `/metrics/detailed?family=F&vhost=V`: only the families asked for (none when none is), with
//!   the `rabbitmq_detailed_` prefix and queue families limited to the vhosts asked for.
//!
//! Only families Lepus has an exact figure for are written; docs/management.md lists them.

use super::counters::MessageTotals;
use super::{as_i64, Labels, ProcessStats};
use crate::broker::Broker;
use crate::introspect::{ConnectionInfo, QueueInfo};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

/// Which samples a scrape writes.
pub enum Shape {
    /// Summed over objects, no object labels (`/metrics`).
    Aggregated,
    /// One sample per object (`/metrics/per-object`).
    PerObject,
    /// Per object, only these families and, for queue families, these vhosts (`/metrics/detailed`).
    Detailed { families: BTreeSet<String>, vhosts: Option<BTreeSet<String>> },
}

impl Shape {
    fn prefix(&self) -> &'static str {
        match self {
            Shape::Detailed { .. } => "rabbitmq_detailed_",
            _ => "rabbitmq_",
        }
    }

    fn wants(&self, family: &str) -> bool {
        match self {
            Shape::Detailed { families, .. } => families.contains(family),
            _ => true,
        }
    }

    fn per_object(&self) -> bool {
        !matches!(self, Shape::Aggregated)
    }

    fn wants_vhost(&self, vhost: &str) -> bool {
        match self {
            Shape::Detailed { vhosts: Some(vhosts), .. } => vhosts.contains(vhost),
            _ => true,
        }
    }
}

/// What one scrape read of the broker.
pub struct Scrape<'a> {
    /// The broker.
    pub broker: &'a Broker,
    /// Every queue.
    pub queues: &'a [QueueInfo],
    /// Every connection.
    pub connections: &'a [ConnectionInfo],
    /// This process.
    pub process: ProcessStats,
    /// Free bytes on the data directory's filesystem.
    pub free_disk_bytes: u64,
}

/// Adds the families `shape` asks for to `registry`.
pub fn register(registry: &mut Registry, scrape: &Scrape, shape: &Shape) {
    let prefix = shape.prefix();
    if shape.wants("connection_churn_metrics") {
        churn(registry, scrape.broker, prefix);
    }
    if shape.wants("node_coarse_metrics") {
        node_coarse(registry, scrape, prefix);
    }
    if shape.wants("node_metrics") {
        node_limits(registry, scrape, prefix);
    }
    if shape.wants("node_persister_metrics") {
        io_sync(registry, scrape.broker, prefix);
    }
    queue_families(registry, scrape, shape);
    if shape.wants("ra_metrics") {
        raft(registry, scrape, shape);
    }
    channel_and_connection_families(registry, scrape, shape);
    if !matches!(shape, Shape::Detailed { .. }) {
        totals(registry, scrape);
        global_counters(registry, scrape.broker);
        alarms(registry, scrape.broker);
    }
    identity(registry);
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    super::gauge(registry, name, help, as_i64(value));
}

fn churn(registry: &mut Registry, broker: &Broker, prefix: &str) {
    let churn = &broker.churn;
    let counters = [
        ("connections_opened", "Total number of connections opened", &churn.connections_opened),
        ("connections_closed", "Total number of connections closed or terminated", &churn.connections_closed),
        ("channels_opened", "Total number of channels opened", &churn.channels_opened),
        ("channels_closed", "Total number of channels closed", &churn.channels_closed),
        ("queues_declared", "Total number of queues declared", &churn.queues_declared),
        ("queues_created", "Total number of queues created", &churn.queues_created),
        ("queues_deleted", "Total number of queues deleted", &churn.queues_deleted),
    ];
    for (name, help, value) in counters {
        // The encoder appends `_total` to counters.
        super::counter(registry, &format!("{prefix}{name}"), help, value.load(Ordering::Relaxed));
    }
}

fn node_coarse(registry: &mut Registry, scrape: &Scrape, prefix: &str) {
    let process = scrape.process;
    gauge(registry, &format!("{prefix}process_open_fds"), "Open file descriptors", process.open_fds);
    gauge(registry, &format!("{prefix}process_open_tcp_sockets"), "Open TCP sockets", scrape.connections.len() as u64);
    gauge(registry, &format!("{prefix}process_resident_memory_bytes"), "Memory used in bytes", process.resident_bytes);
    gauge(registry, &format!("{prefix}disk_space_available_bytes"), "Disk space available in bytes", scrape.free_disk_bytes);
}

fn node_limits(registry: &mut Registry, scrape: &Scrape, prefix: &str) {
    let config = &scrape.broker.config;
    gauge(registry, &format!("{prefix}process_max_fds"), "Open file descriptors limit", scrape.process.max_fds);
    // RabbitMQ's socket limit is the connections it accepts; Lepus's is `connection_max`.
    gauge(registry, &format!("{prefix}process_max_tcp_sockets"), "Open TCP sockets limit", config.connection_max as u64);
    gauge(registry, &format!("{prefix}resident_memory_limit_bytes"), "Memory high watermark in bytes", config.memory_high_watermark_bytes);
    gauge(
        registry,
        &format!("{prefix}disk_space_available_limit_bytes"),
        "Free disk space low watermark in bytes",
        config.disk_free_limit_bytes,
    );
}

/// A gauge family whose samples are summed into one unlabelled sample when aggregated.
struct ObjectGauge {
    family: Family<Labels, Gauge>,
    sum: u64,
}

impl ObjectGauge {
    fn new() -> ObjectGauge {
        ObjectGauge { family: Family::default(), sum: 0 }
    }

    fn add(&mut self, shape: &Shape, labels: &Labels, value: u64) {
        self.sum += value;
        if shape.per_object() {
            self.family.get_or_create(labels).set(as_i64(value));
        }
    }

    fn register(self, registry: &mut Registry, shape: &Shape, name: &str, help: &str) {
        if shape.per_object() {
            registry.register(format!("{}{name}", shape.prefix()), help, self.family);
        } else {
            gauge(registry, &format!("{}{name}", shape.prefix()), help, self.sum);
        }
    }
}

fn queue_families(registry: &mut Registry, scrape: &Scrape, shape: &Shape) {
    let coarse = shape.wants("queue_coarse_metrics");
    let detail = shape.wants("queue_metrics");
    let consumers_only = shape.wants("queue_consumer_count") && !detail;
    if !(coarse || detail || consumers_only) {
        return;
    }
    let (mut ready, mut unacked, mut messages) = (ObjectGauge::new(), ObjectGauge::new(), ObjectGauge::new());
    let (mut consumers, mut paged) = (ObjectGauge::new(), ObjectGauge::new());
    let (mut ready_bytes, mut unacked_bytes, mut message_bytes) = (ObjectGauge::new(), ObjectGauge::new(), ObjectGauge::new());
    for queue in scrape.queues.iter().filter(|queue| shape.wants_vhost(&queue.vhost)) {
        let labels: Labels = vec![("vhost", queue.vhost.clone()), ("queue", queue.name.clone())];
        let snapshot = &queue.snapshot;
        ready.add(shape, &labels, snapshot.ready);
        unacked.add(shape, &labels, snapshot.unacked);
        messages.add(shape, &labels, snapshot.ready + snapshot.unacked);
        consumers.add(shape, &labels, u64::from(snapshot.consumers));
        paged.add(shape, &labels, snapshot.paged);
        ready_bytes.add(shape, &labels, snapshot.ready_bytes);
        unacked_bytes.add(shape, &labels, snapshot.unacked_bytes);
        message_bytes.add(shape, &labels, snapshot.ready_bytes + snapshot.unacked_bytes);
    }
    if coarse {
        ready.register(registry, shape, "queue_messages_ready", "Messages ready to be delivered to consumers");
        unacked.register(registry, shape, "queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged");
        messages.register(registry, shape, "queue_messages", "Sum of ready and unacknowledged messages - total queue depth");
    }
    if detail || consumers_only {
        consumers.register(registry, shape, "queue_consumers", "Consumers on a queue");
    }
    if detail {
        paged.register(registry, shape, "queue_messages_paged_out", "Messages paged out to disk");
        ready_bytes.register(registry, shape, "queue_messages_ready_bytes", "Size in bytes of ready messages");
        unacked_bytes.register(registry, shape, "queue_messages_unacked_bytes", "Size in bytes of all unacknowledged messages");
        message_bytes.register(registry, shape, "queue_messages_bytes", "Size in bytes of ready and unacknowledged messages");
    }
}

/// One Raft group's figures as RabbitMQ's ra_metrics carry them.
#[derive(Default)]
struct RaftSample {
    term: u64,
    snapshot_index: u64,
    applied_index: u64,
    commit_index: u64,
    last_written_index: u64,
    commit_latency_seconds: f64,
}

impl RaftSample {
    fn of(figures: &crate::quorum::ShardFigures) -> RaftSample {
        RaftSample {
            term: figures.term.load(Ordering::Relaxed),
            snapshot_index: figures.snapshot_index.load(Ordering::Relaxed),
            applied_index: figures.applied_index.load(Ordering::Relaxed),
            commit_index: figures.commit_index.load(Ordering::Relaxed),
            last_written_index: figures.last_written_index.load(Ordering::Relaxed),
            commit_latency_seconds: figures.commit_latency_us.load(Ordering::Relaxed) as f64 / 1_000_000.0,
        }
    }
}

/// The HELP texts say what Lepus's figures are: its quorum queues share Raft groups (shards), so
/// a queue's sample is its shard's.
const RAFT_FAMILIES: [(&str, &str); 5] = [
    ("raft_log_snapshot_index", "Raft log snapshot index (a quorum queue's is its Raft shard's)"),
    ("raft_log_last_applied_index", "Raft log last applied index (a quorum queue's is its Raft shard's)"),
    ("raft_log_commit_index", "Raft log commit index (a quorum queue's is its Raft shard's)"),
    ("raft_log_last_written_index", "Raft log last written index (a quorum queue's is its Raft shard's)"),
    (
        "raft_entry_commit_latency_seconds",
        "Time taken for a log entry to be committed: the latest sample of this node's proposal of a batch to its commit \
         (a quorum queue's is its Raft shard's)",
    ),
];

/// One sample per quorum queue (per object) or one summed over the node's shards.
fn raft_samples(scrape: &Scrape, shape: &Shape) -> Vec<(Labels, RaftSample)> {
    if shape.per_object() {
        let quorum = scrape.queues.iter().filter(|queue| queue.queue_type == broker_core::vhost::QueueType::Quorum);
        quorum
            .map(|queue| {
                let figures = scrape.broker.quorum.queue_shard_figures(&queue.vhost, &queue.name);
                (vec![("vhost", queue.vhost.clone()), ("queue", queue.name.clone())], RaftSample::of(figures))
            })
            .collect()
    } else {
        let shards: Vec<RaftSample> =
            scrape.broker.quorum.shard_figures().into_iter().map(|(_, figures)| RaftSample::of(figures)).collect();
        let mut sum = RaftSample::default();
        for shard in &shards {
            sum.term += shard.term;
            sum.snapshot_index += shard.snapshot_index;
            sum.applied_index += shard.applied_index;
            sum.commit_index += shard.commit_index;
            sum.last_written_index += shard.last_written_index;
            sum.commit_latency_seconds += shard.commit_latency_seconds;
        }
        sum.commit_latency_seconds /= shards.len().max(1) as f64;
        vec![(Vec::new(), sum)]
    }
}

/// RabbitMQ's ra_metrics. Per object: one sample per quorum queue (labels vhost and queue, never
/// filtered by vhost, as RabbitMQ 3.10 does not filter them), its shard's figures. Aggregated:
/// summed over the node's Raft groups (Lepus's shards, RabbitMQ's Raft servers), the commit
/// latency averaged over them.
fn raft(registry: &mut Registry, scrape: &Scrape, shape: &Shape) {
    let samples = raft_samples(scrape, shape);
    let prefix = shape.prefix();
    let per_object = shape.per_object();
    // Aggregated, each family is one unlabelled sample (an empty label set would print `{}`).
    let term_help = "Current Raft term number (a quorum queue's is its Raft shard's)";
    // The encoder appends `_total` to counters: rabbitmq_raft_term_total.
    if per_object {
        let terms = Family::<Labels, Counter>::default();
        for (labels, sample) in &samples {
            terms.get_or_create(labels).inc_by(sample.term);
        }
        registry.register(format!("{prefix}raft_term"), term_help, terms);
    } else {
        super::counter(registry, &format!("{prefix}raft_term"), term_help, samples.iter().map(|(_, sample)| sample.term).sum());
    }
    for (position, (name, help)) in RAFT_FAMILIES.into_iter().enumerate() {
        let name = format!("{prefix}{name}");
        if position == RAFT_FAMILIES.len() - 1 {
            type Seconds = Gauge<f64, std::sync::atomic::AtomicU64>;
            if per_object {
                let family = Family::<Labels, Seconds>::default();
                for (labels, sample) in &samples {
                    family.get_or_create(labels).set(sample.commit_latency_seconds);
                }
                registry.register(name, help, family);
            } else {
                let gauge = Seconds::default();
                gauge.set(samples.first().map_or(0.0, |(_, sample)| sample.commit_latency_seconds));
                registry.register(name, help, gauge);
            }
            continue;
        }
        let value =
            |sample: &RaftSample| [sample.snapshot_index, sample.applied_index, sample.commit_index, sample.last_written_index][position];
        if per_object {
            let family = Family::<Labels, Gauge>::default();
            for (labels, sample) in &samples {
                family.get_or_create(labels).set(as_i64(value(sample)));
            }
            registry.register(name, help, family);
        } else {
            gauge(registry, &name, help, samples.first().map_or(0, |(_, sample)| value(sample)));
        }
    }
}

/// A counter family whose samples are summed into one unlabelled sample when aggregated.
struct ObjectCounter {
    family: Family<Labels, Counter>,
    sum: u64,
}

impl ObjectCounter {
    fn new() -> ObjectCounter {
        ObjectCounter { family: Family::default(), sum: 0 }
    }

    fn add(&mut self, shape: &Shape, labels: &Labels, value: u64) {
        self.sum += value;
        if shape.per_object() {
            self.family.get_or_create(labels).inc_by(value);
        }
    }

    /// Registers `name` (the encoder adds `_total`).
    fn register(self, registry: &mut Registry, shape: &Shape, name: &str, help: &str) {
        if shape.per_object() {
            registry.register(format!("{}{name}", shape.prefix()), help, self.family);
        } else {
            super::counter(registry, &format!("{}{name}", shape.prefix()), help, self.sum);
        }
    }
}

/// A label for a channel or connection in the place RabbitMQ puts its Erlang pid: `channel`.
fn pid_label(connection: u64, channel: u16) -> Labels {
    vec![("channel", format!("<lepus.{connection}.{channel}>"))]
}

fn channel_and_connection_families(registry: &mut Registry, scrape: &Scrape, shape: &Shape) {
    if shape.wants("channel_metrics") {
        let (mut consumers, mut unacked, mut unconfirmed) = (ObjectGauge::new(), ObjectGauge::new(), ObjectGauge::new());
        let (mut consumer_prefetch, mut channel_prefetch) = (ObjectGauge::new(), ObjectGauge::new());
        for connection in scrape.connections {
            for (number, channel) in &connection.session.open_channels {
                let Some(channel) = channel.upgrade() else { continue };
                let labels = pid_label(connection.id, *number);
                consumers.add(shape, &labels, u64::from(channel.consumer_count.load(Ordering::Relaxed)));
                unacked.add(shape, &labels, channel.ledger.lock().unacked.len() as u64);
                unconfirmed.add(shape, &labels, channel.confirms_in_syncer.load(Ordering::Relaxed) as u64);
                consumer_prefetch.add(shape, &labels, u64::from(channel.prefetch_count.load(Ordering::Relaxed)));
                channel_prefetch.add(shape, &labels, u64::from(channel.prefetch_global.load(Ordering::Relaxed)));
            }
        }
        consumers.register(registry, shape, "channel_consumers", "Consumers on a channel");
        unacked.register(registry, shape, "channel_messages_unacked", "Delivered but not yet acknowledged messages");
        unconfirmed.register(registry, shape, "channel_messages_unconfirmed", "Published but not yet confirmed messages");
        consumer_prefetch.register(registry, shape, "consumer_prefetch", "Limit of unacknowledged messages for each consumer");
        channel_prefetch.register(
            registry,
            shape,
            "channel_prefetch",
            "Total limit of unacknowledged messages for all consumers on a channel",
        );
    }
    if shape.wants("connection_coarse_metrics") {
        let (mut incoming, mut outgoing) = (ObjectCounter::new(), ObjectCounter::new());
        for connection in scrape.connections {
            let labels = pid_label(connection.id, 0);
            incoming.add(shape, &labels, connection.traffic[0]);
            outgoing.add(shape, &labels, connection.traffic[2]);
        }
        incoming.register(registry, shape, "connection_incoming_bytes", "Total number of bytes received on a connection");
        outgoing.register(registry, shape, "connection_outgoing_bytes", "Total number of bytes sent on a connection");
    }
    if shape.wants("connection_metrics") {
        let mut channels = ObjectGauge::new();
        let (mut incoming, mut outgoing) = (ObjectCounter::new(), ObjectCounter::new());
        for connection in scrape.connections {
            let labels = pid_label(connection.id, 0);
            channels.add(shape, &labels, connection.session.channels as u64);
            incoming.add(shape, &labels, connection.traffic[1]);
            outgoing.add(shape, &labels, connection.traffic[3]);
        }
        channels.register(registry, shape, "connection_channels", "Channels on a connection");
        incoming.register(registry, shape, "connection_incoming_packets", "Total number of packets received on a connection");
        outgoing.register(registry, shape, "connection_outgoing_packets", "Total number of packets sent on a connection");
    }
}

/// RabbitMQ's node_persister_metrics that Lepus has an exact figure for: the fdatasync calls of
/// its group commits and the time they took.
fn io_sync(registry: &mut Registry, broker: &Broker, prefix: &str) {
    let stats = broker.syncer.stats();
    super::counter(registry, &format!("{prefix}io_sync_ops"), "Total number of I/O sync operations", stats.fsyncs.load(Ordering::Relaxed));
    let seconds = Counter::<f64, std::sync::atomic::AtomicU64>::default();
    seconds.inc_by(stats.fsync_us_total.load(Ordering::Relaxed) as f64 / 1_000_000.0);
    registry.register(format!("{prefix}io_sync_time_seconds"), "Total I/O sync time", seconds);
}

/// RabbitMQ's totals: objects that exist now.
fn totals(registry: &mut Registry, scrape: &Scrape) {
    let channels: usize = scrape.connections.iter().map(|connection| connection.session.channels).sum();
    let consumers: u64 = scrape.queues.iter().map(|queue| u64::from(queue.snapshot.consumers)).sum();
    gauge(registry, "rabbitmq_connections", "Connections currently open", scrape.connections.len() as u64);
    gauge(registry, "rabbitmq_channels", "Channels currently open", channels as u64);
    gauge(registry, "rabbitmq_consumers", "Consumers currently connected", consumers);
    gauge(registry, "rabbitmq_queues", "Queues available", scrape.queues.len() as u64);
}

/// Every channel's counters, open and closed, read consistently (see `counters::RetiredTotals`).
pub fn message_totals(broker: &Broker) -> MessageTotals {
    broker.retired_channels.read_with(|sum| {
        for connection in broker.list_connections() {
            for channel in connection.session.open_channels.values().filter_map(|channel| channel.upgrade()) {
                let deliveries = channel.ledger.lock().counters;
                sum.add(&channel.publish_counters, &deliveries);
            }
        }
    })
}

/// Open AMQP channels that have published: RabbitMQ's `rabbitmq_global_publishers{protocol="amqp091"}`,
/// a channel counted from its first basic.publish until it closes (`maybe_increase_global_publishers`
/// in rabbit_channel.erl). RabbitMQ 3.10.8 takes the wrong channels off when they close (a channel
/// that never published, so its gauge drifts below zero); 3.12.0 corrected that, and this is the
/// corrected figure.
fn amqp_publishing_channels(broker: &Broker) -> u64 {
    let mut publishing = 0;
    for connection in broker.list_connections() {
        for channel in connection.session.open_channels.values().filter_map(|channel| channel.upgrade()) {
            publishing += u64::from(channel.publish_counters.received.load(Ordering::Relaxed) > 0);
        }
    }
    publishing
}

/// RabbitMQ's `rabbitmq_global_*` counters, one sample per protocol as `rabbit_global_counters`
/// keeps them: AMQP 0-9-1 (its deliveries labelled as classic queues'), and the RabbitMQ Stream
/// protocol (`rabbit_stream.erl` starts `protocol="stream"` and `protocol="stream",
/// queue_type="rabbit_stream_queue"`), with the stream plugin's refusal counters.
fn global_counters(registry: &mut Registry, broker: &Broker) {
    let totals = message_totals(broker);
    let stream = &broker.stream_protocol;
    let stream_received = stream.received.load(Ordering::Relaxed);
    let label = |protocol: &str| -> Labels { vec![("protocol", protocol.to_string())] };
    let label_queue_type =
        |protocol: &str, queue_type: &str| -> Labels { vec![("protocol", protocol.to_string()), ("queue_type", queue_type.to_string())] };
    let (amqp, on_stream) = (label("amqp091"), label("stream"));
    let (amqp_classic, stream_queue) =
        (label_queue_type("amqp091", "rabbit_classic_queue"), label_queue_type("stream", "rabbit_stream_queue"));
    let deliveries = totals.deliveries;
    // Each family: its AMQP 0-9-1 sample and its stream-protocol one. The stream protocol neither
    // routes (a publisher writes to one stream), nor gets, redelivers or acknowledges: RabbitMQ
    // keeps those counters for it and they stay at 0, as here.
    let families = [
        ("messages_received", "Total number of messages received from publishers", (&amqp, totals.received), (&on_stream, stream_received)),
        (
            "messages_received_confirm",
            "Total number of messages received from publishers expecting confirmations",
            (&amqp, totals.received_confirm),
            (&on_stream, stream_received),
        ),
        ("messages_routed", "Total number of messages routed to queues or streams", (&amqp, totals.routed), (&on_stream, 0)),
        (
            "messages_unroutable_dropped",
            "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
            (&amqp, totals.unroutable_dropped),
            (&on_stream, 0),
        ),
        (
            "messages_unroutable_returned",
            "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable",
            (&amqp, totals.unroutable_returned),
            (&on_stream, 0),
        ),
        (
            "messages_confirmed",
            "Total number of messages confirmed to publishers",
            (&amqp, totals.confirmed),
            (&on_stream, stream.confirmed.load(Ordering::Relaxed)),
        ),
        (
            "messages_delivered",
            "Total number of messages delivered to consumers",
            (&amqp_classic, totals.delivered()),
            (&stream_queue, stream.delivered.load(Ordering::Relaxed)),
        ),
        (
            "messages_delivered_consume_manual_ack",
            "Total number of messages delivered to consumers using basic.consume with manual acknowledgment",
            (&amqp_classic, deliveries.consume_manual_ack),
            (&stream_queue, 0),
        ),
        (
            "messages_delivered_consume_auto_ack",
            "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment",
            (&amqp_classic, deliveries.consume_auto_ack),
            (&stream_queue, 0),
        ),
        (
            "messages_delivered_get_manual_ack",
            "Total number of messages delivered to consumers using basic.get with manual acknowledgment",
            (&amqp_classic, deliveries.get_manual_ack),
            (&stream_queue, 0),
        ),
        (
            "messages_delivered_get_auto_ack",
            "Total number of messages delivered to consumers using basic.get with automatic acknowledgment",
            (&amqp_classic, deliveries.get_auto_ack),
            (&stream_queue, 0),
        ),
        (
            "messages_get_empty",
            "Total number of times basic.get operations fetched no message",
            (&amqp_classic, totals.get_empty),
            (&stream_queue, 0),
        ),
        (
            "messages_redelivered",
            "Total number of messages redelivered to consumers",
            (&amqp_classic, deliveries.redelivered),
            (&stream_queue, 0),
        ),
        (
            "messages_acknowledged",
            "Total number of messages acknowledged by consumers",
            (&amqp_classic, deliveries.acknowledged),
            (&stream_queue, 0),
        ),
    ];
    for (name, help, (amqp_labels, amqp_value), (stream_labels, stream_value)) in families {
        let family = Family::<Labels, Counter>::default();
        family.get_or_create(amqp_labels).inc_by(amqp_value);
        family.get_or_create(stream_labels).inc_by(stream_value);
        registry.register(format!("rabbitmq_global_{name}"), help, family);
    }
    let consumer_total: u64 = broker.list_queues().iter().map(|queue| u64::from(queue.snapshot.consumers)).sum();
    let gauges = [
        ("publishers", "Current number of publishers", amqp_publishing_channels(broker), stream.publishers.load(Ordering::Relaxed)),
        ("consumers", "Current number of consumers", consumer_total, stream.consumers.load(Ordering::Relaxed)),
    ];
    for (name, help, amqp_value, stream_value) in gauges {
        let family = Family::<Labels, Gauge>::default();
        family.get_or_create(&amqp).set(as_i64(amqp_value));
        family.get_or_create(&on_stream).set(stream_value);
        registry.register(format!("rabbitmq_global_{name}"), help, family);
    }
    for (name, help, value) in stream.errors() {
        let family = Family::<Labels, Counter>::default();
        family.get_or_create(&on_stream).inc_by(value);
        registry.register(format!("rabbitmq_global_stream_error_{name}"), help, family);
    }
}

fn alarms(registry: &mut Registry, broker: &Broker) {
    let memory = u64::from(broker.memory_alarm.load(Ordering::Acquire));
    let disk = u64::from(broker.disk_alarm.load(Ordering::Acquire));
    gauge(registry, "rabbitmq_alarms_memory_used_watermark", "is set to 1 when the memory high watermark alarm is in effect", memory);
    gauge(registry, "rabbitmq_alarms_free_disk_space_watermark", "is set to 1 when the free disk space alarm is in effect", disk);
}

/// `rabbitmq_identity_info` and `rabbitmq_build_info`, which every dashboard joins on.
fn identity(registry: &mut Registry) {
    let node = crate::management::node_name();
    let identity = Family::<Labels, Gauge>::default();
    identity
        .get_or_create(&vec![
            ("rabbitmq_node", node.clone()),
            ("rabbitmq_cluster", node.clone()),
            ("rabbitmq_cluster_permanent_id", format!("lepus-{node}")),
        ])
        .set(1);
    registry.register("rabbitmq_identity_info", "RabbitMQ node & cluster identity info", identity);
    let build = Family::<Labels, Gauge>::default();
    build.get_or_create(&vec![("rabbitmq_version", env!("CARGO_PKG_VERSION").to_string()), ("product", "Lepus".to_string())]).set(1);
    registry.register("rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info", build);
}

/// The `family` and `vhost` query parameters of `/metrics/detailed` (decoded), each repeatable.
pub fn detailed_shape(query: &[(String, String)]) -> Shape {
    let mut families = BTreeSet::new();
    let mut vhosts: Option<BTreeSet<String>> = None;
    for (key, value) in query {
        match key.as_str() {
            "family" => {
                families.insert(value.clone());
            }
            "vhost" => {
                vhosts.get_or_insert_with(BTreeSet::new).insert(value.clone());
            }
            _ => {}
        }
    }
    Shape::Detailed { families, vhosts }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detailed_query_names_families_and_vhosts() {
        let pair = |key: &str, value: &str| (key.to_string(), value.to_string());
        let query = [pair("family", "queue_coarse_metrics"), pair("vhost", "/"), pair("family", "channel_metrics")];
        let Shape::Detailed { families, vhosts } = detailed_shape(&query) else { panic!("detailed") };
        assert_eq!(families.into_iter().collect::<Vec<_>>(), ["channel_metrics", "queue_coarse_metrics"]);
        assert_eq!(vhosts.map(|vhosts| vhosts.into_iter().collect::<Vec<_>>()), Some(vec!["/".to_string()]));
        let Shape::Detailed { families, vhosts } = detailed_shape(&[]) else { panic!("detailed") };
        assert!(families.is_empty() && vhosts.is_none());
    }
}
