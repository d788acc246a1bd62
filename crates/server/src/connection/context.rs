//! What channel handlers need from their connection: the broker, the writer, who is logged in.

use crate::broker::Broker;
use crate::shared::{ConnectionShared, Outbound};
use amqp_codec::{encode_method_frame, Method, ShortStr};
use bytes::BytesMut;
use std::sync::Arc;

/// The connection as channel handlers see it.
pub struct Context {
    /// The broker.
    pub broker: Arc<Broker>,
    /// The shared half of the connection.
    pub connection: Arc<ConnectionShared>,
    /// The vhost opened.
    pub vhost: String,
    /// The logged-in user.
    pub user: String,
    /// Negotiated frame_max.
    pub frame_max: u32,
    /// Exclusive queues this connection declared (deleted when it closes).
    pub exclusive_queues: Vec<ShortStr>,
    /// What the user may do in the vhost (set by connection.open).
    pub permission: Option<std::sync::Arc<crate::auth::Permission>>,
    /// The opened vhost's topology (set by connection.open).
    pub topology: Option<crate::broker::VhostTopology>,
    /// A basic.get waiting for its queue's page-in; the connection handles no other frame until
    /// it is answered.
    pub waiting_get: Option<super::channel::WaitingGet>,
    /// When the socket read being handled ended, on the latency clock: the publish time stamped
    /// on the messages it carries (one clock read per read, not per message).
    pub read_at_ns: u64,
}

impl Context {
    /// A context before the handshake.
    pub fn new(broker: Arc<Broker>, connection: Arc<ConnectionShared>) -> Context {
        let frame_max = broker.config.frame_bytes_max;
        Context {
            broker,
            connection,
            vhost: String::new(),
            user: String::new(),
            frame_max,
            exclusive_queues: Vec::new(),
            permission: None,
            topology: None,
            waiting_get: None,
            read_at_ns: 0,
        }
    }

    /// 403 unless the user may have `access` to the `kind` resource `name` in this vhost.
    pub fn check(&self, access: crate::auth::Access, kind: &str, name: &[u8]) -> Result<(), broker_core::AmqpError> {
        match &self.permission {
            Some(permission) => permission.check(access, kind, name),
            None => Err(broker_core::AmqpError::access_refused("no vhost opened")),
        }
    }

    /// The opened vhost's topology (channels exist only after connection.open).
    pub fn topology(&self) -> Result<&crate::broker::VhostTopology, broker_core::AmqpError> {
        self.topology.as_ref().ok_or_else(|| broker_core::AmqpError::command_invalid("no vhost opened"))
    }

    /// Sends a method frame.
    pub fn reply(&self, channel: u16, method: Method) {
        let mut frames = BytesMut::with_capacity(64);
        encode_method_frame(&mut frames, channel, &method);
        self.connection.send(Outbound::Frames(frames.freeze()));
    }
}
