//! Policies: RabbitMQ's way to give every queue whose name matches a pattern the same limits,
//! without redeclaring queues. A policy has a regular expression, what it applies to (queues,
//! exchanges or both), a priority and a definition; among the policies that match a queue, the one
//! of highest priority applies, alone, as in RabbitMQ.
//!
//! Lepus applies the queue settings it implements (`max-length`, `max-length-bytes`, `overflow`,
//! `message-ttl`, `expires`, `dead-letter-exchange`, `dead-letter-routing-key`,
//! `dead-letter-strategy` (quorum queues), `delivery-limit`,
//! and for stream queues `max-age` and `stream-max-segment-size-bytes`)
//! and the exchange setting `alternate-exchange` (an exchange's own argument wins over it).
//! `queue-mode`, `queue-version`, `max-in-memory-length`, `max-in-memory-bytes`,
//! `queue-leader-locator`, `queue-master-locator` and `initial-cluster-size` are taken with
//! RabbitMQ 3.10.8's validation and met as they are (see below and docs/compatibility.md).
//! Classic queue mirroring (`ha-*`) and the federation plugin's settings are refused with a
//! message that says so, never accepted and ignored; unknown settings are refused as RabbitMQ
//! refuses them.

use broker_core::vhost::{Overflow, QueueType};
use serde_json::{Map, Value};
use std::sync::Arc;
use storage::definitions::PolicyRecord;

/// RabbitMQ policy settings that Lepus does not implement; a policy naming one is refused. A
/// mirrored classic queue (`ha-*`) would have replicas on other nodes, which Lepus's classic
/// queues never have: taking the setting would claim a redundancy that is not there.
const NOT_IMPLEMENTED_KEYS: &[&str] = &[
    "federation-upstream",
    "federation-upstream-set",
    "ha-mode",
    "ha-params",
    "ha-promote-on-failure",
    "ha-promote-on-shutdown",
    "ha-sync-batch-size",
    "ha-sync-mode",
];

/// `queue-leader-locator`'s values in RabbitMQ 3.10.8 (`random` and `least-leaders` are its
/// deprecated names for `balanced`).
const QUEUE_LEADER_LOCATORS: &[&str] = &["client-local", "balanced", "random", "least-leaders"];

/// `queue-master-locator`'s values: the strategies RabbitMQ 3.10.8 registers.
const QUEUE_MASTER_LOCATORS: &[&str] = &["client-local", "min-masters", "random"];

/// The keys an operator policy may set (RabbitMQ 3.10.8's): limits only, each merged with the
/// queue's policy so that the stricter value wins.
const OPERATOR_POLICY_KEYS: &[&str] =
    &["delivery-limit", "expires", "max-in-memory-bytes", "max-in-memory-length", "max-length", "max-length-bytes", "message-ttl"];

/// The most policies a broker holds; each is matched against queue names on declaration.
pub const POLICIES_MAX: usize = 1024;

/// What a policy applies to (RabbitMQ's `apply-to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyTo {
    /// Queues only.
    Queues,
    /// Exchanges only.
    Exchanges,
    /// Both.
    All,
}

impl ApplyTo {
    /// Parses RabbitMQ's names.
    pub fn parse(text: &str) -> Option<ApplyTo> {
        match text {
            "queues" => Some(ApplyTo::Queues),
            "exchanges" => Some(ApplyTo::Exchanges),
            "all" => Some(ApplyTo::All),
            _ => None,
        }
    }

    /// RabbitMQ's name.
    pub fn name(self) -> &'static str {
        match self {
            ApplyTo::Queues => "queues",
            ApplyTo::Exchanges => "exchanges",
            ApplyTo::All => "all",
        }
    }
}

/// What a policy is being matched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A queue of a type.
    Queue(QueueType),
    /// An exchange.
    Exchange,
}

/// Classic queue mirroring's settings: neither quorum queues nor streams take them.
const MIRRORING_KEYS: &[&str] =
    &["ha-mode", "ha-params", "ha-sync-mode", "ha-promote-on-shutdown", "ha-promote-on-failure", "queue-master-locator"];

