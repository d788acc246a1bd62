//! What each queue type allows, checked at queue.declare and at basic.consume and basic.get, with
//! RabbitMQ's reply codes and texts. The argument lists are those RabbitMQ 3.10.8's
//! `rabbit_classic_queue`, `rabbit_quorum_queue` and `rabbit_stream_queue` report from
//! `capabilities()`, except where Lepus does not implement an argument yet.

use amqp_codec::ShortStr;
use broker_core::vhost::{check_dead_letter_routing_key, check_queue_argument, QueueDefinition, QueueType};
use broker_core::AmqpError;

/// What a queue type allows.
#[derive(Debug)]
pub struct QueueTypeCapabilities {
    /// The type.
    pub queue_type: QueueType,
    /// Whether Lepus runs queues of this type; a declaration of another is refused with 540.
    pub implemented: bool,
    /// The declaration arguments of [`GATED_QUEUE_ARGUMENTS`] the type takes (for quorum and
    /// stream, what RabbitMQ's types take: what their implementations are to honour).
    pub accepted_arguments: &'static [&'static str],
    /// Whether a queue of the type may be exclusive.
    pub exclusive: bool,
    /// Whether it may be transient (durable=false).
    pub non_durable: bool,
    /// Whether it may be auto-delete.
    pub auto_delete: bool,
    /// Whether a channel with a global prefetch (basic.qos global=true) may consume from it.
    pub global_qos: bool,
    /// Whether basic.get reads from it.
    pub basic_get: bool,
    /// Whether a consumer may take deliveries without acks (no_ack).
    pub no_ack_consume: bool,
    /// Whether a consumer's `x-priority` argument orders deliveries among its consumers (RabbitMQ's
    /// streams do not take it, and ignore it).
    pub consumer_priorities: bool,
}

/// The arguments whose support Lepus decides per type: one of them that a type does not accept is
/// refused with 540 rather than silently ignored. Any other argument is ignored, as RabbitMQ
/// ignores arguments it does not know and hints such as `x-queue-mode` that change no outcome.
/// Adding an argument here refuses it on every type that does not list it in `accepted_arguments`.
pub const GATED_QUEUE_ARGUMENTS: &[&str] = &[
    "x-queue-type",
    "x-max-length",
    "x-message-ttl",
    "x-overflow",
    "x-expires",
    "x-max-length-bytes",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-priority",
    "x-single-active-consumer",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-delivery-limit",
    "x-quorum-initial-group-size",
];

const CLASSIC: QueueTypeCapabilities = QueueTypeCapabilities {
    queue_type: QueueType::Classic,
    implemented: true,
    accepted_arguments: &[
        "x-queue-type",
        "x-max-length",
        "x-message-ttl",
        "x-overflow",
        "x-max-length-bytes",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        // A Lepus extension: RabbitMQ 3.10.8 refuses it on classic queues (406).
        "x-delivery-limit",
        "x-expires",
        "x-single-active-consumer",
        "x-max-priority",
    ],
    exclusive: true,
    non_durable: true,
    auto_delete: true,
    global_qos: true,
    basic_get: true,
    no_ack_consume: true,
    consumer_priorities: true,
};

const QUORUM: QueueTypeCapabilities = QueueTypeCapabilities {
    queue_type: QueueType::Quorum,
    implemented: true,
    // What RabbitMQ 3.10.8's quorum queues take.
    accepted_arguments: &[
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
    ],
    exclusive: false,
    non_durable: false,
    auto_delete: false,
    global_qos: false,
    basic_get: true,
    no_ack_consume: true,
    consumer_priorities: true,
};

const STREAM: QueueTypeCapabilities = QueueTypeCapabilities {
    queue_type: QueueType::Stream,
    implemented: true,
    accepted_arguments: &[
        "x-max-length-bytes",
        "x-queue-type",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    ],
    exclusive: false,
    non_durable: false,
    auto_delete: false,
    global_qos: false,
    basic_get: false,
    no_ack_consume: false,
    consumer_priorities: false,
};

/// The declaration arguments RabbitMQ 3.10.8 knows (`rabbit_amqqueue:declare_args/0`, and
/// x-delivery-limit). A queue type other than classic refuses one of them that it does not take
/// with 406 "invalid arg ... of queue type ..." (measured: x-max-priority, x-queue-mode,
/// x-queue-version, x-max-age on a quorum queue); an argument RabbitMQ does not know is ignored.
pub const RABBITMQ_QUEUE_ARGUMENTS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
    "x-queue-master-locator",
    "x-delivery-limit",
];

