//! The API's routes and handlers.

use super::access::{Caller, Visibility};
use super::json::{self, exchange_from_path, flag, integer, short, text};
use super::{list_response, Api, ApiError, ListQuery, GET_MESSAGES_MAX};
use crate::auth::Access;
use amqp_codec::{ContentHeader, ShortStr};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::history::Rounding;
use super::rates::{RangeQuery, Ranges, View};
use axum::Json;
use broker_core::exchange::{Binding, Destination};
use broker_core::vhost::{ExchangeDeclaration, QueueDefinition, QueueType};
use broker_core::Message;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;

pub(super) type Answer = Result<Response, ApiError>;

/// The JSON body of a request (an empty body is `{}`).
pub fn body_json(body: &Bytes) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let value: Value = serde_json::from_slice(body).map_err(|error| ApiError::bad_request(format!("body is not valid JSON: {error}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("body must be a JSON object"));
    }
    Ok(value)
}

pub fn require_vhost(api: &Api, vhost: &str) -> Result<(), ApiError> {
    if api.broker.has_vhost(vhost) {
        Ok(())
    } else {
        Err(ApiError::object_not_found())
    }
}

pub(super) fn amqp_address(api: &Api) -> SocketAddr {
    SocketAddr::new(api.broker.config.bind_address, api.broker.config.amqp_port)
}

fn disk_alarm(api: &Api) -> bool {
    api.broker.publishers_blocked_by().is_some()
}

pub fn created_or_existing(existed: bool) -> Response {
    if existed {
        StatusCode::NO_CONTENT.into_response()
    } else {
        StatusCode::CREATED.into_response()
    }
}

pub(super) async fn cluster_name(State(api): State<Api>) -> Json<Value> {
    Json(json!({ "name": api.node }))
}

pub(super) fn node_json(api: &Api) -> Value {
    let process = crate::metrics::process_stats();
    let free = crate::alarms::disk::free_bytes(&api.broker.config.data_dir).unwrap_or(0);
    let connections = api.broker.connection_count();
    json!({
        "name": api.node,
        "type": "disc",
        "running": true,
        "being_drained": false,
        "os_pid": std::process::id().to_string(),
        "uptime": api.started.elapsed().as_millis() as u64,
        "mem_used": process.resident_bytes,
        "fd_used": process.open_fds,
        "fd_total": process.max_fds,
        "sockets_used": connections,
        "sockets_total": process.max_fds,
        "proc_used": 0,
        "proc_total": 0,
        "disk_free": free,
        "disk_free_limit": api.broker.config.disk_free_limit_bytes,
        "disk_free_alarm": api.broker.disk_alarm.load(std::sync::atomic::Ordering::Acquire),
        "mem_alarm": api.broker.memory_alarm.load(std::sync::atomic::Ordering::Acquire),
        "mem_limit": api.broker.config.memory_high_watermark_bytes,
        "partitions": [],
        "processors": std::thread::available_parallelism().map(|count| count.get()).unwrap_or(1),
        "rates_mode": "basic",
        "run_queue": 0,
        "applications": [],
        "contexts": [],
        "exchange_types": [],
        "auth_mechanisms": [
            {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism", "enabled": true},
            {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": true},
        ],
    })
}

pub(super) async fn whoami(State(api): State<Api>, caller: Caller) -> Json<Value> {
    let tags = api.broker.users.get(&caller.name).map(|user| user.tags).unwrap_or_default();
    Json(json!({ "name": caller.name, "tags": tags }))
}

pub fn user_json(user: &crate::auth::User) -> Value {
    json!({
        "name": user.name,
        "password_hash": user.password_hash(),
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": user.tags,
        "limits": {},
    })
}

pub(super) async fn users(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    caller.require_administrator()?;
    list_response(api.broker.users.list().iter().map(user_json).collect(), &query)
}

pub(super) async fn user(State(api): State<Api>, caller: Caller, Path(name): Path<String>) -> Answer {
    caller.require_administrator()?;
    let user = api.broker.users.get(&name).ok_or_else(ApiError::object_not_found)?;
    Ok(Json(user_json(&user)).into_response())
}

/// Users' permissions, as `/api/permissions` shows them.
pub fn permission_list(api: &Api, only_vhost: Option<&str>) -> Vec<Value> {
    api.broker
        .permissions
        .list()
        .iter()
        .filter(|entry| only_vhost.is_none_or(|vhost| entry.vhost == vhost))
        .map(|entry| permission_json(entry))
        .collect()
}

fn permission_json(entry: &crate::auth::Permission) -> Value {
    json!({"user": entry.user, "vhost": entry.vhost, "configure": entry.configure, "write": entry.write, "read": entry.read})
}

/// The tags of a PUT /api/users body: RabbitMQ takes a comma-separated string or a list.
pub fn tags_of(body: &Value) -> Vec<String> {
    match body.get("tags") {
        Some(Value::String(text)) => text.split(',').map(str::trim).filter(|tag| !tag.is_empty()).map(String::from).collect(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(String::from).collect(),
        _ => Vec::new(),
    }
}

/// The stored hash for a PUT /api/users body: from `password`, or a `password_hash` in RabbitMQ's
/// sha256 form (other hashing algorithms are refused).
pub fn password_hash_of(body: &Value) -> Result<String, ApiError> {
    if let Some(password) = body.get("password").and_then(Value::as_str) {
        return Ok(crate::auth::hash_password(password));
    }
    let algorithm = body.get("hashing_algorithm").and_then(Value::as_str).unwrap_or("rabbit_password_hashing_sha256");
    if algorithm != "rabbit_password_hashing_sha256" {
        return Err(ApiError::bad_request(format!("hashing algorithm {algorithm} is not supported (only rabbit_password_hashing_sha256)")));
    }
    match body.get("password_hash").and_then(Value::as_str) {
        Some(hash) => Ok(hash.to_string()),
        None => Err(ApiError::bad_request("user needs a password or a password_hash")),
    }
}

pub(super) async fn put_user(State(api): State<Api>, caller: Caller, Path(name): Path<String>, body: Bytes) -> Answer {
    caller.require_administrator()?;
    let body: Value = serde_json::from_slice(&body).map_err(|error| ApiError::bad_request(error.to_string()))?;
    let user = crate::auth::User::new(&name, password_hash_of(&body)?, tags_of(&body));
    let created = api.broker.put_user(user)?;
    Ok(if created { StatusCode::CREATED } else { StatusCode::NO_CONTENT }.into_response())
}

pub(super) async fn delete_user(State(api): State<Api>, caller: Caller, Path(name): Path<String>) -> Answer {
    caller.require_administrator()?;
    if !api.broker.delete_user(&name)? {
        return Err(ApiError::object_not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn user_permissions(
    State(api): State<Api>,
    caller: Caller,
    Path(name): Path<String>,
    Query(query): Query<ListQuery>,
) -> Answer {
    caller.require_administrator()?;
    api.broker.users.get(&name).ok_or_else(ApiError::object_not_found)?;
    let list = api.broker.permissions.list().iter().filter(|entry| entry.user == name).map(|entry| permission_json(entry)).collect();
    list_response(list, &query)
}

pub(super) async fn permission(State(api): State<Api>, caller: Caller, Path((vhost, user)): Path<(String, String)>) -> Answer {
    caller.require_administrator()?;
    let entry = api.broker.permissions.get(&user, &vhost).ok_or_else(ApiError::object_not_found)?;
    Ok(Json(permission_json(&entry)).into_response())
}

pub(super) async fn put_permission(
    State(api): State<Api>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
    body: Bytes,
) -> Answer {
    caller.require_administrator()?;
    require_vhost(&api, &vhost)?;
    if api.broker.users.get(&user).is_none() {
        return Err(ApiError::bad_request(format!("no user '{user}'")));
    }
    let body: Value = serde_json::from_slice(&body).map_err(|error| ApiError::bad_request(error.to_string()))?;
    let expression = |key: &str| body.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let permission = crate::auth::Permission::new(&user, &vhost, &expression("configure"), &expression("write"), &expression("read"))
        .map_err(|error| ApiError::bad_request(error.to_string()))?;
    let created = api.broker.permissions.get(&user, &vhost).is_none();
    api.broker.put_permission(permission)?;
    Ok(if created { StatusCode::CREATED } else { StatusCode::NO_CONTENT }.into_response())
}

pub(super) async fn delete_permission(State(api): State<Api>, caller: Caller, Path((vhost, user)): Path<(String, String)>) -> Answer {
    caller.require_administrator()?;
    if !api.broker.delete_permission(&user, &vhost)? {
        return Err(ApiError::object_not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn permissions(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    caller.require_administrator()?;
    list_response(permission_list(&api, None), &query)
}

pub(super) async fn vhost_permissions(
    State(api): State<Api>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> Answer {
    caller.require_administrator()?;
    require_vhost(&api, &vhost)?;
    list_response(permission_list(&api, Some(&vhost)), &query)
}

/// RabbitMQ's aliveness test: declares the queue `aliveness-test`, publishes a message to it and
/// gets it back.
pub(super) async fn aliveness_test(State(api): State<Api>, Path(vhost): Path<String>) -> Answer {
    require_vhost(&api, &vhost)?;
    let name = ShortStr::from("aliveness-test");
    let definition = QueueDefinition {
        name: name.clone(),
        durable: false,
        exclusive_owner: None,
        auto_delete: false,
        arguments: Default::default(),
        queue_type: QueueType::Classic,
    };
    api.broker.declare_queue(&vhost, definition, false, false, 0)?;
    let body = Bytes::from_static(b"test_message");
    let header = ContentHeader::from_properties(60, body.len() as u64, &Default::default());
    let message = Message { exchange: ShortStr::from(""), routing_key: name, header, body, published_at_ns: 0, bcc_routing_keys: None };
    api.broker.publish_message(&vhost, message)?;
    let got = api.broker.get_messages(&vhost, "aliveness-test", 1, false).await?;
    if got.first().is_some_and(|got| got.message.body.as_ref() == b"test_message") {
        Ok(Json(json!({"status": "ok"})).into_response())
    } else {
        Ok((StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "failed", "reason": "the test message did not come back"})))
            .into_response())
    }
}

pub(super) async fn alarms_check(State(api): State<Api>) -> Response {
    if let Some(reason) = api.broker.publishers_blocked_by() {
        let resource = if reason.ends_with("disk") { "disk" } else { "memory" };
        let alarm = json!({"node": api.node, "resource": resource});
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "failed", "reason": "resource alarm(s) in effect in the cluster", "alarms": [alarm]})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

/// A connection as the API shows it, with its traffic and byte rates.
fn connection_answer(api: &Api, connection: &crate::introspect::ConnectionInfo, view: &View, ranges: &Ranges) -> Value {
    let mut answer = json::connection_json(connection, amqp_address(api), &api.node, disk_alarm(api));
    if let (Some(object), Value::Object(traffic)) =
        (answer.as_object_mut(), json::traffic_json(connection, &view.connection(connection.id), ranges))
    {
        object.extend(traffic);
    }
    answer
}

fn connection_list(api: &Api, only_vhost: Option<&str>, ranges: &Ranges) -> Vec<Value> {
    let connections = api.broker.list_connections();
    api.rates.read(|view| {
        connections
            .iter()
            .filter(|connection| only_vhost.is_none_or(|vhost| connection.session.vhost == vhost))
            .map(|connection| connection_answer(api, connection, view, ranges))
            .collect()
    })
}

pub(super) async fn connections(
    State(api): State<Api>,
    caller: Caller,
    Query(query): Query<ListQuery>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    let ranges = range_query.ranges(Rounding::Floor)?;
    list_response(caller.visible(connection_list(&api, None, &ranges), Visibility::OwnConnection), &query)
}

pub(super) async fn vhost_connections(
    State(api): State<Api>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    require_vhost(&api, &vhost)?;
    let ranges = range_query.ranges(Rounding::Floor)?;
    list_response(caller.visible(connection_list(&api, Some(&vhost), &ranges), Visibility::OwnConnection), &query)
}

/// Finds a connection by its RabbitMQ-style name (or Lepus's numeric id).
fn find_connection(api: &Api, name: &str) -> Option<crate::introspect::ConnectionInfo> {
    let address = amqp_address(api);
    api.broker
        .list_connections()
        .into_iter()
        .find(|connection| json::connection_name(connection, address) == name || connection.id.to_string() == name)
}

/// A connection the caller may see: its own, or any for administrators and monitoring users.
fn find_own_connection(api: &Api, caller: &Caller, name: &str) -> Result<crate::introspect::ConnectionInfo, ApiError> {
    let connection = find_connection(api, name).ok_or_else(ApiError::object_not_found)?;
    if !caller.sees_all && connection.session.user != caller.name {
        return Err(ApiError::unauthorised("Not_Authorized"));
    }
    Ok(connection)
}

pub(super) async fn connection(
    State(api): State<Api>,
    caller: Caller,
    Path(name): Path<String>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    let ranges = range_query.ranges(Rounding::Floor)?;
    let connection = find_own_connection(&api, &caller, &name)?;
    Ok(Json(api.rates.read(|view| connection_answer(&api, &connection, view, &ranges))).into_response())
}

pub(super) async fn close_connection(
    State(api): State<Api>,
    caller: Caller,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
) -> Answer {
    let connection = find_own_connection(&api, &caller, &name)?;
    if !caller.administrator && connection.session.user != caller.name {
        return Err(ApiError::unauthorised("Not_Authorized"));
    }
    let reason = headers
        .get("x-reason")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| "Closed via management plugin".to_string());
    if !api.broker.close_connection(connection.id, &reason) {
        return Err(ApiError::object_not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Channels of every connection (or of one vhost, or one connection), shaped like RabbitMQ's
/// `/api/channels`.
fn channel_list(api: &Api, only_vhost: Option<&str>, only_connection: Option<&str>) -> Vec<Value> {
    use std::sync::atomic::Ordering;
    let address = amqp_address(api);
    let mut list = Vec::new();
    for connection in api.broker.list_connections() {
        let connection_name = json::connection_name(&connection, address);
        if only_vhost.is_some_and(|vhost| connection.session.vhost != vhost) || only_connection.is_some_and(|name| connection_name != name)
        {
            continue;
        }
        for (number, channel) in &connection.session.open_channels {
            let Some(channel) = channel.upgrade() else { continue };
            let unacked = channel.ledger.lock().unacked.len();
            list.push(json!({
                "name": format!("{connection_name} ({number})"),
                "number": number,
                "node": api.node,
                "user": connection.session.user,
                "vhost": connection.session.vhost,
                "state": if channel.flow_active.load(Ordering::Acquire) { "running" } else { "flow" },
                "confirm": channel.confirm_mode.load(Ordering::Relaxed),
                "transactional": channel.transactional.load(Ordering::Relaxed),
                "prefetch_count": channel.prefetch_count.load(Ordering::Relaxed),
                "global_prefetch_count": channel.prefetch_global.load(Ordering::Acquire),
                "consumer_count": channel.consumer_count.load(Ordering::Relaxed),
                "messages_unacknowledged": unacked,
                "messages_unconfirmed": channel.confirms_in_syncer.load(Ordering::Acquire),
                "messages_uncommitted": 0,
                "acks_uncommitted": 0,
                "connection_details": {"name": connection_name, "peer_host": connection.peer.ip().to_string(), "peer_port": connection.peer.port()},
            }));
        }
    }
    list
}

pub(super) async fn channels(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    list_response(caller.visible(channel_list(&api, None, None), Visibility::OwnConnection), &query)
}

pub(super) async fn vhost_channels(
    State(api): State<Api>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> Answer {
    require_vhost(&api, &vhost)?;
    list_response(caller.visible(channel_list(&api, Some(&vhost), None), Visibility::OwnConnection), &query)
}

pub(super) async fn connection_channels(
    State(api): State<Api>,
    caller: Caller,
    Path(name): Path<String>,
    Query(query): Query<ListQuery>,
) -> Answer {
    find_own_connection(&api, &caller, &name)?;
    let address = amqp_address(&api);
    if !api.broker.list_connections().iter().any(|connection| json::connection_name(connection, address) == name) {
        return Err(ApiError::object_not_found());
    }
    list_response(channel_list(&api, None, Some(&name)), &query)
}

pub(super) async fn channel(State(api): State<Api>, caller: Caller, Path(name): Path<String>) -> Answer {
    let found = caller
        .visible(channel_list(&api, None, None), Visibility::OwnConnection)
        .into_iter()
        .find(|channel| channel.get("name").and_then(Value::as_str) == Some(name.as_str()));
    let mut answer = found.ok_or_else(ApiError::object_not_found)?;
    // RabbitMQ's single-channel answer lists the channel's consumers as /api/consumers shows them.
    let vhost = answer.get("vhost").and_then(Value::as_str).map(str::to_owned);
    let consumer_details: Vec<Value> = consumer_list(&api, vhost.as_deref())
        .into_iter()
        .filter(|consumer| consumer.pointer("/channel_details/name").and_then(Value::as_str) == Some(name.as_str()))
        .collect();
    if let Some(object) = answer.as_object_mut() {
        object.insert("consumer_details".to_owned(), Value::Array(consumer_details));
    }
    Ok(Json(answer).into_response())
}

/// Consumers, shaped like RabbitMQ's `/api/consumers`.
pub(super) async fn consumers(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    list_response(caller.visible(consumer_list(&api, None), Visibility::InVhost), &query)
}

pub(super) async fn vhost_consumers(State(api): State<Api>, Path(vhost): Path<String>, Query(query): Query<ListQuery>) -> Answer {
    require_vhost(&api, &vhost)?;
    list_response(consumer_list(&api, Some(&vhost)), &query)
}

fn consumer_list(api: &Api, only_vhost: Option<&str>) -> Vec<Value> {
    let connections = api.broker.list_connections();
    api.broker
        .list_consumers()
        .iter()
        .filter(|consumer| only_vhost.is_none_or(|vhost| consumer.vhost == vhost))
        .map(|consumer| {
            let connection = connections.iter().find(|connection| connection.id == consumer.consumer.connection_id);
            let mut answer = json::consumer_json(consumer, connection, amqp_address(api));
            // RabbitMQ names the node in each consumer's channel_details.
            if let Some(details) = answer.get_mut("channel_details").and_then(Value::as_object_mut) {
                details.insert("node".to_owned(), Value::String(api.node.clone()));
            }
            answer
        })
        .collect()
}

fn exchange_list(api: &Api, only_vhost: Option<&str>, ranges: &Ranges) -> Vec<Value> {
    let exchanges = api.broker.list_exchanges();
    api.rates.read(|view| {
        exchanges
            .iter()
            .filter(|exchange| only_vhost.is_none_or(|vhost| exchange.vhost == vhost))
            .map(|exchange| json::exchange_json(exchange, &view.exchange(&exchange.vhost, &exchange.name), ranges))
            .collect()
    })
}

pub(super) async fn exchanges(
    State(api): State<Api>,
    caller: Caller,
    Query(query): Query<ListQuery>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    let ranges = range_query.ranges(Rounding::Floor)?;
    list_response(caller.visible(exchange_list(&api, None, &ranges), Visibility::InVhost), &query)
}

pub(super) async fn vhost_exchanges(
    State(api): State<Api>,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    require_vhost(&api, &vhost)?;
    let ranges = range_query.ranges(Rounding::Floor)?;
    list_response(exchange_list(&api, Some(&vhost), &ranges), &query)
}

fn find_exchange(api: &Api, vhost: &str, name: &str) -> Result<crate::introspect::ExchangeInfo, ApiError> {
    require_vhost(api, vhost)?;
    let name = exchange_from_path(name);
    api.broker
        .list_exchanges()
        .into_iter()
        .find(|exchange| exchange.vhost == vhost && exchange.name == name)
        .ok_or_else(ApiError::object_not_found)
}

pub(super) async fn exchange(
    State(api): State<Api>,
    Path((vhost, name)): Path<(String, String)>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    let ranges = range_query.ranges(Rounding::Floor)?;
    let exchange = find_exchange(&api, &vhost, &name)?;
    Ok(Json(api.rates.read(|view| json::exchange_json(&exchange, &view.exchange(&exchange.vhost, &exchange.name), &ranges)))
        .into_response())
}

pub(super) async fn declare_exchange(
    State(api): State<Api>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> Answer {
    require_vhost(&api, &vhost)?;
    caller.require_managed(&vhost, Access::Configure, "exchange", exchange_from_path(&name))?;
    let mut body = body_json(&body)?;
    // As RabbitMQ: a PUT without a type declares a direct exchange, exchange.declare's default.
    if let Some(fields) = body.as_object_mut() {
        fields.entry("type").or_insert_with(|| json!("direct"));
    }
    let declaration = exchange_declaration(&name, &body)?;
    let existed = find_exchange(&api, &vhost, &name).is_ok();
    api.broker.declare_exchange(&vhost, &declaration)?;
    Ok(created_or_existing(existed))
}

/// An exchange.declare from the API's JSON (`type`, `durable`, `auto_delete`, `internal`, `arguments`);
/// absent flags take exchange.declare's defaults (all false), as in RabbitMQ.
pub fn exchange_declaration(name: &str, body: &Value) -> Result<ExchangeDeclaration, ApiError> {
    let kind = text(body, "type")?.ok_or_else(|| ApiError::bad_request("[{key_missing,type}]"))?;
    Ok(ExchangeDeclaration {
        name: short(exchange_from_path(name), "exchange name")?,
        kind: short(&kind, "exchange type")?,
        passive: false,
        durable: flag(body, "durable", false)?,
        auto_delete: flag(body, "auto_delete", false)?,
        internal: flag(body, "internal", false)?,
        arguments: json::json_to_table(body.get("arguments"))?,
    })
}

#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct DeleteQuery {
    #[serde(rename = "if-unused")]
    if_unused: Option<String>,
    #[serde(rename = "if-empty")]
    if_empty: Option<String>,
}

pub(super) async fn delete_exchange(
    State(api): State<Api>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<DeleteQuery>,
) -> Answer {
    find_exchange(&api, &vhost, &name)?;
    caller.require_managed(&vhost, Access::Configure, "exchange", exchange_from_path(&name))?;
    let name = short(exchange_from_path(&name), "exchange name")?;
    api.broker.delete_exchange(&vhost, &name, query.if_unused.as_deref() == Some("true"))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn binding_list(api: &Api, only_vhost: Option<&str>) -> Vec<Value> {
    let mut list = Vec::new();
    // The default exchange's implicit binding to every queue, as RabbitMQ lists it.
    for queue in api.broker.list_queues() {
        if only_vhost.is_some_and(|vhost| vhost != queue.vhost) {
            continue;
        }
        list.push(json::binding_json(&crate::introspect::BindingInfo {
            vhost: queue.vhost.clone(),
            source: String::new(),
            destination: queue.name.clone(),
            destination_is_queue: true,
            routing_key: queue.name.clone(),
            arguments: Default::default(),
        }));
    }
    for binding in api.broker.list_bindings() {
        if only_vhost.is_none_or(|vhost| vhost == binding.vhost) {
            list.push(json::binding_json(&binding));
        }
    }
    list
}

pub(super) async fn bindings(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    list_response(caller.visible(binding_list(&api, None), Visibility::InVhost), &query)
}

pub(super) async fn vhost_bindings(State(api): State<Api>, Path(vhost): Path<String>, Query(query): Query<ListQuery>) -> Answer {
    require_vhost(&api, &vhost)?;
    list_response(binding_list(&api, Some(&vhost)), &query)
}

fn filtered_bindings(api: &Api, vhost: &str, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
    binding_list(api, Some(vhost)).into_iter().filter(|binding| keep(binding)).collect()
}

pub(super) async fn exchange_bindings_source(
    State(api): State<Api>,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> Answer {
    let exchange = find_exchange(&api, &vhost, &name)?;
    list_response(filtered_bindings(&api, &vhost, |binding| binding["source"] == exchange.name.as_str()), &query)
}

pub(super) async fn exchange_bindings_destination(
    State(api): State<Api>,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> Answer {
    let exchange = find_exchange(&api, &vhost, &name)?;
    list_response(
        filtered_bindings(&api, &vhost, |binding| {
            binding["destination_type"] == "exchange" && binding["destination"] == exchange.name.as_str()
        }),
        &query,
    )
}

pub(super) fn find_queue(api: &Api, vhost: &str, name: &str) -> Result<crate::introspect::QueueInfo, ApiError> {
    require_vhost(api, vhost)?;
    api.broker.list_queues().into_iter().find(|queue| queue.vhost == vhost && queue.name == name).ok_or_else(ApiError::object_not_found)
}

pub(super) async fn queue_bindings(
    State(api): State<Api>,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> Answer {
    find_queue(&api, &vhost, &name)?;
    list_response(
        filtered_bindings(&api, &vhost, |binding| binding["destination_type"] == "queue" && binding["destination"] == name.as_str()),
        &query,
    )
}

fn queue_list(api: &Api, only_vhost: Option<&str>, ranges: &Ranges) -> Vec<Value> {
    let queues = api.broker.list_queues();
    api.rates.read(|view| {
        queues
            .iter()
            .filter(|queue| only_vhost.is_none_or(|vhost| queue.vhost == vhost))
            .map(|queue| json::queue_json(queue, &view.queue(&queue.vhost, &queue.name), ranges, &api.node))
            .collect()
    })
}

pub(super) async fn queues(
    State(api): State<Api>,
    caller: Caller,
    Query(query): Query<ListQuery>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    let ranges = range_query.ranges(Rounding::Ceil)?;
    list_response(caller.visible(queue_list(&api, None, &ranges), Visibility::InVhost), &query)
}

pub(super) async fn vhost_queues(
    State(api): State<Api>,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    require_vhost(&api, &vhost)?;
    let ranges = range_query.ranges(Rounding::Ceil)?;
    list_response(queue_list(&api, Some(&vhost), &ranges), &query)
}

pub(super) async fn queue(
    State(api): State<Api>,
    Path((vhost, name)): Path<(String, String)>,
    Query(range_query): Query<RangeQuery>,
) -> Answer {
    let ranges = range_query.ranges(Rounding::Ceil)?;
    let queue = find_queue(&api, &vhost, &name)?;
    let mut answer = api.rates.read(|view| json::queue_json(&queue, &view.queue(&vhost, &name), &ranges, &api.node));
    // RabbitMQ's single-queue answer lists the queue's consumers as /api/consumers shows them
    // (which is active, with x-single-active-consumer).
    let consumer_details: Vec<Value> = consumer_list(&api, Some(&vhost))
        .into_iter()
        .filter(|consumer| consumer.pointer("/queue/name").and_then(Value::as_str) == Some(name.as_str()))
        .collect();
    if let Some(object) = answer.as_object_mut() {
        object.insert("consumer_details".to_owned(), Value::Array(consumer_details));
    }
    Ok(Json(answer).into_response())
}

/// A queue.declare from the API's JSON (`durable`, `auto_delete`, `arguments`); absent flags take
/// queue.declare's defaults (false), as in RabbitMQ.
pub fn queue_definition(name: &str, body: &Value) -> Result<QueueDefinition, ApiError> {
    if name.is_empty() {
        return Err(ApiError::bad_request("queue name must not be empty"));
    }
    Ok(QueueDefinition {
        name: short(name, "queue name")?,
        durable: flag(body, "durable", false)?,
        exclusive_owner: None,
        auto_delete: flag(body, "auto_delete", false)?,
        arguments: json::json_to_table(body.get("arguments"))?,
        // Parsed from the arguments when the queue is created.
        queue_type: QueueType::default(),
    })
}

pub(super) async fn declare_queue(
    State(api): State<Api>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> Answer {
    require_vhost(&api, &vhost)?;
    caller.require_managed(&vhost, Access::Configure, "queue", &name)?;
    let body = body_json(&body)?;
    // RabbitMQ's management plugin declares through an AMQP channel, so the vhost's default
    // queue type applies as to any queue.declare.
    let definition = api.broker.with_default_queue_type(&vhost, queue_definition(&name, &body)?);
    let existed = find_queue(&api, &vhost, &name).is_ok();
    api.broker.declare_queue(&vhost, definition, false, false, 0)?;
    Ok(created_or_existing(existed))
}

pub(super) async fn delete_queue(
    State(api): State<Api>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<DeleteQuery>,
) -> Answer {
    let queue = find_queue(&api, &vhost, &name)?;
    caller.require_managed(&vhost, Access::Configure, "queue", &name)?;
    let short_name = short(&name, "queue name")?;
    api.broker.topology(&vhost)?.read().require_queue(&short_name, 0)?;
    if query.if_empty.as_deref() == Some("true") && queue.snapshot.ready > 0 {
        return Err(broker_core::AmqpError::precondition(format!("queue '{name}' in vhost '{vhost}' not empty")).into());
    }
    if query.if_unused.as_deref() == Some("true") && queue.snapshot.consumers > 0 {
        return Err(broker_core::AmqpError::precondition(format!("queue '{name}' in vhost '{vhost}' in use")).into());
    }
    api.broker.remove_queue(&vhost, &short_name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn purge_queue(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>) -> Answer {
    find_queue(&api, &vhost, &name)?;
    caller.require_managed(&vhost, Access::Read, "queue", &name)?;
    let handle = api.broker.topology(&vhost)?.read().require_queue(&short(&name, "queue name")?, 0)?.handle.clone();
    handle.check_local()?;
    handle.purge();
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// 400 naming every missing key, as RabbitMQ 3.10 answers: an Erlang term printed with `~p`, which
/// puts each element on its own line once the list is wider than 80 columns.
fn require_keys(body: &Value, keys: &[&str]) -> Result<(), ApiError> {
    let missing: Vec<String> = keys.iter().filter(|key| body.get(**key).is_none()).map(|key| format!("{{key_missing,{key}}}")).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let one_line = format!("[{}]", missing.join(","));
    const ERLANG_LINE_COLUMNS_MAX: usize = 80;
    if one_line.len() <= ERLANG_LINE_COLUMNS_MAX {
        return Err(ApiError::bad_request(one_line));
    }
    Err(ApiError::bad_request(format!("[{}]", missing.join(",\n "))))
}

/// How long a publish through the API waits for its message to be synced to disk.
const PUBLISH_SYNC_WAIT_S: u64 = 30;

pub(super) async fn publish(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>, body: Bytes) -> Answer {
    let body = body_json(&body)?;
    require_keys(&body, &["routing_key", "properties", "payload", "payload_encoding"])?;
    caller.require_for_publish(&vhost, "exchange", exchange_from_path(&name))?;
    // RabbitMQ runs the publish on a channel: a missing exchange is its 404 channel error, as a 400.
    let exchange = find_exchange(&api, &vhost, &name)
        .map_err(|_| ApiError::bad_request(format!("404 NOT_FOUND - no exchange '{}' in vhost '{vhost}'", exchange_from_path(&name))))?;
    if exchange.internal {
        return Err(broker_core::AmqpError::access_refused(format!(
            "cannot publish to internal exchange '{}' in vhost '{vhost}'",
            exchange.name
        ))
        .into());
    }
    let routing_key = text(&body, "routing_key")?.ok_or_else(|| ApiError::bad_request("[{key_missing,routing_key}]"))?;
    let payload = text(&body, "payload")?.ok_or_else(|| ApiError::bad_request("[{key_missing,payload}]"))?;
    let payload = match text(&body, "payload_encoding")?.as_deref() {
        None | Some("string") => payload.into_bytes(),
        Some("base64") => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(payload.trim())
                .map_err(|_| ApiError::bad_request("payload is not valid base64"))?
        }
        Some(other) => return Err(ApiError::bad_request(format!("payload_encoding must be string or base64, not {other}"))),
    };
    if payload.len() as u64 > api.broker.config.message_bytes_max {
        return Err(ApiError::bad_request(format!(
            "message size {} is larger than the maximum {}",
            payload.len(),
            api.broker.config.message_bytes_max
        )));
    }
    let properties = json::json_to_properties(body.get("properties"))?;
    let message = Message {
        exchange: short(&exchange.name, "exchange name")?,
        routing_key: short(&routing_key, "routing key")?,
        header: ContentHeader::from_properties(60, payload.len() as u64, &properties),
        body: Bytes::from(payload),
        published_at_ns: crate::metrics::latency::clock_ns(),
        bcc_routing_keys: None,
    };
    let published = api.broker.publish_message(&vhost, message)?;
    if !published.tickets.is_empty() {
        let (done, synced) = tokio::sync::oneshot::channel();
        published.tickets.when_settled(
            &api.broker.syncer,
            Box::new(move |durable| {
                let _ = done.send(durable);
            }),
        );
        match tokio::time::timeout(std::time::Duration::from_secs(PUBLISH_SYNC_WAIT_S), synced).await {
            Ok(Ok(true)) => {}
            _ => return Err(ApiError::internal("the message could not be made durable")),
        }
    }
    Ok(Json(json!({ "routed": published.routed })).into_response())
}

pub(super) async fn get_messages(
    State(api): State<Api>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> Answer {
    find_queue(&api, &vhost, &name)?;
    caller.require(&vhost, Access::Read, "queue", &name)?;
    let body = body_json(&body)?;
    require_keys(&body, &["ackmode", "count", "encoding"])?;
    let count = integer(&body, "count")?.ok_or_else(|| ApiError::bad_request("[{key_missing,count}]"))?;
    let count = usize::try_from(count).unwrap_or(usize::MAX).min(GET_MESSAGES_MAX);
    let requeue = match text(&body, "ackmode")?.as_deref() {
        Some("ack_requeue_true") | Some("reject_requeue_true") => true,
        Some("ack_requeue_false") | Some("reject_requeue_false") => false,
        Some(other) => return Err(ApiError::bad_request(format!("unknown ackmode {other}"))),
        None => return Err(ApiError::bad_request("[{key_missing,ackmode}]")),
    };
    let encoding = text(&body, "encoding")?.unwrap_or_else(|| "auto".to_string());
    if encoding != "auto" && encoding != "base64" {
        return Err(ApiError::bad_request(format!("unknown encoding {encoding}")));
    }
    let truncate = integer(&body, "truncate")?.map(|limit| usize::try_from(limit).unwrap_or(usize::MAX));
    let got = api.broker.get_messages(&vhost, &name, count, requeue).await?;
    let list: Vec<Value> = got
        .iter()
        .map(|got| {
            let message = &got.message;
            let mut payload: &[u8] = &message.body;
            if let Some(limit) = truncate {
                payload = &payload[..payload.len().min(limit)];
            }
            let (payload, payload_encoding) = match (encoding.as_str(), std::str::from_utf8(payload)) {
                ("auto", Ok(text)) => (text.to_string(), "string"),
                _ => {
                    use base64::Engine;
                    (base64::engine::general_purpose::STANDARD.encode(payload), "base64")
                }
            };
            let properties =
                message.header.properties().map(|properties| json::properties_to_json(&properties)).unwrap_or_else(|_| json!({}));
            json!({
                "payload_bytes": message.body.len(),
                "redelivered": got.redelivered,
                "exchange": message.exchange.to_string_lossy(),
                "routing_key": message.routing_key.to_string_lossy(),
                "message_count": got.message_count,
                "properties": properties,
                "payload": payload,
                "payload_encoding": payload_encoding,
            })
        })
        .collect();
    Ok(Json(Value::Array(list)).into_response())
}

/// Resolves the `{kind}` segment of a binding path: `q` (queue) or `e` (exchange).
fn destination_kind(kind: &str) -> Result<bool, ApiError> {
    match kind {
        "q" => Ok(true),
        "e" => Ok(false),
        _ => Err(ApiError::object_not_found()),
    }
}

fn pair_bindings(api: &Api, vhost: &str, source: &str, is_queue: bool, destination: &str) -> Result<Vec<Value>, ApiError> {
    find_exchange(api, vhost, source)?;
    if is_queue {
        find_queue(api, vhost, destination)?;
    } else {
        find_exchange(api, vhost, destination)?;
    }
    let source = exchange_from_path(source);
    let destination_type = if is_queue { "queue" } else { "exchange" };
    Ok(filtered_bindings(api, vhost, |binding| {
        binding["source"] == source && binding["destination_type"] == destination_type && binding["destination"] == destination
    }))
}

pub(super) async fn binding_pair(
    State(api): State<Api>,
    Path(params): Path<HashMap<String, String>>,
    Query(query): Query<ListQuery>,
) -> Answer {
    let (vhost, source, kind, destination) = binding_path(&params)?;
    let is_queue = destination_kind(kind)?;
    list_response(pair_bindings(&api, vhost, source, is_queue, destination)?, &query)
}

fn binding_path(params: &HashMap<String, String>) -> Result<(&str, &str, &str, &str), ApiError> {
    let param = |key: &str| params.get(key).map(String::as_str).ok_or_else(ApiError::object_not_found);
    Ok((param("vhost")?, param("source")?, param("kind")?, param("destination")?))
}

/// queue.bind and exchange.bind need write on the destination and read on the source.
fn require_binding_access(caller: &Caller, vhost: &str, source: &str, is_queue: bool, destination: &str) -> Result<(), ApiError> {
    caller.require_managed(vhost, Access::Write, if is_queue { "queue" } else { "exchange" }, destination)?;
    caller.require_managed(vhost, Access::Read, "exchange", exchange_from_path(source))
}

pub(super) async fn create_binding(
    State(api): State<Api>,
    caller: Caller,
    Path(params): Path<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let (vhost, source, kind, destination) = binding_path(&params)?;
    let is_queue = destination_kind(kind)?;
    require_binding_access(&caller, vhost, source, is_queue, destination)?;
    pair_bindings(&api, vhost, source, is_queue, destination)?;
    let body = body_json(&body)?;
    let routing_key = text(&body, "routing_key")?.unwrap_or_default();
    let arguments = json::json_to_table(body.get("arguments"))?;
    let props = json::properties_key(&routing_key, &arguments);
    let destination_name = short(destination, "destination")?;
    let binding = Binding {
        destination: if is_queue { Destination::Queue(destination_name) } else { Destination::Exchange(destination_name) },
        routing_key: short(&routing_key, "routing key")?,
        arguments,
    };
    api.broker.bind(vhost, &short(exchange_from_path(source), "source")?, binding)?;
    let location = format!("{}/{}", crate::url_path::encode_segment(destination), crate::url_path::encode_segment(&props));
    let mut response = StatusCode::CREATED.into_response();
    if let Ok(value) = axum::http::HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(response)
}

fn find_binding(api: &Api, params: &HashMap<String, String>) -> Result<Value, ApiError> {
    let (vhost, source, kind, destination) = binding_path(params)?;
    let props = params.get("props").ok_or_else(ApiError::object_not_found)?;
    let is_queue = destination_kind(kind)?;
    pair_bindings(api, vhost, source, is_queue, destination)?
        .into_iter()
        .find(|binding| binding["properties_key"] == props.as_str())
        .ok_or_else(ApiError::object_not_found)
}

pub(super) async fn binding(State(api): State<Api>, Path(params): Path<HashMap<String, String>>) -> Answer {
    Ok(Json(find_binding(&api, &params)?).into_response())
}

pub(super) async fn delete_binding(State(api): State<Api>, caller: Caller, Path(params): Path<HashMap<String, String>>) -> Answer {
    let found = find_binding(&api, &params)?;
    let (vhost, source, kind, destination) = binding_path(&params)?;
    require_binding_access(&caller, vhost, source, destination_kind(kind)?, destination)?;
    if source.is_empty() || exchange_from_path(source).is_empty() {
        return Err(broker_core::AmqpError::access_refused("operation not permitted on the default exchange").into());
    }
    let destination_name = short(destination, "destination")?;
    let binding = Binding {
        destination: if destination_kind(kind)? { Destination::Queue(destination_name) } else { Destination::Exchange(destination_name) },
        routing_key: short(found["routing_key"].as_str().unwrap_or_default(), "routing key")?,
        arguments: json::json_to_table(found.get("arguments"))?,
    };
    // The listed arguments went through JSON; unbind by the stored binding itself when it is found.
    let stored = api.broker.list_bindings().into_iter().find(|candidate| {
        candidate.vhost == vhost
            && candidate.source == source
            && candidate.destination == destination
            && candidate.destination_is_queue == matches!(binding.destination, Destination::Queue(_))
            && json::properties_key(&candidate.routing_key, &candidate.arguments) == found["properties_key"]
    });
    let binding = match stored {
        Some(stored) => Binding { arguments: stored.arguments, ..binding },
        None => binding,
    };
    api.broker.unbind(vhost, &short(source, "source")?, &binding)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
