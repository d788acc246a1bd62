//! Conversions between AMQP values and the API's JSON, and the JSON shapes of listed objects.

use super::rates::{connection_field, exchange_field, queue_field, Figures, Ranges};
use super::ApiError;
use crate::introspect::{BindingInfo, ConnectionInfo, ExchangeInfo, QueueInfo};
use amqp_codec::{BasicProperties, FieldTable, FieldValue, ShortStr};
use serde_json::{json, Map, Value};

/// A field table as a JSON object (RabbitMQ's management encoding: strings as strings, numbers
/// as numbers, byte arrays as strings).
pub fn table_to_json(table: &FieldTable) -> Value {
    Value::Object(table.iter().map(|(key, value)| (key.to_string_lossy(), value_to_json(value))).collect())
}

fn value_to_json(value: &FieldValue) -> Value {
    match value {
        FieldValue::Bool(v) => json!(v),
        FieldValue::I8(v) => json!(v),
        FieldValue::U8(v) => json!(v),
        FieldValue::I16(v) => json!(v),
        FieldValue::U16(v) => json!(v),
        FieldValue::I32(v) => json!(v),
        FieldValue::U32(v) => json!(v),
        FieldValue::I64(v) => json!(v),
        FieldValue::F32(v) => json!(v),
        FieldValue::F64(v) => json!(v),
        FieldValue::Decimal(v) => Value::String(format!("{v:?}")),
        FieldValue::LongStr(bytes) | FieldValue::Bytes(bytes) => Value::String(String::from_utf8_lossy(bytes).into_owned()),
        FieldValue::Array(values) => Value::Array(values.iter().map(value_to_json).collect()),
        FieldValue::Timestamp(v) => json!(v),
        FieldValue::Table(table) => table_to_json(table),
        FieldValue::Void => Value::Null,
    }
}

/// A JSON object as a field table. Integers become 32-bit signed when they fit (as most AMQP
/// clients send them, so a client redeclaring with the same arguments matches), else 64-bit.
pub fn json_to_table(value: Option<&Value>) -> Result<FieldTable, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(FieldTable::new()),
        Some(Value::String(text)) if text.is_empty() => Ok(FieldTable::new()),
        Some(Value::Object(map)) => {
            let mut table = FieldTable::new();
            for (key, value) in map {
                if key.len() > 255 {
                    return Err(ApiError::bad_request(format!("argument name too long: {key}")));
                }
                table.insert(key, json_to_value(value)?);
            }
            Ok(table)
        }
        Some(other) => Err(ApiError::bad_request(format!("arguments must be a JSON object, not {other}"))),
    }
}

fn json_to_value(value: &Value) -> Result<FieldValue, ApiError> {
    Ok(match value {
        Value::Null => FieldValue::Void,
        Value::Bool(v) => FieldValue::Bool(*v),
        Value::Number(number) => {
            if let Some(integer) = number.as_i64() {
                match i32::try_from(integer) {
                    Ok(small) => FieldValue::I32(small),
                    Err(_) => FieldValue::I64(integer),
                }
            } else {
                FieldValue::F64(number.as_f64().ok_or_else(|| ApiError::bad_request(format!("number out of range: {number}")))?)
            }
        }
        Value::String(text) => FieldValue::LongStr(bytes::Bytes::from(text.clone().into_bytes())),
        Value::Array(values) => FieldValue::Array(values.iter().map(json_to_value).collect::<Result<_, _>>()?),
        Value::Object(_) => FieldValue::Table(json_to_table(Some(value))?),
    })
}

/// A boolean field that RabbitMQ's API accepts as `true`/`false` or as the strings "true"/"false"
/// (rabbitmqadmin sends strings).
pub fn flag(body: &Value, key: &str, default: bool) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(value)) => Ok(*value),
        Some(Value::String(text)) if text == "true" => Ok(true),
        Some(Value::String(text)) if text == "false" => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!("{key} must be true or false, not {other}"))),
    }
}

