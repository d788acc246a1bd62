//! Runs one OMB workload the way OMB's WorkloadGenerator does: warm-up, then the measured run
//! (with the backlog build-and-drain when asked), stats every period, the result in OMB's format.
//!
//! Mapping onto AMQP, as OMB's RabbitMQ driver does: a topic is a durable fanout exchange; a
//! subscription is a durable queue `EXCHANGE-sub-NNN` bound to it; consumers of one subscription
//! compete on that queue; producers publish to the exchange with publisher confirms.

use crate::bench::result::TestResult;
use crate::bench::workload::Workload;
use crate::consumer::{run_consumer, ConsumerSpec, Source};
use crate::control::Control;
use crate::producer::{run_producer, Completion, ProducerSpec};
use crate::stats::{new_histogram, Clock, Counters, Registry};
use hdrhistogram::Histogram;
use lepus_client::{AmqpUrl, Connection, ConnectionOptions};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How to run a workload.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Broker.
    pub url: AmqpUrl,
    /// More brokers (the other nodes of a cluster): producers and consumers are spread over
    /// `url` and these, round robin.
    pub more_urls: Vec<AmqpUrl>,
    /// The subscription queues' arguments (`x-queue-type` and --queue-args).
    pub queue_arguments: amqp_codec::FieldTable,
    /// Stats period in seconds (OMB: 10).
    pub period_s: u64,
    /// Override of warmupDurationMinutes, in seconds.
    pub warmup_s: Option<u64>,
    /// Override of testDurationMinutes, in seconds.
    pub duration_s: Option<u64>,
    /// Persistent messages (OMB's RabbitMQ driver: messagePersistence).
    pub persistent: bool,
    /// Unconfirmed publishes per producer.
    pub max_pending: u32,
    /// Consumer prefetch.
    pub prefetch: u16,
    /// Longest the backlog build or drain may take, in seconds.
    pub backlog_timeout_s: u64,
    /// Driver name in the result; default: the broker's product name.
    pub driver: Option<String>,
}

/// Shared between the stats loop and the backlog task.
struct Phases {
    waiting_for_backlog: AtomicBool,
}

