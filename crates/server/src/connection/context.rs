//! What channel handlers need from their connection: the broker, the writer, who is logged in.

use crate::broker::Broker;
use crate::shared::{ConnectionShared, Outbound};
use amqp_codec::{encode_method_frame, Method, ShortStr};
use bytes::BytesMut;
use std::cell::RefCell;
use std::sync::Arc;
use storage::definitions::DefinitionsTicket;

/// Replies that wait until the definitions changes they answer are durable.
#[derive(Default)]
struct HeldReplies {
    /// The last change submitted; waiting for it covers the earlier ones.
    ticket: Option<DefinitionsTicket>,
    /// Every reply since the first held change, encoded in order.
    frames: BytesMut,
}

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
    /// The user's topic permissions in the vhost, as of the table's last change.
    topic_access: RefCell<crate::topic_permissions::TopicAccess>,
    /// The opened vhost's topology (set by connection.open).
    pub topology: Option<crate::broker::VhostTopology>,
    /// A basic.get waiting for its queue's page-in; the connection handles no other frame until
    /// it is answered.
    pub waiting_get: Option<super::channel::WaitingGet>,
    /// When the socket read being handled ended, on the latency clock: the publish time stamped
    /// on the messages it carries (one clock read per read, not per message).
    pub read_at_ns: u64,
    /// Replies held back until the declares and binds they answer are on disk: pipelined
    /// declares of one socket read share one fdatasync of the definitions log instead of waiting
    /// for one each (`bench/results/many-queues.md`).
    held: RefCell<HeldReplies>,
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
            topic_access: RefCell::default(),
            topology: None,
            waiting_get: None,
            read_at_ns: 0,
            held: RefCell::default(),
        }
    }

    /// Holds every reply from now on until the definitions change behind `ticket` is durable
    /// ([`Context::release_held_replies`]), so declare-ok and the replies after it keep their order.
    pub fn hold_until_durable(&self, ticket: Option<DefinitionsTicket>) {
        if let Some(ticket) = ticket {
            self.held.borrow_mut().ticket = Some(ticket);
        }
    }

    /// Whether replies are held for a definitions change.
    pub fn holds_replies(&self) -> bool {
        self.held.borrow().ticket.is_some()
    }

    /// Waits (blocking, as a single declare always did) until the held changes are durable, then
    /// sends the held replies. When the change could not be stored, the replies are dropped and
    /// the error returned: the connection closes with it, so no declare-ok promises a definition
    /// that is not on disk.
    pub fn release_held_replies(&self) -> Result<(), broker_core::AmqpError> {
        let (ticket, frames) = {
            let mut held = self.held.borrow_mut();
            (held.ticket.take(), std::mem::take(&mut held.frames))
        };
        if ticket.is_none() {
            return Ok(());
        }
        self.broker.await_definitions(ticket)?;
        if !frames.is_empty() {
            self.connection.send(Outbound::Frames(frames.freeze()));
        }
        Ok(())
    }

    /// 403 unless the user may have `access` to the `kind` resource `name` in this vhost.
    pub fn check(&self, access: crate::auth::Access, kind: &str, name: &[u8]) -> Result<(), broker_core::AmqpError> {
        match &self.permission {
            Some(permission) => permission.check(access, kind, name),
            None => Err(broker_core::AmqpError::access_refused("no vhost opened")),
        }
    }

    /// 403 unless the user may use `key` for `kind` on `exchange`: RabbitMQ 3.10.8 checks topic
    /// permissions on exchanges of type topic only, and lets every key pass without an entry.
    pub fn check_topic(
        &self,
        exchange: &broker_core::exchange::Exchange,
        kind: crate::topic_permissions::TopicAccessKind,
        key: &[u8],
    ) -> Result<(), broker_core::AmqpError> {
        if exchange.kind != broker_core::exchange::ExchangeKind::Topic {
            return Ok(());
        }
        let who = (self.user.as_str(), self.vhost.as_str());
        self.topic_access.borrow_mut().check(&self.broker.topic_permissions, who, exchange.name.as_bytes(), kind, key)
    }

    /// The opened vhost's topology (channels exist only after connection.open).
    pub fn topology(&self) -> Result<&crate::broker::VhostTopology, broker_core::AmqpError> {
        self.topology.as_ref().ok_or_else(|| broker_core::AmqpError::command_invalid("no vhost opened"))
    }

    /// Sends a method frame (or holds it behind a held reply, see [`Context::hold_until_durable`]).
    pub fn reply(&self, channel: u16, method: Method) {
        {
            let mut held = self.held.borrow_mut();
            if held.ticket.is_some() {
                encode_method_frame(&mut held.frames, channel, &method);
                return;
            }
        }
        let mut frames = BytesMut::with_capacity(64);
        encode_method_frame(&mut frames, channel, &method);
        self.connection.send(Outbound::Frames(frames.freeze()));
    }
}
