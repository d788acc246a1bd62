//! Stream replication over the cluster: the links carry its messages (payload channel
//! [`STREAM_REPLICATION_CHANNEL`]) and its elections' questions (control requests), and the
//! metadata group records who leads each stream (`StreamLeader`), so every member and every
//! restart agrees on it (docs/streams.md, "Replication").

use super::command::MetadataCommand;
use super::Cluster;
use crate::broker::Broker;
use crate::queue_type::Queue;
use crate::stream::replication::{Leadership, ReplicaMessage, ReplicaTransport, StreamKey, StreamReplication, STREAM_REPLICATION_CHANNEL};
use crate::stream::StreamQueue;
use bytes::Bytes;
use std::sync::{Arc, Weak};
use std::time::Duration;
use storage::stream::StreamTail;

/// The cluster as stream replication sees it.
pub struct StreamLinks {
    /// The node's cluster half.
    pub cluster: Weak<Cluster>,
    /// This node's id.
    pub node_id: u64,
}

impl ReplicaTransport for StreamLinks {
    fn node_id(&self) -> u64 {
        self.node_id
    }

    fn send(&self, to: u64, message: Bytes) -> bool {
        let Some(cluster) = self.cluster.upgrade() else { return false };
        cluster.links.send_payload(to, STREAM_REPLICATION_CHANNEL, message)
    }

    fn ask_tail(&self, to: u64, key: &StreamKey, epoch: u64) -> Option<StreamTail> {
        let cluster = self.cluster.upgrade()?;
        let request = super::control::ControlRequest::StreamTail { vhost: key.vhost.clone(), name: key.name.clone(), epoch };
        let body = Bytes::from(serde_json::to_vec(&request).ok()?);
        let answer =
            cluster.links.request_blocking(to, body, Duration::from_millis(crate::stream::replication::TAIL_QUESTION_TIMEOUT_MS)).ok()?;
        match serde_json::from_slice(&answer).ok()? {
            super::control::ControlAnswer::StreamTail { last_epoch, next_offset } => Some(StreamTail { last_epoch, next_offset }),
            super::control::ControlAnswer::Refused { reason } => {
                tracing::warn!(node = %format!("{to:x}"), stream = %key.name, %reason, "a member did not answer the stream's election");
                None
            }
            _ => None,
        }
    }

    fn propose_leadership(&self, key: &StreamKey, leadership: Leadership) -> Result<(), String> {
        let cluster = self.cluster.upgrade().ok_or("the node is shutting down")?;
        let command = MetadataCommand::StreamLeader {
            vhost: key.vhost.clone(),
            name: key.name.clone(),
            epoch: leadership.epoch,
            leader: leadership.leader,
            members: leadership.members,
        };
        cluster.propose(command).map(drop).map_err(|error| error.to_string())
    }
}

/// The stream queue `key` names on this node, with its replication.
pub fn replicated_stream(broker: &Broker, key: &StreamKey) -> Option<(Arc<StreamQueue>, Arc<StreamReplication>)> {
    let topology = broker.vhost(&key.vhost)?;
    let name = amqp_codec::ShortStr::truncating(key.name.clone());
    let queue = match topology.read().queue(&name).map(|entry| entry.handle.clone()) {
        Some(Queue::Stream(queue)) => queue,
        _ => return None,
    };
    let replication = queue.replication()?.clone();
    Some((queue, replication))
}

impl Cluster {
    /// Where each node's stream-protocol clients connect (host, port), by node id: this node's
    /// and each linked peer's, as their handshakes said. A node without a stream listener, or
    /// not linked now, is left out, as RabbitMQ leaves out a node it cannot reach.
    pub fn stream_endpoints(&self) -> std::collections::HashMap<u64, (String, u16)> {
        let peers = self.links.peers().into_iter().filter(|peer| peer.connected).map(|peer| peer.hello);
        std::iter::once(self.links.local_hello())
            .chain(peers)
            .filter(|hello| hello.stream_port != 0)
            .map(|hello| (hello.node_id, (hello.stream_host, hello.stream_port)))
            .collect()
    }

