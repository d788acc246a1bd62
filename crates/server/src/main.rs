//! `lepus`: the Lepus broker and its tools, one binary with subcommands.

mod alarms;
mod auth;
mod broker;
mod cluster;
mod config;
mod connection;
mod ctl;
mod dead_letter;
mod dedup;
mod delayed;
mod direct_reply;
mod introspect;
mod listener;
mod login_throttle;
mod management;
mod metrics;
mod operator_messages;
mod policy;
mod queue_expiry;
mod queue_runtime;
mod queue_type;
mod quorum;
mod recovery_walker;
mod settings;
mod shared;
mod stream;
mod stream_protocol;
mod tls;
mod topic_permissions;
mod url_path;
mod vhost_limits;
mod write_hold;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Lepus: an AMQP 0-9-1 message broker that RabbitMQ clients use unchanged.
#[derive(Parser)]
#[command(name = "lepus", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as plain text, or as one JSON object per line for log shippers.
    #[arg(long, global = true, env = "LEPUS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines, coloured only on a terminal.
    Text,
    /// One JSON object per line: timestamp, level, target, message and fields.
    Json,
}

/// Starts logging to stderr, filtered by `LEPUS_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEPUS_LOG").unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        // Colour codes only help a terminal; in a file or a journal they are noise.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        // Fields flattened beside "message", so a shipper indexes them without nesting.
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).init(),
    }
}

// Parsed once at start and dropped: the size of the server's settings costs nothing here.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Runs a single-node broker.
    Server(settings::ServerArguments),
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

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    init_logging(cli.log_format);
    match cli.command {
        Command::Perf { args } => exit_code(lepus_perf::run_perf(args)),
        Command::Bench { args } => exit_code(lepus_perf::run_bench(args)),
        Command::Ctl(arguments) => exit_code(ctl::run(arguments)),
        Command::Server(arguments) => match settings::resolve(arguments) {
            Ok(settings::Resolved::Print(toml)) => {
                print!("{toml}");
                ExitCode::SUCCESS
            }
            Ok(settings::Resolved::Run(config)) => match listener::run(*config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    // Plain text on stderr, not a log line: the operator who started it reads it.
                    eprintln!("lepus server: {error}");
                    ExitCode::FAILURE
                }
            },
            Err(error) => {
                eprintln!("lepus server: {error}");
                ExitCode::from(2)
            }
        },
    }
}

/// Prints clap's message; `lepus ctl` exits with rabbitmqctl's EX_USAGE (64) for bad arguments.
fn usage_error(error: clap::Error) -> ExitCode {
    let printed = error.print();
    if !error.use_stderr() {
        // --help and --version are not errors.
        return if printed.is_ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    if std::env::args().nth(1).as_deref() == Some("ctl") {
        ExitCode::from(64)
    } else {
        ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2))
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
