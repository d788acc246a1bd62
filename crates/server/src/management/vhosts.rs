//! `/api/vhosts`, `/api/policies` and `/api/vhost-limits`: creating and deleting vhosts, the
//! policies that give queues their limits, and the vhosts' own limits, shaped as RabbitMQ 3.10's
//! management API.

use super::access::{Caller, Visibility};
use super::routes::{body_json, created_or_existing, require_vhost, tags_of};
use super::{list_response, Api, ApiError, ListQuery};
use crate::policy::Policy;
use crate::vhost_limits::{VhostLimit, VhostLimits};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use broker_core::vhost::QueueType;
use serde_json::{json, Value};

type Answer = Result<Response, ApiError>;

fn vhost_json(api: &Api, info: &crate::broker::VhostInfo) -> Value {
    let (mut ready, mut unacked) = (0, 0);
    for queue in api.broker.list_queues().iter().filter(|queue| queue.vhost == info.name) {
        ready += queue.snapshot.ready;
        unacked += queue.snapshot.unacked;
    }
    json!({
        "name": info.name,
        "description": info.description,
        "tags": info.tags,
        "metadata": vhost_metadata(info),
        "default_queue_type": info.default_queue_type.unwrap_or_default().name(),
        "tracing": false,
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "cluster_state": { api.node.clone(): "running" },
    })
}

/// A vhost's metadata as RabbitMQ keeps it: `default_queue_type` only when the vhost has one.
pub fn vhost_metadata(info: &crate::broker::VhostInfo) -> Value {
    let mut metadata = json!({"description": info.description, "tags": info.tags});
    if let (Some(queue_type), Some(fields)) = (info.default_queue_type, metadata.as_object_mut()) {
        fields.insert("default_queue_type".to_string(), json!(queue_type.name()));
    }
    metadata
}

/// GET /api/vhosts.
pub async fn vhosts(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    list_response(caller.visible(api.broker.vhost_infos().iter().map(|info| vhost_json(&api, info)).collect(), Visibility::Vhost), &query)
}

/// GET /api/vhosts/{vhost}.
pub async fn vhost(State(api): State<Api>, caller: Caller, Path(vhost): Path<String>) -> Answer {
    caller.require_visible(&vhost)?;
    let info = api.broker.vhost_infos().into_iter().find(|info| info.name == vhost).ok_or_else(ApiError::object_not_found)?;
    Ok(Json(vhost_json(&api, &info)).into_response())
}

/// PUT /api/vhosts/{vhost}: creates a vhost (or updates its description and tags). As in
/// RabbitMQ, the administrator who creates it gets full permissions in it. RabbitMQ 3.10.8 reads
/// the default queue type from `defaultqueuetype` (later versions `default_queue_type`, taken too).
pub async fn put_vhost(State(api): State<Api>, caller: Caller, Path(vhost): Path<String>, body: Bytes) -> Answer {
    caller.require_administrator()?;
    let body = body_json(&body)?;
    let description = body.get("description").and_then(Value::as_str).unwrap_or("").to_string();
    let default_queue_type =
        match body.get("defaultqueuetype").or_else(|| body.get("default_queue_type")) {
            None | Some(Value::Null) => None,
            Some(value) => Some(value.as_str().and_then(QueueType::from_name).ok_or_else(|| {
                ApiError::bad_request(format!("invalid_queue_type: {value} is not a queue type (classic, quorum, stream)"))
            })?),
        };
    let created = api.broker.put_vhost(&vhost, description, tags_of(&body), default_queue_type)?;
    if created {
        let permission =
            crate::auth::Permission::new(&caller.name, &vhost, ".*", ".*", ".*").map_err(|error| ApiError::internal(error.to_string()))?;
        api.broker.put_permission(permission)?;
    }
    Ok(created_or_existing(!created))
}

