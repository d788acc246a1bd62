//! Exchanges and their bindings: where a message goes, given its routing key and headers.

pub mod consistent_hash;
pub mod deduplication;
pub mod delayed;
mod headers;
mod topic;

pub use headers::headers_match;
pub use topic::topic_matches;

use amqp_codec::{BasicProperties, FieldTable, ShortStr};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// The exchange types RabbitMQ ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Routing key equals binding key.
    Direct,
    /// Every binding.
    Fanout,
    /// Dotted words with `*` and `#` wildcards.
    Topic,
    /// Header values against binding arguments (`x-match`).
    Headers,
    /// One binding per message, by a hash of its routing key (or a header or property), each
    /// binding weighted by the integer of its key (RabbitMQ's rabbitmq_consistent_hash_exchange).
    ConsistentHash,
    /// Routes as the type of its `x-delayed-type` argument, holding back for its `x-delay` a
    /// message that asks for one (the rabbitmq-delayed-message-exchange plugin; see [`delayed`]).
    Delayed,
    /// Every binding, each message once per `x-deduplication-header` value within the cache's
    /// time to live (the rabbitmq-message-deduplication plugin's type; see [`deduplication`]).
    Deduplication,
}

impl ExchangeKind {
    /// Parses the type name a client declares.
    pub fn parse(name: &[u8]) -> Option<ExchangeKind> {
        match name {
            b"direct" => Some(ExchangeKind::Direct),
            b"fanout" => Some(ExchangeKind::Fanout),
            b"topic" => Some(ExchangeKind::Topic),
            b"headers" => Some(ExchangeKind::Headers),
            b"x-consistent-hash" => Some(ExchangeKind::ConsistentHash),
            b"x-delayed-message" => Some(ExchangeKind::Delayed),
            b"x-message-deduplication" => Some(ExchangeKind::Deduplication),
            _ => None,
        }
    }

    /// The type name.
    pub fn name(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
            ExchangeKind::ConsistentHash => "x-consistent-hash",
            ExchangeKind::Delayed => "x-delayed-message",
            ExchangeKind::Deduplication => "x-message-deduplication",
        }
    }
}

/// What a binding points at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    /// A queue, by name.
    Queue(ShortStr),
    /// Another exchange (exchange-to-exchange binding), by name.
    Exchange(ShortStr),
}

/// A binding from an exchange to a destination.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// Where matching messages go.
    pub destination: Destination,
    /// The binding key.
    pub routing_key: ShortStr,
    /// Binding arguments (used by headers exchanges; part of a binding's identity).
    pub arguments: FieldTable,
}

/// What was published through an exchange, RabbitMQ's `publish_in` and `publish_out`. Channels
/// count into it in batches (a channel adds its counts once per socket read, not per message),
/// the management API reads it.
#[derive(Debug, Default)]
pub struct ExchangeStats {
    /// Messages published to the exchange.
    pub published_in: AtomicU64,
    /// Messages it routed into queues, one per queue reached.
    pub published_out: AtomicU64,
}

