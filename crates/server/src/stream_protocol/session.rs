//! One stream-protocol connection's state: the handshake (peer properties, SASL, tune, open)
//! and the dispatch of what an open connection sends, as RabbitMQ 3.10.8's
//! `rabbit_stream_reader` does it. Commands come in decoded; answers go out as encoded frames in
//! the outbox; the socket is the connection task's (`connection.rs`), so this state machine is
//! driven and tested without one.
//!
//! Before `open` succeeds any frame out of order, unknown or malformed closes the socket without
//! an answer (RabbitMQ's invalid transition); after it, an unknown or malformed frame gets a close
//! with UNKNOWN_FRAME ("unknown frame") and the connection waits for the client's close answer,
//! ignoring everything else, as RabbitMQ does.

use super::commands::{Confirmed, Publisher};
use super::delivery::{FileSpan, Subscription};
use super::Node;
use crate::auth::{Access, LoginError};
use crate::metrics::counters::PendingStreamCounts;
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use stream_codec::{ClientCommand, DecodeError, ResponseCode, ServerCommand, Text, TextMap, DEFAULT_FRAME_MAX, DEFAULT_HEARTBEAT_S};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;

/// Where the connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the client's peer properties.
    Connected,
    /// Peer properties exchanged; a SASL handshake or authenticate may come.
    PeerPropertiesExchanged,
    /// SASL under way.
    Authenticating,
    /// Authenticated, our tune sent: waiting for the client's.
    Tuning,
    /// Tuned: waiting for open.
    Tuned,
    /// Open: commands are served.
    Opened,
    /// We sent a close: waiting for the client's answer, ignoring everything else.
    CloseSent,
}

/// What the connection task does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on.
    Continue,
    /// Send what the outbox holds, then drop the socket.
    Close,
}

/// A connection's state.
pub struct Session {
    pub(super) node: Arc<Node>,
    pub(super) peer: SocketAddr,
    /// The broker's id for the connection (what queue declarations record).
    pub(super) connection_id: u64,
    pub(super) phase: Phase,
    pub(super) user: Option<String>,
    pub(super) vhost: Option<String>,
    /// The negotiated frame_max (0: none), in force once open.
    pub frame_max: u32,
    /// The negotiated heartbeat, seconds (0: none).
    pub heartbeat_s: u32,
    pub(super) client_properties: TextMap,
    pub(super) publishers: HashMap<u8, Publisher>,
    pub(super) subscriptions: HashMap<u8, Subscription>,
    /// Frames to send.
    pub outbox: BytesMut,
    /// Chunk data to send from segment files, in outbox order (see [`FileSpan`]).
    pub file_spans: Vec<FileSpan>,
    /// Woken when a stream this connection reads commits chunks.
    pub wake: Arc<Notify>,
    /// Where the group commit sends confirms back.
    pub(super) confirms: UnboundedSender<Confirmed>,
    /// Messages published and not yet confirmed: the connection stops reading its socket at
    /// [`UNCONFIRMED_MAX`] (RabbitMQ's initial credits), so this bounds the confirms in flight.
    pub unconfirmed: u64,
    /// A publish's entries, without their publishing ids, on their way into a chunk.
    pub(super) scratch: Vec<u8>,
    /// A chunk's data on its way to a subscriber.
    pub(super) chunk_buffer: Vec<u8>,
    /// Messages received, confirmed and delivered since the last [`Session::flush_counts`].
    pub(super) counts: PendingStreamCounts,
}

/// The most messages a connection has published and not yet had confirmed before it stops
/// reading (RabbitMQ's `initial_credits`, 50,000).
pub const UNCONFIRMED_MAX: u64 = stream_codec::DEFAULT_INITIAL_CREDITS as u64;

/// The SASL mechanisms offered, in RabbitMQ's order.
pub const MECHANISMS: [&str; 2] = ["AMQPLAIN", "PLAIN"];

