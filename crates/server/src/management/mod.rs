//! The management HTTP API, shaped like RabbitMQ 3.10's (`rabbitmq_management`), so operators'
//! tools (`rabbitmqadmin`, scripts against `/api/...`, monitoring checks) work against Lepus. See
//! docs/management.md for the endpoints and what differs from RabbitMQ.
//!
//! Every route needs HTTP basic auth with a broker user (the AMQP rules apply: `guest` only from
//! loopback). Errors are JSON `{"error": ..., "reason": ...}` with RabbitMQ's status codes.

mod access;
mod cluster;
mod console;
mod definitions;
mod definitions_import;
mod environment;
mod history;
mod json;
mod overview;
mod quorum_members;
mod rates;
mod router;
mod routes;
mod topic_permissions;
mod vhosts;

use crate::broker::Broker;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use broker_core::AmqpError;
use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::sync::Arc;

/// The largest request body accepted (definitions files, published payloads), in bytes.
pub const REQUEST_BODY_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The most messages one "get messages" request may take.
pub const GET_MESSAGES_MAX: usize = 10_000;
/// The RabbitMQ version the API's shape follows (reported as `management_version`).
pub const RABBITMQ_API_VERSION: &str = "3.10.8";

/// What every handler shares.
#[derive(Clone)]
pub struct Api {
    broker: Arc<Broker>,
    rates: Arc<rates::Rates>,
    started: std::time::Instant,
    node: String,
}

impl Api {
    fn new(broker: Arc<Broker>) -> Api {
        let node = broker.config.cluster.node_name.clone();
        Api { broker, rates: Arc::new(rates::Rates::default()), started: std::time::Instant::now(), node }
    }
}

/// This node's name, `lepus@HOSTNAME` (RabbitMQ's is `rabbit@HOSTNAME`).
pub fn node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|name| name.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "localhost".to_string() } else { host };
    format!("lepus@{host}")
}

/// The API's router, one for the HTTP and the HTTPS listener, and the message-rate sampling in the
/// background that both show.
pub fn app(broker: Arc<Broker>) -> axum::Router {
    let api = Api::new(broker);
    tokio::spawn(rates::sample_forever(api.broker.clone(), api.rates.clone()));
    router::router()
        .route_layer(axum::middleware::from_fn_with_state(api.clone(), access::authorize_vhost))
        .route_layer(axum::middleware::from_fn_with_state(api.clone(), authenticate))
        // The web console's static files, outside the authentication layer (the page logs in).
        .merge(console::router())
        .fallback(|| async { ApiError::object_not_found() })
        .layer(DefaultBodyLimit::max(REQUEST_BODY_BYTES_MAX))
        .with_state(api)
}

/// Serves the API over plain HTTP on `listener` forever.
pub async fn serve(app: axum::Router, listener: tokio::net::TcpListener) {
    if let Err(error) = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await {
        tracing::error!(%error, "the management HTTP API stopped");
    }
}

/// Serves the API over HTTPS on `listener` forever: each socket gets its TLS handshake in its own
/// task, then HTTP/1.1 on the TLS stream with the same router as plain HTTP.
pub async fn serve_tls(app: axum::Router, listener: tokio::net::TcpListener, acceptor: tokio_rustls::TlsAcceptor) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: keep serving the others.
                tracing::warn!(%error, "management HTTPS: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let app = app.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Some((stream, _)) = crate::tls::accept(&acceptor, stream, peer, "management HTTPS").await else { return };
            // The authentication layer reads the client's address as plain HTTP gives it.
            let app = tower::ServiceExt::map_request(app, with_connect_info(peer));
            let service = hyper_util::service::TowerToHyperService::new(app);
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).await {
                tracing::debug!(%peer, %error, "management HTTPS connection ended");
            }
        });
    }
}

/// Adds the client's address to a request, as `into_make_service_with_connect_info` does for plain
/// HTTP, for the authentication layer (`guest` only from loopback).
fn with_connect_info<B>(peer: SocketAddr) -> impl Fn(axum::http::Request<B>) -> axum::http::Request<B> + Clone {
    move |mut request| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    }
}

/// The tags that let a user into the management API (RabbitMQ's).
const MANAGEMENT_TAGS: [&str; 4] = ["administrator", "monitoring", "management", "policymaker"];

