//! `/api/definitions`: RabbitMQ's definitions file (exchanges, queues, bindings, users, vhosts,
//! permissions), exported and imported, so a topology moves between RabbitMQ and Lepus.

use super::access::Caller;
use super::json::{self, text};
use super::routes::{body_json, exchange_declaration, permission_list, queue_definition, require_vhost, user_json};
use super::{Api, ApiError, RABBITMQ_API_VERSION};
use crate::vhost_limits::VhostLimits;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use broker_core::exchange::{Binding, Destination};
use broker_core::vhost::{QueueType, QUEUE_TYPE_ARGUMENT};
use serde_json::{json, Map, Value};

type Answer = Result<Response, ApiError>;

fn is_exported_exchange(name: &str) -> bool {
    !name.is_empty() && !name.starts_with("amq.")
}

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
        .filter(|exchange| keep(&exchange.vhost) && is_exported_exchange(&exchange.name))
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
        .map(|info| json!({"name": info.name, "description": info.description, "tags": info.tags, "metadata": {"description": info.description, "tags": info.tags}}))
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
        "topic_permissions": [],
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
            Some(json!({"value": entry["value"], "vhost": info.name, "component": VHOST_LIMITS_COMPONENT, "name": "limits"}))
        })
        .collect()
}

/// The runtime parameter component that holds a vhost's limits.
const VHOST_LIMITS_COMPONENT: &str = "vhost-limits";

/// The vhost limits among imported parameters, validated; other parameters are counted, to be
/// reported as skipped.
fn limits_to_import(
    parameters: &[Value],
    vhost_of: impl Fn(&Value) -> Result<String, ApiError>,
) -> Result<(Vec<(String, VhostLimits)>, usize), ApiError> {
    let mut limits = Vec::new();
    let mut skipped = 0;
    for item in parameters {
        if text(item, "component")?.as_deref() != Some(VHOST_LIMITS_COMPONENT) {
            skipped += 1;
            continue;
        }
        let value = VhostLimits::from_json(item.get("value").unwrap_or(&Value::Null)).map_err(ApiError::bad_request)?;
        limits.push((vhost_of(item)?, value));
    }
    Ok((limits, skipped))
}

pub async fn import_all(State(api): State<Api>, caller: Caller, body: Bytes) -> Answer {
    caller.require_administrator()?;
    let body = body_json(&body)?;
    import(&api, &body, None)
}

pub async fn import_vhost(State(api): State<Api>, caller: Caller, Path(vhost): Path<String>, body: Bytes) -> Answer {
    caller.require_administrator()?;
    require_vhost(&api, &vhost)?;
    let body = body_json(&body)?;
    import(&api, &body, Some(&vhost))
}

fn section<'a>(body: &'a Value, key: &str) -> Result<&'a [Value], ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(ApiError::bad_request(format!("{key} must be a list"))),
    }
}

fn object<'a>(item: &'a Value, key: &str) -> Result<&'a Map<String, Value>, ApiError> {
    item.as_object().ok_or_else(|| ApiError::bad_request(format!("each of {key} must be a JSON object")))
}

fn required(item: &Value, key: &str, section: &str) -> Result<String, ApiError> {
    text(item, key)?.ok_or_else(|| ApiError::bad_request(format!("an entry of {section} lacks {key}")))
}

/// Refuses a queue of a type Lepus does not run, before anything of the file is applied. The type
/// is the queue's `x-queue-type` argument, as RabbitMQ 3.10 reads it; without one, the `type` field
/// `rabbitmqctl export_definitions` writes. RabbitMQ 3.10 ignores that field, but a file that says
/// `quorum` there asks for a quorum queue, and Lepus refuses it rather than make it classic.
fn check_imported_queue_type(item: &Value, vhost: &str) -> Result<(), ApiError> {
    let name = required(item, "name", "queues")?;
    let arguments = json::json_to_table(item.get("arguments"))?;
    let short_name = json::short(&name, "queue name")?;
    let queue_type = if arguments.get(QUEUE_TYPE_ARGUMENT).is_some() {
        QueueType::from_arguments(&short_name, vhost, &arguments)?
    } else {
        match text(item, "type")? {
            None => QueueType::Classic,
            Some(type_name) => QueueType::from_name(&type_name)
                .ok_or_else(|| ApiError::bad_request(format!("queue '{name}' in vhost '{vhost}': unsupported queue type '{type_name}'")))?,
        }
    };
    if !crate::queue_type::capabilities(queue_type).implemented {
        return Err(ApiError::bad_request(format!(
            "queue '{name}' in vhost '{vhost}' is a {} queue: queue type '{}' is not supported by Lepus yet; nothing was imported",
            queue_type.name(),
            queue_type.name()
        )));
    }
    Ok(())
}