/// Whether a queue type does not take a setting: a policy that has one does not apply to a queue
/// of that type at all, and the next matching policy does (RabbitMQ 3.10.8's
/// `unsupported_policies` of each queue type, checked by `rabbit_queue_type:is_policy_applicable`).
/// One difference: `delivery-limit` applies to classic queues, which take it in Lepus.
fn unsupported_setting(queue_type: QueueType, key: &str) -> bool {
    let own: &[&str] = match queue_type {
        QueueType::Classic => {
            return ["max-age", "stream-max-segment-size-bytes", "queue-leader-locator", "initial-cluster-size", "dead-letter-strategy"]
                .contains(&key)
        }
        QueueType::Quorum => {
            &["max-priority", "queue-mode", "single-active-consumer", "max-age", "stream-max-segment-size-bytes", "initial-cluster-size"]
        }
        QueueType::Stream => &[
            "expires",
            "message-ttl",
            "dead-letter-exchange",
            "dead-letter-routing-key",
            "max-length",
            "max-in-memory-length",
            "max-in-memory-bytes",
            "max-priority",
            "overflow",
            "queue-mode",
            "single-active-consumer",
            "delivery-limit",
            "dead-letter-strategy",
        ],
    };
    own.contains(&key) || MIRRORING_KEYS.contains(&key)
}

/// The queue settings a policy carries (each `None` when the policy does not set it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSettings {
    /// `max-length`: the most ready messages.
    pub max_length: Option<u64>,
    /// `max-length-bytes`: the most body bytes of ready messages.
    pub max_length_bytes: Option<u64>,
    /// `delivery-limit`: how often a message may be requeued before it is dead-lettered.
    pub delivery_limit: Option<u64>,
    /// `dead-letter-exchange`: where rejected, expired and dropped messages go.
    pub dead_letter_exchange: Option<String>,
    /// `dead-letter-routing-key`: the routing key they get there.
    pub dead_letter_routing_key: Option<String>,
    /// `dead-letter-strategy`: whether a quorum queue dead-letters at least once (true) or at
    /// most once (false).
    pub dead_letter_at_least_once: Option<bool>,
    /// `overflow`: what happens at `max-length`.
    pub overflow: Option<Overflow>,
    /// `message-ttl`: how long a message may wait, in milliseconds.
    pub message_ttl_ms: Option<u64>,
    /// `expires`: how long the queue may stay unused before it is deleted, in milliseconds.
    pub expires_ms: Option<u64>,
    /// `consumer-timeout`: how long a delivery from the queue may wait for its ack, in milliseconds.
    pub consumer_timeout_ms: Option<u64>,
    /// `max-age` (stream queues): how long a segment is kept, in milliseconds.
    pub max_age_ms: Option<u64>,
    /// `stream-max-segment-size-bytes` (stream queues): the size a segment grows to.
    pub stream_max_segment_size_bytes: Option<u64>,
}

