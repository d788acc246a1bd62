//! A lean stream-protocol client on [`stream_codec`]: the handshake (peer properties, SASL
//! PLAIN, tune, open), request/answer by correlation id for the setup commands, then two halves
//! that read and write frames through one reused buffer each.

use bytes::BytesMut;
use std::time::{Duration, Instant};
use stream_codec::{split_frame, ClientCommand, DecodeError, ResponseCode, ServerCommand, Text, TextMap, DEFAULT_FRAME_MAX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// How much the read buffer grows by when it needs room: many small frames per socket read.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// How long the setup waits for any one answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest frame taken from a server. Not the negotiated frame_max: RabbitMQ delivers a chunk
/// whole whatever its size, and osiris gathers several publishes in a chunk, so a deliver frame
/// can exceed frame_max (1,060,917 bytes measured against a 1 MiB frame_max with 1 KiB messages).
const SERVER_FRAME_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// The heartbeat lepus perf asks for: the server's proposal, capped, so an idle consumer is
/// noticed within a minute.
const HEARTBEAT_S_MAX: u32 = 60;

/// Why a stream connection failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server sent bytes the codec refused.
    #[error("undecodable frame from the server: {0}")]
    Decode(#[from] DecodeError),
    /// The server answered a request with an error code.
    #[error("{what} refused: {code}")]
    Refused {
        /// The request.
        what: String,
        /// The server's answer.
        code: ResponseCode,
    },
    /// The server closed the connection.
    #[error("the server closed the connection: {code} {reason}")]
    Closed {
        /// Its code.
        code: ResponseCode,
        /// Its reason.
        reason: String,
    },
    /// Anything else the server did that a client cannot go on from.
    #[error("{0}")]
    Protocol(String),
}

/// `rabbitmq-stream://user:password@host:port/vhost`, as RabbitMQ's stream clients take it
/// (port 5552 when absent; user and password guest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamUrl {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// User.
    pub user: String,
    /// Password.
    pub password: String,
    /// Virtual host.
    pub vhost: String,
}

/// The stream protocol's port.
pub const STREAM_PORT: u16 = 5552;

impl StreamUrl {
    /// Parses a `rabbitmq-stream://` URL, with the AMQP URL parser for the shared syntax.
    pub fn parse(text: &str) -> Result<StreamUrl, String> {
        let Some(rest) = text.strip_prefix("rabbitmq-stream://") else {
            return Err(format!("{text:?}: --protocol stream needs a rabbitmq-stream://user:password@host:port/vhost URL"));
        };
        let url = lepus_client::AmqpUrl::parse(&format!("amqp://{rest}")).map_err(|error| error.to_string().replace("amqp://", ""))?;
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, host_port)| host_port);
        let port_given = host_port.rsplit_once(']').map_or(host_port, |(_, after)| after).contains(':');
        let port = if port_given { url.port } else { STREAM_PORT };
        Ok(StreamUrl { host: url.host, port, user: url.user, password: url.password, vhost: url.vhost })
    }

    /// `host:port`.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL with the password hidden, for reports.
    pub fn redacted(&self) -> String {
        format!("rabbitmq-stream://{}:***@{}/{}", self.user, self.address(), self.vhost.replace('/', "%2F"))
    }
}

/// Frames from the server.
pub struct StreamReader {
    stream: OwnedReadHalf,
    buffer: BytesMut,
    frame_max: u32,
}

impl StreamReader {
    /// The next command, reading the socket only when none is buffered.
    pub async fn next(&mut self) -> Result<ServerCommand, StreamError> {
        loop {
            if let Some(command) = self.buffered()? {
                return Ok(command);
            }
            self.buffer.reserve(READ_CHUNK_BYTES);
            if self.stream.read_buf(&mut self.buffer).await? == 0 {
                return Err(StreamError::Protocol("the server closed the socket".to_string()));
            }
        }
    }

    /// A command already buffered, without touching the socket. A close from the server comes
    /// back as an error, since every caller of a load generator treats it as the end.
    pub fn buffered(&mut self) -> Result<Option<ServerCommand>, StreamError> {
        let Some(frame) = split_frame(&mut self.buffer, self.frame_max)? else {
            return Ok(None);
        };
        match ServerCommand::decode(frame)? {
            ServerCommand::Close { code, reason, .. } => Err(StreamError::Closed { code, reason: reason.to_string_lossy() }),
            command => Ok(Some(command)),
        }
    }
}

/// Frames to the server, gathered in one buffer and written with one system call per flush.
pub struct StreamWriter {
    stream: OwnedWriteHalf,
    buffer: BytesMut,
    heartbeat_every: Option<Duration>,
    last_flush: Instant,
}

