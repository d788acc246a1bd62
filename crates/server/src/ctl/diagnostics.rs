//! `lepus ctl cluster_status`, `environment` and `report`, shaped as rabbitmqctl 3.10.8 prints
//! them: the same sections and JSON keys (`cluster_status --formatter json` has rabbitmqctl's
//! keys), filled with what a Lepus node has. A node started without a cluster port answers as a
//! cluster of one; a clustered node lists the cluster's members from `/api/lepus/cluster` (which
//! ones run, as this node sees them) and, in the table, the metadata group's leader and indexes.
//!
//! `report --formatter json` prints one object of every section; rabbitmqctl 3.10.8 refuses that
//! formatter for `report` ("Only report formatter is supported").

use super::client::{text, Client, CtlError};
use super::listing::{self, Listing};
use super::{CtlArguments, Formatter};
use serde_json::{json, Map, Value};

/// What `cluster_status --formatter json` prints, and the node's `/api/lepus/cluster` answer it
/// was made of (the cluster's members and, when clustered, its metadata group). The nodes are the
/// cluster's members as this node knows them; versions and listeners are this node's own, as the
/// others' are not known here.
fn cluster_facts(client: &Client) -> Result<(Value, Value), CtlError> {
    let overview = client.get_json("/overview")?;
    let cluster = client.get_json("/lepus/cluster")?;
    let members: Vec<&Value> = cluster.get("members").and_then(Value::as_array).map(|members| members.iter().collect()).unwrap_or_default();
    let name = |member: &Value| text(member.get("name"));
    // In name order, as rabbitmqctl lists them, whatever order the cluster keeps its members in.
    let mut disk_nodes: Vec<String> = members.iter().map(|member| name(member)).collect();
    disk_nodes.sort();
    let mut running_nodes: Vec<String> =
        members.iter().filter(|member| member.get("running").and_then(Value::as_bool) == Some(true)).map(|member| name(member)).collect();
    running_nodes.sort();
    let mut listeners: Map<String, Value> = Map::new();
    for listener in super::listeners(client, &overview) {
        let entry = listeners.entry(text(listener.get("node"))).or_insert_with(|| json!([]));
        if let Some(list) = entry.as_array_mut() {
            list.push(listener);
        }
    }
    let version = json!({
        "rabbitmq_name": overview.get("product_name"),
        "rabbitmq_version": overview.get("product_version"),
        "erlang_version": overview.get("erlang_version"),
    });
    let mut versions = Map::new();
    versions.insert(text(overview.get("node")), version);
    let maintenance: Map<String, Value> = disk_nodes.iter().map(|node| (node.clone(), json!("not under maintenance"))).collect();
    let status = json!({
        "alarms": client.alarms()?,
        "cluster_name": cluster.get("cluster_name"),
        "disk_nodes": disk_nodes,
        "feature_flags": [],
        "listeners": listeners,
        "maintenance_status": maintenance,
        "partitions": {},
        "ram_nodes": [],
        "running_nodes": running_nodes,
        "versions": versions,
    });
    Ok((status, cluster))
}

/// Lines of one section: a title, a blank line, the lines (or "(none)"), a blank line.
fn section(title: &str, lines: Vec<String>) {
    println!("{title}\n");
    if lines.is_empty() {
        println!("(none)");
    }
    for line in lines {
        println!("{line}");
    }
    println!();
}

/// The strings of a JSON array.
fn strings(value: Option<&Value>) -> Vec<String> {
    value.and_then(Value::as_array).map(|items| items.iter().map(|item| text(Some(item))).collect()).unwrap_or_default()
}

