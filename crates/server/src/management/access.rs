//! Who may see and do what through the API, as RabbitMQ's management plugin decides it:
//! - `administrator` and `monitoring` users see every vhost; other management users see only the
//!   vhosts they have permissions in, and only their own connections and channels;
//! - any operation inside a vhost (declare, delete, bind, publish, get, purge) needs a permission
//!   in that vhost, whatever the user's tags, and the same configure/write/read expressions an
//!   AMQP client of that user would need;
//! - users, permissions and definitions are for administrators.

use super::{Api, ApiError};
use crate::auth::{Access, Permission};
use axum::extract::{FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::request::Parts;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// The authenticated caller of a request, with what their tags and permissions allow.
#[derive(Clone, Debug)]
pub struct Caller {
    /// User name.
    pub name: String,
    /// Tagged `administrator`.
    pub administrator: bool,
    /// Tagged `policymaker`.
    pub policymaker: bool,
    /// Sees every vhost (administrator or monitoring).
    pub sees_all: bool,
    permissions: Vec<Arc<Permission>>,
}

/// How a listing's items are matched against what a caller may see.
#[derive(Debug, Clone, Copy)]
pub enum Visibility {
    /// By the item's `vhost`.
    InVhost,
    /// By the item's `name` (the item is a vhost).
    Vhost,
    /// The caller's own connections and channels (by the item's `user`).
    OwnConnection,
}

fn not_authorised_in_vhost() -> ApiError {
    ApiError::unauthorised("User not authorised to access virtual host")
}

impl Caller {
    /// The caller as the users and permissions are now.
    pub fn new(api: &Api, name: &str) -> Caller {
        let user = api.broker.users.get(name);
        let tagged = |tag: &str| user.as_ref().is_some_and(|user| user.has_tag(tag));
        Caller {
            name: name.to_string(),
            administrator: tagged("administrator"),
            policymaker: tagged("policymaker"),
            sees_all: tagged("administrator") || tagged("monitoring"),
            permissions: api.broker.permissions.list().into_iter().filter(|permission| permission.user == name).collect(),
        }
    }

    /// 401 unless the caller is an administrator.
    pub fn require_administrator(&self) -> Result<(), ApiError> {
        if self.administrator {
            Ok(())
        } else {
            Err(ApiError::unauthorised("Not administrator user"))
        }
    }

    /// The caller's permission in `vhost`, or 401.
    pub fn permission(&self, vhost: &str) -> Result<&Permission, ApiError> {
        self.permissions.iter().find(|permission| permission.vhost == vhost).map(Arc::as_ref).ok_or_else(not_authorised_in_vhost)
    }

    /// 401 unless the caller may see objects of `vhost`.
    pub fn require_visible(&self, vhost: &str) -> Result<(), ApiError> {
        if self.sees_all {
            return Ok(());
        }
        self.permission(vhost).map(|_| ())
    }

    /// 401 unless the caller may have `access` to the `kind` resource `name` in `vhost`, with the
    /// text an AMQP client of the same user would get.
    pub fn require(&self, vhost: &str, access: Access, kind: &str, name: &str) -> Result<(), ApiError> {
        self.permission(vhost)?.check(access, kind, name.as_bytes()).map_err(ApiError::from)
    }

    /// 401 "Access refused." unless the caller may have `access` to the `kind` resource `name` in
    /// `vhost`: RabbitMQ's management plugin makes this check itself, without the AMQP text, before
    /// it declares, deletes, binds or purges.
    pub fn require_managed(&self, vhost: &str, access: Access, kind: &str, name: &str) -> Result<(), ApiError> {
        self.permission(vhost)?.check(access, kind, name.as_bytes()).map_err(|_| ApiError::unauthorised("Access refused."))
    }

    /// For a publish, which RabbitMQ's management plugin runs as basic.publish on a channel: the
    /// channel's 403 comes back as 400 "403 ACCESS_REFUSED - ...".
    pub fn require_for_publish(&self, vhost: &str, kind: &str, name: &str) -> Result<(), ApiError> {
        self.permission(vhost)?
            .check(Access::Write, kind, name.as_bytes())
            .map_err(|error| ApiError::bad_request(format!("{} {}", error.code, error.text)))
    }

    /// The items of a listing the caller may see.
    pub fn visible(&self, items: Vec<Value>, visibility: Visibility) -> Vec<Value> {
        // As RabbitMQ 3.10: objects in a vhost are listed only for the vhosts the caller may log
        // in to, even for administrators and monitoring users, who see every vhost and connection.
        if self.sees_all && !matches!(visibility, Visibility::InVhost) {
            return items;
        }
        let field = |item: &Value, key: &str| item.get(key).and_then(Value::as_str).map(str::to_string).unwrap_or_default();
        items
            .into_iter()
            .filter(|item| match visibility {
                // A consumer names its vhost in its queue.
                Visibility::InVhost => {
                    let vhost = item.get("queue").map_or_else(|| field(item, "vhost"), |queue| field(queue, "vhost"));
                    self.permission(&vhost).is_ok()
                }
                Visibility::Vhost => self.permission(&field(item, "name")).is_ok(),
                Visibility::OwnConnection => field(item, "user") == self.name,
            })
            .collect()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Caller, ApiError> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| ApiError::unauthorised("Not_Authorized"))
    }
}

/// Routes with a `{vhost}` that administrators use on vhosts they need no permission in (creating
/// and deleting the vhost, granting permissions in it, importing definitions into it, setting its
/// limits, topic permissions).
const VHOST_ADMINISTRATION_ROUTES: [&str; 6] = [
    "/api/vhosts/{vhost}",
    "/api/permissions/{vhost}/{user}",
    "/api/topic-permissions/{vhost}/{user}",
    "/api/topic-permissions/{vhost}/{user}/{exchange}",
    "/api/definitions/{vhost}",
    "/api/vhost-limits/{vhost}/{name}",
];

/// Checks, for every route with a `{vhost}` in its path, that the caller may see it (reads) or
/// has a permission in it (changes), before the handler runs.
pub async fn authorize_vhost(
    State(api): State<Api>,
    matched: Option<MatchedPath>,
    parameters: Option<Path<HashMap<String, String>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(caller) = request.extensions().get::<Caller>() else {
        return ApiError::unauthorised("Not_Authorized").into_response();
    };
    let administration = matched.is_some_and(|matched| VHOST_ADMINISTRATION_ROUTES.contains(&matched.as_str()));
    // A vhost that does not exist is not a secret: the handler answers 404, as RabbitMQ does.
    let vhost = parameters
        .as_ref()
        .and_then(|Path(parameters)| parameters.get("vhost"))
        .filter(|vhost| !administration && api.broker.has_vhost(vhost));
    if let Some(vhost) = vhost {
        let allowed = if request.method() == Method::GET { caller.require_visible(vhost) } else { caller.permission(vhost).map(|_| ()) };
        if let Err(error) = allowed {
            return error.into_response();
        }
    }
    next.run(request).await
}
