//! One client connection: the protocol header, the handshake (start, tune, open), then frames in a
//! loop handed to channels, until either side closes.
//!
//! The reader side (this task) owns every channel's state; a separate writer task owns the socket's
//! write half, so a client that stops reading never stops us from reading its frames.

mod channel;
mod channel_map;
mod context;
mod heartbeat;
mod stream;
mod writer;

pub use stream::ClientStream;

use crate::broker::Broker;
use crate::login_throttle::Admission;
use crate::metrics::counters::ChurnCounters;
use crate::shared::{ChannelShared, ConnectionShared, Outbound};
use amqp_codec::{
    constants, decode_frame, ConnectionClose, ConnectionCloseOk, ConnectionOpenOk, ConnectionStart, ConnectionTune,
    ConnectionUpdateSecretOk, DecodeError, FieldTable, FieldValue, Frame, FramePayload, LongStr, Method, ShortStr, PROTOCOL_HEADER,
};
use broker_core::{AmqpError, ErrorScope};
use bytes::{Bytes, BytesMut};
use channel::Channel;
use channel_map::ChannelMap;
use context::Context;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use writer::{run_writer, WriterSettings};

/// How long a client has to complete the handshake (RabbitMQ's handshake_timeout).
pub const HANDSHAKE_TIMEOUT_S: u64 = 10;
/// How long we wait for close-ok after sending connection.close.
pub const CLOSE_OK_TIMEOUT_S: u64 = 3;
/// How long a refused login's socket stays open for the client to close it first (RabbitMQ's
/// `SILENT_CLOSE_DELAY`: 3 s, with or without connection.close sent).
pub const REFUSED_LOGIN_CLOSE_DELAY_S: u64 = 3;
/// The size of one socket read.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Where the connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitStartOk,
    AwaitTuneOk,
    AwaitOpen,
    Open,
    /// We sent connection.close and wait for close-ok, ignoring everything else.
    Closing,
    /// The byte stream could not be decoded; we sent connection.close and discard input.
    Draining,
    /// We sent close-ok to the client's close; the client closes the socket (as RabbitMQ
    /// expects), we only wait a bounded time for that.
    AwaitClientEof,
    Done,
}

/// Serves one accepted socket to the end: plain TCP, or a TLS stream after its handshake (`tls`
/// then says what it negotiated).
pub async fn serve<S: ClientStream>(broker: Arc<Broker>, stream: S, peer: SocketAddr, tls: Option<crate::tls::TlsInfo>) {
    let (mut read_half, mut write_half) = stream.into_halves();
    let mut header = [0u8; 8];
    let header_read = tokio::time::timeout(Duration::from_secs(HANDSHAKE_TIMEOUT_S), read_half.read_exact(&mut header)).await;
    match header_read {
        Ok(Ok(_)) if &header == PROTOCOL_HEADER => {}
        Ok(Ok(_)) => {
            // RabbitMQ answers a wrong protocol header with the one it speaks, then closes.
            tracing::info!(%peer, header = ?header, "wrong protocol header; closing");
            let _ = write_half.write_all(PROTOCOL_HEADER).await;
            let _ = write_half.shutdown().await;
            return;
        }
        _ => return,
    }
    let (sender, receiver) = mpsc::unbounded_channel();
    let shared = Arc::new(ConnectionShared {
        id: broker.next_connection_id(),
        outbound: sender,
        outbound_deliveries: AtomicUsize::new(0),
        stalled_queues: Default::default(),
        consumer_cancel_notify: AtomicBool::new(false),
        pending_work: AtomicUsize::new(0),
        pending_work_drained: tokio::sync::Notify::new(),
        force_close: tokio::sync::Notify::new(),
        has_published: AtomicBool::new(false),
        peer,
        connected_at_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64),
        session: Default::default(),
        close_reason: Default::default(),
        tls,
        traffic: Default::default(),
    });
    broker.register_connection(shared.clone());
    let frame_max = Arc::new(AtomicU32::new(broker.config.frame_bytes_max));
    let heartbeat_s = Arc::new(AtomicU32::new(0));
    let last_write_ns = Arc::new(AtomicU64::new(crate::metrics::latency::clock_ns()));
    let writer_settings =
        WriterSettings { frame_max: frame_max.clone(), heartbeat_s: heartbeat_s.clone(), last_write_ns: last_write_ns.clone() };
    let writer = tokio::spawn(run_writer(write_half, receiver, shared.clone(), writer_settings));
    let mut connection = Connection {
        context: Context::new(broker.clone(), shared.clone()),
        peer,
        reader: Box::new(read_half),
        buffer: BytesMut::with_capacity(READ_BUFFER_BYTES),
        phase: Phase::AwaitStartOk,
        channels: ChannelMap::default(),
        channel_max: broker.config.channels_per_connection_max,
        frame_max,
        heartbeat_s,
        last_write_ns,
        read_timer: heartbeat::CoarseTimer::default(),
        authentication_failure_close: false,
        refused_login: None,
        channels_with_pending_syncs: Vec::new(),
        blocked_notify: false,
        close_wait: Duration::from_secs(CLOSE_OK_TIMEOUT_S),
        consumer_timeout_tick: consumer_timeout_tick(broker.config.consumer_timeout_ms),
    };
    tracing::debug!(%peer, id = shared.id, tls = shared.tls.as_ref().map_or("no", |tls| tls.protocol), "connection accepted");
    connection.send_start();
    if let Err(error) = connection.run().await {
        tracing::info!(%peer, tls = shared.tls.is_some(), %error, "connection ended");
    }
    connection.release_everything();
    shared.send(Outbound::Shutdown);
    let _ = writer.await;
    broker.unregister_connection(shared.id);
}

