//! `lepus server`'s settings: flags and environment variables win over the configuration file
//! (`--config FILE`, TOML), which wins over the embedded defaults. `--print-config` shows the
//! result, so an operator sees exactly what a broker would run with.

use crate::config::ServerConfig;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::PathBuf;
use storage::syncer::SyncPolicy;

/// `--sync-interval-ms` when not given.
pub const SYNC_INTERVAL_MS_DEFAULT: u64 = 200;

/// The `--sync` choices (see docs/storage.md for what each promises).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// fdatasync before every confirm, group-committed.
    Always,
    /// Confirm after the write; fdatasync every --sync-interval-ms.
    Interval,
    /// Confirm after the write; never fdatasync.
    Never,
}

/// `lepus server` flags. Each may also come from its environment variable or the file; the
/// defaults named here apply when none gives it.
#[derive(clap::Args, Debug)]
pub struct ServerArguments {
    /// A TOML file with any of the settings below (keys as the flags, with underscores).
    #[arg(long, env = "LEPUS_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective settings as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// Directory for definitions and message logs, created if missing [default: lepus-data].
    #[arg(long, env = "LEPUS_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// AMQP port [default: 5672].
    #[arg(long, env = "LEPUS_AMQP_PORT")]
    amqp_port: Option<u16>,
    /// Address to listen on [default: 0.0.0.0].
    #[arg(long, env = "LEPUS_BIND")]
    bind: Option<IpAddr>,
    /// Management HTTP API port, RabbitMQ-compatible `/api`; 0 disables it [default: 15672].
    #[arg(long, env = "LEPUS_HTTP_PORT")]
    http_port: Option<u16>,
    /// Prometheus metrics port, `/metrics`; 0 disables it [default: 15692].
    #[arg(long, env = "LEPUS_METRICS_PORT")]
    metrics_port: Option<u16>,
    /// AMQP over TLS port, served when --tls-cert-file and --tls-key-file are given; 0 disables it [default: 5671].
    #[arg(long, env = "LEPUS_AMQPS_PORT")]
    amqps_port: Option<u16>,
    /// Management HTTP API over TLS port, served when --tls-cert-file and --tls-key-file are given; 0 disables it [default: 15671].
    #[arg(long, env = "LEPUS_HTTPS_PORT")]
    https_port: Option<u16>,
    /// The server's certificate chain, PEM, leaf first; with --tls-key-file it turns the TLS listeners on.
    #[arg(long, env = "LEPUS_TLS_CERT_FILE")]
    tls_cert_file: Option<PathBuf>,
    /// The private key of the certificate, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "LEPUS_TLS_KEY_FILE")]
    tls_key_file: Option<PathBuf>,
    /// CA certificates, PEM, that client certificates must chain to (with --tls-verify-peer).
    #[arg(long, env = "LEPUS_TLS_CA_FILE")]
    tls_ca_file: Option<PathBuf>,
    /// AMQPS asks clients for a certificate and verifies the ones presented [default: false].
    #[arg(long, env = "LEPUS_TLS_VERIFY_PEER", num_args = 0..=1, default_missing_value = "true")]
    tls_verify_peer: Option<bool>,
    /// AMQPS refuses clients that present no certificate; needs --tls-verify-peer [default: false].
    #[arg(long, env = "LEPUS_TLS_FAIL_IF_NO_PEER_CERT", num_args = 0..=1, default_missing_value = "true")]
    tls_fail_if_no_peer_cert: Option<bool>,
    /// Heartbeat interval proposed to clients, in seconds; 0 disables [default: 60].
    #[arg(long, env = "LEPUS_HEARTBEAT_S")]
    heartbeat_s: Option<u16>,
    /// A queue log segment takes new messages until it holds this many bytes [default: 8388608].
    #[arg(long, env = "LEPUS_SEGMENT_BYTES_MAX")]
    segment_bytes_max: Option<u64>,
    /// Publishers are blocked while the data directory's filesystem has less free space than this [default: 50000000].
    #[arg(long, env = "LEPUS_DISK_FREE_LIMIT_BYTES")]
    disk_free_limit_bytes: Option<u64>,
    /// Publishers are blocked while the broker's resident memory is above this [default: 40% of RAM].
    #[arg(long, env = "LEPUS_MEMORY_HIGH_WATERMARK_BYTES")]
    memory_high_watermark_bytes: Option<u64>,
    /// The most client connections served at once; past it the listeners stop accepting until one
    /// closes [default: half the descriptor limit, less 128].
    #[arg(long, env = "LEPUS_CONNECTION_MAX")]
    connection_max: Option<usize>,
    /// The most consumers one channel may hold; one more is refused with 530 [default: 65536].
    #[arg(long, env = "LEPUS_CONSUMER_MAX_PER_CHANNEL")]
    consumer_max_per_channel: Option<usize>,
    /// How long a delivery may wait for its ack, in milliseconds; 0 turns the check off [default: 1800000].
    #[arg(long, env = "LEPUS_CONSUMER_TIMEOUT_MS")]
    consumer_timeout_ms: Option<u64>,
    /// What a consumer timeout does: close the channel (RabbitMQ) or cancel only the consumer [default: close].
    #[arg(long, env = "LEPUS_CONSUMER_TIMEOUT_MODE", value_enum)]
    consumer_timeout_mode: Option<crate::config::ConsumerTimeoutMode>,
    /// How long a quorum queue's at-least-once dead letter that was not settled (it routed
    /// nowhere) waits before it is published again, in milliseconds [default: 180000, RabbitMQ's].
    #[arg(long, env = "LEPUS_DEAD_LETTER_RETRY_INTERVAL_MS")]
    dead_letter_retry_interval_ms: Option<u64>,
    /// When messages are fdatasynced [default: always].
    #[arg(long, env = "LEPUS_SYNC", value_enum)]
    sync: Option<SyncMode>,
    /// With `--sync interval`: milliseconds between fdatasyncs [default: 200].
    #[arg(long, env = "LEPUS_SYNC_INTERVAL_MS")]
    sync_interval_ms: Option<u64>,
    /// The RabbitMQ Stream protocol's port [default: 5552; 0 turns it off].
    #[arg(long, env = "LEPUS_STREAM_PORT")]
    stream_port: Option<u16>,
    /// The host stream-protocol clients are told to connect to [default: this host's name].
    #[arg(long, env = "LEPUS_STREAM_ADVERTISED_HOST")]
    stream_advertised_host: Option<String>,
    /// This node's name, `name@host` (RabbitMQ's RABBITMQ_NODENAME) [default: lepus@HOSTNAME].
    #[arg(long, env = "LEPUS_NODENAME")]
    node_name: Option<String>,
    /// Port of the links between cluster nodes; 0 turns clustering off [default: 25672 with --cluster-seeds, else 0].
    #[arg(long, env = "LEPUS_CLUSTER_PORT")]
    cluster_port: Option<u16>,
    /// The cluster's founding nodes, `host:port,...` (this node among them, spelled as the others spell it).
    #[arg(long, env = "LEPUS_CLUSTER_SEEDS", value_delimiter = ',')]
    cluster_seeds: Option<Vec<String>>,
    /// The cluster's name; links from nodes of another name are refused [default: lepus].
    #[arg(long, env = "LEPUS_CLUSTER_NAME")]
    cluster_name: Option<String>,
    /// The address other nodes reach this one at, `host:port` [default: this node's seed, or BIND:CLUSTER_PORT].
    #[arg(long, env = "LEPUS_CLUSTER_ADVERTISE")]
    cluster_advertise: Option<String>,
    /// Applied metadata log entries between snapshots of the definitions (the log is compacted up to each) [default: 4096].
    #[arg(long, env = "LEPUS_METADATA_SNAPSHOT_ENTRIES_INTERVAL")]
    metadata_snapshot_entries_interval: Option<u64>,
}

