//! Confirm latency: how long a publish waited for its basic.ack, from the end of the socket read
//! that carried it to the ack handed to the connection's writer. Observed once per group of
//! confirms (a channel's confirms of one socket read), weighted by how many it held, so the
//! message path pays one clock read per read, not per message.
//!
//! Delivery latency: from the end of the socket read that carried a publish (stamped on the
//! message, one clock read per read) to the write of its first basic.deliver to a consumer's
//! socket. A connection's writer reads the clock once per write and counts its deliveries into a
//! [`LocalHistogram`], added to the shared one once per write.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bucket bounds in microseconds (the last is +Inf), the fsync histogram's.
pub const LATENCY_BUCKETS_US: [u64; 12] = storage::syncer::FSYNC_LATENCY_BUCKETS_US;

/// Groups of confirms a channel tracks at once; past this, newer groups go unobserved (a channel
/// that far behind is already visible in `rabbitmq_channel_messages_unconfirmed`).
pub const CONFIRM_GROUPS_TRACKED_MAX: usize = 4096;

/// A histogram with fixed buckets, counted with atomics.
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl LatencyHistogram {
    const fn new() -> LatencyHistogram {
        LatencyHistogram {
            buckets: [const { AtomicU64::new(0) }; LATENCY_BUCKETS_US.len()],
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Counts `weight` observations of `elapsed`.
    pub fn observe(&self, elapsed: Duration, weight: u64) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_US.iter().position(|bound| micros <= *bound).unwrap_or(LATENCY_BUCKETS_US.len() - 1);
        self.buckets[bucket].fetch_add(weight, Ordering::Relaxed);
        self.sum_us.fetch_add(micros.saturating_mul(weight), Ordering::Relaxed);
        self.count.fetch_add(weight, Ordering::Relaxed);
    }

    /// The histogram in OpenMetrics text: cumulative buckets in seconds, sum and count.
    pub fn text(&self, name: &str, help: &str) -> String {
        use std::fmt::Write as _;
        let mut text = String::new();
        let _ = writeln!(text, "# HELP {name} {help}");
        let _ = writeln!(text, "# TYPE {name} histogram");
        let mut cumulative = 0u64;
        for (bound_us, bucket) in LATENCY_BUCKETS_US.iter().zip(self.buckets.iter()) {
            cumulative += bucket.load(Ordering::Relaxed);
            let bound = if *bound_us == u64::MAX { "+Inf".to_string() } else { format!("{}", *bound_us as f64 / 1_000_000.0) };
            let _ = writeln!(text, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(text, "{name}_sum {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1_000_000.0);
        let _ = writeln!(text, "{name}_count {}", self.count.load(Ordering::Relaxed));
        text
    }
}

/// Every channel's confirm latencies (one broker per process).
pub static CONFIRM_LATENCY: LatencyHistogram = LatencyHistogram::new();

/// Every connection's delivery latencies (one broker per process).
pub static DELIVERY_LATENCY: LatencyHistogram = LatencyHistogram::new();

/// The latency clock: nanoseconds since the process first read it (never 0, which stamps a message
/// whose publish time is unknown).
pub fn clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let elapsed = EPOCH.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// Observations gathered by one task in plain integers, added to a shared [`LatencyHistogram`] in
/// one go (a few atomic adds per batch instead of three per observation).
#[derive(Debug, Default)]
pub struct LocalHistogram {
    buckets: [u64; LATENCY_BUCKETS_US.len()],
    sum_us: u64,
    count: u64,
}

impl LocalHistogram {
    /// Counts one observation of `elapsed_ns`.
    pub fn observe_ns(&mut self, elapsed_ns: u64) {
        let micros = elapsed_ns / 1000;
        let bucket = LATENCY_BUCKETS_US.iter().position(|bound| micros <= *bound).unwrap_or(LATENCY_BUCKETS_US.len() - 1);
        self.buckets[bucket] += 1;
        self.sum_us = self.sum_us.saturating_add(micros);
        self.count += 1;
    }

    /// Adds what was counted to `shared` and starts again.
    pub fn flush_into(&mut self, shared: &LatencyHistogram) {
        if self.count == 0 {
            return;
        }
        for (bucket, count) in shared.buckets.iter().zip(self.buckets.iter_mut()) {
            if *count > 0 {
                bucket.fetch_add(std::mem::take(count), Ordering::Relaxed);
            }
        }
        shared.sum_us.fetch_add(std::mem::take(&mut self.sum_us), Ordering::Relaxed);
        shared.count.fetch_add(std::mem::take(&mut self.count), Ordering::Relaxed);
    }
}

/// What a connection's writer measures of the deliveries of one write: their publish times, read
/// against one clock reading taken when the first of them is seen.
#[derive(Debug, Default)]
pub struct DeliveryLatencies {
    now_ns: Option<u64>,
    histogram: LocalHistogram,
}

impl DeliveryLatencies {
    /// Counts a first delivery (not a redelivery) of a message published at `published_at_ns`
    /// (0: unknown, not counted).
    pub fn delivered(&mut self, published_at_ns: u64, redelivered: bool) {
        if published_at_ns == 0 || redelivered {
            return;
        }
        let now_ns = *self.now_ns.get_or_insert_with(clock_ns);
        self.histogram.observe_ns(now_ns.saturating_sub(published_at_ns));
    }

    /// After the write: adds the write's deliveries to [`DELIVERY_LATENCY`].
    pub fn written(&mut self) {
        self.now_ns = None;
        self.histogram.flush_into(&DELIVERY_LATENCY);
    }
}

/// A channel's groups of confirms waiting for their group commit: (last delivery tag, how many,
/// when the read that carried them ended), oldest first.
#[derive(Debug, Default)]
pub struct ConfirmGroups {
    waiting: VecDeque<(u64, u64, Instant)>,
}

impl ConfirmGroups {
    /// Notes a group of `count` confirms ending at `last_tag`, handed to the syncer now.
    pub fn started(&mut self, last_tag: u64, count: u64) {
        if self.waiting.len() < CONFIRM_GROUPS_TRACKED_MAX {
            self.waiting.push_back((last_tag, count, Instant::now()));
        }
    }

    /// Observes the groups the confirms up to `confirmed_through` finished.
    pub fn finished(&mut self, confirmed_through: u64) {
        while let Some(&(last_tag, count, started)) = self.waiting.front() {
            if last_tag > confirmed_through {
                break;
            }
            self.waiting.pop_front();
            CONFIRM_LATENCY.observe(started.elapsed(), count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_weighted() {
        let histogram = LatencyHistogram::new();
        histogram.observe(Duration::from_micros(50), 3);
        histogram.observe(Duration::from_millis(3), 1);
        let text = histogram.text("x_seconds", "help");
        assert!(text.contains("x_seconds_bucket{le=\"0.0001\"} 3\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{le=\"0.0025\"} 3\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{le=\"0.005\"} 4\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{le=\"+Inf\"} 4\nx_seconds_sum 0.00315\nx_seconds_count 4\n"), "{text}");
    }

    #[test]
    fn a_local_histogram_adds_up_into_the_shared_one() {
        let shared = LatencyHistogram::new();
        let mut local = LocalHistogram::default();
        local.observe_ns(50_000);
        local.observe_ns(3_000_000);
        local.flush_into(&shared);
        local.flush_into(&shared);
        local.observe_ns(50_000);
        local.flush_into(&shared);
        let text = shared.text("d_seconds", "help");
        assert!(text.contains("d_seconds_bucket{le=\"0.0001\"} 2\n"), "{text}");
        assert!(text.contains("d_seconds_bucket{le=\"+Inf\"} 3\nd_seconds_sum 0.0031\nd_seconds_count 3\n"), "{text}");
    }

    #[test]
    fn redeliveries_and_unknown_publish_times_are_not_delivery_latencies() {
        let mut latencies = DeliveryLatencies::default();
        latencies.delivered(0, false);
        latencies.delivered(clock_ns(), true);
        assert_eq!(latencies.histogram.count, 0);
        latencies.delivered(clock_ns(), false);
        assert_eq!(latencies.histogram.count, 1);
    }

    #[test]
    fn a_group_is_observed_once_all_its_confirms_are_sent() {
        let mut groups = ConfirmGroups::default();
        groups.started(5, 5);
        groups.started(9, 4);
        let before = CONFIRM_LATENCY.count.load(Ordering::Relaxed);
        groups.finished(7);
        let after_first = CONFIRM_LATENCY.count.load(Ordering::Relaxed);
        groups.finished(9);
        let after_both = CONFIRM_LATENCY.count.load(Ordering::Relaxed);
        // Other tests of this process may observe too: at least our weights arrived.
        assert!(after_first - before >= 5 && after_both - after_first >= 4);
        assert!(groups.waiting.is_empty());
    }
}
