//! Which handler answers which path of the management API (RabbitMQ's paths). Kept apart from
//! the handlers so that `routes.rs`, whose request helpers `vhosts.rs` and `definitions.rs` use,
//! does not import them back.

use super::overview::overview;
use super::routes::{
    alarms_check, aliveness_test, binding, binding_pair, bindings, channel, channels, close_connection, cluster_name, connection,
    connection_channels, connections, consumers, create_binding, declare_exchange, declare_queue, delete_binding, delete_exchange,
    delete_permission, delete_queue, delete_user, exchange, exchange_bindings_destination, exchange_bindings_source, exchanges,
    get_messages, permission, permissions, publish, purge_queue, put_permission, put_user, queue, queue_bindings, queues, user,
    user_permissions, users, vhost_bindings, vhost_channels, vhost_connections, vhost_consumers, vhost_exchanges, vhost_permissions,
    vhost_queues, whoami,
};
use super::{definitions, topic_permissions, vhosts, Api};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

/// Every route (authentication is layered on by the caller).
pub(super) fn router() -> Router<Api> {
    Router::new()
        .route("/api/overview", get(overview))
        .route("/api/cluster-name", get(cluster_name))
        .route("/api/nodes", get(super::cluster::nodes))
        .route("/api/nodes/{node}", get(super::cluster::node))
        .route("/api/lepus/cluster", get(super::cluster::status))
        .route("/api/lepus/cluster/join", post(super::cluster::join))
        .route("/api/lepus/cluster/leave", post(super::cluster::leave))
        .route("/api/lepus/cluster/nodes/{node}", axum::routing::delete(super::cluster::forget))
        .route("/api/extensions", get(|| async { Json(json!([])) }))
        .route("/api/whoami", get(whoami))
        .route("/api/lepus/environment", get(super::environment::environment))
        .route("/api/users", get(users))
        .route("/api/users/{user}", get(user).put(put_user).delete(delete_user))
        .route("/api/users/{user}/permissions", get(user_permissions))
        .route("/api/permissions/{vhost}/{user}", get(permission).put(put_permission).delete(delete_permission))
        .route("/api/permissions", get(permissions))
        .route("/api/topic-permissions", get(topic_permissions::topic_permissions))
        .route("/api/vhosts/{vhost}/topic-permissions", get(topic_permissions::vhost_topic_permissions))
        .route("/api/users/{user}/topic-permissions", get(topic_permissions::user_topic_permissions))
        .route(
            "/api/topic-permissions/{vhost}/{user}",
            get(topic_permissions::topic_permission)
                .put(topic_permissions::put_topic_permission)
                .delete(topic_permissions::delete_topic_permission),
        )
        .route(
            "/api/topic-permissions/{vhost}/{user}/{exchange}",
            get(topic_permissions::topic_permission)
                .put(topic_permissions::put_topic_permission)
                .delete(topic_permissions::delete_topic_permission),
        )
        .route("/api/vhosts", get(vhosts::vhosts))
        .route("/api/vhosts/{vhost}", get(vhosts::vhost).put(vhosts::put_vhost).delete(vhosts::delete_vhost))
        .route("/api/policies", get(vhosts::policies))
        .route("/api/policies/{vhost}", get(vhosts::vhost_policies))
        .route("/api/policies/{vhost}/{name}", get(vhosts::policy).put(vhosts::put_policy).delete(vhosts::delete_policy))
        .route("/api/vhost-limits", get(vhosts::all_vhost_limits))
        .route("/api/vhost-limits/{vhost}", get(vhosts::vhost_limits))
        .route("/api/vhost-limits/{vhost}/{name}", axum::routing::put(vhosts::put_vhost_limit).delete(vhosts::delete_vhost_limit))
        .route("/api/operator-policies", get(vhosts::operator_policies))
        .route("/api/operator-policies/{vhost}", get(vhosts::vhost_operator_policies))
        .route(
            "/api/operator-policies/{vhost}/{name}",
            get(vhosts::operator_policy).put(vhosts::put_operator_policy).delete(vhosts::delete_operator_policy),
        )
        .route("/api/vhosts/{vhost}/permissions", get(vhost_permissions))
        .route("/api/aliveness-test/{vhost}", get(aliveness_test))
        .route("/api/healthchecks/node", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/api/health/checks/alarms", get(alarms_check))
        .route("/api/connections", get(connections))
        .route("/api/connections/{name}", get(connection).delete(close_connection))
        .route("/api/vhosts/{vhost}/connections", get(vhost_connections))
        .route("/api/channels", get(channels))
        .route("/api/channels/{name}", get(channel))
        .route("/api/vhosts/{vhost}/channels", get(vhost_channels))
        .route("/api/connections/{name}/channels", get(connection_channels))
        .route("/api/consumers", get(consumers))
        .route("/api/consumers/{vhost}", get(vhost_consumers))
        .route("/api/exchanges", get(exchanges))
        .route("/api/exchanges/{vhost}", get(vhost_exchanges))
        .route("/api/exchanges/{vhost}/{name}", get(exchange).put(declare_exchange).delete(delete_exchange))
        .route("/api/exchanges/{vhost}/{name}/bindings/source", get(exchange_bindings_source))
        .route("/api/exchanges/{vhost}/{name}/bindings/destination", get(exchange_bindings_destination))
        .route("/api/exchanges/{vhost}/{name}/publish", post(publish))
        .route("/api/queues", get(queues))
        .route("/api/queues/{vhost}", get(vhost_queues))
        .route("/api/queues/{vhost}/{name}", get(queue).put(declare_queue).delete(delete_queue))
        .route("/api/queues/{vhost}/{name}/bindings", get(queue_bindings))
        .route("/api/queues/{vhost}/{name}/contents", axum::routing::delete(purge_queue))
        .route("/api/queues/{vhost}/{name}/get", post(get_messages))
        .route("/api/queues/quorum/{vhost}/{name}/replicas/add", post(super::quorum_members::add_member))
        .route("/api/queues/quorum/{vhost}/{name}/replicas/delete", axum::routing::delete(super::quorum_members::delete_member))
        .route("/api/queues/quorum/replicas/on/{node}/grow", post(super::quorum_members::grow))
        .route("/api/queues/quorum/replicas/on/{node}/shrink", axum::routing::delete(super::quorum_members::shrink))
        .route("/api/bindings", get(bindings))
        .route("/api/bindings/{vhost}", get(vhost_bindings))
        .route("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", get(binding_pair).post(create_binding))
        .route("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", get(binding).delete(delete_binding))
        .route("/api/definitions", get(definitions::export_all).post(definitions::import_all))
        .route("/api/definitions/{vhost}", get(definitions::export_vhost).post(definitions::import_vhost))
}