/// Imports vhosts, users, permissions and policies, then exchanges, queues and bindings, as
/// RabbitMQ does. Every object must be in a vhost that exists or that the file creates, every queue
/// must be of a type Lepus runs, and every policy and vhost limit must be valid; all are checked
/// before anything is changed. Parameters other than vhost limits, and topic permissions, are not
/// imported (logged and skipped).
fn import(api: &Api, body: &Value, into_vhost: Option<&str>) -> Answer {
    let vhost_of = |item: &Value| -> Result<String, ApiError> {
        match into_vhost {
            Some(vhost) => Ok(vhost.to_string()),
            None => Ok(text(item, "vhost")?.unwrap_or_else(|| "/".to_string())),
        }
    };
    let (exchanges, queues, bindings) = (section(body, "exchanges")?, section(body, "queues")?, section(body, "bindings")?);
    let mut created_vhosts = Vec::new();
    if into_vhost.is_none() {
        for item in section(body, "vhosts")? {
            let name = required(item, "name", "vhosts")?;
            let metadata = item.get("metadata").unwrap_or(&Value::Null);
            let description = text(item, "description")?.or(text(metadata, "description")?).unwrap_or_default();
            let tags = if item.get("tags").is_some() { super::routes::tags_of(item) } else { super::routes::tags_of(metadata) };
            created_vhosts.push((name, description, tags));
        }
    }
    let mut missing: Vec<String> = Vec::new();
    let parameters = section(body, "parameters")?;
    for item in exchanges.iter().chain(queues).chain(bindings).chain(section(body, "policies")?).chain(parameters) {
        object(item, "exchanges, queues, bindings, policies and parameters")?;
        let vhost = vhost_of(item)?;
        if !api.broker.has_vhost(&vhost) && !created_vhosts.iter().any(|(name, ..)| *name == vhost) && !missing.contains(&vhost) {
            missing.push(vhost);
        }
    }
    if !missing.is_empty() {
        return Err(ApiError::bad_request(format!(
            "the definitions use vhosts {missing:?}, which neither exist nor are defined in the file"
        )));
    }
    for item in queues {
        check_imported_queue_type(item, &vhost_of(item)?)?;
    }
    let mut policies = Vec::new();
    for item in section(body, "policies")? {
        let name = required(item, "name", "policies")?;
        policies.push(super::vhosts::policy_from_body(&vhost_of(item)?, &name, item)?);
    }
    let (limits, other_parameters) = limits_to_import(parameters, vhost_of)?;
    for (name, description, tags) in created_vhosts {
        api.broker.put_vhost(&name, description, tags)?;
    }
    for skipped in ["topic_permissions", "parameters", "global_parameters"] {
        let count = if skipped == "parameters" { other_parameters } else { section(body, skipped)?.len() };
        if count > 0 {
            tracing::warn!(section = skipped, count, "definitions import: not supported by Lepus yet, skipped");
        }
    }
    // Users and permissions first, as RabbitMQ imports them.
    for item in section(body, "users")? {
        let name = required(item, "name", "users")?;
        let user = crate::auth::User::new(&name, super::routes::password_hash_of(item)?, super::routes::tags_of(item));
        api.broker.users.put(user);
    }
    for item in section(body, "permissions")? {
        let user = required(item, "user", "permissions")?;
        let vhost = vhost_of(item)?;
        let expression = |key: &str| text(item, key).map(|value| value.unwrap_or_default());
        let permission =
            crate::auth::Permission::new(&user, &vhost, &expression("configure")?, &expression("write")?, &expression("read")?)
                .map_err(|error| ApiError::bad_request(error.to_string()))?;
        api.broker.permissions.put(permission);
    }
    api.broker.persist()?;
    // Before the queues, as RabbitMQ imports parameters.
    for (vhost, limits) in limits {
        api.broker.set_vhost_limits(&vhost, limits)?;
    }
    for policy in policies {
        api.broker.put_policy(policy)?;
    }
    for item in exchanges {
        let name = required(item, "name", "exchanges")?;
        if !is_exported_exchange(&name) {
            continue;
        }
        let declaration = exchange_declaration(&name, item)?;
        api.broker.declare_exchange(&vhost_of(item)?, &declaration)?;
    }
    for item in queues {
        let name = required(item, "name", "queues")?;
        let definition = queue_definition(&name, item)?;
        api.broker.declare_queue(&vhost_of(item)?, definition, false, false, 0)?;
    }
    for item in bindings {
        let source = required(item, "source", "bindings")?;
        let destination = required(item, "destination", "bindings")?;
        let destination_name = json::short(&destination, "destination")?;
        let destination = match required(item, "destination_type", "bindings")?.as_str() {
            "queue" => Destination::Queue(destination_name),
            "exchange" => Destination::Exchange(destination_name),
            other => return Err(ApiError::bad_request(format!("unknown destination_type {other}"))),
        };
        let binding = Binding {
            destination,
            routing_key: json::short(&text(item, "routing_key")?.unwrap_or_default(), "routing key")?,
            arguments: json::json_to_table(item.get("arguments"))?,
        };
        if source.is_empty() {
            // The default exchange's bindings are implicit.
            continue;
        }
        api.broker.bind(&vhost_of(item)?, &json::short(&source, "source")?, binding)?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
