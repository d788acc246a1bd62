//! `lepus perf client | producer | consumer`: set up, run, report, clean up.

use crate::cli::{parse_range, Mode, PerfArgs, QueueType};
use crate::consumer::{run_consumer, ConsumerSpec, Source};
use crate::control::Control;
use crate::producer::{run_producer, Completion, ProducerSpec};
use crate::report::{write_json, Distributions, HdrLog, Interval, Latencies, Report, Summary, Sustained, JSON_SCHEMA};
use crate::stats::{new_histogram, Clock, Counters, Registry};
use lepus_client::{AmqpUrl, Connection, ConnectionOptions};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};
use tokio::task::JoinSet;

/// What a destination URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `queue://NAME`.
    Queue(String),
    /// `topic://NAME`.
    Topic(String),
}

impl Destination {
    /// Parses `queue://NAME` or `topic://NAME` and expands it to `count` names.
    pub fn expand(text: &str, count: u32) -> Result<Vec<Destination>, String> {
        let (kind, name) = text.split_once("://").ok_or_else(|| format!("destination {text:?}: expected queue://NAME or topic://NAME"))?;
        if name.is_empty() || name.len() > 200 {
            return Err(format!("destination {text:?}: the name must have 1 to 200 bytes"));
        }
        let names: Vec<String> =
            if count <= 1 { vec![name.to_string()] } else { (0..count).map(|index| format!("{name}{index}")).collect() };
        names
            .into_iter()
            .map(|name| match kind {
                "queue" => Ok(Destination::Queue(name)),
                "topic" => Ok(Destination::Topic(name)),
                other => Err(format!("destination kind {other:?}: expected queue or topic")),
            })
            .collect()
    }

    fn name(&self) -> &str {
        match self {
            Destination::Queue(name) | Destination::Topic(name) => name,
        }
    }
}

/// The outcome of a run, for the caller's exit code and for tests.
pub struct Outcome {
    /// The summary printed at the end.
    pub summary: Summary,
    /// Exit code: 0 when the run ended as planned, 1 when it failed.
    pub exit_code: i32,
}

/// Hides the password in a URL for reports.
pub fn redact(url: &AmqpUrl) -> String {
    format!("amqp://{}:***@{}/{}", url.user, url.address(), url.vhost.replace('/', "%2F"))
}

