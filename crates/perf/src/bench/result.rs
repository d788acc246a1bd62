//! OMB's `TestResult`, field for field: names and units exactly as OMB writes them, so its chart
//! script and anything else that reads OMB results read ours. Publish and end-to-end latencies are
//! milliseconds; publish delay is microseconds (whole numbers), as in OMB.

use hdrhistogram::Histogram;
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

/// A percentile -> value map whose keys are written as Java's `Double.toString` writes them
/// ("50.0", "99.9"), in ascending order.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "std::collections::BTreeMap<String, f64>")]
pub struct Quantiles(pub Vec<(f64, f64)>);

impl From<std::collections::BTreeMap<String, f64>> for Quantiles {
    fn from(map: std::collections::BTreeMap<String, f64>) -> Quantiles {
        let mut pairs: Vec<(f64, f64)> =
            map.into_iter().filter_map(|(key, value)| key.parse::<f64>().ok().map(|key| (key, value))).collect();
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        Quantiles(pairs)
    }
}

impl Serialize for Quantiles {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (percentile, value) in &self.0 {
            map.serialize_entry(&java_double(*percentile), value)?;
        }
        map.end()
    }
}

/// Java's `Double.toString` for the values percentiles take (0 to 100).
pub fn java_double(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

/// OMB's result file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[allow(missing_docs)]
pub struct TestResult {
    pub workload: String,
    pub driver: String,
    pub message_size: u64,
    pub topics: u32,
    pub partitions: u32,
    pub producers_per_topic: u32,
    pub consumers_per_topic: u32,

    pub publish_rate: Vec<f64>,
    pub publish_error_rate: Vec<f64>,
    pub consume_rate: Vec<f64>,
    pub backlog: Vec<i64>,

    pub publish_latency_avg: Vec<f64>,
    pub publish_latency_50pct: Vec<f64>,
    pub publish_latency_75pct: Vec<f64>,
    pub publish_latency_95pct: Vec<f64>,
    pub publish_latency_99pct: Vec<f64>,
    pub publish_latency_999pct: Vec<f64>,
    pub publish_latency_9999pct: Vec<f64>,
    pub publish_latency_99999pct: Vec<f64>,
    pub publish_latency_max: Vec<f64>,

    pub publish_delay_latency_avg: Vec<f64>,
    pub publish_delay_latency_50pct: Vec<u64>,
    pub publish_delay_latency_75pct: Vec<u64>,
    pub publish_delay_latency_95pct: Vec<u64>,
    pub publish_delay_latency_99pct: Vec<u64>,
    pub publish_delay_latency_999pct: Vec<u64>,
    pub publish_delay_latency_9999pct: Vec<u64>,
    pub publish_delay_latency_99999pct: Vec<u64>,
    pub publish_delay_latency_max: Vec<u64>,

    pub aggregated_publish_latency_avg: f64,
    pub aggregated_publish_latency_50pct: f64,
    pub aggregated_publish_latency_75pct: f64,
    pub aggregated_publish_latency_95pct: f64,
    pub aggregated_publish_latency_99pct: f64,
    pub aggregated_publish_latency_999pct: f64,
    pub aggregated_publish_latency_9999pct: f64,
    pub aggregated_publish_latency_99999pct: f64,
    pub aggregated_publish_latency_max: f64,

    pub aggregated_publish_delay_latency_avg: f64,
    pub aggregated_publish_delay_latency_50pct: u64,
    pub aggregated_publish_delay_latency_75pct: u64,
    pub aggregated_publish_delay_latency_95pct: u64,
    pub aggregated_publish_delay_latency_99pct: u64,
    pub aggregated_publish_delay_latency_999pct: u64,
    pub aggregated_publish_delay_latency_9999pct: u64,
    pub aggregated_publish_delay_latency_99999pct: u64,
    pub aggregated_publish_delay_latency_max: u64,

    pub aggregated_publish_latency_quantiles: Quantiles,
    pub aggregated_publish_delay_latency_quantiles: Quantiles,

    pub end_to_end_latency_avg: Vec<f64>,
    pub end_to_end_latency_50pct: Vec<f64>,
    pub end_to_end_latency_75pct: Vec<f64>,
    pub end_to_end_latency_95pct: Vec<f64>,
    pub end_to_end_latency_99pct: Vec<f64>,
    pub end_to_end_latency_999pct: Vec<f64>,
    pub end_to_end_latency_9999pct: Vec<f64>,
    pub end_to_end_latency_99999pct: Vec<f64>,
    pub end_to_end_latency_max: Vec<f64>,

    pub aggregated_end_to_end_latency_quantiles: Quantiles,

    pub aggregated_end_to_end_latency_avg: f64,
    pub aggregated_end_to_end_latency_50pct: f64,
    pub aggregated_end_to_end_latency_75pct: f64,
    pub aggregated_end_to_end_latency_95pct: f64,
    pub aggregated_end_to_end_latency_99pct: f64,
    pub aggregated_end_to_end_latency_999pct: f64,
    pub aggregated_end_to_end_latency_9999pct: f64,
    pub aggregated_end_to_end_latency_99999pct: f64,
    pub aggregated_end_to_end_latency_max: f64,
}

const PERCENTILES: [f64; 7] = [50.0, 75.0, 95.0, 99.0, 99.9, 99.99, 99.999];

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn at(histogram: &Histogram<u64>, percentile: f64) -> u64 {
    if histogram.is_empty() {
        0
    } else {
        histogram.value_at_quantile(percentile / 100.0)
    }
}

fn mean(histogram: &Histogram<u64>) -> f64 {
    if histogram.is_empty() {
        0.0
    } else {
        histogram.mean()
    }
}

fn quantiles(histogram: &Histogram<u64>, scale: f64) -> Quantiles {
    if histogram.is_empty() {
        return Quantiles::default();
    }
    // OMB: histogram.percentiles(100), keyed by percentile, valued at the value iterated to.
    let mut pairs: Vec<(f64, f64)> =
        histogram.iter_quantiles(100).map(|step| (step.quantile() * 100.0, step.value_iterated_to() as f64 / scale)).collect();
    pairs.dedup_by(|later, earlier| later.0 == earlier.0);
    Quantiles(pairs)
}

impl TestResult {
    /// Appends one period. Histograms are in nanoseconds: publish (send-ack), publish delay and
    /// end-to-end.
    #[allow(clippy::too_many_arguments)]
    pub fn push_period(
        &mut self,
        publish_rate: f64,
        error_rate: f64,
        consume_rate: f64,
        backlog: i64,
        publish: &Histogram<u64>,
        delay: &Histogram<u64>,
        end_to_end: &Histogram<u64>,
    ) {
        self.publish_rate.push(publish_rate);
        self.publish_error_rate.push(error_rate);
        self.consume_rate.push(consume_rate);
        self.backlog.push(backlog);
        let ms_at = |histogram, percentile| ms(at(histogram, percentile));
        self.publish_latency_avg.push(mean(publish) / 1e6);
        self.publish_latency_50pct.push(ms_at(publish, 50.0));
        self.publish_latency_75pct.push(ms_at(publish, 75.0));
        self.publish_latency_95pct.push(ms_at(publish, 95.0));
        self.publish_latency_99pct.push(ms_at(publish, 99.0));
        self.publish_latency_999pct.push(ms_at(publish, 99.9));
        self.publish_latency_9999pct.push(ms_at(publish, 99.99));
        self.publish_latency_99999pct.push(ms_at(publish, 99.999));
        self.publish_latency_max.push(ms(publish.max()));
        let us_at = |histogram, percentile| at(histogram, percentile) / 1000;
        self.publish_delay_latency_avg.push(mean(delay) / 1e3);
        self.publish_delay_latency_50pct.push(us_at(delay, 50.0));
        self.publish_delay_latency_75pct.push(us_at(delay, 75.0));
        self.publish_delay_latency_95pct.push(us_at(delay, 95.0));
        self.publish_delay_latency_99pct.push(us_at(delay, 99.0));
        self.publish_delay_latency_999pct.push(us_at(delay, 99.9));
        self.publish_delay_latency_9999pct.push(us_at(delay, 99.99));
        self.publish_delay_latency_99999pct.push(us_at(delay, 99.999));
        self.publish_delay_latency_max.push(delay.max() / 1000);
        self.end_to_end_latency_avg.push(mean(end_to_end) / 1e6);
        self.end_to_end_latency_50pct.push(ms_at(end_to_end, 50.0));
        self.end_to_end_latency_75pct.push(ms_at(end_to_end, 75.0));
        self.end_to_end_latency_95pct.push(ms_at(end_to_end, 95.0));
        self.end_to_end_latency_99pct.push(ms_at(end_to_end, 99.0));
        self.end_to_end_latency_999pct.push(ms_at(end_to_end, 99.9));
        self.end_to_end_latency_9999pct.push(ms_at(end_to_end, 99.99));
        self.end_to_end_latency_99999pct.push(ms_at(end_to_end, 99.999));
        self.end_to_end_latency_max.push(ms(end_to_end.max()));
    }

    /// Fills the aggregated fields from the whole measured phase.
    pub fn set_aggregated(&mut self, publish: &Histogram<u64>, delay: &Histogram<u64>, end_to_end: &Histogram<u64>) {
        let p = |histogram, index: usize| ms(at(histogram, PERCENTILES[index]));
        self.aggregated_publish_latency_avg = mean(publish) / 1e6;
        self.aggregated_publish_latency_50pct = p(publish, 0);
        self.aggregated_publish_latency_75pct = p(publish, 1);
        self.aggregated_publish_latency_95pct = p(publish, 2);
        self.aggregated_publish_latency_99pct = p(publish, 3);
        self.aggregated_publish_latency_999pct = p(publish, 4);
        self.aggregated_publish_latency_9999pct = p(publish, 5);
        self.aggregated_publish_latency_99999pct = p(publish, 6);
        self.aggregated_publish_latency_max = ms(publish.max());
        let d = |index: usize| at(delay, PERCENTILES[index]) / 1000;
        self.aggregated_publish_delay_latency_avg = mean(delay) / 1e3;
        self.aggregated_publish_delay_latency_50pct = d(0);
        self.aggregated_publish_delay_latency_75pct = d(1);
        self.aggregated_publish_delay_latency_95pct = d(2);
        self.aggregated_publish_delay_latency_99pct = d(3);
        self.aggregated_publish_delay_latency_999pct = d(4);
        self.aggregated_publish_delay_latency_9999pct = d(5);
        self.aggregated_publish_delay_latency_99999pct = d(6);
        self.aggregated_publish_delay_latency_max = delay.max() / 1000;
        self.aggregated_end_to_end_latency_avg = mean(end_to_end) / 1e6;
        self.aggregated_end_to_end_latency_50pct = p(end_to_end, 0);
        self.aggregated_end_to_end_latency_75pct = p(end_to_end, 1);
        self.aggregated_end_to_end_latency_95pct = p(end_to_end, 2);
        self.aggregated_end_to_end_latency_99pct = p(end_to_end, 3);
        self.aggregated_end_to_end_latency_999pct = p(end_to_end, 4);
        self.aggregated_end_to_end_latency_9999pct = p(end_to_end, 5);
        self.aggregated_end_to_end_latency_99999pct = p(end_to_end, 6);
        self.aggregated_end_to_end_latency_max = ms(end_to_end.max());
        self.aggregated_publish_latency_quantiles = quantiles(publish, 1e6);
        self.aggregated_publish_delay_latency_quantiles = quantiles(delay, 1e3);
        self.aggregated_end_to_end_latency_quantiles = quantiles(end_to_end, 1e6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::new_histogram;

    /// Every field of OMB's TestResult.java, spelled as Jackson writes them.
    const OMB_FIELDS: &str = "workload driver messageSize topics partitions producersPerTopic consumersPerTopic publishRate publishErrorRate consumeRate backlog publishLatencyAvg publishLatency50pct publishLatency75pct publishLatency95pct publishLatency99pct publishLatency999pct publishLatency9999pct publishLatency99999pct publishLatencyMax publishDelayLatencyAvg publishDelayLatency50pct publishDelayLatency75pct publishDelayLatency95pct publishDelayLatency99pct publishDelayLatency999pct publishDelayLatency9999pct publishDelayLatency99999pct publishDelayLatencyMax aggregatedPublishLatencyAvg aggregatedPublishLatency50pct aggregatedPublishLatency75pct aggregatedPublishLatency95pct aggregatedPublishLatency99pct aggregatedPublishLatency999pct aggregatedPublishLatency9999pct aggregatedPublishLatency99999pct aggregatedPublishLatencyMax aggregatedPublishDelayLatencyAvg aggregatedPublishDelayLatency50pct aggregatedPublishDelayLatency75pct aggregatedPublishDelayLatency95pct aggregatedPublishDelayLatency99pct aggregatedPublishDelayLatency999pct aggregatedPublishDelayLatency9999pct aggregatedPublishDelayLatency99999pct aggregatedPublishDelayLatencyMax aggregatedPublishLatencyQuantiles aggregatedPublishDelayLatencyQuantiles endToEndLatencyAvg endToEndLatency50pct endToEndLatency75pct endToEndLatency95pct endToEndLatency99pct endToEndLatency999pct endToEndLatency9999pct endToEndLatency99999pct endToEndLatencyMax aggregatedEndToEndLatencyQuantiles aggregatedEndToEndLatencyAvg aggregatedEndToEndLatency50pct aggregatedEndToEndLatency75pct aggregatedEndToEndLatency95pct aggregatedEndToEndLatency99pct aggregatedEndToEndLatency999pct aggregatedEndToEndLatency9999pct aggregatedEndToEndLatency99999pct aggregatedEndToEndLatencyMax";

    #[test]
    fn field_names_and_units_are_omb_s() {
        let mut publish = new_histogram();
        for value_ms in 1..=100u64 {
            publish.record(value_ms * 1_000_000).unwrap();
        }
        let mut result = TestResult::default();
        result.push_period(10.0, 0.0, 10.0, 0, &publish, &new_histogram(), &publish);
        result.set_aggregated(&publish, &new_histogram(), &publish);
        let json = serde_json::to_value(&result).unwrap();
        let keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        let mut expected: Vec<&str> = OMB_FIELDS.split(' ').collect();
        let mut actual = keys.clone();
        expected.sort_unstable();
        actual.sort_unstable();
        assert_eq!(actual, expected);
        // Milliseconds.
        assert!((result.aggregated_publish_latency_50pct - 50.0).abs() < 0.1);
        let quantiles = &json["aggregatedPublishLatencyQuantiles"];
        assert!(quantiles.get("100.0").is_some(), "{quantiles}");
        let text = serde_json::to_string(&result).unwrap();
        let back: TestResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back.aggregated_publish_latency_quantiles, result.aggregated_publish_latency_quantiles);
    }

    #[test]
    fn java_double_format() {
        assert_eq!(java_double(50.0), "50.0");
        assert_eq!(java_double(99.9), "99.9");
        assert_eq!(java_double(99.609375), "99.609375");
    }
}
