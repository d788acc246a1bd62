//! rabbitmqctl's topic permission commands: `set_topic_permissions [-p VHOST] USER EXCHANGE WRITE
//! READ`, `clear_topic_permissions [-p VHOST] USER [EXCHANGE]`, `list_topic_permissions [-p VHOST]`
//! and `list_user_topic_permissions USER`, with rabbitmqctl 3.10.8's banners (on stderr, left out
//! by `-q`), rows and exit codes: a missing user is 67, a missing vhost 69 (65 when listing a
//! vhost's), an expression that does not compile 69.

use super::client::{Client, CtlError};
use super::listing::{print_json, print_table};
use super::{CtlArguments, Formatter};
use crate::url_path::encode_segment;
use serde_json::{json, Map, Value};

/// The user must exist (EX_NOUSER otherwise), as rabbitmqctl checks it first.
fn require_user(client: &Client, user: &str) -> Result<(), CtlError> {
    match client.get_json(&format!("/users/{}", encode_segment(user))) {
        Err(CtlError::NotFound(_)) => Err(CtlError::NoUser(format!("User {user} does not exist"))),
        other => other.map(drop),
    }
}

/// The vhost must exist (EX_UNAVAILABLE otherwise).
fn require_vhost(client: &Client, vhost: &str) -> Result<(), CtlError> {
    match client.get_json(&format!("/vhosts/{}", encode_segment(vhost))) {
        Err(CtlError::NotFound(_)) => Err(CtlError::Unavailable(format!("Virtual host {vhost} does not exist"))),
        other => other.map(drop),
    }
}

fn entry_path(vhost: &str, user: &str, exchange: Option<&str>) -> String {
    let path = format!("/topic-permissions/{}/{}", encode_segment(vhost), encode_segment(user));
    match exchange {
        Some(exchange) => format!("{path}/{}", encode_segment(exchange)),
        None => path,
    }
}

/// A change's outcome: nothing more for tables (the banner said it), rabbitmqctl's object for json.
fn report_done(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    if arguments.formatter == Formatter::Json {
        println!("{}", json!({"node": client.node()?, "result": "ok"}));
    }
    Ok(())
}

/// `set_topic_permissions USER EXCHANGE WRITE READ` in the vhost.
pub fn set(client: &Client, arguments: &CtlArguments, user: &str, exchange: &str, write: &str, read: &str) -> Result<(), CtlError> {
    let vhost = arguments.vhost();
    arguments.inform(&format!("Setting topic permissions on \"{exchange}\" for user \"{user}\" in vhost \"{vhost}\" ..."));
    require_user(client, user)?;
    require_vhost(client, vhost)?;
    let body = json!({"exchange": exchange, "write": write, "read": read}).to_string();
    match client.request("PUT", &entry_path(vhost, user, None), Some(&body), &[]) {
        // rabbitmqctl exits 69 for an expression that does not compile.
        Err(CtlError::DataError(message)) => return Err(CtlError::Unavailable(message)),
        other => other?,
    };
    report_done(client, arguments)
}

/// `clear_topic_permissions USER [EXCHANGE]` in the vhost; clearing what is not there succeeds.
pub fn clear(client: &Client, arguments: &CtlArguments, user: &str, exchange: Option<&str>) -> Result<(), CtlError> {
    let vhost = arguments.vhost();
    match exchange {
        Some(exchange) => {
            arguments.inform(&format!("Clearing topic permissions on \"{exchange}\" for user \"{user}\" in vhost \"{vhost}\" ..."))
        }
        None => arguments.inform(&format!("Clearing topic permissions for user \"{user}\" in vhost \"{vhost}\" ...")),
    }
    require_user(client, user)?;
    require_vhost(client, vhost)?;
    match client.request("DELETE", &entry_path(vhost, user, exchange), None, &[]) {
        Err(CtlError::NotFound(_)) => {}
        other => other.map(drop)?,
    }
    report_done(client, arguments)
}

/// Rows of `columns` taken from the API's objects.
fn rows_of(items: &Value, columns: &[&str]) -> Vec<Map<String, Value>> {
    let items = items.as_array().map(Vec::as_slice).unwrap_or_default();
    items
        .iter()
        .map(|item| columns.iter().map(|column| (column.to_string(), item.get(*column).cloned().unwrap_or(Value::Null))).collect())
        .collect()
}

fn print(arguments: &CtlArguments, columns: &[&str], rows: &[Map<String, Value>], headers: bool) {
    match arguments.formatter {
        Formatter::Json => print_json(rows),
        Formatter::Table => print_table(columns, rows, headers && !arguments.no_table_headers),
    }
}

/// `list_topic_permissions`: the vhost's entries (user, exchange, write, read).
pub fn list(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let vhost = arguments.vhost();
    arguments.inform(&format!("Listing topic permissions for vhost \"{vhost}\" ..."));
    let items = match client.get_json(&format!("/vhosts/{}/topic-permissions", encode_segment(vhost))) {
        Err(CtlError::NotFound(_)) => return Err(CtlError::DataError(format!("Virtual host '{vhost}' does not exist"))),
        other => other?,
    };
    let columns = ["user", "exchange", "write", "read"];
    print(arguments, &columns, &rows_of(&items, &columns), true);
    Ok(())
}

/// `list_user_topic_permissions USER`: the user's entries (vhost, exchange, write, read).
/// rabbitmqctl 3.10.8 prints this table without its header line.
pub fn list_of_user(client: &Client, arguments: &CtlArguments, user: &str) -> Result<(), CtlError> {
    arguments.inform(&format!("Listing topic permissions for user \"{user}\" ..."));
    let items = match client.get_json(&format!("/users/{}/topic-permissions", encode_segment(user))) {
        Err(CtlError::NotFound(_)) => return Err(CtlError::Unavailable(format!("User {user} does not exist"))),
        other => other?,
    };
    let columns = ["vhost", "exchange", "write", "read"];
    print(arguments, &columns, &rows_of(&items, &columns), false);
    Ok(())
}
