//! Prometheus metrics on `--metrics-port` at `/metrics` (OpenMetrics text, prefix `lepus_`; names
//! in docs/management.md). Every scrape reads the broker's current state into a fresh registry,
//! so nothing on the message path updates metrics.

pub mod counters;
pub mod latency;
mod rabbitmq;

pub use rabbitmq::message_totals;

use crate::broker::Broker;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The content type of the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/proc/self` tells about this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessStats {
    /// Resident set size.
    pub resident_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on file descriptors.
    pub max_fds: u64,
}

/// Reads RSS and file descriptor counts (zeros where /proc is unavailable).
pub fn process_stats() -> ProcessStats {
    // SAFETY: sysconf has no preconditions.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    let resident_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1).and_then(|pages| pages.parse::<u64>().ok()))
        .unwrap_or(0);
    let open_fds = std::fs::read_dir("/proc/self/fd").map(|entries| entries.count() as u64).unwrap_or(0);
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: limit is a valid, writable rlimit.
    let max_fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 { limit.rlim_cur } else { 0 };
    ProcessStats { resident_bytes: resident_pages * page_bytes, open_fds, max_fds }
}

type Labels = Vec<(&'static str, String)>;

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let gauge: Gauge = Gauge::default();
    gauge.set(value);
    registry.register(name, help, gauge);
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let counter: Counter = Counter::default();
    counter.inc_by(value);
    registry.register(name, help, counter);
}

fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Each quorum shard's Raft state on this node: term, commit index, applied index, leadership.
fn register_raft_metrics(registry: &mut Registry, broker: &Broker) {
    let families = [
        ("lepus_raft_term", "The current Raft term of the quorum shard"),
        ("lepus_raft_commit_index", "The highest log index this node knows committed in the quorum shard"),
        ("lepus_raft_applied_index", "The highest log index this node applied in the quorum shard"),
        ("lepus_raft_leader", "1 while this node leads the quorum shard"),
    ];
    for (position, (name, help)) in families.into_iter().enumerate() {
        let family = Family::<Labels, Gauge>::default();
        for (shard, figures) in broker.quorum.shard_figures() {
            let value = match position {
                0 => as_i64(figures.term.load(Ordering::Relaxed)),
                1 => as_i64(figures.commit_index.load(Ordering::Relaxed)),
                2 => as_i64(figures.applied_index.load(Ordering::Relaxed)),
                _ => i64::from(figures.is_leader.load(Ordering::Relaxed)),
            };
            family.get_or_create(&vec![("shard", shard.to_string())]).set(value);
        }
        registry.register(name, help, family);
    }
}

/// The syncer's counters (group commits, the publishes and logs they covered, wake-ups, failed batches).
fn register_storage_metrics(registry: &mut Registry, broker: &Broker) {
    let stats = broker.syncer.stats();
    let counter = |registry: &mut Registry, name: &str, help: &str, value: u64| {
        let metric = Counter::<u64>::default();
        metric.inc_by(value);
        registry.register(name, help, metric);
    };
    counter(registry, "lepus_storage_group_commits", "Group commits the syncer ran", stats.batches.load(Ordering::Relaxed));
    counter(
        registry,
        "lepus_storage_sync_requests",
        "Requests (publishes waiting for durability, flushes) the group commits covered",
        stats.requests.load(Ordering::Relaxed),
    );
    counter(
        registry,
        "lepus_storage_logs_written",
        "Queue logs the group commits wrote (grows with the logs that had work, not with the logs that exist)",
        stats.logs_written.load(Ordering::Relaxed),
    );
    counter(
        registry,
        "lepus_storage_syncer_wakeups",
        "Times the syncer thread woke up (requests, dirty logs, timers); idle queues add none",
        stats.wakeups.load(Ordering::Relaxed),
    );
    counter(
        registry,
        "lepus_storage_sync_failures",
        "Group commits whose write or fdatasync failed (their confirms were nacked)",
        stats.failures.load(Ordering::Relaxed),
    );
}

/// Bytes and socket reads and writes over every connection, open and closed, and what was
/// published through each exchange.
fn register_traffic_metrics(registry: &mut Registry, broker: &Broker) {
    let [received_bytes, received_packets, sent_bytes, sent_packets] = broker.traffic_totals();
    counter(registry, "lepus_network_received_bytes", "Bytes read from client connections' sockets", received_bytes);
    counter(registry, "lepus_network_received_packets", "Socket reads of client connections that returned data", received_packets);
    counter(registry, "lepus_network_sent_bytes", "Bytes written to client connections' sockets", sent_bytes);
    counter(registry, "lepus_network_sent_packets", "Socket writes to client connections", sent_packets);
    let published_in = Family::<Labels, Counter>::default();
    let published_out = Family::<Labels, Counter>::default();
    for exchange in broker.list_exchanges() {
        let labels: Labels = vec![("vhost", exchange.vhost.clone()), ("exchange", exchange.name.clone())];
        published_in.get_or_create(&labels).inc_by(exchange.published_in);
        published_out.get_or_create(&labels).inc_by(exchange.published_out);
    }
    registry.register("lepus_exchange_messages_published_in", "Messages published to an exchange", published_in);
    registry.register(
        "lepus_exchange_messages_published_out",
        "Messages an exchange routed into queues, one per queue reached",
        published_out,
    );
}

/// The fdatasync latency histogram in OpenMetrics text form. The syncer counts into fixed
/// buckets with atomics (nothing to allocate on its path), which prometheus-client's Histogram
/// cannot take as they are, so it is written here: cumulative buckets, sum and count.
fn fsync_histogram_text(broker: &Broker) -> String {
    use std::fmt::Write as _;
    let stats = broker.syncer.stats();
    let mut text = String::new();
    let _ = writeln!(text, "# HELP lepus_storage_fsync_seconds Time fdatasync took, per call");
    let _ = writeln!(text, "# TYPE lepus_storage_fsync_seconds histogram");
    let mut cumulative = 0u64;
    for (bound_us, bucket) in storage::syncer::FSYNC_LATENCY_BUCKETS_US.iter().zip(stats.fsync_us_buckets.iter()) {
        cumulative += bucket.load(Ordering::Relaxed);
        let bound = if *bound_us == u64::MAX { "+Inf".to_string() } else { format!("{}", *bound_us as f64 / 1_000_000.0) };
        let _ = writeln!(text, "lepus_storage_fsync_seconds_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(text, "lepus_storage_fsync_seconds_sum {}", stats.fsync_us_total.load(Ordering::Relaxed) as f64 / 1_000_000.0);
    let _ = writeln!(text, "lepus_storage_fsync_seconds_count {}", stats.fsyncs.load(Ordering::Relaxed));
    text
}

/// How late delayed messages were routed, as a histogram of 1 ms buckets up to
/// [`crate::delayed::LATENESS_BUCKETS_MS`] (the delay store counts them with atomics).
fn delayed_lateness_text(broker: &Broker) -> String {
    use std::fmt::Write as _;
    let lateness = &broker.delayed.lateness;
    let mut text = String::new();
    let _ = writeln!(text, "# HELP lepus_delayed_lateness_seconds How late the timer routed due delayed messages");
    let _ = writeln!(text, "# TYPE lepus_delayed_lateness_seconds histogram");
    let mut cumulative = 0u64;
    for (lateness_ms, bucket) in lateness.buckets.iter().enumerate() {
        cumulative += bucket.load(Ordering::Relaxed);
        let bound = if lateness_ms == crate::delayed::LATENESS_BUCKETS_MS {
            "+Inf".to_string()
        } else {
            format!("{}", lateness_ms as f64 / 1000.0)
        };
        let _ = writeln!(text, "lepus_delayed_lateness_seconds_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(text, "lepus_delayed_lateness_seconds_sum {}", lateness.total_ms.load(Ordering::Relaxed) as f64 / 1000.0);
    let _ = writeln!(text, "lepus_delayed_lateness_seconds_count {cumulative}");
    let _ = writeln!(text, "# HELP lepus_delayed_lateness_max_seconds The latest a delayed message was routed");
    let _ = writeln!(text, "# TYPE lepus_delayed_lateness_max_seconds gauge");
    let _ = writeln!(text, "lepus_delayed_lateness_max_seconds {}", lateness.max_ms.load(Ordering::Relaxed) as f64 / 1000.0);
    text
}

/// Every metric, in the OpenMetrics text format.
pub fn render(broker: &Broker) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let queues = broker.list_queues();
    let connections = broker.list_connections();

    let ready = Family::<Labels, Gauge>::default();
    let paged = Family::<Labels, Gauge>::default();
    let unacked = Family::<Labels, Gauge>::default();
    let consumers = Family::<Labels, Gauge>::default();
    let published = Family::<Labels, Counter>::default();
    let delivered = Family::<Labels, Counter>::default();
    let acked = Family::<Labels, Counter>::default();
    let requeued = Family::<Labels, Counter>::default();
    let (mut published_total, mut delivered_total, mut acked_total, mut consumers_total) = (0u64, 0u64, 0u64, 0u64);
    let (mut ready_total, mut unacked_total) = (0u64, 0u64);
    for queue in &queues {
        let labels: Labels = vec![("vhost", queue.vhost.clone()), ("queue", queue.name.clone())];
        let snapshot = &queue.snapshot;
        ready.get_or_create(&labels).set(as_i64(snapshot.ready));
        paged.get_or_create(&labels).set(as_i64(snapshot.paged));
        unacked.get_or_create(&labels).set(as_i64(snapshot.unacked));
        consumers.get_or_create(&labels).set(i64::from(snapshot.consumers));
        published.get_or_create(&labels).inc_by(snapshot.stats.published);
        delivered.get_or_create(&labels).inc_by(snapshot.stats.delivered);
        acked.get_or_create(&labels).inc_by(snapshot.stats.acked);
        requeued.get_or_create(&labels).inc_by(snapshot.stats.requeued);
        published_total += snapshot.stats.published;
        delivered_total += snapshot.stats.delivered;
        acked_total += snapshot.stats.acked;
        consumers_total += u64::from(snapshot.consumers);
        ready_total += snapshot.ready;
        unacked_total += snapshot.unacked;
    }
    registry.register("lepus_queue_messages_ready", "Ready messages of a queue, in memory and paged to disk", ready);
    registry.register("lepus_queue_messages_paged", "Ready messages of a queue held on disk only", paged);
    registry.register("lepus_queue_messages_unacked", "Delivered and not yet acknowledged messages of a queue", unacked);
    registry.register("lepus_queue_consumers", "Consumers of a queue", consumers);
    registry.register("lepus_queue_messages_published", "Messages enqueued into a queue", published);
    registry.register("lepus_queue_messages_delivered", "Deliveries from a queue to consumers and basic.get", delivered);
    registry.register("lepus_queue_messages_acked", "Deliveries from a queue settled by ack or no-ack", acked);
    registry.register("lepus_queue_messages_requeued", "Deliveries put back into a queue", requeued);

    gauge(&mut registry, "lepus_queues", "Queues", queues.len() as i64);
    gauge(&mut registry, "lepus_delayed_messages", "Messages held back by x-delayed-message exchanges", as_i64(broker.delayed.pending()));
    gauge(&mut registry, "lepus_exchanges", "Exchanges", broker.list_exchanges().len() as i64);
    gauge(&mut registry, "lepus_connections", "Open client connections", connections.len() as i64);
    let channels: usize = connections.iter().map(|connection| connection.session.channels).sum();
    gauge(&mut registry, "lepus_channels", "Open channels", channels as i64);
    gauge(&mut registry, "lepus_consumers", "Consumers over all queues", as_i64(consumers_total));
    gauge(&mut registry, "lepus_messages_ready", "Ready messages over all queues", as_i64(ready_total));
    gauge(&mut registry, "lepus_messages_unacked", "Unacked messages over all queues", as_i64(unacked_total));
    counter(&mut registry, "lepus_messages_published", "Messages enqueued, summed over queues", published_total);
    counter(&mut registry, "lepus_messages_delivered", "Deliveries, summed over queues", delivered_total);
    counter(&mut registry, "lepus_messages_acked", "Acked deliveries, summed over queues", acked_total);

    let memory_alarm = broker.memory_alarm.load(Ordering::Acquire);
    gauge(
        &mut registry,
        "lepus_memory_alarm",
        "1 while resident memory is above the high watermark and publishers are blocked",
        i64::from(memory_alarm),
    );
    gauge(
        &mut registry,
        "lepus_memory_high_watermark_bytes",
        "The memory high watermark",
        as_i64(broker.config.memory_high_watermark_bytes),
    );
    let alarm = broker.disk_alarm.load(Ordering::Acquire);
    gauge(&mut registry, "lepus_disk_alarm", "1 while free disk space is below the limit and publishers are blocked", i64::from(alarm));
    let free = crate::alarms::disk::free_bytes(&broker.config.data_dir).unwrap_or(0);
    gauge(&mut registry, "lepus_disk_free_bytes", "Free bytes on the data directory's filesystem", as_i64(free));
    gauge(
        &mut registry,
        "lepus_disk_free_limit_bytes",
        "Publishers are blocked below this many free bytes",
        as_i64(broker.config.disk_free_limit_bytes),
    );

    let process = process_stats();
    gauge(&mut registry, "lepus_process_resident_memory_bytes", "Resident set size of the broker process", as_i64(process.resident_bytes));
    gauge(&mut registry, "lepus_process_open_fds", "Open file descriptors of the broker process", as_i64(process.open_fds));
    gauge(&mut registry, "lepus_process_max_fds", "Soft limit on file descriptors of the broker process", as_i64(process.max_fds));
    let build = Family::<Labels, Gauge>::default();
    build.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())]).set(1);
    registry.register("lepus_build_info", "Always 1; the version is a label", build);

    register_storage_metrics(&mut registry, broker);
    register_raft_metrics(&mut registry, broker);
    if let Some(cluster) = broker.cluster.get() {
        crate::cluster::metrics::register(&mut registry, cluster);
    }
    register_traffic_metrics(&mut registry, broker);
    // Summed over queues, which is how RabbitMQ's channel_queue_exchange_metrics add up on /metrics.
    counter(&mut registry, "rabbitmq_queue_messages_published", "Total number of messages published to queues", published_total);
    let scrape = rabbitmq::Scrape { broker, queues: &queues, connections: &connections, process, free_disk_bytes: free };
    rabbitmq::register(&mut registry, &scrape, &rabbitmq::Shape::Aggregated);

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    // The histogram goes before the closing "# EOF" line the encoder writes.
    let end = text.rfind("# EOF").unwrap_or(text.len());
    text.insert_str(end, &fsync_histogram_text(broker));
    let end = text.rfind("# EOF").unwrap_or(text.len());
    let confirms = latency::CONFIRM_LATENCY.text(
        "lepus_confirm_latency_seconds",
        "Time from the socket read that carried a publish to its basic.ack, for confirms that waited for a group commit",
    );
    text.insert_str(end, &confirms);
    let end = text.rfind("# EOF").unwrap_or(text.len());
    text.insert_str(end, &delayed_lateness_text(broker));
    let deliveries = latency::DELIVERY_LATENCY.text(
        "lepus_delivery_latency_seconds",
        "Time from the socket read that carried a publish to the write of its first delivery to a consumer",
    );
    text.insert_str(end, &deliveries);
    Ok(text)
}

/// Only RabbitMQ's families, per object (`/metrics/per-object`) or as `/metrics/detailed` asks.
pub fn render_rabbitmq(broker: &Broker, shape: &rabbitmq::Shape) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let queues = broker.list_queues();
    let connections = broker.list_connections();
    let free_disk_bytes = crate::alarms::disk::free_bytes(&broker.config.data_dir).unwrap_or(0);
    let scrape = rabbitmq::Scrape { broker, queues: &queues, connections: &connections, process: process_stats(), free_disk_bytes };
    rabbitmq::register(&mut registry, &scrape, shape);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

fn respond(rendered: Result<String, std::fmt::Error>) -> Response {
    match rendered {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics failed: {error}")).into_response(),
    }
}

async fn metrics(State(broker): State<Arc<Broker>>) -> Response {
    respond(render(&broker))
}

async fn per_object(State(broker): State<Arc<Broker>>) -> Response {
    respond(render_rabbitmq(&broker, &rabbitmq::Shape::PerObject))
}

async fn detailed(State(broker): State<Arc<Broker>>, Query(query): Query<Vec<(String, String)>>) -> Response {
    respond(render_rabbitmq(&broker, &rabbitmq::detailed_shape(&query)))
}

/// Serves `/metrics`, `/metrics/per-object` and `/metrics/detailed` on `listener` forever (no
/// authentication, like RabbitMQ's prometheus plugin).
pub async fn serve(broker: Arc<Broker>, listener: tokio::net::TcpListener) {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .route("/metrics/per-object", axum::routing::get(per_object))
        .route("/metrics/detailed", axum::routing::get(detailed))
        .with_state(broker);
    if let Err(error) = axum::serve(listener, app).await {
        tracing::error!(%error, "the metrics HTTP server stopped");
    }
}