/// Why a policy is refused; the texts are what the management API answers with 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// The pattern is not a regular expression.
    #[error("Validation failed\n\n<<\"{0}\">> is not a valid regular expression: {1}\n")]
    Pattern(String, String),
    /// `apply-to` is not queues, exchanges or all.
    #[error("Validation failed\n\n\"{0}\" is not a valid apply-to value (queues, exchanges, all)\n")]
    ApplyTo(String),
    /// The definition is empty.
    #[error("Validation failed\n\na policy definition must not be empty\n")]
    Empty,
    /// Settings RabbitMQ does not know.
    #[error("Validation failed\n\n{0:?} are not recognised policy settings\n")]
    Unrecognised(Vec<String>),
    /// Settings RabbitMQ knows that Lepus does not implement.
    #[error("Validation failed\n\npolicy settings {0:?} are not implemented by Lepus\n")]
    NotImplemented(Vec<String>),
    /// A setting with a value of the wrong kind.
    #[error("Validation failed\n\n{0} {1}\n")]
    BadValue(String, &'static str),
    /// A setting with a value RabbitMQ refuses: its own text ("5 is not a valid dead letter
    /// exchange name").
    #[error("Validation failed\n\n{0} is not a valid {1}\n")]
    Invalid(String, &'static str),
    /// A `queue-master-locator` RabbitMQ has no strategy for (its text is worded apart).
    #[error("Validation failed\n\n{0} invalid queue-master-locator value\n")]
    MasterLocator(String),
    /// Too many policies.
    #[error("the broker holds {POLICIES_MAX} policies, its limit")]
    TooMany,
}

/// A policy, validated and compiled.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Its vhost.
    pub vhost: String,
    /// Its name.
    pub name: String,
    /// The regular expression as given.
    pub pattern: String,
    compiled: regex::Regex,
    /// What it applies to.
    pub apply_to: ApplyTo,
    /// The highest priority among matching policies wins.
    pub priority: i64,
    /// The definition as given.
    pub definition: Map<String, Value>,
    /// The queue settings in the definition.
    pub queue_settings: QueueSettings,
    /// `alternate-exchange`: where the exchanges it applies to send what they cannot route.
    pub alternate_exchange: Option<String>,
    /// The operator policy merged into this one ([`merge_operator_policy`]), if any.
    pub operator_policy: Option<String>,
}

impl Policy {
    /// Validates a policy as the management API or `lepus ctl` gives it.
    pub fn new(
        vhost: &str,
        name: &str,
        pattern: &str,
        apply_to: &str,
        priority: i64,
        definition: Map<String, Value>,
    ) -> Result<Policy, PolicyError> {
        let compiled = regex::Regex::new(pattern).map_err(|error| PolicyError::Pattern(pattern.to_string(), error.to_string()))?;
        let apply_to = ApplyTo::parse(apply_to).ok_or_else(|| PolicyError::ApplyTo(apply_to.to_string()))?;
        let queue_settings = queue_settings(&definition)?;
        let alternate_exchange = definition.get("alternate-exchange").and_then(Value::as_str).map(String::from);
        Ok(Policy {
            alternate_exchange,
            operator_policy: None,
            vhost: vhost.to_string(),
            name: name.to_string(),
            pattern: pattern.to_string(),
            compiled,
            apply_to,
            priority,
            definition,
            queue_settings,
        })
    }

    /// Validates an operator policy: only limits, as RabbitMQ allows (others are refused as
    /// settings it does not recognise), and of those the ones Lepus implements.
    pub fn new_operator(
        vhost: &str,
        name: &str,
        pattern: &str,
        apply_to: &str,
        priority: i64,
        definition: Map<String, Value>,
    ) -> Result<Policy, PolicyError> {
        let unrecognised: Vec<String> = definition.keys().filter(|key| !OPERATOR_POLICY_KEYS.contains(&key.as_str())).cloned().collect();
        if !unrecognised.is_empty() {
            return Err(PolicyError::Unrecognised(unrecognised));
        }
        Policy::new(vhost, name, pattern, apply_to, priority, definition)
    }

    /// The name of the (user) policy that applies, for listings: none when only an operator
    /// policy does.
    pub fn user_policy_name(&self) -> Option<&str> {
        (!self.name.is_empty()).then_some(self.name.as_str())
    }

    /// A stored policy.
    pub fn from_record(record: &PolicyRecord) -> Result<Policy, PolicyError> {
        Policy::new(&record.vhost, &record.name, &record.pattern, &record.apply_to, record.priority, record.definition.clone())
    }

    /// The policy as stored.
    pub fn to_record(&self) -> PolicyRecord {
        PolicyRecord {
            vhost: self.vhost.clone(),
            name: self.name.clone(),
            pattern: self.pattern.clone(),
            apply_to: self.apply_to.name().to_string(),
            priority: self.priority,
            definition: self.definition.clone(),
        }
    }

