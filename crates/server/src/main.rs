//! `lepus`: the Lepus broker and its tools, one binary with subcommands.

mod auth;
mod broker;
mod config;
mod connection;
mod ctl;
mod disk;
mod introspect;
mod listener;
mod management;
mod metrics;
mod outbound;
mod queue_runtime;

use clap::{Parser, Subcommand};
use config::ServerConfig;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Lepus: an AMQP 0-9-1 message broker that RabbitMQ clients use unchanged.
#[derive(Parser)]
#[command(name = "lepus", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a single-node broker.
    Server(ServerArguments),
    /// Measures throughput and latency of a broker (Artemis-style perf client/producer/consumer).
    #[command(disable_help_flag = true)]
    Perf {
        /// Arguments for `lepus perf` (see `lepus perf --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Operates a running broker through its management HTTP API (status, listings, definitions).
    Ctl(ctl::CtlArguments),
    /// Runs OpenMessaging Benchmark workloads, or `bench report` to chart results.
    #[command(disable_help_flag = true)]
    Bench {
        /// Arguments for `lepus bench` (see `lepus bench --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Parser)]
struct ServerArguments {
    /// Directory for definitions and message logs (created if missing).
    #[arg(long, env = "LEPUS_DATA_DIR", default_value = "lepus-data")]
    data_dir: PathBuf,
    /// AMQP port.
    #[arg(long, env = "LEPUS_AMQP_PORT", default_value_t = 5672)]
    amqp_port: u16,
    /// Address to listen on.
    #[arg(long, env = "LEPUS_BIND", default_value = "0.0.0.0")]
    bind: IpAddr,
    /// Management HTTP API port (RabbitMQ-compatible `/api`; 0 disables it).
    #[arg(long, env = "LEPUS_HTTP_PORT", default_value_t = 15672)]
    http_port: u16,
    /// Prometheus metrics port (`/metrics`; 0 disables it).
    #[arg(long, env = "LEPUS_METRICS_PORT", default_value_t = 15692)]
    metrics_port: u16,
    /// Heartbeat interval proposed to clients, in seconds (0 disables).
    #[arg(long, default_value_t = 60)]
    heartbeat_s: u16,
    /// A queue log segment takes new messages until it holds this many bytes.
    #[arg(long, env = "LEPUS_SEGMENT_BYTES_MAX", default_value_t = storage::queue_log::SEGMENT_BYTES_MAX_DEFAULT)]
    segment_bytes_max: u64,
    /// Publishers are blocked while the data directory's filesystem has less free space than this.
    #[arg(long, env = "LEPUS_DISK_FREE_LIMIT_BYTES", default_value_t = 50_000_000)]
    disk_free_limit_bytes: u64,
    /// When messages are fdatasynced: `always` (before every confirm), `interval` or `never`.
    #[arg(long, env = "LEPUS_SYNC", value_enum, default_value = "always")]
    sync: SyncMode,
    /// With `--sync interval`: milliseconds between fdatasyncs.
    #[arg(long, env = "LEPUS_SYNC_INTERVAL_MS", default_value_t = 200)]
    sync_interval_ms: u64,
}

/// The `--sync` choices (see docs/storage.md for what each promises).
#[derive(Clone, Copy, clap::ValueEnum)]
enum SyncMode {
    /// fdatasync before every confirm, group-committed.
    Always,
    /// Confirm after the write; fdatasync every --sync-interval-ms.
    Interval,
    /// Confirm after the write; never fdatasync.
    Never,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("LEPUS_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Perf { args } => exit_code(lepus_perf::run_perf(args)),
        Command::Bench { args } => exit_code(lepus_perf::run_bench(args)),
        Command::Ctl(arguments) => exit_code(ctl::run(arguments)),
        Command::Server(arguments) => {
            let config = ServerConfig {
                data_dir: arguments.data_dir,
                amqp_port: arguments.amqp_port,
                http_port: arguments.http_port,
                metrics_port: arguments.metrics_port,
                bind_address: arguments.bind,
                heartbeat_interval_s: arguments.heartbeat_s,
                segment_bytes_max: arguments.segment_bytes_max.max(1),
                disk_free_limit_bytes: arguments.disk_free_limit_bytes,
                sync_policy: match arguments.sync {
                    SyncMode::Always => storage::syncer::SyncPolicy::Always,
                    SyncMode::Interval => storage::syncer::SyncPolicy::Interval { interval_ms: arguments.sync_interval_ms },
                    SyncMode::Never => storage::syncer::SyncPolicy::Never,
                },
                ..ServerConfig::default()
            };
            match listener::run(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!(%error, "the broker stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
