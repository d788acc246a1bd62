//! The message a dead-lettering publishes: RabbitMQ 3.10's `rabbit_dead_letter:make_msg/5`. The
//! `x-death` header gains (or counts again) the entry of this queue and reason, the first death
//! is named in `x-first-death-*`, the expiration moves to `original-expiration`, and the message
//! goes to the dead-letter exchange with the dead-letter routing key (or its own keys).

use super::DeadLetterTarget;
use amqp_codec::{ContentHeader, FieldTable, FieldValue, ShortStr};
use broker_core::Message;
use bytes::Bytes;
use queue_core::DeadLetterReason;

const X_DEATH: &str = "x-death";

/// A dead-lettered message and its `x-death` entries (most recent first), for the cycle check.
#[derive(Debug)]
pub struct DeadLettered {
    /// The message to route through the dead-letter exchange.
    pub message: Message,
    /// The `x-death` array as written into the message.
    pub deaths: Vec<FieldValue>,
    /// The keys it is routed by: the dead-letter routing key, or without one the message's own
    /// keys, its routing key and then its `CC` keys, as RabbitMQ 3.10 routes it (the message's
    /// `routing_keys`; its `BCC` keys were taken out at publish, before any queue held it).
    pub routing_keys: Vec<ShortStr>,
}

fn text(value: &[u8]) -> FieldValue {
    FieldValue::LongStr(Bytes::copy_from_slice(value))
}

fn table_text<'a>(table: &'a FieldTable, key: &str) -> Option<&'a [u8]> {
    match table.get(key) {
        Some(FieldValue::LongStr(value)) => Some(value),
        _ => None,
    }
}

/// Sets `key` to `value`, replacing an entry of that key.
fn set(table: &mut FieldTable, key: &str, value: FieldValue) {
    table.0.retain(|(name, _)| name.as_bytes() != key.as_bytes());
    table.insert(key, value);
}

/// RabbitMQ keeps header tables sorted by key once it has changed them (`rabbit_misc:sort_field_table`).
fn sort(table: &mut FieldTable) {
    table.0.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
}

/// The message `message` becomes when `queue` dead-letters it for `reason` at `now_s` (seconds
/// since the epoch). None when its properties cannot be read (they were checked on publish).
pub fn dead_lettered(
    message: &Message,
    queue: &ShortStr,
    reason: DeadLetterReason,
    target: &DeadLetterTarget,
    now_s: u64,
) -> Option<DeadLettered> {
    let mut properties = message.header.properties().ok()?;
    let mut headers = properties.headers.take().unwrap_or_default();
    // The first routing key is the publish's; the others are its CC keys.
    let mut routing_keys = vec![text(message.routing_key.as_bytes())];
    if let Some(FieldValue::Array(cc)) = headers.get("CC") {
        routing_keys.extend(cc.iter().filter(|key| matches!(key, FieldValue::LongStr(_))).cloned());
    }
    let mut entry = FieldTable::new();
    entry.insert("count", FieldValue::I64(1));
    entry.insert("reason", text(reason.name().as_bytes()));
    entry.insert("queue", text(queue.as_bytes()));
    entry.insert("time", FieldValue::Timestamp(now_s));
    entry.insert("exchange", text(message.exchange.as_bytes()));
    entry.insert("routing-keys", FieldValue::Array(routing_keys.clone()));
    if let Some(expiration) = properties.expiration.take() {
        entry.insert("original-expiration", text(expiration.as_bytes()));
    }
    let deaths = add_death(&mut headers, entry, queue, reason, &message.exchange);
    if target.routing_key.is_some() {
        // The CC keys were the original route; the dead-letter routing key replaces them all.
        headers.0.retain(|(name, _)| name.as_bytes() != b"CC");
    }
    sort(&mut headers);
    properties.headers = Some(headers);
    let header = ContentHeader::from_properties(message.header.class_id, message.header.body_size, &properties);
    let (routing_keys, bcc_routing_keys) = match &target.routing_key {
        Some(routing_key) => (vec![routing_key.clone()], None),
        // Without a dead-letter routing key the message keeps its routes, its BCC keys among
        // them (RabbitMQ keeps them in its routing keys), though x-death, read from the
        // headers, does not list them.
        None => {
            let mut keys: Vec<ShortStr> = routing_keys
                .iter()
                .filter_map(|key| match key {
                    // Longer keys were never routing keys: no binding can match them.
                    FieldValue::LongStr(key) if key.len() <= 255 => Some(ShortStr::from_bytes(key.clone())),
                    _ => None,
                })
                .collect();
            keys.extend(message.bcc_routing_keys.iter().flat_map(|bcc| bcc.iter().cloned()));
            (keys, message.bcc_routing_keys.clone())
        }
    };
    let routing_key = target.routing_key.clone().unwrap_or_else(|| message.routing_key.clone());
    let body = message.body.clone();
    let message = Message { exchange: target.exchange.clone(), routing_key, header, body, published_at_ns: 0, bcc_routing_keys };
    Some(DeadLettered { message, deaths, routing_keys })
}