/// DELETE /api/vhosts/{vhost}: closes its connections and deletes everything in it.
pub async fn delete_vhost(State(api): State<Api>, caller: Caller, Path(vhost): Path<String>) -> Answer {
    caller.require_administrator()?;
    if !api.broker.delete_vhost(&vhost)? {
        return Err(ApiError::object_not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A policy as RabbitMQ's API shows it.
pub fn policy_json(policy: &Policy) -> Value {
    json!({
        "vhost": policy.vhost,
        "name": policy.name,
        "pattern": policy.pattern,
        "apply-to": policy.apply_to.name(),
        "definition": policy.definition,
        "priority": policy.priority,
    })
}

fn policy_list(api: &Api, vhost: Option<&str>) -> Vec<Value> {
    api.broker
        .policies()
        .iter()
        .filter(|policy| vhost.is_none_or(|vhost| policy.vhost == vhost))
        .map(|policy| policy_json(policy))
        .collect()
}

/// GET /api/policies.
pub async fn policies(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    list_response(caller.visible(policy_list(&api, None), Visibility::InVhost), &query)
}

/// GET /api/policies/{vhost}.
pub async fn vhost_policies(State(api): State<Api>, Path(vhost): Path<String>, Query(query): Query<ListQuery>) -> Answer {
    require_vhost(&api, &vhost)?;
    list_response(policy_list(&api, Some(&vhost)), &query)
}

/// GET /api/policies/{vhost}/{name}.
pub async fn policy(State(api): State<Api>, Path((vhost, name)): Path<(String, String)>) -> Answer {
    let policies = api.broker.policies();
    let policy = policies.iter().find(|policy| policy.vhost == vhost && policy.name == name).ok_or_else(ApiError::object_not_found)?;
    Ok(Json(policy_json(policy)).into_response())
}

fn operator_policy_list(api: &Api, vhost: Option<&str>) -> Vec<Value> {
    let policies = api.broker.operator_policies();
    policies.iter().filter(|policy| vhost.is_none_or(|vhost| policy.vhost == vhost)).map(|policy| policy_json(policy)).collect()
}

/// GET /api/operator-policies (administrators, as in RabbitMQ).
pub async fn operator_policies(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    caller.require_administrator()?;
    list_response(operator_policy_list(&api, None), &query)
}

/// GET /api/operator-policies/{vhost}.
pub async fn vhost_operator_policies(
    State(api): State<Api>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> Answer {
    caller.require_administrator()?;
    require_vhost(&api, &vhost)?;
    list_response(operator_policy_list(&api, Some(&vhost)), &query)
}

/// GET /api/operator-policies/{vhost}/{name}.
pub async fn operator_policy(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>) -> Answer {
    caller.require_administrator()?;
    let policies = api.broker.operator_policies();
    let policy = policies.iter().find(|policy| policy.vhost == vhost && policy.name == name).ok_or_else(ApiError::object_not_found)?;
    Ok(Json(policy_json(policy)).into_response())
}

/// PUT /api/operator-policies/{vhost}/{name}: limits merged into every matching queue's policy,
/// the stricter value winning (`max-length`, `message-ttl`; RabbitMQ's other operator policy keys
/// are refused as not implemented, any other key as not recognised).
pub async fn put_operator_policy(
    State(api): State<Api>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> Answer {
    caller.require_administrator()?;
    require_vhost(&api, &vhost)?;
    let policy = operator_policy_from_body(&vhost, &name, &body_json(&body)?)?;
    Ok(created_or_existing(!api.broker.put_operator_policy(policy)?))
}

/// DELETE /api/operator-policies/{vhost}/{name}.
pub async fn delete_operator_policy(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>) -> Answer {
    caller.require_administrator()?;
    if !api.broker.delete_operator_policy(&vhost, &name)? {
        return Err(ApiError::object_not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// 401 unless the caller may change policies (RabbitMQ: the policymaker or administrator tag).
fn require_policymaker(caller: &Caller) -> Result<(), ApiError> {
    if caller.administrator || caller.policymaker {
        Ok(())
    } else {
        Err(ApiError::unauthorised("Not policymaker or administrator user"))
    }
}

/// Builds a policy from a PUT body (RabbitMQ's: `pattern`, `definition`, `priority`, `apply-to`).
pub fn policy_from_body(vhost: &str, name: &str, body: &Value) -> Result<Policy, ApiError> {
    let (pattern, apply_to, priority, definition) = policy_parts(body)?;
    Policy::new(vhost, name, pattern, apply_to, priority, definition)
        .map_err(|error| ApiError::bad_request(escape_html_tags(&error.to_string())))
}

/// RabbitMQ 3.10.8's policy endpoint escapes its validation reasons as HTML (measured: an
/// Erlang binary `<<"x">>` comes back as `&lt;&lt;"x"&gt;&gt;`).
fn escape_html_tags(reason: &str) -> String {
    reason.replace('<', "&lt;").replace('>', "&gt;")
}

/// An operator policy from a PUT body, in the same form.
fn operator_policy_from_body(vhost: &str, name: &str, body: &Value) -> Result<Policy, ApiError> {
    let (pattern, apply_to, priority, definition) = policy_parts(body)?;
    Policy::new_operator(vhost, name, pattern, apply_to, priority, definition).map_err(|error| ApiError::bad_request(error.to_string()))
}

/// A policy body's pattern, apply-to, priority and definition.
type PolicyParts<'a> = (&'a str, &'a str, i64, serde_json::Map<String, Value>);

/// The parts of a policy body: apply-to is `all` and priority 0 when absent.
fn policy_parts(body: &Value) -> Result<PolicyParts<'_>, ApiError> {
    let pattern = body.get("pattern").and_then(Value::as_str).ok_or_else(|| ApiError::bad_request("policy needs a pattern"))?;
    let definition =
        body.get("definition").and_then(Value::as_object).ok_or_else(|| ApiError::bad_request("policy needs a definition object"))?;
    let priority = match body.get("priority") {
        None | Some(Value::Null) => 0,
        Some(value) => value
            .as_i64()
            .or_else(|| value.as_str().and_then(|text| text.parse().ok()))
            .ok_or_else(|| ApiError::bad_request("priority must be an integer"))?,
    };
    let apply_to = body.get("apply-to").and_then(Value::as_str).unwrap_or("all");
    Ok((pattern, apply_to, priority, definition.clone()))
}

/// PUT /api/policies/{vhost}/{name}: sets a policy and applies it to the vhost's queues at once.
pub async fn put_policy(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>, body: Bytes) -> Answer {
    require_policymaker(&caller)?;
    require_vhost(&api, &vhost)?;
    let policy = policy_from_body(&vhost, &name, &body_json(&body)?)?;
    Ok(created_or_existing(!api.broker.put_policy(policy)?))
}

/// DELETE /api/policies/{vhost}/{name}.
pub async fn delete_policy(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>) -> Answer {
    require_policymaker(&caller)?;
    if !api.broker.delete_policy(&vhost, &name)? {
        return Err(ApiError::object_not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// One vhost's entry in `/api/vhost-limits`: its limits by name, or `[]` when it has a set of
/// limits that is empty (every limit deleted), as RabbitMQ writes an empty parameter.
pub fn vhost_limits_json(vhost: &str, limits: &VhostLimits) -> Value {
    let value = if *limits == VhostLimits::default() { json!([]) } else { json!(limits.to_map()) };
    json!({"vhost": vhost, "value": value})
}

/// GET /api/vhost-limits: the limits of every vhost the caller may see that has any.
pub async fn all_vhost_limits(State(api): State<Api>, caller: Caller) -> Answer {
    let entries: Vec<Value> = api
        .broker
        .vhost_infos()
        .iter()
        .filter(|info| caller.require_visible(&info.name).is_ok())
        .filter_map(|info| info.limits.as_ref().map(|limits| vhost_limits_json(&info.name, limits)))
        .collect();
    Ok(Json(entries).into_response())
}

/// GET /api/vhost-limits/{vhost}: `[]` when the vhost has no limit, as RabbitMQ answers.
pub async fn vhost_limits(State(api): State<Api>, Path(vhost): Path<String>) -> Answer {
    let limits = api.broker.vhost_limits(&vhost).ok_or_else(ApiError::object_not_found)?;
    let entries: Vec<Value> =
        limits.filter(|limits| *limits != VhostLimits::default()).map(|limits| vhost_limits_json(&vhost, &limits)).into_iter().collect();
    Ok(Json(entries).into_response())
}

/// RabbitMQ's 404 for a limit of a vhost that does not exist.
fn vhost_not_found() -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, error: "not_found", reason: "vhost_not_found".to_string(), problems: Vec::new() }
}

/// PUT /api/vhost-limits/{vhost}/{name} with `{"value": N}`: sets one limit (administrators only).
/// A negative value means no limit; 0 refuses every new connection or queue.
pub async fn put_vhost_limit(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>, body: Bytes) -> Answer {
    caller.require_administrator()?;
    if !api.broker.has_vhost(&vhost) {
        return Err(vhost_not_found());
    }
    let body: Value = serde_json::from_slice(&body)
        .ok()
        .filter(Value::is_object)
        .or_else(|| body.iter().all(u8::is_ascii_whitespace).then(|| json!({})))
        .ok_or_else(|| ApiError::bad_request("not_json"))?;
    let value = body.get("value").ok_or_else(|| ApiError::bad_request("[{key_missing,value}]"))?;
    let Some(limit) = VhostLimit::parse(&name) else {
        return Err(ApiError::bad_request(VhostLimits::from_json(&json!({ name: value })).err().unwrap_or_default()));
    };
    let value = crate::vhost_limits::limit_value(limit, value).map_err(ApiError::bad_request)?;
    if !api.broker.set_vhost_limit(&vhost, limit, Some(value))? {
        return Err(vhost_not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// DELETE /api/vhost-limits/{vhost}/{name}: removes one limit (administrators only); a limit
/// that is not set, or not a limit at all, is deleted without complaint, as in RabbitMQ.
pub async fn delete_vhost_limit(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>) -> Answer {
    caller.require_administrator()?;
    let exists = match VhostLimit::parse(&name) {
        Some(limit) => api.broker.set_vhost_limit(&vhost, limit, None)?,
        None => api.broker.has_vhost(&vhost),
    };
    // RabbitMQ 3.10 answers 500 for a vhost that does not exist; 404 says what happened.
    if !exists {
        return Err(ApiError::object_not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