impl Session {
    /// A session for a connection from `peer`; confirms come back through `confirms`.
    pub fn new(node: Arc<Node>, peer: SocketAddr, confirms: UnboundedSender<Confirmed>) -> Session {
        let connection_id = node.broker.next_connection_id();
        Session {
            node,
            peer,
            connection_id,
            phase: Phase::Connected,
            user: None,
            vhost: None,
            frame_max: DEFAULT_FRAME_MAX,
            heartbeat_s: DEFAULT_HEARTBEAT_S,
            client_properties: TextMap::new(),
            publishers: HashMap::new(),
            subscriptions: HashMap::new(),
            outbox: BytesMut::with_capacity(64 * 1024),
            file_spans: Vec::new(),
            wake: Arc::new(Notify::new()),
            confirms,
            unconfirmed: 0,
            scratch: Vec::new(),
            chunk_buffer: Vec::new(),
            counts: PendingStreamCounts::default(),
        }
    }

    /// Adds the connection's message counts and its publishers and subscriptions to the node's
    /// `protocol="stream"` counters (the socket task calls this once per pass of its loop).
    pub fn flush_counts(&mut self) {
        self.counts.flush(&self.node.broker.stream_protocol, self.publishers.len(), self.subscriptions.len());
    }

    /// Counts a command answered with `code` as RabbitMQ's reader does once a connection is open
    /// (`rabbit_global_counters:increase_protocol_counter(stream, ...)`): each refusal once per
    /// command, whatever the number of messages it carried; OK and NO_OFFSET are not counted.
    pub(super) fn count_refusal(&self, code: ResponseCode) {
        self.node.broker.stream_protocol.count_error(code.as_u16());
    }

    /// Where the connection is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The frame size the reader enforces now: a low ceiling until open (see
    /// [`stream_codec::PRE_OPEN_FRAME_MAX`]), the negotiated one after.
    pub fn frame_max_in_force(&self) -> u32 {
        match self.phase {
            Phase::Opened | Phase::CloseSent => self.frame_max,
            _ => stream_codec::PRE_OPEN_FRAME_MAX,
        }
    }

    pub(super) fn send(&mut self, command: &ServerCommand) {
        command.encode(&mut self.outbox);
    }

    /// Handles a frame the reader could not decode.
    pub fn undecodable(&mut self, error: &DecodeError) -> Flow {
        match self.phase {
            Phase::Opened => {
                let reason = match error {
                    DecodeError::FrameTooLarge { .. } => "frame too large",
                    _ => "unknown frame",
                };
                tracing::warn!(peer = %self.peer, %error, "stream connection: {reason}, sending close");
                self.count_refusal(error.response_code());
                self.send(&ServerCommand::Close { correlation_id: 1, code: error.response_code(), reason: Text::from(reason) });
                self.phase = Phase::CloseSent;
                Flow::Continue
            }
            Phase::CloseSent => Flow::Continue,
            _ => {
                tracing::warn!(peer = %self.peer, %error, "stream connection: bad frame before open, closing");
                Flow::Close
            }
        }
    }

    /// Handles one command.
    pub fn handle(&mut self, command: ClientCommand) -> Flow {
        match self.phase {
            Phase::Opened => self.handle_open(command),
            Phase::CloseSent => match command {
                ClientCommand::CloseResponse { .. } => Flow::Close,
                _ => Flow::Continue,
            },
            _ => self.handle_handshake(command),
        }
    }

