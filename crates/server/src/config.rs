//! The broker's settings, with the embedded defaults that `lepus server` starts with.

use std::net::IpAddr;
use std::path::PathBuf;

/// Settings for one broker process.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where definitions and message logs live.
    pub data_dir: PathBuf,
    /// The address AMQP listens on.
    pub bind_address: IpAddr,
    /// The AMQP port.
    pub amqp_port: u16,
    /// The management HTTP API's port (0: not served).
    pub http_port: u16,
    /// The Prometheus metrics port (0: not served).
    pub metrics_port: u16,
    /// The AMQP-over-TLS port (0: not served; served only with a certificate and key).
    pub amqps_port: u16,
    /// The management API's HTTPS port (0: not served; served only with a certificate and key).
    pub https_port: u16,
    /// The server's certificate chain (PEM), leaf first.
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of the certificate's leaf.
    pub tls_key_file: Option<PathBuf>,
    /// The CA certificates (PEM) that client certificates must chain to.
    pub tls_ca_file: Option<PathBuf>,
    /// Whether AMQPS asks clients for a certificate and verifies the ones presented.
    pub tls_verify_peer: bool,
    /// Whether AMQPS refuses clients that present no certificate (needs `tls_verify_peer`).
    pub tls_fail_if_no_peer_cert: bool,
    /// The largest frame we accept and offer in connection.tune, in bytes (RabbitMQ's default).
    pub frame_bytes_max: u32,
    /// The most channels per connection we offer in connection.tune (RabbitMQ's default).
    pub channels_per_connection_max: u16,
    /// The heartbeat interval we propose, in seconds (RabbitMQ's default).
    pub heartbeat_interval_s: u16,
    /// The largest message body we accept (RabbitMQ 3.10's default max_message_size).
    pub message_bytes_max: u64,
    /// A queue log segment takes new messages until it holds this many bytes.
    pub segment_bytes_max: u64,
    /// Publishers are blocked while the data directory's filesystem has less free space than
    /// this (RabbitMQ's default disk_free_limit).
    pub disk_free_limit_bytes: u64,
    /// Publishers are blocked while the broker's resident memory is above this.
    pub memory_high_watermark_bytes: u64,
    /// When messages are fdatasynced, and so what a confirm promises (see docs/storage.md).
    pub sync_policy: storage::syncer::SyncPolicy,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            data_dir: PathBuf::from("lepus-data"),
            bind_address: IpAddr::from([0, 0, 0, 0]),
            amqp_port: 5672,
            http_port: 15672,
            metrics_port: 15692,
            amqps_port: 5671,
            https_port: 15671,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            tls_verify_peer: false,
            tls_fail_if_no_peer_cert: false,
            frame_bytes_max: 131_072,
            channels_per_connection_max: 2047,
            heartbeat_interval_s: 60,
            message_bytes_max: 128 * 1024 * 1024,
            segment_bytes_max: storage::queue_log::SEGMENT_BYTES_MAX_DEFAULT,
            disk_free_limit_bytes: 50_000_000,
            sync_policy: storage::syncer::SyncPolicy::Always,
            memory_high_watermark_bytes: crate::disk::default_memory_high_watermark_bytes(),
        }
    }
}
