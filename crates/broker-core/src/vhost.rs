//! A virtual host's topology: exchanges, queues and bindings, and the rules RabbitMQ applies when
//! a client declares, binds or deletes them. Generic over `Q`, the runtime's queue handle, so that
//! routing hands the runtime its queues directly without a second lookup.

use crate::error::AmqpError;
use crate::exchange::consistent_hash::{binding_weight, HashOn};
use crate::exchange::{Binding, Destination, Exchange, ExchangeKind};
use amqp_codec::{BasicProperties, FieldTable, FieldValue, ShortStr};
use std::collections::HashMap;

/// How many exchange-to-exchange hops a message may take; guards against binding cycles and
/// pathological chains (a cycle is also cut by the visited check).
pub const ROUTING_HOPS_MAX: usize = 64;

/// The properties of a queue fixed at declaration.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDefinition {
    /// Its name.
    pub name: ShortStr,
    /// Whether it survives a restart.
    pub durable: bool,
    /// The connection that owns it, for exclusive queues.
    pub exclusive_owner: Option<u64>,
    /// Whether it goes away with its last consumer.
    pub auto_delete: bool,
    /// Declaration arguments, as the client sent them (`x-queue-type` included when it was sent).
    pub arguments: FieldTable,
    /// What kind of queue it is. [`Vhost::declare_queue`] parses it from `x-queue-type` once, when
    /// it creates the queue (the value a declaration carries in here is replaced); recovery reads
    /// it from the definitions file.
    pub queue_type: QueueType,
}

/// RabbitMQ's queue types, named as `x-queue-type` and the management API name them. What each
/// type allows, and whether Lepus runs it yet, is the server's queue-type seam to decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    /// The default: a single-node queue.
    #[default]
    Classic,
    /// A replicated queue (Raft).
    Quorum,
    /// An append-only log read by offset.
    Stream,
}

impl QueueType {
    /// The name `x-queue-type` and the management API use.
    pub fn name(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
            QueueType::Stream => "stream",
        }
    }

    /// The type of that name, if RabbitMQ has one.
    pub fn from_name(name: &str) -> Option<QueueType> {
        match name {
            "classic" => Some(QueueType::Classic),
            "quorum" => Some(QueueType::Quorum),
            "stream" => Some(QueueType::Stream),
            _ => None,
        }
    }

    /// The type a declaration of `queue` asks for with `x-queue-type` (classic without it), with
    /// RabbitMQ's 406 for a name it does not know or a value that is not a string.
    pub fn from_arguments(queue: &ShortStr, vhost: &str, arguments: &FieldTable) -> Result<QueueType, AmqpError> {
        let Some(value) = arguments.get(QUEUE_TYPE_ARGUMENT) else {
            return Ok(QueueType::Classic);
        };
        let Some(name) = value.as_text() else {
            return Err(invalid_argument(QUEUE_TYPE_ARGUMENT, queue, vhost, format!("{{unacceptable_type,{}}}", type_name(value))));
        };
        QueueType::from_name(&name)
            .ok_or_else(|| invalid_argument(QUEUE_TYPE_ARGUMENT, queue, vhost, format!("\"unsupported queue type '{name}'\"")))
    }
}

/// The declaration argument that names a queue's type.
pub const QUEUE_TYPE_ARGUMENT: &str = "x-queue-type";

/// A queue in the topology: its definition and the runtime's handle.
#[derive(Debug)]
pub struct QueueEntry<Q> {
    /// Fixed properties.
    pub definition: QueueDefinition,
    /// The runtime handle.
    pub handle: Q,
}

/// Arguments of exchange.declare, after decoding.
#[derive(Debug, Clone)]
pub struct ExchangeDeclaration {
    /// Name.
    pub name: ShortStr,
    /// Type name as sent.
    pub kind: ShortStr,
    /// Passive: only check it exists.
    pub passive: bool,
    /// Durable.
    pub durable: bool,
    /// Auto-delete.
    pub auto_delete: bool,
    /// Internal.
    pub internal: bool,
    /// Arguments.
    pub arguments: FieldTable,
}

/// A virtual host.
#[derive(Debug)]
pub struct Vhost<Q> {
    /// Its name ("/").
    pub name: String,
    exchanges: HashMap<ShortStr, Exchange>,
    queues: HashMap<ShortStr, QueueEntry<Q>>,
}

fn equivalence(what: &str, name: &ShortStr, vhost: &str, argument: &str, received: String, current: String) -> AmqpError {
    AmqpError::precondition(format!(
        "inequivalent arg '{argument}' for {what} '{name}' in vhost '{vhost}': received {received} but current is {current}"
    ))
}

fn quoted_bool(value: bool) -> String {
    format!("'{value}'")
}