/// The settings as the file holds them, and as `--print-config` writes them.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    data_dir: Option<PathBuf>,
    amqp_port: Option<u16>,
    bind: Option<IpAddr>,
    http_port: Option<u16>,
    metrics_port: Option<u16>,
    amqps_port: Option<u16>,
    https_port: Option<u16>,
    tls_cert_file: Option<PathBuf>,
    tls_key_file: Option<PathBuf>,
    tls_ca_file: Option<PathBuf>,
    tls_verify_peer: Option<bool>,
    tls_fail_if_no_peer_cert: Option<bool>,
    heartbeat_s: Option<u16>,
    segment_bytes_max: Option<u64>,
    disk_free_limit_bytes: Option<u64>,
    memory_high_watermark_bytes: Option<u64>,
    connection_max: Option<usize>,
    consumer_max_per_channel: Option<usize>,
    consumer_timeout_ms: Option<u64>,
    consumer_timeout_mode: Option<crate::config::ConsumerTimeoutMode>,
    dead_letter_retry_interval_ms: Option<u64>,
    sync: Option<SyncMode>,
    sync_interval_ms: Option<u64>,
    stream_port: Option<u16>,
    stream_advertised_host: Option<String>,
    node_name: Option<String>,
    cluster_port: Option<u16>,
    cluster_seeds: Option<Vec<String>>,
    cluster_name: Option<String>,
    cluster_advertise: Option<String>,
    metadata_snapshot_entries_interval: Option<u64>,
}