/// Whether a frame may be handled while replies wait for definitions changes to be durable:
/// declares and binds, whose only effect a client sees is their reply (held in order behind the
/// others). Anything else (a publish, a consume, a delete that cancels consumers) first waits for
/// the held changes, so its effects never overtake a reply that is not sent yet.
fn waits_with_held_replies(frame: &Frame) -> bool {
    matches!(
        &frame.payload,
        FramePayload::Heartbeat
            | FramePayload::Method(
                Method::QueueDeclare(_)
                    | Method::QueueBind(_)
                    | Method::QueueUnbind(_)
                    | Method::ExchangeDeclare(_)
                    | Method::ExchangeBind(_)
                    | Method::ExchangeUnbind(_)
            )
    )
}

/// A refused login waiting for its answer.
struct RefusedLogin {
    /// How long to wait before answering.
    answer_after: Duration,
    /// connection.close to send, when the client asked for one (authentication_failure_close).
    close: Option<AmqpError>,
}

struct Connection {
    context: Context,
    peer: SocketAddr,
    reader: Box<dyn AsyncRead + Unpin + Send>,
    buffer: BytesMut,
    phase: Phase,
    channels: ChannelMap,
    channel_max: u16,
    frame_max: Arc<AtomicU32>,
    heartbeat_s: Arc<AtomicU32>,
    /// When the writer last wrote (see `heartbeat.rs`: a read piggybacks a heartbeat on it).
    last_write_ns: Arc<AtomicU64>,
    /// The handshake's, the close's or the heartbeats' deadline for the next read.
    read_timer: heartbeat::CoarseTimer,
    authentication_failure_close: bool,
    /// A refused login, answered after the throttle's delay (see `login_throttle.rs`).
    refused_login: Option<RefusedLogin>,
    /// Channels whose publishes or acks of this socket read wait for [`Channel::flush_syncs`]
    /// and [`Channel::flush_acks`].
    channels_with_pending_syncs: Vec<u16>,
    /// Whether the client understands connection.blocked / unblocked.
    blocked_notify: bool,
    /// How long to wait for the client once the connection is closing.
    close_wait: Duration,
    /// When the channels next look for deliveries unacked past `consumer_timeout`.
    consumer_timeout_tick: tokio::time::Interval,
}