/// Whether `key` is an argument only other queue types take: one the quorum or stream type takes
/// and classic queues do not (`classic_accepted`, with Lepus's `x-delivery-limit`). RabbitMQ 3.10.8
/// refuses such an argument on a classic queue with 406 "... of queue type rabbit_classic_queue"
/// (its invalid arguments are every type's arguments less the type's own).
fn is_other_types_argument(key: &str, classic_accepted: &[&str]) -> bool {
    [QUORUM.accepted_arguments, STREAM.accepted_arguments].iter().any(|taken| taken.contains(&key)) && !classic_accepted.contains(&key)
}

/// Arguments a type takes that Lepus does not implement for it yet: refused with 540.
fn not_implemented_for(queue_type: QueueType, key: &str, _value: &amqp_codec::FieldValue) -> bool {
    match (queue_type, key) {
        // Deduplication (a Lepus extension, as LavinMQ's) keeps its cache beside a classic queue's
        // log or in a quorum queue's replicated state; a stream keeps everything it is given.
        (QueueType::Stream, "x-message-deduplication") => true,
        _ => false,
    }
}

/// A server-named queue of any type but classic is refused, before anything else is looked at
/// (RabbitMQ 3.10.8, measured), on a single node and through a clustered node alike.
pub fn check_server_named(queue_type: QueueType, server_named: bool) -> Result<(), AmqpError> {
    if server_named && queue_type != QueueType::Classic {
        return Err(AmqpError::precondition(format!("Cannot declare a server-named queue for type {}", type_module(queue_type))));
    }
    Ok(())
}

/// The name RabbitMQ's replies give a queue type's module.
fn type_module(queue_type: QueueType) -> &'static str {
    match queue_type {
        QueueType::Classic => "rabbit_classic_queue",
        QueueType::Quorum => "rabbit_quorum_queue",
        QueueType::Stream => "rabbit_stream_queue",
    }
}

/// RabbitMQ 3.10.8's checks of the arguments only quorum and stream queues know (measured).
fn check_replicated_argument(key: &str, value: &amqp_codec::FieldValue, queue: &ShortStr, vhost: &str) -> Option<Result<(), AmqpError>> {
    use amqp_codec::FieldValue;
    let invalid =
        |reason: String| Err(AmqpError::precondition(format!("invalid arg '{key}' for {}: {reason}", describe_queue(queue, vhost))));
    let type_name = |value: &FieldValue| broker_core::vhost::field_type_name(value);
    let text_choice = |choices: &[&str], wrong: &str| match value {
        FieldValue::LongStr(text) if choices.iter().any(|choice| choice.as_bytes() == &text[..]) => Ok(()),
        FieldValue::LongStr(_) => invalid(wrong.to_string()),
        other => invalid(format!("{{unacceptable_type,{}}}", type_name(other))),
    };
    Some(match key {
        "x-quorum-initial-group-size" | "x-initial-cluster-size" => match value.as_i64() {
            Some(0) => invalid("{value_zero,0}".to_string()),
            Some(size) if size < 0 => invalid(format!("{{value_negative,{size}}}")),
            Some(_) => Ok(()),
            None => invalid(format!("\"expected integer, got {}\"", type_name(value))),
        },
        "x-max-in-memory-length" | "x-max-in-memory-bytes" => match value.as_i64() {
            Some(limit) if limit < 0 => invalid(format!("{{value_negative,{limit}}}")),
            Some(_) => Ok(()),
            None => invalid(format!("{{unacceptable_type,{}}}", type_name(value))),
        },
        "x-dead-letter-strategy" => text_choice(&["at-most-once", "at-least-once"], "invalid_dlx_strategy"),
        "x-queue-leader-locator" => text_choice(&["client-local", "balanced", "random", "least-leaders"], "invalid_queue_locator_arg"),
        "x-overflow" => match value {
            FieldValue::LongStr(_) => text_choice(&["drop-head", "reject-publish", "reject-publish-dlx"], "invalid_overflow"),
            _ => return None,
        },
        // RabbitMQ 3.10.8 takes any x-delivery-limit on a quorum queue (measured: -1 and "a").
        "x-delivery-limit" => Ok(()),
        _ => return None,
    })
}

/// What queues of `queue_type` allow.
pub fn capabilities(queue_type: QueueType) -> &'static QueueTypeCapabilities {
    match queue_type {
        QueueType::Classic => &CLASSIC,
        QueueType::Quorum => &QUORUM,
        QueueType::Stream => &STREAM,
    }
}