    fn handle_handshake(&mut self, command: ClientCommand) -> Flow {
        use ClientCommand::*;
        let expected = match (&command, self.phase) {
            (Heartbeat, _) => return Flow::Continue,
            (PeerProperties { .. }, Phase::Connected) => true,
            (SaslHandshake { .. }, Phase::PeerPropertiesExchanged | Phase::Authenticating) => true,
            (SaslAuthenticate { .. }, Phase::PeerPropertiesExchanged | Phase::Authenticating) => true,
            (Tune { .. }, Phase::Tuning) => true,
            (Open { .. }, Phase::Tuning | Phase::Tuned) => true,
            _ => false,
        };
        if !expected {
            tracing::warn!(peer = %self.peer, phase = ?self.phase, key = command.key(), "stream connection: unexpected command before open, closing");
            return Flow::Close;
        }
        match command {
            PeerProperties { correlation_id, properties } => {
                self.client_properties = properties;
                let properties = self.node.server_properties();
                self.send(&ServerCommand::PeerPropertiesResponse { correlation_id, code: ResponseCode::Ok, properties });
                self.phase = Phase::PeerPropertiesExchanged;
                Flow::Continue
            }
            SaslHandshake { correlation_id } => {
                let mechanisms = MECHANISMS.iter().map(|mechanism| Text::from(*mechanism)).collect();
                self.send(&ServerCommand::SaslHandshakeResponse { correlation_id, code: ResponseCode::Ok, mechanisms });
                self.phase = Phase::Authenticating;
                Flow::Continue
            }
            SaslAuthenticate { correlation_id, mechanism, response } => self.authenticate(correlation_id, &mechanism, &response),
            Tune { frame_max, heartbeat_s } => {
                // 0 on either side means no limit; otherwise the lower one.
                self.frame_max = match (frame_max, DEFAULT_FRAME_MAX) {
                    (0, ours) => ours,
                    (theirs, ours) => theirs.min(ours),
                };
                self.heartbeat_s = heartbeat_s;
                self.phase = Phase::Tuned;
                Flow::Continue
            }
            Open { correlation_id, virtual_host } => self.open(correlation_id, &virtual_host),
            _ => Flow::Close,
        }
    }

    fn authenticate(&mut self, correlation_id: u32, mechanism: &Text, response: &Bytes) -> Flow {
        let answer = |session: &mut Session, code| {
            session.send(&ServerCommand::SaslAuthenticateResponse { correlation_id, code, challenge: Bytes::new() });
        };
        if !MECHANISMS.iter().any(|offered| offered.as_bytes() == mechanism.as_bytes()) {
            answer(self, ResponseCode::SaslMechanismNotSupported);
            return Flow::Close;
        }
        match self.node.broker.users.authenticate(mechanism.as_bytes(), response, self.peer.ip()) {
            Ok(user) => {
                answer(self, ResponseCode::Ok);
                self.user = Some(user);
                self.send(&ServerCommand::Tune {
                    frame_max: DEFAULT_FRAME_MAX,
                    heartbeat_s: u32::from(self.node.broker.config.heartbeat_interval_s),
                });
                self.phase = Phase::Tuning;
                Flow::Continue
            }
            // Not counted: RabbitMQ's reader (3.10.8 to 3.13) bumps none of the handshake's
            // refusal counters (authentication, SASL, vhost access), so they stay at 0 there and
            // here, and a dashboard reads the same on both.
            Err(error) => {
                tracing::warn!(peer = %self.peer, %error, "stream connection: authentication failed");
                let code = match error {
                    LoginError::LoopbackOnly(_) => ResponseCode::SaslAuthenticationFailureLoopback,
                    LoginError::Malformed(_) => ResponseCode::SaslError,
                    LoginError::UnsupportedMechanism(_) => ResponseCode::SaslMechanismNotSupported,
                    LoginError::InvalidCredentials(_) | LoginError::Throttled => ResponseCode::AuthenticationFailure,
                };
                answer(self, code);
                Flow::Close
            }
        }
    }

    fn open(&mut self, correlation_id: u32, virtual_host: &Text) -> Flow {
        let vhost = virtual_host.to_string_lossy();
        let user = self.user.clone().unwrap_or_default();
        let allowed = self.node.broker.has_vhost(&vhost) && self.node.broker.permissions.get(&user, &vhost).is_some();
        if !allowed {
            tracing::warn!(peer = %self.peer, user, vhost, "stream connection: virtual host access refused");
            self.send(&ServerCommand::OpenResponse {
                correlation_id,
                code: ResponseCode::VirtualHostAccessFailure,
                properties: TextMap::new(),
            });
            return Flow::Close;
        }
        let properties = vec![
            (Text::from("advertised_port"), Text::from(self.node.advertised_port.to_string())),
            (Text::from("advertised_host"), Text::from(self.node.advertised_host.as_str())),
        ];
        self.send(&ServerCommand::OpenResponse { correlation_id, code: ResponseCode::Ok, properties });
        tracing::info!(peer = %self.peer, user, vhost, "stream connection open");
        self.vhost = Some(vhost);
        self.phase = Phase::Opened;
        Flow::Continue
    }

