//! The cluster in the management API: `/api/nodes` lists every member with `running`, as
//! RabbitMQ's does, and `/api/lepus/cluster` is what `lepus ctl cluster ...` reads and asks
//! (status, join, leave, forget), which `rabbitmqctl` does over Erlang distribution instead.

use super::access::Caller;
use super::routes::{body_json, node_json, Answer};
use super::{list_response, Api, ApiError, ListQuery};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use broker_core::vhost::QueueType;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

/// Another member, as this node knows it.
fn member_json(member: &crate::cluster::MemberStatus) -> Value {
    json!({
        "name": member.name,
        "type": "disc",
        "running": member.running,
        "being_drained": false,
        "partitions": [],
        "cluster_links": [],
    })
}

/// Every node's answer: this one in full, the others as the cluster knows them.
fn nodes_json(api: &Api) -> Vec<Value> {
    let Some(cluster) = api.broker.cluster.get() else { return vec![node_json(api)] };
    cluster.members().iter().map(|member| if member.id == cluster.node_id { node_json(api) } else { member_json(member) }).collect()
}

/// GET /api/nodes.
pub(super) async fn nodes(State(api): State<Api>, Query(query): Query<ListQuery>) -> Answer {
    list_response(nodes_json(&api), &query)
}

/// GET /api/nodes/{node}.
pub(super) async fn node(State(api): State<Api>, Path(node): Path<String>) -> Answer {
    let found = nodes_json(&api).into_iter().find(|entry| entry.get("name").and_then(Value::as_str) == Some(node.as_str()));
    found.map(|entry| Json(entry).into_response()).ok_or_else(ApiError::object_not_found)
}

/// GET /api/lepus/cluster: the cluster's members and this node's view of its metadata group.
pub(super) async fn status(State(api): State<Api>) -> Answer {
    let Some(cluster) = api.broker.cluster.get() else {
        return Ok(Json(json!({
            "cluster_name": api.node,
            "clustered": false,
            "node": api.node,
            "members": [{"name": api.node, "running": true, "voter": true, "leader": true}],
        }))
        .into_response());
    };
    let view = cluster.group_view();
    let counters = cluster.link_counters();
    let members: Vec<Value> = cluster
        .members()
        .iter()
        .map(|member| {
            json!({
                "name": member.name,
                "id": format!("{:016x}", member.id),
                "address": member.address,
                "running": member.running,
                "voter": member.voter,
                "leader": member.leader,
            })
        })
        .collect();
    Ok(Json(json!({
        "cluster_name": cluster.settings.cluster_name,
        "cluster_id": format!("{:016x}", cluster.cluster_id()),
        "clustered": true,
        "member": cluster.is_member(),
        "node": cluster.node_name(),
        "node_id": format!("{:016x}", cluster.node_id),
        "members": members,
        "metadata": {
            "role": view.role,
            "term": view.term,
            "leader": view.leader.and_then(|leader| cluster.member_name(leader)),
            "commit_index": view.commit,
            "applied_index": view.applied,
            "last_index": view.last_index,
            // Joined nodes not caught up yet: promoted to voter once they hold the commit index.
            "learners": view.learners.iter().map(|id| cluster.member_name(*id)).collect::<Vec<_>>(),
            "elections": view.elections,
            "snapshot_index": view.snapshot_index,
            "snapshots_taken": view.snapshots_taken,
            "snapshots_installed": view.snapshots_installed,
            "snapshots_sent": view.snapshots_sent,
            "write_held": view.write_held,
            "matched_index": view.matched.iter().map(|(id, matched)| json!({"node": cluster.member_name(*id), "matched_index": matched})).collect::<Vec<_>>(),
        },
        "quorum_shards": quorum_shards_json(&api),
        "links": {
            "raft_messages_dropped": counters.raft_dropped.load(Ordering::Relaxed),
            "sends_refused": counters.sends_refused.load(Ordering::Relaxed),
            "handshakes_refused": counters.handshakes_refused.load(Ordering::Relaxed),
            "links_up": counters.links_up.load(Ordering::Relaxed),
            "links_timed_out": counters.links_timed_out.load(Ordering::Relaxed),
        },
    }))
    .into_response())
}

/// Every quorum shard's leader, voters and learners (a quorum queue's members are its shard's),
/// with the quorum queues it holds: the console's cluster page shows which queues share a shard.
fn quorum_shards_json(api: &Api) -> Vec<Value> {
    let shards = api.broker.quorum.shard_members();
    let mut queues_of_shard: Vec<Vec<Value>> = vec![Vec::new(); shards.len()];
    for queue in api.broker.list_queues().iter().filter(|queue| queue.queue_type == QueueType::Quorum) {
        let shard = api.broker.quorum.shard_of_queue(&queue.vhost, &queue.name) as usize;
        if let Some(queues) = queues_of_shard.get_mut(shard) {
            queues.push(json!({"vhost": queue.vhost, "name": queue.name}));
        }
    }
    shards
        .iter()
        .zip(queues_of_shard)
        .map(|(shard, queues)| {
            json!({
                "shard": shard.shard,
                "leader": shard.leader,
                "voters": shard.voters,
                "learners": shard.learners,
                "promotion_pending": shard.promotion_pending,
                "queues": queues,
            })
        })
        .collect()
}

fn cluster_of(api: &Api) -> Result<std::sync::Arc<crate::cluster::Cluster>, ApiError> {
    api.broker
        .cluster
        .get()
        .cloned()
        .ok_or_else(|| ApiError::bad_request("this node is not clustered (it was started without --cluster-port)"))
}

async fn run_blocking(work: impl FnOnce() -> Result<(), String> + Send + 'static) -> Answer {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(())) => Ok(StatusCode::NO_CONTENT.into_response()),
        Ok(Err(reason)) => Err(ApiError::bad_request(reason)),
        Err(error) => Err(ApiError::internal(error.to_string())),
    }
}

/// POST /api/lepus/cluster/join `{"address": "host:port"}`.
pub(super) async fn join(State(api): State<Api>, caller: Caller, body: Bytes) -> Answer {
    caller.require_administrator()?;
    let cluster = cluster_of(&api)?;
    let body = body_json(&body)?;
    let address = body.get("address").and_then(Value::as_str).ok_or_else(|| ApiError::bad_request("address (host:port) is required"))?;
    let address = address.to_string();
    run_blocking(move || cluster.join(&address)).await
}

/// POST /api/lepus/cluster/leave.
pub(super) async fn leave(State(api): State<Api>, caller: Caller) -> Answer {
    caller.require_administrator()?;
    let cluster = cluster_of(&api)?;
    run_blocking(move || cluster.leave()).await
}

/// DELETE /api/lepus/cluster/nodes/{node}: forgets a member that is not running.
pub(super) async fn forget(State(api): State<Api>, caller: Caller, Path(node): Path<String>) -> Answer {
    caller.require_administrator()?;
    let cluster = cluster_of(&api)?;
    run_blocking(move || cluster.forget(&node)).await
}
