//! The AMQP listeners (plain, and TLS when a certificate is configured): accept sockets and start
//! a connection task for each; also starts the management API (HTTP, HTTPS) and metrics servers.

use crate::broker::Broker;
use crate::config::ServerConfig;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// How long a graceful shutdown waits for clients to answer connection.close.
pub const SHUTDOWN_CONNECTIONS_WAIT_S: u64 = 5;

/// Opens the data directory, listens, and serves until SIGINT or SIGTERM.
pub fn run(config: ServerConfig) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|error| error.to_string())?;
    runtime.block_on(async move {
        // Bad TLS files stop the start here, before the data directory is opened or a port taken.
        let tls = crate::tls::load(&config)?;
        let broker = Broker::open(config.clone())?;
        let address = SocketAddr::new(config.bind_address, config.amqp_port);
        let listener = TcpListener::bind(address).await.map_err(|error| format!("listening on {address}: {error}"))?;
        tracing::info!(%address, data_dir = %config.data_dir.display(), "Lepus is accepting AMQP 0-9-1 connections");
        // AMQPS, once configured, is as essential as AMQP: a port already taken stops the broker.
        let amqps_listener = match &tls {
            Some(tls) if config.amqps_port != 0 => {
                let address = SocketAddr::new(config.bind_address, config.amqps_port);
                let listener = TcpListener::bind(address).await.map_err(|error| format!("listening on {address} (AMQPS): {error}"))?;
                tracing::info!(%address, verify_peer = config.tls_verify_peer, fail_if_no_peer_cert = config.tls_fail_if_no_peer_cert,
                    "Lepus is accepting AMQP 0-9-1 connections over TLS");
                Some((listener, tls.amqp.clone()))
            }
            _ => None,
        };
        tokio::spawn(crate::disk::monitor(broker.clone()));
        let management =
            (config.http_port != 0 || (tls.is_some() && config.https_port != 0)).then(|| crate::management::app(broker.clone()));
        // A port already taken stops only that server, not the broker: several brokers started
        // with the defaults on one machine (test suites) keep working over AMQP.
        let https_port = if tls.is_some() { config.https_port } else { 0 };
        let servers = [(config.http_port, Server::Http), (https_port, Server::Https), (config.metrics_port, Server::Metrics)];
        for (port, server) in servers {
            if port == 0 {
                continue;
            }
            let address = SocketAddr::new(config.bind_address, port);
            let socket = match TcpListener::bind(address).await {
                Ok(socket) => socket,
                Err(error) => {
                    tracing::error!(%address, %error, "cannot listen: the {} is not served", server.name());
                    continue;
                }
            };
            tracing::info!(%address, "serving the {}", server.name());
            match (server, &management, &tls) {
                (Server::Http, Some(app), _) => {
                    tokio::spawn(crate::management::serve(app.clone(), socket));
                }
                (Server::Https, Some(app), Some(tls)) => {
                    tokio::spawn(crate::management::serve_tls(app.clone(), socket, tls.https.clone()));
                }
                (Server::Metrics, _, _) => {
                    tokio::spawn(crate::metrics::serve(broker.clone(), socket));
                }
                _ => {}
            }
        }
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|error| error.to_string())?;
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(crate::connection::serve(broker.clone(), stream, peer, None));
                    }
                    Err(error) => accept_failed(error).await,
                },
                accepted = accept_amqps(amqps_listener.as_ref()) => match accepted {
                    Ok((stream, peer, acceptor)) => {
                        tokio::spawn(serve_amqps(broker.clone(), acceptor, stream, peer));
                    }
                    Err(error) => accept_failed(error).await,
                },
                _ = tokio::signal::ctrl_c() => break,
                _ = terminate.recv() => break,
            }
        }
        tracing::info!(connections = broker.connection_count(), "shutting down: closing connections with 320 CONNECTION_FORCED");
        drop(listener);
        drop(amqps_listener);
        broker.close_all_connections();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(SHUTDOWN_CONNECTIONS_WAIT_S);
        while broker.connection_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        broker.flush_all();
        Ok(())
    })
}

/// The HTTP servers besides AMQP.
#[derive(Clone, Copy)]
enum Server {
    Http,
    Https,
    Metrics,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::Http => "management HTTP API",
            Server::Https => "management HTTPS API",
            Server::Metrics => "Prometheus metrics at /metrics",
        }
    }
}

/// Accepts from the AMQPS listener, or waits forever when there is none (TLS not configured).
async fn accept_amqps(listener: Option<&(TcpListener, TlsAcceptor)>) -> std::io::Result<(TcpStream, SocketAddr, TlsAcceptor)> {
    match listener {
        Some((listener, acceptor)) => listener.accept().await.map(|(stream, peer)| (stream, peer, acceptor.clone())),
        None => std::future::pending().await,
    }
}

/// Out of file descriptors and the like: a short pause, then the listener keeps serving the others.
async fn accept_failed(error: std::io::Error) {
    tracing::warn!(%error, "accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

/// The TLS handshake on an AMQPS socket, then the same connection code as plain AMQP.
async fn serve_amqps(broker: std::sync::Arc<Broker>, acceptor: TlsAcceptor, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let Some((stream, tls)) = crate::tls::accept(&acceptor, stream, peer, "AMQPS").await else { return };
    tracing::debug!(
        %peer,
        protocol = tls.protocol,
        cipher_suite = %tls.cipher_suite,
        client_certificate = tls.peer_cert_subject.as_deref().unwrap_or("none"),
        "AMQPS: TLS handshake done"
    );
    crate::connection::serve(broker, stream, peer, Some(tls)).await;
}
