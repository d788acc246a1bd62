//! `lepus ctl list_*`: rabbitmqctl's info keys (columns) read from the management API's objects,
//! printed as rabbitmqctl prints them (tab-separated table, or a JSON array of objects).

use super::client::{Client, CtlError};
use super::{CtlArguments, Formatter};
use crate::url_path::encode_segment as segment;
use serde_json::{json, Map, Value};

/// What `lepus ctl list` lists.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Listing {
    Queues,
    Exchanges,
    Bindings,
    Connections,
    Channels,
    Consumers,
    Users,
    Vhosts,
    Permissions,
    Policies,
}

/// One info key: its name, and the dotted path of the API field that holds it.
type Key = (&'static str, &'static str);

impl Listing {
    /// The info keys Lepus can answer, first those rabbitmqctl shows by default.
    fn keys(self) -> (&'static [&'static str], &'static [Key]) {
        match self {
            Listing::Queues => (
                &["name", "messages"],
                &[
                    ("name", "name"),
                    ("messages", "messages"),
                    ("messages_ready", "messages_ready"),
                    ("messages_unacknowledged", "messages_unacknowledged"),
                    ("consumers", "consumers"),
                    ("durable", "durable"),
                    ("auto_delete", "auto_delete"),
                    ("exclusive", "exclusive"),
                    ("arguments", "arguments"),
                    ("policy", "policy"),
                    ("state", "state"),
                    ("type", "type"),
                    ("vhost", "vhost"),
                ],
            ),
            Listing::Exchanges => (
                &["name", "type"],
                &[
                    ("name", "name"),
                    ("type", "type"),
                    ("durable", "durable"),
                    ("auto_delete", "auto_delete"),
                    ("internal", "internal"),
                    ("arguments", "arguments"),
                    ("policy", "policy"),
                    ("vhost", "vhost"),
                ],
            ),
            Listing::Bindings => (
                &["source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments"],
                &[
                    ("source_name", "source"),
                    ("source_kind", "-exchange"),
                    ("destination_name", "destination"),
                    ("destination_kind", "destination_type"),
                    ("routing_key", "routing_key"),
                    ("arguments", "arguments"),
                    ("vhost", "vhost"),
                ],
            ),
            Listing::Connections => (
                &["user", "peer_host", "peer_port", "state"],
                &[
                    ("user", "user"),
                    ("peer_host", "peer_host"),
                    ("peer_port", "peer_port"),
                    ("state", "state"),
                    ("name", "name"),
                    ("vhost", "vhost"),
                    ("channels", "channels"),
                    ("protocol", "protocol"),
                    ("host", "host"),
                    ("port", "port"),
                    ("ssl", "ssl"),
                    ("frame_max", "frame_max"),
                    ("timeout", "timeout"),
                    ("client_properties", "client_properties"),
                    ("recv_oct", "recv_oct"),
                    ("recv_cnt", "recv_cnt"),
                    ("send_oct", "send_oct"),
                    ("send_cnt", "send_cnt"),
                    ("connected_at", "connected_at"),
                ],
            ),
            Listing::Channels => (
                &["pid", "user", "consumer_count", "messages_unacknowledged"],
                &[
                    ("pid", "name"),
                    ("name", "name"),
                    ("user", "user"),
                    ("consumer_count", "consumer_count"),
                    ("messages_unacknowledged", "messages_unacknowledged"),
                    ("vhost", "vhost"),
                    ("number", "number"),
                    ("confirm", "confirm"),
                    ("transactional", "transactional"),
                    ("prefetch_count", "prefetch_count"),
                ],
            ),
            Listing::Consumers => (
                &["queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active", "arguments"],
                &[
                    ("queue_name", "queue.name"),
                    ("channel_pid", "channel_details.name"),
                    ("consumer_tag", "consumer_tag"),
                    ("ack_required", "ack_required"),
                    ("prefetch_count", "prefetch_count"),
                    ("active", "active"),
                    ("arguments", "arguments"),
                    ("exclusive", "exclusive"),
                ],
            ),
            Listing::Users => (&["user", "tags"], &[("user", "name"), ("tags", "tags")]),
            Listing::Vhosts => {
                (&["name"], &[("name", "name"), ("description", "description"), ("tracing", "tracing"), ("messages", "messages")])
            }
            Listing::Permissions => (
                &["user", "configure", "write", "read"],
                &[("user", "user"), ("configure", "configure"), ("write", "write"), ("read", "read"), ("vhost", "vhost")],
            ),
            Listing::Policies => (
                &["vhost", "name", "pattern", "apply-to", "definition", "priority"],
                &[
                    ("vhost", "vhost"),
                    ("name", "name"),
                    ("pattern", "pattern"),
                    ("apply-to", "apply-to"),
                    ("definition", "definition"),
                    ("priority", "priority"),
                ],
            ),
        }
    }

    /// The API path that lists these objects; connections, channels, users and vhosts are
    /// node-wide in rabbitmqctl, the others belong to one vhost.
    fn path(self, vhost: &str) -> String {
        let vhost = segment(vhost);
        match self {
            Listing::Queues => format!("/queues/{vhost}"),
            Listing::Exchanges => format!("/exchanges/{vhost}"),
            Listing::Bindings => format!("/bindings/{vhost}"),
            Listing::Consumers => format!("/consumers/{vhost}"),
            Listing::Permissions => format!("/vhosts/{vhost}/permissions"),
            Listing::Policies => format!("/policies/{vhost}"),
            Listing::Connections => "/connections".to_string(),
            Listing::Channels => "/channels".to_string(),
            Listing::Users => "/users".to_string(),
            Listing::Vhosts => "/vhosts".to_string(),
        }
    }
}