/// What `lepus server` should do.
pub enum Resolved {
    /// Run a broker with these settings.
    Run(Box<ServerConfig>),
    /// Print these settings and exit.
    Print(String),
}

/// Merges flags and environment, the file, and the defaults.
pub fn resolve(arguments: ServerArguments) -> Result<Resolved, String> {
    let file = match &arguments.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
            toml::from_str::<FileSettings>(&text).map_err(|error| format!("{}: {error}", path.display()))?
        }
        None => FileSettings::default(),
    };
    let defaults = ServerConfig::default();
    let sync = arguments.sync.or(file.sync).unwrap_or(SyncMode::Always);
    let sync_interval_ms = arguments.sync_interval_ms.or(file.sync_interval_ms).unwrap_or(SYNC_INTERVAL_MS_DEFAULT);
    let mut cluster = crate::cluster::ClusterSettings::resolve(
        arguments.node_name.or(file.node_name),
        arguments.cluster_port.or(file.cluster_port),
        arguments.cluster_seeds.or(file.cluster_seeds),
        arguments.cluster_name.or(file.cluster_name),
        arguments.cluster_advertise.or(file.cluster_advertise),
    )?;
    if let Some(interval) = arguments.metadata_snapshot_entries_interval.or(file.metadata_snapshot_entries_interval) {
        if interval == 0 {
            return Err("metadata_snapshot_entries_interval must be at least 1".to_string());
        }
        cluster.metadata_snapshot_entries_interval = interval;
    }
    let config = ServerConfig {
        data_dir: arguments.data_dir.or(file.data_dir).unwrap_or(defaults.data_dir.clone()),
        amqp_port: arguments.amqp_port.or(file.amqp_port).unwrap_or(defaults.amqp_port),
        bind_address: arguments.bind.or(file.bind).unwrap_or(defaults.bind_address),
        http_port: arguments.http_port.or(file.http_port).unwrap_or(defaults.http_port),
        metrics_port: arguments.metrics_port.or(file.metrics_port).unwrap_or(defaults.metrics_port),
        amqps_port: arguments.amqps_port.or(file.amqps_port).unwrap_or(defaults.amqps_port),
        https_port: arguments.https_port.or(file.https_port).unwrap_or(defaults.https_port),
        tls_cert_file: arguments.tls_cert_file.or(file.tls_cert_file),
        tls_key_file: arguments.tls_key_file.or(file.tls_key_file),
        tls_ca_file: arguments.tls_ca_file.or(file.tls_ca_file),
        tls_verify_peer: arguments.tls_verify_peer.or(file.tls_verify_peer).unwrap_or(defaults.tls_verify_peer),
        tls_fail_if_no_peer_cert: arguments
            .tls_fail_if_no_peer_cert
            .or(file.tls_fail_if_no_peer_cert)
            .unwrap_or(defaults.tls_fail_if_no_peer_cert),
        heartbeat_interval_s: arguments.heartbeat_s.or(file.heartbeat_s).unwrap_or(defaults.heartbeat_interval_s),
        segment_bytes_max: arguments.segment_bytes_max.or(file.segment_bytes_max).unwrap_or(defaults.segment_bytes_max).max(1),
        disk_free_limit_bytes: arguments.disk_free_limit_bytes.or(file.disk_free_limit_bytes).unwrap_or(defaults.disk_free_limit_bytes),
        memory_high_watermark_bytes: arguments
            .memory_high_watermark_bytes
            .or(file.memory_high_watermark_bytes)
            .unwrap_or(defaults.memory_high_watermark_bytes),
        connection_max: arguments.connection_max.or(file.connection_max).unwrap_or(defaults.connection_max),
        consumer_max_per_channel: arguments
            .consumer_max_per_channel
            .or(file.consumer_max_per_channel)
            .unwrap_or(defaults.consumer_max_per_channel),
        consumer_timeout_ms: arguments.consumer_timeout_ms.or(file.consumer_timeout_ms).unwrap_or(defaults.consumer_timeout_ms),
        consumer_timeout_mode: arguments.consumer_timeout_mode.or(file.consumer_timeout_mode).unwrap_or(defaults.consumer_timeout_mode),
        dead_letter_retry_interval_ms: arguments
            .dead_letter_retry_interval_ms
            .or(file.dead_letter_retry_interval_ms)
            .unwrap_or(defaults.dead_letter_retry_interval_ms)
            .max(1),
        sync_policy: match sync {
            SyncMode::Always => SyncPolicy::Always,
            SyncMode::Interval => SyncPolicy::Interval { interval_ms: sync_interval_ms },
            SyncMode::Never => SyncPolicy::Never,
        },
        stream_port: arguments.stream_port.or(file.stream_port).unwrap_or(defaults.stream_port),
        stream_advertised_host: arguments.stream_advertised_host.or(file.stream_advertised_host),
        cluster,
        ..defaults
    };
    check_tls(&config)?;
    check_limits(&config)?;
    if !arguments.print_config {
        return Ok(Resolved::Run(Box::new(config)));
    }
    let effective = effective_file_settings(&config, sync, sync_interval_ms);
    toml::to_string(&effective).map(Resolved::Print).map_err(|error| error.to_string())
}

