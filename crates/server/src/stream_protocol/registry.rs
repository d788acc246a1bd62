//! The streams the stream protocol serves are the vhosts' stream queues: a stream created over
//! port 5552 is a durable queue with `x-queue-type: stream` in the topology (and its durable
//! definitions), which AMQP 0-9-1 consumes too, and a stream queue declared over AMQP 0-9-1 is
//! a stream here. Create and delete go through the broker's queue declare and delete, so limits,
//! definitions and the queue-type seam's argument checks apply as they do to AMQP.

use crate::broker::Broker;
use crate::queue_type::Queue;
use crate::stream::StreamQueue;
use amqp_codec::{FieldTable, FieldValue, ShortStr};
use broker_core::vhost::{QueueDefinition, QueueType};
use std::sync::Arc;
use storage::stream::Stream;
use stream_codec::TextMap;
use tokio::sync::Notify;

/// One stream: the stream queue and its store.
pub struct StreamEntry {
    /// The queue.
    pub queue: Arc<StreamQueue>,
    /// Its store.
    pub stream: Arc<Stream>,
}

impl StreamEntry {
    /// Wakes `notify` whenever chunks are committed, until it is dropped.
    pub fn watch(&self, notify: &Arc<Notify>) {
        self.queue.watch(notify);
    }

    /// Whether the stream was deleted.
    pub fn is_deleted(&self) -> bool {
        self.queue.is_deleted()
    }
}

/// Why a create refused.
#[derive(Debug, PartialEq, Eq)]
pub enum CreateRefusal {
    /// Exists with the same arguments (STREAM_ALREADY_EXISTS).
    AlreadyExists,
    /// Exists with other arguments, or an argument is not valid (PRECONDITION_FAILED).
    Precondition(String),
    /// Refused for a limit or failed (INTERNAL_ERROR).
    Internal(String),
}

/// The streams of the broker's vhosts.
pub struct StreamRegistry {
    broker: Arc<Broker>,
}

/// The keys RabbitMQ's stream plugin turns into queue arguments, with the AMQP argument each
/// becomes and whether its value is a number; it ignores any other key, and so does Lepus.
const KNOWN_ARGUMENTS: [(&str, &str, bool); 5] = [
    ("max-length-bytes", "x-max-length-bytes", true),
    ("max-age", "x-max-age", false),
    ("stream-max-segment-size-bytes", "x-stream-max-segment-size-bytes", true),
    ("initial-cluster-size", "x-initial-cluster-size", true),
    ("queue-leader-locator", "x-queue-leader-locator", false),
];

/// A stream queue's declare arguments from the stream protocol's, as `rabbit_stream_manager`
/// maps them. A number that does not parse is refused: RabbitMQ 3.10.8's connection crashes on
/// one; Lepus answers PRECONDITION_FAILED, as later versions do.
pub fn queue_arguments(arguments: &TextMap) -> Result<FieldTable, String> {
    let mut table = FieldTable::new();
    table.insert("x-queue-type", FieldValue::LongStr(bytes::Bytes::from_static(b"stream")));
    for (key, value) in arguments {
        let Some((_, argument, numeric)) = KNOWN_ARGUMENTS.iter().find(|(known, _, _)| known.as_bytes() == key.as_bytes()) else {
            continue;
        };
        let value = if *numeric {
            let text = value.to_string_lossy();
            FieldValue::I64(text.parse::<i64>().map_err(|_| format!("{key}: '{text}' is not a number"))?)
        } else {
            FieldValue::LongStr(value.clone().into_bytes())
        };
        table.insert(argument, value);
    }
    Ok(table)
}

impl StreamRegistry {
    /// The registry of `broker`'s streams.
    pub fn new(broker: Arc<Broker>) -> StreamRegistry {
        StreamRegistry { broker }
    }

    /// The stream queue `name` of `vhost` (a classic queue of that name is no stream).
    pub fn get(&self, vhost: &str, name: &str) -> Option<Arc<StreamEntry>> {
        let name = short(name)?;
        let topology = self.broker.vhost(vhost)?;
        let topology = topology.read();
        match &topology.queue(&name)?.handle {
            Queue::Stream(queue) if !queue.is_deleted() => {
                Some(Arc::new(StreamEntry { queue: queue.clone(), stream: queue.stream.clone() }))
            }
            _ => None,
        }
    }

    /// Creates a stream queue with the client's arguments.
    pub fn create(&self, vhost: &str, name: &str, arguments: &TextMap, connection_id: u64) -> Result<(), CreateRefusal> {
        let Some(queue_name) = short(name) else {
            return Err(CreateRefusal::Precondition(format!("a stream name of {} bytes (255 at most)", name.len())));
        };
        let arguments = queue_arguments(arguments).map_err(CreateRefusal::Precondition)?;
        let existed = self.broker.vhost(vhost).is_some_and(|topology| topology.read().queue(&queue_name).is_some());
        let definition = QueueDefinition {
            name: queue_name,
            durable: true,
            exclusive_owner: None,
            auto_delete: false,
            arguments,
            queue_type: QueueType::Stream,
        };
        match self.broker.declare_queue(vhost, definition, false, false, connection_id) {
            Ok(_) if existed => Err(CreateRefusal::AlreadyExists),
            Ok(_) => Ok(()),
            Err(error) if error.code == amqp_codec::constants::PRECONDITION_FAILED => Err(CreateRefusal::Precondition(error.to_string())),
            Err(error) => Err(CreateRefusal::Internal(error.to_string())),
        }
    }

    /// Deletes a stream queue: its AMQP consumers are cancelled, its stream-protocol subscribers
    /// woken to find it gone. `false` when there is no such stream.
    pub fn delete(&self, vhost: &str, name: &str) -> Result<bool, String> {
        let Some(entry) = self.get(vhost, name) else { return Ok(false) };
        self.broker.remove_queue(vhost, entry.queue.name());
        entry.queue.wake_consumers();
        Ok(true)
    }
}

fn short(name: &str) -> Option<ShortStr> {
    (name.len() <= 255).then(|| ShortStr::from(name))
}
