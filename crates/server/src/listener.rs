//! The AMQP listener: accepts sockets and starts a connection task for each.

use crate::broker::Broker;
use crate::config::ServerConfig;
use std::net::SocketAddr;

/// How long a graceful shutdown waits for clients to answer connection.close.
pub const SHUTDOWN_CONNECTIONS_WAIT_S: u64 = 5;

/// Opens the data directory, listens, and serves until SIGINT or SIGTERM.
pub fn run(config: ServerConfig) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|error| error.to_string())?;
    runtime.block_on(async move {
        let broker = Broker::open(config.clone())?;
        let address = SocketAddr::new(config.bind_address, config.amqp_port);
        let listener = tokio::net::TcpListener::bind(address).await.map_err(|error| format!("listening on {address}: {error}"))?;
        tracing::info!(%address, data_dir = %config.data_dir.display(), "Lepus is accepting AMQP 0-9-1 connections");
        tokio::spawn(crate::disk::monitor(broker.clone()));
        // A port already taken stops only that server, not the broker: several brokers started
        // with the defaults on one machine (test suites) keep working over AMQP.
        for (port, what) in [(config.http_port, "management HTTP API"), (config.metrics_port, "Prometheus metrics")] {
            if port == 0 {
                continue;
            }
            let address = SocketAddr::new(config.bind_address, port);
            match tokio::net::TcpListener::bind(address).await {
                Ok(http) if port == config.http_port => {
                    tracing::info!(%address, "serving the {what}");
                    tokio::spawn(crate::management::serve(broker.clone(), http));
                }
                Ok(http) => {
                    tracing::info!(%address, "serving the {what} at /metrics");
                    tokio::spawn(crate::metrics::serve(broker.clone(), http));
                }
                Err(error) => tracing::error!(%address, %error, "cannot listen: the {what} is not served"),
            }
        }
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|error| error.to_string())?;
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        tokio::spawn(crate::connection::serve(broker.clone(), stream, peer));
                    }
                    Err(error) => {
                        // Out of file descriptors and the like: keep serving the others.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
                _ = tokio::signal::ctrl_c() => break,
                _ = terminate.recv() => break,
            }
        }
        tracing::info!(connections = broker.connection_count(), "shutting down: closing connections with 320 CONNECTION_FORCED");
        drop(listener);
        broker.close_all_connections();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(SHUTDOWN_CONNECTIONS_WAIT_S);
        while broker.connection_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        broker.flush_all();
        Ok(())
    })
}
