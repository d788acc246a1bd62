//! OpenMessaging Benchmark workload files, read unchanged (unknown fields are ignored, as OMB's
//! own reader does).

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// One OMB workload (`workloads/*.yaml` in the OMB repository).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// Name, used in the result file.
    pub name: String,
    /// Number of topics (AMQP: fanout exchanges).
    pub topics: u32,
    /// Partitions per topic; AMQP has none, so only 1 is accepted (as OMB's RabbitMQ driver).
    #[serde(default = "one")]
    pub partitions_per_topic: u32,
    /// NO_KEY, KEY_ROUND_ROBIN or RANDOM_NANO; keys do not route on a fanout exchange.
    #[serde(default = "no_key")]
    pub key_distributor: String,
    /// Message size in bytes.
    pub message_size: usize,
    /// Random payloads instead of the payload file.
    #[serde(default)]
    pub use_randomized_payloads: bool,
    /// Share of random bytes in a randomized payload (the rest are zeros).
    #[serde(default)]
    pub random_bytes_ratio: f64,
    /// How many randomized payloads to cycle through.
    #[serde(default)]
    pub randomized_payload_pool_size: usize,
    /// Payload file (relative to the workload file, then to the working directory).
    #[serde(default)]
    pub payload_file: Option<String>,
    /// Subscriptions per topic (AMQP: one durable queue each, bound to the exchange).
    pub subscriptions_per_topic: u32,
    /// Consumers per subscription (competing consumers on the queue).
    #[serde(default = "one")]
    pub consumer_per_subscription: u32,
    /// Producers per topic.
    pub producers_per_topic: u32,
    /// Total publish rate in msg/s; 0 = find the maximum sustainable rate.
    #[serde(default)]
    pub producer_rate: f64,
    /// Backlog to build with consumers paused, in GiB (OMB: an integer; fractions accepted).
    #[serde(default, rename = "consumerBacklogSizeGB")]
    pub consumer_backlog_size_gb: f64,
    /// Share of the backlog to drain before the drain phase ends.
    #[serde(default = "one_f64")]
    pub backlog_drain_ratio: f64,
    /// Measured minutes.
    pub test_duration_minutes: f64,
    /// Warm-up minutes (OMB's default: 1).
    #[serde(default = "one_f64")]
    pub warmup_duration_minutes: f64,
}

fn one() -> u32 {
    1
}

fn one_f64() -> f64 {
    1.0
}

fn no_key() -> String {
    "NO_KEY".to_string()
}

impl Workload {
    /// Reads and checks a workload file.
    pub fn load(path: &Path) -> Result<Workload, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
        let workload: Workload = serde_yaml::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))?;
        workload.check().map_err(|error| format!("{}: {error}", path.display()))?;
        Ok(workload)
    }

    fn check(&self) -> Result<(), String> {
        if self.partitions_per_topic != 1 {
            // OMB's RabbitMQ driver refuses the same way: a queue has no partitions.
            return Err(format!("partitionsPerTopic {} (AMQP topics have one partition)", self.partitions_per_topic));
        }
        if self.topics == 0 || self.producers_per_topic == 0 && self.subscriptions_per_topic == 0 {
            return Err("nothing to run: no topics, producers or subscriptions".to_string());
        }
        if self.message_size == 0 {
            return Err("messageSize must be at least 1".to_string());
        }
        if self.consumer_backlog_size_gb > 0.0 && self.producer_rate <= 0.0 {
            // OMB: "Cannot probe producer sustainable rate when building backlog".
            return Err("a backlog test needs a fixed producerRate".to_string());
        }
        Ok(())
    }

    /// The payloads to cycle through, each `messageSize` bytes.
    pub fn payloads(&self, workload_path: &Path) -> Vec<Vec<u8>> {
        use rand::{Rng, SeedableRng};
        if self.use_randomized_payloads {
            let mut rng = rand::rngs::StdRng::from_entropy();
            let random_bytes = ((self.message_size as f64) * self.random_bytes_ratio.clamp(0.0, 1.0)) as usize;
            return (0..self.randomized_payload_pool_size.max(1))
                .map(|_| {
                    let mut payload = vec![0u8; self.message_size];
                    rng.fill(&mut payload[..random_bytes]);
                    payload
                })
                .collect();
        }
        if let Some(file) = &self.payload_file {
            let candidates: Vec<PathBuf> =
                [workload_path.parent().map(|dir| dir.join(file)), Some(PathBuf::from(file))].into_iter().flatten().collect();
            for candidate in &candidates {
                if let Ok(mut bytes) = std::fs::read(candidate) {
                    // The file defines the content; messageSize the size, as OMB's payload reader
                    // checks (a mismatch there is an error; here we pad or cut and say so).
                    if bytes.len() != self.message_size {
                        eprintln!(
                            "note: {} has {} bytes, messageSize is {}: using messageSize",
                            candidate.display(),
                            bytes.len(),
                            self.message_size
                        );
                        bytes.resize(self.message_size, 0);
                    }
                    return vec![bytes];
                }
            }
            eprintln!("note: payload file {file} not found: using {} zero bytes", self.message_size);
        }
        vec![vec![0u8; self.message_size]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_omb_workload_unchanged() {
        let text = r#"
name: 1 topic / 1 partition / 1kb
topics: 1
partitionsPerTopic: 1
keyDistributor: "NO_KEY"
messageSize: 1024
payloadFile: "payload/payload-1Kb.data"
subscriptionsPerTopic: 1
consumerPerSubscription: 1
producersPerTopic: 1
producerRate: 50000
consumerBacklogSizeGB: 0
testDurationMinutes: 15
someFutureField: ignored
"#;
        let workload: Workload = serde_yaml::from_str(text).unwrap();
        workload.check().unwrap();
        assert_eq!(workload.message_size, 1024);
        assert_eq!(workload.producer_rate, 50000.0);
        assert_eq!(workload.warmup_duration_minutes, 1.0);
        assert_eq!(workload.backlog_drain_ratio, 1.0);
        let payloads = workload.payloads(Path::new("/nonexistent/w.yaml"));
        assert_eq!(payloads[0].len(), 1024);
    }

    #[test]
    fn randomized_payloads_and_checks() {
        let text = "name: r\ntopics: 1\nmessageSize: 100\nuseRandomizedPayloads: true\nrandomBytesRatio: 0.5\nrandomizedPayloadPoolSize: 3\nsubscriptionsPerTopic: 1\nproducersPerTopic: 1\ntestDurationMinutes: 1\n";
        let workload: Workload = serde_yaml::from_str(text).unwrap();
        let payloads = workload.payloads(Path::new("w.yaml"));
        assert_eq!(payloads.len(), 3);
        assert!(payloads.iter().all(|payload| payload.len() == 100 && payload[50..].iter().all(|&b| b == 0)));
        let bad: Workload = serde_yaml::from_str(&text.replace("topics: 1", "topics: 1\npartitionsPerTopic: 16")).unwrap();
        assert!(bad.check().is_err());
        let backlog: Workload = serde_yaml::from_str(&text.replace("topics: 1", "topics: 1\nconsumerBacklogSizeGB: 1")).unwrap();
        assert!(backlog.check().is_err(), "backlog needs a fixed rate");
    }
}
