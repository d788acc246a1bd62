//! Stream queues behind the seam: [`crate::stream::StreamQueue`] runs them; this file makes and
//! recovers them with their streams (`DATA_DIR/streams/<hex of vhost and name>/`), and turns what
//! a publish did into the seam's terms.

use super::{ConfirmTicket, PublishOutcome, Queue};
use crate::stream::queue::{Appended, RETENTION_CHECK_INTERVAL_MS};
use crate::stream::StreamQueue;
use broker_core::vhost::QueueDefinition;
use broker_core::Message;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use storage::file_cache::FileCache;
use storage::stream::{Stream, StreamError};

/// Where streams live under the data directory.
pub const STREAMS_DIRECTORY: &str = "streams";

/// Where stream queues keep their streams.
pub struct StreamStorage<'a> {
    /// The broker's data directory (streams live under `streams/`).
    pub data_dir: &'a Path,
    /// The node's cache of open segment files, which streams share with queue logs.
    pub file_cache: &'a Arc<FileCache>,
}

fn stream_path(data_dir: &Path, vhost: &str, definition: &QueueDefinition) -> PathBuf {
    data_dir.join(STREAMS_DIRECTORY).join(super::classic::queue_file_name(vhost, &definition.name))
}

impl StreamStorage<'_> {
    /// Makes a newly declared stream queue with an empty stream (replacing what an older queue of
    /// the same name left).
    pub fn create(&self, definition: &QueueDefinition, vhost: &str) -> Result<Queue, StreamError> {
        let path = stream_path(self.data_dir, vhost, definition);
        let settings = crate::stream::queue::settings(&definition.arguments, None);
        let stream = Stream::create(&path, settings, self.file_cache.clone())?;
        Ok(Queue::Stream(start(StreamQueue::new(definition.clone(), vhost, stream))))
    }

    /// Recovers a stream queue; returns it and how many messages it holds.
    pub fn recover(&self, definition: &QueueDefinition, vhost: &str) -> Result<(Queue, u64), StreamError> {
        let path = stream_path(self.data_dir, vhost, definition);
        let settings = crate::stream::queue::settings(&definition.arguments, None);
        let (stream, recovery) = Stream::open(&path, settings, self.file_cache.clone())?;
        for cut in &recovery.truncated {
            tracing::warn!(file = %cut.path.display(), offset = cut.position, reason = %cut.reason, queue = %definition.name,
                "cut a stream segment at its first invalid chunk (a write a crash interrupted)");
        }
        if !recovery.gaps.is_empty() {
            tracing::error!(queue = %definition.name, gaps = ?recovery.gaps, "offsets are missing from a stream (damaged segments)");
        }
        let queue = start(StreamQueue::new(definition.clone(), vhost, stream));
        let messages = queue.message_count();
        Ok((Queue::Stream(queue), messages))
    }
}

/// What a clustered node's copy of a stream queue replicates with.
pub struct StreamReplicaSetup {
    /// Its leadership in force.
    pub leadership: crate::stream::replication::Leadership,
    /// Whether the declaration is live (not a replay of the metadata log at start).
    pub live: bool,
    /// The cluster's links.
    pub transport: Arc<dyn crate::stream::replication::ReplicaTransport>,
    /// The node's syncer.
    pub syncer: storage::syncer::Syncer,
}

impl StreamStorage<'_> {
    /// A clustered node's copy of a stream queue: recovered (a replay at start, or a snapshot
    /// restoring it) or new and empty, replicated under `setup`'s leadership. Nothing of a
    /// recovered copy is readable until the leader says how far the cluster committed it.
    pub fn replicated(
        &self,
        definition: &QueueDefinition,
        vhost: &str,
        recover: bool,
        setup: StreamReplicaSetup,
    ) -> Result<Queue, StreamError> {
        use crate::stream::replication::marks;
        let path = stream_path(self.data_dir, vhost, definition);
        let settings = crate::stream::queue::settings(&definition.arguments, None);
        let (stream, committed) = if recover {
            (Stream::open(&path, settings, self.file_cache.clone())?.0, marks::read_commit(&marks::paths(&path).1))
        } else {
            // An older stream's fence would refuse this one's first leader.
            marks::remove(&path);
            (Stream::create(&path, settings, self.file_cache.clone())?, 0)
        };
        stream.enable_replication(committed)?;
        let queue = start(StreamQueue::new(definition.clone(), vhost, stream.clone()));
        let key = crate::stream::replication::StreamKey { vhost: vhost.to_string(), name: definition.name.to_string_lossy() };
        let StreamReplicaSetup { leadership, live, transport, syncer } = setup;
        let replication = crate::stream::replication::StreamReplication::start(key, stream, transport, syncer, leadership, live)
            .map_err(|source| StreamError::Storage(storage::StorageError::Io { path: path.display().to_string(), source }))?;
        queue.set_replication(replication);
        Ok(Queue::Stream(queue))
    }
}

/// Starts the queue's retention timer (by age), which ends with the queue.
fn start(queue: Arc<StreamQueue>) -> Arc<StreamQueue> {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let weak = Arc::downgrade(&queue);
        runtime.spawn(async move {
            let mut interval = tokio::time::interval(std::time::Duration::from_millis(RETENTION_CHECK_INTERVAL_MS));
            interval.tick().await;
            loop {
                interval.tick().await;
                let Some(queue) = weak.upgrade() else { return };
                if queue.is_deleted() {
                    return;
                }
                // Deleting files is the janitor's; evaluating is a few comparisons under a lock.
                queue.evaluate_retention();
            }
        });
    }
    queue
}

/// Appends a message to a stream queue: confirmed once its stream commits it.
#[inline]
pub(super) fn publish(queue: &Arc<StreamQueue>, message: &Arc<Message>) -> PublishOutcome {
    match queue.publish(message) {
        Appended::Written => PublishOutcome::Accepted(ConfirmTicket::StreamCommitted(queue.stream.clone())),
        Appended::Deleted => PublishOutcome::Dropped,
        Appended::Refused => PublishOutcome::Rejected,
        Appended::Forwarded(slot) => PublishOutcome::Accepted(ConfirmTicket::Committed(slot)),
        Appended::Replicated { next_offset, epoch } => {
            let slot = crate::quorum::CommitSlot::new();
            if let Some(replication) = queue.replication() {
                replication.when_committed(next_offset, epoch, crate::stream::replication::CommitWaiter::Slot(slot.clone()));
            }
            PublishOutcome::Accepted(ConfirmTicket::Committed(slot))
        }
    }
}
