//! `/api/definitions`: RabbitMQ's definitions file (exchanges, queues, bindings, users, vhosts,
//! permissions), exported and imported, so a topology moves between RabbitMQ and Lepus.

use super::access::Caller;
use super::json::{self};
use super::routes::{body_json, permission_list, require_vhost, user_json};
use super::{Api, ApiError, RABBITMQ_API_VERSION};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

type Answer = Result<Response, ApiError>;

/// The exchanges, queues (not exclusive ones) and bindings of `vhost` (all vhosts when None), as a
/// definitions file holds them; per-vhost exports leave out the `vhost` fields, as RabbitMQ does.
fn topology(api: &Api, only_vhost: Option<&str>) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let keep = |vhost: &str| only_vhost.is_none_or(|only| only == vhost);
    let with_vhost = |mut value: Value, vhost: &str| {
        if only_vhost.is_none() {
            if let Value::Object(map) = &mut value {
                map.insert("vhost".to_string(), Value::String(vhost.to_string()));
            }
        }
        value
    };
    let queues_listed = api.broker.list_queues();
    let exclusive =
        |vhost: &str, name: &str| queues_listed.iter().any(|queue| queue.vhost == vhost && queue.name == name && queue.exclusive);
    let queues = queues_listed
        .iter()
        .filter(|queue| keep(&queue.vhost) && !queue.exclusive)
        .map(|queue| {
            with_vhost(
                json!({
                    "name": queue.name,
                    "durable": queue.durable,
                    "auto_delete": queue.auto_delete,
                    "arguments": json::table_to_json(&queue.arguments),
                }),
                &queue.vhost,
            )
        })
        .collect();
    let exchanges = api
        .broker
        .list_exchanges()
        .iter()
        .filter(|exchange| keep(&exchange.vhost) && super::definitions_import::is_exported_exchange(&exchange.name))
        .map(|exchange| {
            with_vhost(
                json!({
                    "name": exchange.name,
                    "type": exchange.kind,
                    "durable": exchange.durable,
                    "auto_delete": exchange.auto_delete,
                    "internal": exchange.internal,
                    "arguments": json::table_to_json(&exchange.arguments),
                }),
                &exchange.vhost,
            )
        })
        .collect();
    let bindings = api
        .broker
        .list_bindings()
        .iter()
        .filter(|binding| keep(&binding.vhost) && !(binding.destination_is_queue && exclusive(&binding.vhost, &binding.destination)))
        .map(|binding| {
            with_vhost(
                json!({
                    "source": binding.source,
                    "destination": binding.destination,
                    "destination_type": if binding.destination_is_queue { "queue" } else { "exchange" },
                    "routing_key": binding.routing_key,
                    "arguments": json::table_to_json(&binding.arguments),
                }),
                &binding.vhost,
            )
        })
        .collect();
    (exchanges, queues, bindings)
}

pub async fn export_all(State(api): State<Api>, caller: Caller) -> Answer {
    caller.require_administrator()?;
    let (exchanges, queues, bindings) = topology(&api, None);
    let users: Vec<Value> = api
        .broker
        .users
        .list()
        .iter()
        .map(|user| {
            let mut value = user_json(user);
            if let Value::Object(map) = &mut value {
                map.remove("limits");
            }
            value
        })
        .collect();
    let vhosts: Vec<Value> = api
        .broker
        .vhost_infos()
        .iter()
        .map(|info| json!({"name": info.name, "description": info.description, "tags": info.tags, "metadata": super::vhosts::vhost_metadata(info)}))
        .collect();
    let policies: Vec<Value> = api.broker.policies().iter().map(|policy| super::vhosts::policy_json(policy)).collect();
    Ok(Json(json!({
        "rabbit_version": RABBITMQ_API_VERSION,
        "rabbitmq_version": RABBITMQ_API_VERSION,
        "product_name": "Lepus",
        "product_version": env!("CARGO_PKG_VERSION"),
        "users": users,
        "vhosts": vhosts,
        "permissions": permission_list(&api, None),
        "topic_permissions": super::topic_permissions::topic_permission_list(&api),
        "parameters": limit_parameters(&api, None),
        "global_parameters": [],
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }))
    .into_response())
}

pub async fn export_vhost(State(api): State<Api>, caller: Caller, Path(vhost): Path<String>) -> Answer {
    caller.require_administrator()?;
    require_vhost(&api, &vhost)?;
    let (exchanges, queues, bindings) = topology(&api, Some(&vhost));
    Ok(Json(json!({
        "rabbit_version": RABBITMQ_API_VERSION,
        "rabbitmq_version": RABBITMQ_API_VERSION,
        "product_name": "Lepus",
        "product_version": env!("CARGO_PKG_VERSION"),
        "parameters": limit_parameters(&api, Some(&vhost)),
        "policies": api.broker.policies().iter().filter(|policy| policy.vhost == vhost).map(|policy| {
            let mut value = super::vhosts::policy_json(policy);
            if let Value::Object(map) = &mut value {
                map.remove("vhost");
            }
            value
        }).collect::<Vec<Value>>(),
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }))
    .into_response())
}

/// The vhosts' limits as RabbitMQ exports them: one parameter of component `vhost-limits`, named
/// `limits`, per vhost that has a set of limits (of `vhost` alone when given).
fn limit_parameters(api: &Api, only_vhost: Option<&str>) -> Vec<Value> {
    api.broker
        .vhost_infos()
        .iter()
        .filter(|info| only_vhost.is_none_or(|vhost| info.name == vhost))
        .filter_map(|info| {
            let entry = super::vhosts::vhost_limits_json(&info.name, info.limits.as_ref()?);
            Some(json!({"value": entry["value"], "vhost": info.name, "component": super::definitions_import::VHOST_LIMITS_COMPONENT, "name": "limits"}))
        })
        .collect()
}

pub async fn import_all(State(api): State<Api>, caller: Caller, body: Bytes) -> Answer {
    caller.require_administrator()?;
    let body = body_json(&body)?;
    super::definitions_import::import(&api.broker, &body, None)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn import_vhost(State(api): State<Api>, caller: Caller, Path(vhost): Path<String>, body: Bytes) -> Answer {
    caller.require_administrator()?;
    require_vhost(&api, &vhost)?;
    let body = body_json(&body)?;
    super::definitions_import::import(&api.broker, &body, Some(&vhost))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