/// Runs one perf command to the end.
pub async fn run(mode: Mode) -> Result<Outcome, String> {
    let Some(args) = mode.args().cloned() else {
        return Err("the sink is not a load mode".to_string());
    };
    if args.protocol == crate::cli::Protocol::Stream {
        return crate::stream::run(mode, args).await;
    }
    let producing = !matches!(mode, Mode::Consumer(_));
    let consuming = !matches!(mode, Mode::Producer(_));
    let urls = args.url.iter().map(|text| AmqpUrl::parse(text).map_err(|error| error.to_string())).collect::<Result<Vec<_>, _>>()?;
    let url = urls.first().cloned().ok_or("--url: at least one broker URL")?;
    // Consumers spread over --url too, unless --consumer-url names their one broker.
    let consumer_urls = match &args.consumer_url {
        Some(text) => vec![AmqpUrl::parse(text).map_err(|error| error.to_string())?],
        None => urls.clone(),
    };
    let consumer_url = consumer_urls[0].clone();
    let queue_arguments = args.queue_arguments()?;
    if args.queue_type() != crate::cli::QueueType::Classic && args.destination.starts_with("topic://") {
        // A topic's subscription queues are declared by its consumers, without arguments.
        return Err("--queue-type quorum and stream apply to queue:// destinations".to_string());
    }
    let destinations = Destination::expand(&args.destination, args.num_destinations)?;
    let ack_every = parse_range(&args.ack_every).map_err(|error| format!("--ack-every {error}"))?;
    let completion = completion(&args)?;
    if args.message_size < 8 {
        eprintln!("note: messages under 8 bytes carry no timestamp: no transfer latency");
    }
    let duration_s = duration_s(&args);
    // Quorum and stream queues exist only durable.
    let durable = args.durable || args.persistent || args.queue_type() != crate::cli::QueueType::Classic;

    // Topology: queues and topic exchanges, declared by either side so that any start order works.
    let setup_url = if producing { &url } else { &consumer_url };
    let broker = declare(setup_url, &destinations, durable, args.durable, &queue_arguments).await?;
    println!(
        "lepus perf {}: {} against {} ({}), {} destination(s), {} producer(s) and {} consumer(s) each, {} B messages, {}",
        mode.name(),
        args.destination,
        redact(setup_url),
        broker,
        destinations.len(),
        if producing { args.producers } else { 0 },
        if consuming { args.consumers } else { 0 },
        args.message_size,
        match args.rate {
            Some(rate) => format!("target {rate} msg/s"),
            None => "all-out".to_string(),
        }
    );

    let clock = Clock::new();
    let registry = Arc::new(Registry::default());
    let producers_total = if producing { args.producers as usize * destinations.len() } else { 0 };
    let rate_per_producer = match args.rate {
        Some(rate) if producers_total > 0 => rate / producers_total as f64,
        _ => 0.0,
    };
    let producer_control = Arc::new(Control::new(rate_per_producer));
    let consumer_control = Arc::new(Control::new(0.0));
    let mut consumers = JoinSet::new();
    let mut producers = JoinSet::new();

    if consuming {
        let mut readies = Vec::new();
        let mut spread = 0;
        for destination in &destinations {
            for index in 0..args.consumers {
                let consumer_url = consumer_urls[spread % consumer_urls.len()].clone();
                spread += 1;
                let source = match destination {
                    Destination::Queue(name) => Source::Queue(name.clone()),
                    Destination::Topic(name) => Source::Subscription {
                        exchange: name.clone(),
                        durable_queue: args.durable.then(|| subscription_queue(name, index)),
                    },
                };
                let spec = ConsumerSpec {
                    name: format!("lepus-perf consumer {} #{index}", destination.name()),
                    url: consumer_url.clone(),
                    source,
                    prefetch: args.prefetch,
                    ack_every,
                    stream_offset: if args.queue_type() == QueueType::Stream { args.stream_offset.clone() } else { None },
                };
                let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
                readies.push(ready_rx);
                let control = consumer_control.clone();
                let stats = registry.worker();
                consumers.spawn(async move {
                    if let Err(error) = run_consumer(spec.clone(), control.clone(), stats, clock, ready_tx).await {
                        control.fail(format!("{}: {error}", spec.name));
                    }
                });
            }
        }
        for ready in readies {
            match tokio::time::timeout(Duration::from_secs(60), ready).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => return Err(format!("a consumer could not start: {error}")),
                _ => return Err("a consumer did not start within 60 s".to_string()),
            }
        }
    }
    if producing {
        let payload: Vec<u8> = (0..args.message_size).map(|index| b'a' + (index % 26) as u8).collect();
        let payloads = Arc::new(vec![payload]);
        let mut spread = 0;
        for destination in &destinations {
            let (exchange, routing_key) = match destination {
                Destination::Queue(name) => (String::new(), name.clone()),
                Destination::Topic(name) => (name.clone(), name.clone()),
            };
            for index in 0..args.producers {
                let url = urls[spread % urls.len()].clone();
                spread += 1;
                let spec = ProducerSpec {
                    name: format!("lepus-perf producer {} #{index}", destination.name()),
                    url,
                    exchange: exchange.clone(),
                    routing_key: routing_key.clone(),
                    persistent: args.persistent,
                    completion,
                    message_count: args.message_count,
                    payloads: payloads.clone(),
                    precise_pacing: args.pacing == crate::cli::Pacing::Precise,
                    latency_from_sent: args.latency_from_sent,
                };
                let control = producer_control.clone();
                let stats = registry.worker();
                producers.spawn(async move {
                    if let Err(error) = run_producer(spec.clone(), control.clone(), stats, clock).await {
                        control.fail(format!("{}: {error}", spec.name));
                    }
                });
            }
        }
    }

    let fanout = destinations
        .iter()
        .map(|destination| match destination {
            Destination::Queue(_) => 1,
            Destination::Topic(_) => u64::from(args.consumers),
        })
        .max()
        .unwrap_or(1);
    let workers = Workers { registry, producer_control, consumer_control, clock, producers, consumers };
    let config = config_json(&args, &urls, &consumer_url);
    let (setup_url, cleanup_args) = (setup_url.clone(), args.clone());
    let cleanup = move || async move { delete_topology(&setup_url, &destinations, &cleanup_args).await };
    let shape = RunShape { duration_s, fanout, producing, consuming };
    conclude(&mode, args, workers, shape, broker, config, cleanup).await
}

