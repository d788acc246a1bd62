//! Per-interval lines, the summary, the JSON file and the HdrHistogram interval log.

use crate::stats::{Counters, Metric, Percentiles};
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

/// Version of the JSON layout below; bumped on any incompatible change.
pub const JSON_SCHEMA: &str = "lepus-perf/1";

/// Latencies of one interval or of the whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latencies {
    /// Send to confirm (or commit-ok); `null` when nothing was confirmed.
    pub send_ack_latency_us: Option<Percentiles>,
    /// Send to delivery (end to end); `null` when nothing was received.
    pub transfer_latency_us: Option<Percentiles>,
    /// Lateness of sends against the `--rate` schedule; `null` when all-out.
    pub send_delay_us: Option<Percentiles>,
}

impl Latencies {
    /// Reads the three histograms (indexed as [`Metric::ALL`]).
    pub fn of(histograms: &[Histogram<u64>; 3]) -> Latencies {
        Latencies {
            send_ack_latency_us: Percentiles::of(&histograms[0]),
            transfer_latency_us: Percentiles::of(&histograms[1]),
            send_delay_us: Percentiles::of(&histograms[2]),
        }
    }
}

/// One reporting interval (normally one second).
#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    /// Seconds from the start of the load to the end of this interval.
    pub elapsed_s: f64,
    /// Length of this interval in seconds.
    pub interval_s: f64,
    /// Whether this interval belongs to the warm-up.
    pub warmup: bool,
    /// Whether producers had stopped and consumers were draining what was sent.
    pub draining: bool,
    /// Messages published per second.
    pub sent_per_sec: f64,
    /// Sends that waited for a pending slot, per second.
    pub blocked_per_sec: f64,
    /// Publishes confirmed per second.
    pub completed_per_sec: f64,
    /// Publishes nacked per second.
    pub nacked_per_sec: f64,
    /// Messages received per second.
    pub received_per_sec: f64,
    /// Latencies of this interval.
    #[serde(flatten)]
    pub latencies: Latencies,
}

impl Interval {
    /// Builds an interval from counter deltas.
    pub fn new(elapsed_s: f64, interval_s: f64, warmup: bool, delta: &Counters, latencies: Latencies) -> Interval {
        let rate = |count: u64| {
            if interval_s > 0.0 {
                count as f64 / interval_s
            } else {
                0.0
            }
        };
        Interval {
            elapsed_s,
            interval_s,
            warmup,
            draining: false,
            sent_per_sec: rate(delta.sent),
            blocked_per_sec: rate(delta.blocked),
            completed_per_sec: rate(delta.completed),
            nacked_per_sec: rate(delta.nacked),
            received_per_sec: rate(delta.received),
            latencies,
        }
    }

    /// The console line(s).
    pub fn print(&self, show_latency: bool) {
        println!(
            "[{:>6.1} s{}] sent {:>9.0}/s | blocked {:>8.0}/s | completed {:>9.0}/s | received {:>9.0}/s{}",
            self.elapsed_s,
            if self.warmup {
                " warm-up"
            } else if self.draining {
                " drain"
            } else {
                ""
            },
            self.sent_per_sec,
            self.blocked_per_sec,
            self.completed_per_sec,
            self.received_per_sec,
            if self.nacked_per_sec > 0.0 { format!(" | NACKED {:.0}/s", self.nacked_per_sec) } else { String::new() }
        );
        if show_latency {
            print_latencies(&self.latencies, "    ");
        }
    }
}

fn print_latencies(latencies: &Latencies, indent: &str) {
    for (name, value) in [
        ("send-ack  ", &latencies.send_ack_latency_us),
        ("transfer  ", &latencies.transfer_latency_us),
        ("send-delay", &latencies.send_delay_us),
    ] {
        if let Some(percentiles) = value {
            println!("{indent}{name} {}", percentiles.line());
        }
    }
}

