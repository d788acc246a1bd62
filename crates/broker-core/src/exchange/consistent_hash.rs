//! The `x-consistent-hash` exchange type of RabbitMQ's rabbitmq_consistent_hash_exchange plugin:
//! each message goes to one of the exchange's bindings, chosen by a hash of its routing key (or of
//! the header named by the exchange's `hash-header` argument, or of the property named by
//! `hash-property`), with a binding's chance proportional to its weight, the integer its binding
//! key holds.
//!
//! RabbitMQ numbers buckets in binding order and picks one by jump consistent hashing, so the
//! queue a key goes to depends on the order bindings were made, which a node restart may change
//! (a known complaint). Lepus uses weighted rendezvous hashing instead: every binding scores the
//! message's hash, the best score wins. The choice depends only on the set of bindings, not their
//! order, so it survives restarts; adding or removing a binding moves only the keys that go to or
//! came from that binding; and the share of each binding is its weight over the total. It costs
//! one hash and one logarithm per binding per message, for this exchange type only.

use super::{Binding, Destination};
#[cfg(test)]
use amqp_codec::FieldValue;
use amqp_codec::{BasicProperties, FieldTable};

/// The largest weight a binding key may hold. RabbitMQ accepts any positive integer (and makes a
/// bucket record per unit of weight); Lepus keeps weights to 32 bits so their sum cannot overflow.
pub const BINDING_WEIGHT_MAX: u64 = u32::MAX as u64;

/// The exchange argument naming a header to hash instead of the routing key.
pub const HASH_HEADER_ARGUMENT: &str = "hash-header";
/// The exchange argument naming a property to hash instead of the routing key.
pub const HASH_PROPERTY_ARGUMENT: &str = "hash-property";
/// The properties `hash-property` may name, as in RabbitMQ.
const HASHABLE_PROPERTIES: [&str; 3] = ["correlation_id", "message_id", "timestamp"];

/// What the exchange hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashOn {
    /// The routing key (the default).
    RoutingKey,
    /// The value of a header.
    Header(String),
    /// `correlation_id`, `message_id` or `timestamp`.
    Property(String),
}

impl HashOn {
    /// What an exchange's arguments ask to hash, checked with RabbitMQ's 406 texts (a value that is
    /// not a string makes RabbitMQ 3.10.8 fail with 541 INTERNAL_ERROR; Lepus answers 406).
    pub fn from_arguments(arguments: &FieldTable) -> Result<HashOn, String> {
        let text_of = |key: &str| -> Result<Option<String>, String> {
            match arguments.get(key) {
                None => Ok(None),
                Some(value) => value.as_text().map(Some).ok_or_else(|| format!("{key} must be a string")),
            }
        };
        match (text_of(HASH_HEADER_ARGUMENT)?, text_of(HASH_PROPERTY_ARGUMENT)?) {
            (None, None) => Ok(HashOn::RoutingKey),
            (Some(header), None) => Ok(HashOn::Header(header)),
            (None, Some(property)) if HASHABLE_PROPERTIES.contains(&property.as_str()) => Ok(HashOn::Property(property)),
            (None, Some(property)) => Err(format!("Unsupported property: {property}")),
            (Some(_), Some(_)) => Err("hash-header and hash-property are mutually exclusive".to_string()),
        }
    }

    /// Whether the message's properties are needed (not for the routing key).
    pub fn needs_properties(&self) -> bool {
        *self != HashOn::RoutingKey
    }
}