/// A value as RabbitMQ prints it in an equivalence error: strings as text, numbers as numbers.
fn display_value(value: &FieldValue) -> String {
    match value {
        FieldValue::LongStr(text) | FieldValue::Bytes(text) => String::from_utf8_lossy(text).into_owned(),
        FieldValue::Bool(flag) => flag.to_string(),
        FieldValue::F32(number) => number.to_string(),
        FieldValue::F64(number) => number.to_string(),
        FieldValue::Timestamp(seconds) => seconds.to_string(),
        other => other.as_i64().map(|number| number.to_string()).unwrap_or_else(|| format!("{other:?}")),
    }
}

/// One side of an argument RabbitMQ found on one side only: "none", or the value with its type.
fn describe(value: Option<&FieldValue>) -> String {
    match value {
        None => "none".to_string(),
        Some(value) => format!("the value '{}' of type '{}'", display_value(value), type_name(value)),
    }
}

/// Whether an absent `x-queue-type` and a sent one mean the same queue: classic is the default,
/// so RabbitMQ takes a redeclaration with `classic` of a queue declared without the argument (and
/// the reverse) as equivalent.
fn same_queue_type(current: Option<&FieldValue>, received: Option<&FieldValue>) -> bool {
    let classic = |value: Option<&FieldValue>| value.and_then(FieldValue::as_text).as_deref() == Some(QueueType::Classic.name());
    match (current, received) {
        (None, received) => received.is_none() || classic(received),
        (current, None) => classic(current),
        (Some(current), Some(received)) => current == received,
    }
}

/// The queue arguments a redeclaration compares: those RabbitMQ 3.10.8 compares
/// (`rabbit_amqqueue:declare_args/0` and its queue types' own; an argument it does not know may
/// change, come or go), and Lepus's deduplication arguments, which change what the queue does.
const COMPARED_QUEUE_ARGUMENTS: &[&[u8]] = &[
    b"x-expires",
    b"x-message-ttl",
    b"x-dead-letter-exchange",
    b"x-dead-letter-routing-key",
    b"x-dead-letter-strategy",
    b"x-max-length",
    b"x-max-length-bytes",
    b"x-max-in-memory-length",
    b"x-max-in-memory-bytes",
    b"x-max-priority",
    b"x-overflow",
    b"x-queue-mode",
    b"x-queue-version",
    b"x-single-active-consumer",
    b"x-queue-type",
    b"x-quorum-initial-group-size",
    b"x-max-age",
    b"x-stream-max-segment-size-bytes",
    b"x-initial-cluster-size",
    b"x-queue-leader-locator",
    b"x-queue-master-locator",
    b"x-delivery-limit",
    b"x-message-deduplication",
    b"x-cache-size",
    b"x-cache-ttl",
    b"x-cache-persistence",
    b"x-deduplication-header",
];

/// Whether two argument values are equivalent as RabbitMQ compares them (`rabbit_misc`'s
/// `type_class`): integers of any width with the same value are, floats of either width too.
fn equivalent_values(old: Option<&FieldValue>, new: Option<&FieldValue>) -> bool {
    match (old, new) {
        (Some(old), Some(new)) => match (old.as_i64(), new.as_i64()) {
            (Some(old), Some(new)) => old == new,
            _ => match (old, new) {
                (FieldValue::F32(old), FieldValue::F64(new)) | (FieldValue::F64(new), FieldValue::F32(old)) => f64::from(*old) == *new,
                _ => old == new,
            },
        },
        _ => old == new,
    }
}

/// Compares the arguments RabbitMQ compares on redeclaration: for exchanges `alternate-exchange`,
/// for queues [`COMPARED_QUEUE_ARGUMENTS`].
fn compare_arguments(what: &str, name: &ShortStr, vhost: &str, current: &FieldTable, received: &FieldTable) -> Result<(), AmqpError> {
    let relevant = |key: &[u8]| {
        if what == "exchange" {
            key == b"alternate-exchange"
        } else {
            COMPARED_QUEUE_ARGUMENTS.contains(&key)
        }
    };
    let mut keys: Vec<&ShortStr> =
        current.iter().chain(received.iter()).map(|(key, _)| key).filter(|key| relevant(key.as_bytes())).collect();
    keys.dedup();
    for key in keys {
        let key_text = key.to_string_lossy();
        let (old, new) = (current.get(&key_text), received.get(&key_text));
        if what == "queue" && key_text == QUEUE_TYPE_ARGUMENT && same_queue_type(old, new) {
            continue;
        }
        match (old, new) {
            _ if equivalent_values(old, new) => {}
            // RabbitMQ prints both values bare when both sides have the argument.
            (Some(old), Some(new)) => {
                return Err(equivalence(
                    what,
                    name,
                    vhost,
                    &key_text,
                    format!("'{}'", display_value(new)),
                    format!("'{}'", display_value(old)),
                ))
            }
            _ => return Err(equivalence(what, name, vhost, &key_text, describe(new), describe(old))),
        }
    }
    Ok(())
}