impl StreamWriter {
    /// The buffer, for frames written in place (see [`stream_codec::PublishFrame`]).
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buffer
    }

    /// Appends a command.
    pub fn command(&mut self, command: &ClientCommand) {
        command.encode(&mut self.buffer);
    }

    /// Appends a heartbeat when nothing was written for half the negotiated interval.
    pub fn heartbeat_if_due(&mut self) {
        if let Some(every) = self.heartbeat_every {
            if self.buffer.is_empty() && self.last_flush.elapsed() >= every {
                self.command(&ClientCommand::Heartbeat);
            }
        }
    }

    /// Bytes appended and not yet written.
    pub fn pending_bytes(&self) -> usize {
        self.buffer.len()
    }

    /// Writes everything appended so far.
    pub async fn flush(&mut self) -> Result<(), StreamError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        self.stream.write_all(&self.buffer).await?;
        self.buffer.clear();
        self.last_flush = Instant::now();
        Ok(())
    }

    /// Sends a close and the frames before it; the answer is not awaited (the caller is done).
    pub async fn close(mut self) {
        self.command(&ClientCommand::Close { correlation_id: u32::MAX, code: ResponseCode::Ok.as_u16(), reason: Text::from("Goodbye") });
        let _ = self.flush().await;
        let _ = self.stream.shutdown().await;
    }
}

/// An open connection in its setup phase: requests wait for their answers.
pub struct StreamConnection {
    reader: StreamReader,
    writer: StreamWriter,
    next_correlation_id: u32,
    server_properties: TextMap,
    /// The negotiated frame_max (0: none).
    pub frame_max: u32,
}

impl StreamConnection {
    /// Connects, authenticates with PLAIN, tunes and opens the URL's virtual host.
    pub async fn open(url: &StreamUrl, connection_name: &str) -> Result<StreamConnection, StreamError> {
        let socket = TcpStream::connect(url.address()).await?;
        socket.set_nodelay(true)?;
        let (read_half, write_half) = socket.into_split();
        let reader =
            StreamReader { stream: read_half, buffer: BytesMut::with_capacity(READ_CHUNK_BYTES), frame_max: SERVER_FRAME_BYTES_MAX };
        let writer = StreamWriter {
            stream: write_half,
            buffer: BytesMut::with_capacity(READ_CHUNK_BYTES),
            heartbeat_every: None,
            last_flush: Instant::now(),
        };
        let mut connection = StreamConnection { reader, writer, next_correlation_id: 1, server_properties: TextMap::new(), frame_max: 0 };
        tokio::time::timeout(ANSWER_TIMEOUT, connection.handshake(url, connection_name))
            .await
            .map_err(|_| StreamError::Protocol(format!("no handshake with {} within {ANSWER_TIMEOUT:?}", url.address())))??;
        Ok(connection)
    }

    async fn handshake(&mut self, url: &StreamUrl, connection_name: &str) -> Result<(), StreamError> {
        let properties: TextMap = [("connection_name", connection_name), ("product", "lepus perf"), ("version", env!("CARGO_PKG_VERSION"))]
            .into_iter()
            .map(|(key, value)| (Text::from(key), Text::from(value)))
            .collect();
        let answer = self.request("peer properties", |correlation_id| ClientCommand::PeerProperties { correlation_id, properties }).await?;
        if let ServerCommand::PeerPropertiesResponse { properties, .. } = answer {
            self.server_properties = properties;
        }
        let answer = self.request("SASL handshake", |correlation_id| ClientCommand::SaslHandshake { correlation_id }).await?;
        if let ServerCommand::SaslHandshakeResponse { mechanisms, .. } = answer {
            if !mechanisms.iter().any(|mechanism| mechanism.as_bytes() == b"PLAIN") {
                return Err(StreamError::Protocol(format!("the server offers no PLAIN mechanism: {mechanisms:?}")));
            }
        }
        let response = format!("\0{}\0{}", url.user, url.password).into_bytes().into();
        self.request("authentication", |correlation_id| ClientCommand::SaslAuthenticate {
            correlation_id,
            mechanism: Text::from("PLAIN"),
            response,
        })
        .await?;
        // The server's tune follows a successful authentication.
        let (frame_max, heartbeat_s) = loop {
            match self.reader.next().await? {
                ServerCommand::Tune { frame_max, heartbeat_s } => break (frame_max, heartbeat_s),
                ServerCommand::Heartbeat => continue,
                other => return Err(StreamError::Protocol(format!("expected a tune, got {other:?}"))),
            }
        };
        let frame_max = if frame_max == 0 { DEFAULT_FRAME_MAX } else { frame_max.min(DEFAULT_FRAME_MAX) };
        let heartbeat_s = heartbeat_s.min(HEARTBEAT_S_MAX);
        self.writer.command(&ClientCommand::Tune { frame_max, heartbeat_s });
        self.frame_max = frame_max;
        // Half the interval, as RabbitMQ's clients send them, so one late tick is no miss.
        self.writer.heartbeat_every = (heartbeat_s > 0).then(|| Duration::from_millis(u64::from(heartbeat_s) * 500));
        let virtual_host = Text::from(url.vhost.as_str());
        self.request("open", |correlation_id| ClientCommand::Open { correlation_id, virtual_host }).await?;
        Ok(())
    }