fn print_cluster_status(status: &Value) {
    section("Basics", vec![format!("Cluster name: {}", text(status.get("cluster_name")))]);
    section("Disk Nodes", strings(status.get("disk_nodes")));
    section("Running Nodes", strings(status.get("running_nodes")));
    let objects = |key: &str| status.get(key).and_then(Value::as_object).cloned().unwrap_or_default();
    let versions = objects("versions")
        .iter()
        .map(|(node, version)| format!("{node}: {} {}", text(version.get("rabbitmq_name")), text(version.get("rabbitmq_version"))))
        .collect();
    section("Versions", versions);
    let maintenance =
        objects("maintenance_status").iter().map(|(node, state)| format!("Node: {node}, status: {}", text(Some(state)))).collect();
    section("Maintenance status", maintenance);
    let alarms = status
        .get("alarms")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|alarm| {
            let what = if text(alarm.get("resource")) == "disk" { "Free disk space alarm" } else { "Memory alarm" };
            format!("{what} on node {}", text(alarm.get("node")))
        })
        .collect();
    section("Alarms", alarms);
    section("Network Partitions", Vec::new());
    let mut listeners = Vec::new();
    for (node, list) in objects("listeners") {
        for listener in list.as_array().into_iter().flatten() {
            listeners.push(format!(
                "Node: {node}, interface: {}, port: {}, protocol: {}, purpose: {}",
                text(listener.get("interface")),
                text(listener.get("port")),
                text(listener.get("protocol")),
                text(listener.get("purpose"))
            ));
        }
    }
    section("Listeners", listeners);
    section("Feature flags", Vec::new());
}

/// The metadata group of a clustered node (rabbitmqctl has none: RabbitMQ's metadata is Mnesia).
fn print_metadata_group(cluster: &Value) {
    let Some(metadata) = cluster.get("metadata") else { return };
    let number = |key: &str| metadata.get(key).and_then(Value::as_u64).unwrap_or(0);
    let lines = vec![
        format!("Cluster id: {}", text(cluster.get("cluster_id"))),
        format!("Leader: {}", text(metadata.get("leader"))),
        format!("Term: {}", number("term")),
        format!("Commit index: {}", number("commit_index")),
        format!("Applied index: {}", number("applied_index")),
    ];
    section("Metadata group", lines);
}

/// The line rabbitmqctl prints first on stdout, unless `-q`.
fn banner(arguments: &CtlArguments, line: &str) {
    if !arguments.quiet {
        println!("{line}");
    }
}

/// `cluster_status`.
pub fn cluster_status(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let (status, cluster) = cluster_facts(client)?;
    match arguments.formatter {
        Formatter::Json => println!("{status}"),
        Formatter::Table => {
            banner(arguments, &format!("Cluster status of node {} ...", client.node()?));
            print_cluster_status(&status);
            print_metadata_group(&cluster);
        }
    }
    Ok(())
}

/// What `environment --formatter json` prints: `{"lepus": {SETTING: VALUE}}`, as rabbitmqctl
/// prints `{APPLICATION: {KEY: VALUE}}`.
fn environment_value(client: &Client) -> Result<Value, CtlError> {
    let answer = client.get_json("/lepus/environment")?;
    Ok(json!({"lepus": answer.get("lepus").cloned().unwrap_or_else(|| json!({}))}))
}

/// A JSON value as an Erlang term, as rabbitmqctl prints the environment.
fn erlang_term(value: &Value) -> String {
    match value {
        Value::Null => "undefined".to_owned(),
        Value::String(text) => format!("{text:?}"),
        Value::Array(items) => format!("[{}]", items.iter().map(erlang_term).collect::<Vec<_>>().join(",")),
        Value::Object(map) => {
            format!("[{}]", map.iter().map(|(key, value)| format!("{{{key},{}}}", erlang_term(value))).collect::<Vec<_>>().join(","))
        }
        other => other.to_string(),
    }
}

/// The environment as rabbitmqctl lays it out: one application per entry, one setting a line.
fn print_environment(environment: &Value) {
    let applications = environment.as_object().cloned().unwrap_or_default();
    let mut lines = Vec::new();
    for (application, settings) in &applications {
        let settings: Vec<String> =
            settings.as_object().into_iter().flatten().map(|(key, value)| format!("{{{key},{}}}", erlang_term(value))).collect();
        lines.push(format!("{{{application},\n     [{}]}}", settings.join(",\n      ")));
    }
    println!("[{}]", lines.join(",\n "));
}