impl<Q: Clone> Vhost<Q> {
    /// A vhost with the default exchange and the `amq.*` exchanges RabbitMQ predeclares.
    pub fn new(name: &str) -> Vhost<Q> {
        let mut vhost = Vhost { name: name.to_string(), exchanges: HashMap::new(), queues: HashMap::new() };
        let predeclared: [(&str, ExchangeKind, bool); 7] = [
            ("", ExchangeKind::Direct, false),
            ("amq.direct", ExchangeKind::Direct, false),
            ("amq.fanout", ExchangeKind::Fanout, false),
            ("amq.topic", ExchangeKind::Topic, false),
            ("amq.headers", ExchangeKind::Headers, false),
            ("amq.match", ExchangeKind::Headers, false),
            ("amq.rabbitmq.trace", ExchangeKind::Topic, true),
        ];
        for (exchange_name, kind, internal) in predeclared {
            let name = ShortStr::from(exchange_name);
            vhost.exchanges.insert(name.clone(), Exchange::new(name, kind, true, false, internal, FieldTable::new()));
        }
        vhost
    }

    /// A copy of the topology without the runtime's handles: the same exchanges, bindings and
    /// queue definitions, on which a change can be tried (a definitions import checks its whole
    /// file this way) without touching a queue. Costs one copy of the vhost's definitions.
    pub fn shape(&self) -> Vhost<()> {
        let queues = self
            .queues
            .iter()
            .map(|(name, entry)| (name.clone(), QueueEntry { definition: entry.definition.clone(), handle: () }))
            .collect();
        Vhost { name: self.name.clone(), exchanges: self.exchanges.clone(), queues }
    }

    /// An exchange by name.
    pub fn exchange(&self, name: &ShortStr) -> Option<&Exchange> {
        self.exchanges.get(name)
    }

    /// Every exchange.
    pub fn exchanges(&self) -> impl Iterator<Item = &Exchange> {
        self.exchanges.values()
    }

    /// A queue by name.
    pub fn queue(&self, name: &ShortStr) -> Option<&QueueEntry<Q>> {
        self.queues.get(name)
    }

    /// Every queue (its `len()` is the count, without a walk).
    pub fn queues(&self) -> impl ExactSizeIterator<Item = &QueueEntry<Q>> {
        self.queues.values()
    }

    /// 404 unless the exchange exists.
    pub fn require_exchange(&self, name: &ShortStr) -> Result<&Exchange, AmqpError> {
        self.exchanges.get(name).ok_or_else(|| AmqpError::no_exchange(&name.to_string_lossy(), &self.name))
    }

    /// The queue, checked for existence (404) and exclusive ownership (405).
    pub fn require_queue(&self, name: &ShortStr, connection_id: u64) -> Result<&QueueEntry<Q>, AmqpError> {
        let entry = self.queues.get(name).ok_or_else(|| AmqpError::no_queue(&name.to_string_lossy(), &self.name))?;
        self.check_exclusive(&entry.definition, connection_id)?;
        Ok(entry)
    }

    fn check_exclusive(&self, definition: &QueueDefinition, connection_id: u64) -> Result<(), AmqpError> {
        match definition.exclusive_owner {
            Some(owner) if owner != connection_id => Err(AmqpError::resource_locked(format!(
                "cannot obtain exclusive access to locked queue '{}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
                definition.name, self.name
            ))),
            _ => Ok(()),
        }
    }

    fn refuse_default_exchange(name: &ShortStr) -> Result<(), AmqpError> {
        if name.is_empty() {
            return Err(AmqpError::access_refused("operation not permitted on the default exchange"));
        }
        Ok(())
    }