/// The settings in force, as the file names them (what `--print-config` writes).
fn effective_file_settings(config: &ServerConfig, sync: SyncMode, sync_interval_ms: u64) -> FileSettings {
    FileSettings {
        data_dir: Some(config.data_dir.clone()),
        amqp_port: Some(config.amqp_port),
        bind: Some(config.bind_address),
        http_port: Some(config.http_port),
        metrics_port: Some(config.metrics_port),
        amqps_port: Some(config.amqps_port),
        https_port: Some(config.https_port),
        tls_cert_file: config.tls_cert_file.clone(),
        tls_key_file: config.tls_key_file.clone(),
        tls_ca_file: config.tls_ca_file.clone(),
        tls_verify_peer: Some(config.tls_verify_peer),
        tls_fail_if_no_peer_cert: Some(config.tls_fail_if_no_peer_cert),
        heartbeat_s: Some(config.heartbeat_interval_s),
        segment_bytes_max: Some(config.segment_bytes_max),
        disk_free_limit_bytes: Some(config.disk_free_limit_bytes),
        memory_high_watermark_bytes: Some(config.memory_high_watermark_bytes),
        connection_max: Some(config.connection_max),
        consumer_max_per_channel: Some(config.consumer_max_per_channel),
        consumer_timeout_ms: Some(config.consumer_timeout_ms),
        consumer_timeout_mode: Some(config.consumer_timeout_mode),
        dead_letter_retry_interval_ms: Some(config.dead_letter_retry_interval_ms),
        sync: Some(sync),
        sync_interval_ms: Some(sync_interval_ms),
        stream_port: Some(config.stream_port),
        stream_advertised_host: config.stream_advertised_host.clone(),
        node_name: Some(config.cluster.node_name.clone()),
        cluster_port: Some(config.cluster.cluster_port),
        cluster_seeds: Some(config.cluster.seeds.clone()),
        cluster_name: Some(config.cluster.cluster_name.clone()),
        cluster_advertise: config.cluster.advertise.clone(),
        metadata_snapshot_entries_interval: Some(config.cluster.metadata_snapshot_entries_interval),
    }
}

