//! Quorum queues behind the seam: [`QuorumQueue`] (crate::quorum) replicates their commands
//! through the node's shards; this file makes and recovers them.

use super::Queue;
use crate::quorum::{QuorumHost, QuorumQueue};
use broker_core::vhost::QueueDefinition;
use std::sync::Arc;

/// Where quorum queues live: the node's shards.
pub struct QuorumStorage<'a> {
    /// The node's host of the shards.
    pub host: &'a Arc<QuorumHost>,
}

impl QuorumStorage<'_> {
    /// Makes a newly declared quorum queue; its declaration is replicated (commands sent before
    /// it is committed follow it in the log).
    pub fn create(&self, definition: &QueueDefinition, vhost: &str) -> Queue {
        Queue::Quorum(QuorumQueue::declare(definition.clone(), vhost, self.host))
    }

    /// A quorum queue of the definitions: its messages are in its shard's log and snapshot.
    pub fn recover(&self, definition: &QueueDefinition, vhost: &str) -> Queue {
        Queue::Quorum(QuorumQueue::recover(definition.clone(), vhost, self.host))
    }
}
