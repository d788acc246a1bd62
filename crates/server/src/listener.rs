//! The listeners: AMQP (plain, and TLS when a certificate is configured), the management API
//! (HTTP, HTTPS) and metrics. Every configured listener is bound before storage is touched, and
//! one that cannot be bound stops the start: a broker that runs on without the listener its
//! operator configured (its management API, say) hides the failure until someone needs it.

use crate::broker::Broker;
use crate::config::ServerConfig;
use crate::tls::TlsAcceptors;
use std::net::SocketAddr;
use std::sync::Arc;
use storage::data_dir_lock::{DataDirLock, DataDirLockError};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// How long a graceful shutdown waits for clients to answer connection.close.
pub const SHUTDOWN_CONNECTIONS_WAIT_S: u64 = 5;

/// Why `lepus server` could not start (or, for `Signal`, keep running).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The async runtime could not be built.
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The TLS certificate or key files are unusable (the message names the file).
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsConfigError),
    /// Another process holds the data directory, or its lock file cannot be written.
    #[error(transparent)]
    DataDirectory(#[from] DataDirLockError),
    /// A configured listener's address cannot be bound (taken, not permitted, not local).
    #[error("cannot listen on {address} for {listener} (--{}): {source}", listener.setting())]
    Listen {
        /// Which listener.
        listener: ListenerKind,
        /// The address it was to listen on.
        address: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
    /// Opening the data directory or recovering from it failed (the message names the file).
    #[error(transparent)]
    Recovery(#[from] crate::broker::RecoveryError),
    /// The SIGTERM handler could not be installed.
    #[error("handling SIGTERM: {0}")]
    Signal(#[source] std::io::Error),
    /// The cluster links or membership could not start (the message says why).
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterStartError),
}

/// The listeners a broker may serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    /// AMQP 0-9-1.
    Amqp,
    /// AMQP 0-9-1 over TLS.
    Amqps,
    /// The management API over HTTP.
    Http,
    /// The management API over HTTPS.
    Https,
    /// Prometheus metrics.
    Metrics,
    /// The RabbitMQ Stream protocol.
    Stream,
}

impl ListenerKind {
    /// The setting (flag without `--`, file key with `_`) that chooses its port.
    pub fn setting(self) -> &'static str {
        match self {
            ListenerKind::Amqp => "amqp-port",
            ListenerKind::Amqps => "amqps-port",
            ListenerKind::Http => "http-port",
            ListenerKind::Https => "https-port",
            ListenerKind::Metrics => "metrics-port",
            ListenerKind::Stream => "stream-port",
        }
    }
}

impl std::fmt::Display for ListenerKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            ListenerKind::Amqp => "AMQP",
            ListenerKind::Amqps => "AMQPS (AMQP over TLS)",
            ListenerKind::Http => "the management HTTP API",
            ListenerKind::Https => "the management HTTPS API",
            ListenerKind::Metrics => "Prometheus metrics",
            ListenerKind::Stream => "the RabbitMQ Stream protocol",
        })
    }
}

/// Every configured listener, bound and not yet accepting.
struct Listeners {
    amqp: TcpListener,
    amqps: Option<(TcpListener, TlsAcceptor)>,
    http: Option<TcpListener>,
    https: Option<(TcpListener, TlsAcceptor)>,
    metrics: Option<TcpListener>,
    stream: Option<TcpListener>,
}

impl Listeners {
    /// Binds every listener the settings turn on; the first that fails stops the start. A port of
    /// 0 turns a listener off (AMQP's is always on: 0 there asks the kernel for a free port).
    async fn bind_all(config: &ServerConfig, tls: Option<&TlsAcceptors>) -> Result<Listeners, StartError> {
        let amqp = bind(config, ListenerKind::Amqp, config.amqp_port).await?;
        let (amqps_port, https_port) = if tls.is_some() { (config.amqps_port, config.https_port) } else { (0, 0) };
        let amqps = bind_optional(config, ListenerKind::Amqps, amqps_port).await?;
        let http = bind_optional(config, ListenerKind::Http, config.http_port).await?;
        let https = bind_optional(config, ListenerKind::Https, https_port).await?;
        let metrics = bind_optional(config, ListenerKind::Metrics, config.metrics_port).await?;
        let stream = bind_optional(config, ListenerKind::Stream, config.stream_port).await?;
        Ok(Listeners {
            amqp,
            amqps: amqps.zip(tls.map(|tls| tls.amqp.clone())),
            http,
            https: https.zip(tls.map(|tls| tls.https.clone())),
            metrics,
            stream,
        })
    }
}

async fn bind(config: &ServerConfig, listener: ListenerKind, port: u16) -> Result<TcpListener, StartError> {
    let address = SocketAddr::new(config.bind_address, port);
    TcpListener::bind(address).await.map_err(|source| StartError::Listen { listener, address, source })
}

async fn bind_optional(config: &ServerConfig, listener: ListenerKind, port: u16) -> Result<Option<TcpListener>, StartError> {
    if port == 0 {
        return Ok(None);
    }
    bind(config, listener, port).await.map(Some)
}