/// Totals and rates over the measured period (warm-up excluded).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Seconds measured (after the warm-up).
    pub measured_s: f64,
    /// Messages published.
    pub sent: u64,
    /// Sends that waited for a pending slot.
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
    /// `sent / measured_s`.
    pub sent_per_sec: f64,
    /// `completed / measured_s`.
    pub completed_per_sec: f64,
    /// `received / measured_s`.
    pub received_per_sec: f64,
    /// `sent_bytes / measured_s`.
    pub sent_bytes_per_sec: f64,
    /// Aggregated latencies of the measured period.
    #[serde(flatten)]
    pub latencies: Latencies,
    /// The measured latency distributions as `[percentile, microseconds]` pairs (HdrHistogram's
    /// percentile iteration, 5 steps per halving), for charts: `send_ack`, `transfer`, `send_delay`.
    pub latency_distribution_us: Distributions,
    /// Whether Ctrl-C ended the run.
    pub interrupted: bool,
    /// What ended the run early, if anything failed.
    pub error: Option<String>,
    /// Whether the rate was sustainable (client mode: producers and consumers in this process);
    /// `null` otherwise.
    pub sustained: Option<Sustained>,
}

/// Whether what was sent over the measured period was also received in it, promptly: a rate the
/// broker can hold, as opposed to one it accepts while its queue grows. `received_per_sec`
/// counts the drain after the measured period too, so on its own it overstates what consumers
/// kept up with.
#[derive(Debug, Clone, Serialize)]
pub struct Sustained {
    /// Messages sent over the measured period, times the fan-out (what consumers should receive).
    pub expected: u64,
    /// Messages received over the measured period itself (not in the drain after it).
    pub received_while_measuring: u64,
    /// `received_while_measuring / expected`, in percent.
    pub received_percent: f64,
    /// Whether consumers kept up: they received at least [`KEPT_UP_PERCENT_MIN`] % of it.
    pub kept_up: bool,
    /// The bound on the end-to-end (transfer) p99, in milliseconds.
    pub transfer_p99_ms_max: f64,
    /// Whether the rate was sustained: kept up, and the transfer p99 within the bound.
    pub sustained: bool,
    /// The received rate while measuring, when sustained (the figure to quote), else `null`.
    pub sustainable_per_sec: Option<f64>,
}

/// The share of the expected messages consumers must receive over the measured period to have
/// kept up. Messages in flight at its end (the producers' unconfirmed window, the consumers'
/// prefetch) are not received yet; at the rates measured here they are far below 1 %.
pub const KEPT_UP_PERCENT_MIN: f64 = 99.0;

impl Sustained {
    /// Judges a run from what it sent and received while measuring and its transfer p99.
    pub fn judge(
        expected: u64,
        received_while_measuring: u64,
        measured_s: f64,
        transfer_p99_us: Option<f64>,
        transfer_p99_ms_max: f64,
    ) -> Sustained {
        let received_percent = if expected == 0 { 0.0 } else { received_while_measuring as f64 * 100.0 / expected as f64 };
        let kept_up = expected > 0 && received_percent >= KEPT_UP_PERCENT_MIN;
        let prompt = transfer_p99_us.is_some_and(|p99_us| p99_us <= transfer_p99_ms_max * 1000.0);
        let sustained = kept_up && prompt;
        let sustainable_per_sec = (sustained && measured_s > 0.0).then(|| received_while_measuring as f64 / measured_s);
        Sustained { expected, received_while_measuring, received_percent, kept_up, transfer_p99_ms_max, sustained, sustainable_per_sec }
    }

    /// The console line.
    pub fn line(&self, transfer_p99_us: Option<f64>) -> String {
        let p99 = transfer_p99_us.map_or("none".to_string(), |p99_us| format!("{:.2} ms", p99_us / 1000.0));
        let verdict = match self.sustainable_per_sec {
            Some(rate) => format!("SUSTAINED: {rate:.0} msg/s"),
            None => "NOT SUSTAINED".to_string(),
        };
        format!(
            "{verdict} | kept up: {} (received {:.2} % of {} sent while measuring) | transfer p99 {p99} (bound {} ms)",
            if self.kept_up { "yes" } else { "no" },
            self.received_percent,
            self.expected,
            self.transfer_p99_ms_max
        )
    }
}