/// The message with its `x-delivery-count` header (a long, as RabbitMQ's quorum queues write it)
/// set to `count`: a copy, made only for queues with a delivery limit.
pub fn with_delivery_count(message: &std::sync::Arc<Message>, count: u32) -> std::sync::Arc<Message> {
    let Ok(mut properties) = message.header.properties() else {
        return message.clone();
    };
    let mut headers = properties.headers.take().unwrap_or_default();
    set(&mut headers, "x-delivery-count", FieldValue::I64(i64::from(count)));
    properties.headers = Some(headers);
    let header = ContentHeader::from_properties(message.header.class_id, message.header.body_size, &properties);
    std::sync::Arc::new(Message { header, ..(**message).clone() })
}

/// Adds `entry` to the `x-death` header: the first death also names itself in `x-first-death-*`;
/// a later death of the same queue and reason counts one more on that entry (which keeps its
/// first time, exchange and keys, as RabbitMQ's does) and moves it to the front. Returns the array.
fn add_death(
    headers: &mut FieldTable,
    entry: FieldTable,
    queue: &ShortStr,
    reason: DeadLetterReason,
    exchange: &ShortStr,
) -> Vec<FieldValue> {
    let existing = match headers.get(X_DEATH) {
        Some(FieldValue::Array(deaths)) => Some(deaths.clone()),
        _ => None,
    };
    let deaths = match existing {
        None => {
            let first_death = headers.get(X_DEATH).is_none();
            if first_death {
                set(headers, "x-first-death-reason", text(reason.name().as_bytes()));
                set(headers, "x-first-death-queue", text(queue.as_bytes()));
                set(headers, "x-first-death-exchange", text(exchange.as_bytes()));
            }
            vec![FieldValue::Table(entry)]
        }
        Some(mut deaths) => {
            let same = |death: &FieldValue| match death {
                FieldValue::Table(table) => {
                    table_text(table, "queue") == Some(queue.as_bytes()) && table_text(table, "reason") == Some(reason.name().as_bytes())
                }
                _ => false,
            };
            let mut front = match deaths.iter().position(same) {
                Some(index) => match deaths.remove(index) {
                    FieldValue::Table(mut table) => {
                        let count = table.get("count").and_then(FieldValue::as_i64).unwrap_or(0);
                        set(&mut table, "count", FieldValue::I64(count.saturating_add(1)));
                        table
                    }
                    _ => entry,
                },
                None => entry,
            };
            sort(&mut front);
            deaths.insert(0, FieldValue::Table(front));
            deaths
        }
    };
    set(headers, X_DEATH, FieldValue::Array(deaths.clone()));
    deaths
}