/// Why the read loop ended.
#[derive(Debug, thiserror::Error)]
enum EndReason {
    #[error("socket closed by the client")]
    Eof,
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    #[error("no frame within two heartbeat intervals")]
    MissedHeartbeats,
    #[error("handshake not completed in time")]
    HandshakeTimeout,
    #[error("closed")]
    Closed,
    #[error("the writer is gone: the socket failed or took no bytes for the send timeout")]
    WriterGone,
}

impl Connection {
    fn send_start(&mut self) {
        let start = ConnectionStart {
            version_major: 0,
            version_minor: 9,
            server_properties: server_properties(),
            mechanisms: LongStr::from("AMQPLAIN PLAIN"),
            locales: LongStr::from("en_US"),
        };
        self.context.reply(0, start.into());
    }

    async fn run(&mut self) -> Result<(), EndReason> {
        let handshake_deadline = tokio::time::Instant::now() + Duration::from_secs(HANDSHAKE_TIMEOUT_S);
        loop {
            if self.phase == Phase::Draining {
                self.buffer.clear();
            }
            while let Some(frame) = self.next_buffered_frame()? {
                let channel = frame.channel;
                if self.context.holds_replies() && !waits_with_held_replies(&frame) {
                    self.release_held_replies();
                }
                self.handle_frame(frame);
                self.answer_waiting_get().await;
                let pending = |channel: &Channel| channel.has_pending_syncs() || channel.has_pending_acks() || channel.has_pending_counts();
                if self.channels.get(&channel).is_some_and(pending) && !self.channels_with_pending_syncs.contains(&channel) {
                    self.channels_with_pending_syncs.push(channel);
                }
                if self.phase == Phase::Done {
                    self.release_held_replies();
                    let Some(refused) = self.refused_login.take() else {
                        return Err(EndReason::Closed);
                    };
                    self.answer_refused_login(refused).await;
                }
            }
            // Everything this read asked for is handled: its held replies share one fdatasync.
            self.release_held_replies();
            self.flush_pending_syncs();
            let deadline = match self.phase {
                Phase::AwaitStartOk | Phase::AwaitTuneOk | Phase::AwaitOpen => Some(handshake_deadline),
                Phase::Closing | Phase::AwaitClientEof | Phase::Draining => Some(tokio::time::Instant::now() + self.close_wait),
                _ => match self.heartbeat_s.load(Ordering::Acquire) {
                    0 => None,
                    interval => Some(heartbeat::missed_heartbeats_deadline(interval, self.context.read_at_ns)),
                },
            };
            self.read_timer.set(deadline);
            // Backpressure: stop reading while this connection's writer and syncs are behind.
            self.context.connection.wait_for_capacity().await;
            if self.context.connection.outbound.is_closed() {
                // Nothing more can reach the client: reading on would take its publishes unbounded.
                return Err(EndReason::WriterGone);
            }
            self.wait_out_resource_alarms().await;
            let broker = self.context.broker.clone();
            let alarm_raised = broker.disk_alarm_raised.notified();
            let read = tokio::select! {
                read = self.reader.read_buf(&mut self.buffer) => Ok(read),
                _ = self.read_timer.fired() => Err(()),
                _ = self.context.connection.outbound.closed() => return Err(EndReason::WriterGone),
                _ = self.context.connection.force_close.notified() => {
                    self.force_close();
                    continue;
                }
                // A publisher learns of a disk alarm at once, not at its next frame.
                _ = alarm_raised, if self.context.connection.has_published.load(Ordering::Acquire) => continue,
                _ = self.consumer_timeout_tick.tick(), if !self.channels.is_empty() => {
                    for channel in self.channels.values_mut() {
                        channel.check_consumer_timeout(&mut self.context);
                    }
                    continue;
                }
            };
            match read {
                Ok(Ok(0)) => return Err(EndReason::Eof),
                Ok(Ok(read)) => {
                    self.context.connection.traffic.count_read(read);
                    self.context.read_at_ns = crate::metrics::latency::clock_ns();
                    self.piggyback_heartbeat();
                }
                Ok(Err(error)) => return Err(EndReason::Io(error)),
                Err(_) => {
                    return Err(match self.phase {
                        Phase::Open => EndReason::MissedHeartbeats,
                        Phase::Closing | Phase::AwaitClientEof | Phase::Draining => EndReason::Closed,
                        _ => EndReason::HandshakeTimeout,
                    })
                }
            }
            if self.buffer.capacity() - self.buffer.len() < 4096 {
                self.buffer.reserve(READ_BUFFER_BYTES);
            }
        }
    }

