//! Opening a connection (handshake, login, tuning) and the synchronous set-up calls.

use crate::io::{FrameReader, FrameWriter};
use crate::{AmqpUrl, ClientError};
use amqp_codec::{
    BasicConsume, BasicQos, ChannelOpen, ConfirmSelect, ConnectionClose, ConnectionOpen, ConnectionStartOk, ConnectionTuneOk, DecodeError,
    ExchangeDeclare, ExchangeDelete, FieldTable, FieldValue, FramePayload, LongStr, Method, QueueBind, QueueDeclare, QueueDelete,
    QueuePurge, ShortStr, TxSelect, PROTOCOL_HEADER,
};
use bytes::{Bytes, BytesMut};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// How a connection is opened.
#[derive(Debug, Clone)]
pub struct ConnectionOptions {
    /// Shown by the broker's management tools (`connection_name` client property).
    pub connection_name: String,
    /// Limit for TCP connect plus the whole AMQP handshake.
    pub open_timeout: Duration,
    /// Limit for each synchronous set-up call (declare, bind, ...).
    pub call_timeout: Duration,
    /// The largest frame we accept; the broker's offer wins when it is smaller.
    pub frame_max_bytes: u32,
}

impl Default for ConnectionOptions {
    fn default() -> ConnectionOptions {
        ConnectionOptions {
            connection_name: "lepus-perf".to_string(),
            open_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            frame_max_bytes: 131_072,
        }
    }
}

/// What `queue.declare-ok` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDeclared {
    /// The queue name (the broker's choice for a server-named queue).
    pub queue: String,
    /// Messages ready in the queue.
    pub message_count: u32,
    /// Consumers on the queue.
    pub consumer_count: u32,
}

/// An open AMQP connection, used for set-up calls and then [`Connection::split`] for the load.
pub struct Connection {
    reader: FrameReader,
    writer: FrameWriter,
    frame_max: u32,
    heartbeat_s: u16,
    call_timeout: Duration,
    server_product: String,
}