    /// Whether the policy applies to `target` named `name` (unanchored match, as RabbitMQ); not
    /// to a queue whose type does not take one of its settings ([`unsupported_setting`]).
    pub fn matches(&self, target: Target, name: &[u8]) -> bool {
        let kind_matches = match target {
            Target::Queue(queue_type) => {
                self.apply_to != ApplyTo::Exchanges && !self.definition.keys().any(|key| unsupported_setting(queue_type, key))
            }
            Target::Exchange => self.apply_to != ApplyTo::Queues,
        };
        kind_matches && std::str::from_utf8(name).is_ok_and(|text| self.compiled.is_match(text))
    }
}

/// The policy that applies to `name` in `vhost`: the matching one of highest priority, ties
/// broken by name so the choice does not depend on the order policies were set in.
pub fn select(policies: &[Arc<Policy>], vhost: &str, name: &[u8], target: Target) -> Option<Arc<Policy>> {
    policies
        .iter()
        .filter(|policy| policy.vhost == vhost && policy.matches(target, name))
        .max_by(|a, b| a.priority.cmp(&b.priority).then_with(|| b.name.cmp(&a.name)))
        .cloned()
}

/// What applies to a queue when an operator policy matches it too: the user policy's settings with
/// each of the operator policy's limits merged in, the lower value winning, as RabbitMQ merges
/// them. Without a user policy the result carries an empty name ([`Policy::user_policy_name`]).
pub fn merge_operator_policy(policy: Option<Arc<Policy>>, operator: Option<Arc<Policy>>) -> Option<Arc<Policy>> {
    let Some(operator) = operator else { return policy };
    let mut merged = match &policy {
        Some(policy) => Policy::clone(policy),
        None => {
            Policy { name: String::new(), definition: Map::new(), queue_settings: QueueSettings::default(), ..Policy::clone(&operator) }
        }
    };
    let lower = |mine: Option<u64>, theirs: Option<u64>| match (mine, theirs) {
        (Some(mine), Some(theirs)) => Some(mine.min(theirs)),
        (mine, theirs) => mine.or(theirs),
    };
    let (settings, limits) = (&mut merged.queue_settings, &operator.queue_settings);
    settings.max_length = lower(settings.max_length, limits.max_length);
    settings.max_length_bytes = lower(settings.max_length_bytes, limits.max_length_bytes);
    settings.message_ttl_ms = lower(settings.message_ttl_ms, limits.message_ttl_ms);
    settings.delivery_limit = lower(settings.delivery_limit, limits.delivery_limit);
    settings.expires_ms = lower(settings.expires_ms, limits.expires_ms);
    for (key, value) in &operator.definition {
        let stricter = match (merged.definition.get(key).and_then(Value::as_u64), value.as_u64()) {
            (Some(mine), Some(theirs)) => Value::from(mine.min(theirs)),
            _ => value.clone(),
        };
        merged.definition.insert(key.clone(), stricter);
    }
    merged.operator_policy = Some(operator.name.clone());
    Some(Arc::new(merged))
}

/// A JSON value as RabbitMQ prints it in a validation message: numbers bare, strings as Erlang
/// binaries (`<<"x">>`).
fn rabbit_value(value: &Value) -> String {
    match value {
        Value::String(text) => format!("<<\"{text}\">>"),
        other => other.to_string(),
    }
}