/// HTTP basic auth against the broker's users.
async fn authenticate(State(api): State<Api>, ConnectInfo(peer): ConnectInfo<SocketAddr>, mut request: Request, next: Next) -> Response {
    let credentials = request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).and_then(parse_basic_auth);
    let Some((user, password)) = credentials else {
        return ApiError::unauthorised("Not_Authorized").into_response();
    };
    let now = std::time::Instant::now();
    let login = match api.broker.login_throttle.admit(peer.ip(), now) {
        crate::login_throttle::Admission::Check => api.broker.users.check_password(&user, &password, peer.ip()),
        crate::login_throttle::Admission::RefuseUnchecked => Err(crate::auth::LoginError::Throttled),
    };
    match login {
        Ok(name) => {
            // As RabbitMQ: only users tagged for management may use the API at all.
            let tagged = api.broker.users.get(&name).is_some_and(|user| MANAGEMENT_TAGS.iter().any(|tag| user.has_tag(tag)));
            if !tagged {
                return ApiError::unauthorised("Not management user").into_response();
            }
            request.extensions_mut().insert(access::Caller::new(&api, &name));
            next.run(request).await
        }
        Err(error) => {
            tracing::info!(%error, %peer, "management API login failed");
            // Rate limiting, as for AMQP logins: the answer waits its turn.
            if !matches!(error, crate::auth::LoginError::Throttled) {
                tokio::time::sleep(api.broker.login_throttle.record_failure(peer.ip(), now)).await;
            }
            // RabbitMQ spells this one error "not_authorized", unlike its other 401s.
            ApiError { status: StatusCode::UNAUTHORIZED, error: "not_authorized", reason: "Login failed".to_string(), problems: Vec::new() }
                .into_response()
        }
    }
}

/// `Basic base64(user:password)` -> (user, password).
fn parse_basic_auth(value: &str) -> Option<(String, String)> {
    use base64::Engine;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// An error answer: `{"error": error, "reason": reason}` with a status code.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    error: &'static str,
    reason: String,
    /// Each problem found, when there were several (a definitions import lists them all).
    problems: Vec<String>,
}

impl ApiError {
    /// The same error, listing its problems one by one in a `problems` field.
    fn with_problems(self, problems: Vec<String>) -> ApiError {
        ApiError { problems, ..self }
    }

    /// 404 for a path or object that does not exist, worded as RabbitMQ words it.
    fn object_not_found() -> ApiError {
        ApiError { status: StatusCode::NOT_FOUND, error: "Object Not Found", reason: "Not Found".to_string(), problems: Vec::new() }
    }

    /// 400 with a reason.
    fn bad_request(reason: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, error: "bad_request", reason: reason.into(), problems: Vec::new() }
    }

    /// 401.
    fn unauthorised(reason: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::UNAUTHORIZED, error: "not_authorised", reason: reason.into(), problems: Vec::new() }
    }

    /// 500.
    fn internal(reason: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, error: "internal_server_error", reason: reason.into(), problems: Vec::new() }
    }
}

impl From<AmqpError> for ApiError {
    /// As RabbitMQ's management plugin maps a channel error of the operation it ran: 404 stays
    /// not found, 403 becomes 401 not_authorised, anything else is 400 with "CODE TEXT".
    fn from(error: AmqpError) -> ApiError {
        match error.code {
            404 => ApiError { status: StatusCode::NOT_FOUND, error: "not_found", reason: error.text, problems: Vec::new() },
            403 => ApiError::unauthorised(error.text),
            541 => ApiError::internal(error.text),
            code => ApiError::bad_request(format!("{code} {}", error.text)),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.error, "reason": self.reason});
        if !self.problems.is_empty() {
            body["problems"] = json!(self.problems);
        }
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"RabbitMQ Management\""));
        }
        response
    }
}

/// The listing query parameters RabbitMQ's API takes: `columns`, `sort`, `sort_reverse`, `name`
/// (with `use_regex` unsupported: a plain substring match), `page` and `page_size`.
#[derive(Debug, Default, serde::Deserialize)]
struct ListQuery {
    columns: Option<String>,
    sort: Option<String>,
    sort_reverse: Option<String>,
    name: Option<String>,
    page: Option<String>,
    page_size: Option<String>,
}