impl ExchangeStats {
    /// Counts `published_in` messages published to the exchange and `published_out` queue
    /// deliveries they were routed to.
    pub fn add(&self, published_in: u64, published_out: u64) {
        self.published_in.fetch_add(published_in, std::sync::atomic::Ordering::Relaxed);
        self.published_out.fetch_add(published_out, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An exchange's [`ExchangeStats`], shared by its clones. Not part of the exchange's identity:
/// exchanges compare equal whatever they counted.
#[derive(Debug, Clone, Default)]
pub struct ExchangeStatsHandle(pub Arc<ExchangeStats>);

impl PartialEq for ExchangeStatsHandle {
    fn eq(&self, _other: &ExchangeStatsHandle) -> bool {
        true
    }
}

/// An exchange and its outgoing bindings.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// Its name ("" is the default exchange).
    pub name: ShortStr,
    /// Its type.
    pub kind: ExchangeKind,
    /// Whether it survives a restart.
    pub durable: bool,
    /// Whether it goes away when its last binding does.
    pub auto_delete: bool,
    /// Whether clients may not publish to it directly.
    pub internal: bool,
    /// Declaration arguments, compared on redeclaration.
    pub arguments: FieldTable,
    /// Outgoing bindings, in creation order.
    pub bindings: Vec<Binding>,
    /// The `alternate-exchange` of the policy that applies to it, if any; its own argument wins
    /// over it, as in RabbitMQ.
    pub policy_alternate_exchange: Option<ShortStr>,
    /// Whether and how it drops duplicates (from its type and arguments, fixed at declaration).
    pub deduplication: Option<deduplication::DeduplicationSettings>,
    /// What was published through it.
    pub stats: ExchangeStatsHandle,
}

impl Exchange {
    /// A new exchange with no bindings.
    pub fn new(name: ShortStr, kind: ExchangeKind, durable: bool, auto_delete: bool, internal: bool, arguments: FieldTable) -> Exchange {
        let deduplication = deduplication::settings(&arguments, kind == ExchangeKind::Deduplication);
        Exchange {
            name,
            kind,
            durable,
            auto_delete,
            internal,
            arguments,
            bindings: Vec::new(),
            policy_alternate_exchange: None,
            deduplication,
            stats: ExchangeStatsHandle::default(),
        }
    }

    /// Where what it cannot route goes: its `alternate-exchange` argument, else its policy's.
    pub fn alternate_exchange(&self) -> Option<ShortStr> {
        match self.arguments.get("alternate-exchange").and_then(|value| value.as_text()) {
            Some(name) => Some(ShortStr::truncating(name)),
            None => self.policy_alternate_exchange.clone(),
        }
    }

    /// The rules it routes by: its type's, or for a delayed exchange its `x-delayed-type`'s
    /// (checked at declaration; one restored from disk without a valid one routes as direct).
    pub fn routing_kind(&self) -> ExchangeKind {
        match self.kind {
            ExchangeKind::Delayed => delayed::delayed_type(&self.arguments).unwrap_or(ExchangeKind::Direct),
            kind => kind,
        }
    }

    /// Whether routing needs the message's properties (its headers, or what a consistent-hash
    /// exchange hashes, or a delayed exchange's `x-delay`), which cost a decode.
    pub fn needs_properties(&self) -> bool {
        match self.routing_kind() {
            _ if self.kind == ExchangeKind::Delayed => true,
            ExchangeKind::Headers => true,
            ExchangeKind::ConsistentHash => {
                self.arguments.get(consistent_hash::HASH_HEADER_ARGUMENT).is_some()
                    || self.arguments.get(consistent_hash::HASH_PROPERTY_ARGUMENT).is_some()
            }
            _ => false,
        }
    }

    /// Calls `found` with each destination whose binding matches.
    pub fn route(&self, routing_key: &[u8], properties: Option<&BasicProperties>, mut found: impl FnMut(&Destination)) {
        let kind = self.routing_kind();
        if kind == ExchangeKind::ConsistentHash {
            // Checked at declaration; an exchange restored from disk with bad arguments routes
            // by its routing key.
            let hash_on = consistent_hash::HashOn::from_arguments(&self.arguments).unwrap_or(consistent_hash::HashOn::RoutingKey);
            let hash = consistent_hash::message_hash(&hash_on, routing_key, properties);
            if let Some(binding) = consistent_hash::choose(&self.bindings, hash) {
                found(&binding.destination);
            }
            return;
        }
        let headers = properties.and_then(|properties| properties.headers.as_ref());
        for binding in &self.bindings {
            let matches = match kind {
                ExchangeKind::Direct | ExchangeKind::Delayed => binding.routing_key.as_bytes() == routing_key,
                ExchangeKind::Fanout | ExchangeKind::Deduplication => true,
                ExchangeKind::Topic => topic_matches(binding.routing_key.as_bytes(), routing_key),
                ExchangeKind::Headers => headers_match(&binding.arguments, headers),
                ExchangeKind::ConsistentHash => false,
            };
            if matches {
                found(&binding.destination);
            }
        }
    }

    /// Adds a binding unless the same one exists; returns whether it was added.
    pub fn bind(&mut self, binding: Binding) -> bool {
        if self.bindings.contains(&binding) {
            return false;
        }
        self.bindings.push(binding);
        true
    }

    /// Removes a binding; returns whether it existed.
    pub fn unbind(&mut self, binding: &Binding) -> bool {
        let before = self.bindings.len();
        self.bindings.retain(|existing| existing != binding);
        before != self.bindings.len()
    }

    /// Removes every binding to `destination`; returns how many went.
    pub fn unbind_destination(&mut self, destination: &Destination) -> usize {
        let before = self.bindings.len();
        self.bindings.retain(|existing| &existing.destination != destination);
        before - self.bindings.len()
    }
}