    /// exchange.declare. Returns whether the exchange was created (so the caller persists it).
    pub fn declare_exchange(&mut self, declaration: &ExchangeDeclaration) -> Result<bool, AmqpError> {
        Self::refuse_default_exchange(&declaration.name)?;
        if declaration.passive {
            self.require_exchange(&declaration.name)?;
            return Ok(false);
        }
        let kind = ExchangeKind::parse(declaration.kind.as_bytes())
            .ok_or_else(|| AmqpError::command_invalid(format!("unknown exchange type '{}'", declaration.kind)))?;
        if let Some(existing) = self.exchanges.get(&declaration.name) {
            let name = &declaration.name;
            if existing.kind != kind {
                return Err(equivalence(
                    "exchange",
                    name,
                    &self.name,
                    "type",
                    format!("'{}'", kind.name()),
                    format!("'{}'", existing.kind.name()),
                ));
            }
            for (argument, received, current) in [
                ("durable", declaration.durable, existing.durable),
                ("auto_delete", declaration.auto_delete, existing.auto_delete),
                ("internal", declaration.internal, existing.internal),
            ] {
                if received != current {
                    return Err(equivalence("exchange", name, &self.name, argument, quoted_bool(received), quoted_bool(current)));
                }
            }
            compare_arguments("exchange", name, &self.name, &existing.arguments, &declaration.arguments)?;
            return Ok(false);
        }
        if declaration.name.as_bytes().starts_with(b"amq.") {
            return Err(AmqpError::access_refused(format!("exchange name '{}' contains reserved prefix 'amq.*'", declaration.name)));
        }
        // A delayed exchange is checked as its plugin's `validate/1` does: its type, then that
        // type's own checks.
        let routing_kind = match kind {
            ExchangeKind::Delayed => crate::exchange::delayed::delayed_type(&declaration.arguments).map_err(|reason| match reason {
                Some(reason) => AmqpError::precondition(reason),
                None => {
                    let name = declaration.arguments.get(crate::exchange::delayed::DELAYED_TYPE_ARGUMENT).and_then(FieldValue::as_text);
                    AmqpError::command_invalid(format!("unknown exchange type '{}'", name.unwrap_or_default()))
                }
            })?,
            kind => kind,
        };
        if routing_kind == ExchangeKind::ConsistentHash {
            HashOn::from_arguments(&declaration.arguments).map_err(AmqpError::precondition)?;
        }
        crate::exchange::deduplication::check(&declaration.arguments, kind == ExchangeKind::Deduplication).map_err(|(key, problem)| {
            AmqpError::precondition(format!("invalid arg '{key}' for exchange '{}' in vhost '{}': {problem}", declaration.name, self.name))
        })?;
        let exchange = Exchange::new(
            declaration.name.clone(),
            kind,
            declaration.durable,
            declaration.auto_delete,
            declaration.internal,
            declaration.arguments.clone(),
        );
        self.exchanges.insert(declaration.name.clone(), exchange);
        Ok(true)
    }

    /// Gives each exchange but the default one (which has no alternate exchange in RabbitMQ) the
    /// `alternate-exchange` its policy sets, after a policy changed or an exchange was declared.
    pub fn set_policy_alternate_exchanges(&mut self, mut alternate_of: impl FnMut(&ShortStr) -> Option<ShortStr>) {
        for exchange in self.exchanges.values_mut().filter(|exchange| !exchange.name.is_empty()) {
            exchange.policy_alternate_exchange = alternate_of(&exchange.name);
        }
    }

    /// Sets one exchange's policy `alternate-exchange` (a new exchange's).
    pub fn set_policy_alternate_exchange(&mut self, name: &ShortStr, alternate: Option<ShortStr>) {
        if let Some(exchange) = self.exchanges.get_mut(name).filter(|exchange| !exchange.name.is_empty()) {
            exchange.policy_alternate_exchange = alternate;
        }
    }

    /// Inserts an exchange as recovered from disk, bypassing the client-facing checks.
    pub fn restore_exchange(&mut self, exchange: Exchange) {
        self.exchanges.insert(exchange.name.clone(), exchange);
    }

    /// exchange.delete. Returns the deleted exchange (None if it did not exist: RabbitMQ answers
    /// delete-ok for a missing exchange).
    pub fn delete_exchange(&mut self, name: &ShortStr, if_unused: bool) -> Result<Option<Exchange>, AmqpError> {
        Self::refuse_default_exchange(name)?;
        if name.as_bytes().starts_with(b"amq.") {
            return Err(AmqpError::access_refused(format!("deletion of system exchange '{name}' in vhost '{}' not allowed", self.name)));
        }
        let Some(exchange) = self.exchanges.get(name) else {
            return Ok(None);
        };
        let destination = Destination::Exchange(name.clone());
        let bound_as_destination = self.exchanges.values().any(|source| source.bindings.iter().any(|b| b.destination == destination));
        if if_unused && (!exchange.bindings.is_empty() || bound_as_destination) {
            return Err(AmqpError::precondition(format!("exchange '{name}' in vhost '{}' in use", self.name)));
        }
        let removed = self.exchanges.remove(name);
        self.remove_bindings_to(&destination);
        Ok(removed)
    }

