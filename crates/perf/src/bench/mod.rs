//! `lepus bench`: OpenMessaging Benchmark workloads on AMQP, and reports that compare results.

pub mod chart;
pub mod html;
pub mod omb;
pub mod result;
pub mod workload;

use clap::Parser;
use lepus_client::AmqpUrl;
use std::path::PathBuf;

/// lepus bench: run OMB workload files against an AMQP 0-9-1 broker.
#[derive(Parser, Debug)]
#[command(name = "lepus bench")]
pub struct BenchCli {
    /// OMB workload files (YAML), run one after the other.
    #[arg(required = true)]
    pub workloads: Vec<PathBuf>,
    /// Broker URL; given several times, producers and consumers are spread over them, round robin.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/", action = clap::ArgAction::Append)]
    pub url: Vec<String>,
    /// The subscription queues' type (classic: no x-queue-type; quorum and stream are durable).
    #[arg(long, value_enum)]
    pub queue_type: Option<crate::cli::QueueType>,
    /// Queue arguments as KEY=VALUE pairs separated by commas (as `lepus perf --queue-args`).
    #[arg(long)]
    pub queue_args: Option<String>,
    /// Folder for the result files (`WORKLOAD-DRIVER-DATE.json`, as OMB names them).
    #[arg(long, default_value = ".")]
    pub output_dir: PathBuf,
    /// Driver name in the results (default: the broker's product, e.g. Lepus or RabbitMQ).
    #[arg(long)]
    pub driver: Option<String>,
    /// Persistent messages (OMB RabbitMQ driver's messagePersistence).
    #[arg(long)]
    pub persistent: bool,
    /// Stats period in seconds (OMB: 10).
    #[arg(long, default_value_t = 10)]
    pub period_s: u64,
    /// Override warmupDurationMinutes, in seconds.
    #[arg(long)]
    pub warmup_s: Option<u64>,
    /// Override testDurationMinutes, in seconds.
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Unconfirmed publishes per producer.
    #[arg(long, default_value_t = 1000)]
    pub max_pending: u32,
    /// Consumer prefetch.
    #[arg(long, default_value_t = 1000)]
    pub prefetch: u16,
    /// Longest the backlog build or drain may take, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub backlog_timeout_s: u64,
    /// Runtime worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// lepus bench report: charts and one HTML page comparing result files.
#[derive(Parser, Debug)]
#[command(name = "lepus bench report")]
pub struct ReportCli {
    /// OMB result files or `lepus perf --json` files.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// Folder for report.html and the SVG charts.
    #[arg(long, default_value = "report")]
    pub output: PathBuf,
    /// Seconds per entry in OMB results' series (OMB: 10; lepus bench: its --period-s).
    #[arg(long, default_value_t = 10.0)]
    pub period_s: f64,
    /// Page title.
    #[arg(long, default_value = "Lepus benchmark report")]
    pub title: String,
}

/// `lepus bench ...`; returns the exit code.
pub fn run(args: Vec<String>) -> i32 {
    if args.first().map(String::as_str) == Some("report") {
        return report(args.into_iter().skip(1).collect());
    }
    let cli = match BenchCli::try_parse_from(std::iter::once("lepus bench".to_string()).chain(args)) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { 2 } else { 0 };
        }
    };
    let urls = match cli.url.iter().map(|text| AmqpUrl::parse(text)).collect::<Result<Vec<_>, _>>() {
        Ok(urls) if !urls.is_empty() => urls,
        Ok(_) => {
            eprintln!("error: --url: at least one broker URL");
            return 1;
        }
        Err(error) => {
            eprintln!("error: {error}");
            return 1;
        }
    };
    let mut queue_arguments = match cli.queue_args.as_deref().map(crate::cli::parse_queue_arguments).transpose() {
        Ok(arguments) => arguments.unwrap_or_default(),
        Err(error) => {
            eprintln!("error: {error}");
            return 1;
        }
    };
    let type_name = match cli.queue_type {
        Some(crate::cli::QueueType::Quorum) => Some("quorum"),
        Some(crate::cli::QueueType::Stream) => Some("stream"),
        _ => None,
    };
    if let Some(name) = type_name {
        queue_arguments.insert("x-queue-type", amqp_codec::FieldValue::LongStr(bytes::Bytes::from_static(name.as_bytes())));
    }
    let options = omb::BenchOptions {
        url: urls[0].clone(),
        more_urls: urls[1..].to_vec(),
        queue_arguments,
        period_s: cli.period_s,
        warmup_s: cli.warmup_s,
        duration_s: cli.duration_s,
        persistent: cli.persistent,
        max_pending: cli.max_pending,
        prefetch: cli.prefetch,
        backlog_timeout_s: cli.backlog_timeout_s,
        driver: cli.driver.clone(),
    };
    let runtime = match crate::runtime(cli.threads) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return 1;
        }
    };
    let mut failed = false;
    for path in &cli.workloads {
        let outcome = workload::Workload::load(path).and_then(|workload| {
            let result = runtime.block_on(omb::run_workload(&workload, path, &options))?;
            write_result(&cli.output_dir, &workload.name, &result)
        });
        match outcome {
            Ok(written) => println!("result: {}", written.display()),
            Err(error) => {
                eprintln!("error: {error}");
                failed = true;
            }
        }
    }
    i32::from(failed)
}

fn write_result(dir: &std::path::Path, workload: &str, result: &result::TestResult) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let safe =
        |text: &str| text.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect::<String>();
    let path = dir.join(format!("{}-{}-{stamp}.json", safe(workload), safe(&result.driver)));
    let text = serde_json::to_string_pretty(result).map_err(|error| error.to_string())?;
    std::fs::write(&path, text + "\n").map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(path)
}

fn report(args: Vec<String>) -> i32 {
    let cli = match ReportCli::try_parse_from(std::iter::once("lepus bench report".to_string()).chain(args)) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { 2 } else { 0 };
        }
    };
    let loaded: Result<Vec<_>, String> = cli.results.iter().map(|path| html::load(path, cli.period_s)).collect();
    match loaded.and_then(|mut loaded| html::write_report(&mut loaded, &cli.output, &cli.title)) {
        Ok(path) => {
            println!("report: {}", path.display());
            0
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}