/// The weight a binding key holds, with RabbitMQ's 406 texts for one that is not a positive
/// integer (`+5` is 5, as Erlang's `list_to_integer` reads it).
pub fn binding_weight(binding_key: &[u8]) -> Result<u64, String> {
    let text = String::from_utf8_lossy(binding_key);
    let digits = text.strip_prefix('+').unwrap_or(&text);
    let negative = digits.strip_prefix('-');
    let magnitude = negative.unwrap_or(digits);
    if magnitude.is_empty() || !magnitude.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(format!("The binding key must be an integer: <<\"{text}\">>"));
    }
    let value = magnitude.trim_start_matches('0');
    if negative.is_some() || value.is_empty() {
        return Err("The binding key must be greater than 0".to_string());
    }
    match value.parse::<u64>() {
        Ok(weight) if weight <= BINDING_WEIGHT_MAX => Ok(weight),
        _ => Err(format!("The binding key must be at most {BINDING_WEIGHT_MAX}")),
    }
}

/// 64-bit FNV-1a, then a finaliser that spreads every input bit over the output: stable across
/// builds and restarts, unlike the standard library's hasher.
fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(hash)
}

/// SplitMix64's finaliser.
fn mix(mut value: u64) -> u64 {
    value ^= value >> 30;
    value = value.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value ^= value >> 27;
    value = value.wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

/// The hash of what a message is routed by. A missing header or property hashes as an empty
/// value, so such messages all go to one binding, as in RabbitMQ.
pub fn message_hash(hash_on: &HashOn, routing_key: &[u8], properties: Option<&BasicProperties>) -> u64 {
    match hash_on {
        HashOn::RoutingKey => hash_bytes(0, routing_key),
        HashOn::Header(name) => {
            let value = properties.and_then(|properties| properties.headers.as_ref()).and_then(|headers| headers.get(name.as_str()));
            match value {
                None => hash_bytes(1, b""),
                Some(value) => match value.as_text() {
                    Some(text) => hash_bytes(0, text.as_bytes()),
                    None => hash_bytes(2, format!("{value:?}").as_bytes()),
                },
            }
        }
        HashOn::Property(name) => {
            let text = properties.and_then(|properties| match name.as_str() {
                "correlation_id" => properties.correlation_id.as_ref().map(|value| value.to_string_lossy()),
                "message_id" => properties.message_id.as_ref().map(|value| value.to_string_lossy()),
                _ => properties.timestamp.map(|value| value.to_string()),
            });
            match text {
                Some(text) => hash_bytes(0, text.as_bytes()),
                None => hash_bytes(1, b""),
            }
        }
    }
}

/// The binding a message of hash `message_hash` goes to: the best weighted rendezvous score. A
/// binding whose key is not a weight (it could not have been made) is passed over.
pub fn choose(bindings: &[Binding], message_hash: u64) -> Option<&Binding> {
    let mut best: Option<(f64, &Binding)> = None;
    for binding in bindings {
        let Ok(weight) = binding_weight(binding.routing_key.as_bytes()) else { continue };
        let (kind, name) = match &binding.destination {
            Destination::Queue(name) => (0u64, name),
            Destination::Exchange(name) => (1u64, name),
        };
        let binding_hash = hash_bytes(kind, name.as_bytes()) ^ hash_bytes(3, binding.routing_key.as_bytes()).rotate_left(17);
        let draw = mix(message_hash ^ binding_hash);
        // A uniform draw in (0, 1), never 0 or 1, so the logarithm is finite and negative.
        let uniform = ((draw >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let score = weight as f64 / -uniform.ln();
        if best.is_none_or(|(best_score, _)| score > best_score) {
            best = Some((score, binding));
        }
    }
    best.map(|(_, binding)| binding)
}

/// A string header or argument value, for the tests.
#[cfg(test)]
fn header(value: &str) -> FieldValue {
    FieldValue::LongStr(value.as_bytes().to_vec().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::ShortStr;

    fn binding(queue: &str, weight: &str) -> Binding {
        Binding {
            destination: Destination::Queue(ShortStr::from(queue)),
            routing_key: ShortStr::from(weight),
            arguments: FieldTable::new(),
        }
    }

    fn destination(binding: &Binding) -> String {
        match &binding.destination {
            Destination::Queue(name) | Destination::Exchange(name) => name.to_string_lossy(),
        }
    }

    #[test]
    fn binding_keys_are_weights_with_rabbitmqs_texts() {
        assert_eq!(binding_weight(b"3"), Ok(3));
        assert_eq!(binding_weight(b"+5"), Ok(5));
        assert_eq!(binding_weight(b"abc"), Err("The binding key must be an integer: <<\"abc\">>".to_string()));
        assert_eq!(binding_weight(b" 5"), Err("The binding key must be an integer: <<\" 5\">>".to_string()));
        assert_eq!(binding_weight(b"0"), Err("The binding key must be greater than 0".to_string()));
        assert_eq!(binding_weight(b"-3"), Err("The binding key must be greater than 0".to_string()));
        assert!(binding_weight(b"99999999999999999999").is_err());
    }

    #[test]
    fn keys_spread_by_weight_and_each_key_keeps_its_binding() {
        let bindings = vec![binding("a", "1"), binding("b", "2"), binding("c", "3"), binding("d", "4")];
        let mut counts = [0u32; 4];
        for key in 0..10_000 {
            let hash = message_hash(&HashOn::RoutingKey, format!("key-{key}").as_bytes(), None);
            let chosen = choose(&bindings, hash).expect("bindings exist");
            counts["abcd".find(destination(chosen).as_str()).expect("one of them")] += 1;
            assert_eq!(choose(&bindings, hash).map(destination), Some(destination(chosen)), "the same key, the same binding");
        }
        for (index, count) in counts.iter().enumerate() {
            let expected = 10_000.0 * (index + 1) as f64 / 10.0;
            assert!((f64::from(*count) - expected).abs() < expected * 0.1, "{counts:?}");
        }
        // The choice does not depend on the order of the bindings.
        let reversed: Vec<Binding> = bindings.iter().rev().cloned().collect();
        for key in 0..1000 {
            let hash = message_hash(&HashOn::RoutingKey, format!("key-{key}").as_bytes(), None);
            assert_eq!(choose(&bindings, hash).map(destination), choose(&reversed, hash).map(destination));
        }
    }

    #[test]
    fn removing_a_binding_moves_only_its_keys() {
        let bindings = vec![binding("a", "1"), binding("b", "1"), binding("c", "1")];
        let fewer = vec![binding("a", "1"), binding("c", "1")];
        for key in 0..2000 {
            let hash = message_hash(&HashOn::RoutingKey, format!("key-{key}").as_bytes(), None);
            let before = choose(&bindings, hash).map(destination);
            if before.as_deref() != Some("b") {
                assert_eq!(choose(&fewer, hash).map(destination), before);
            }
        }
    }

    #[test]
    fn header_and_property_arguments_choose_what_is_hashed() {
        let table = |entries: &[(&str, &str)]| {
            let mut arguments = FieldTable::new();
            for (key, value) in entries {
                arguments.insert(key, header(value));
            }
            arguments
        };
        assert_eq!(HashOn::from_arguments(&table(&[])), Ok(HashOn::RoutingKey));
        assert_eq!(HashOn::from_arguments(&table(&[("hash-property", "app_id")])), Err("Unsupported property: app_id".to_string()));
        assert_eq!(HashOn::from_arguments(&table(&[("hash-property", "message_id")])), Ok(HashOn::Property("message_id".to_string())));
        assert_eq!(HashOn::from_arguments(&table(&[("hash-header", "shard")])), Ok(HashOn::Header("shard".to_string())));
        assert_eq!(
            HashOn::from_arguments(&table(&[("hash-property", "message_id"), ("hash-header", "shard")])),
            Err("hash-header and hash-property are mutually exclusive".to_string())
        );
        let properties = BasicProperties { message_id: Some(ShortStr::from("m-1")), ..BasicProperties::default() };
        let by_property = message_hash(&HashOn::Property("message_id".to_string()), b"ignored", Some(&properties));
        assert_eq!(by_property, message_hash(&HashOn::RoutingKey, b"m-1", None));
    }
}
