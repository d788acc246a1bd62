//! TLS for the AMQPS and HTTPS listeners (rustls with the ring provider, TLS 1.2 and 1.3): loading
//! the PEM files the settings name into server configurations, and the handshake, bounded in time.

mod names;

use crate::config::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ProtocolVersion, RootCertStore};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has to complete the TLS handshake, so one that connects and says nothing
/// does not hold a task and a socket forever (RabbitMQ's ssl_handshake_timeout is 5 s; the AMQP
/// handshake timeout that follows is 10 s).
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// The acceptors of the two TLS listeners: they share the certificate, but only AMQPS asks for
/// client certificates (HTTPS clients log in with HTTP basic auth, and a browser asked for a
/// certificate it does not have would fail), and only HTTPS offers ALPN `http/1.1`.
#[derive(Clone)]
pub struct TlsAcceptors {
    /// For the AMQPS listener.
    pub amqp: TlsAcceptor,
    /// For the management API's HTTPS listener.
    pub https: TlsAcceptor,
}

/// What a TLS connection negotiated, for logs and the management API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsInfo {
    /// The protocol version as RabbitMQ names it (`tlsv1.3`, `tlsv1.2`).
    pub protocol: &'static str,
    /// The cipher suite as rustls names it (`TLS13_AES_256_GCM_SHA384`).
    pub cipher_suite: String,
    /// The client certificate's subject, RFC 4514 (`CN=client,O=Example`), when the client presented
    /// one (and it verified: others fail the handshake).
    pub peer_cert_subject: Option<String>,
    /// The client certificate's issuer, likewise.
    pub peer_cert_issuer: Option<String>,
    /// The port the client connected to, for the connection's name ("client -> server").
    pub listener_port: u16,
}

/// Builds the TLS acceptors from the settings, or None when no certificate is configured. Every
/// problem with the files (unreadable, not PEM, no key, a key that does not match the certificate)
/// is an error that names the file, so the broker refuses to start rather than start without TLS.
pub fn load(config: &ServerConfig) -> Result<Option<TlsAcceptors>, TlsConfigError> {
    let (Some(cert_file), Some(key_file)) = (&config.tls_cert_file, &config.tls_key_file) else {
        return Ok(None);
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certificates = read_certificates(cert_file, "tls_cert_file")?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|error| pem_error("tls_key_file", key_file, "private key (unencrypted PKCS#8, PKCS#1 or SEC1)", error))?;
    let roots = match &config.tls_ca_file {
        Some(ca_file) => Some(read_roots(ca_file)?),
        None => None,
    };
    let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
    let builder = || {
        rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(TlsConfigError::ProtocolVersions)
    };
    let with_key = |builder: rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>| {
        builder.with_single_cert(certificates.clone(), key.clone_key()).map_err(|source| TlsConfigError::KeyMismatch {
            key_file: key_file.clone(),
            cert_file: cert_file.clone(),
            source,
        })
    };
    let amqp = match (&roots, config.tls_verify_peer) {
        (Some(roots), true) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
            // Without fail_if_no_peer_cert a client may still connect without a certificate, as
            // with RabbitMQ's verify_peer alone; one it does present must verify.
            let verifier = if config.tls_fail_if_no_peer_cert { verifier } else { verifier.allow_unauthenticated() };
            let verifier = verifier.build().map_err(TlsConfigError::ClientVerifier)?;
            with_key(builder()?.with_client_cert_verifier(verifier))?
        }
        _ => with_key(builder()?.with_no_client_auth())?,
    };
    let mut https = with_key(builder()?.with_no_client_auth())?;
    https.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(TlsAcceptors { amqp: TlsAcceptor::from(Arc::new(amqp)), https: TlsAcceptor::from(Arc::new(https)) }))
}