/// Locks and opens the data directory, listens, and serves until SIGINT or SIGTERM.
pub fn run(config: ServerConfig) -> Result<(), StartError> {
    // Bad TLS files stop the start here, before the data directory is locked or a port taken.
    let tls = crate::tls::load(&config)?;
    // Taken before anything in the directory is read, and held until this function returns
    // (declared before the runtime, so dropped after it and after the final flush).
    let _data_dir_lock = DataDirLock::acquire(&config.data_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(StartError::Runtime)?;
    runtime.block_on(async move {
        let listeners = Listeners::bind_all(&config, tls.as_ref()).await?;
        let broker = Broker::open(config.clone())?;
        if config.cluster.enabled() {
            // Sets `broker.cluster` itself, before its metadata group runs.
            crate::cluster::Cluster::start(&broker)?;
        }
        serve(broker, listeners).await
    })
}

/// Serves every bound listener until SIGINT or SIGTERM, then shuts down.
async fn serve(broker: Arc<Broker>, listeners: Listeners) -> Result<(), StartError> {
    let Listeners { amqp, amqps, http, https, metrics, stream } = listeners;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(StartError::Signal)?;
    tokio::spawn(crate::alarms::monitor(broker.clone()));
    tokio::spawn(crate::queue_expiry::run(broker.clone()));
    if http.is_some() || https.is_some() {
        let app = crate::management::app(broker.clone());
        if let Some(socket) = http {
            log_serving(&socket, ListenerKind::Http);
            tokio::spawn(crate::management::serve(app.clone(), socket));
        }
        if let Some((socket, acceptor)) = https {
            log_serving(&socket, ListenerKind::Https);
            tokio::spawn(crate::management::serve_tls(app, socket, acceptor));
        }
    }
    if let Some(socket) = metrics {
        log_serving(&socket, ListenerKind::Metrics);
        tokio::spawn(crate::metrics::serve(broker.clone(), socket));
    }
    if let Some(socket) = stream {
        log_serving(&socket, ListenerKind::Stream);
        tokio::spawn(crate::stream_protocol::serve(broker.clone(), socket));
    }
    if let Some((socket, _)) = &amqps {
        log_serving(socket, ListenerKind::Amqps);
    }
    log_serving(&amqp, ListenerKind::Amqp);
    tracing::info!(data_dir = %broker.config.data_dir.display(), "Lepus is accepting AMQP 0-9-1 connections");
    let connection_slots = Arc::new(Semaphore::new(broker.config.connection_max.min(Semaphore::MAX_PERMITS)));
    loop {
        // A slot first, then a socket: at connection_max the listeners stop accepting, and new
        // clients wait in the kernel's backlog until a connection closes, as with RabbitMQ's
        // connection_max (which never answers them with an AMQP error).
        if connection_slots.available_permits() == 0 {
            tracing::warn!(
                connection_max = broker.config.connection_max,
                "connection_max reached: not accepting until a connection closes"
            );
        }
        let slot = tokio::select! {
            slot = connection_slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_closed) => break,
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        };
        tokio::select! {
            accepted = amqp.accept() => serve_accepted(&broker, accepted.map(|(stream, peer)| (stream, peer, None)), slot).await,
            accepted = accept_amqps(amqps.as_ref()) => {
                serve_accepted(&broker, accepted.map(|(stream, peer, acceptor)| (stream, peer, Some(acceptor))), slot).await;
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
    }
    drop(amqp);
    drop(amqps);
    shut_down(&broker).await;
    Ok(())
}

fn log_serving(socket: &TcpListener, listener: ListenerKind) {
    match socket.local_addr() {
        Ok(address) => tracing::info!(%address, "serving {listener}"),
        Err(error) => tracing::info!(%error, "serving {listener} (its address is unknown)"),
    }
}

/// Closes every connection (waiting a bounded time for clients to answer) and flushes every log.
async fn shut_down(broker: &Broker) {
    tracing::info!(connections = broker.connection_count(), "shutting down: closing connections with 320 CONNECTION_FORCED");
    broker.close_all_connections();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(SHUTDOWN_CONNECTIONS_WAIT_S);
    while broker.connection_count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    broker.flush_all();
}

/// Accepts from the AMQPS listener, or waits forever when there is none (TLS not configured).
async fn accept_amqps(listener: Option<&(TcpListener, TlsAcceptor)>) -> std::io::Result<(TcpStream, SocketAddr, TlsAcceptor)> {
    match listener {
        Some((listener, acceptor)) => listener.accept().await.map(|(stream, peer)| (stream, peer, acceptor.clone())),
        None => std::future::pending().await,
    }
}

/// Serves an accepted socket (after its TLS handshake when it came with an acceptor) in its own
/// task, which holds the connection's slot until the connection ends.
async fn serve_accepted(
    broker: &Arc<Broker>,
    accepted: std::io::Result<(TcpStream, SocketAddr, Option<TlsAcceptor>)>,
    slot: OwnedSemaphorePermit,
) {
    match accepted {
        Ok((stream, peer, acceptor)) => {
            let broker = broker.clone();
            tokio::spawn(async move {
                match acceptor {
                    Some(acceptor) => serve_amqps(broker, acceptor, stream, peer).await,
                    None => {
                        let _ = stream.set_nodelay(true);
                        crate::connection::serve(broker, stream, peer, None).await;
                    }
                }
                drop(slot);
            });
        }
        Err(error) => accept_failed(error).await,
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