/// The workers of a run, once started (by either protocol).
pub(crate) struct Workers {
    pub(crate) registry: Arc<Registry>,
    pub(crate) producer_control: Arc<Control>,
    pub(crate) consumer_control: Arc<Control>,
    pub(crate) clock: Clock,
    pub(crate) producers: JoinSet<()>,
    pub(crate) consumers: JoinSet<()>,
}

/// How a run ends: after a duration or a count, and how many receptions a send makes.
pub(crate) struct RunShape {
    pub(crate) duration_s: Option<u64>,
    pub(crate) fanout: u64,
    pub(crate) producing: bool,
    pub(crate) consuming: bool,
}

/// Measures running workers to the end, stops them, cleans up and reports: the part of a run
/// both protocols share.
pub(crate) async fn conclude<F, C>(
    mode: &Mode,
    args: PerfArgs,
    mut workers: Workers,
    shape: RunShape,
    broker: String,
    config: serde_json::Value,
    cleanup: C,
) -> Result<Outcome, String>
where
    C: FnOnce() -> F,
    F: std::future::Future<Output = Result<(), String>>,
{
    let clock = workers.clock;
    let setup = RunSetup {
        args: &args,
        registry: &workers.registry,
        producer_control: &workers.producer_control,
        consumer_control: &workers.consumer_control,
        clock,
        duration_s: shape.duration_s,
        fanout: shape.fanout,
        producing: shape.producing,
        consuming: shape.consuming,
    };
    let hdr = match &args.hdr {
        Some(path) => Some(
            HdrLog::create(path.clone(), clock.origin_system_time(), format!("lepus perf {} {}", mode.name(), args.destination))
                .map_err(|error| format!("--hdr {}: {error}", path.display()))?,
        ),
        None => None,
    };
    let (intervals, summary) = report_loop(&setup, &mut workers.producers, hdr.as_ref()).await;

    workers.consumer_control.stop();
    workers.producer_control.stop();
    // Workers end within their own bounded waits; this bounds the join too.
    let _ = tokio::time::timeout(Duration::from_secs(15), async {
        while workers.producers.join_next().await.is_some() {}
        while workers.consumers.join_next().await.is_some() {}
    })
    .await;
    if let Some(hdr) = hdr {
        if let Err(error) = hdr.finish() {
            eprintln!("warning: --hdr: {error}");
        }
    }
    let cleanup_wanted = args.cleanup || (matches!(mode, Mode::Client(_)) && !args.keep);
    if cleanup_wanted {
        if let Err(error) = cleanup().await {
            eprintln!("warning: cleanup failed: {error}");
        }
    }
    summary.print();
    if let Some(path) = &args.json {
        let report = Report {
            schema: JSON_SCHEMA,
            mode: mode.name().to_string(),
            broker,
            started_at_unix_ms: clock.origin_system_time().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64),
            config,
            intervals,
            summary: Some(summary.clone()),
        };
        write_json(path, &report).map_err(|error| format!("--json {}: {error}", path.display()))?;
    }
    let exit_code = if summary.error.is_some() { 1 } else { 0 };
    Ok(Outcome { summary, exit_code })
}

/// The measured seconds: --duration, or none when --message-count ends the run, or 60.
pub(crate) fn duration_s(args: &PerfArgs) -> Option<u64> {
    match (args.duration, args.message_count) {
        (Some(duration), _) => Some(duration),
        (None, Some(_)) => None,
        (None, None) => Some(60),
    }
}

fn completion(args: &PerfArgs) -> Result<Completion, String> {
    match (args.tx_size, &args.batch_size) {
        (Some(_), Some(_)) => Err("--tx-size and --batch-size exclude each other".to_string()),
        (Some(0), None) => Err("--tx-size must be at least 1".to_string()),
        (Some(size), None) => Ok(Completion::Transactions { size }),
        (None, Some(text)) => {
            let (min, max) = parse_range(text).map_err(|error| format!("--batch-size {error}"))?;
            Ok(Completion::Batches { min, max })
        }
        (None, None) if args.max_pending == 0 => Err("--max-pending must be at least 1".to_string()),
        (None, None) => Ok(Completion::Confirms { max_pending: args.max_pending }),
    }
}

fn subscription_queue(topic: &str, index: u32) -> String {
    format!("{topic}.subscription-{index}")
}