impl Summary {
    /// Builds the summary from measured counters.
    pub fn new(measured_s: f64, counters: &Counters, latencies: Latencies, interrupted: bool, error: Option<String>) -> Summary {
        let rate = |count: u64| {
            if measured_s > 0.0 {
                count as f64 / measured_s
            } else {
                0.0
            }
        };
        Summary {
            measured_s,
            sent: counters.sent,
            blocked: counters.blocked,
            completed: counters.completed,
            nacked: counters.nacked,
            received: counters.received,
            sent_bytes: counters.sent_bytes,
            received_bytes: counters.received_bytes,
            sent_per_sec: rate(counters.sent),
            completed_per_sec: rate(counters.completed),
            received_per_sec: rate(counters.received),
            sent_bytes_per_sec: rate(counters.sent_bytes),
            latencies,
            latency_distribution_us: Distributions::default(),
            interrupted,
            error,
            sustained: None,
        }
    }

    /// The console block.
    pub fn print(&self) {
        println!("--- SUMMARY ({:.1} s measured, warm-up excluded) ---", self.measured_s);
        println!(
            "sent {} ({:.0} msg/s, {:.1} MiB/s) | completed {} ({:.0} msg/s) | received {} ({:.0} msg/s) | blocked {} | nacked {}",
            self.sent,
            self.sent_per_sec,
            self.sent_bytes_per_sec / 1_048_576.0,
            self.completed,
            self.completed_per_sec,
            self.received,
            self.received_per_sec,
            self.blocked,
            self.nacked
        );
        print_latencies(&self.latencies, "");
        if let Some(sustained) = &self.sustained {
            println!("{}", sustained.line(self.latencies.transfer_latency_us.as_ref().map(|transfer| transfer.p99_us)));
        }
        if self.interrupted {
            println!("interrupted by Ctrl-C");
        }
        if let Some(error) = &self.error {
            println!("ERROR: {error}");
        }
    }
}

/// Latency distributions of the measured period.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Distributions {
    /// Send to confirm.
    pub send_ack: Vec<[f64; 2]>,
    /// Send to delivery.
    pub transfer: Vec<[f64; 2]>,
    /// Lateness against the schedule.
    pub send_delay: Vec<[f64; 2]>,
}

impl Distributions {
    /// Reads the three histograms (indexed as [`Metric::ALL`]).
    pub fn of(histograms: &[Histogram<u64>; 3]) -> Distributions {
        let steps = |histogram: &Histogram<u64>| -> Vec<[f64; 2]> {
            if histogram.is_empty() {
                return Vec::new();
            }
            let mut pairs: Vec<[f64; 2]> =
                histogram.iter_quantiles(5).map(|step| [step.quantile() * 100.0, step.value_iterated_to() as f64 / 1000.0]).collect();
            pairs.dedup_by(|later, earlier| later[0] == earlier[0]);
            pairs
        };
        Distributions { send_ack: steps(&histograms[0]), transfer: steps(&histograms[1]), send_delay: steps(&histograms[2]) }
    }
}

/// The whole JSON document written by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`JSON_SCHEMA`].
    pub schema: &'static str,
    /// `client`, `producer` or `consumer`.
    pub mode: String,
    /// The broker's `product` and `version` server properties.
    pub broker: String,
    /// Milliseconds since the epoch when the load started.
    pub started_at_unix_ms: u64,
    /// The options, as run.
    pub config: serde_json::Value,
    /// One entry per interval, warm-up included (flagged).
    pub intervals: Vec<Interval>,
    /// Totals and aggregated latencies.
    pub summary: Option<Summary>,
}

/// Writes the report, creating parent folders.
pub fn write_json(path: &Path, report: &Report) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(path, text + "\n")
}