    /// queue.declare. `make_handle` creates the runtime handle when the queue is new, after the
    /// checks that do not depend on the queue's type; it checks what the type allows (the
    /// server's queue-type seam) and may refuse. Returns the entry and whether it was created.
    pub fn declare_queue(
        &mut self,
        definition: QueueDefinition,
        passive: bool,
        server_named: bool,
        connection_id: u64,
        make_handle: impl FnOnce(&QueueDefinition) -> Result<Q, AmqpError>,
    ) -> Result<(&QueueEntry<Q>, bool), AmqpError> {
        if passive {
            return Ok((self.require_queue(&definition.name, connection_id)?, false));
        }
        if let Some(existing) = self.queues.get(&definition.name) {
            self.check_exclusive(&existing.definition, connection_id)?;
            let current = &existing.definition;
            // RabbitMQ answers an exclusive flag that differs from the original with 405, not 406.
            if current.exclusive_owner.is_some() != definition.exclusive_owner.is_some() {
                return Err(AmqpError::resource_locked(format!(
                    "cannot obtain exclusive access to locked queue '{}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
                    definition.name, self.name
                )));
            }
            let name = &definition.name;
            for (argument, received, now) in [
                ("durable", definition.durable, current.durable),
                ("exclusive", definition.exclusive_owner.is_some(), current.exclusive_owner.is_some()),
                ("auto_delete", definition.auto_delete, current.auto_delete),
            ] {
                if received != now {
                    return Err(equivalence("queue", name, &self.name, argument, quoted_bool(received), quoted_bool(now)));
                }
            }
            compare_arguments("queue", name, &self.name, &current.arguments, &definition.arguments)?;
            let entry = self.queues.get(&definition.name).expect("checked above");
            return Ok((entry, false));
        }
        if !server_named && definition.name.as_bytes().starts_with(b"amq.") {
            return Err(AmqpError::access_refused(format!("queue name '{}' contains reserved prefix 'amq.*'", definition.name)));
        }
        let mut definition = definition;
        definition.queue_type = QueueType::from_arguments(&definition.name, &self.name, &definition.arguments)?;
        let handle = make_handle(&definition)?;
        let name = definition.name.clone();
        self.queues.insert(name.clone(), QueueEntry { definition, handle });
        Ok((self.queues.get(&name).expect("just inserted"), true))
    }

    /// Inserts a queue as recovered from disk.
    pub fn restore_queue(&mut self, definition: QueueDefinition, handle: Q) {
        self.queues.insert(definition.name.clone(), QueueEntry { definition, handle });
    }

    /// Removes a queue and every binding to it. Returns the entry and the auto-delete exchanges
    /// that lost their last binding and went with it.
    pub fn remove_queue(&mut self, name: &ShortStr) -> Option<(QueueEntry<Q>, Vec<Exchange>)> {
        let entry = self.queues.remove(name)?;
        let removed_exchanges = self.remove_bindings_to(&Destination::Queue(name.clone()));
        Some((entry, removed_exchanges))
    }

    fn remove_bindings_to(&mut self, destination: &Destination) -> Vec<Exchange> {
        let mut emptied = Vec::new();
        for exchange in self.exchanges.values_mut() {
            if exchange.unbind_destination(destination) > 0 && exchange.auto_delete && exchange.bindings.is_empty() {
                emptied.push(exchange.name.clone());
            }
        }
        emptied.into_iter().filter_map(|name| self.exchanges.remove(&name)).collect()
    }

    /// queue.bind / exchange.bind. Returns whether the binding is new.
    pub fn bind(&mut self, source: &ShortStr, binding: Binding) -> Result<bool, AmqpError> {
        Self::refuse_default_exchange(source)?;
        if let Some(mode) = binding.arguments.get("x-match") {
            let valid = mode.as_text().is_some_and(|text| matches!(text.as_str(), "all" | "any" | "all-with-x" | "any-with-x"));
            if !valid && self.exchanges.get(source).is_some_and(|exchange| exchange.routing_kind() == ExchangeKind::Headers) {
                return Err(AmqpError::precondition(format!(
                    "Invalid x-match field value {mode:?}; expected all, any, all-with-x, or any-with-x"
                )));
            }
        }
        if let Destination::Exchange(destination) = &binding.destination {
            Self::refuse_default_exchange(destination)?;
            self.require_exchange(destination)?;
        }
        let vhost = self.name.clone();
        let exchange = self.exchanges.get_mut(source).ok_or_else(|| AmqpError::no_exchange(&source.to_string_lossy(), &vhost))?;
        if exchange.routing_kind() == ExchangeKind::ConsistentHash {
            binding_weight(binding.routing_key.as_bytes()).map_err(AmqpError::precondition)?;
        }
        Ok(exchange.bind(binding))
    }

    /// queue.unbind / exchange.unbind. Returns whether a binding was removed, and the source if it
    /// was auto-delete and lost its last binding.
    pub fn unbind(&mut self, source: &ShortStr, binding: &Binding) -> Result<(bool, Option<Exchange>), AmqpError> {
        Self::refuse_default_exchange(source)?;
        if let Destination::Exchange(destination) = &binding.destination {
            Self::refuse_default_exchange(destination)?;
        }
        // RabbitMQ answers unbind-ok when the source exchange does not exist: there is no binding
        // to remove, and clients (kombu's cleanup among them) rely on that.
        let Some(exchange) = self.exchanges.get_mut(source) else {
            return Ok((false, None));
        };
        let removed = exchange.unbind(binding);
        if removed && exchange.auto_delete && exchange.bindings.is_empty() {
            return Ok((true, self.exchanges.remove(source)));
        }
        Ok((removed, None))
    }