/// Why the TLS settings cannot be used; each names the setting and the file it concerns, so the
/// broker refuses to start with a message the operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// The file holds no PEM item of the kind the setting needs.
    #[error("{setting} {}: no PEM {what} found in it", path.display())]
    NoPemItem {
        /// The setting that names the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What was looked for.
        what: &'static str,
    },
    /// The file cannot be read, or is not PEM.
    #[error("{setting} {}: {source}", path.display())]
    Pem {
        /// The setting that names the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: rustls::pki_types::pem::Error,
    },
    /// The TLS library refuses the protocol versions.
    #[error("TLS protocol versions: {0}")]
    ProtocolVersions(#[source] rustls::Error),
    /// The private key is not the certificate's.
    #[error("tls_key_file {} does not fit tls_cert_file {}: {source}", key_file.display(), cert_file.display())]
    KeyMismatch {
        /// The key file.
        key_file: PathBuf,
        /// The certificate file.
        cert_file: PathBuf,
        /// The error.
        source: rustls::Error,
    },
    /// The CA certificates make no client certificate verifier.
    #[error("tls_ca_file: client certificate verifier: {0}")]
    ClientVerifier(#[source] rustls::server::VerifierBuilderError),
    /// A CA certificate is unusable.
    #[error("tls_ca_file {}: {source}", path.display())]
    CaCertificate {
        /// The CA file.
        path: PathBuf,
        /// The error.
        source: rustls::Error,
    },
}

fn pem_error(setting: &'static str, path: &Path, what: &'static str, error: rustls::pki_types::pem::Error) -> TlsConfigError {
    match error {
        rustls::pki_types::pem::Error::NoItemsFound => TlsConfigError::NoPemItem { setting, path: path.to_path_buf(), what },
        source => TlsConfigError::Pem { setting, path: path.to_path_buf(), source },
    }
}

fn read_certificates(path: &Path, setting: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| pem_error(setting, path, "certificate", error))?;
    if certificates.is_empty() {
        return Err(TlsConfigError::NoPemItem { setting, path: path.to_path_buf(), what: "certificate (BEGIN CERTIFICATE)" });
    }
    Ok(certificates)
}

fn read_roots(path: &Path) -> Result<Arc<RootCertStore>, TlsConfigError> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path, "tls_ca_file")? {
        roots.add(certificate).map_err(|source| TlsConfigError::CaCertificate { path: path.to_path_buf(), source })?;
    }
    Ok(Arc::new(roots))
}

/// Runs the server side of the TLS handshake on an accepted socket. A failure (a client that
/// speaks plain AMQP or HTTP to the TLS port, a certificate that does not verify, a client that
/// stays silent) is logged, and only this socket closes.
pub async fn accept(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    listener: &'static str,
) -> Option<(TlsStream<TcpStream>, TlsInfo)> {
    let handshake = tokio::time::timeout(Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS), acceptor.accept(stream)).await;
    match handshake {
        Ok(Ok(stream)) => {
            let session = stream.get_ref().1;
            let protocol = match session.protocol_version() {
                Some(ProtocolVersion::TLSv1_3) => "tlsv1.3",
                Some(ProtocolVersion::TLSv1_2) => "tlsv1.2",
                _ => "unknown",
            };
            let cipher_suite = session.negotiated_cipher_suite().map(|suite| format!("{:?}", suite.suite())).unwrap_or_default();
            let names =
                session.peer_certificates().and_then(|certificates| certificates.first()).and_then(|leaf| names::subject_and_issuer(leaf));
            let (peer_cert_subject, peer_cert_issuer) = names.map_or((None, None), |(subject, issuer)| (Some(subject), Some(issuer)));
            let listener_port = stream.get_ref().0.local_addr().map_or(0, |address| address.port());
            Some((stream, TlsInfo { protocol, cipher_suite, peer_cert_subject, peer_cert_issuer, listener_port }))
        }
        Ok(Err(error)) => {
            tracing::warn!(%peer, %error, "{listener}: TLS handshake failed; closing");
            None
        }
        Err(_) => {
            tracing::info!(%peer, timeout_ms = TLS_HANDSHAKE_TIMEOUT_MS, "{listener}: TLS handshake not completed in time; closing");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(cert_file: &Path, key_file: &Path) -> ServerConfig {
        ServerConfig { tls_cert_file: Some(cert_file.to_path_buf()), tls_key_file: Some(key_file.to_path_buf()), ..ServerConfig::default() }
    }

    #[test]
    fn no_certificate_means_no_tls_and_bad_files_are_errors_that_name_them() {
        assert!(matches!(load(&ServerConfig::default()), Ok(None)));
        let directory = std::env::temp_dir().join(format!("lepus-tls-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("temp dir");
        let missing = directory.join("missing.pem");
        let not_pem = directory.join("not.pem");
        std::fs::write(&not_pem, "hello\n").expect("write");
        let error = load(&config_with(&missing, &not_pem)).err().map(|error| error.to_string()).unwrap_or_default();
        assert!(error.starts_with("tls_cert_file ") && error.contains("missing.pem"), "{error}");
        let error = load(&config_with(&not_pem, &not_pem)).err().map(|error| error.to_string()).unwrap_or_default();
        assert!(error.contains("no PEM certificate"), "{error}");
        let _ = std::fs::remove_dir_all(&directory);
    }
}
