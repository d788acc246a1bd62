//! `lepus bench` runs an OMB workload against Lepus (from `LEPUS_BIN`) through all of OMB's
//! phases, backlog build and drain included, and writes OMB's result format.

mod common;

use lepus_client::AmqpUrl;
use lepus_perf::bench::omb::{run_workload, BenchOptions};
use lepus_perf::bench::workload::Workload;
use std::path::Path;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn omb_workload_with_backlog_build_and_drain() {
    let Some(broker) = common::Broker::start() else { return };
    let yaml = "name: test backlog\ntopics: 1\npartitionsPerTopic: 1\nmessageSize: 1024\nsubscriptionsPerTopic: 2\nconsumerPerSubscription: 1\nproducersPerTopic: 1\nproducerRate: 3000\nconsumerBacklogSizeGB: 0.002\nbacklogDrainRatio: 1.0\ntestDurationMinutes: 1\nwarmupDurationMinutes: 1\n";
    let workload: Workload = serde_yaml::from_str(yaml).unwrap();
    let options = BenchOptions {
        url: AmqpUrl::parse(&broker.url).unwrap(),
        more_urls: Vec::new(),
        queue_arguments: Default::default(),
        period_s: 1,
        warmup_s: Some(1),
        duration_s: Some(2),
        persistent: true,
        max_pending: 1000,
        prefetch: 100,
        backlog_timeout_s: 60,
        driver: None,
    };
    let result = run_workload(&workload, Path::new("test.yaml"), &options).await.unwrap();
    assert_eq!(result.driver, "Lepus");
    assert_eq!(result.workload, "test backlog");
    assert!(result.publish_rate.len() >= 2, "{:?}", result.publish_rate);
    // 2 MiB of 1 KiB messages were held back, then drained.
    let peak = result.backlog.iter().copied().max().unwrap();
    assert!(peak >= 2048, "backlog peaked at {peak}: {:?}", result.backlog);
    assert!(*result.backlog.last().unwrap() < peak);
    assert!(result.aggregated_publish_latency_99pct > 0.0);
    assert!(result.aggregated_end_to_end_latency_50pct > 0.0);
    let json = serde_json::to_value(&result).unwrap();
    assert!(json["aggregatedEndToEndLatencyQuantiles"].as_object().is_some_and(|map| map.len() > 10));
}
