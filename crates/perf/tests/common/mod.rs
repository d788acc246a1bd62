//! Starts a Lepus broker for a test: the binary named by `LEPUS_BIN`, on a free loopback port,
//! with a fresh data directory; stopped when dropped.

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Broker {
    pub child: Child,
    pub url: String,
    data_dir: std::path::PathBuf,
}

impl Broker {
    /// The broker from `LEPUS_BIN`, or `None` when `LEPUS_BIN=none` (a deliberate skip). Panics
    /// when it is unset: a broker test that silently tests nothing must not pass.
    pub fn start() -> Option<Broker> {
        let binary = match std::env::var("LEPUS_BIN") {
            Ok(value) if value == "none" => {
                println!("skipped on purpose: LEPUS_BIN=none");
                return None;
            }
            Ok(binary) => binary,
            Err(_) => panic!("LEPUS_BIN is not set: set it to a lepus binary (target/release/lepus), or to none to skip the broker tests"),
        };
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let data_dir = std::env::temp_dir().join(format!("lepus-perf-test-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        let child = Command::new(binary)
            .args(["server", "--bind", "127.0.0.1", "--amqp-port", &port.to_string(), "--data-dir"])
            .arg(&data_dir)
            .env("LEPUS_LOG", "warn")
            // No management, metrics or stream listeners: parallel tests (and other brokers on the
            // machine) would fight over their fixed ports; the loser exits before listening.
            // (Environment rather than flags, which a broker without these listeners ignores.)
            .env("LEPUS_HTTP_PORT", "0")
            .env("LEPUS_METRICS_PORT", "0")
            .env("LEPUS_STREAM_PORT", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("LEPUS_BIN starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "lepus did not listen within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Broker { child, url: format!("amqp://guest:guest@127.0.0.1:{port}/"), data_dir })
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Parses `lepus perf` arguments.
pub fn mode(args: &[&str]) -> lepus_perf::cli::Mode {
    use clap::Parser;
    let argv = std::iter::once("lepus perf").chain(args.iter().copied());
    lepus_perf::cli::PerfCli::try_parse_from(argv).unwrap().mode
}