/// Runs `workload` and returns OMB's result.
pub async fn run_workload(workload: &Workload, workload_path: &Path, options: &BenchOptions) -> Result<TestResult, String> {
    let tag: u32 = rand::random::<u32>() % 100_000;
    let topics: Vec<String> = (0..workload.topics).map(|index| format!("lepus-bench-{tag:05}-{index:04}")).collect();
    let subscriptions: Vec<(String, String)> = topics
        .iter()
        .flat_map(|topic| (0..workload.subscriptions_per_topic).map(move |index| (topic.clone(), format!("{topic}-sub-{index:03}"))))
        .collect();
    let broker = declare(&options.url, &topics, &subscriptions, &options.queue_arguments).await?;
    let urls: Vec<AmqpUrl> = std::iter::once(options.url.clone()).chain(options.more_urls.iter().cloned()).collect();
    let mut spread = 0;
    let driver = options.driver.clone().unwrap_or_else(|| broker.split_whitespace().next().unwrap_or("AMQP").to_string());
    println!(
        "lepus bench: {} on {broker}: {} topic(s), {} subscription(s)/topic x {} consumer(s), {} producer(s)/topic, {} B",
        workload.name,
        workload.topics,
        workload.subscriptions_per_topic,
        workload.consumer_per_subscription,
        workload.producers_per_topic,
        workload.message_size
    );

    let clock = Clock::new();
    let registry = Arc::new(Registry::default());
    let producers_total = (workload.topics * workload.producers_per_topic).max(1) as f64;
    let mut rate_total = if workload.producer_rate > 0.0 { workload.producer_rate } else { 10_000.0 };
    let producer_control = Arc::new(Control::new(rate_total / producers_total));
    let consumer_control = Arc::new(Control::new(0.0));
    let mut workers = JoinSet::new();

    let mut readies = Vec::new();
    for (_, queue) in &subscriptions {
        for index in 0..workload.consumer_per_subscription {
            let url = urls[spread % urls.len()].clone();
            spread += 1;
            let spec = ConsumerSpec {
                name: format!("lepus-bench consumer {queue} #{index}"),
                url,
                source: Source::Queue(queue.clone()),
                prefetch: options.prefetch,
                ack_every: (1, 1),
                stream_offset: None,
            };
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            readies.push(ready_rx);
            let (control, stats) = (consumer_control.clone(), registry.worker());
            workers.spawn(async move {
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
    let payloads = Arc::new(workload.payloads(workload_path));
    for topic in &topics {
        for index in 0..workload.producers_per_topic {
            let url = urls[spread % urls.len()].clone();
            spread += 1;
            let spec = ProducerSpec {
                name: format!("lepus-bench producer {topic} #{index}"),
                url,
                exchange: topic.clone(),
                // Keys do not route on a fanout exchange (keyDistributor has no effect, as with
                // OMB's RabbitMQ driver).
                routing_key: String::new(),
                persistent: options.persistent,
                completion: Completion::Confirms { max_pending: options.max_pending },
                message_count: None,
                payloads: payloads.clone(),
                precise_pacing: true,
                latency_from_sent: false,
            };
            let (control, stats) = (producer_control.clone(), registry.worker());
            workers.spawn(async move {
                if let Err(error) = run_producer(spec.clone(), control.clone(), stats, clock).await {
                    control.fail(format!("{}: {error}", spec.name));
                }
            });
        }
    }

    let context = StatsContext {
        workload,
        registry: &registry,
        producer_control: &producer_control,
        consumer_control: &consumer_control,
        period: Duration::from_secs(options.period_s.max(1)),
    };
    let find_max_rate = workload.producer_rate <= 0.0;
    let warmup_s = options.warmup_s.unwrap_or((workload.warmup_duration_minutes * 60.0) as u64);
    let duration_s = options.duration_s.unwrap_or((workload.test_duration_minutes * 60.0) as u64);
    let phases = Arc::new(Phases { waiting_for_backlog: AtomicBool::new(false) });
    let mut state = LoopState { totals: Counters::default(), last_control: (Instant::now(), Counters::default()), ramp: 1.0 };
    let outcome = async {
        if warmup_s > 0 {
            println!("----- Starting warm-up traffic ({warmup_s} s) ------");
            collect(&context, &mut state, warmup_s, &phases, find_max_rate, &mut rate_total, "warm-up").await?;
        }
        if workload.consumer_backlog_size_gb > 0.0 {
            phases.waiting_for_backlog.store(true, Ordering::Release);
            let (phases, consumer_control, registry) = (phases.clone(), consumer_control.clone(), registry.clone());
            let (workload, timeout_s) = (workload.clone(), options.backlog_timeout_s);
            tokio::spawn(async move {
                build_and_drain(&workload, &registry, &consumer_control, timeout_s, duration_s).await;
                phases.waiting_for_backlog.store(false, Ordering::Release);
            });
        }
        println!("----- Starting benchmark traffic ({duration_s} s) ------");
        collect(&context, &mut state, duration_s, &phases, find_max_rate, &mut rate_total, "benchmark").await
    }
    .await;
    producer_control.stop();
    consumer_control.set_paused(false);
    consumer_control.stop();
    let _ = tokio::time::timeout(Duration::from_secs(15), async { while workers.join_next().await.is_some() {} }).await;
    if let Err(error) = delete(&options.url, &topics, &subscriptions).await {
        eprintln!("warning: cleanup failed: {error}");
    }
    let mut result = outcome?;
    result.workload = workload.name.clone();
    result.driver = driver;
    result.message_size = workload.message_size as u64;
    result.topics = workload.topics;
    result.partitions = workload.partitions_per_topic;
    result.producers_per_topic = workload.producers_per_topic;
    result.consumers_per_topic = workload.consumer_per_subscription;
    Ok(result)
}

struct StatsContext<'a> {
    workload: &'a Workload,
    registry: &'a Registry,
    producer_control: &'a Control,
    consumer_control: &'a Control,
    period: Duration,
}

struct LoopState {
    totals: Counters,
    last_control: (Instant, Counters),
    ramp: f64,
}

/// OMB's printAndCollectStats: a line and a result entry per period until the duration is over
/// and no backlog phase is pending. Aggregates cover only this call (OMB resets stats between
/// warm-up and the measured run).
async fn collect(
    context: &StatsContext<'_>,
    state: &mut LoopState,
    duration_s: u64,
    phases: &Phases,
    find_max_rate: bool,
    rate_total: &mut f64,
    label: &str,
) -> Result<TestResult, String> {
    let start = Instant::now();
    let end = start + Duration::from_secs(duration_s);
    let mut result = TestResult::default();
    let mut aggregate = [new_histogram(), new_histogram(), new_histogram()];
    let mut last = Instant::now();
    // A rate search adjusts every 3 s, as OMB's does; stats still come every period.
    let mut next_period = start + context.period;
    let subscriptions = i64::from(context.workload.subscriptions_per_topic);
    loop {
        let wake = if find_max_rate { next_period.min(Instant::now() + Duration::from_secs(3)) } else { next_period };
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = tokio::signal::ctrl_c() => return Err("interrupted".to_string()),
        }
        if let Some(error) = context.producer_control.error().or_else(|| context.consumer_control.error()) {
            return Err(error);
        }
        let now = Instant::now();
        if find_max_rate {
            adjust_rate(context, state, rate_total, now);
        }
        if now < next_period {
            continue;
        }
        next_period += context.period;
        let totals = context.registry.totals();
        let delta = totals.since(&state.totals);
        state.totals = totals;
        let elapsed_s = now.duration_since(last).as_secs_f64();
        last = now;
        let mut histograms = [new_histogram(), new_histogram(), new_histogram()];
        context.registry.harvest(&mut histograms);
        let [publish, end_to_end, delay] = &histograms;
        let backlog = (subscriptions * totals.sent as i64 - totals.received as i64).max(0);
        let publish_rate = delta.sent as f64 / elapsed_s;
        let consume_rate = delta.received as f64 / elapsed_s;
        let error_rate = delta.nacked as f64 / elapsed_s;
        print_period(
            label,
            publish_rate,
            error_rate,
            consume_rate,
            backlog,
            publish,
            delay,
            end_to_end,
            delta.sent_bytes as f64 / elapsed_s,
        );
        result.push_period(publish_rate, error_rate, consume_rate, backlog, publish, delay, end_to_end);
        for (target, source) in aggregate.iter_mut().zip(histograms.iter()) {
            let _ = target.add(source);
        }
        if now >= end && !phases.waiting_for_backlog.load(Ordering::Acquire) {
            break;
        }
    }
    let [publish, end_to_end, delay] = &aggregate;
    result.set_aggregated(publish, delay, end_to_end);
    println!(
        "----- Aggregated Pub Latency (ms) avg: {:.1} - 50%: {:.1} - 95%: {:.1} - 99%: {:.1} - 99.9%: {:.1} - Max: {:.1} | E2E (ms) 50%: {:.1} - 99%: {:.1}",
        result.aggregated_publish_latency_avg,
        result.aggregated_publish_latency_50pct,
        result.aggregated_publish_latency_95pct,
        result.aggregated_publish_latency_99pct,
        result.aggregated_publish_latency_999pct,
        result.aggregated_publish_latency_max,
        result.aggregated_end_to_end_latency_50pct,
        result.aggregated_end_to_end_latency_99pct
    );
    Ok(result)
}

#[allow(clippy::too_many_arguments)]
fn print_period(
    label: &str,
    publish_rate: f64,
    error_rate: f64,
    consume_rate: f64,
    backlog: i64,
    publish: &Histogram<u64>,
    delay: &Histogram<u64>,
    end_to_end: &Histogram<u64>,
    bytes_per_s: f64,
) {
    let ms = |histogram: &Histogram<u64>, quantile: f64| {
        if histogram.is_empty() {
            0.0
        } else {
            histogram.value_at_quantile(quantile) as f64 / 1e6
        }
    };
    println!(
        "[{label}] Pub rate {publish_rate:.0} msg/s / {:.1} MB/s | Pub err {error_rate:.0} err/s | Cons rate {consume_rate:.0} msg/s | Backlog: {:.1} K | Pub Latency (ms) 50%: {:.1} - 99%: {:.1} - Max: {:.1} | Pub Delay (us) 99%: {:.0} | E2E (ms) 50%: {:.1} - 99%: {:.1}",
        bytes_per_s / 1_048_576.0,
        backlog as f64 / 1000.0,
        ms(publish, 0.5),
        ms(publish, 0.99),
        publish.max() as f64 / 1e6,
        ms(delay, 0.99) * 1000.0,
        ms(end_to_end, 0.5),
        ms(end_to_end, 0.99),
    );
}

/// The maximum-sustainable-rate search (producerRate 0), in the spirit of OMB's RateController:
/// ramp up while publishes keep up with the target and consumers keep up with publishes; on a
/// growing backlog or a publish shortfall fall back below what was achieved and ramp more gently.
fn adjust_rate(context: &StatsContext<'_>, state: &mut LoopState, rate_total: &mut f64, now: Instant) {
    let (since, before) = state.last_control;
    let seconds = now.duration_since(since).as_secs_f64();
    if seconds < 2.5 {
        return;
    }
    let totals = context.registry.totals();
    let subscriptions = u64::from(context.workload.subscriptions_per_topic);
    let published = totals.sent.saturating_sub(before.sent) as f64 / seconds;
    let backlog_before = (before.sent * subscriptions).saturating_sub(before.received) as f64;
    let backlog_now = (totals.sent * subscriptions).saturating_sub(totals.received) as f64;
    let acceptable_backlog = (*rate_total * 0.5).max(1000.0);
    let falling_behind = backlog_now - backlog_before > acceptable_backlog || published < *rate_total * 0.9;
    *rate_total = if falling_behind {
        state.ramp = (state.ramp / 2.0).max(0.05);
        (published.min(*rate_total) * 0.9).max(100.0)
    } else {
        *rate_total * (1.0 + state.ramp)
    };
    let producers = f64::from((context.workload.topics * context.workload.producers_per_topic).max(1));
    context.producer_control.set_rate(*rate_total / producers);
    state.last_control = (now, totals);
}

/// OMB's buildAndDrainBacklog: pause consumers until the backlog holds the requested bytes,
/// resume, wait until it is drained to (1 - backlogDrainRatio), then keep running for the test
/// duration. Every wait is bounded by `timeout_s`.
async fn build_and_drain(workload: &Workload, registry: &Registry, consumers: &Control, timeout_s: u64, duration_s: u64) {
    let subscriptions = u64::from(workload.subscriptions_per_topic);
    let requested_bytes = (workload.consumer_backlog_size_gb * 1024.0 * 1024.0 * 1024.0) as u64;
    let backlog = || {
        let totals = registry.totals();
        (totals.sent * subscriptions).saturating_sub(totals.received)
    };
    let started = Instant::now();
    println!("Stopping all consumers to build backlog");
    consumers.set_paused(true);
    let deadline = started + Duration::from_secs(timeout_s);
    while backlog() * (workload.message_size as u64) < requested_bytes && Instant::now() < deadline && !consumers.stopped() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("--- Completed backlog build in {:.0} s ---", started.elapsed().as_secs_f64());
    let drain_started = Instant::now();
    println!("--- Start draining backlog ---");
    consumers.set_paused(false);
    let capacity = requested_bytes / workload.message_size.max(1) as u64;
    let empty_level = ((1.0 - workload.backlog_drain_ratio) * capacity as f64) as u64;
    let min_backlog = empty_level.max(1000);
    let deadline = drain_started + Duration::from_secs(timeout_s);
    while backlog() > min_backlog && Instant::now() < deadline && !consumers.stopped() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("--- Completed backlog draining in {:.0} s ---", drain_started.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(duration_s)).await;
}

async fn declare(
    url: &AmqpUrl,
    topics: &[String],
    subscriptions: &[(String, String)],
    arguments: &amqp_codec::FieldTable,
) -> Result<String, String> {
    let work = async {
        let options = ConnectionOptions { connection_name: "lepus-bench setup".to_string(), ..ConnectionOptions::default() };
        let mut connection = Connection::open(url, &options).await?;
        connection.channel_open(1).await?;
        for topic in topics {
            connection.exchange_declare(1, topic, "fanout", true).await?;
        }
        for (topic, queue) in subscriptions {
            connection.queue_declare_with_arguments(1, queue, true, false, false, arguments.clone()).await?;
            connection.queue_bind(1, queue, topic, "").await?;
        }
        let product = connection.server_product().to_string();
        connection.close().await?;
        Ok::<_, lepus_client::ClientError>(product)
    };
    work.await.map_err(|error| error.to_string())
}

async fn delete(url: &AmqpUrl, topics: &[String], subscriptions: &[(String, String)]) -> Result<(), String> {
    let work = async {
        let mut connection = Connection::open(url, &ConnectionOptions::default()).await?;
        connection.channel_open(1).await?;
        for (_, queue) in subscriptions {
            connection.queue_delete(1, queue).await?;
        }
        for topic in topics {
            connection.exchange_delete(1, topic).await?;
        }
        connection.close().await
    };
    match tokio::time::timeout(Duration::from_secs(60), work).await {
        Ok(result) => result.map_err(|error| error.to_string()),
        Err(_) => Err("timed out after 60 s".to_string()),
    }
}