    /// Routes a message published to `exchange` with `routing_key`: follows exchange-to-exchange
    /// bindings and alternate exchanges, and pushes each matched queue's handle once into `out`.
    /// `properties` is called at most once, and only when an exchange on the way needs them.
    /// A delayed exchange on the way that holds the message back for its `x-delay` routes it
    /// nowhere now and is pushed into `delayed` with the delay, for the caller to route the
    /// message from it later (see [`crate::exchange::delayed`]).
    pub fn route(
        &self,
        exchange: &ShortStr,
        routing_key: &ShortStr,
        properties: &mut dyn FnMut() -> Option<BasicProperties>,
        out: &mut Vec<Q>,
        delayed: &mut Vec<DelayedRoute>,
    ) {
        // The default exchange routes to the queue named by the key and nowhere else: no walk,
        // and none of the walk's allocations, for the most common publish.
        if exchange.is_empty() && self.exchanges.contains_key(exchange) {
            if let Some(entry) = self.queues.get(routing_key) {
                out.push(entry.handle.clone());
            }
            return;
        }
        let mut matched_names = MatchedNames::default();
        let mut decoded_properties: Option<Option<BasicProperties>> = None;
        let mut visited: Vec<ShortStr> = Vec::new();
        let mut pending: Vec<ShortStr> = vec![exchange.clone()];
        while let Some(current) = pending.pop() {
            if visited.contains(&current) || visited.len() >= ROUTING_HOPS_MAX {
                continue;
            }
            visited.push(current.clone());
            let Some(source) = self.exchanges.get(&current) else {
                continue;
            };
            let before = matched_names.len();
            if current.is_empty() {
                if self.queues.contains_key(routing_key) {
                    matched_names.insert(routing_key);
                }
            } else {
                if source.needs_properties() && decoded_properties.is_none() {
                    decoded_properties = Some(properties());
                }
                let properties = decoded_properties.as_ref().and_then(|properties| properties.as_ref());
                let mut routed_somewhere = false;
                let delay_ms = match source.kind {
                    ExchangeKind::Delayed => crate::exchange::delayed::message_delay_ms(properties.and_then(|p| p.headers.as_ref())),
                    _ => None,
                };
                if let Some(delay_ms) = delay_ms {
                    delayed.push(DelayedRoute { exchange: current.clone(), delay_ms });
                } else {
                    source.route(routing_key.as_bytes(), properties, |destination| {
                        routed_somewhere = true;
                        match destination {
                            Destination::Queue(name) => matched_names.insert(name),
                            Destination::Exchange(name) => pending.push(name.clone()),
                        }
                    });
                }
                // The alternate exchange takes what this exchange could not route anywhere.
                if !routed_somewhere && matched_names.len() == before {
                    if let Some(alternate) = source.alternate_exchange() {
                        pending.push(alternate);
                    }
                }
            }
        }
        for name in matched_names.names {
            if let Some(entry) = self.queues.get(&name) {
                out.push(entry.handle.clone());
            }
        }
    }

    /// Every binding, as (source exchange, binding), for persistence and listing.
    pub fn bindings(&self) -> impl Iterator<Item = (&Exchange, &Binding)> {
        self.exchanges.values().flat_map(|exchange| exchange.bindings.iter().map(move |binding| (exchange, binding)))
    }
}

/// The queues a publish matched, each once, in the order first matched. A short list is searched
/// in place; past [`MatchedNames::LINEAR_MAX`] names a set takes over, so a fan-out to 1,000
/// queues costs 1,000 lookups, not 500,000 name comparisons (they were 15 % of the broker's CPU).
#[derive(Default)]
struct MatchedNames {
    names: Vec<ShortStr>,
    index: Option<std::collections::HashSet<ShortStr>>,
}

impl MatchedNames {
    const LINEAR_MAX: usize = 16;

    fn insert(&mut self, name: &ShortStr) {
        match &mut self.index {
            Some(index) => {
                if index.insert(name.clone()) {
                    self.names.push(name.clone());
                }
            }
            None if self.names.contains(name) => {}
            None => {
                self.names.push(name.clone());
                if self.names.len() > Self::LINEAR_MAX {
                    self.index = Some(self.names.iter().cloned().collect());
                }
            }
        }
    }

    fn len(&self) -> usize {
        self.names.len()
    }
}

/// A delayed exchange that held a message back: route the message from it after `delay_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayedRoute {
    /// The delayed exchange.
    pub exchange: ShortStr,
    /// The message's `x-delay`.
    pub delay_ms: u64,
}

/// The overflow behaviour of a queue with `x-max-length` or `x-max-length-bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Drop the oldest ready message to make room (RabbitMQ's default).
    DropHead,
    /// Refuse the new message: the publisher gets basic.nack in confirm mode.
    RejectPublish,
    /// Refuse the new message and dead-letter it (reason `maxlen`).
    RejectPublishDeadLetter,
}

