//! The RabbitMQ Stream protocol on port 5552 (`--stream-port`), as RabbitMQ 3.10.8's
//! `rabbitmq_stream` plugin serves it: the handshake (peer properties, SASL PLAIN or AMQPLAIN
//! against the broker's users, tune, open with the user's vhost access), create and delete
//! stream, publishers with deduplication by reference, publish confirmed after the group commit,
//! subscriptions with offset specifications and credit fed whole chunks from the store,
//! stored consumer offsets, metadata naming this node, heartbeats and close.
//!
//! The layers follow a message: the socket task (`connection.rs`) cuts frames with
//! [`stream_codec::split_frame`] (frame size checked before the body is read) and hands decoded
//! commands to the connection's state (`session.rs`, with `commands.rs` and `delivery.rs`),
//! which answers into an outbox; streams are the vhosts' stream queues (`crate::stream`, on the
//! store `storage::stream`), found, created and deleted through `registry.rs`.

mod commands;
mod connection;
mod delivery;
pub mod registry;
mod session;

use crate::broker::Broker;
use registry::StreamRegistry;
use std::sync::Arc;
use stream_codec::{Text, TextMap};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What every stream connection of the node shares.
pub struct Node {
    /// The broker: users, permissions, vhosts, the syncer, alarms.
    pub broker: Arc<Broker>,
    /// The streams.
    pub registry: Arc<StreamRegistry>,
    /// The host clients are told to connect to.
    pub advertised_host: String,
    /// The port clients are told to connect to.
    pub advertised_port: u16,
}

impl Node {
    /// The peer properties the server answers with (RabbitMQ's keys, in its order).
    pub fn server_properties(&self) -> TextMap {
        [
            ("cluster_name", "lepus"),
            ("copyright", "Copyright (c) the Lepus authors"),
            ("information", "Licensed under the Apache License 2.0"),
            ("platform", "Rust"),
            ("product", "Lepus"),
            ("version", env!("CARGO_PKG_VERSION")),
        ]
        .into_iter()
        .map(|(key, value)| (Text::from(key), Text::from(value)))
        .collect()
    }
}

/// This machine's host name, RabbitMQ's default advertised host.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The host this node's stream clients are told to connect to (`metadata`, peer properties),
/// and its cluster peers too.
pub fn advertised_host(config: &crate::config::ServerConfig) -> String {
    config.stream_advertised_host.clone().unwrap_or_else(host_name)
}

/// Serves stream-protocol connections on `listener` until the runtime stops. Connections beyond `connection_max` wait in the kernel's backlog, as AMQP's do.
pub async fn serve(broker: Arc<Broker>, listener: TcpListener) {
    let port = listener.local_addr().map(|address| address.port()).unwrap_or(broker.config.stream_port);
    let registry = Arc::new(StreamRegistry::new(broker.clone()));
    let advertised_host = advertised_host(&broker.config);
    let node = Arc::new(Node { broker: broker.clone(), registry, advertised_host, advertised_port: port });
    let slots = Arc::new(Semaphore::new(broker.config.connection_max.min(Semaphore::MAX_PERMITS)));
    tracing::info!(port, "Lepus is accepting RabbitMQ Stream protocol connections");
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((socket, peer)) => {
                let node = node.clone();
                tokio::spawn(async move {
                    let _ = socket.set_nodelay(true);
                    connection::serve(node, socket, peer).await;
                    drop(slot);
                });
            }
            Err(error) => {
                tracing::warn!(%error, "stream accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