async fn declare(
    url: &AmqpUrl,
    destinations: &[Destination],
    queue_durable: bool,
    exchange_durable: bool,
    queue_arguments: &amqp_codec::FieldTable,
) -> Result<String, String> {
    let options = ConnectionOptions { connection_name: "lepus-perf setup".to_string(), ..ConnectionOptions::default() };
    let work = async {
        let mut connection = Connection::open(url, &options).await?;
        connection.channel_open(1).await?;
        for destination in destinations {
            match destination {
                Destination::Queue(name) => {
                    connection.queue_declare_with_arguments(1, name, queue_durable, false, false, queue_arguments.clone()).await?;
                }
                Destination::Topic(name) => {
                    connection.exchange_declare(1, name, "topic", exchange_durable).await?;
                }
            }
        }
        let product = connection.server_product().to_string();
        connection.close().await?;
        Ok::<_, lepus_client::ClientError>(product)
    };
    work.await.map_err(|error| error.to_string())
}

async fn delete_topology(url: &AmqpUrl, destinations: &[Destination], args: &PerfArgs) -> Result<(), String> {
    let work = async {
        let mut connection = Connection::open(url, &ConnectionOptions::default()).await?;
        connection.channel_open(1).await?;
        for destination in destinations {
            match destination {
                Destination::Queue(name) => {
                    connection.queue_delete(1, name).await?;
                }
                Destination::Topic(name) => {
                    if args.durable {
                        for index in 0..args.consumers {
                            connection.queue_delete(1, &subscription_queue(name, index)).await?;
                        }
                    }
                    connection.exchange_delete(1, name).await?;
                }
            }
        }
        connection.close().await
    };
    match tokio::time::timeout(Duration::from_secs(30), work).await {
        Ok(result) => result.map_err(|error| error.to_string()),
        Err(_) => Err("timed out after 30 s".to_string()),
    }
}

fn config_json(args: &PerfArgs, urls: &[AmqpUrl], consumer_url: &AmqpUrl) -> serde_json::Value {
    let queue_type = match args.queue_type() {
        crate::cli::QueueType::Classic => "classic",
        crate::cli::QueueType::Quorum => "quorum",
        crate::cli::QueueType::Stream => "stream",
    };
    serde_json::json!({
        "destination": args.destination,
        "url": redact(&urls[0]),
        "urls": urls.iter().map(redact).collect::<Vec<_>>(),
        "queue_type": queue_type,
        "queue_args": args.queue_args,
        "consumer_url": redact(consumer_url),
        "num_destinations": args.num_destinations,
        "producers_per_destination": args.producers,
        "consumers_per_destination": args.consumers,
        "message_size_bytes": args.message_size,
        "persistent": args.persistent,
        "durable": args.durable,
        "rate_per_sec": args.rate,
        "max_pending": args.max_pending,
        "tx_size": args.tx_size,
        "batch_size": args.batch_size,
        "ack_every": args.ack_every,
        "prefetch": args.prefetch,
        "pacing": format!("{:?}", args.pacing).to_lowercase(),
        "warmup_s": args.warmup,
        "sustained_p99_ms": args.sustained_p99_ms,
        "latency_from_sent": args.latency_from_sent,
        "duration_s": args.duration,
        "message_count": args.message_count,
    })
}

struct RunSetup<'a> {
    args: &'a PerfArgs,
    registry: &'a Registry,
    producer_control: &'a Control,
    consumer_control: &'a Control,
    clock: Clock,
    duration_s: Option<u64>,
    fanout: u64,
    producing: bool,
    consuming: bool,
}

/// Why the measured phase ended.
#[derive(Debug, PartialEq, Eq)]
enum Phase {
    Running,
    Draining { since: Instant },
    Done,
}

