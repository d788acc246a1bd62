//! `GET /api/lepus/environment`: the node's settings in force, as the configuration file names them.
//! RabbitMQ's API has no such route (`rabbitmqctl environment` reads a node's application
//! environment over Erlang distribution); `lepus ctl environment` and `report` read this one.
//! Administrators only: the settings name files and ports an operator may keep to themselves.

use super::access::Caller;
use super::routes::Answer;
use super::Api;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

pub(super) async fn environment(State(api): State<Api>, caller: Caller) -> Answer {
    caller.require_administrator()?;
    let settings = crate::settings::effective_settings_json(&api.broker.config);
    Ok(Json(json!({"node": api.node, "lepus": settings})).into_response())
}
