//! Message deduplication (beyond RabbitMQ), with the argument and header names of LavinMQ and of
//! the rabbitmq-message-deduplication plugin: a message whose `x-deduplication-header` value was
//! seen within the cache's time to live is not routed (on an exchange) or not enqueued (on a
//! queue). An exchange deduplicates when it is of the plugin's type `x-message-deduplication`
//! (which routes as fanout) or has `x-message-deduplication: true` (LavinMQ's way, any type); a
//! queue when it has `x-message-deduplication: true`.
//!
//! Arguments: `x-cache-size` (entries; the bound of the cache, required by the plugin's exchange
//! type), `x-cache-ttl` (ms; none: until evicted), `x-cache-persistence` (`memory` or `disk`),
//! `x-deduplication-header` (LavinMQ: the header that holds the key). A message's own
//! `x-cache-ttl` header overrides the cache's time to live. The cache itself lives in the server.

use amqp_codec::{FieldTable, FieldValue};

/// Turns deduplication on for a queue or an exchange of any type.
pub const DEDUPLICATION_ARGUMENT: &str = "x-message-deduplication";
/// The most entries the cache holds.
pub const CACHE_SIZE_ARGUMENT: &str = "x-cache-size";
/// How long an entry counts, in ms (also a message header, overriding the argument).
pub const CACHE_TTL_ARGUMENT: &str = "x-cache-ttl";
/// `memory` or `disk`.
pub const CACHE_PERSISTENCE_ARGUMENT: &str = "x-cache-persistence";
/// The name of the header that holds a message's key (LavinMQ).
pub const HEADER_ARGUMENT: &str = "x-deduplication-header";
/// The header that holds a message's key unless `x-deduplication-header` names another.
pub const DEFAULT_HEADER: &str = "x-deduplication-header";
/// The cache's size without `x-cache-size` (LavinMQ's default).
pub const CACHE_SIZE_DEFAULT: u64 = 128;
/// The largest `x-cache-size` taken: a cache entry costs about 100 bytes of memory with its key.
pub const CACHE_SIZE_MAX: u64 = 1_000_000;

/// Where a cache keeps its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// In memory only: a restart forgets them.
    Memory,
    /// Also in a log on disk: they survive a restart.
    Disk,
}

/// A deduplicating exchange's or queue's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeduplicationSettings {
    /// The most entries (the oldest inserted goes first when full).
    pub cache_size: u64,
    /// How long an entry counts, unless a message says otherwise; none: until evicted.
    pub cache_ttl_ms: Option<u64>,
    /// As declared; none lets the server choose (disk for a durable owner).
    pub persistence: Option<Persistence>,
    /// The header that holds the key.
    pub header: String,
}

/// The settings `arguments` declare, when deduplication is on (`always`: the plugin's exchange
/// type, on whatever the arguments say). The arguments are checked first by [`check`].
pub fn settings(arguments: &FieldTable, always: bool) -> Option<DeduplicationSettings> {
    let on = always || matches!(arguments.get(DEDUPLICATION_ARGUMENT), Some(FieldValue::Bool(true)));
    if !on {
        return None;
    }
    let integer = |key: &str| arguments.get(key).and_then(FieldValue::as_i64).and_then(|value| u64::try_from(value).ok());
    let persistence = match arguments.get(CACHE_PERSISTENCE_ARGUMENT).and_then(FieldValue::as_text).as_deref() {
        Some("disk") => Some(Persistence::Disk),
        Some("memory") => Some(Persistence::Memory),
        _ => None,
    };
    Some(DeduplicationSettings {
        cache_size: integer(CACHE_SIZE_ARGUMENT).unwrap_or(CACHE_SIZE_DEFAULT).clamp(1, CACHE_SIZE_MAX),
        cache_ttl_ms: integer(CACHE_TTL_ARGUMENT).filter(|ttl| *ttl > 0),
        persistence,
        header: arguments.get(HEADER_ARGUMENT).and_then(FieldValue::as_text).unwrap_or_else(|| DEFAULT_HEADER.to_string()),
    })
}

/// Checks the deduplication arguments among `arguments`; the key and the problem of the first bad
/// one. `size_required`: the plugin's exchange type, which requires `x-cache-size`.
pub fn check(arguments: &FieldTable, size_required: bool) -> Result<(), (&'static str, String)> {
    if size_required && arguments.get(CACHE_SIZE_ARGUMENT).is_none() {
        return Err((CACHE_SIZE_ARGUMENT, "missing: the x-message-deduplication exchange requires it".to_string()));
    }
    for (key, value) in arguments.iter() {
        let key = match key.as_bytes() {
            b"x-message-deduplication" => DEDUPLICATION_ARGUMENT,
            b"x-cache-size" => CACHE_SIZE_ARGUMENT,
            b"x-cache-ttl" => CACHE_TTL_ARGUMENT,
            b"x-cache-persistence" => CACHE_PERSISTENCE_ARGUMENT,
            b"x-deduplication-header" => HEADER_ARGUMENT,
            _ => continue,
        };
        check_one(key, value).map_err(|problem| (key, problem))?;
    }
    Ok(())
}

