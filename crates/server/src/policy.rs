//! Policies: RabbitMQ's way to give every queue whose name matches a pattern the same limits,
//! without redeclaring queues. A policy has a regular expression, what it applies to (queues,
//! exchanges or both), a priority and a definition; among the policies that match a queue, the one
//! of highest priority applies, alone, as in RabbitMQ.
//!
//! Lepus applies the queue settings it implements (`max-length`, `overflow`, `message-ttl`, `expires`).
//! Settings RabbitMQ knows and Lepus does not implement are refused with a message that says so,
//! never accepted and ignored; unknown settings are refused as RabbitMQ refuses them.

use broker_core::vhost::Overflow;
use serde_json::{Map, Value};
use std::sync::Arc;
use storage::definitions::PolicyRecord;

/// RabbitMQ policy settings that Lepus does not implement; a policy naming one is refused.
const NOT_IMPLEMENTED_KEYS: &[&str] = &[
    "alternate-exchange",
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "dead-letter-strategy",
    "delivery-limit",
    "federation-upstream",
    "federation-upstream-set",
    "ha-mode",
    "ha-params",
    "ha-promote-on-failure",
    "ha-promote-on-shutdown",
    "ha-sync-batch-size",
    "ha-sync-mode",
    "initial-cluster-size",
    "max-age",
    "max-in-memory-bytes",
    "max-in-memory-length",
    "max-length-bytes",
    "queue-leader-locator",
    "queue-master-locator",
    "queue-version",
    "stream-max-segment-size-bytes",
];

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
    /// A queue.
    Queue,
    /// An exchange.
    Exchange,
}

/// The queue settings a policy carries (each `None` when the policy does not set it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueSettings {
    /// `max-length`: the most ready messages.
    pub max_length: Option<u64>,
    /// `overflow`: what happens at `max-length`.
    pub overflow: Option<Overflow>,
    /// `message-ttl`: how long a message may wait, in milliseconds.
    pub message_ttl_ms: Option<u64>,
    /// `expires`: how long the queue may stay unused before it is deleted, in milliseconds.
    pub expires_ms: Option<u64>,
    /// `consumer-timeout`: how long a delivery from the queue may wait for its ack, in milliseconds.
    pub consumer_timeout_ms: Option<u64>,
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
        Ok(Policy {
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

    /// Whether the policy applies to `target` named `name` (unanchored match, as RabbitMQ).
    pub fn matches(&self, target: Target, name: &[u8]) -> bool {
        let kind_matches = match target {
            Target::Queue => self.apply_to != ApplyTo::Exchanges,
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

fn queue_settings(definition: &Map<String, Value>) -> Result<QueueSettings, PolicyError> {
    if definition.is_empty() {
        return Err(PolicyError::Empty);
    }
    let mut settings = QueueSettings::default();
    let mut unrecognised = Vec::new();
    let mut not_implemented = Vec::new();
    for (key, value) in definition {
        let non_negative = || value.as_u64().ok_or_else(|| PolicyError::BadValue(key.clone(), "must be a non-negative integer"));
        match key.as_str() {
            "max-length" => settings.max_length = Some(non_negative()?),
            "message-ttl" => settings.message_ttl_ms = Some(non_negative()?),
            "consumer-timeout" => {
                settings.consumer_timeout_ms = Some(
                    value
                        .as_u64()
                        .filter(|timeout| *timeout >= 1)
                        .ok_or(PolicyError::BadValue(key.clone(), "must be a positive integer"))?,
                )
            }
            "expires" => {
                settings.expires_ms = Some(
                    value
                        .as_u64()
                        .filter(|expires| *expires >= 1)
                        .ok_or(PolicyError::BadValue(key.clone(), "must be a positive integer"))?,
                )
            }
            "overflow" => {
                settings.overflow = Some(match value.as_str() {
                    Some("drop-head") => Overflow::DropHead,
                    // Without dead-lettering, reject-publish-dlx behaves as reject-publish.
                    Some("reject-publish") | Some("reject-publish-dlx") => Overflow::RejectPublish,
                    _ => return Err(PolicyError::BadValue(key.clone(), "must be drop-head, reject-publish or reject-publish-dlx")),
                })
            }
            // Lepus's durable queues always keep a bounded window in memory and the rest on disk,
            // which is what `lazy` asks for (RabbitMQ 3.12 ignores the setting for the same reason).
            "queue-mode" => match value.as_str() {
                Some("default") | Some("lazy") => {}
                _ => return Err(PolicyError::BadValue(key.clone(), "must be default or lazy")),
            },
            known if NOT_IMPLEMENTED_KEYS.contains(&known) => not_implemented.push(key.clone()),
            _ => unrecognised.push(key.clone()),
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
        let chosen = |name: &str| select(&policies, "/", name.as_bytes(), Target::Queue).map(|policy| policy.name.clone());
        assert_eq!(chosen("orders.eu.1").as_deref(), Some("high"));
        assert_eq!(chosen("orders.us").as_deref(), Some("low"));
        assert_eq!(chosen("invoices"), None, "the exchange-only and other-vhost policies do not apply");
        assert_eq!(high.queue_settings.message_ttl_ms, Some(60_000));
        assert_eq!(low.queue_settings.max_length, Some(10));
    }

    #[test]
    fn unknown_and_unimplemented_settings_are_refused_loudly() {
        let refused = |value: Value| Policy::new("/", "p", ".*", "queues", 0, definition(value)).err();
        assert_eq!(refused(json!({"colour": "blue"})), Some(PolicyError::Unrecognised(vec!["colour".to_string()])));
        assert_eq!(
            refused(json!({"dead-letter-exchange": "dlx"})),
            Some(PolicyError::NotImplemented(vec!["dead-letter-exchange".to_string()]))
        );
        assert!(matches!(refused(json!({"max-length": -1})), Some(PolicyError::BadValue(..))));
        assert!(matches!(refused(json!({"overflow": "explode"})), Some(PolicyError::BadValue(..))));
        assert_eq!(refused(json!({})), Some(PolicyError::Empty));
        assert!(matches!(Policy::new("/", "p", "(", "queues", 0, definition(json!({"max-length": 1}))), Err(PolicyError::Pattern(..))));
        assert!(matches!(Policy::new("/", "p", ".*", "streams", 0, definition(json!({"max-length": 1}))), Err(PolicyError::ApplyTo(..))));
        assert!(refused(json!({"queue-mode": "lazy", "overflow": "reject-publish"})).is_none());
    }
}
