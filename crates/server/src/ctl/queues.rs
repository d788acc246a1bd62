//! `lepus ctl queues grow|shrink|add_member|delete_member`: RabbitMQ's `rabbitmq-queues`
//! membership commands, through the node's management API (RabbitMQ's paths). A quorum queue's
//! members are its shard's, which many queues share: `add_member` and `delete_member` act on the
//! queue's shard and say which queues it holds; `grow` and `shrink` act on every shard.

use super::client::{Client, CtlError};
use super::CtlArguments;
use crate::url_path::encode_segment;
use serde_json::{json, Value};

/// What `lepus ctl queues` does.
#[derive(clap::Subcommand, Debug)]
pub enum QueuesCommand {
    /// Makes NODE a voter of every quorum shard (`all`), or of those with an even number of
    /// voters (`even`); it is promoted once it caught up.
    Grow {
        /// The member's node name.
        node: String,
        /// all or even.
        #[arg(default_value = "all")]
        strategy: String,
    },
    /// Makes NODE stop voting in every quorum shard (it stays a learner and serves its clients).
    Shrink {
        /// The member's node name.
        node: String,
    },
    /// Makes NODE a voter of the shard of quorum queue QUEUE (in vhost -p), and so of every
    /// queue on that shard.
    #[command(name = "add_member", alias = "add-member")]
    AddMember {
        /// The quorum queue.
        queue: String,
        /// The member's node name.
        node: String,
    },
    /// Makes NODE stop voting in the shard of quorum queue QUEUE (in vhost -p), and so in every
    /// queue on that shard.
    #[command(name = "delete_member", alias = "delete-member")]
    DeleteMember {
        /// The quorum queue.
        queue: String,
        /// The member's node name.
        node: String,
    },
}

/// Runs one queues command.
pub fn run(client: &Client, arguments: &CtlArguments, command: &QueuesCommand) -> Result<(), CtlError> {
    let vhost = arguments.vhost();
    let (method, path, body, what) = match command {
        QueuesCommand::Grow { node, strategy } => (
            "POST",
            format!("/queues/quorum/replicas/on/{}/grow", encode_segment(node)),
            json!({"vhost_pattern": ".*", "queue_pattern": ".*", "strategy": strategy}),
            format!("Growing quorum shards ({strategy}) with a voter on node {node} ..."),
        ),
        QueuesCommand::Shrink { node } => (
            "DELETE",
            format!("/queues/quorum/replicas/on/{}/shrink", encode_segment(node)),
            json!({}),
            format!("Shrinking every quorum shard: node {node} stops voting ..."),
        ),
        QueuesCommand::AddMember { queue, node } => (
            "POST",
            format!("/queues/quorum/{}/{}/replicas/add", encode_segment(vhost), encode_segment(queue)),
            json!({"node": node}),
            format!("Adding a voter on node {node} to the shard of quorum queue '{queue}' in vhost '{vhost}' ..."),
        ),
        QueuesCommand::DeleteMember { queue, node } => (
            "DELETE",
            format!("/queues/quorum/{}/{}/replicas/delete", encode_segment(vhost), encode_segment(queue)),
            json!({"node": node}),
            format!("Removing node {node} from the voters of the shard of quorum queue '{queue}' in vhost '{vhost}' ..."),
        ),
    };
    arguments.inform(&what);
    let answer = client.request(method, &path, Some(&body.to_string()), &[])?;
    let answer: Value = serde_json::from_str(&answer).map_err(|error| CtlError::Software(format!("the node's answer: {error}")))?;
    let shards = answer.get("shards").and_then(Value::as_array).cloned().unwrap_or_default();
    let node = client.node()?;
    if shards.is_empty() {
        arguments.report(&node, "No quorum shard to change.");
        return Ok(());
    }
    for shard in shards {
        let queues: Vec<&str> =
            shard.get("queues").and_then(Value::as_array).map(|names| names.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let listed = if queues.is_empty() { "no quorum queue yet".to_string() } else { queues.join(", ") };
        arguments.report(&node, &format!("quorum shard {}: done (its queues: {listed})", shard.get("shard").unwrap_or(&Value::Null)));
    }
    Ok(())
}