fn check_one(key: &str, value: &FieldValue) -> Result<(), String> {
    let unacceptable = || format!("{{unacceptable_type,{}}}", value_type(value));
    match key {
        DEDUPLICATION_ARGUMENT => matches!(value, FieldValue::Bool(_)).then_some(()).ok_or_else(unacceptable),
        CACHE_SIZE_ARGUMENT => match value.as_i64().ok_or_else(unacceptable)? {
            size if size <= 0 => Err(format!("{{value_not_positive,{size}}}")),
            size if size as u64 > CACHE_SIZE_MAX => Err(format!("{{value_too_large,{size},max,{CACHE_SIZE_MAX}}}")),
            _ => Ok(()),
        },
        CACHE_TTL_ARGUMENT => match value.as_i64().ok_or_else(unacceptable)? {
            ttl if ttl < 0 => Err(format!("{{value_negative,{ttl}}}")),
            _ => Ok(()),
        },
        CACHE_PERSISTENCE_ARGUMENT => match value.as_text().as_deref() {
            Some("memory" | "disk") => Ok(()),
            Some(other) => Err(format!("{{unacceptable_value,<<\"{other}\">>}}")),
            None => Err(unacceptable()),
        },
        _ => match value {
            FieldValue::LongStr(text) if !text.is_empty() && text.len() <= 255 => Ok(()),
            FieldValue::LongStr(_) => Err("{unacceptable_value,empty_or_longer_than_255}".to_string()),
            _ => Err(unacceptable()),
        },
    }
}

/// A value's AMQP type name, as RabbitMQ's texts print them.
fn value_type(value: &FieldValue) -> &'static str {
    match value {
        FieldValue::Bool(_) => "bool",
        FieldValue::LongStr(_) => "longstr",
        FieldValue::F32(_) => "float",
        FieldValue::F64(_) => "double",
        FieldValue::Table(_) => "table",
        FieldValue::Array(_) => "array",
        value if value.as_i64().is_some() => "integer",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn table(entries: &[(&str, FieldValue)]) -> FieldTable {
        let mut table = FieldTable::new();
        for (key, value) in entries {
            table.insert(key, value.clone());
        }
        table
    }

    #[test]
    fn settings_follow_the_arguments_with_lavinmq_defaults() {
        assert_eq!(settings(&FieldTable::new(), false), None);
        let on = settings(&table(&[(DEDUPLICATION_ARGUMENT, FieldValue::Bool(true))]), false).expect("on");
        assert_eq!(
            on,
            DeduplicationSettings { cache_size: 128, cache_ttl_ms: None, persistence: None, header: DEFAULT_HEADER.to_string() }
        );
        let full = table(&[
            (CACHE_SIZE_ARGUMENT, FieldValue::I32(10)),
            (CACHE_TTL_ARGUMENT, FieldValue::I64(5000)),
            (CACHE_PERSISTENCE_ARGUMENT, FieldValue::LongStr(Bytes::from("memory"))),
            (HEADER_ARGUMENT, FieldValue::LongStr(Bytes::from("order-id"))),
        ]);
        let plugin_type = settings(&full, true).expect("always on for the exchange type");
        assert_eq!((plugin_type.cache_size, plugin_type.cache_ttl_ms), (10, Some(5000)));
        assert_eq!((plugin_type.persistence, plugin_type.header.as_str()), (Some(Persistence::Memory), "order-id"));
    }

    #[test]
    fn bad_arguments_are_named() {
        let refused = |entries: &[(&str, FieldValue)]| check(&table(entries), false).unwrap_err();
        assert_eq!(refused(&[(CACHE_SIZE_ARGUMENT, FieldValue::I32(0))]), (CACHE_SIZE_ARGUMENT, "{value_not_positive,0}".to_string()));
        assert_eq!(refused(&[(CACHE_SIZE_ARGUMENT, FieldValue::I64(2_000_000))]).0, CACHE_SIZE_ARGUMENT);
        assert_eq!(refused(&[(CACHE_TTL_ARGUMENT, FieldValue::I32(-1))]), (CACHE_TTL_ARGUMENT, "{value_negative,-1}".to_string()));
        assert_eq!(
            refused(&[(DEDUPLICATION_ARGUMENT, FieldValue::I32(1))]),
            (DEDUPLICATION_ARGUMENT, "{unacceptable_type,integer}".to_string())
        );
        let persistence = refused(&[(CACHE_PERSISTENCE_ARGUMENT, FieldValue::LongStr(Bytes::from("tape")))]);
        assert_eq!(persistence, (CACHE_PERSISTENCE_ARGUMENT, "{unacceptable_value,<<\"tape\">>}".to_string()));
        assert_eq!(check(&FieldTable::new(), true).unwrap_err().0, CACHE_SIZE_ARGUMENT);
        assert_eq!(check(&table(&[(CACHE_SIZE_ARGUMENT, FieldValue::I32(5))]), true), Ok(()));
    }
}
