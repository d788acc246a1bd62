//! `lepus bench report`: several result files side by side, as SVG charts and one HTML page.
//! Reads OMB result files (ours or OMB's own) and `lepus perf --json` files.

use crate::bench::chart::{line_chart, Series, XAxis};
use crate::bench::result::{Quantiles, TestResult};
use std::fmt::Write as _;
use std::path::Path;

/// One result to show.
pub struct Loaded {
    /// Legend text.
    pub label: String,
    /// The result in OMB's shape.
    pub result: TestResult,
    /// Seconds between two entries of the per-period series.
    pub period_s: f64,
}

/// Reads an OMB result or a `lepus perf --json` report.
pub fn load(path: &Path, omb_period_s: f64) -> Result<Loaded, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))?;
    let stem = path.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
    if value.get("schema").and_then(|schema| schema.as_str()).is_some_and(|schema| schema.starts_with("lepus-perf/")) {
        return Ok(from_perf(&value, stem));
    }
    if value.get("publishRate").is_none() {
        return Err(format!("{}: neither an OMB result nor a lepus perf --json report", path.display()));
    }
    let result: TestResult = serde_json::from_value(value).map_err(|error| format!("{}: not an OMB result: {error}", path.display()))?;
    let label = if result.driver.is_empty() { stem } else { format!("{}: {}", result.driver, result.workload) };
    Ok(Loaded { label, result, period_s: omb_period_s })
}

/// Maps a `lepus perf` report onto OMB's fields (rates per interval, latencies in ms).
fn from_perf(value: &serde_json::Value, stem: String) -> Loaded {
    let number = |value: &serde_json::Value, key: &str| value.get(key).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    let mut result = TestResult::default();
    let intervals: Vec<&serde_json::Value> = value["intervals"]
        .as_array()
        .map(|all| all.iter().filter(|interval| interval["warmup"] != true && interval["draining"] != true).collect())
        .unwrap_or_default();
    for interval in &intervals {
        result.publish_rate.push(number(interval, "sent_per_sec"));
        result.consume_rate.push(number(interval, "received_per_sec"));
        result.publish_latency_99pct.push(number(&interval["send_ack_latency_us"], "p99_us") / 1000.0);
    }
    let summary = &value["summary"];
    let quantiles = |latency: &serde_json::Value| {
        let pairs = [
            (50.0, "p50_us"),
            (90.0, "p90_us"),
            (95.0, "p95_us"),
            (99.0, "p99_us"),
            (99.9, "p99_9_us"),
            (99.99, "p99_99_us"),
            (100.0, "max_us"),
        ];
        Quantiles(
            pairs
                .iter()
                .filter_map(|(percentile, key)| latency.get(key).and_then(serde_json::Value::as_f64).map(|us| (*percentile, us / 1000.0)))
                .collect(),
        )
    };
    // The full distribution when the report has it (lepus perf writes it), else the percentiles.
    let distribution = |key: &str| -> Option<Quantiles> {
        let pairs = summary["latency_distribution_us"][key].as_array()?;
        let pairs: Vec<(f64, f64)> =
            pairs.iter().filter_map(|pair| Some((pair.get(0)?.as_f64()?, pair.get(1)?.as_f64()? / 1000.0))).collect();
        (!pairs.is_empty()).then_some(Quantiles(pairs))
    };
    result.aggregated_publish_latency_quantiles = distribution("send_ack").unwrap_or_else(|| quantiles(&summary["send_ack_latency_us"]));
    result.aggregated_end_to_end_latency_quantiles = distribution("transfer").unwrap_or_else(|| quantiles(&summary["transfer_latency_us"]));
    result.aggregated_publish_latency_50pct = number(&summary["send_ack_latency_us"], "p50_us") / 1000.0;
    result.aggregated_publish_latency_99pct = number(&summary["send_ack_latency_us"], "p99_us") / 1000.0;
    result.aggregated_publish_latency_999pct = number(&summary["send_ack_latency_us"], "p99_9_us") / 1000.0;
    result.aggregated_end_to_end_latency_50pct = number(&summary["transfer_latency_us"], "p50_us") / 1000.0;
    result.aggregated_end_to_end_latency_99pct = number(&summary["transfer_latency_us"], "p99_us") / 1000.0;
    result.driver = value["broker"].as_str().unwrap_or("").to_string();
    result.workload = value["config"]["destination"].as_str().unwrap_or("").to_string();
    let period_s = intervals.first().map_or(1.0, |interval| number(interval, "interval_s").max(0.001));
    Loaded { label: format!("{stem}: {}", result.driver), result, period_s }
}

fn over_time(loaded: &[Loaded], pick: fn(&TestResult) -> &Vec<f64>) -> Vec<Series> {
    loaded
        .iter()
        .map(|one| Series {
            name: one.label.clone(),
            points: pick(&one.result).iter().enumerate().map(|(index, &value)| ((index + 1) as f64 * one.period_s, value)).collect(),
        })
        .collect()
}