/// `environment`.
pub fn environment(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let environment = environment_value(client)?;
    match arguments.formatter {
        Formatter::Json => println!("{environment}"),
        Formatter::Table => {
            banner(arguments, &format!("Application environment of node {} ...", client.node()?));
            print_environment(&environment);
        }
    }
    Ok(())
}

/// The listings of a report: node-wide ones, then each vhost's, with rabbitmqctl's headings.
fn report_listings(vhost: Option<&str>) -> Vec<(String, &'static str, Listing)> {
    match vhost {
        None => vec![
            ("Listing connections ...".to_owned(), "connections", Listing::Connections),
            ("Listing channels ...".to_owned(), "channels", Listing::Channels),
        ],
        Some(vhost) => vec![
            (format!("Listing queues for vhost {vhost} ..."), "queues", Listing::Queues),
            (format!("Listing exchanges for vhost {vhost} ..."), "exchanges", Listing::Exchanges),
            (format!("Listing bindings for vhost {vhost}..."), "bindings", Listing::Bindings),
            (format!("Listing permissions for vhost \"{vhost}\" ..."), "permissions", Listing::Permissions),
            (format!("Listing policies for vhost \"{vhost}\" ..."), "policies", Listing::Policies),
        ],
    }
}

/// Prints (table) or gathers (JSON) one vhost's or the node's listings, every info key of each.
fn report_section(client: &Client, arguments: &CtlArguments, vhost: Option<&str>, into: &mut Map<String, Value>) -> Result<(), CtlError> {
    for (heading, key, listing) in report_listings(vhost) {
        let (columns, rows) = listing::rows(client, vhost.unwrap_or("/"), listing, &listing::all_columns(listing))?;
        match arguments.formatter {
            Formatter::Json => {
                into.insert(key.to_owned(), Value::Array(rows.into_iter().map(Value::Object).collect()));
            }
            Formatter::Table => {
                println!("{heading}");
                listing::print_table(&columns, &rows, true);
                println!();
            }
        }
    }
    Ok(())
}

/// `report`: status, cluster status, environment, then connections, channels and each vhost's
/// queues, exchanges, bindings, permissions and policies, in rabbitmqctl's order.
pub fn report(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let node = client.node()?;
    let (status, overview, node_facts) = super::status_value(client)?;
    let (cluster, metadata) = cluster_facts(client)?;
    let environment = environment_value(client)?;
    let vhosts: Vec<String> = client.get_json("/vhosts")?.as_array().into_iter().flatten().map(|vhost| text(vhost.get("name"))).collect();
    let mut everything = Map::new();
    if arguments.formatter == Formatter::Table {
        println!("Reporting server status of node {node} ...\n");
        super::print_status(&status, &overview, &node_facts);
        println!("\nCluster status of node {node} ...");
        print_cluster_status(&cluster);
        print_metadata_group(&metadata);
        println!("Application environment of node {node} ...");
        print_environment(&environment);
        println!();
    }
    report_section(client, arguments, None, &mut everything)?;
    let mut per_vhost = Map::new();
    for vhost in &vhosts {
        let mut listings = Map::new();
        report_section(client, arguments, Some(vhost), &mut listings)?;
        per_vhost.insert(vhost.clone(), Value::Object(listings));
    }
    if arguments.formatter == Formatter::Json {
        everything.insert("status".to_owned(), status);
        everything.insert("cluster_status".to_owned(), cluster);
        everything.insert("environment".to_owned(), environment);
        everything.insert("vhosts".to_owned(), Value::Object(per_vhost));
        println!("{}", Value::Object(everything));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_print_as_erlang_terms() {
        assert_eq!(erlang_term(&json!("lepus-data")), "\"lepus-data\"");
        assert_eq!(erlang_term(&json!(5672)), "5672");
        assert_eq!(erlang_term(&json!(null)), "undefined");
        assert_eq!(erlang_term(&json!({"a": [1, true]})), "[{a,[1,true]}]");
    }
}