    /// Whether the user may `access` the stream `name` in the connection's vhost.
    pub(super) fn permitted(&self, access: Access, name: &Text) -> bool {
        let (Some(user), Some(vhost)) = (&self.user, &self.vhost) else { return false };
        self.node.broker.permissions.get(user, vhost).is_some_and(|permission| permission.allows(access, name.as_bytes()))
    }

    /// The vhost (empty before open).
    pub(super) fn vhost(&self) -> &str {
        self.vhost.as_deref().unwrap_or_default()
    }

    fn handle_open(&mut self, command: ClientCommand) -> Flow {
        use ClientCommand::*;
        match command {
            Heartbeat => Flow::Continue,
            Close { correlation_id, code, reason } => {
                tracing::debug!(peer = %self.peer, code, reason = %reason, "stream connection: the client closes");
                self.send(&ServerCommand::CloseResponse { correlation_id, code: ResponseCode::Ok });
                Flow::Close
            }
            DeclarePublisher { correlation_id, publisher_id, reference, stream } => {
                self.declare_publisher(correlation_id, publisher_id, reference, stream)
            }
            Publish { publisher_id, messages } => self.publish(publisher_id, messages),
            QueryPublisherSequence { correlation_id, reference, stream } => {
                self.query_publisher_sequence(correlation_id, &reference, &stream)
            }
            DeletePublisher { correlation_id, publisher_id } => self.delete_publisher(correlation_id, publisher_id),
            Subscribe { correlation_id, subscription_id, stream, offset, credit, properties: _ } => {
                self.subscribe(correlation_id, subscription_id, stream, offset, credit)
            }
            Credit { subscription_id, credit } => self.credit(subscription_id, credit),
            StoreOffset { reference, stream, offset } => self.store_offset(&reference, &stream, offset),
            QueryOffset { correlation_id, reference, stream } => self.query_offset(correlation_id, &reference, &stream),
            Unsubscribe { correlation_id, subscription_id } => self.unsubscribe(correlation_id, subscription_id),
            Create { correlation_id, stream, arguments } => self.create(correlation_id, &stream, &arguments),
            Delete { correlation_id, stream } => self.delete(correlation_id, &stream),
            Metadata { correlation_id, streams } => self.metadata(correlation_id, streams),
            // No super streams: every route and partitions query names one that does not exist.
            Route { correlation_id, .. } => {
                self.count_refusal(ResponseCode::StreamDoesNotExist);
                self.send(&ServerCommand::RouteResponse { correlation_id, code: ResponseCode::StreamDoesNotExist, streams: Vec::new() });
                Flow::Continue
            }
            Partitions { correlation_id, .. } => {
                self.count_refusal(ResponseCode::StreamDoesNotExist);
                self.send(&ServerCommand::PartitionsResponse {
                    correlation_id,
                    code: ResponseCode::StreamDoesNotExist,
                    streams: Vec::new(),
                });
                Flow::Continue
            }
            // Handshake commands once open, or the answer to a close never sent: RabbitMQ takes
            // them as unknown frames.
            other => {
                tracing::warn!(peer = %self.peer, key = other.key(), "stream connection: unexpected command, sending close");
                self.count_refusal(ResponseCode::UnknownFrame);
                self.send(&ServerCommand::Close {
                    correlation_id: 1,
                    code: ResponseCode::UnknownFrame,
                    reason: Text::from("unknown frame"),
                });
                self.phase = Phase::CloseSent;
                Flow::Continue
            }
        }
    }
}

impl Drop for Session {
    /// A connection that ends takes its publishers and subscriptions out of the node's gauges and
    /// hands over the counts of its last pass, whichever way it ended.
    fn drop(&mut self) {
        self.counts.flush(&self.node.broker.stream_protocol, 0, 0);
    }
}