/// A non-negative integer field, as a number or a string of digits.
pub fn integer(body: &Value, key: &str) -> Result<Option<u64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => {
            number.as_u64().map(Some).ok_or_else(|| ApiError::bad_request(format!("{key} must be a non-negative integer")))
        }
        Some(Value::String(text)) => {
            text.trim().parse::<u64>().map(Some).map_err(|_| ApiError::bad_request(format!("{key} must be a non-negative integer")))
        }
        Some(other) => Err(ApiError::bad_request(format!("{key} must be a non-negative integer, not {other}"))),
    }
}

/// A text field.
pub fn text(body: &Value, key: &str) -> Result<Option<String>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Number(number)) => Ok(Some(number.to_string())),
        Some(other) => Err(ApiError::bad_request(format!("{key} must be a string, not {other}"))),
    }
}

/// A short string (at most 255 bytes, as AMQP names are).
pub fn short(text: &str, what: &str) -> Result<ShortStr, ApiError> {
    if text.len() > 255 {
        return Err(ApiError::bad_request(format!("{what} longer than 255 bytes")));
    }
    Ok(ShortStr::truncating(text))
}

/// Message properties as the API shows them.
pub fn properties_to_json(properties: &BasicProperties) -> Value {
    let mut map = Map::new();
    let mut text = |key: &str, value: &Option<ShortStr>| {
        if let Some(value) = value {
            map.insert(key.to_string(), Value::String(value.to_string_lossy()));
        }
    };
    text("content_type", &properties.content_type);
    text("content_encoding", &properties.content_encoding);
    text("correlation_id", &properties.correlation_id);
    text("reply_to", &properties.reply_to);
    text("expiration", &properties.expiration);
    text("message_id", &properties.message_id);
    text("type", &properties.message_type);
    text("user_id", &properties.user_id);
    text("app_id", &properties.app_id);
    text("cluster_id", &properties.cluster_id);
    if let Some(headers) = &properties.headers {
        map.insert("headers".to_string(), table_to_json(headers));
    }
    if let Some(mode) = properties.delivery_mode {
        map.insert("delivery_mode".to_string(), json!(mode));
    }
    if let Some(priority) = properties.priority {
        map.insert("priority".to_string(), json!(priority));
    }
    if let Some(timestamp) = properties.timestamp {
        map.insert("timestamp".to_string(), json!(timestamp));
    }
    Value::Object(map)
}

/// Message properties from the API's JSON (`properties` of a publish).
pub fn json_to_properties(value: Option<&Value>) -> Result<BasicProperties, ApiError> {
    let mut properties = BasicProperties::default();
    let map = match value {
        None | Some(Value::Null) => return Ok(properties),
        Some(Value::Object(map)) => map,
        Some(other) => return Err(ApiError::bad_request(format!("properties must be a JSON object, not {other}"))),
    };
    let body = Value::Object(map.clone());
    let short_property =
        |key: &str| -> Result<Option<ShortStr>, ApiError> { text(&body, key)?.map(|value| short(&value, key)).transpose() };
    properties.content_type = short_property("content_type")?;
    properties.content_encoding = short_property("content_encoding")?;
    properties.correlation_id = short_property("correlation_id")?;
    properties.reply_to = short_property("reply_to")?;
    properties.expiration = short_property("expiration")?;
    properties.message_id = short_property("message_id")?;
    properties.message_type = short_property("type")?;
    properties.user_id = short_property("user_id")?;
    properties.app_id = short_property("app_id")?;
    properties.cluster_id = short_property("cluster_id")?;
    if let Some(headers) = map.get("headers") {
        properties.headers = Some(json_to_table(Some(headers))?);
    }
    let small = |key: &str, max: u64| -> Result<Option<u8>, ApiError> {
        match integer(&body, key)? {
            None => Ok(None),
            Some(value) if value <= max => Ok(Some(value as u8)),
            Some(value) => Err(ApiError::bad_request(format!("{key} {value} out of range"))),
        }
    };
    properties.delivery_mode = small("delivery_mode", 2)?;
    properties.priority = small("priority", 255)?;
    properties.timestamp = integer(&body, "timestamp")?;
    Ok(properties)
}

