//! Counters and latency histograms: each worker records into its own, a reporter harvests them
//! once per interval. Values are nanoseconds; reports show microseconds.

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The largest latency a histogram holds (longer ones are recorded as this): one hour.
pub const LATENCY_NS_MAX: u64 = 3_600_000_000_000;

/// A new latency histogram: 1 ns to one hour, 3 significant digits (0.1% precision).
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts, so this cannot fail.
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid histogram bounds")
}

/// One clock for the whole process: a monotonic origin and the wall-clock time it stood for, so
/// that message timestamps are wall-clock nanoseconds (comparable across processes on one host)
/// while every reading costs only a monotonic clock read.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
    origin_wall_ns: u64,
}

impl Clock {
    /// Reads both clocks now.
    pub fn new() -> Clock {
        let origin = Instant::now();
        let origin_wall_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|since| since.as_nanos() as u64).unwrap_or(0);
        Clock { origin, origin_wall_ns }
    }

    /// Wall-clock nanoseconds since the epoch at `instant`.
    pub fn wall_ns(&self, instant: Instant) -> u64 {
        self.origin_wall_ns + instant.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// Wall-clock nanoseconds since the epoch now.
    pub fn now_wall_ns(&self) -> u64 {
        self.wall_ns(Instant::now())
    }

    /// Monotonic nanoseconds since the origin.
    pub fn mono_ns(&self, instant: Instant) -> u64 {
        instant.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// The instant `ns` monotonic nanoseconds after the origin.
    pub fn instant_at(&self, ns: u64) -> Instant {
        self.origin + Duration::from_nanos(ns)
    }

    /// The origin.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Wall-clock time of the origin.
    pub fn origin_system_time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.origin_wall_ns)
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

/// The three latencies that are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Send to confirm (or to tx.commit-ok).
    SendAck,
    /// Send (intended send time under `--rate`) to delivery, from the timestamp in the body.
    Transfer,
    /// How late a send went out against its schedule (coordinated omission).
    SendDelay,
}

impl Metric {
    /// All of them, in report order.
    pub const ALL: [Metric; 3] = [Metric::SendAck, Metric::Transfer, Metric::SendDelay];