fn queue_settings(definition: &Map<String, Value>) -> Result<QueueSettings, PolicyError> {
    if definition.is_empty() {
        return Err(PolicyError::Empty);
    }
    let mut settings = QueueSettings::default();
    let mut unrecognised = Vec::new();
    let mut not_implemented = Vec::new();
    for (key, value) in definition {
        // RabbitMQ 3.10.8's `rabbit_policies` validation texts.
        let invalid = |what: &'static str| PolicyError::Invalid(rabbit_value(value), what);
        let non_negative = |what: &'static str| value.as_u64().ok_or_else(|| invalid(what));
        let positive = |what: &'static str| value.as_u64().filter(|number| *number >= 1).ok_or_else(|| invalid(what));
        match key.as_str() {
            "max-length" => settings.max_length = Some(non_negative("maximum length")?),
            "max-length-bytes" => settings.max_length_bytes = Some(non_negative("maximum length in bytes")?),
            "delivery-limit" => settings.delivery_limit = Some(non_negative("delivery limit")?),
            "dead-letter-exchange" => {
                let name = value.as_str().filter(|name| name.len() <= 255);
                settings.dead_letter_exchange = Some(name.ok_or_else(|| invalid("dead letter exchange name"))?.to_string())
            }
            "dead-letter-routing-key" => {
                let key = value.as_str().filter(|key| key.len() <= 255);
                settings.dead_letter_routing_key = Some(key.ok_or_else(|| invalid("dead letter routing key"))?.to_string())
            }
            "dead-letter-strategy" => {
                settings.dead_letter_at_least_once = Some(match value.as_str() {
                    Some("at-least-once") => true,
                    Some("at-most-once") => false,
                    _ => return Err(invalid("dead letter strategy")),
                })
            }
            "message-ttl" => settings.message_ttl_ms = Some(non_negative("message TTL")?),
            // Not a policy key in RabbitMQ 3.10.8 (3.12 added it); Lepus takes it.
            "consumer-timeout" => {
                settings.consumer_timeout_ms = Some(
                    value
                        .as_u64()
                        .filter(|number| *number >= 1)
                        .ok_or_else(|| PolicyError::BadValue(key.clone(), "must be a positive integer"))?,
                )
            }
            "max-age" => {
                let age = value.as_str().map(|text| crate::stream::arguments::parse_max_age(text.as_bytes()));
                match age {
                    Some(crate::stream::arguments::MaxAge::Milliseconds(age)) => settings.max_age_ms = Some(age),
                    _ => return Err(invalid("max age")),
                }
            }
            "stream-max-segment-size-bytes" => {
                let size = value.as_u64().filter(|size| *size <= crate::stream::arguments::SEGMENT_SIZE_BYTES_MAX);
                settings.stream_max_segment_size_bytes = Some(size.ok_or_else(|| invalid("segment size"))?)
            }
            "expires" => settings.expires_ms = Some(positive("queue expiry")?),
            "overflow" => {
                let overflow = value.as_str().and_then(Overflow::from_name);
                settings.overflow = Some(overflow.ok_or_else(|| invalid("overflow value"))?);
            }
            known if NOT_IMPLEMENTED_KEYS.contains(&known) => not_implemented.push(key.clone()),
            other => match validate_met_as_it_is(other, value) {
                Some(validated) => validated?,
                None => unrecognised.push(key.clone()),
            },
        }
    }
    if !unrecognised.is_empty() {
        return Err(PolicyError::Unrecognised(unrecognised));
    }
    if !not_implemented.is_empty() {
        return Err(PolicyError::NotImplemented(not_implemented));
    }
    Ok(settings)
}