/// A per-second rate as RabbitMQ's `*_details` objects carry it.
pub fn details(rate: f64) -> Value {
    json!({ "rate": (rate * 10.0).round() / 10.0 })
}

/// The API's name of the default exchange in paths and listings.
pub const DEFAULT_EXCHANGE_ALIAS: &str = "amq.default";

/// An exchange name from a path ("amq.default" is the default exchange, "").
pub fn exchange_from_path(name: &str) -> &str {
    if name == DEFAULT_EXCHANGE_ALIAS {
        ""
    } else {
        name
    }
}

/// A queue as `/api/queues` shows it, with its rates (and samples, when `ranges` asks) from
/// `figures`.
pub fn queue_json(queue: &QueueInfo, figures: &Figures<'_, { queue_field::COUNT }>, ranges: &Ranges, node: &str) -> Value {
    let mut value = queue_json_of_any_type(queue, figures, ranges, node);
    if queue.queue_type == broker_core::vhost::QueueType::Stream {
        stream_queue_fields(&mut value, queue, node);
    } else if let Some(replicas) = &queue.replicas {
        add_replica_fields(&mut value, replicas, queue.held_dead_letters.unwrap_or_default());
    }
    value
}

/// What RabbitMQ 3.10.8 shows of a stream queue (measured): its members, the members online and
/// each member's readers, and no classic queue's paging or exclusive-consumer fields. Its
/// messages are the offsets it holds (RabbitMQ counts no unacked messages for a stream).
fn stream_queue_fields(value: &mut Value, queue: &QueueInfo, node: &str) {
    let Some(fields) = value.as_object_mut() else { return };
    for key in [
        "exclusive_consumer_tag",
        "single_active_consumer_tag",
        "consumer_utilisation",
        "messages_paged_out",
        "messages_ram",
        "messages_ready_ram",
        "messages_unacknowledged_ram",
        "messages_persistent",
        // A stream's bytes are its segments', not counted here.
        "message_bytes",
        "message_bytes_ready",
        "message_bytes_unacknowledged",
        "message_bytes_paged_out",
        "message_bytes_ram",
        "message_bytes_persistent",
    ] {
        fields.remove(key);
    }
    match &queue.replicas {
        // A replicated stream (a cluster's): RabbitMQ names its leader as the queue's node too.
        Some(replicas) => {
            if let Some(leader) = &replicas.leader {
                fields.insert("node".to_string(), json!(leader));
            }
            fields.insert("leader".to_string(), json!(replicas.leader));
            fields.insert("members".to_string(), json!(replicas.members));
            fields.insert("online".to_string(), json!(replicas.online));
        }
        None => {
            fields.insert("members".to_string(), json!([node]));
            fields.insert("online".to_string(), json!([node]));
        }
    }
    fields.insert("readers".to_string(), json!({ node: queue.snapshot.consumers }));
    fields.insert("messages".to_string(), json!(queue.snapshot.ready));
    fields.insert("messages_unacknowledged".to_string(), json!(0));
}

