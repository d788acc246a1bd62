//! `lepus perf` against a real broker: Lepus from `LEPUS_BIN`, and RabbitMQ from
//! `LEPUS_PERF_RABBITMQ_URL` (e.g. amqp://guest:guest@127.0.0.1:5672/).
//!
//! A test whose broker is not named fails rather than pass without running: set the variable, or
//! set it to `none` to skip that test on purpose (scripts/test.sh sets `LEPUS_PERF_RABBITMQ_URL=none`
//! for the workspace run and runs the RabbitMQ test in its reference run).

mod common;

use common::{mode, Broker};
use lepus_perf::run::run;
use std::time::Duration;

/// The value that skips a broker test deliberately.
const OPT_OUT: &str = "none";

/// The RabbitMQ URL from `LEPUS_PERF_RABBITMQ_URL`; `None` when it is `none`. Panics when unset.
fn rabbitmq_url() -> Option<String> {
    match std::env::var("LEPUS_PERF_RABBITMQ_URL") {
        Ok(url) if url == OPT_OUT => {
            println!("skipped on purpose: LEPUS_PERF_RABBITMQ_URL=none");
            None
        }
        Ok(url) => Some(url),
        Err(_) => panic!(
            "LEPUS_PERF_RABBITMQ_URL is not set: set it to a RabbitMQ AMQP URL (scripts/rabbitmq-reference.sh does), or to none to skip this test"
        ),
    }
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

async fn queue_round_trip(url: &str) {
    let json = std::env::temp_dir().join(format!("{}.json", unique("perf")));
    let destination = format!("queue://{}", unique("lepus-perf-test"));
    let outcome = run(mode(&[
        "client",
        "--url",
        url,
        "--message-count",
        "3000",
        "--max-pending",
        "50",
        "--persistent",
        "--show-latency",
        "--json",
        json.to_str().unwrap(),
        &destination,
    ]))
    .await
    .unwrap();
    let summary = &outcome.summary;
    assert_eq!(outcome.exit_code, 0, "{:?}", summary.error);
    assert_eq!((summary.sent, summary.completed, summary.received), (3000, 3000, 3000));
    assert_eq!(summary.latencies.send_ack_latency_us.unwrap().count, 3000);
    assert_eq!(summary.latencies.transfer_latency_us.unwrap().count, 3000);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["schema"], "lepus-perf/1");
    assert_eq!(report["summary"]["received"], 3000);
    assert!(report["summary"]["transfer_latency_us"]["p99_us"].as_f64().unwrap() > 0.0);
    assert!(report["intervals"].as_array().is_some());
    // Producers and consumers ran here: the run says whether consumers kept up while measuring.
    let sustained = &report["summary"]["sustained"];
    assert!(sustained["kept_up"].is_boolean() && sustained["received_percent"].as_f64().is_some(), "{sustained}");
    let _ = std::fs::remove_file(json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lepus_queue_round_trip() {
    let Some(broker) = Broker::start() else {
        return;
    };
    queue_round_trip(&broker.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_queue_round_trip() {
    let Some(url) = rabbitmq_url() else {
        return;
    };
    queue_round_trip(&url).await;
}

/// `--queue-type quorum` with `--queue-args`, and two `--url`s (the same broker twice: producers and
/// consumers alternate between them), as a cluster's nodes would be given.
async fn quorum_round_trip(url: &str) {
    let json = std::env::temp_dir().join(format!("{}.json", unique("perf-quorum")));
    let destination = format!("queue://{}", unique("lepus-perf-quorum"));
    let outcome = run(mode(&[
        "client",
        "--url",
        url,
        "--url",
        url,
        "--queue-type",
        "quorum",
        "--queue-args",
        "x-max-length=100000",
        "--producers",
        "2",
        "--consumers",
        "2",
        "--message-count",
        "1000",
        "--persistent",
        "--json",
        json.to_str().unwrap(),
        &destination,
    ]))
    .await
    .unwrap();
    let summary = &outcome.summary;
    assert_eq!(outcome.exit_code, 0, "{:?}", summary.error);
    assert_eq!((summary.sent, summary.completed, summary.received), (2000, 2000, 2000));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["config"]["queue_type"], "quorum");
    assert_eq!(report["config"]["urls"].as_array().map(Vec::len), Some(2));
    let _ = std::fs::remove_file(json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lepus_quorum_round_trip() {
    let Some(broker) = Broker::start() else {
        return;
    };
    quorum_round_trip(&broker.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_quorum_round_trip() {
    let Some(url) = rabbitmq_url() else {
        return;
    };
    quorum_round_trip(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_topics_fan_out_to_every_subscriber() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let destination = format!("topic://{}", unique("topic"));
    let outcome = run(mode(&[
        "client",
        "--url",
        &broker.url,
        "--message-count",
        "500",
        "--producers",
        "2",
        "--consumers",
        "3",
        "--num-destinations",
        "2",
        "--durable",
        "--persistent",
        &destination,
    ]))
    .await
    .unwrap();
    let summary = &outcome.summary;
    assert_eq!(outcome.exit_code, 0, "{:?}", summary.error);
    // 2 destinations x 2 producers x 500, each message to 3 subscriptions.
    assert_eq!(summary.sent, 2000);
    assert_eq!(summary.received, 6000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_batches_and_rate() {
    let Some(broker) = Broker::start() else {
        return;
    };
    for extra in [
        vec!["--tx-size", "7", "--message-count", "100"],
        vec!["--batch-size", "1-10", "--ack-every", "1-10", "--message-count", "300"],
        vec!["--rate", "500", "--duration", "2", "--show-latency"],
    ] {
        let destination = format!("queue://{}", unique("modes"));
        let mut args = vec!["client", "--url", &broker.url, &destination];
        args.extend(extra.iter().copied());
        let outcome = run(mode(&args)).await.unwrap();
        let summary = &outcome.summary;
        assert_eq!(outcome.exit_code, 0, "{extra:?}: {:?}", summary.error);
        assert!(summary.sent > 0, "{extra:?}");
        assert_eq!(summary.completed, summary.sent, "{extra:?}");
        assert_eq!(summary.received, summary.sent, "{extra:?}");
        if extra.contains(&"--rate") {
            assert!(summary.latencies.send_delay_us.is_some());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_consumer_run_apart() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let destination = format!("queue://{}", unique("split"));
    let produced = run(mode(&["producer", "--url", &broker.url, "--message-count", "700", &destination])).await.unwrap();
    assert_eq!(produced.summary.completed, 700);
    // Consumers start late: the backlog waits in the queue.
    let consumed = run(mode(&["consumer", "--url", &broker.url, "--message-count", "700", "--cleanup", &destination])).await.unwrap();
    assert_eq!(consumed.exit_code, 0, "{:?}", consumed.summary.error);
    assert_eq!(consumed.summary.received, 700);
    assert!(consumed.summary.latencies.transfer_latency_us.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_errors() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let error = run(mode(&["client", "--url", "http://nowhere", "--duration", "1"])).await.err().unwrap();
    assert!(error.contains("invalid AMQP URL"), "{error}");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let refused = format!("amqp://guest:guest@127.0.0.1:{port}/");
    let error = run(mode(&["client", "--url", &refused, "--duration", "1"])).await.err().unwrap();
    assert!(error.contains("cannot connect to 127.0.0.1"), "{error}");
    let bad_login = broker.url.replace("guest:guest", "guest:wrong");
    let error = run(mode(&["client", "--url", &bad_login, "--duration", "1"])).await.err().unwrap();
    assert!(error.contains("refused the credentials"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_going_away_ends_with_a_summary_and_failure() {
    let Some(mut broker) = Broker::start() else {
        return;
    };
    let url = broker.url.clone();
    let destination = format!("queue://{}", unique("gone"));
    let running =
        tokio::spawn(async move { run(mode(&["client", "--url", &url, "--duration", "20", "--rate", "2000", &destination])).await });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    broker.kill();
    let outcome = tokio::time::timeout(Duration::from_secs(30), running).await.unwrap().unwrap().unwrap();
    assert_eq!(outcome.exit_code, 1);
    let error = outcome.summary.error.clone().unwrap();
    assert!(error.contains("went away") || error.contains("connection lost"), "{error}");
    assert!(outcome.summary.sent > 1000, "what was measured is kept: {}", outcome.summary.sent);
}
