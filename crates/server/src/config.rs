//! The broker's settings, with the embedded defaults that `lepus server` starts with.

use std::net::IpAddr;
use std::path::PathBuf;

/// The default of [`ServerConfig::consumer_max_per_channel`]. RabbitMQ's default is unlimited;
/// a bound is needed because each consumer costs the channel and its queue an entry and a handle
/// (about 200 bytes), so a client that leaks consumers would grow them without end. Applications
/// that consume many queues on one channel (one consumer per queue, as Celery's workers do) hold
/// thousands, not tens of thousands, so this stops only a leak: 65,536 consumers cost ~13 MB.
pub const CONSUMER_MAX_PER_CHANNEL_DEFAULT: usize = 65_536;

/// RabbitMQ 3.10's default `consumer_timeout`: 30 minutes.
pub const CONSUMER_TIMEOUT_MS_DEFAULT: u64 = 1_800_000;

/// What happens to a channel whose oldest delivery waits for its ack past `consumer_timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsumerTimeoutMode {
    /// RabbitMQ's behaviour: the channel is closed with 406 PRECONDITION_FAILED (its unacked
    /// messages are requeued).
    Close,
    /// Only the consumer holding that delivery is cancelled, with basic.cancel from the broker;
    /// the channel, its other consumers and its unacked messages (which may still be acked) stay.
    Cancel,
}

/// Descriptors the default [`ServerConfig::connection_max`] leaves to everything but client
/// sockets: the listeners, the management API's and metrics' connections, the journal, the
/// definitions file and the directories synced.
pub const CONNECTION_DESCRIPTORS_RESERVED: u64 = 128;

/// The fewest connections the default [`ServerConfig::connection_max`] allows, however low the
/// descriptor limit (an operator with a tiny limit sets the value explicitly).
pub const CONNECTION_MAX_DEFAULT_MIN: usize = 16;

/// The default [`ServerConfig::connection_max`] for a soft descriptor limit (`RLIMIT_NOFILE`):
/// half of the limit, less [`CONNECTION_DESCRIPTORS_RESERVED`]. RabbitMQ's default is
/// "infinity", and a node that runs out of descriptors fails where it hurts (a queue log cannot
/// open a segment, the definitions cannot be written); each connection holds one descriptor,
/// and the other half is left to queue segment files. With the common limits: 1,024 -> 384,
/// 65,536 -> 32,640, 1,048,576 -> 524,160.
pub fn default_connection_max(descriptor_limit: u64) -> usize {
    let connections = (descriptor_limit / 2).saturating_sub(CONNECTION_DESCRIPTORS_RESERVED);
    usize::try_from(connections).unwrap_or(usize::MAX).max(CONNECTION_MAX_DEFAULT_MIN)
}

/// The process's soft descriptor limit (1,024, the usual default, when it cannot be read).
pub fn descriptor_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur
    } else {
        1024
    }
}

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
    /// The most client connections (AMQP and AMQPS together) the node serves at once; past it the
    /// listeners stop accepting until one closes (RabbitMQ's `connection_max`).
    pub connection_max: usize,
    /// The most consumers one channel may hold (RabbitMQ's later `consumer_max_per_channel`;
    /// 3.10 has no such limit).
    pub consumer_max_per_channel: usize,
    /// How long a delivery may wait for its ack (RabbitMQ's `consumer_timeout`); 0 turns the
    /// check off.
    pub consumer_timeout_ms: u64,
    /// What a timeout does.
    pub consumer_timeout_mode: ConsumerTimeoutMode,
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
    /// How many Raft groups (shards) quorum queues are spread over (docs/replication.md).
    pub quorum_shards: u32,
    /// How long a quorum queue's held (at-least-once) dead letter that was not settled waits
    /// before it is published again (RabbitMQ's `dead_letter_worker_publisher_confirm_timeout`).
    pub dead_letter_retry_interval_ms: u64,
    /// The RabbitMQ Stream protocol's port (0: not served).
    pub stream_port: u16,
    /// The host the stream protocol tells clients to connect to (open's connection properties,
    /// metadata): RabbitMQ's `stream.advertised_host`, by default this machine's host name.
    pub stream_advertised_host: Option<String>,
    /// This node's name and its cluster links (off unless a cluster port or seeds are set).
    pub cluster: crate::cluster::ClusterSettings,
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
            connection_max: default_connection_max(descriptor_limit()),
            consumer_max_per_channel: CONSUMER_MAX_PER_CHANNEL_DEFAULT,
            consumer_timeout_ms: CONSUMER_TIMEOUT_MS_DEFAULT,
            consumer_timeout_mode: ConsumerTimeoutMode::Close,
            heartbeat_interval_s: 60,
            message_bytes_max: 128 * 1024 * 1024,
            segment_bytes_max: storage::queue_log::SEGMENT_BYTES_MAX_DEFAULT,
            disk_free_limit_bytes: 50_000_000,
            sync_policy: storage::syncer::SyncPolicy::Always,
            memory_high_watermark_bytes: crate::alarms::memory::default_memory_high_watermark_bytes(),
            quorum_shards: crate::quorum::SHARDS_DEFAULT,
            dead_letter_retry_interval_ms: crate::quorum::DEAD_LETTER_RETRY_INTERVAL_MS_DEFAULT,
            stream_port: 5552,
            stream_advertised_host: None,
            cluster: crate::cluster::ClusterSettings::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_connection_max_follows_the_descriptor_limit() {
        assert_eq!(default_connection_max(1024), 384);
        assert_eq!(default_connection_max(65_536), 32_640);
        assert_eq!(default_connection_max(100), CONNECTION_MAX_DEFAULT_MIN);
        assert_eq!(default_connection_max(u64::MAX), usize::try_from(u64::MAX / 2 - 128).unwrap_or(usize::MAX));
    }
}