/// The settings in force, as the file names them, as JSON (`lepus ctl environment`). The sync
/// interval of a node that does not sync by interval is the default it would use.
pub fn effective_settings_json(config: &ServerConfig) -> serde_json::Value {
    let (sync, sync_interval_ms) = match config.sync_policy {
        SyncPolicy::Always => (SyncMode::Always, SYNC_INTERVAL_MS_DEFAULT),
        SyncPolicy::Interval { interval_ms } => (SyncMode::Interval, interval_ms),
        SyncPolicy::Never => (SyncMode::Never, SYNC_INTERVAL_MS_DEFAULT),
    };
    serde_json::to_value(effective_file_settings(config, sync, sync_interval_ms)).unwrap_or(serde_json::Value::Null)
}

/// Refuses limits of 0: a node that accepts no connection, or channels that take no consumer, is
/// a typo rather than a wish (RabbitMQ's vhost limit `max-connections` 0 is the way to refuse a
/// vhost's clients).
fn check_limits(config: &ServerConfig) -> Result<(), String> {
    if config.connection_max == 0 {
        return Err("connection_max must be at least 1".to_string());
    }
    if config.consumer_max_per_channel == 0 {
        return Err("consumer_max_per_channel must be at least 1".to_string());
    }
    Ok(())
}

