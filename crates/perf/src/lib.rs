//! `lepus perf` and `lepus bench`: throughput and latency of any AMQP 0-9-1 broker, measured the
//! way Artemis `perf`, the OpenMessaging Benchmark and RabbitMQ PerfTest measure them, on the
//! lean [`lepus_client`].

pub mod bench;
pub mod cli;
pub mod consumer;
pub mod control;
pub mod producer;
pub mod report;
pub mod run;
pub mod sink;
pub mod stats;
pub mod stream;

use clap::Parser;

/// Entry point of `lepus perf ARGS...`; returns the process exit code.
pub fn run_perf(args: Vec<String>) -> i32 {
    let cli = match cli::PerfCli::try_parse_from(std::iter::once("lepus perf".to_string()).chain(args)) {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { 2 } else { 0 };
            let _ = error.print();
            return code;
        }
    };
    let runtime = match runtime(cli.mode.args().map_or(0, |args| args.threads)) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return 1;
        }
    };
    if let cli::Mode::Sink(sink) = &cli.mode {
        let lifetime = std::time::Duration::from_secs(sink.lifetime);
        return match runtime.block_on(sink::serve(sink.port, lifetime)) {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("error: sink: {error}");
                1
            }
        };
    }
    match runtime.block_on(run::run(cli.mode)) {
        Ok(outcome) => outcome.exit_code,
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

/// A multi-threaded runtime with `threads` workers (0 = one per core).
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if threads > 0 {
        builder.worker_threads(threads);
    }
    builder.enable_all().build()
}

/// Entry point of `lepus bench ARGS...`; returns the process exit code.
pub fn run_bench(args: Vec<String>) -> i32 {
    bench::run(args)
}