impl Overflow {
    /// The mode of that `x-overflow` (or policy `overflow`) name.
    pub fn from_name(name: &str) -> Option<Overflow> {
        match name {
            "drop-head" => Some(Overflow::DropHead),
            "reject-publish" => Some(Overflow::RejectPublish),
            "reject-publish-dlx" => Some(Overflow::RejectPublishDeadLetter),
            _ => None,
        }
    }
}

fn invalid_argument(key: &str, queue: &ShortStr, vhost: &str, problem: String) -> AmqpError {
    AmqpError::precondition(format!("invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {problem}"))
}

/// Checks the value of one queue.declare argument whose meaning does not depend on the queue's
/// type, with RabbitMQ's 406 texts. Which arguments a type takes at all is the server's to decide.
pub fn check_queue_argument(key: &str, value: &FieldValue, queue: &ShortStr, vhost: &str) -> Result<(), AmqpError> {
    match key {
        "x-max-length-bytes" => match value.as_i64() {
            Some(limit) if limit >= 0 => Ok(()),
            Some(limit) => Err(invalid_argument(key, queue, vhost, format!("{{value_negative,{limit}}}"))),
            None => Err(invalid_argument(key, queue, vhost, format!("\"expected integer, got {}\"", type_name(value)))),
        },
        "x-dead-letter-exchange" => match value {
            FieldValue::LongStr(_) => Ok(()),
            other => Err(AmqpError::precondition(format!(
                "invalid type '{}' for arg '{key}' in queue '{queue}' in vhost '{vhost}'",
                type_name(other)
            ))),
        },
        "x-dead-letter-routing-key" => match value {
            // Without x-dead-letter-exchange beside it, the declaration is refused too: see
            // `check_dead_letter_routing_key`.
            FieldValue::LongStr(_) => Ok(()),
            other => Err(invalid_argument(key, queue, vhost, format!("{{unacceptable_type,{}}}", type_name(other)))),
        },
        // RabbitMQ's check_int_arg words a non-integer as a quoted string (measured on 3.10.8).
        "x-max-length" | "x-delivery-limit" => match value.as_i64() {
            Some(limit) if limit >= 0 => Ok(()),
            Some(limit) => Err(invalid_argument(key, queue, vhost, format!("{{value_negative,{limit}}}"))),
            None => Err(invalid_argument(key, queue, vhost, format!("\"expected integer, got {}\"", type_name(value)))),
        },
        "x-message-ttl" => match value.as_i64() {
            Some(ttl) if ttl > QUEUE_EXPIRES_MS_MAX => Err(invalid_argument(key, queue, vhost, format!("{{value_too_large,{ttl}}}"))),
            Some(ttl) if ttl >= 0 => Ok(()),
            Some(ttl) => Err(invalid_argument(key, queue, vhost, format!("{{value_negative,{ttl}}}"))),
            None => Err(invalid_argument(key, queue, vhost, format!("\"expected integer, got {}\"", type_name(value)))),
        },
        "x-overflow" => match value.as_text().as_deref() {
            Some("drop-head" | "reject-publish" | "reject-publish-dlx") => Ok(()),
            Some(_) => Err(invalid_argument(key, queue, vhost, "invalid_overflow".to_string())),
            None => Err(invalid_argument(key, queue, vhost, format!("{{unacceptable_type,{}}}", type_name(value)))),
        },
        "x-message-deduplication" | "x-cache-size" | "x-cache-ttl" | "x-cache-persistence" | "x-deduplication-header" => {
            let mut single = FieldTable::new();
            single.insert(key, value.clone());
            crate::exchange::deduplication::check(&single, false).map_err(|(key, problem)| invalid_argument(key, queue, vhost, problem))
        }
        _ => check_consumer_side_argument(key, value, queue, vhost),
    }
}

/// The longest x-expires RabbitMQ 3.10.8 takes: ten years in milliseconds (measured: one more is
/// refused with `value_too_large`).
pub const QUEUE_EXPIRES_MS_MAX: i64 = 315_360_000_000;

/// The highest x-max-priority RabbitMQ takes on a classic queue.
pub const MAX_PRIORITY_MAX: i64 = 255;

/// x-expires, x-max-priority and x-single-active-consumer, with the texts RabbitMQ 3.10.8 answers
/// (measured against it). An integer argument of another type is refused with the text of
/// RabbitMQ's `check_int_arg`, which its reply prints as a quoted string.
fn check_consumer_side_argument(key: &str, value: &FieldValue, queue: &ShortStr, vhost: &str) -> Result<(), AmqpError> {
    let expected_integer = || invalid_argument(key, queue, vhost, format!("\"expected integer, got {}\"", type_name(value)));
    match key {
        "x-expires" => match value.as_i64().ok_or_else(expected_integer)? {
            0 => Err(invalid_argument(key, queue, vhost, "{value_zero,0}".to_string())),
            expires if expires < 0 => Err(invalid_argument(key, queue, vhost, format!("{{value_negative,{expires}}}"))),
            expires if expires > QUEUE_EXPIRES_MS_MAX => Err(invalid_argument(key, queue, vhost, format!("{{value_too_large,{expires}}}"))),
            _ => Ok(()),
        },
        "x-max-priority" => match value.as_i64().ok_or_else(expected_integer)? {
            priority if priority < 0 => Err(invalid_argument(key, queue, vhost, format!("{{value_negative,{priority}}}"))),
            priority if priority > MAX_PRIORITY_MAX => {
                Err(invalid_argument(key, queue, vhost, format!("{{max_value_exceeded,{priority}}}")))
            }
            _ => Ok(()),
        },
        "x-single-active-consumer" => match value {
            FieldValue::Bool(_) => Ok(()),
            _ => Err(invalid_argument(key, queue, vhost, format!("{{unacceptable_type,{}}}", type_name(value)))),
        },
        _ => Ok(()),
    }
}