/// Refuses TLS settings that cannot mean what the operator wants, before anything listens: a
/// certificate without its key (or the reverse), or client verification that would not happen.
/// Whether the files themselves are usable is checked when the broker starts (see `tls::load`).
fn check_tls(config: &ServerConfig) -> Result<(), String> {
    let tls_enabled = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(_), Some(_)) => true,
        (None, None) => false,
        (Some(_), None) => return Err("tls_cert_file is set but tls_key_file is not: TLS needs both".to_string()),
        (None, Some(_)) => return Err("tls_key_file is set but tls_cert_file is not: TLS needs both".to_string()),
    };
    if !tls_enabled && (config.tls_ca_file.is_some() || config.tls_verify_peer || config.tls_fail_if_no_peer_cert) {
        return Err("tls_ca_file, tls_verify_peer and tls_fail_if_no_peer_cert need tls_cert_file and tls_key_file".to_string());
    }
    if config.tls_verify_peer && config.tls_ca_file.is_none() {
        return Err("tls_verify_peer needs tls_ca_file: the CA certificates that client certificates must chain to".to_string());
    }
    if config.tls_fail_if_no_peer_cert && !config.tls_verify_peer {
        return Err("tls_fail_if_no_peer_cert needs tls_verify_peer: without it no client certificate is asked for".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        server: ServerArguments,
    }

    fn resolve_from(arguments: &[&str]) -> Result<Resolved, String> {
        let cli = TestCli::try_parse_from(std::iter::once("lepus").chain(arguments.iter().copied())).map_err(|error| error.to_string())?;
        resolve(cli.server)
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let path = std::env::temp_dir().join(format!("lepus-settings-{}.toml", std::process::id()));
        std::fs::write(&path, "amqp_port = 5699\nsync = \"interval\"\nheartbeat_s = 30\n").expect("write");
        let Ok(Resolved::Run(config)) = resolve_from(&["--config", path.to_str().expect("utf-8"), "--heartbeat-s", "10"]) else {
            panic!("resolves")
        };
        assert_eq!(config.amqp_port, 5699, "from the file");
        assert_eq!(config.heartbeat_interval_s, 10, "the flag wins");
        assert_eq!(config.sync_policy, SyncPolicy::Interval { interval_ms: 200 }, "file value, default interval");
        assert_eq!(config.http_port, 15672, "default");
        let Ok(Resolved::Print(toml)) = resolve_from(&["--config", path.to_str().expect("utf-8"), "--print-config"]) else {
            panic!("prints")
        };
        assert!(toml.contains("amqp_port = 5699") && toml.contains("sync = \"interval\""), "{toml}");
        std::fs::write(&path, "amqp_prot = 1\n").expect("write");
        let error = resolve_from(&["--config", path.to_str().expect("utf-8")]).err().expect("an unknown key is an error");
        assert!(error.contains("unknown field `amqp_prot`"), "{error}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn limits_come_from_flags_or_the_file_and_zero_is_refused() {
        let Ok(Resolved::Run(config)) = resolve_from(&[]) else { panic!("resolves") };
        assert_eq!(config.connection_max, crate::config::default_connection_max(crate::config::descriptor_limit()));
        assert_eq!(config.consumer_max_per_channel, crate::config::CONSUMER_MAX_PER_CHANNEL_DEFAULT);
        let path = std::env::temp_dir().join(format!("lepus-settings-limits-{}.toml", std::process::id()));
        std::fs::write(&path, "connection_max = 7\nconsumer_max_per_channel = 9\n").expect("write");
        let file = path.to_str().expect("utf-8");
        let Ok(Resolved::Run(config)) = resolve_from(&["--config", file, "--connection-max", "5"]) else { panic!("resolves") };
        assert_eq!((config.connection_max, config.consumer_max_per_channel), (5, 9), "the flag wins, the file fills in");
        let Ok(Resolved::Print(toml)) = resolve_from(&["--config", file, "--print-config"]) else { panic!("prints") };
        assert!(toml.contains("connection_max = 7") && toml.contains("consumer_max_per_channel = 9"), "{toml}");
        let _ = std::fs::remove_file(&path);
        for (arguments, expected) in [
            (["--connection-max", "0"], "connection_max must be at least 1"),
            (["--consumer-max-per-channel", "0"], "consumer_max_per_channel must be at least 1"),
        ] {
            let error = resolve_from(&arguments).err().unwrap_or_default();
            assert!(error.contains(expected), "{arguments:?}: {error}");
        }
    }

    #[test]
    fn tls_settings_resolve_and_inconsistent_ones_are_refused() {
        let Ok(Resolved::Run(config)) = resolve_from(&[]) else { panic!("resolves") };
        assert_eq!((config.amqps_port, config.https_port), (5671, 15671), "RabbitMQ's TLS ports");
        assert!(config.tls_cert_file.is_none() && !config.tls_verify_peer && !config.tls_fail_if_no_peer_cert);
        let all = [
            "--tls-cert-file=c.pem",
            "--tls-key-file=k.pem",
            "--tls-ca-file=ca.pem",
            "--tls-verify-peer",
            "--tls-fail-if-no-peer-cert=true",
            "--amqps-port=5999",
        ];
        let Ok(Resolved::Run(config)) = resolve_from(&all) else { panic!("resolves") };
        assert!(config.tls_verify_peer && config.tls_fail_if_no_peer_cert);
        assert_eq!(config.amqps_port, 5999);
        assert_eq!(config.tls_ca_file, Some(PathBuf::from("ca.pem")));
        let Ok(Resolved::Print(toml)) = resolve_from(&[&all[..], &["--print-config"]].concat()) else { panic!("prints") };
        assert!(toml.contains("tls_cert_file = \"c.pem\"") && toml.contains("tls_verify_peer = true"), "{toml}");
        let refused = [
            (&["--tls-cert-file=c.pem"][..], "tls_key_file is not"),
            (&["--tls-key-file=k.pem"][..], "tls_cert_file is not"),
            (&["--tls-verify-peer", "--tls-ca-file=ca.pem"][..], "need tls_cert_file"),
            (&["--tls-cert-file=c.pem", "--tls-key-file=k.pem", "--tls-verify-peer"][..], "needs tls_ca_file"),
            (&["--tls-cert-file=c.pem", "--tls-key-file=k.pem", "--tls-fail-if-no-peer-cert"][..], "needs tls_verify_peer"),
        ];
        for (arguments, expected) in refused {
            let error = resolve_from(arguments).err().unwrap_or_default();
            assert!(error.contains(expected), "{arguments:?}: {error}");
        }
    }
}