/// Validates a setting Lepus takes and has nothing to do for (each one's reason below), with
/// RabbitMQ 3.10.8's texts; `None` when `key` is not one of them.
fn validate_met_as_it_is(key: &str, value: &Value) -> Option<Result<(), PolicyError>> {
    let invalid = |what: &'static str| Err(PolicyError::Invalid(rabbit_value(value), what));
    let one_of = |values: &[&str]| value.as_str().is_some_and(|text| values.contains(&text));
    let checked = match key {
        // Read by the exchange's routing (`Policy::alternate_exchange`).
        "alternate-exchange" if !value.is_string() => invalid("alternate exchange name"),
        "alternate-exchange" => Ok(()),
        // Lepus's durable queues always keep a bounded window in memory and the rest on disk,
        // which is what `lazy` asks for (RabbitMQ 3.12 ignores the setting for the same reason).
        "queue-mode" if one_of(&["default", "lazy"]) => Ok(()),
        "queue-mode" => invalid("queue-mode value"),
        // RabbitMQ 3.10's classic queue storage versions differ in their files and memory use,
        // not in what a client sees; Lepus has one storage, which keeps bodies on disk as
        // version 2 does, so either value is met (as `x-queue-version` already is).
        "queue-version" if matches!(value.as_u64(), Some(1) | Some(2)) => Ok(()),
        "queue-version" => invalid("queue-version value"),
        // Bounds on a quorum queue's messages in memory: a Lepus quorum queue keeps its bodies in
        // its log and a bounded window in memory whatever the bound (RabbitMQ's text for both
        // keys says "memory in bytes").
        "max-in-memory-length" | "max-in-memory-bytes" if value.as_u64().is_some() => Ok(()),
        "max-in-memory-length" | "max-in-memory-bytes" => invalid("maximum memory in bytes"),
        // Where a new quorum or stream queue's leader goes: a Lepus quorum queue's leader is its
        // Raft shard's, a stream lives on the node that declared it.
        "queue-leader-locator" if one_of(QUEUE_LEADER_LOCATORS) => Ok(()),
        "queue-leader-locator" => invalid("queue leader locator value"),
        // Where a new classic queue goes: a Lepus classic queue lives on the node that declared
        // it, as with `client-local`.
        "queue-master-locator" if one_of(QUEUE_MASTER_LOCATORS) => Ok(()),
        "queue-master-locator" => Err(PolicyError::MasterLocator(rabbit_value(value))),
        // A stream's replica count: a Lepus stream has one copy, on its node.
        "initial-cluster-size" if value.as_u64().is_some() => Ok(()),
        "initial-cluster-size" => invalid("cluster size"),
        _ => return None,
    };
    Some(checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn definition(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_matching_policy_of_highest_priority_applies() {
        let low = Arc::new(Policy::new("/", "low", "^orders", "queues", 1, definition(json!({"max-length": 10}))).expect("valid"));
        let high = Arc::new(Policy::new("/", "high", "^orders\\.eu", "all", 5, definition(json!({"message-ttl": 60000}))).expect("valid"));
        let exchanges = Arc::new(Policy::new("/", "ex", ".*", "exchanges", 9, definition(json!({"max-length": 1}))).expect("valid"));
        let other_vhost = Arc::new(Policy::new("/b", "b", ".*", "queues", 9, definition(json!({"max-length": 1}))).expect("valid"));
        let policies = vec![low.clone(), high.clone(), exchanges, other_vhost];
        let chosen =
            |name: &str| select(&policies, "/", name.as_bytes(), Target::Queue(QueueType::Classic)).map(|policy| policy.name.clone());
        assert_eq!(chosen("orders.eu.1").as_deref(), Some("high"));
        assert_eq!(chosen("orders.us").as_deref(), Some("low"));
        assert_eq!(chosen("invoices"), None, "the exchange-only and other-vhost policies do not apply");
        assert_eq!(high.queue_settings.message_ttl_ms, Some(60_000));
        assert_eq!(low.queue_settings.max_length, Some(10));
    }

    #[test]
    fn an_operator_policy_sets_limits_only_and_the_stricter_value_wins() {
        let operator = |value: Value| Policy::new_operator("/", "op", ".*", "queues", 0, definition(value));
        assert_eq!(operator(json!({"overflow": "drop-head"})).err(), Some(PolicyError::Unrecognised(vec!["overflow".to_string()])));
        let user =
            Arc::new(Policy::new("/", "user", ".*", "queues", 0, definition(json!({"max-length": 5, "message-ttl": 100}))).expect("valid"));
        let strict = Arc::new(operator(json!({"max-length": 2, "message-ttl": 1000})).expect("valid"));
        let merged = merge_operator_policy(Some(user.clone()), Some(strict.clone())).expect("merged");
        assert_eq!((merged.queue_settings.max_length, merged.queue_settings.message_ttl_ms), (Some(2), Some(100)));
        assert_eq!(Value::Object(merged.definition.clone()), json!({"max-length": 2, "message-ttl": 100}));
        assert_eq!((merged.user_policy_name(), merged.operator_policy.as_deref()), (Some("user"), Some("op")));
        let alone = merge_operator_policy(None, Some(strict)).expect("merged");
        assert_eq!((alone.user_policy_name(), alone.queue_settings.max_length), (None, Some(2)));
        assert!(merge_operator_policy(Some(user), None).is_some_and(|policy| policy.operator_policy.is_none()));
    }

    #[test]
    fn an_alternate_exchange_policy_names_an_exchange() {
        let policy = Policy::new("/", "ae", ".*", "exchanges", 0, definition(json!({"alternate-exchange": "unrouted"}))).expect("valid");
        assert_eq!(policy.alternate_exchange.as_deref(), Some("unrouted"));
        let refused = Policy::new("/", "ae", ".*", "exchanges", 0, definition(json!({"alternate-exchange": 5}))).err();
        let text = refused.map(|error| error.to_string());
        assert_eq!(text.as_deref(), Some("Validation failed\n\n5 is not a valid alternate exchange name\n"));
    }

    #[test]
    fn unknown_and_unimplemented_settings_are_refused_loudly() {
        let refused = |value: Value| Policy::new("/", "p", ".*", "queues", 0, definition(value)).err();
        assert_eq!(refused(json!({"colour": "blue"})), Some(PolicyError::Unrecognised(vec!["colour".to_string()])));
        assert_eq!(refused(json!({"ha-mode": "all"})), Some(PolicyError::NotImplemented(vec!["ha-mode".to_string()])));
        assert_eq!(refused(json!({"queue-version": 2})), None, "met by the one storage");
        assert_eq!(refused(json!({"queue-version": 3})), Some(PolicyError::Invalid("3".to_string(), "queue-version value")));
        assert_eq!(
            refused(json!({"dead-letter-strategy": "sometimes"})),
            Some(PolicyError::Invalid("<<\"sometimes\">>".to_string(), "dead letter strategy"))
        );
        let strategy = |value: &str| {
            Policy::new("/", "p", ".*", "queues", 0, definition(json!({"dead-letter-strategy": value})))
                .ok()
                .and_then(|policy| policy.queue_settings.dead_letter_at_least_once)
        };
        assert_eq!((strategy("at-least-once"), strategy("at-most-once")), (Some(true), Some(false)));
        assert_eq!(refused(json!({"dead-letter-exchange": 5})), Some(PolicyError::Invalid("5".to_string(), "dead letter exchange name")));
        assert_eq!(
            refused(json!({"max-length-bytes": "a"})),
            Some(PolicyError::Invalid("<<\"a\">>".to_string(), "maximum length in bytes"))
        );
        assert_eq!(refused(json!({"max-length-bytes": -1})), Some(PolicyError::Invalid("-1".to_string(), "maximum length in bytes")));
        assert_eq!(refused(json!({"delivery-limit": -1})), Some(PolicyError::Invalid("-1".to_string(), "delivery limit")));
        assert!(refused(
            json!({"dead-letter-exchange": "dlx", "dead-letter-routing-key": "k", "max-length-bytes": 10, "delivery-limit": 3})
        )
        .is_none());
        assert_eq!(refused(json!({"max-length": -1})), Some(PolicyError::Invalid("-1".to_string(), "maximum length")));
        assert_eq!(refused(json!({"overflow": "explode"})), Some(PolicyError::Invalid("<<\"explode\">>".to_string(), "overflow value")));
        assert_eq!(refused(json!({})), Some(PolicyError::Empty));
        assert!(matches!(Policy::new("/", "p", "(", "queues", 0, definition(json!({"max-length": 1}))), Err(PolicyError::Pattern(..))));
        assert!(matches!(Policy::new("/", "p", ".*", "streams", 0, definition(json!({"max-length": 1}))), Err(PolicyError::ApplyTo(..))));
        assert!(refused(json!({"queue-mode": "lazy", "overflow": "reject-publish"})).is_none());
    }

    #[test]
    fn the_settings_lepus_meets_as_they_are_take_rabbitmq_values_and_texts() {
        let refused = |value: Value| Policy::new("/", "p", ".*", "queues", 0, definition(value)).err().map(|error| error.to_string());
        for taken in [
            json!({"max-in-memory-length": 0, "max-in-memory-bytes": 1024}),
            json!({"queue-leader-locator": "client-local", "initial-cluster-size": 3}),
            json!({"queue-leader-locator": "least-leaders", "queue-master-locator": "min-masters"}),
            json!({"queue-mode": "lazy", "queue-version": 1}),
        ] {
            assert_eq!(refused(taken.clone()), None, "{taken}");
        }
        let text = |body: &str| Some(format!("Validation failed\n\n{body}\n"));
        assert_eq!(refused(json!({"max-in-memory-length": -1})), text("-1 is not a valid maximum memory in bytes"));
        assert_eq!(refused(json!({"max-in-memory-bytes": "a"})), text("<<\"a\">> is not a valid maximum memory in bytes"));
        assert_eq!(refused(json!({"queue-leader-locator": "nearest"})), text("<<\"nearest\">> is not a valid queue leader locator value"));
        assert_eq!(refused(json!({"queue-master-locator": "nearest"})), text("<<\"nearest\">> invalid queue-master-locator value"));
        assert_eq!(refused(json!({"initial-cluster-size": 1.5})), text("1.5 is not a valid cluster size"));
        assert_eq!(refused(json!({"queue-mode": "eager"})), text("<<\"eager\">> is not a valid queue-mode value"));
        assert_eq!(refused(json!({"message-ttl": -5})), text("-5 is not a valid message TTL"));
        assert_eq!(refused(json!({"expires": 0})), text("0 is not a valid queue expiry"));
        assert_eq!(refused(json!({"stream-max-segment-size-bytes": 3_000_000_001u64})), text("3000000001 is not a valid segment size"));
    }

    #[test]
    fn an_operator_policy_takes_the_in_memory_limits_and_merges_the_lower() {
        let operator = Policy::new_operator("/", "op", ".*", "queues", 0, definition(json!({"max-in-memory-length": 10})));
        let user = Policy::new("/", "user", ".*", "queues", 0, definition(json!({"max-in-memory-length": 50}))).expect("valid");
        let merged = merge_operator_policy(Some(Arc::new(user)), Some(Arc::new(operator.expect("valid")))).expect("merged");
        assert_eq!(Value::Object(merged.definition.clone()), json!({"max-in-memory-length": 10}));
    }

    #[test]
    fn a_policy_with_a_setting_the_queue_type_does_not_take_does_not_apply_to_it() {
        let policy = |name: &str, priority: i64, value: Value| {
            Arc::new(Policy::new("/", name, ".*", "queues", priority, definition(value)).expect("valid"))
        };
        let policies = vec![
            policy("quorum-only", 9, json!({"max-length": 5, "queue-leader-locator": "balanced"})),
            policy("streams", 5, json!({"max-age": "1D"})),
            policy("any", 1, json!({"max-length": 50})),
        ];
        let chosen = |queue_type| select(&policies, "/", b"q", Target::Queue(queue_type)).map(|policy| policy.name.clone());
        assert_eq!(chosen(QueueType::Quorum).as_deref(), Some("quorum-only"));
        assert_eq!(chosen(QueueType::Classic).as_deref(), Some("any"), "classic queues take no queue-leader-locator nor max-age");
        assert_eq!(chosen(QueueType::Stream).as_deref(), Some("streams"), "streams take no max-length");
        let delivery_limit = vec![policy("retries", 1, json!({"delivery-limit": 3}))];
        assert!(select(&delivery_limit, "/", b"q", Target::Queue(QueueType::Classic)).is_some(), "a Lepus classic queue takes it");
    }
}