fn queue_json_of_any_type(queue: &QueueInfo, figures: &Figures<'_, { queue_field::COUNT }>, ranges: &Ranges, node: &str) -> Value {
    let snapshot = &queue.snapshot;
    let stats = &snapshot.stats;
    let messages = snapshot.ready + snapshot.unacked;
    let (lengths, msg_rates) = (ranges.lengths.as_ref(), ranges.msg_rates.as_ref());
    let mut answer = json!({
        "name": queue.name,
        "vhost": queue.vhost,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive,
        "arguments": table_to_json(&queue.arguments),
        "node": queue.home.as_deref().unwrap_or(node),
        "type": queue.queue_type.name(),
        "state": "running",
        "policy": queue.policy.as_ref().and_then(|policy| policy.user_policy_name()),
        "operator_policy": queue.policy.as_ref().and_then(|policy| policy.operator_policy.as_deref()),
        "effective_policy_definition": queue.policy.as_ref().map(|policy| Value::Object(policy.definition.clone())).unwrap_or_else(|| json!({})),
        "exclusive_consumer_tag": null,
        "single_active_consumer_tag": snapshot.single_active_consumer_tag,
        "consumers": snapshot.consumers,
        "consumer_utilisation": null,
        "messages": messages,
        "messages_details": figures.details(lengths, |values| values[queue_field::READY] + values[queue_field::UNACKED]),
        "messages_ready": snapshot.ready,
        "messages_ready_details": figures.field(lengths, queue_field::READY),
        "messages_unacknowledged": snapshot.unacked,
        "messages_unacknowledged_details": figures.field(lengths, queue_field::UNACKED),
        "message_bytes": snapshot.ready_bytes + snapshot.unacked_bytes,
        "message_bytes_ready": snapshot.ready_bytes,
        "message_bytes_unacknowledged": snapshot.unacked_bytes,
        "message_stats": {
            "publish": stats.published,
            "publish_details": figures.field(msg_rates, queue_field::PUBLISH),
            "deliver_get": stats.delivered,
            "deliver_get_details": figures.field(msg_rates, queue_field::DELIVER_GET),
            "ack": stats.acked,
            "ack_details": figures.field(msg_rates, queue_field::ACK),
            "redeliver": stats.requeued,
            "redeliver_details": figures.field(msg_rates, queue_field::REDELIVER),
        },
    });
    if let Some(fields) = answer.as_object_mut() {
        add_memory_fields(fields, snapshot);
    }
    answer
}

/// Where a classic queue's messages are, as RabbitMQ 3.10.8's `rabbit_variable_queue:info/2`
/// reports it: in memory (ready and unacked apart) or paged out, and persistent or not.
fn add_memory_fields(fields: &mut serde_json::Map<String, Value>, snapshot: &crate::queue_type::QueueSnapshot) {
    let messages = snapshot.ready + snapshot.unacked;
    let message_bytes = snapshot.ready_bytes + snapshot.unacked_bytes;
    let figures = [
        ("messages_paged_out", snapshot.paged),
        ("message_bytes_paged_out", snapshot.paged_bytes),
        ("messages_ram", messages - snapshot.paged.min(messages)),
        ("messages_ready_ram", snapshot.ready - snapshot.paged.min(snapshot.ready)),
        ("messages_unacknowledged_ram", snapshot.unacked),
        ("message_bytes_ram", snapshot.ready_bytes_in_memory + snapshot.unacked_bytes),
        // RabbitMQ counts a message persistent when it is persistent in a durable queue: one
        // with a record in the queue's log.
        ("messages_persistent", messages.saturating_sub(snapshot.unlogged.count)),
        ("message_bytes_persistent", message_bytes.saturating_sub(snapshot.unlogged.bytes)),
    ];
    for (key, value) in figures {
        fields.insert(key.to_string(), json!(value));
    }
}

/// A quorum queue's fields as RabbitMQ 3.10.8 shows them (measured): its leader as `node`,
/// `leader`, `members` and `online`, `single_active_consumer_ctag`, the dead letters it holds
/// (`messages_dlx`, `message_bytes_dlx`, and counted in `messages` and `message_bytes`, as
/// RabbitMQ 3.10.8 counts them, measured), and none of a classic queue's paging or exclusive-consumer fields.
pub fn add_replica_fields(answer: &mut Value, replicas: &crate::quorum::ReplicaInfo, held: crate::quorum::HeldDeadLetterFigures) {
    let Some(object) = answer.as_object_mut() else { return };
    let messages = object.get("messages").and_then(Value::as_u64).unwrap_or(0);
    object.insert("messages".to_string(), json!(messages + held.count));
    let message_bytes = object.get("message_bytes").and_then(Value::as_u64).unwrap_or(0);
    object.insert("message_bytes".to_string(), json!(message_bytes + held.body_bytes));
    let single_active = object.remove("single_active_consumer_tag").unwrap_or(Value::Null);
    for key in
        ["exclusive_consumer_tag", "messages_paged_out", "message_bytes_paged_out", "messages_ready_ram", "messages_unacknowledged_ram"]
    {
        object.remove(key);
    }
    object.insert("single_active_consumer_ctag".to_string(), single_active);
    // RabbitMQ 3.10.8's quorum queues report none in memory (`rabbit_fifo:query_in_memory_usage`
    // answers {0, 0}): their bodies are read back from the log.
    object.insert("messages_ram".to_string(), json!(0));
    object.insert("message_bytes_ram".to_string(), json!(0));
    // RabbitMQ 3.10.8 counts every message of a quorum queue persistent, its held dead letters too.
    object.insert("messages_persistent".to_string(), json!(messages + held.count));
    object.insert("message_bytes_persistent".to_string(), json!(message_bytes + held.body_bytes));
    object.insert("messages_dlx".to_string(), json!(held.count));
    object.insert("message_bytes_dlx".to_string(), json!(held.body_bytes));
    if let Some(leader) = &replicas.leader {
        object.insert("node".to_string(), json!(leader));
    }
    object.insert("leader".to_string(), json!(replicas.leader));
    object.insert("members".to_string(), json!(replicas.members));
    object.insert("online".to_string(), json!(replicas.online));
}