    /// Sends a request and waits for its answer; an answer with an error code is an error.
    pub async fn request(&mut self, what: &str, build: impl FnOnce(u32) -> ClientCommand) -> Result<ServerCommand, StreamError> {
        let answer = self.ask(build).await?;
        match answer_code(&answer) {
            Some(code) if code != ResponseCode::Ok => Err(StreamError::Refused { what: what.to_string(), code }),
            _ => Ok(answer),
        }
    }

    /// Sends a request and returns its answer, whatever its code.
    pub async fn ask(&mut self, build: impl FnOnce(u32) -> ClientCommand) -> Result<ServerCommand, StreamError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        self.writer.command(&build(correlation_id));
        self.writer.flush().await?;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let next = tokio::time::timeout_at(deadline.into(), self.reader.next()).await;
            let command = next.map_err(|_| StreamError::Protocol(format!("no answer within {ANSWER_TIMEOUT:?}")))??;
            if answer_correlation_id(&command) == Some(correlation_id) {
                return Ok(command);
            }
        }
    }

    /// The server's product and version, as its peer properties give them.
    pub fn server_product(&self) -> String {
        let property = |key: &str| stream_codec::get(&self.server_properties, key).map(Text::to_string_lossy).unwrap_or_default();
        format!("{} {}", property("product"), property("version")).trim().to_string()
    }

    /// The two halves, for the run.
    pub fn split(self) -> (StreamReader, StreamWriter) {
        (self.reader, self.writer)
    }
}

fn answer_correlation_id(command: &ServerCommand) -> Option<u32> {
    use ServerCommand::*;
    match command {
        Response { correlation_id, .. }
        | QueryPublisherSequenceResponse { correlation_id, .. }
        | QueryOffsetResponse { correlation_id, .. }
        | MetadataResponse { correlation_id, .. }
        | PeerPropertiesResponse { correlation_id, .. }
        | SaslHandshakeResponse { correlation_id, .. }
        | SaslAuthenticateResponse { correlation_id, .. }
        | OpenResponse { correlation_id, .. }
        | CloseResponse { correlation_id, .. }
        | RouteResponse { correlation_id, .. }
        | PartitionsResponse { correlation_id, .. } => Some(*correlation_id),
        _ => None,
    }
}

fn answer_code(command: &ServerCommand) -> Option<ResponseCode> {
    use ServerCommand::*;
    match command {
        Response { code, .. }
        | QueryPublisherSequenceResponse { code, .. }
        | QueryOffsetResponse { code, .. }
        | PeerPropertiesResponse { code, .. }
        | SaslHandshakeResponse { code, .. }
        | SaslAuthenticateResponse { code, .. }
        | OpenResponse { code, .. }
        | CloseResponse { code, .. } => Some(*code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_urls() {
        let url = StreamUrl::parse("rabbitmq-stream://bob:s%40cret@127.0.0.1:5553/%2f").unwrap();
        assert_eq!(
            (url.host.as_str(), url.port, url.user.as_str(), url.password.as_str(), url.vhost.as_str()),
            ("127.0.0.1", 5553, "bob", "s@cret", "/")
        );
        let url = StreamUrl::parse("rabbitmq-stream://localhost").unwrap();
        assert_eq!((url.port, url.user.as_str(), url.vhost.as_str()), (STREAM_PORT, "guest", "/"));
        assert_eq!(StreamUrl::parse("rabbitmq-stream://[::1]/v").unwrap().port, STREAM_PORT);
        assert_eq!(StreamUrl::parse("rabbitmq-stream://[::1]:7/v").unwrap().port, 7);
        assert!(StreamUrl::parse("amqp://localhost").is_err());
        assert_eq!(url_redacted(), "rabbitmq-stream://guest:***@h:1/%2F");
    }

    fn url_redacted() -> String {
        StreamUrl::parse("rabbitmq-stream://guest:guest@h:1/%2f").unwrap().redacted()
    }
}
