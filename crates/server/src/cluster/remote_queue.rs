//! A classic queue of another node, as this node's topology holds it.
//!
//! Decision (docs/cluster.md, "Classic queues"): classic queues stay on the node that declared
//! them, as RabbitMQ's do, and Lepus does not forward their traffic between nodes. Every node
//! knows every queue's definition (names are taken cluster-wide, bindings and declarations
//! replicate), but consuming from, getting from or purging a classic queue through another node
//! is refused with 540 NOT_IMPLEMENTED naming the queue's node; a message routed to it through
//! another node is refused (basic.nack to a confirming publisher, a warning in the log). Quorum
//! queues are the cluster's shared queues.

use amqp_codec::ShortStr;
use broker_core::vhost::QueueDefinition;
use broker_core::AmqpError;
use std::sync::atomic::{AtomicU64, Ordering};

/// Seconds between two warnings about messages refused by one remote queue.
const REFUSED_PUBLISH_WARNING_INTERVAL_S: u64 = 10;

/// A classic queue whose messages live on another node.
#[derive(Debug)]
pub struct RemoteQueue {
    /// Its definition, as declared on its node.
    pub definition: QueueDefinition,
    /// Its vhost.
    pub vhost: String,
    /// The node that holds it.
    pub home_name: String,
    /// Its Raft id.
    pub home_id: u64,
    /// Messages routed to it here and refused.
    pub refused_publishes: AtomicU64,
    /// The policy that applies to it (listings show it on every node).
    pub policy: parking_lot::Mutex<Option<std::sync::Arc<crate::policy::Policy>>>,
    last_warning_s: AtomicU64,
}

impl RemoteQueue {
    /// The placeholder of a queue held by `home_name`.
    pub fn new(definition: QueueDefinition, vhost: &str, home_id: u64, home_name: String) -> RemoteQueue {
        RemoteQueue {
            definition,
            vhost: vhost.to_string(),
            home_name,
            home_id,
            refused_publishes: AtomicU64::new(0),
            policy: parking_lot::Mutex::new(None),
            last_warning_s: AtomicU64::new(0),
        }
    }

    /// The refusal of an operation that needs the queue's messages.
    pub fn refusal(&self) -> AmqpError {
        if self.definition.queue_type == broker_core::vhost::QueueType::Quorum {
            // On a node that joined after formation (quorum_link.rs): not a member of the shards.
            return AmqpError::not_implemented(format!(
                "queue '{}' in vhost '{}' is a quorum queue of the cluster's founding nodes, and this node joined later: it is not a member of the quorum shards (their membership changes are not built); connect to a founding node",
                self.definition.name, self.vhost
            ));
        }
        AmqpError::not_implemented(format!(
            "queue '{}' in vhost '{}' is a classic queue on node {}: Lepus serves a classic queue on its own node only (connect there, or use a quorum queue)",
            self.definition.name, self.vhost, self.home_name
        ))
    }

    /// Counts a message routed here and refused, and warns (at most every few seconds).
    pub fn refuse_publish(&self) {
        self.refused_publishes.fetch_add(1, Ordering::Relaxed);
        let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|time| time.as_secs()).unwrap_or(0);
        let last = self.last_warning_s.load(Ordering::Relaxed);
        if now_s >= last + REFUSED_PUBLISH_WARNING_INTERVAL_S
            && self.last_warning_s.compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::warn!(
                queue = %self.definition.name,
                vhost = %self.vhost,
                node = %self.home_name,
                refused = self.refused_publishes.load(Ordering::Relaxed),
                "a message routed to a classic queue of another node was refused (basic.nack with confirms)"
            );
        }
    }

    /// Its name.
    pub fn name(&self) -> &ShortStr {
        &self.definition.name
    }
}