/// An exchange as `/api/exchanges` shows it, with `message_stats` once something was published to
/// it (`publish_out` once something was routed), as RabbitMQ shows them.
pub fn exchange_json(exchange: &ExchangeInfo, figures: &Figures<'_, { exchange_field::COUNT }>, ranges: &Ranges) -> Value {
    let mut answer = json!({
        "name": exchange.name,
        "vhost": exchange.vhost,
        "type": exchange.kind,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": table_to_json(&exchange.arguments),
        "policy": exchange.policy,
        "user_who_performed_action": "rmq-internal",
    });
    let range = ranges.msg_rates.as_ref();
    let mut stats = Map::new();
    for (name, field, value) in [
        ("publish_in", exchange_field::PUBLISH_IN, exchange.published_in),
        ("publish_out", exchange_field::PUBLISH_OUT, exchange.published_out),
    ] {
        if value > 0 {
            stats.insert(name.to_owned(), json!(value));
            stats.insert(format!("{name}_details"), figures.field(range, field));
        }
    }
    if let (false, Some(object)) = (stats.is_empty(), answer.as_object_mut()) {
        object.insert("message_stats".to_owned(), Value::Object(stats));
    }
    answer
}

/// RabbitMQ's `quote_plus` as it builds a binding's properties key.
fn quote_plus(text: &str) -> String {
    let mut quoted = String::new();
    for byte in text.bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => quoted.push(byte as char),
            b' ' => quoted.push('+'),
            other => quoted.push_str(&format!("%{other:02X}")),
        }
    }
    quoted
}

/// The key that names a binding in `/api/bindings/.../{props}`: the quoted routing key, and a
/// hash of the arguments when there are any ("~" for an empty key without arguments). RabbitMQ
/// hashes with Erlang's phash2; clients treat the key as opaque, so Lepus's hash differs.
pub fn properties_key(routing_key: &str, arguments: &FieldTable) -> String {
    if arguments.is_empty() {
        if routing_key.is_empty() {
            return "~".to_string();
        }
        return quote_plus(routing_key);
    }
    use base64::Engine;
    use sha2::Digest;
    let digest = sha2::Sha256::digest(table_to_json(arguments).to_string().as_bytes());
    let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..6]);
    format!("{}~{}", quote_plus(routing_key), quote_plus(&hash))
}

/// A binding as `/api/bindings` shows it.
pub fn binding_json(binding: &BindingInfo) -> Value {
    json!({
        "source": binding.source,
        "vhost": binding.vhost,
        "destination": binding.destination,
        "destination_type": if binding.destination_is_queue { "queue" } else { "exchange" },
        "routing_key": binding.routing_key,
        "arguments": table_to_json(&binding.arguments),
        "properties_key": properties_key(&binding.routing_key, &binding.arguments),
    })
}