    /// Queues a heartbeat when the writer has been silent long enough, from the wakeup this read
    /// already cost (see `heartbeat.rs`).
    fn piggyback_heartbeat(&self) {
        if self.phase != Phase::Open {
            return;
        }
        let interval_s = self.heartbeat_s.load(Ordering::Relaxed);
        if heartbeat::piggyback_due(interval_s, self.context.read_at_ns, self.last_write_ns.load(Ordering::Relaxed)) {
            self.context.connection.send(Outbound::Frames(Bytes::from_static(heartbeat::HEARTBEAT_FRAME)));
        }
    }

    /// Answers a refused login after the throttle's delay, as RabbitMQ does: connection.close
    /// (403) when the client asked for it, and in any case the socket stays open until the client
    /// closes it or [`REFUSED_LOGIN_CLOSE_DELAY_S`] pass. Closing at once would race the client's
    /// close-ok: its bytes arriving at a closed socket make the kernel answer with a reset, and the
    /// reset can destroy the unread connection.close on the client's side (rabbitpy then reports
    /// "connection reset" instead of ACCESS_REFUSED).
    async fn answer_refused_login(&mut self, refused: RefusedLogin) {
        tokio::time::sleep(refused.answer_after).await;
        match refused.close {
            Some(error) => self.send_connection_close(&error),
            None => self.phase = Phase::Draining,
        }
        self.close_wait = Duration::from_secs(REFUSED_LOGIN_CLOSE_DELAY_S);
    }

    /// Sends the replies held for definitions changes once they are durable; a change that could
    /// not be stored closes the connection (541), as a declare that waited alone did.
    fn release_held_replies(&mut self) {
        if let Err(error) = self.context.release_held_replies() {
            self.fail(error);
        }
    }

    /// Decodes the next complete frame; a decoding error closes the connection with its code.
    fn next_buffered_frame(&mut self) -> Result<Option<Frame>, EndReason> {
        let frame_max = self.frame_max.load(Ordering::Acquire);
        match decode_frame(&mut self.buffer, frame_max) {
            Ok(frame) => Ok(frame),
            Err(error) => {
                self.fail_decode(error);
                self.buffer.clear();
                Ok(None)
            }
        }
    }

    fn fail_decode(&mut self, error: DecodeError) {
        tracing::warn!(peer = %self.peer, %error, "malformed frame");
        let (class_id, method_id) = match error {
            DecodeError::UnknownMethod { class_id, method_id } | DecodeError::MethodArguments { class_id, method_id, .. } => {
                (class_id, method_id)
            }
            _ => (0, 0),
        };
        let text = match &error {
            DecodeError::UnknownMethod { class_id, method_id } => format!("unknown method {class_id}/{method_id}"),
            other => other.to_string(),
        };
        let amqp_error = AmqpError::new(error.reply_code(), text).during(class_id, method_id);
        if matches!(self.phase, Phase::Open | Phase::AwaitOpen | Phase::AwaitTuneOk) {
            self.send_connection_close(&amqp_error);
        }
        // The stream can no longer be parsed: drain what the client still sends for a bounded
        // time (closing at once would make its pending writes fail), then close, as RabbitMQ does.
        self.phase = Phase::Draining;
    }

    /// Hands each channel's publishes of the last socket read to the syncer, one request per
    /// channel per read, and settles the read's acks in their queues.
    fn flush_pending_syncs(&mut self) {
        for id in std::mem::take(&mut self.channels_with_pending_syncs) {
            if let Some(channel) = self.channels.get_mut(&id) {
                channel.flush_syncs(&self.context);
                channel.flush_acks();
                channel.flush_counts();
            }
        }
    }

