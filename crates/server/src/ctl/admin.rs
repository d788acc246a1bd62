//! rabbitmqctl's user and vhost-limit commands that change one setting of an existing object:
//! `change_password`, `set_user_tags`, `clear_permissions`, `set_vhost_limits`,
//! `clear_vhost_limits`. Each reads what it must keep (a user's tags or hash) and writes the
//! object back through the management API, as rabbitmqctl's commands change one field.

use super::client::{Client, CtlError};
use crate::url_path::encode_segment;
use serde_json::{json, Value};

/// The vhost limits `set_vhost_limits` and `clear_vhost_limits` know (RabbitMQ 3.10's).
const VHOST_LIMIT_NAMES: [&str; 2] = ["max-connections", "max-queues"];

fn user_path(name: &str) -> String {
    format!("/users/{}", encode_segment(name))
}

/// A user as GET /api/users/NAME shows it; a missing user is rabbitmqctl's "no such user".
fn existing_user(client: &Client, name: &str) -> Result<Value, CtlError> {
    client.get_json(&user_path(name)).map_err(|error| match error {
        CtlError::NotFound(_) => CtlError::NoUser(format!("User \"{name}\" does not exist")),
        other => other,
    })
}

/// `change_password USER PASSWORD`: a new password, the tags kept.
pub fn change_password(client: &Client, name: &str, password: &str) -> Result<(), CtlError> {
    let user = existing_user(client, name)?;
    let body = json!({"password": password, "tags": user.get("tags").cloned().unwrap_or(Value::Null)});
    client.request("PUT", &user_path(name), Some(&body.to_string()), &[])?;
    println!("password of user '{name}' changed");
    Ok(())
}

/// `set_user_tags USER TAG...`: the tags replaced (none clears them), the password kept.
pub fn set_user_tags(client: &Client, name: &str, tags: &[String]) -> Result<(), CtlError> {
    let user = existing_user(client, name)?;
    let hash = user.get("password_hash").and_then(Value::as_str).unwrap_or_default();
    let algorithm = user.get("hashing_algorithm").and_then(Value::as_str).unwrap_or("rabbit_password_hashing_sha256");
    let body = json!({"password_hash": hash, "hashing_algorithm": algorithm, "tags": tags.join(",")});
    client.request("PUT", &user_path(name), Some(&body.to_string()), &[])?;
    println!("tags of user '{name}' set to [{}]", tags.join(", "));
    Ok(())
}

/// `clear_permissions USER` in the vhost: the user keeps its account, loses its access there.
pub fn clear_permissions(client: &Client, vhost: &str, user: &str) -> Result<(), CtlError> {
    client.request("DELETE", &format!("/permissions/{}/{}", encode_segment(vhost), encode_segment(user)), None, &[])?;
    println!("permissions of '{user}' in '{vhost}' cleared");
    Ok(())
}

/// `set_vhost_limits '{"max-connections": N, "max-queues": N}'`: the vhost's limits become
/// exactly these (a limit not named is lifted, a negative value lifts it), as rabbitmqctl does.
pub fn set_vhost_limits(client: &Client, vhost: &str, definition: &str) -> Result<(), CtlError> {
    let limits: Value = serde_json::from_str(definition).map_err(|error| CtlError::Usage(format!("the limits are not JSON: {error}")))?;
    let Some(limits) = limits.as_object().filter(|limits| !limits.is_empty()) else {
        return Err(CtlError::Usage(format!("the limits must be a JSON object naming {}", VHOST_LIMIT_NAMES.join(" or "))));
    };
    if let Some(unknown) = limits.keys().find(|name| !VHOST_LIMIT_NAMES.contains(&name.as_str())) {
        return Err(CtlError::Usage(format!("unknown vhost limit '{unknown}' (known: {})", VHOST_LIMIT_NAMES.join(", "))));
    }
    for name in VHOST_LIMIT_NAMES {
        let path = format!("/vhost-limits/{}/{}", encode_segment(vhost), name);
        match limits.get(name) {
            Some(value) => client.request("PUT", &path, Some(&json!({ "value": value }).to_string()), &[])?,
            None => client.request("DELETE", &path, None, &[])?,
        };
    }
    println!("limits of vhost '{vhost}' set");
    Ok(())
}

/// `clear_vhost_limits`: every limit of the vhost lifted.
pub fn clear_vhost_limits(client: &Client, vhost: &str) -> Result<(), CtlError> {
    for name in VHOST_LIMIT_NAMES {
        client.request("DELETE", &format!("/vhost-limits/{}/{}", encode_segment(vhost), name), None, &[])?;
    }
    println!("limits of vhost '{vhost}' cleared");
    Ok(())
}
