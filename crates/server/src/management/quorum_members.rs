//! Quorum shard membership by hand over HTTP: add and delete a queue's member, grow and shrink a
//! node everywhere, as `rabbitmq-queues add_member`, `delete_member`, `grow` and `shrink` do.
//! These paths are Lepus's: RabbitMQ 3.10.8's management plugin serves none of them (measured:
//! they fall to its static-file route, which answers POST and DELETE with 405), so their answers
//! follow Lepus's API and `rabbit_quorum_queue`'s outcomes (docs/management.md). A quorum
//! queue's members are those of its shard, which many queues share: adding or deleting a member
//! acts on the whole shard, and the answer says which shard and which queues it holds
//! (docs/cluster.md).

use super::access::Caller;
use super::routes::{body_json, find_queue, Answer};
use super::{Api, ApiError};
use crate::cluster::{ShardRoleError, ShardSelection};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::Json;
use broker_core::vhost::QueueType;
use replication::transport::ShardId;
use serde_json::{json, Value};

impl From<ShardRoleError> for ApiError {
    fn from(error: ShardRoleError) -> ApiError {
        match error {
            ShardRoleError::UnknownNode(_) => {
                ApiError { status: axum::http::StatusCode::NOT_FOUND, error: "not_found", ..ApiError::bad_request(error.to_string()) }
            }
            ShardRoleError::NotCommitted(_) | ShardRoleError::Pending { .. } => ApiError::internal(error.to_string()),
            _ => ApiError::bad_request(error.to_string()),
        }
    }
}

/// Runs a role change off the async workers (it waits for commits) and answers the shards it
/// acted on, with the quorum queues each holds.
async fn change(api: Api, node: String, selection: ShardSelection, voter: bool) -> Answer {
    let changed = match api.broker.cluster.get().cloned() {
        Some(cluster) => tokio::task::spawn_blocking(move || cluster.choose_shard_role(&node, selection, voter))
            .await
            .map_err(|error| ApiError::internal(error.to_string()))??,
        None => unclustered_role(&api, &node, selection, voter)?,
    };
    let queues = api.broker.list_queues();
    let shards: Vec<Value> = changed
        .iter()
        .map(|shard| {
            let names: Vec<&str> = queues
                .iter()
                .filter(|queue| {
                    queue.queue_type == QueueType::Quorum && api.broker.quorum.shard_of_queue(&queue.vhost, &queue.name) == *shard
                })
                .map(|queue| queue.name.as_str())
                .collect();
            json!({"shard": shard, "queues": names})
        })
        .collect();
    Ok(Json(json!({"shards": shards})).into_response())
}

/// A node started without `--cluster-port` is the one voter of each of its shards. It answers as
/// a clustered node would, and as RabbitMQ 3.10.8's `rabbit_quorum_queue` does on a single node
/// (measured with `rabbitmq-queues`): making it a voter again succeeds and changes nothing
/// (`add_member` of a member is `ok`), it cannot stop voting (`last_node`), and another node is
/// not a member (RabbitMQ: `node_not_running`).
fn unclustered_role(api: &Api, node: &str, selection: ShardSelection, voter: bool) -> Result<Vec<ShardId>, ShardRoleError> {
    if node != api.node {
        return Err(ShardRoleError::UnknownNode(node.to_string()));
    }
    // The node is the one voter of each shard, whatever members its shards list (none, alone).
    let shards: Vec<ShardId> =
        (0..api.broker.quorum.shard_member_ids().len() as ShardId).filter(|shard| selection.takes(*shard, 1)).collect();
    match shards.first() {
        Some(&shard) if !voter => Err(ShardRoleError::LastVoter { node: node.to_string(), shard }),
        _ => Ok(shards),
    }
}

fn node_of(body: &Bytes) -> Result<String, ApiError> {
    let body = body_json(body)?;
    body.get("node").and_then(Value::as_str).map(str::to_string).ok_or_else(|| ApiError::bad_request("[{key_missing,node}]"))
}

/// The shard of quorum queue `name` in `vhost` (404 when there is no such queue, 400 when it is
/// not a quorum queue).
fn queue_shard(api: &Api, vhost: &str, name: &str) -> Result<ShardSelection, ApiError> {
    let queue = find_queue(api, vhost, name)?;
    if queue.queue_type != QueueType::Quorum {
        return Err(ApiError::bad_request(format!("queue '{name}' in vhost '{vhost}' is not a quorum queue")));
    }
    Ok(ShardSelection::One(api.broker.quorum.shard_of_queue(vhost, name)))
}

/// POST /api/queues/quorum/{vhost}/{name}/replicas/add `{"node": N}`: N votes in the queue's shard.
pub(super) async fn add_member(State(api): State<Api>, caller: Caller, Path((vhost, name)): Path<(String, String)>, body: Bytes) -> Answer {
    caller.require_administrator()?;
    let selection = queue_shard(&api, &vhost, &name)?;
    change(api, node_of(&body)?, selection, true).await
}

/// DELETE /api/queues/quorum/{vhost}/{name}/replicas/delete `{"node": N}`: N stops voting in the
/// queue's shard (it stays a learner: every cluster member runs every shard).
pub(super) async fn delete_member(
    State(api): State<Api>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: Bytes,
) -> Answer {
    caller.require_administrator()?;
    let selection = queue_shard(&api, &vhost, &name)?;
    change(api, node_of(&body)?, selection, false).await
}

/// POST /api/queues/quorum/replicas/on/{node}/grow `{"strategy": "all"|"even"}`: the node votes
/// in every shard (or those with an even number of voters). RabbitMQ's queue and vhost patterns
/// select queues; shards hold many, so only `.*` is taken.
pub(super) async fn grow(State(api): State<Api>, caller: Caller, Path(node): Path<String>, body: Bytes) -> Answer {
    caller.require_administrator()?;
    let body = if body.is_empty() { json!({}) } else { body_json(&body)? };
    for pattern in ["vhost_pattern", "queue_pattern"] {
        if body.get(pattern).and_then(Value::as_str).is_some_and(|value| value != ".*") {
            return Err(ApiError::bad_request(format!(
                "{pattern}: quorum queues share their shards' members, so grow acts on every shard; only \".*\" is taken"
            )));
        }
    }
    let selection = match body.get("strategy").and_then(Value::as_str).unwrap_or("all") {
        "all" => ShardSelection::All,
        "even" => ShardSelection::Even,
        other => return Err(ApiError::bad_request(format!("strategy '{other}': all or even"))),
    };
    change(api, node, selection, true).await
}

/// DELETE /api/queues/quorum/replicas/on/{node}/shrink: the node stops voting in every shard.
pub(super) async fn shrink(State(api): State<Api>, caller: Caller, Path(node): Path<String>) -> Answer {
    caller.require_administrator()?;
    change(api, node, ShardSelection::All, false).await
}
