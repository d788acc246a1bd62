//! Quorum queues behind the seam: [`QuorumQueue`] (crate::quorum) replicates their commands
//! through the node's shards; this file makes and recovers them.

use super::classic::{expires_argument_ms, queue_file_name, EXPIRY_DIRECTORY};
use super::Queue;
use crate::queue_expiry::ExpiryTimers;
use crate::queue_runtime::{now_ms, ExpiryClock};
use crate::quorum::{QuorumHost, QuorumQueue};
use broker_core::vhost::QueueDefinition;
use std::path::Path;
use std::sync::Arc;

/// Where quorum queues live: the node's shards.
pub struct QuorumStorage<'a> {
    /// The node's host of the shards.
    pub host: &'a Arc<QuorumHost>,
    /// Where queues with x-expires wait to be deleted.
    pub expiry_timers: &'a Arc<ExpiryTimers>,
    /// The data directory, where a queue with x-expires keeps its last use (as a durable classic
    /// queue does, in the same directory: one vhost's queue names are unique across types).
    pub data_dir: &'a Path,
}

impl QuorumStorage<'_> {
    /// Makes a newly declared quorum queue; its declaration is replicated (commands sent before
    /// it is committed follow it in the log). `incarnation` orders the declarations of a name
    /// (a cluster's metadata log index; 0 on a single node, whose one proposer orders them).
    pub fn create(&self, definition: &QueueDefinition, vhost: &str, incarnation: u64) -> Queue {
        let queue = QuorumQueue::declare(definition.clone(), vhost, self.host, self.expiry_clock(definition, vhost), incarnation);
        queue.start_expiry_clock(false);
        Queue::Quorum(queue)
    }

    /// A quorum queue of the definitions: its messages are in its shard's log and snapshot.
    pub fn recover(&self, definition: &QueueDefinition, vhost: &str, incarnation: u64) -> Queue {
        let queue = QuorumQueue::recover(definition.clone(), vhost, self.host, self.expiry_clock(definition, vhost), incarnation);
        queue.start_expiry_clock(true);
        Queue::Quorum(queue)
    }

    /// A queue's x-expires clock, its last use kept on disk (quorum queues are durable).
    fn expiry_clock(&self, definition: &QueueDefinition, vhost: &str) -> ExpiryClock {
        let file = self.data_dir.join(EXPIRY_DIRECTORY).join(queue_file_name(vhost, &definition.name));
        ExpiryClock::new(self.expiry_timers.clone(), Some(file), expires_argument_ms(definition), now_ms())
    }
}
