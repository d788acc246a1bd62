//! A vhost's limits, as RabbitMQ's `vhost-limits` runtime parameter holds them: `max-connections`
//! (connections open in the vhost) and `max-queues` (queues declared in it). A negative value
//! means no limit; 0 refuses every new connection or queue. Set through the management API
//! (`/api/vhost-limits`) or imported definitions, kept with the vhost's record in the definitions
//! file, and exported as RabbitMQ exports them: a parameter of component `vhost-limits` named
//! `limits`.

use std::collections::BTreeMap;

/// One of the limits a vhost can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VhostLimit {
    /// How many connections may be open in the vhost.
    MaxConnections,
    /// How many queues the vhost may hold.
    MaxQueues,
}

impl VhostLimit {
    /// RabbitMQ's name for it.
    pub fn name(self) -> &'static str {
        match self {
            VhostLimit::MaxConnections => "max-connections",
            VhostLimit::MaxQueues => "max-queues",
        }
    }

    /// The limit RabbitMQ calls `name`.
    pub fn parse(name: &str) -> Option<VhostLimit> {
        match name {
            "max-connections" => Some(VhostLimit::MaxConnections),
            "max-queues" => Some(VhostLimit::MaxQueues),
            _ => None,
        }
    }
}

/// The limits a vhost has: each set one, by name. An empty set is not the same as none: RabbitMQ
/// keeps the parameter when its last limit is deleted, and lists it (`"value": []`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VhostLimits {
    /// max-connections, when set.
    pub max_connections: Option<i64>,
    /// max-queues, when set.
    pub max_queues: Option<i64>,
}

impl VhostLimits {
    /// The value of one limit, when set.
    pub fn get(&self, limit: VhostLimit) -> Option<i64> {
        match limit {
            VhostLimit::MaxConnections => self.max_connections,
            VhostLimit::MaxQueues => self.max_queues,
        }
    }

    /// Sets (`Some`) or clears (`None`) one limit.
    pub fn set(&mut self, limit: VhostLimit, value: Option<i64>) {
        match limit {
            VhostLimit::MaxConnections => self.max_connections = value,
            VhostLimit::MaxQueues => self.max_queues = value,
        }
    }

    /// The bound a limit puts on a count, when it puts one (a negative value is no limit).
    pub fn bound(&self, limit: VhostLimit) -> Option<u64> {
        self.get(limit).and_then(|value| u64::try_from(value).ok())
    }

    /// By RabbitMQ's names, for the definitions file and the API.
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        [VhostLimit::MaxConnections, VhostLimit::MaxQueues]
            .into_iter()
            .filter_map(|limit| self.get(limit).map(|value| (limit.name().to_string(), value)))
            .collect()
    }

    /// From RabbitMQ's names; a name that is not a limit is returned as the error.
    pub fn from_map(map: &BTreeMap<String, i64>) -> Result<VhostLimits, String> {
        let mut limits = VhostLimits::default();
        for (name, value) in map {
            let limit = VhostLimit::parse(name).ok_or_else(|| name.clone())?;
            limits.set(limit, Some(*value));
        }
        Ok(limits)
    }

    /// From a JSON object of limits (a `PUT` body's or an imported parameter's value), validated
    /// with RabbitMQ's texts: an unknown name or a value that is not an integer is refused.
    pub fn from_json(value: &serde_json::Value) -> Result<VhostLimits, String> {
        let mut limits = VhostLimits::default();
        let entries = match value {
            serde_json::Value::Object(entries) => entries,
            // RabbitMQ writes an empty set of limits as an empty list.
            serde_json::Value::Array(items) if items.is_empty() => return Ok(limits),
            other => return Err(format!("Validation failed\n\n{} is not a valid limits object\n", erlang_term(other))),
        };
        let unknown: Vec<String> = entries
            .iter()
            .filter(|(name, _)| VhostLimit::parse(name).is_none())
            .map(|(name, value)| format!("{{<<\"{name}\">>,{}}}", erlang_term(value)))
            .collect();
        if !unknown.is_empty() {
            return Err(format!("Validation failed\n\nUnrecognised terms [{}] in limits\n", unknown.join(",")));
        }
        for (name, value) in entries {
            let limit = VhostLimit::parse(name).ok_or_else(|| name.clone())?;
            limits.set(limit, Some(limit_value(limit, value)?));
        }
        Ok(limits)
    }
}

/// One limit's value from JSON: an integer, or RabbitMQ's validation text.
pub fn limit_value(limit: VhostLimit, value: &serde_json::Value) -> Result<i64, String> {
    value.as_i64().ok_or_else(|| format!("Validation failed\n\n{} should be a number, actually was {}\n", limit.name(), erlang_term(value)))
}

/// A JSON value as RabbitMQ's validation messages print the Erlang term it decoded to: strings
/// as binaries (`<<"x">>`), numbers, `true`, `false` and `null` as they are.
fn erlang_term(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => format!("<<\"{text}\">>"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_are_validated_with_rabbitmq_texts() {
        let limits = VhostLimits::from_json(&json!({"max-connections": 2, "max-queues": -1})).expect("valid");
        assert_eq!(limits, VhostLimits { max_connections: Some(2), max_queues: Some(-1) });
        assert_eq!(limits.bound(VhostLimit::MaxConnections), Some(2));
        assert_eq!(limits.bound(VhostLimit::MaxQueues), None, "negative: no limit");
        assert_eq!(VhostLimits::from_map(&limits.to_map()), Ok(limits));
        assert_eq!(VhostLimits::from_json(&json!([])), Ok(VhostLimits::default()));
        assert_eq!(
            VhostLimits::from_json(&json!({"max-foo": 5})).err().unwrap_or_default(),
            "Validation failed\n\nUnrecognised terms [{<<\"max-foo\">>,5}] in limits\n"
        );
        assert_eq!(
            VhostLimits::from_json(&json!({"max-queues": "x"})).err().unwrap_or_default(),
            "Validation failed\n\nmax-queues should be a number, actually was <<\"x\">>\n"
        );
        assert_eq!(
            limit_value(VhostLimit::MaxQueues, &json!(1.5)).err().unwrap_or_default(),
            "Validation failed\n\nmax-queues should be a number, actually was 1.5\n"
        );
        assert_eq!(VhostLimits::from_map(&BTreeMap::from([("max-foo".to_string(), 1)])), Err("max-foo".to_string()));
    }
}