/// One histogram on its way to the log file.
struct LogEntry {
    tag: String,
    start: Duration,
    length: Duration,
    histogram: Histogram<u64>,
}

/// An HdrHistogram interval log written by a thread of its own (compression is not free, and
/// the writer's borrows are easiest to keep on one stack).
pub struct HdrLog {
    sender: Option<mpsc::SyncSender<LogEntry>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl HdrLog {
    /// Creates `path` and writes the header. Times in the log are seconds since `base_time`;
    /// values are nanoseconds (Java's HistogramLogProcessor: `-outputValueUnitRatio 1000` for
    /// microseconds).
    pub fn create(path: PathBuf, base_time: SystemTime, comment: String) -> std::io::Result<HdrLog> {
        if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = std::io::BufWriter::new(std::fs::File::create(&path)?);
        // Bounded: a slow disk slows the reporter, never grows memory.
        let (sender, receiver) = mpsc::sync_channel::<LogEntry>(64);
        let thread = std::thread::spawn(move || -> std::io::Result<()> {
            let mut serializer = V2DeflateSerializer::new();
            {
                let mut writer = IntervalLogWriterBuilder::new()
                    .add_comment(&comment)
                    .add_comment("Values in nanoseconds. Tags: send-ack, transfer, send-delay; warm-up intervals carry a warmup- prefix.")
                    .with_start_time(base_time)
                    .with_base_time(base_time)
                    .with_max_value_divisor(1_000_000.0)
                    .begin_log_with(&mut file, &mut serializer)?;
                writer.write_comment("\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"")?;
                for entry in receiver {
                    writer
                        .write_histogram(&entry.histogram, entry.start, entry.length, Tag::new(&entry.tag))
                        .map_err(|error| std::io::Error::other(error.to_string()))?;
                }
            }
            file.flush()
        });
        Ok(HdrLog { sender: Some(sender), thread: Some(thread) })
    }

    /// Queues one interval's histograms (empty ones are skipped).
    pub fn write(&self, start: Duration, length: Duration, warmup: bool, histograms: &[Histogram<u64>; 3]) {
        let Some(sender) = &self.sender else { return };
        for (metric, histogram) in Metric::ALL.iter().zip(histograms.iter()) {
            if histogram.is_empty() {
                continue;
            }
            let tag = if warmup { format!("warmup-{}", metric.name()) } else { metric.name().to_string() };
            let _ = sender.send(LogEntry { tag, start, length, histogram: histogram.clone() });
        }
    }

    /// Flushes and closes the file.
    pub fn finish(mut self) -> std::io::Result<()> {
        self.sender.take();
        match self.thread.take().map(|thread| thread.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(std::io::Error::other("the HDR log writer panicked")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_sustained_when_consumers_kept_up_and_the_transfer_p99_is_within_the_bound() {
        let sustained = Sustained::judge(100_000, 99_950, 10.0, Some(2_500.0), 10.0);
        assert!(sustained.kept_up && sustained.sustained);
        assert_eq!(sustained.sustainable_per_sec, Some(9_995.0));
        assert!(sustained.line(Some(2_500.0)).starts_with("SUSTAINED: 9995 msg/s | kept up: yes"));
    }

    #[test]
    fn a_growing_backlog_or_a_slow_p99_is_not_sustained() {
        let behind = Sustained::judge(100_000, 60_000, 10.0, Some(2_500.0), 10.0);
        assert!(!behind.kept_up && !behind.sustained && behind.sustainable_per_sec.is_none());
        assert!(behind.line(Some(2_500.0)).starts_with("NOT SUSTAINED | kept up: no (received 60.00 %"));
        let slow = Sustained::judge(100_000, 100_000, 10.0, Some(25_000.0), 10.0);
        assert!(slow.kept_up && !slow.sustained);
        let nothing_received = Sustained::judge(100_000, 100_000, 10.0, None, 10.0);
        assert!(!nothing_received.sustained);
        assert!(!Sustained::judge(0, 0, 10.0, None, 10.0).kept_up);
    }
}