/// RabbitMQ refuses a dead-letter routing key without a dead-letter exchange.
pub fn check_dead_letter_routing_key(arguments: &FieldTable, queue: &ShortStr, vhost: &str) -> Result<(), AmqpError> {
    let key = "x-dead-letter-routing-key";
    if arguments.get(key).is_some() && arguments.get("x-dead-letter-exchange").is_none() {
        return Err(invalid_argument(key, queue, vhost, "routing_key_but_no_dlx_defined".to_string()));
    }
    Ok(())
}

/// The AMQP type name RabbitMQ reports for a value of the wrong type (for the checks of other
/// crates: the server's queue types check their own arguments).
pub fn field_type_name(value: &FieldValue) -> &'static str {
    type_name(value)
}

/// The AMQP type name RabbitMQ reports for a value of the wrong type.
fn type_name(value: &FieldValue) -> &'static str {
    match value {
        FieldValue::Bool(_) => "bool",
        FieldValue::LongStr(_) => "longstr",
        FieldValue::Bytes(_) => "binary",
        FieldValue::Table(_) => "table",
        FieldValue::Array(_) => "array",
        FieldValue::Timestamp(_) => "timestamp",
        FieldValue::Void => "void",
        FieldValue::F32(_) => "float",
        FieldValue::F64(_) => "double",
        FieldValue::Decimal(_) => "decimal",
        FieldValue::I8(_) => "byte",
        FieldValue::U8(_) => "unsignedbyte",
        FieldValue::I16(_) => "short",
        FieldValue::U16(_) => "unsignedshort",
        FieldValue::I32(_) => "signedint",
        FieldValue::U32(_) => "unsignedint",
        FieldValue::I64(_) => "long",
    }
}

#[cfg(test)]
mod routing_tests {
    use super::*;

    fn queue(vhost: &mut Vhost<String>, name: &str) {
        let definition = QueueDefinition {
            name: ShortStr::from(name),
            durable: false,
            exclusive_owner: None,
            auto_delete: false,
            arguments: FieldTable::new(),
            queue_type: QueueType::Classic,
        };
        vhost.declare_queue(definition, false, false, 1, |definition| Ok(definition.name.to_string_lossy())).expect("declare");
    }

    fn bind(vhost: &mut Vhost<String>, exchange: &str, destination: Destination, key: &str) {
        let binding = Binding { destination, routing_key: ShortStr::from(key), arguments: FieldTable::new() };
        vhost.bind(&ShortStr::from(exchange), binding).expect("bind");
    }

    fn routed(vhost: &Vhost<String>, exchange: &str, key: &str) -> Vec<String> {
        let (mut out, mut delayed) = (Vec::new(), Vec::new());
        vhost.route(&ShortStr::from(exchange), &ShortStr::from(key), &mut || None, &mut out, &mut delayed);
        out
    }

    #[test]
    fn a_fan_out_reaches_each_queue_once_in_the_order_first_matched() {
        // Past the short list's length the set takes over: each queue is matched by two bindings
        // of amq.topic and once more through amq.fanout (bound to amq.topic's key), and must still
        // come out once, in the order of its first match.
        let mut vhost: Vhost<String> = Vhost::new("/");
        let names: Vec<String> = (0..40).map(|index| format!("q{index:02}")).collect();
        for name in &names {
            queue(&mut vhost, name);
            bind(&mut vhost, "amq.topic", Destination::Queue(ShortStr::from(name.as_str())), "a.*");
            bind(&mut vhost, "amq.topic", Destination::Queue(ShortStr::from(name.as_str())), "#");
            bind(&mut vhost, "amq.fanout", Destination::Queue(ShortStr::from(name.as_str())), "");
        }
        bind(&mut vhost, "amq.topic", Destination::Exchange(ShortStr::from("amq.fanout")), "a.b");
        let out = routed(&vhost, "amq.topic", "a.b");
        let mut sorted = out.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, names, "every queue, each once");
        assert_eq!(out.len(), names.len());
        assert_eq!(routed(&vhost, "amq.topic", "z"), names, "one binding each: in binding order");
    }
}
