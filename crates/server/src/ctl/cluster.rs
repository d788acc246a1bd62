//! `lepus ctl cluster status|join|leave|forget` and rabbitmqctl's spellings (`cluster_status`,
//! `join_cluster`, `forget_cluster_node`), through the node's `/api/lepus/cluster`.

use super::client::{Client, CtlError};
use super::{CtlArguments, Formatter};
use serde_json::{json, Value};

/// What `lepus ctl cluster` does.
#[derive(clap::Subcommand, Debug)]
pub enum ClusterCommand {
    /// Shows the cluster's members, which run, and the metadata group's leader and indexes.
    Status,
    /// Makes this node (a new one) join the cluster a member of which listens at ADDRESS.
    Join {
        /// `host:port` of a member's cluster port.
        address: String,
    },
    /// Makes this node leave its cluster; it shuts down once the others agree.
    Leave,
    /// Removes a member that is not running (its classic queues go with it).
    Forget {
        /// The member's node name.
        node: String,
    },
}

/// Runs one cluster command.
pub fn run(client: &Client, arguments: &CtlArguments, command: &ClusterCommand) -> Result<(), CtlError> {
    match command {
        ClusterCommand::Status => status(client, arguments),
        ClusterCommand::Join { address } => {
            arguments.inform(&format!("Clustering node {} with {address} ...", client.node()?));
            client.request("POST", "/lepus/cluster/join", Some(&json!({ "address": address }).to_string()), &[])?;
            arguments.report(&client.node()?, "Joined.");
            Ok(())
        }
        ClusterCommand::Leave => {
            let node = client.node()?;
            arguments.inform(&format!("Node {node} is leaving its cluster ..."));
            client.request("POST", "/lepus/cluster/leave", None, &[])?;
            arguments.report(&node, "Left; the node shuts down.");
            Ok(())
        }
        ClusterCommand::Forget { node } => {
            arguments.inform(&format!("Removing node {node} from the cluster"));
            client.request("DELETE", &format!("/lepus/cluster/nodes/{}", urlencode(node)), None, &[])?;
            arguments.report(&client.node()?, &format!("Node {node} is forgotten."));
            Ok(())
        }
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

fn status(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let status = client.get_json("/lepus/cluster")?;
    if arguments.formatter == Formatter::Json {
        println!("{status}");
        return Ok(());
    }
    let text = |value: &Value, key: &str| value.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let members = status.get("members").and_then(Value::as_array).cloned().unwrap_or_default();
    arguments.inform(&format!("Cluster status of node {} ...", text(&status, "node")));
    println!("Basics\n\nCluster name: {}\nCluster id: {}\n", text(&status, "cluster_name"), text(&status, "cluster_id"));
    println!("Disk Nodes\n");
    for member in &members {
        println!("{}", text(member, "name"));
    }
    println!("\nRunning Nodes\n");
    for member in members.iter().filter(|member| member.get("running") == Some(&Value::Bool(true))) {
        println!("{}", text(member, "name"));
    }
    if let Some(metadata) = status.get("metadata") {
        let number = |key: &str| metadata.get(key).and_then(Value::as_u64).unwrap_or(0);
        println!(
            "\nMetadata group\n\nLeader: {}\nTerm: {}\nCommit index: {}\nApplied index: {}\nSnapshot index: {}",
            text(metadata, "leader"),
            number("term"),
            number("commit_index"),
            number("applied_index"),
            number("snapshot_index")
        );
        // Joined nodes still catching up: they vote once promoted (docs/cluster.md, "Learner first").
        println!("Learners: {}", names(metadata.get("learners")));
    }
    print_quorum_shards(&status);
    Ok(())
}

/// One line per quorum shard: its leader, voters, learners, and the learners chosen as voters
/// that are not promoted yet (still catching up).
fn print_quorum_shards(status: &Value) {
    let shards = status.get("quorum_shards").and_then(Value::as_array).cloned().unwrap_or_default();
    if shards.is_empty() {
        return;
    }
    println!("\nQuorum shards\n");
    for shard in &shards {
        println!(
            "shard {}: leader {}; voters {}; learners {}; promotion pending {}",
            shard.get("shard").and_then(Value::as_u64).unwrap_or(0),
            shard.get("leader").and_then(Value::as_str).unwrap_or("none"),
            names(shard.get("voters")),
            names(shard.get("learners")),
            names(shard.get("promotion_pending"))
        );
    }
}

/// A JSON array of names, comma-separated ("none" when empty or absent).
fn names(value: Option<&Value>) -> String {
    let names: Vec<&str> =
        value.and_then(Value::as_array).map(|names| names.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}