/// Whether publishing to `target_queue` would close a dead-letter cycle that no client broke:
/// RabbitMQ's `rabbit_dead_letter:is_cycle/2`. The deaths since the target last dead-lettered
/// the message (and that death) must all be automatic (none `rejected`) for it to be a cycle.
/// Rejected messages are never checked (the caller skips the check for that reason).
pub fn is_cycle(target_queue: &[u8], deaths: &[FieldValue]) -> bool {
    let queue_of = |death: &FieldValue| match death {
        FieldValue::Table(table) => table_text(table, "queue").map(<[u8]>::to_vec),
        _ => None,
    };
    let Some(index) = deaths.iter().position(|death| queue_of(death).as_deref() == Some(target_queue)) else {
        return false;
    };
    deaths[..=index].iter().all(|death| match death {
        FieldValue::Table(table) => table_text(table, "reason") != Some(b"rejected"),
        // Something a client put there: the cycle is not fully automatic.
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::BasicProperties;

    fn message(headers: Option<FieldTable>, expiration: Option<&str>) -> Message {
        let properties =
            BasicProperties { headers, expiration: expiration.map(ShortStr::from), delivery_mode: Some(2), ..BasicProperties::default() };
        Message {
            exchange: ShortStr::from("orders"),
            routing_key: ShortStr::from("eu"),
            header: ContentHeader::from_properties(60, 3, &properties),
            body: Bytes::from_static(b"abc"),
            published_at_ns: 0,
            bcc_routing_keys: None,
        }
    }

    fn target(routing_key: Option<&str>) -> DeadLetterTarget {
        DeadLetterTarget { exchange: ShortStr::from("dlx"), routing_key: routing_key.map(ShortStr::from) }
    }

    fn headers_of(message: &Message) -> FieldTable {
        message.header.properties().expect("decodes").headers.expect("headers")
    }

    fn death(deaths: &[FieldValue], index: usize) -> &FieldTable {
        match &deaths[index] {
            FieldValue::Table(table) => table,
            other => panic!("not a table: {other:?}"),
        }
    }

    #[test]
    fn the_first_death_writes_x_death_and_the_first_death_headers() {
        let mut cc = FieldTable::new();
        cc.insert("CC", FieldValue::Array(vec![text(b"us")]));
        let original = message(Some(cc), Some("60000"));
        let dead = dead_lettered(&original, &ShortStr::from("q"), DeadLetterReason::Rejected, &target(Some("parked")), 1_700_000_000)
            .expect("dead-lettered");
        assert_eq!(dead.message.exchange.as_bytes(), b"dlx");
        assert_eq!(dead.message.routing_key.as_bytes(), b"parked");
        let properties = dead.message.header.properties().expect("decodes");
        assert_eq!(properties.expiration, None, "the expiration is removed");
        assert_eq!(properties.delivery_mode, Some(2));
        let headers = properties.headers.expect("headers");
        assert!(headers.get("CC").is_none(), "a dead-letter routing key replaces the CC keys");
        assert_eq!(headers.get("x-first-death-reason"), Some(&text(b"rejected")));
        assert_eq!(headers.get("x-first-death-queue"), Some(&text(b"q")));
        assert_eq!(headers.get("x-first-death-exchange"), Some(&text(b"orders")));
        let first = death(&dead.deaths, 0);
        assert_eq!(first.get("count"), Some(&FieldValue::I64(1)));
        assert_eq!(first.get("time"), Some(&FieldValue::Timestamp(1_700_000_000)));
        assert_eq!(first.get("routing-keys"), Some(&FieldValue::Array(vec![text(b"eu"), text(b"us")])));
        assert_eq!(first.get("original-expiration"), Some(&text(b"60000")));
        let keys: Vec<_> = headers.iter().map(|(key, _)| key.to_string_lossy()).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "RabbitMQ sorts the headers it rewrites");
    }

    #[test]
    fn a_repeated_death_counts_and_moves_to_the_front() {
        let queue_a = ShortStr::from("a");
        let queue_b = ShortStr::from("b");
        let first = dead_lettered(&message(None, None), &queue_a, DeadLetterReason::Rejected, &target(None), 10).expect("first");
        let second = dead_lettered(&first.message, &queue_b, DeadLetterReason::Expired, &target(None), 20).expect("second");
        let third = dead_lettered(&second.message, &queue_a, DeadLetterReason::Rejected, &target(None), 30).expect("third");
        assert_eq!(third.deaths.len(), 2);
        let front = death(&third.deaths, 0);
        assert_eq!(table_text(front, "queue"), Some(&b"a"[..]));
        assert_eq!(front.get("count"), Some(&FieldValue::I64(2)));
        assert_eq!(front.get("time"), Some(&FieldValue::Timestamp(10)), "RabbitMQ 3.10 keeps the entry's first time");
        assert_eq!(table_text(death(&third.deaths, 1), "queue"), Some(&b"b"[..]));
        let headers = headers_of(&third.message);
        assert_eq!(headers.get("x-first-death-queue"), Some(&text(b"a")), "the first death stays the first");
        assert_eq!(headers.get("x-first-death-exchange"), Some(&text(b"orders")));
        assert_eq!(third.message.exchange.as_bytes(), b"dlx");
        assert_eq!(table_text(front, "exchange"), Some(&b"orders"[..]));
    }

    #[test]
    fn cycles_are_cut_unless_a_client_rejected_on_the_way() {
        let expired_in_a =
            dead_lettered(&message(None, None), &ShortStr::from("a"), DeadLetterReason::Expired, &target(None), 1).expect("a");
        assert!(is_cycle(b"a", &expired_in_a.deaths), "back to the queue it expired in, with no reject: a cycle");
        assert!(!is_cycle(b"b", &expired_in_a.deaths), "a queue it never died in");
        let rejected_in_b =
            dead_lettered(&expired_in_a.message, &ShortStr::from("b"), DeadLetterReason::Rejected, &target(None), 2).expect("b");
        assert!(!is_cycle(b"a", &rejected_in_b.deaths), "a reject on the way breaks the cycle");
        let expired_in_b =
            dead_lettered(&expired_in_a.message, &ShortStr::from("b"), DeadLetterReason::Expired, &target(None), 2).expect("b");
        assert!(is_cycle(b"a", &expired_in_b.deaths));
    }
}
