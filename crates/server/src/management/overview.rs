//! `GET /api/overview`: the node's totals, message rates, churn and listeners, with RabbitMQ's
//! chart samples when the range parameters ask for them.

use super::history::{Range, Rounding};
use super::rates::{node_field, node_values, Figures, RangeQuery, Ranges, RETENTION_GLOBAL_S, RETENTION_OBJECT_S};
use super::routes::{amqp_address, Answer};
use super::{Api, RABBITMQ_API_VERSION};
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Map, Value};
use std::net::SocketAddr;

pub(super) async fn overview(State(api): State<Api>, Query(range_query): Query<RangeQuery>) -> Answer {
    let ranges = range_query.ranges(Rounding::Floor)?;
    let overview = api.broker.overview();
    let address = amqp_address(&api);
    let current = node_values(&api.broker, overview.messages_ready, overview.messages_unacked);
    let (message_stats, queue_totals, churn_rates) = api.rates.read(|view| {
        let node = view.node();
        (
            overview_message_stats(&node, &current, &ranges),
            overview_queue_totals(&node, &current, &ranges),
            churn_rates(&node, &current, &ranges),
        )
    });
    Ok(Json(json!({
        "management_version": RABBITMQ_API_VERSION,
        "rabbitmq_version": RABBITMQ_API_VERSION,
        "product_name": "Lepus",
        "product_version": env!("CARGO_PKG_VERSION"),
        "rates_mode": "basic",
        "sample_retention_policies": {"global": RETENTION_GLOBAL_S, "basic": RETENTION_OBJECT_S, "detailed": RETENTION_OBJECT_S},
        "cluster_name": api.node,
        "node": api.node,
        "erlang_version": "none (Lepus is written in Rust)",
        "erlang_full_version": "none",
        "disable_stats": false,
        "enable_queue_totals": true,
        "statistics_db_event_queue": 0,
        "exchange_types": [
            {"name": "direct", "description": "AMQP direct exchange, as per the AMQP specification", "enabled": true},
            {"name": "fanout", "description": "AMQP fanout exchange, as per the AMQP specification", "enabled": true},
            {"name": "headers", "description": "AMQP headers exchange, as per the AMQP specification", "enabled": true},
            {"name": "topic", "description": "AMQP topic exchange, as per the AMQP specification", "enabled": true},
            {"name": "x-consistent-hash", "description": "Consistent Hashing Exchange", "enabled": true},
        ],
        "disk_free_alarm": overview.disk_alarm,
        "mem_alarm": api.broker.memory_alarm.load(std::sync::atomic::Ordering::Acquire),
        "object_totals": {
            "connections": overview.connections,
            "channels": overview.channels,
            "exchanges": overview.exchanges,
            "queues": overview.queues,
            "consumers": overview.consumers,
        },
        "queue_totals": queue_totals,
        "message_stats": message_stats,
        "churn_rates": churn_rates,
        "listeners": listeners(&api, address),
        "contexts": [{"node": api.node, "description": "RabbitMQ Management", "path": "/"}],
    }))
    .into_response())
}

/// Fills `object` with each `(name, field)`'s current value and its `*_details`.
fn counted(
    figures: &Figures<'_, { node_field::COUNT }>,
    current: &[u64],
    range: Option<&Range>,
    fields: &[(&str, usize)],
) -> Map<String, Value> {
    let mut object = Map::new();
    for (name, field) in fields {
        object.insert((*name).to_owned(), json!(current[*field]));
        object.insert(format!("{name}_details"), figures.field(range, *field));
    }
    object
}

/// The overview's `message_stats`: what channels counted, as RabbitMQ's overview shows it.
fn overview_message_stats(node: &Figures<'_, { node_field::COUNT }>, current: &[u64; node_field::COUNT], ranges: &Ranges) -> Value {
    use node_field::*;
    let range = ranges.msg_rates.as_ref();
    let fields = [
        ("publish", PUBLISH),
        ("confirm", CONFIRM),
        ("return_unroutable", RETURN_UNROUTABLE),
        ("drop_unroutable", DROP_UNROUTABLE),
        ("deliver", DELIVER),
        ("deliver_no_ack", DELIVER_NO_ACK),
        ("get", GET),
        ("get_no_ack", GET_NO_ACK),
        ("redeliver", REDELIVER),
        ("ack", ACK),
        ("get_empty", GET_EMPTY),
    ];
    let mut stats = counted(node, current, range, &fields);
    let deliver_get = |values: &[u64; COUNT]| values[DELIVER] + values[DELIVER_NO_ACK] + values[GET] + values[GET_NO_ACK];
    stats.insert("deliver_get".to_owned(), json!(deliver_get(current)));
    stats.insert("deliver_get_details".to_owned(), node.details(range, deliver_get));
    Value::Object(stats)
}

/// The overview's `queue_totals`.
fn overview_queue_totals(node: &Figures<'_, { node_field::COUNT }>, current: &[u64; node_field::COUNT], ranges: &Ranges) -> Value {
    use node_field::{READY, UNACKED};
    let range = ranges.lengths.as_ref();
    let mut totals = counted(node, current, range, &[("messages_ready", READY), ("messages_unacknowledged", UNACKED)]);
    totals.insert("messages".to_owned(), json!(current[READY] + current[UNACKED]));
    totals.insert("messages_details".to_owned(), node.details(range, |values| values[READY] + values[UNACKED]));
    Value::Object(totals)
}

/// The overview's `churn_rates` (samples with the message-rate range, as RabbitMQ).
fn churn_rates(node: &Figures<'_, { node_field::COUNT }>, current: &[u64; node_field::COUNT], ranges: &Ranges) -> Value {
    use node_field::*;
    let fields = [
        ("connection_created", CONNECTION_CREATED),
        ("connection_closed", CONNECTION_CLOSED),
        ("channel_created", CHANNEL_CREATED),
        ("channel_closed", CHANNEL_CLOSED),
        ("queue_declared", QUEUE_DECLARED),
        ("queue_created", QUEUE_CREATED),
        ("queue_deleted", QUEUE_DELETED),
    ];
    Value::Object(counted(node, current, ranges.msg_rates.as_ref(), &fields))
}

/// Every listener, as RabbitMQ names them: `amqp`, `amqp/ssl` with TLS, `http` (this API),
/// `https` with TLS, `http/prometheus` (metrics), `stream` (the stream protocol) and `clustering`
/// (the links between cluster nodes); a port set to 0 is not listened on.
fn listeners(api: &Api, address: SocketAddr) -> Value {
    let listener =
        |protocol: &str, port: u16| json!({"node": api.node, "protocol": protocol, "ip_address": address.ip().to_string(), "port": port});
    let config = &api.broker.config;
    let tls = config.tls_cert_file.is_some() && config.tls_key_file.is_some();
    let candidates = [
        ("amqp", address.port(), true),
        ("amqp/ssl", config.amqps_port, tls),
        ("http", config.http_port, true),
        ("https", config.https_port, tls),
        ("http/prometheus", config.metrics_port, true),
        ("stream", config.stream_port, true),
        ("clustering", config.cluster.cluster_port, true),
    ];
    let listeners =
        candidates.into_iter().filter(|(_, port, served)| *served && *port != 0).map(|(protocol, port, _)| listener(protocol, port));
    Value::Array(listeners.collect())
}