/// A consumer as `/api/consumers` shows it.
pub fn consumer_json(
    consumer: &crate::introspect::ConsumerInfo,
    connection: Option<&ConnectionInfo>,
    server: std::net::SocketAddr,
) -> Value {
    let view = &consumer.consumer;
    let connection_name = connection.map(|connection| connection_name(connection, server)).unwrap_or_default();
    json!({
        "consumer_tag": view.tag,
        "queue": {"name": consumer.queue, "vhost": consumer.vhost},
        "channel_details": {
            "name": format!("{} ({})", connection_name, view.channel),
            "number": view.channel,
            "connection_name": connection_name,
            "peer_host": connection.map(|connection| connection.peer.ip().to_string()),
            "peer_port": connection.map(|connection| connection.peer.port()),
            "user": connection.map(|connection| connection.session.user.clone()),
        },
        "ack_required": view.ack_required,
        "prefetch_count": view.prefetch,
        "exclusive": view.exclusive,
        "arguments": if view.priority != 0 { json!({"x-priority": view.priority}) } else { json!({}) },
        "active": view.active,
        "activity_status": view.activity_status,
    })
}

/// A connection's name as RabbitMQ forms it: "client address -> server address".
pub fn connection_name(connection: &ConnectionInfo, server: std::net::SocketAddr) -> String {
    format!("{} -> {}", connection.peer, listener_address(connection, server))
}

/// The address the connection came in on: `server` (the AMQP listener's), with the AMQPS port for
/// a TLS connection.
fn listener_address(connection: &ConnectionInfo, server: std::net::SocketAddr) -> std::net::SocketAddr {
    match &connection.tls {
        Some(tls) => std::net::SocketAddr::new(server.ip(), tls.listener_port),
        None => server,
    }
}

/// A connection's traffic (RabbitMQ's recv_oct, recv_cnt, send_oct, send_cnt) with the byte rates.
pub fn traffic_json(connection: &ConnectionInfo, figures: &Figures<'_, { connection_field::COUNT }>, ranges: &Ranges) -> Value {
    let [received_bytes, received_packets, sent_bytes, sent_packets] = connection.traffic;
    let range = ranges.data_rates.as_ref();
    json!({
        "recv_oct": received_bytes,
        "recv_oct_details": figures.field(range, connection_field::RECV_OCT),
        "recv_cnt": received_packets,
        "send_oct": sent_bytes,
        "send_oct_details": figures.field(range, connection_field::SEND_OCT),
        "send_cnt": sent_packets,
    })
}

/// A connection as `/api/connections` shows it (without its traffic: see [`traffic_json`]).
pub fn connection_json(connection: &ConnectionInfo, server: std::net::SocketAddr, node: &str, disk_alarm: bool) -> Value {
    let session = &connection.session;
    let server = listener_address(connection, server);
    let state = if connection.session.user.is_empty() {
        "starting"
    } else if disk_alarm && connection.has_published {
        "blocked"
    } else {
        "running"
    };
    json!({
        "name": connection_name(connection, server),
        "node": node,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "state": state,
        "user": session.user,
        "vhost": session.vhost,
        "channels": session.channels,
        "frame_max": session.frame_max,
        "timeout": session.heartbeat_s,
        "peer_host": connection.peer.ip().to_string(),
        "peer_port": connection.peer.port(),
        "host": server.ip().to_string(),
        "port": server.port(),
        "connected_at": connection.connected_at_ms,
        "ssl": connection.tls.is_some(),
        "ssl_protocol": connection.tls.as_ref().map(|tls| tls.protocol),
        "ssl_cipher": connection.tls.as_ref().map(|tls| tls.cipher_suite.as_str()),
        "peer_cert_subject": connection.tls.as_ref().and_then(|tls| tls.peer_cert_subject.as_deref()),
        "peer_cert_issuer": connection.tls.as_ref().and_then(|tls| tls.peer_cert_issuer.as_deref()),
        "auth_mechanism": "PLAIN",
        "client_properties": {
            "product": session.client_product,
            "version": session.client_version,
        },
        "lepus_id": connection.id,
    })
}