/// RabbitMQ's `rabbit_misc:rs/1` of a queue, which its reply texts embed.
fn describe_queue(queue: &ShortStr, vhost: &str) -> String {
    format!("queue '{queue}' in vhost '{vhost}'")
}

impl QueueTypeCapabilities {
    /// Checks a declaration that creates a queue of this type, in RabbitMQ's order: the type (540
    /// while Lepus does not run it), its properties (406), then each argument (406 for a bad value,
    /// 540 for one Lepus does not implement), in the order the client sent them.
    pub fn check_declare(&self, definition: &QueueDefinition, vhost: &str) -> Result<(), AmqpError> {
        if !self.implemented {
            return Err(AmqpError::not_implemented(format!("queue type '{}' is not supported by Lepus yet", self.queue_type.name())));
        }
        if self.queue_type == QueueType::Stream {
            return check_stream_declare(self, definition, vhost);
        }
        if self.queue_type == QueueType::Quorum {
            // RabbitMQ checks a quorum queue's arguments first, then its properties.
            self.check_replicated_arguments(definition, vhost)?;
            return self.check_properties(definition, vhost);
        }
        self.check_properties(definition, vhost)?;
        for (key, value) in definition.arguments.iter() {
            let key_text = key.to_string_lossy();
            if is_other_types_argument(&key_text, self.accepted_arguments) {
                // Its value is not checked; its key is refused after the others' values, as
                // RabbitMQ orders the two checks.
                continue;
            }
            check_queue_argument(&key_text, value, &definition.name, vhost)?;
            if key_text == "x-dead-letter-routing-key" {
                check_dead_letter_routing_key(&definition.arguments, &definition.name, vhost)?;
            }
            let key_text = key_text.as_str();
            if GATED_QUEUE_ARGUMENTS.contains(&key_text) && !self.accepted_arguments.contains(&key_text) {
                return Err(AmqpError::not_implemented(format!("queue argument '{key_text}' is not supported by Lepus yet")));
            }
        }
        let keys = definition.arguments.iter().map(|(key, _)| key.to_string_lossy());
        if let Some(key) = keys.into_iter().find(|key| is_other_types_argument(key, self.accepted_arguments)) {
            return Err(AmqpError::precondition(format!(
                "invalid arg '{key}' for {} of queue type {}",
                describe_queue(&definition.name, vhost),
                type_module(self.queue_type)
            )));
        }
        Ok(())
    }

    /// A quorum or stream queue's arguments, in the order the client sent them: one RabbitMQ knows
    /// and the type does not take is refused (406, naming the type's module), the others checked
    /// as RabbitMQ checks them; one Lepus does not implement for the type is refused with 540.
    fn check_replicated_arguments(&self, definition: &QueueDefinition, vhost: &str) -> Result<(), AmqpError> {
        for (key, value) in definition.arguments.iter() {
            let key_text = key.to_string_lossy();
            let key_text = key_text.as_str();
            if RABBITMQ_QUEUE_ARGUMENTS.contains(&key_text) && !self.accepted_arguments.contains(&key_text) {
                return Err(AmqpError::precondition(format!(
                    "invalid arg '{key_text}' for {} of queue type {}",
                    describe_queue(&definition.name, vhost),
                    type_module(self.queue_type)
                )));
            }
            match check_replicated_argument(key_text, value, &definition.name, vhost) {
                Some(checked) => checked?,
                None => check_queue_argument(key_text, value, &definition.name, vhost)?,
            }
            if key_text == "x-dead-letter-routing-key" {
                check_dead_letter_routing_key(&definition.arguments, &definition.name, vhost)?;
            }
            if not_implemented_for(self.queue_type, key_text, value) {
                return Err(AmqpError::not_implemented(format!(
                    "queue argument '{key_text}' is not supported by Lepus yet for {} queues",
                    self.queue_type.name()
                )));
            }
        }
        Ok(())
    }

    /// Checks the durable, auto-delete and exclusive flags, with the texts of RabbitMQ's
    /// `rabbit_quorum_queue:declare/2` (streams answer the same).
    pub fn check_properties(&self, definition: &QueueDefinition, vhost: &str) -> Result<(), AmqpError> {
        // RabbitMQ's order (`rabbit_quorum_queue:declare/2`: auto-delete, exclusive, durable) and
        // its names for them (measured: an exclusive quorum queue is refused as 'exclusive-owner').
        let refused = [
            (definition.auto_delete && !self.auto_delete, "auto-delete"),
            (definition.exclusive_owner.is_some() && !self.exclusive, "exclusive-owner"),
            (!definition.durable && !self.non_durable, "non-durable"),
        ];
        match refused.iter().find(|(refused, _)| *refused) {
            Some((_, property)) => {
                Err(AmqpError::precondition(format!("invalid property '{property}' for {}", describe_queue(&definition.name, vhost))))
            }
            None => Ok(()),
        }
    }