async fn report_loop(setup: &RunSetup<'_>, producers: &mut JoinSet<()>, hdr: Option<&HdrLog>) -> (Vec<Interval>, Summary) {
    let args = setup.args;
    let start = Instant::now();
    let warmup = Duration::from_secs(args.warmup);
    let end = setup.duration_s.map(|duration| start + warmup + Duration::from_secs(duration));
    let mut ticker = tokio::time::interval_at((start + Duration::from_secs(1)).into(), Duration::from_secs(1));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut interrupted = false;
    let mut intervals = Vec::new();
    // Counted from zero: consumers that started first may already have received messages.
    let mut previous = Counters::default();
    let mut previous_at = start;
    let mut measured_from: Option<(Instant, Counters)> = if warmup.is_zero() { Some((start, previous)) } else { None };
    let mut measured_until: Option<Instant> = None;
    // The counters when the measured period ended (the drain after it is not measured).
    let mut at_measured_end: Option<Counters> = None;
    let mut total = [new_histogram(), new_histogram(), new_histogram()];
    let mut phase = Phase::Running;
    let mut producers_left = producers.len();
    let mut last_received = (previous.received, Instant::now());
    loop {
        let mut final_tick = false;
        tokio::select! {
            _ = ticker.tick() => {}
            _ = &mut ctrl_c => { interrupted = true; final_tick = true; }
            Some(_) = producers.join_next(), if producers_left > 0 => {
                producers_left -= 1;
                continue;
            }
        }
        let now = Instant::now();
        let totals = setup.registry.totals();
        let mut histograms = [new_histogram(), new_histogram(), new_histogram()];
        setup.registry.harvest(&mut histograms);
        let in_warmup = measured_from.is_none();
        let length = now.duration_since(previous_at);
        let mut interval = Interval::new(
            now.duration_since(start).as_secs_f64(),
            length.as_secs_f64(),
            in_warmup,
            &totals.since(&previous),
            Latencies::of(&histograms),
        );
        interval.draining = matches!(phase, Phase::Draining { .. });
        if !args.quiet {
            interval.print(args.show_latency);
        }
        if let Some(hdr) = hdr {
            hdr.write(previous_at.duration_since(setup.clock.origin()), length, in_warmup, &histograms);
        }
        if in_warmup {
            // The boundary: whatever comes after this tick is measured.
        } else {
            for (target, source) in total.iter_mut().zip(histograms.iter()) {
                let _ = target.add(source);
            }
        }
        intervals.push(interval);
        // Ticks land a little after each whole second: the tick that ends the warm-up (within
        // a tenth of a second) belongs to it, and the measurement starts from its counters.
        if measured_from.is_none() && now.duration_since(start) + Duration::from_millis(100) >= warmup {
            measured_from = Some((now, totals));
        }
        previous = totals;
        previous_at = now;
        if totals.received != last_received.0 {
            last_received = (totals.received, now);
        }

        let failed = setup.producer_control.error().is_some() || setup.consumer_control.error().is_some();
        if final_tick || failed {
            measured_until.get_or_insert(now);
            at_measured_end.get_or_insert(totals);
            break;
        }
        match phase {
            Phase::Running => {
                let time_up = end.is_some_and(|end| now >= end);
                let producers_done = setup.producing && producers_left == 0;
                let consumer_count_done = !setup.producing && args.message_count.is_some_and(|count| totals.received >= count);
                if time_up || producers_done || consumer_count_done {
                    measured_until = Some(now);
                    at_measured_end = Some(totals);
                    setup.producer_control.stop();
                    phase =
                        if setup.producing && setup.consuming && args.consumers > 0 { Phase::Draining { since: now } } else { Phase::Done };
                }
            }
            Phase::Draining { since } => {
                let caught_up = totals.received >= totals.sent * setup.fanout;
                let stalled = now.duration_since(last_received.1) >= Duration::from_secs(3);
                let too_long = now.duration_since(since) >= Duration::from_secs(args.drain_timeout);
                if caught_up || stalled || too_long {
                    phase = Phase::Done;
                }
            }
            Phase::Done => {}
        }
        if phase == Phase::Done {
            break;
        }
    }
    let totals = setup.registry.totals();
    let (from, base) = measured_from.unwrap_or((start, Counters::default()));
    let until = measured_until.unwrap_or_else(Instant::now);
    let error = setup.producer_control.error().or_else(|| setup.consumer_control.error());
    let mut summary =
        Summary::new(until.saturating_duration_since(from).as_secs_f64(), &totals.since(&base), Latencies::of(&total), interrupted, error);
    summary.latency_distribution_us = Distributions::of(&total);
    if setup.producing && setup.consuming {
        let at_end = at_measured_end.unwrap_or(totals).since(&base);
        let transfer_p99_us = summary.latencies.transfer_latency_us.as_ref().map(|transfer| transfer.p99_us);
        let expected = at_end.sent * setup.fanout;
        summary.sustained = Some(Sustained::judge(expected, at_end.received, summary.measured_s, transfer_p99_us, args.sustained_p99_ms));
    }
    (intervals, summary)
}
