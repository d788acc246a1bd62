//! Topic permissions in the management API, as RabbitMQ 3.10.8's management plugin serves them
//! (rabbit_mgmt_wm_topic_permission*.erl), every route for administrators only:
//!
//! - `GET /api/topic-permissions`, `/api/vhosts/{vhost}/topic-permissions`,
//!   `/api/users/{user}/topic-permissions`: lists (404 for a vhost or user that does not exist);
//! - `GET /api/topic-permissions/{vhost}/{user}[/{exchange}]`: the user's entries in the vhost,
//!   every exchange's even when one is named (RabbitMQ's handler ignores it); 404 when none;
//! - `PUT` there with `{"exchange", "write", "read"}`: 201 when the user had no entry in the vhost,
//!   204 when it had one (on any exchange); 400 `vhost_or_user_not_found`;
//! - `DELETE`: every entry of the user in the vhost, or the named exchange's; 404 when the user has
//!   none there (then even a named exchange without an entry is 204, as RabbitMQ answers).
//!
//! Objects carry RabbitMQ's keys in RabbitMQ's order (serialised from structs, whose field order
//! serde keeps); a listing with query parameters goes through the common listing code.

use super::access::Caller;
use super::routes::{body_json, Answer};
use super::{list_response, Api, ApiError, ListQuery};
use crate::topic_permissions::TopicPermission;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

/// An entry with the user first (`/api/topic-permissions`, a user's, one user's in a vhost).
#[derive(Serialize)]
struct UserFirst<'a> {
    user: &'a str,
    vhost: &'a str,
    exchange: &'a str,
    write: &'a str,
    read: &'a str,
}

/// An entry with the vhost first (a vhost's list).
#[derive(Serialize)]
struct VhostFirst<'a> {
    vhost: &'a str,
    user: &'a str,
    exchange: &'a str,
    write: &'a str,
    read: &'a str,
}

fn user_first(entry: &TopicPermission) -> UserFirst<'_> {
    UserFirst { user: &entry.user, vhost: &entry.vhost, exchange: &entry.exchange, write: &entry.write, read: &entry.read }
}

fn vhost_first(entry: &TopicPermission) -> VhostFirst<'_> {
    VhostFirst { vhost: &entry.vhost, user: &entry.user, exchange: &entry.exchange, write: &entry.write, read: &entry.read }
}

/// The entries as the export of definitions writes them.
pub fn topic_permission_list(api: &Api) -> Vec<Value> {
    api.broker.topic_permissions.list().iter().map(|entry| serde_json::to_value(user_first(entry)).unwrap_or(Value::Null)).collect()
}

/// A listing: the ordered objects as they are, or through the listing code when the query sorts,
/// selects columns or pages.
fn listing<T: Serialize>(items: Vec<T>, query: &ListQuery) -> Answer {
    let plain =
        query.columns.is_none() && query.sort.is_none() && query.sort_reverse.is_none() && query.name.is_none() && query.page.is_none();
    if plain {
        return Ok(Json(items).into_response());
    }
    list_response(items.iter().map(|item| serde_json::to_value(item).unwrap_or(Value::Null)).collect(), query)
}

pub(super) async fn topic_permissions(State(api): State<Api>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    caller.require_administrator()?;
    let entries = api.broker.topic_permissions.list();
    listing(entries.iter().map(|entry| user_first(entry)).collect(), &query)
}

pub(super) async fn vhost_topic_permissions(
    State(api): State<Api>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> Answer {
    caller.require_administrator()?;
    super::routes::require_vhost(&api, &vhost)?;
    let entries: Vec<Arc<TopicPermission>> = api.broker.topic_permissions.list().into_iter().filter(|entry| entry.vhost == vhost).collect();
    listing(entries.iter().map(|entry| vhost_first(entry)).collect(), &query)
}

pub(super) async fn user_topic_permissions(
    State(api): State<Api>,
    caller: Caller,
    Path(user): Path<String>,
    Query(query): Query<ListQuery>,
) -> Answer {
    caller.require_administrator()?;
    api.broker.users.get(&user).ok_or_else(ApiError::object_not_found)?;
    let entries: Vec<Arc<TopicPermission>> = api.broker.topic_permissions.list().into_iter().filter(|entry| entry.user == user).collect();
    listing(entries.iter().map(|entry| user_first(entry)).collect(), &query)
}

/// The user's entries in the vhost, or why there are none: `Err(true)` when the user or the
/// vhost does not exist, `Err(false)` when it has no entry.
fn entries_of(api: &Api, vhost: &str, user: &str) -> Result<Vec<Arc<TopicPermission>>, bool> {
    if api.broker.users.get(user).is_none() || !api.broker.has_vhost(vhost) {
        return Err(true);
    }
    let mut entries = api.broker.topic_permissions.of(user, vhost);
    if entries.is_empty() {
        return Err(false);
    }
    entries.sort_by(|a, b| a.exchange.cmp(&b.exchange));
    Ok(entries)
}

/// `{vhost}/{user}` and `{vhost}/{user}/{exchange}`.
type EntryPath = Path<Vec<(String, String)>>;

/// The vhost, user and (when the path names one) exchange of a path.
fn path_parts(Path(parameters): EntryPath) -> (String, String, Option<String>) {
    let value = |key: &str| parameters.iter().find(|(name, _)| name == key).map(|(_, value)| value.clone());
    (value("vhost").unwrap_or_default(), value("user").unwrap_or_default(), value("exchange"))
}

pub(super) async fn topic_permission(State(api): State<Api>, caller: Caller, path: EntryPath) -> Answer {
    caller.require_administrator()?;
    let (vhost, user, _) = path_parts(path);
    let entries = entries_of(&api, &vhost, &user).map_err(|_| ApiError::object_not_found())?;
    Ok(Json(entries.iter().map(|entry| user_first(entry)).collect::<Vec<_>>()).into_response())
}

pub(super) async fn put_topic_permission(State(api): State<Api>, caller: Caller, path: EntryPath, body: Bytes) -> Answer {
    caller.require_administrator()?;
    let (vhost, user, _) = path_parts(path);
    let created = match entries_of(&api, &vhost, &user) {
        Err(true) => return Err(ApiError::bad_request("vhost_or_user_not_found")),
        Err(false) => true,
        Ok(_) => false,
    };
    let body = body_json(&body).map_err(|_| ApiError::bad_request("not_json"))?;
    let field = |key: &str| body.get(key).map(|value| value.as_str().map_or_else(|| value.to_string(), str::to_string));
    let missing: Vec<String> =
        ["exchange", "write", "read"].iter().filter(|key| body.get(**key).is_none()).map(|key| format!("{{key_missing,{key}}}")).collect();
    if !missing.is_empty() {
        return Err(ApiError::bad_request(format!("[{}]", missing.join(","))));
    }
    let [exchange, write, read] = ["exchange", "write", "read"].map(|key| field(key).unwrap_or_default());
    let permission =
        TopicPermission::new(&user, &vhost, &exchange, &write, &read).map_err(|error| ApiError::bad_request(error.to_string()))?;
    api.broker.put_topic_permission(permission)?;
    Ok(if created { StatusCode::CREATED } else { StatusCode::NO_CONTENT }.into_response())
}

pub(super) async fn delete_topic_permission(State(api): State<Api>, caller: Caller, path: EntryPath) -> Answer {
    caller.require_administrator()?;
    let (vhost, user, exchange) = path_parts(path);
    entries_of(&api, &vhost, &user).map_err(|_| ApiError::object_not_found())?;
    api.broker.delete_topic_permissions(&user, &vhost, exchange.as_deref())?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