    /// Checks basic.consume on a queue of this type: a consumer without acks, or on a channel
    /// with a global prefetch, where the type cannot honour them (540, RabbitMQ's texts).
    pub fn check_consume(&self, queue: &ShortStr, vhost: &str, no_ack: bool, global_qos_active: bool) -> Result<(), AmqpError> {
        if no_ack && !self.no_ack_consume {
            return Err(AmqpError::not_implemented(format!(
                "automatic acknowledgement not supported by stream queues {}",
                describe_queue(queue, vhost)
            )));
        }
        if global_qos_active && !self.global_qos {
            return Err(AmqpError::not_implemented(format!("{} does not support global qos", describe_queue(queue, vhost))));
        }
        Ok(())
    }

    /// Checks basic.get on a queue of this type (540 where the type cannot be read that way).
    pub fn check_get(&self, queue: &ShortStr, vhost: &str) -> Result<(), AmqpError> {
        if self.basic_get {
            return Ok(());
        }
        Err(AmqpError::not_implemented(format!("basic.get not supported by stream queues {}", describe_queue(queue, vhost))))
    }
}

/// A stream queue's declaration, in RabbitMQ 3.10.8's order (measured): the values of the
/// arguments the type takes (in RabbitMQ's own order of them), then the first known argument it
/// does not take, then the properties (auto-delete, exclusive, durable), then the segment size's
/// bound.
fn check_stream_declare(capabilities: &QueueTypeCapabilities, definition: &QueueDefinition, vhost: &str) -> Result<(), AmqpError> {
    use crate::stream::arguments;
    let (arguments_table, queue) = (&definition.arguments, &definition.name);
    for key in ["x-max-length-bytes", "x-max-age", "x-initial-cluster-size", "x-queue-leader-locator", "x-stream-max-segment-size-bytes"] {
        let Some(value) = arguments_table.get(key) else { continue };
        match key {
            "x-max-age" => arguments::check_max_age_argument(value, queue, vhost).map(|_| ())?,
            "x-stream-max-segment-size-bytes" => arguments::check_segment_size_argument(value, queue, vhost)?,
            "x-initial-cluster-size" => arguments::check_initial_cluster_size_argument(value, queue, vhost)?,
            "x-queue-leader-locator" => arguments::check_leader_locator_argument(value, queue, vhost)?,
            _ => check_queue_argument(key, value, queue, vhost)?,
        }
    }
    for (key, _) in arguments_table.iter() {
        let key = key.to_string_lossy();
        if RABBITMQ_QUEUE_ARGUMENTS.contains(&key.as_str()) && !capabilities.accepted_arguments.contains(&key.as_str()) {
            return Err(AmqpError::precondition(format!(
                "invalid arg '{key}' for {} of queue type rabbit_stream_queue",
                describe_queue(queue, vhost)
            )));
        }
    }
    let refused = [
        (definition.auto_delete, "auto-delete"),
        (definition.exclusive_owner.is_some(), "exclusive-owner"),
        (!definition.durable, "non-durable"),
    ];
    if let Some((_, property)) = refused.iter().find(|(refused, _)| *refused) {
        return Err(AmqpError::precondition(format!("invalid property '{property}' for {}", describe_queue(queue, vhost))));
    }
    arguments::check_segment_size_bound(arguments_table)
}

impl QueueTypeCapabilities {
    /// Checks basic.consume on a stream queue, in RabbitMQ 3.10.8's order (measured): an
    /// `x-priority` argument (406, the type does not take it), no prefetch (406), no-ack (540),
    /// a global prefetch (540).
    pub fn check_stream_consume(
        &self,
        queue: &ShortStr,
        vhost: &str,
        arguments: &amqp_codec::FieldTable,
        prefetch: u32,
        no_ack: bool,
        global_qos_active: bool,
    ) -> Result<(), AmqpError> {
        if arguments.get("x-priority").is_some() {
            return Err(AmqpError::precondition(format!(
                "invalid arg 'x-priority' for {} of queue type rabbit_stream_queue",
                describe_queue(queue, vhost)
            )));
        }
        if prefetch == 0 {
            return Err(AmqpError::precondition(format!("consumer prefetch count is not set for '{}'", describe_queue(queue, vhost))));
        }
        self.check_consume(queue, vhost, no_ack, global_qos_active)
    }
}