impl Connection {
    /// Connects, logs in with PLAIN and opens the URL's virtual host.
    pub async fn open(url: &AmqpUrl, options: &ConnectionOptions) -> Result<Connection, ClientError> {
        let address = url.address();
        let limit = options.open_timeout;
        match tokio::time::timeout(limit, Self::open_inner(url, options, &address)).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Timeout { what: format!("opening an AMQP connection to {address}"), timeout_s: limit.as_secs() }),
        }
    }

    async fn open_inner(url: &AmqpUrl, options: &ConnectionOptions, address: &str) -> Result<Connection, ClientError> {
        let stream = TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(|source| ClientError::Connect { address: address.to_string(), source })?;
        // Small frames (confirms, acks) must not wait for Nagle.
        stream.set_nodelay(true)?;
        let (read_half, mut write_half) = stream.into_split();
        write_half.write_all(PROTOCOL_HEADER).await?;
        // Handshake frames are small; frame_max 0 here would let a hostile size through.
        let reader = FrameReader::new(read_half, BytesMut::with_capacity(4096), 131_072);
        let writer = FrameWriter::new(write_half, options.frame_max_bytes);
        let mut connection = Connection {
            reader,
            writer,
            frame_max: options.frame_max_bytes,
            heartbeat_s: 0,
            call_timeout: options.call_timeout,
            server_product: String::new(),
        };
        let start = match connection.reader.next_frame().await {
            Ok(frame) => frame,
            Err(ClientError::Decode(DecodeError::UnknownFrameType(b'A'))) => {
                return Err(ClientError::NotAmqp {
                    address: address.to_string(),
                    detail: "it answered with a different AMQP protocol version".to_string(),
                })
            }
            Err(ClientError::Decode(error)) => {
                return Err(ClientError::NotAmqp { address: address.to_string(), detail: error.to_string() })
            }
            Err(error) => return Err(error),
        };
        match start.payload {
            FramePayload::Method(Method::ConnectionStart(start)) => {
                let text = |key: &str| start.server_properties.get(key).and_then(FieldValue::as_text).unwrap_or_default();
                connection.server_product = format!("{} {}", text("product"), text("version")).trim().to_string();
            }
            other => {
                return Err(ClientError::NotAmqp {
                    address: address.to_string(),
                    detail: format!("expected connection.start, got {other:?}"),
                })
            }
        }
        let mut response = Vec::with_capacity(url.user.len() + url.password.len() + 2);
        response.push(0);
        response.extend_from_slice(url.user.as_bytes());
        response.push(0);
        response.extend_from_slice(url.password.as_bytes());
        connection.writer.method(
            0,
            &Method::ConnectionStartOk(ConnectionStartOk {
                client_properties: client_properties(&options.connection_name),
                mechanism: ShortStr::from_static("PLAIN"),
                response: LongStr(Bytes::from(response)),
                locale: ShortStr::from_static("en_US"),
            }),
        );
        connection.writer.flush().await?;
        let refused = |text: String| ClientError::AccessRefused { user: url.user.clone(), text };
        let tune = match connection.reader.next_frame().await {
            Ok(frame) => frame,
            Err(ClientError::ConnectionClosed { code: 403, text }) => return Err(refused(text)),
            // Brokers that do not know the authentication_failure_close capability just hang up.
            Err(ClientError::BrokerGone) => return Err(refused("the broker closed the socket during login".to_string())),
            Err(error) => return Err(error),
        };
        let FramePayload::Method(Method::ConnectionTune(tune)) = tune.payload else {
            return Err(ClientError::Protocol(format!("expected connection.tune, got {:?}", tune.payload)));
        };
        let frame_max = match (tune.frame_max, options.frame_max_bytes) {
            (0, ours) => ours,
            (theirs, ours) => theirs.min(ours),
        };
        // The client's choice is final in 0-9-1; take the smaller non-zero of the two.
        let heartbeat_s = match (tune.heartbeat, url.heartbeat_s) {
            (_, 0) => 0,
            (0, ours) => ours,
            (theirs, ours) => theirs.min(ours),
        };
        connection
            .writer
            .method(0, &Method::ConnectionTuneOk(ConnectionTuneOk { channel_max: tune.channel_max, frame_max, heartbeat: heartbeat_s }));
        connection.writer.set_tuning(frame_max, heartbeat_s);
        connection.reader.set_frame_max(frame_max);
        connection.reader.set_heartbeat(heartbeat_s);
        connection.frame_max = frame_max;
        connection.heartbeat_s = heartbeat_s;
        let open =
            Method::ConnectionOpen(ConnectionOpen { virtual_host: ShortStr::truncating(url.vhost.clone()), ..ConnectionOpen::default() });
        match connection.call(0, open).await? {
            Method::ConnectionOpenOk(_) => Ok(connection),
            other => Err(ClientError::Protocol(format!("expected connection.open-ok, got {}", other.name()))),
        }
    }

    /// The broker's `product` and `version` server properties, such as `RabbitMQ 3.10.8`.
    pub fn server_product(&self) -> &str {
        &self.server_product
    }

    /// The negotiated maximum frame size in bytes.
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// The negotiated heartbeat interval in seconds (0 = off).
    pub fn heartbeat_s(&self) -> u16 {
        self.heartbeat_s
    }

    /// Sends a synchronous method and returns the next method the broker sends on that channel.
    /// Heartbeats are skipped; a close from the broker is an error with its reply code.
    pub async fn call(&mut self, channel: u16, method: Method) -> Result<Method, ClientError> {
        let name = method.name();
        self.writer.method(channel, &method);
        self.writer.flush().await?;
        let limit = self.call_timeout;
        let wait = async {
            loop {
                let frame = self.reader.next_frame().await?;
                match frame.payload {
                    FramePayload::Method(reply) if frame.channel == channel => return Ok(reply),
                    FramePayload::Heartbeat => continue,
                    // Anything else (a stray delivery on another channel) is not ours to handle.
                    _ => continue,
                }
            }
        };
        match tokio::time::timeout(limit, wait).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Timeout { what: format!("waiting for the reply to {name}"), timeout_s: limit.as_secs() }),
        }
    }

    async fn expect(&mut self, channel: u16, method: Method, matches: fn(&Method) -> bool) -> Result<Method, ClientError> {
        let name = method.name();
        let reply = self.call(channel, method).await?;
        if matches(&reply) {
            Ok(reply)
        } else {
            Err(ClientError::Protocol(format!("unexpected {} in reply to {name}", reply.name())))
        }
    }

    /// Opens a channel.
    pub async fn channel_open(&mut self, channel: u16) -> Result<(), ClientError> {
        let method = Method::ChannelOpen(ChannelOpen::default());
        self.expect(channel, method, |m| matches!(m, Method::ChannelOpenOk(_))).await.map(drop)
    }

    /// Declares an exchange (`kind`: direct, fanout, topic, headers).
    pub async fn exchange_declare(&mut self, channel: u16, name: &str, kind: &str, durable: bool) -> Result<(), ClientError> {
        let method = Method::ExchangeDeclare(ExchangeDeclare {
            exchange: ShortStr::truncating(name),
            exchange_type: ShortStr::truncating(kind),
            durable,
            ..ExchangeDeclare::default()
        });
        self.expect(channel, method, |m| matches!(m, Method::ExchangeDeclareOk(_))).await.map(drop)
    }

    /// Deletes an exchange.
    pub async fn exchange_delete(&mut self, channel: u16, name: &str) -> Result<(), ClientError> {
        let method = Method::ExchangeDelete(ExchangeDelete { exchange: ShortStr::truncating(name), ..ExchangeDelete::default() });
        self.expect(channel, method, |m| matches!(m, Method::ExchangeDeleteOk(_))).await.map(drop)
    }

    /// Declares a queue; an empty name asks the broker to choose one.
    pub async fn queue_declare(
        &mut self,
        channel: u16,
        name: &str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
    ) -> Result<QueueDeclared, ClientError> {
        self.queue_declare_with_arguments(channel, name, durable, exclusive, auto_delete, FieldTable::new()).await
    }

    /// Declares a queue with arguments (`x-queue-type`, limits, ...).
    pub async fn queue_declare_with_arguments(
        &mut self,
        channel: u16,
        name: &str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> Result<QueueDeclared, ClientError> {
        let method = Method::QueueDeclare(QueueDeclare {
            queue: ShortStr::truncating(name),
            durable,
            exclusive,
            auto_delete,
            arguments,
            ..QueueDeclare::default()
        });
        match self.call(channel, method).await? {
            Method::QueueDeclareOk(ok) => {
                Ok(QueueDeclared { queue: ok.queue.to_string_lossy(), message_count: ok.message_count, consumer_count: ok.consumer_count })
            }
            other => Err(ClientError::Protocol(format!("unexpected {} in reply to queue.declare", other.name()))),
        }
    }

    /// Binds a queue to an exchange.
    pub async fn queue_bind(&mut self, channel: u16, queue: &str, exchange: &str, routing_key: &str) -> Result<(), ClientError> {
        let method = Method::QueueBind(QueueBind {
            queue: ShortStr::truncating(queue),
            exchange: ShortStr::truncating(exchange),
            routing_key: ShortStr::truncating(routing_key),
            ..QueueBind::default()
        });
        self.expect(channel, method, |m| matches!(m, Method::QueueBindOk(_))).await.map(drop)
    }

    /// Deletes a queue and returns how many messages it held.
    pub async fn queue_delete(&mut self, channel: u16, name: &str) -> Result<u32, ClientError> {
        let method = Method::QueueDelete(QueueDelete { queue: ShortStr::truncating(name), ..QueueDelete::default() });
        match self.call(channel, method).await? {
            Method::QueueDeleteOk(ok) => Ok(ok.message_count),
            other => Err(ClientError::Protocol(format!("unexpected {} in reply to queue.delete", other.name()))),
        }
    }

    /// Purges a queue and returns how many messages it dropped.
    pub async fn queue_purge(&mut self, channel: u16, name: &str) -> Result<u32, ClientError> {
        let method = Method::QueuePurge(QueuePurge { queue: ShortStr::truncating(name), ..QueuePurge::default() });
        match self.call(channel, method).await? {
            Method::QueuePurgeOk(ok) => Ok(ok.message_count),
            other => Err(ClientError::Protocol(format!("unexpected {} in reply to queue.purge", other.name()))),
        }
    }

    /// Sets the channel's prefetch count.
    pub async fn basic_qos(&mut self, channel: u16, prefetch_count: u16) -> Result<(), ClientError> {
        let method = Method::BasicQos(BasicQos { prefetch_count, ..BasicQos::default() });
        self.expect(channel, method, |m| matches!(m, Method::BasicQosOk(_))).await.map(drop)
    }

    /// Puts the channel in publisher-confirm mode.
    pub async fn confirm_select(&mut self, channel: u16) -> Result<(), ClientError> {
        let method = Method::ConfirmSelect(ConfirmSelect::default());
        self.expect(channel, method, |m| matches!(m, Method::ConfirmSelectOk(_))).await.map(drop)
    }

    /// Puts the channel in transaction mode.
    pub async fn tx_select(&mut self, channel: u16) -> Result<(), ClientError> {
        let method = Method::TxSelect(TxSelect::default());
        self.expect(channel, method, |m| matches!(m, Method::TxSelectOk(_))).await.map(drop)
    }

    /// Starts a consumer with manual acks (unless `no_ack`) and returns its tag.
    pub async fn basic_consume(&mut self, channel: u16, queue: &str, no_ack: bool) -> Result<String, ClientError> {
        self.basic_consume_with_arguments(channel, queue, no_ack, FieldTable::new()).await
    }

    /// Starts a consumer with arguments (`x-stream-offset`, `x-priority`, ...).
    pub async fn basic_consume_with_arguments(
        &mut self,
        channel: u16,
        queue: &str,
        no_ack: bool,
        arguments: FieldTable,
    ) -> Result<String, ClientError> {
        let method =
            Method::BasicConsume(BasicConsume { queue: ShortStr::truncating(queue), no_ack, arguments, ..BasicConsume::default() });
        match self.call(channel, method).await? {
            Method::BasicConsumeOk(ok) => Ok(ok.consumer_tag.to_string_lossy()),
            other => Err(ClientError::Protocol(format!("unexpected {} in reply to basic.consume", other.name()))),
        }
    }

    /// Closes the connection politely, waiting a bounded time for close-ok.
    pub async fn close(mut self) -> Result<(), ClientError> {
        let method = Method::ConnectionClose(ConnectionClose {
            reply_code: 200,
            reply_text: ShortStr::from_static("Goodbye"),
            ..ConnectionClose::default()
        });
        self.call_timeout = self.call_timeout.min(Duration::from_secs(5));
        match self.call(0, method).await {
            Ok(_) | Err(ClientError::BrokerGone) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Hands the two halves to the tasks that drive the load.
    pub fn split(self) -> (FrameReader, FrameWriter) {
        (self.reader, self.writer)
    }
}

fn client_properties(connection_name: &str) -> FieldTable {
    let text = |value: &str| FieldValue::LongStr(Bytes::copy_from_slice(value.as_bytes()));
    let mut capabilities = FieldTable::new();
    for capability in ["publisher_confirms", "authentication_failure_close", "consumer_cancel_notify", "basic.nack", "connection.blocked"] {
        capabilities.insert(capability, FieldValue::Bool(true));
    }
    let mut properties = FieldTable::new();
    properties.insert("product", text("lepus-perf"));
    properties.insert("version", text(env!("CARGO_PKG_VERSION")));
    properties.insert("platform", text("Rust"));
    properties.insert("connection_name", text(connection_name));
    properties.insert("capabilities", FieldValue::Table(capabilities));
    properties
}