/// rabbitmqctl's type name for an argument value in a table.
fn argument_type(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "longstr",
        Value::Bool(_) => "bool",
        Value::Number(number) if number.is_f64() => "double",
        Value::Number(_) => "long",
        Value::Array(_) => "array",
        Value::Object(_) => "table",
        Value::Null => "void",
    }
}

/// One info key's value: arguments as rabbitmqctl shows them (`[[name, type, value], ...]`).
fn value_of(item: &Value, key: &str, path: &str) -> Value {
    if let Some(constant) = path.strip_prefix('-') {
        return Value::String(constant.to_string());
    }
    let value = path.split('.').try_fold(item, |value, step| value.get(step)).cloned().unwrap_or(Value::Null);
    match (key, value) {
        ("arguments", Value::Object(arguments)) => {
            Value::Array(arguments.into_iter().map(|(name, value)| json!([name, argument_type(&value), value])).collect())
        }
        ("arguments", Value::Null) => json!([]),
        ("tags", Value::String(tags)) => Value::Array(tags.split(',').filter(|tag| !tag.is_empty()).map(|tag| json!(tag)).collect()),
        ("policy", Value::Null) => json!(""),
        (_, value) => value,
    }
}

/// Lists `listing` with the asked columns (its defaults when none).
pub fn list(client: &Client, arguments: &CtlArguments, listing: Listing, columns: &[String]) -> Result<(), CtlError> {
    let (wanted, rows) = rows(client, arguments.vhost(), listing, columns)?;
    match arguments.formatter {
        Formatter::Json => print_json(&rows),
        Formatter::Table => print_table(&wanted, &rows, !arguments.no_table_headers),
    }
    Ok(())
}

/// Every info key Lepus answers for `listing` (what `report` lists).
pub fn all_columns(listing: Listing) -> Vec<String> {
    listing.keys().1.iter().map(|(key, _)| (*key).to_owned()).collect()
}

/// The columns of a listing and its rows, one object of those columns each.
pub type Rows = (Vec<&'static str>, Vec<Map<String, Value>>);

/// The rows of `listing` in `vhost` with `columns` (the defaults when none), and the columns.
pub fn rows(client: &Client, vhost: &str, listing: Listing, columns: &[String]) -> Result<Rows, CtlError> {
    let (defaults, keys) = listing.keys();
    let mut wanted: Vec<&'static str> = Vec::new();
    let mut unknown: Vec<&str> = Vec::new();
    for column in columns {
        match keys.iter().find(|(key, _)| key == column) {
            Some((key, _)) => wanted.push(key),
            None => unknown.push(column),
        }
    }
    if !unknown.is_empty() {
        let known: Vec<&str> = keys.iter().map(|(key, _)| *key).collect();
        return Err(CtlError::Usage(format!("Info key(s) {} are not supported; these are: {}", unknown.join(","), known.join(", "))));
    }
    if columns.is_empty() {
        wanted = defaults.to_vec();
    }
    let items = match client.get_json(&listing.path(vhost))? {
        Value::Array(items) => items,
        single => vec![single],
    };
    let rows: Vec<Map<String, Value>> = items
        .iter()
        .map(|item| {
            wanted
                .iter()
                .filter_map(|column| keys.iter().find(|(key, _)| key == column))
                .map(|(key, path)| (key.to_string(), value_of(item, key, path)))
                .collect()
        })
        .collect();
    Ok((wanted, rows))
}

/// A JSON array laid out as rabbitmqctl lays it out: one object per line, commas leading.
pub fn print_json(rows: &[Map<String, Value>]) {
    println!("[");
    for (index, row) in rows.iter().enumerate() {
        let separator = if index == 0 { "" } else { "," };
        println!("{separator}{}", Value::Object(row.clone()));
    }
    println!("]");
}

pub fn print_table(columns: &[&str], rows: &[Map<String, Value>], headers: bool) {
    if headers {
        println!("{}", columns.join("\t"));
    }
    for row in rows {
        let cells: Vec<String> = columns.iter().map(|column| super::client::text(row.get(*column))).collect();
        println!("{}", cells.join("\t"));
    }
}