fn distribution(loaded: &[Loaded], pick: fn(&TestResult) -> &Quantiles) -> Vec<Series> {
    loaded
        .iter()
        .map(|one| Series {
            name: one.label.clone(),
            points: pick(&one.result).0.iter().filter(|(percentile, _)| *percentile < 100.0).copied().collect(),
        })
        .collect()
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Writes the charts and `report.html` into `output_dir`; returns the HTML path.
pub fn write_report(loaded: &mut [Loaded], output_dir: &Path, title: &str) -> Result<std::path::PathBuf, String> {
    // Two results with one label (the same broker and workload twice) get numbered.
    for index in 1..loaded.len() {
        let label = loaded[index].label.clone();
        if loaded[..index].iter().any(|earlier| earlier.label == label) {
            loaded[index].label = format!("{label} #{}", index + 1);
        }
    }
    let loaded = &*loaded;
    std::fs::create_dir_all(output_dir).map_err(|error| format!("{}: {error}", output_dir.display()))?;
    let charts = [
        ("publish-rate", line_chart("Publish rate", "time (s)", "msg/s", XAxis::Linear, &over_time(loaded, |r| &r.publish_rate))),
        ("consume-rate", line_chart("Consume rate", "time (s)", "msg/s", XAxis::Linear, &over_time(loaded, |r| &r.consume_rate))),
        (
            "publish-latency-p99",
            line_chart("Publish latency p99 over time", "time (s)", "ms", XAxis::Linear, &over_time(loaded, |r| &r.publish_latency_99pct)),
        ),
        (
            "publish-latency-distribution",
            line_chart(
                "Publish latency distribution",
                "percentile",
                "ms",
                XAxis::Percentile,
                &distribution(loaded, |r| &r.aggregated_publish_latency_quantiles),
            ),
        ),
        (
            "end-to-end-latency-distribution",
            line_chart(
                "End-to-end latency distribution",
                "percentile",
                "ms",
                XAxis::Percentile,
                &distribution(loaded, |r| &r.aggregated_end_to_end_latency_quantiles),
            ),
        ),
    ];
    for (name, svg) in &charts {
        let path = output_dir.join(format!("{name}.svg"));
        std::fs::write(&path, svg).map_err(|error| format!("{}: {error}", path.display()))?;
        // PNGs too where librsvg's converter is installed (the SVGs are the source either way).
        let _ = std::process::Command::new("rsvg-convert")
            .arg("-o")
            .arg(output_dir.join(format!("{name}.png")))
            .arg(&path)
            .stderr(std::process::Stdio::null())
            .status();
    }
    let mut html = String::new();
    let _ = writeln!(html, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>");
    html.push_str("<style>body{font-family:sans-serif;max-width:1600px;margin:2em auto;padding:0 1em}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}th:first-child,td:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:12px}.note{color:#555}</style></head><body>\n");
    let _ = writeln!(html, "<h1>{title}</h1>");
    html.push_str("<p class=\"note\">Rates are means over the measured periods; latencies are the aggregated percentiles of the measured run (warm-up excluded). Ratios compare each row with the first.</p>\n<table><tr><th>result</th><th>workload</th><th>publish msg/s</th><th>consume msg/s</th><th>publish p50 ms</th><th>publish p99 ms</th><th>publish p99.9 ms</th><th>end-to-end p50 ms</th><th>end-to-end p99 ms</th></tr>\n");
    let base = loaded
        .first()
        .map(|one| (mean(&one.result.publish_rate), mean(&one.result.consume_rate), one.result.aggregated_publish_latency_99pct));
    for one in loaded {
        let result = &one.result;
        let (publish, consume) = (mean(&result.publish_rate), mean(&result.consume_rate));
        let ratio = |value: f64, base: f64| {
            if base > 0.0 {
                format!(" <small>(x{:.2})</small>", value / base)
            } else {
                String::new()
            }
        };
        let (base_publish, base_consume, base_p99) = base.unwrap_or((0.0, 0.0, 0.0));
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{publish:.0}{}</td><td>{consume:.0}{}</td><td>{:.2}</td><td>{:.2}{}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td></tr>",
            one.label.replace('<', "&lt;"),
            result.workload.replace('<', "&lt;"),
            ratio(publish, base_publish),
            ratio(consume, base_consume),
            result.aggregated_publish_latency_50pct,
            result.aggregated_publish_latency_99pct,
            ratio(result.aggregated_publish_latency_99pct, base_p99),
            result.aggregated_publish_latency_999pct,
            result.aggregated_end_to_end_latency_50pct,
            result.aggregated_end_to_end_latency_99pct,
        );
    }
    html.push_str("</table>\n<div class=\"charts\">\n");
    for (_, svg) in &charts {
        html.push_str(svg);
    }
    html.push_str("</div></body></html>\n");
    let path = output_dir.join("report.html");
    std::fs::write(&path, html).map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(path)
}