    /// A stream's leadership in force here.
    pub fn stream_leadership(&self, key: &StreamKey) -> Option<Leadership> {
        self.state.lock().stream_leaders.get(key).cloned()
    }

    /// Records a new stream's first leadership (its declaring node, epoch 1), replacing what an
    /// older queue of the same name had.
    pub(crate) fn record_new_stream(&self, key: StreamKey, leadership: Leadership) {
        self.state.lock().stream_leaders.insert(key, leadership);
    }

    /// Forgets a deleted stream's leadership.
    pub(crate) fn forget_stream(&self, key: &StreamKey) {
        self.state.lock().stream_leaders.remove(key);
    }

    /// Applies `StreamLeader`: a higher epoch than the one in force replaces it, and the
    /// stream's copy here takes its new role. Returns whether it was applied.
    pub(super) fn apply_stream_leader(&self, index: u64, key: StreamKey, leadership: Leadership) -> bool {
        {
            let mut state = self.state.lock();
            if state.stream_leaders.get(&key).is_some_and(|current| leadership.epoch <= current.epoch) {
                return false;
            }
            state.stream_leaders.insert(key.clone(), leadership.clone());
        }
        if let Some((_, replication)) = self.broker().and_then(|broker| replicated_stream(&broker, &key)) {
            replication.set_leadership(leadership, !self.replaying(index));
        }
        true
    }

    /// The metadata snapshot's commands for the stream leaderships in force.
    pub(super) fn stream_leader_commands(&self) -> Vec<MetadataCommand> {
        let state = self.state.lock();
        state
            .stream_leaders
            .iter()
            .map(|(key, leadership)| MetadataCommand::StreamLeader {
                vhost: key.vhost.clone(),
                name: key.name.clone(),
                epoch: leadership.epoch,
                leader: leadership.leader,
                members: leadership.members.clone(),
            })
            .collect()
    }

    /// The transport this node's replicated streams use.
    pub fn stream_transport(self: &Arc<Self>) -> Arc<dyn ReplicaTransport> {
        Arc::new(StreamLinks { cluster: Arc::downgrade(self), node_id: self.node_id })
    }
}

/// A stream replication message from member `from`, for its stream's copy here.
pub fn receive(broker: &Broker, from: u64, body: Bytes) {
    let message = match ReplicaMessage::decode(body) {
        Ok(message) => message,
        Err(error) => return tracing::warn!(node = %format!("{from:x}"), %error, "a stream replication message did not decode; dropped"),
    };
    let key = match &message {
        ReplicaMessage::Fetch(key, _)
        | ReplicaMessage::Data(key, _)
        | ReplicaMessage::Publish(key, _)
        | ReplicaMessage::Published(key, _)
        | ReplicaMessage::PublishEntries(key, _)
        | ReplicaMessage::StoreOffset(key, _) => key,
    };
    match replicated_stream(broker, key) {
        Some((_, replication)) => replication.receive(from, message),
        None => tracing::debug!(stream = %key.name, vhost = %key.vhost, "a replication message for a stream not held here; dropped"),
    }
}

/// An election's question: the end of this node's copy, fenced at `epoch`.
pub fn answer_tail(broker: &Broker, key: &StreamKey, epoch: u64) -> super::control::ControlAnswer {
    match replicated_stream(broker, key).map(|(_, replication)| replication.answer_tail(epoch)) {
        Some(Ok(tail)) => super::control::ControlAnswer::StreamTail { last_epoch: tail.last_epoch, next_offset: tail.next_offset },
        Some(Err(reason)) => super::control::ControlAnswer::Refused { reason },
        None => super::control::ControlAnswer::Refused { reason: format!("no stream '{}' in vhost '{}' here", key.name, key.vhost) },
    }
}