    fn handle_frame(&mut self, frame: Frame) {
        let result = match self.phase {
            Phase::AwaitStartOk | Phase::AwaitTuneOk | Phase::AwaitOpen => self.handle_handshake(frame),
            Phase::Open => self.handle_open(frame),
            Phase::Closing => {
                if let (0, FramePayload::Method(Method::ConnectionCloseOk(_) | Method::ConnectionClose(_))) =
                    (frame.channel, &frame.payload)
                {
                    self.phase = Phase::Done;
                }
                Ok(())
            }
            Phase::AwaitClientEof | Phase::Draining | Phase::Done => Ok(()),
        };
        if let Err(error) = result {
            self.fail(error);
        }
    }

    /// Answers a basic.get that waits for its queue's page-in before the next frame is handled,
    /// so replies keep the order of the requests.
    async fn answer_waiting_get(&mut self) {
        while let Some(waiting) = self.context.waiting_get.take() {
            waiting.queue.wait_for_page_in().await;
            if let Some(channel) = self.channels.get_mut(&waiting.channel) {
                channel.resume_get(&mut self.context, waiting);
            }
        }
    }

    /// While a resource alarm (disk or memory) is raised, a connection that publishes is not read
    /// (RabbitMQ's blocking); it is told with connection.blocked when it asked for that capability.
    async fn wait_out_resource_alarms(&mut self) {
        let broker = self.context.broker.clone();
        if self.phase != Phase::Open || !self.context.connection.has_published.load(Ordering::Acquire) {
            return;
        }
        let mut told_blocked = false;
        while broker.publishers_blocked_by().is_some() {
            let cleared = broker.disk_alarm_cleared.notified();
            tokio::pin!(cleared);
            cleared.as_mut().enable();
            let Some(reason) = broker.publishers_blocked_by() else { break };
            if !told_blocked && self.blocked_notify {
                self.context.reply(0, amqp_codec::ConnectionBlocked { reason: ShortStr::from(reason) }.into());
                told_blocked = true;
            }
            tokio::select! {
                _ = &mut cleared => {}
                _ = self.context.connection.force_close.notified() => {
                    self.force_close();
                    return;
                }
                // Re-check now and then, so a missed wake-up cannot block forever.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        if told_blocked {
            self.context.reply(0, amqp_codec::ConnectionUnblocked {}.into());
        }
    }

    /// The broker is shutting down: tell the client, as RabbitMQ does, and wait for close-ok.
    fn force_close(&mut self) {
        match self.phase {
            Phase::Open => {
                let reason = self.context.connection.close_reason.lock().clone().unwrap_or_else(|| "shutdown".to_string());
                let error = AmqpError::new(
                    amqp_codec::constants::CONNECTION_FORCED,
                    format!("broker forced connection closure with reason '{reason}'"),
                );
                self.send_connection_close(&error);
            }
            Phase::Closing | Phase::AwaitClientEof | Phase::Draining | Phase::Done => {}
            _ => self.phase = Phase::Done,
        }
    }

    fn fail(&mut self, error: AmqpError) {
        if self.phase == Phase::AwaitStartOk {
            self.phase = Phase::Done;
            return;
        }
        tracing::warn!(peer = %self.peer, code = error.code, text = %error.text, "connection error");
        self.send_connection_close(&error);
    }

    fn send_connection_close(&mut self, error: &AmqpError) {
        let close = ConnectionClose {
            reply_code: error.code,
            reply_text: ShortStr::truncating(error.text.clone()),
            class_id: error.class_id,
            method_id: error.method_id,
        };
        self.context.reply(0, close.into());
        self.release_everything();
        self.phase = Phase::Closing;
    }

    fn handle_handshake(&mut self, frame: Frame) -> Result<(), AmqpError> {
        let FramePayload::Method(method) = frame.payload else {
            return Err(AmqpError::unexpected_frame("expected a method frame during the handshake"));
        };
        if frame.channel != 0 {
            return Err(AmqpError::command_invalid("handshake methods must be sent on channel 0"));
        }
        match (self.phase, method) {
            (Phase::AwaitStartOk, Method::ConnectionStartOk(start_ok)) => {
                let capabilities = match start_ok.client_properties.get("capabilities") {
                    Some(FieldValue::Table(table)) => table.clone(),
                    _ => FieldTable::new(),
                };
                let flag = |name: &str| capabilities.get(name).and_then(FieldValue::as_bool).unwrap_or(false);
                self.context.connection.consumer_cancel_notify.store(flag("consumer_cancel_notify"), Ordering::Release);
                self.authentication_failure_close = flag("authentication_failure_close");
                self.blocked_notify = flag("connection.blocked");
                let now = std::time::Instant::now();
                let login = match self.context.broker.login_throttle.admit(self.peer.ip(), now) {
                    Admission::Check => {
                        self.context.broker.users.authenticate(start_ok.mechanism.as_bytes(), &start_ok.response.0, self.peer.ip())
                    }
                    Admission::RefuseUnchecked => Err(crate::auth::LoginError::Throttled),
                };
                match login {
                    Ok(user) => {
                        let text = |name: &str| match start_ok.client_properties.get(name) {
                            Some(FieldValue::LongStr(value)) => String::from_utf8_lossy(value).into_owned(),
                            _ => String::new(),
                        };
                        {
                            let mut session = self.context.connection.session.lock();
                            session.user = user.clone();
                            session.client_product = text("product");
                            session.client_version = text("version");
                        }
                        self.context.user = user;
                        let tune = ConnectionTune {
                            channel_max: self.channel_max,
                            frame_max: self.context.broker.config.frame_bytes_max,
                            heartbeat: self.context.broker.config.heartbeat_interval_s,
                        };
                        self.context.reply(0, tune.into());
                        self.phase = Phase::AwaitTuneOk;
                        Ok(())
                    }
                    Err(error) => {
                        tracing::warn!(peer = %self.peer, %error, "login refused");
                        let unknown_mechanism = matches!(error, crate::auth::LoginError::UnsupportedMechanism(_));
                        let close = (self.authentication_failure_close && !unknown_mechanism).then(|| {
                            AmqpError::access_refused(format!(
                                "Login was refused using authentication mechanism {}. For details see the broker logfile.",
                                start_ok.mechanism
                            ))
                        });
                        // A refusal without a check is answered at once: it reveals nothing, and
                        // counting it would lock the address out for as long as the flood lasts.
                        let answer_after = match error {
                            crate::auth::LoginError::Throttled => Duration::ZERO,
                            _ => self.context.broker.login_throttle.record_failure(self.peer.ip(), now),
                        };
                        self.refused_login = Some(RefusedLogin { answer_after, close });
                        self.phase = Phase::Done;
                        Ok(())
                    }
                }
            }
            (Phase::AwaitTuneOk, Method::ConnectionTuneOk(tune_ok)) => {
                let ours = self.context.broker.config.frame_bytes_max;
                if tune_ok.frame_max != 0 && tune_ok.frame_max < constants::FRAME_MIN_SIZE {
                    return Err(AmqpError::not_allowed(format!(
                        "frame_max={} < {} min size",
                        tune_ok.frame_max,
                        constants::FRAME_MIN_SIZE
                    )));
                }
                if tune_ok.frame_max > ours {
                    return Err(AmqpError::not_allowed(format!("frame_max={} > {} max size", tune_ok.frame_max, ours)));
                }
                let frame_max = if tune_ok.frame_max == 0 { ours } else { tune_ok.frame_max };
                self.frame_max.store(frame_max, Ordering::Release);
                self.context.frame_max = frame_max;
                // channel_max 0 means "no limit", which exceeds ours: RabbitMQ drops the socket.
                if tune_ok.channel_max == 0 || tune_ok.channel_max > self.channel_max {
                    tracing::warn!(peer = %self.peer, channel_max = tune_ok.channel_max, "tune-ok channel_max above ours; closing");
                    self.phase = Phase::Done;
                    return Ok(());
                }
                self.channel_max = tune_ok.channel_max;
                self.heartbeat_s.store(u32::from(tune_ok.heartbeat), Ordering::Release);
                {
                    let mut session = self.context.connection.session.lock();
                    session.frame_max = frame_max;
                    session.heartbeat_s = tune_ok.heartbeat;
                }
                self.phase = Phase::AwaitOpen;
                Ok(())
            }
            (Phase::AwaitOpen, Method::ConnectionOpen(open)) => {
                let vhost = open.virtual_host.to_string_lossy();
                let Some(topology) = self.context.broker.vhost(&vhost) else {
                    return Err(AmqpError::not_allowed(format!("vhost {vhost} not found")).during(10, 40));
                };
                // The vhost's max-connections, then the user's permission (see `admit_to_vhost`).
                let permission = self
                    .context
                    .broker
                    .admit_to_vhost(self.context.connection.id, &vhost, &self.context.user)
                    .map_err(|error| error.during(10, 40))?;
                self.context.permission = Some(permission);
                self.context.topology = Some(topology);
                self.context.vhost = vhost;
                self.context.reply(0, ConnectionOpenOk { known_hosts: ShortStr::from("") }.into());
                self.phase = Phase::Open;
                Ok(())
            }
            (_, Method::ConnectionClose(_)) => {
                self.context.reply(0, ConnectionCloseOk {}.into());
                self.phase = Phase::AwaitClientEof;
                Ok(())
            }
            (_, other) => Err(AmqpError::command_invalid(format!("unexpected {} during the handshake", other.name()))
                .during(other.class_id(), other.method_id())),
        }
    }

    fn handle_open(&mut self, frame: Frame) -> Result<(), AmqpError> {
        if frame.channel == 0 {
            return self.handle_channel_zero(frame.payload);
        }
        let Some(channel) = self.channels.get_mut(&frame.channel) else {
            return self.handle_unopened_channel(frame);
        };
        match channel.handle(&mut self.context, frame.payload) {
            Ok(channel::After::KeepOpen) => Ok(()),
            Ok(channel::After::Forget) => {
                if let Some(channel) = self.channels.remove(&frame.channel) {
                    self.retire_channels(std::iter::once(channel.shared().clone()));
                }
                Ok(())
            }
            Err(error) if error.scope() == ErrorScope::Channel => {
                tracing::info!(peer = %self.peer, channel = frame.channel, code = error.code, text = %error.text, "channel error");
                channel.fail(&mut self.context, &error);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// A frame for a channel that is not open: channel.open opens it, anything else is an error.
    fn handle_unopened_channel(&mut self, frame: Frame) -> Result<(), AmqpError> {
        match frame.payload {
            FramePayload::Method(Method::ChannelOpen(_)) => {
                // Like RabbitMQ 3.10, channel_max bounds how many channels are open, not their numbers.
                if self.channels.len() >= usize::from(self.channel_max) {
                    return Err(AmqpError::not_allowed(format!(
                        "number of channels opened ({}) has reached the negotiated channel_max ({})",
                        self.channels.len(),
                        self.channel_max
                    ))
                    .during(20, 10));
                }
                let channel = Channel::open(frame.channel, &self.context);
                ChurnCounters::count(&self.context.broker.churn.channels_opened);
                let mut session = self.context.connection.session.lock();
                session.open_channels.insert(frame.channel, Arc::downgrade(channel.shared()));
                self.channels.insert(frame.channel, channel);
                session.channels = self.channels.len();
                Ok(())
            }
            // A close-ok for a channel already forgotten: harmless.
            FramePayload::Method(Method::ChannelCloseOk(_)) => Ok(()),
            FramePayload::Method(other) => {
                Err(AmqpError::channel_error("expected 'channel.open'").during(other.class_id(), other.method_id()))
            }
            FramePayload::Header(_) | FramePayload::Body(_) => {
                Err(AmqpError::unexpected_frame("expected method frame, got non method frame instead"))
            }
            FramePayload::Heartbeat => Err(AmqpError::unexpected_frame("heartbeat frame on a non-zero channel")),
        }
    }

    fn handle_channel_zero(&mut self, payload: FramePayload) -> Result<(), AmqpError> {
        match payload {
            FramePayload::Heartbeat => Ok(()),
            FramePayload::Method(Method::ConnectionClose(_)) => {
                self.release_everything();
                self.context.reply(0, ConnectionCloseOk {}.into());
                self.phase = Phase::AwaitClientEof;
                Ok(())
            }
            FramePayload::Method(Method::ConnectionUpdateSecret(_)) => {
                self.context.reply(0, ConnectionUpdateSecretOk {}.into());
                Ok(())
            }
            FramePayload::Method(Method::ConnectionBlocked(_) | Method::ConnectionUnblocked(_)) => Ok(()),
            FramePayload::Method(other) => {
                Err(AmqpError::channel_error("unexpected method in connection state running").during(other.class_id(), other.method_id()))
            }
            FramePayload::Header(_) | FramePayload::Body(_) => {
                Err(AmqpError::unexpected_frame("expected method frame, got non method frame instead"))
            }
        }
    }

    /// Closes every channel (requeueing unacked deliveries, removing consumers) and deletes the
    /// connection's exclusive queues.
    fn release_everything(&mut self) {
        let mut closed = Vec::with_capacity(self.channels.len());
        for (_, mut channel) in self.channels.drain() {
            channel.release(&self.context);
            closed.push(channel.shared().clone());
        }
        self.retire_channels(closed.into_iter());
        let owner = self.context.connection.id;
        for name in std::mem::take(&mut self.context.exclusive_queues) {
            self.context.broker.remove_exclusive_queue(&self.context.vhost, &name, owner);
        }
    }
}

impl Connection {
    /// Takes closed channels off the connection's list and adds their message counters to the
    /// broker's, in one step a metrics scrape cannot see half of.
    fn retire_channels(&mut self, closed: impl Iterator<Item = Arc<ChannelShared>>) {
        let broker = &self.context.broker;
        broker.retired_channels.retire(|totals| {
            let mut session = self.context.connection.session.lock();
            for channel in closed {
                session.open_channels.remove(&channel.id);
                totals.add(&channel.publish_counters, &channel.ledger.lock().counters);
                ChurnCounters::count(&broker.churn.channels_closed);
            }
            session.channels = self.channels.len();
        });
    }
}

/// The connection's consumer-timeout sampling clock (see `channel/consumer_timeout.rs`). Its ticks
/// fall on multiples of the period (on the clock `heartbeat.rs` rounds to), so every connection's
/// tick comes in the same runtime turn rather than 19,000 of them each waking a parked thread.
/// The first comes within one period: a delivery before it is timed from it, so a later first
/// tick would make the first deliveries' timeouts late by as much.
fn consumer_timeout_tick(consumer_timeout_ms: u64) -> tokio::time::Interval {
    let period = channel::consumer_timeout_tick_interval(consumer_timeout_ms);
    let period_ns = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
    let first = heartbeat::aligned_deadline(crate::metrics::latency::clock_ns(), 0, period_ns);
    let mut tick = tokio::time::interval_at(first, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

fn server_properties() -> FieldTable {
    let text = |value: &str| FieldValue::LongStr(Bytes::copy_from_slice(value.as_bytes()));
    let mut capabilities = FieldTable::new();
    for capability in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        capabilities.insert(capability, FieldValue::Bool(true));
    }
    let mut properties = FieldTable::new();
    properties.insert("capabilities", FieldValue::Table(capabilities));
    properties.insert("cluster_name", text("lepus"));
    properties.insert("copyright", text("Copyright (c) the Lepus authors"));
    properties.insert("information", text("Licensed under the Apache License 2.0"));
    properties.insert("platform", text("Rust"));
    properties.insert("product", text("Lepus"));
    properties.insert("version", text(env!("CARGO_PKG_VERSION")));
    properties
}
