//! The `--hdr` interval log is read by HdrHistogram's Java HistogramLogProcessor, and the
//! percentiles it prints are the ones we recorded. Skipped (with the reason printed) when Java or
//! Maven is missing.

use lepus_perf::report::HdrLog;
use lepus_perf::stats::new_histogram;
use std::process::Command;
use std::time::{Duration, SystemTime};

#[test]
fn java_histogram_log_processor_reads_our_log() {
    let dir = std::env::temp_dir().join(format!("lepus-hdr-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.hdr");
    let log = HdrLog::create(path.clone(), SystemTime::now(), "interop test".to_string()).unwrap();
    // Warm-up: values that must not show up under the plain tag.
    let mut warmup = [new_histogram(), new_histogram(), new_histogram()];
    warmup[0].record(999_000_000).unwrap();
    log.write(Duration::ZERO, Duration::from_secs(1), true, &warmup);
    // Two measured intervals of send-ack: 1..=1000 us and 1001..=2000 us, in nanoseconds.
    for second in 0..2u64 {
        let mut histograms = [new_histogram(), new_histogram(), new_histogram()];
        for value_us in 1..=1000u64 {
            histograms[0].record((second * 1000 + value_us) * 1000).unwrap();
            histograms[1].record(5_000).unwrap();
        }
        log.write(Duration::from_secs(1 + second), Duration::from_secs(1), false, &histograms);
    }
    log.finish().unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hdr_java_interop.sh");
    let output = Command::new("bash").arg(script).arg(&path).arg("send-ack").output().unwrap();
    if output.status.code() == Some(3) {
        println!("skipped: {}", String::from_utf8_lossy(&output.stderr).trim());
        return;
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "HistogramLogProcessor failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    println!("{stdout}");
    // "#[Max     =     2000.127, Total count    =         2000]"
    let total_line = stdout.lines().find(|line| line.contains("Total count")).expect("a totals line");
    let total: u64 = total_line.rsplit('=').next().unwrap().trim().trim_end_matches(']').trim().parse().unwrap();
    assert_eq!(total, 2000, "{total_line}");
    let max: f64 = total_line.split('=').nth(1).unwrap().split(',').next().unwrap().trim().parse().unwrap();
    assert!((max - 2000.0).abs() < 3.0, "max {max} us, expected about 2000 (warm-up excluded)");
    // The median line: value about 1000 us at percentile 0.5.
    let median = stdout
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let value = fields.first()?.parse::<f64>().ok()?;
            let percentile = fields.get(1)?.parse::<f64>().ok()?;
            (percentile >= 0.5).then_some(value)
        })
        .next()
        .expect("a percentile table");
    assert!((median - 1000.0).abs() < 3.0, "median {median} us");
    let _ = std::fs::remove_dir_all(&dir);
}