    /// Name in reports and HDR log tags.
    pub fn name(self) -> &'static str {
        match self {
            Metric::SendAck => "send-ack",
            Metric::Transfer => "transfer",
            Metric::SendDelay => "send-delay",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One worker's counters and histograms. Counters are atomics so the reporter reads them without
/// stopping the worker; histograms sit behind a mutex that only the reporter ever contends for.
pub struct WorkerStats {
    /// Messages published.
    pub sent: AtomicU64,
    /// Sends that had to wait for a pending slot (or for a transaction or batch to complete).
    pub blocked: AtomicU64,
    /// Publishes confirmed (or committed).
    pub completed: AtomicU64,
    /// Publishes nacked by the broker.
    pub nacked: AtomicU64,
    /// Messages received.
    pub received: AtomicU64,
    /// Body bytes published.
    pub sent_bytes: AtomicU64,
    /// Body bytes received.
    pub received_bytes: AtomicU64,
    histograms: Mutex<[Histogram<u64>; 3]>,
}

impl WorkerStats {
    /// Zeroed stats.
    pub fn new() -> Arc<WorkerStats> {
        Arc::new(WorkerStats {
            sent: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            nacked: AtomicU64::new(0),
            received: AtomicU64::new(0),
            sent_bytes: AtomicU64::new(0),
            received_bytes: AtomicU64::new(0),
            histograms: Mutex::new([new_histogram(), new_histogram(), new_histogram()]),
        })
    }

    /// Records latencies under one lock: pass a closure that calls `record` as often as needed.
    pub fn record_with(&self, metric: Metric, record: impl FnOnce(&mut Histogram<u64>)) {
        let mut histograms = self.histograms.lock();
        record(&mut histograms[metric.index()]);
    }

    /// Records one latency.
    pub fn record(&self, metric: Metric, value_ns: u64) {
        self.record_with(metric, |histogram| histogram.saturating_record(value_ns.max(1)));
    }

    fn counters(&self) -> Counters {
        Counters {
            sent: self.sent.load(Ordering::Relaxed),
            blocked: self.blocked.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            nacked: self.nacked.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            sent_bytes: self.sent_bytes.load(Ordering::Relaxed),
            received_bytes: self.received_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Totals of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Messages published.
    pub sent: u64,
    /// Sends that waited for a slot.
    pub blocked: u64,
    /// Publishes confirmed.
    pub completed: u64,
    /// Publishes nacked.
    pub nacked: u64,
    /// Messages received.
    pub received: u64,
    /// Body bytes published.
    pub sent_bytes: u64,
    /// Body bytes received.
    pub received_bytes: u64,
}

impl Counters {
    fn add(&mut self, other: Counters) {
        self.sent += other.sent;
        self.blocked += other.blocked;
        self.completed += other.completed;
        self.nacked += other.nacked;
        self.received += other.received;
        self.sent_bytes += other.sent_bytes;
        self.received_bytes += other.received_bytes;
    }

    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            sent: self.sent.saturating_sub(earlier.sent),
            blocked: self.blocked.saturating_sub(earlier.blocked),
            completed: self.completed.saturating_sub(earlier.completed),
            nacked: self.nacked.saturating_sub(earlier.nacked),
            received: self.received.saturating_sub(earlier.received),
            sent_bytes: self.sent_bytes.saturating_sub(earlier.sent_bytes),
            received_bytes: self.received_bytes.saturating_sub(earlier.received_bytes),
        }
    }
}

/// Every worker's stats, for the reporter.
#[derive(Default)]
pub struct Registry {
    workers: Mutex<Vec<Arc<WorkerStats>>>,
}

impl Registry {
    /// Stats for a new worker.
    pub fn worker(&self) -> Arc<WorkerStats> {
        let stats = WorkerStats::new();
        self.workers.lock().push(stats.clone());
        stats
    }

    /// The counters summed over all workers.
    pub fn totals(&self) -> Counters {
        let mut totals = Counters::default();
        for worker in self.workers.lock().iter() {
            totals.add(worker.counters());
        }
        totals
    }

    /// Moves every worker's histograms into `into` (one per metric) and resets them.
    pub fn harvest(&self, into: &mut [Histogram<u64>; 3]) {
        for worker in self.workers.lock().iter() {
            let mut histograms = worker.histograms.lock();
            for (target, source) in into.iter_mut().zip(histograms.iter_mut()) {
                // Same bounds everywhere, so adding cannot fail.
                let _ = target.add(&*source);
                source.reset();
            }
        }
    }
}

/// Percentiles of one histogram in microseconds, with plain names for JSON readers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Number of values.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 95th percentile.
    pub p95_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p99_9_us: f64,
    /// 99.99th percentile.
    pub p99_99_us: f64,
    /// Largest value.
    pub max_us: f64,
}

impl Percentiles {
    /// Reads the percentiles of a nanosecond histogram.
    pub fn of(histogram: &Histogram<u64>) -> Option<Percentiles> {
        if histogram.is_empty() {
            return None;
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Some(Percentiles {
            count: histogram.len(),
            mean_us: histogram.mean() / 1000.0,
            p50_us: us(histogram.value_at_quantile(0.50)),
            p90_us: us(histogram.value_at_quantile(0.90)),
            p95_us: us(histogram.value_at_quantile(0.95)),
            p99_us: us(histogram.value_at_quantile(0.99)),
            p99_9_us: us(histogram.value_at_quantile(0.999)),
            p99_99_us: us(histogram.value_at_quantile(0.9999)),
            max_us: us(histogram.max()),
        })
    }

    /// One line for the console.
    pub fn line(&self) -> String {
        format!(
            "p50 {} | p90 {} | p99 {} | p99.9 {} | p99.99 {} | max {} (us, {} values)",
            fmt_us(self.p50_us),
            fmt_us(self.p90_us),
            fmt_us(self.p99_us),
            fmt_us(self.p99_9_us),
            fmt_us(self.p99_99_us),
            fmt_us(self.max_us),
            self.count
        )
    }
}

fn fmt_us(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harvest_moves_and_resets() {
        let registry = Registry::default();
        let worker = registry.worker();
        for value in 1..=1000u64 {
            worker.record(Metric::SendAck, value * 1000);
        }
        worker.sent.fetch_add(5, Ordering::Relaxed);
        let mut into = [new_histogram(), new_histogram(), new_histogram()];
        registry.harvest(&mut into);
        let percentiles = Percentiles::of(&into[0]).unwrap();
        assert_eq!(percentiles.count, 1000);
        assert!((percentiles.p50_us - 500.0).abs() < 1.0, "{percentiles:?}");
        assert!(Percentiles::of(&into[1]).is_none());
        let mut again = [new_histogram(), new_histogram(), new_histogram()];
        registry.harvest(&mut again);
        assert!(again[0].is_empty());
        assert_eq!(registry.totals().sent, 5);
    }

    #[test]
    fn clock_is_consistent() {
        let clock = Clock::new();
        let now = Instant::now();
        assert!(clock.wall_ns(now) >= clock.origin_wall_ns);
        assert_eq!(clock.instant_at(clock.mono_ns(now)), now);
    }
}