/// The value at a dotted path (`message_stats.publish`).
fn lookup<'a>(item: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(item, |value, key| value.get(key))
}

fn sort_key(value: Option<&Value>) -> (u8, f64, String) {
    match value {
        None | Some(Value::Null) => (0, 0.0, String::new()),
        Some(Value::Number(number)) => (1, number.as_f64().unwrap_or(0.0), String::new()),
        Some(Value::String(text)) => (2, 0.0, text.clone()),
        Some(other) => (3, 0.0, other.to_string()),
    }
}

/// Applies a [`ListQuery`] to a listing and answers it.
fn list_response(mut items: Vec<Value>, query: &ListQuery) -> Result<Response, ApiError> {
    let total_count = items.len();
    if let Some(name) = query.name.as_deref().filter(|name| !name.is_empty()) {
        items.retain(|item| item.get("name").and_then(Value::as_str).is_some_and(|text| text.contains(name)));
    }
    if let Some(sort) = query.sort.as_deref().filter(|sort| !sort.is_empty()) {
        items.sort_by(|a, b| sort_key(lookup(a, sort)).partial_cmp(&sort_key(lookup(b, sort))).unwrap_or(std::cmp::Ordering::Equal));
    }
    if query.sort_reverse.as_deref() == Some("true") {
        items.reverse();
    }
    if let Some(columns) = query.columns.as_deref().filter(|columns| !columns.is_empty()) {
        let columns: Vec<&str> = columns.split(',').map(str::trim).filter(|column| !column.is_empty()).collect();
        items = items.iter().map(|item| select_columns(item, &columns)).collect();
    }
    if query.page.is_none() {
        return Ok(Json(Value::Array(items)).into_response());
    }
    let page: usize = parse_positive(query.page.as_deref(), "page", 1)?;
    let page_size: usize = parse_positive(query.page_size.as_deref(), "page_size", 100)?.min(500);
    let filtered_count = items.len();
    let page_count = filtered_count.div_ceil(page_size).max(1);
    if page > page_count {
        return Err(ApiError::bad_request(format!("page out of range, page: {page} page size: {page_size}, len: {filtered_count}")));
    }
    let items: Vec<Value> = items.into_iter().skip((page - 1) * page_size).take(page_size).collect();
    Ok(Json(json!({
        "filtered_count": filtered_count,
        "item_count": items.len(),
        "items": items,
        "page": page,
        "page_count": page_count,
        "page_size": page_size,
        "total_count": total_count,
    }))
    .into_response())
}

fn parse_positive(text: Option<&str>, what: &str, default: usize) -> Result<usize, ApiError> {
    match text {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(value) if value > 0 => Ok(value),
            _ => Err(ApiError::bad_request(format!("{what} must be a positive integer"))),
        },
    }
}

/// Keeps only `columns` (dotted paths) of an object.
fn select_columns(item: &Value, columns: &[&str]) -> Value {
    let mut selected = Value::Object(Map::new());
    for column in columns {
        let Some(value) = lookup(item, column) else { continue };
        let mut target = &mut selected;
        let parts: Vec<&str> = column.split('.').collect();
        for (index, part) in parts.iter().enumerate() {
            let Value::Object(map) = target else { break };
            if index + 1 == parts.len() {
                map.insert((*part).to_string(), value.clone());
                break;
            }
            target = map.entry((*part).to_string()).or_insert_with(|| Value::Object(Map::new()));
        }
    }
    selected
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_parses() {
        assert_eq!(parse_basic_auth("Basic Z3Vlc3Q6Z3Vlc3Q="), Some(("guest".to_string(), "guest".to_string())));
        assert_eq!(parse_basic_auth("Bearer abc"), None);
        assert_eq!(parse_basic_auth("Basic !!!"), None);
    }

    #[test]
    fn columns_keep_dotted_paths() {
        let item = json!({"name": "q", "messages": 3, "message_stats": {"publish": 5, "ack": 1}});
        assert_eq!(select_columns(&item, &["name", "message_stats.publish"]), json!({"name": "q", "message_stats": {"publish": 5}}));
    }
}
