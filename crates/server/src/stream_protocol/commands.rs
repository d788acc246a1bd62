//! What an open connection asks of streams: publishers and their publishes, create and delete,
//! stored offsets, metadata. Each refusal is the response code RabbitMQ 3.10.8 answers with, in
//! the order its reader checks (alarm, permission, ids, the stream itself).

use super::registry::{CreateRefusal, StreamEntry};
use super::session::{Flow, Session};
use crate::auth::Access;
use crate::stream::replication::{CommitWaiter, ForwardedEntry, StreamKey, StreamReplication};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use storage::stream::chunk::EntryBatch;
use storage::stream::now_ms;
use stream_codec::{key, Broker, PublishedMessages, PublishingError, ResponseCode, ServerCommand, StreamMetadata, Text, TextMap};

/// A declared publisher.
pub struct Publisher {
    /// The stream's name.
    pub stream: Text,
    /// Its reference, for deduplication (none when declared with an empty one).
    pub reference: Option<Text>,
    /// The stream.
    pub entry: Arc<StreamEntry>,
}

/// Publishes confirmed (or not) by the group commit, on their way back to the connection.
pub struct Confirmed {
    /// The publisher.
    pub publisher_id: u8,
    /// Its ids, in the order they came.
    pub publishing_ids: Vec<u64>,
    /// False when the write or its sync failed.
    pub durable: bool,
}

/// The leader index of a stream without one, in a metadata answer.
const NO_LEADER: u16 = 0xffff;

impl Session {
    /// Answers a command with `code`, counting it when it is a refusal.
    pub(super) fn respond(&mut self, command_key: u16, correlation_id: u32, code: ResponseCode) -> Flow {
        self.count_refusal(code);
        self.send(&ServerCommand::Response { key: command_key, correlation_id, code });
        Flow::Continue
    }

    pub(super) fn declare_publisher(&mut self, correlation_id: u32, publisher_id: u8, reference: Text, stream: Text) -> Flow {
        let code = self.publisher_refusal(publisher_id, &reference, &stream);
        if code == ResponseCode::Ok {
            if let Some(entry) = self.node.registry.get(self.vhost(), &stream.to_string_lossy()) {
                let reference = (!reference.is_empty()).then_some(reference);
                self.publishers.insert(publisher_id, Publisher { stream, reference, entry });
            }
        }
        self.respond(key::DECLARE_PUBLISHER, correlation_id, code)
    }

    fn publisher_refusal(&self, publisher_id: u8, reference: &Text, stream: &Text) -> ResponseCode {
        let broker = &self.node.broker;
        if broker.disk_alarm.load(Ordering::Acquire) || broker.memory_alarm.load(Ordering::Acquire) {
            return ResponseCode::PreconditionFailed;
        }
        if !self.permitted(Access::Write, stream) {
            return ResponseCode::AccessRefused;
        }
        let reference_taken = !reference.is_empty()
            && self.publishers.values().any(|publisher| &publisher.stream == stream && publisher.reference.as_ref() == Some(reference));
        // The store tracks references of 1 to 255 bytes.
        if self.publishers.contains_key(&publisher_id) || reference_taken || reference.len() > stream_codec::REFERENCE_BYTES_MAX {
            return ResponseCode::PreconditionFailed;
        }
        match self.node.registry.get(self.vhost(), &stream.to_string_lossy()) {
            None => ResponseCode::StreamDoesNotExist,
            Some(_) => ResponseCode::Ok,
        }
    }

    pub(super) fn publish(&mut self, publisher_id: u8, messages: PublishedMessages) -> Flow {
        // RabbitMQ counts a declared publisher's messages as received before its permission check
        // (`increase_messages_received`), and an unknown publisher's not at all.
        if self.publishers.contains_key(&publisher_id) {
            self.counts.received += u64::from(messages.message_count);
        }
        let refusal = match self.publishers.get(&publisher_id) {
            None => Some(ResponseCode::PublisherDoesNotExist),
            Some(publisher) if !self.permitted(Access::Write, &publisher.stream) => Some(ResponseCode::AccessRefused),
            Some(publisher) if publisher.entry.is_deleted() => Some(ResponseCode::StreamNotAvailable),
            Some(_) => None,
        };
        if let Some(code) = refusal {
            self.count_refusal(code);
            let errors = messages.iter().map(|published| PublishingError { publishing_id: published.publishing_id, code }).collect();
            self.send(&ServerCommand::PublishError { publisher_id, errors });
            return Flow::Continue;
        }
        let Some(publisher) = self.publishers.get(&publisher_id) else { return Flow::Continue };
        // A replicated stream is written by its leader: on another member the publish goes
        // there, as RabbitMQ routes a publish from any node to the stream's leader.
        if let Some(replication) = led_elsewhere(&publisher.entry) {
            let reference = publisher.reference.clone();
            return self.forward_publish(publisher_id, &replication, reference, messages);
        }
        let stream = publisher.entry.stream.clone();
        let reference = publisher.reference.clone();
        // Deduplication: with a reference, an entry whose id is not above the last one stored is
        // dropped (and confirmed), as osiris drops it.
        let mut last_id = reference.as_ref().and_then(|reference| stream.publisher_sequence(reference.as_bytes())).unwrap_or(0);
        let (mut entries, mut records) = (0usize, 0u64);
        let mut data = std::mem::take(&mut self.scratch);
        data.clear();
        let mut publishing_ids = Vec::with_capacity(messages.message_count.min(65_536) as usize);
        for published in messages.iter() {
            publishing_ids.push(published.publishing_id);
            if reference.is_some() && published.publishing_id <= last_id {
                continue;
            }
            last_id = last_id.max(published.publishing_id);
            data.extend_from_slice(published.entry.raw());
            entries += 1;
            records += u64::from(published.entry.record_count());
        }
        self.unconfirmed += publishing_ids.len() as u64;
        if entries == 0 {
            // Nothing to store (every message a duplicate, or an empty publish): confirmed now.
            self.scratch = data;
            let _ = self.confirms.send(Confirmed { publisher_id, publishing_ids, durable: true });
            return Flow::Continue;
        }
        if entries > usize::from(u16::MAX) || records > u64::from(u32::MAX) {
            self.scratch = data;
            return self.publish_failed(publisher_id, publishing_ids, "more entries than one chunk holds".to_string());
        }
        let batch = EntryBatch { data: &data, entries: entries as u16, records: records as u32 };
        let tracked = reference.as_ref().map(|reference| (reference.as_bytes(), last_id));
        let replication = publisher.entry.queue.replication().cloned();
        let epoch = replication.as_ref().and_then(|replication| replication.leading_epoch());
        let appended = stream.append_batch(&batch, tracked, now_ms());
        self.scratch = data;
        match appended {
            Ok(first_offset) => {
                let confirms = self.confirms.clone();
                let callback: Box<dyn FnOnce(bool) + Send> = Box::new(move |durable: bool| {
                    let _ = confirms.send(Confirmed { publisher_id, publishing_ids, durable });
                });
                match (replication, epoch) {
                    // Confirmed once the cluster commits it, not once it is on this disk.
                    (Some(replication), Some(epoch)) => {
                        replication.request_sync();
                        let waiter = CommitWaiter::Callback(callback);
                        replication.when_committed(first_offset + records, epoch, waiter);
                    }
                    (Some(_), None) => callback(false),
                    (None, _) => self.node.broker.syncer.sync_with_streams(Vec::new(), vec![stream], Some(callback)),
                }
                Flow::Continue
            }
            Err(error) => self.publish_failed(publisher_id, publishing_ids, error.to_string()),
        }
    }

    /// Sends a publish to the stream's leader whole, publishing ids and all (the leader
    /// deduplicates against its own tracking); confirmed once the leader says it is committed.
    fn forward_publish(
        &mut self,
        publisher_id: u8,
        replication: &StreamReplication,
        reference: Option<Text>,
        messages: PublishedMessages,
    ) -> Flow {
        let count = (messages.message_count as usize).min(65_536);
        let (mut entries, mut publishing_ids, mut data) = (Vec::with_capacity(count), Vec::with_capacity(count), Vec::new());
        for published in messages.iter() {
            let raw = published.entry.raw();
            publishing_ids.push(published.publishing_id);
            // A frame's length is a u32: so is any entry's in it.
            let length = u32::try_from(raw.len()).unwrap_or(u32::MAX);
            entries.push(ForwardedEntry {
                publishing_id: published.publishing_id,
                records: u32::from(published.entry.record_count()),
                length,
            });
            data.extend_from_slice(raw);
        }
        self.unconfirmed += publishing_ids.len() as u64;
        let confirms = self.confirms.clone();
        let waiter = CommitWaiter::Callback(Box::new(move |durable: bool| {
            let _ = confirms.send(Confirmed { publisher_id, publishing_ids, durable });
        }));
        let reference = reference.map(|reference| bytes::Bytes::copy_from_slice(reference.as_bytes()));
        replication.forward_entries(reference, entries, bytes::Bytes::from(data), waiter);
        Flow::Continue
    }

    fn publish_failed(&mut self, publisher_id: u8, publishing_ids: Vec<u64>, why: String) -> Flow {
        tracing::error!(peer = %self.peer, publisher_id, %why, "stream publish not stored");
        let _ = self.confirms.send(Confirmed { publisher_id, publishing_ids, durable: false });
        Flow::Continue
    }

    /// Sends the confirms (or errors) of a group commit.
    pub fn confirmed(&mut self, confirmed: Confirmed) {
        self.unconfirmed = self.unconfirmed.saturating_sub(confirmed.publishing_ids.len() as u64);
        // A publisher deleted meanwhile gets nothing, as with RabbitMQ.
        if !self.publishers.contains_key(&confirmed.publisher_id) {
            return;
        }
        if confirmed.durable {
            stream_codec::encode_publish_confirm(&mut self.outbox, confirmed.publisher_id, &confirmed.publishing_ids);
            self.counts.confirmed += confirmed.publishing_ids.len() as u64;
        } else {
            self.count_refusal(ResponseCode::InternalError);
            let errors = confirmed
                .publishing_ids
                .iter()
                .map(|&publishing_id| PublishingError { publishing_id, code: ResponseCode::InternalError })
                .collect();
            self.send(&ServerCommand::PublishError { publisher_id: confirmed.publisher_id, errors });
        }
    }

    pub(super) fn query_publisher_sequence(&mut self, correlation_id: u32, reference: &Text, stream: &Text) -> Flow {
        let (code, sequence) = if !self.permitted(Access::Read, stream) {
            (ResponseCode::AccessRefused, 0)
        } else {
            match self.node.registry.get(self.vhost(), &stream.to_string_lossy()) {
                None => (ResponseCode::StreamDoesNotExist, 0),
                Some(entry) => (ResponseCode::Ok, entry.stream.publisher_sequence(reference.as_bytes()).unwrap_or(0)),
            }
        };
        self.count_refusal(code);
        self.send(&ServerCommand::QueryPublisherSequenceResponse { correlation_id, code, sequence });
        Flow::Continue
    }

    pub(super) fn delete_publisher(&mut self, correlation_id: u32, publisher_id: u8) -> Flow {
        let code = match self.publishers.remove(&publisher_id) {
            Some(_) => ResponseCode::Ok,
            None => ResponseCode::PublisherDoesNotExist,
        };
        self.respond(key::DELETE_PUBLISHER, correlation_id, code)
    }

    pub(super) fn create(&mut self, correlation_id: u32, stream: &Text, arguments: &TextMap) -> Flow {
        // RabbitMQ strips CR and LF from the name, and refuses an empty one or one in amq.
        let name: String = stream.to_string_lossy().chars().filter(|character| !matches!(character, '\r' | '\n')).collect();
        let code = if name.is_empty() || name.starts_with("amq.") {
            ResponseCode::PreconditionFailed
        } else if !self.permitted(Access::Configure, &Text::from(name.as_str())) {
            ResponseCode::AccessRefused
        } else {
            match self.node.registry.create(self.vhost(), &name, arguments, self.connection_id) {
                Ok(()) => ResponseCode::Ok,
                Err(CreateRefusal::AlreadyExists) => ResponseCode::StreamAlreadyExists,
                Err(CreateRefusal::Precondition(why)) => {
                    tracing::info!(stream = name, %why, "stream not created");
                    ResponseCode::PreconditionFailed
                }
                Err(CreateRefusal::Internal(why)) => {
                    tracing::error!(stream = name, %why, "stream not created");
                    ResponseCode::InternalError
                }
            }
        };
        self.respond(key::CREATE, correlation_id, code)
    }

    pub(super) fn delete(&mut self, correlation_id: u32, stream: &Text) -> Flow {
        if !self.permitted(Access::Configure, stream) {
            return self.respond(key::DELETE, correlation_id, ResponseCode::AccessRefused);
        }
        let code = match self.node.registry.delete(self.vhost(), &stream.to_string_lossy()) {
            Ok(true) => ResponseCode::Ok,
            Ok(false) => ResponseCode::StreamDoesNotExist,
            Err(why) => {
                tracing::error!(stream = %stream, %why, "stream deleted with an error");
                ResponseCode::Ok
            }
        };
        self.respond(key::DELETE, correlation_id, code);
        if code == ResponseCode::Ok {
            self.forget_stream(stream);
        }
        Flow::Continue
    }

    /// Drops the publishers and subscriptions on a deleted stream and tells the client, as
    /// RabbitMQ does with a metadata update (STREAM_NOT_AVAILABLE) when it had any.
    pub(super) fn forget_stream(&mut self, stream: &Text) {
        let publishers_before = self.publishers.len();
        self.publishers.retain(|_, publisher| &publisher.stream != stream);
        let subscriptions_before = self.subscriptions.len();
        self.subscriptions.retain(|_, subscription| &subscription.stream != stream);
        if self.publishers.len() != publishers_before || self.subscriptions.len() != subscriptions_before {
            self.count_refusal(ResponseCode::StreamNotAvailable);
            self.send(&ServerCommand::MetadataUpdate { code: ResponseCode::StreamNotAvailable, stream: stream.clone() });
        }
    }

    pub(super) fn store_offset(&mut self, reference: &Text, stream: &Text, offset: u64) -> Flow {
        // No answer, whatever happens (RabbitMQ's fire-and-forget): refusals are logged.
        if !self.permitted(Access::Write, stream) {
            tracing::warn!(peer = %self.peer, stream = %stream, "not authorised to store an offset");
            return Flow::Continue;
        }
        let Some(entry) = self.node.registry.get(self.vhost(), &stream.to_string_lossy()) else {
            tracing::warn!(peer = %self.peer, stream = %stream, "offset stored on a stream that does not exist");
            return Flow::Continue;
        };
        // Only a replicated stream's leader writes it: another member sends the offset there.
        if let Some(replication) = led_elsewhere(&entry) {
            if !replication.forward_stored_offset(bytes::Bytes::copy_from_slice(reference.as_bytes()), offset) {
                tracing::warn!(peer = %self.peer, stream = %stream, "offset not stored: the stream's leader is not reachable");
            }
            return Flow::Continue;
        }
        match entry.stream.store_offset(reference.as_bytes(), offset, now_ms()) {
            Ok(()) => match entry.queue.replication() {
                Some(replication) => replication.request_sync(),
                None => self.node.broker.syncer.sync_with_streams(Vec::new(), vec![entry.stream.clone()], None),
            },
            Err(error) => tracing::warn!(peer = %self.peer, stream = %stream, %error, "offset not stored"),
        }
        Flow::Continue
    }

    pub(super) fn query_offset(&mut self, correlation_id: u32, reference: &Text, stream: &Text) -> Flow {
        let (code, offset) = if !self.permitted(Access::Read, stream) {
            (ResponseCode::AccessRefused, 0)
        } else {
            match self.node.registry.get(self.vhost(), &stream.to_string_lossy()) {
                None => (ResponseCode::StreamDoesNotExist, 0),
                Some(entry) => match entry.stream.query_offset(reference.as_bytes()) {
                    Some(offset) => (ResponseCode::Ok, offset),
                    None => (ResponseCode::NoOffset, 0),
                },
            }
        };
        self.count_refusal(code);
        self.send(&ServerCommand::QueryOffsetResponse { correlation_id, code, offset });
        Flow::Continue
    }

    pub(super) fn metadata(&mut self, correlation_id: u32, mut streams: Vec<Text>) -> Flow {
        // RabbitMQ folds over a map of the names and prepends: each name once, in reverse order.
        streams.sort();
        streams.dedup();
        streams.reverse();
        let topologies: Vec<(Text, Option<Topology>)> = streams
            .into_iter()
            .map(|stream| {
                let topology = self.topology(&stream);
                (stream, topology)
            })
            .collect();
        // Every node named, once, each referred to by its place in the list.
        let mut endpoints: Vec<Endpoint> = topologies
            .iter()
            .filter_map(|(_, topology)| topology.as_ref())
            .flat_map(|topology| topology.leader.iter().chain(&topology.replicas).cloned())
            .collect();
        endpoints.sort();
        endpoints.dedup();
        let reference = |endpoint: &Endpoint| endpoints.binary_search(endpoint).map_or(NO_LEADER, |index| index as u16);
        let streams: Vec<StreamMetadata> = topologies
            .into_iter()
            .map(|(stream, topology)| match topology {
                Some(topology) => StreamMetadata {
                    stream,
                    code: ResponseCode::Ok,
                    leader: topology.leader.as_ref().map_or(NO_LEADER, reference),
                    replicas: topology.replicas.iter().map(reference).collect(),
                },
                None => StreamMetadata { stream, code: ResponseCode::StreamDoesNotExist, leader: NO_LEADER, replicas: Vec::new() },
            })
            .collect();
        let brokers = endpoints
            .iter()
            .enumerate()
            .map(|(index, (host, port))| Broker { reference: index as u16, host: Text::from(host.as_str()), port: u32::from(*port) })
            .collect();
        self.send(&ServerCommand::MetadataResponse { correlation_id, brokers, streams });
        Flow::Continue
    }

    /// Where a stream is led and copied, as its clients connect: `None` when it does not exist.
    /// A replicated stream's members whose node is not linked now are left out (RabbitMQ leaves
    /// out a node it cannot reach); its leader is unnamed while it has none reachable.
    fn topology(&self, stream: &Text) -> Option<Topology> {
        let entry = self.node.registry.get(self.vhost(), &stream.to_string_lossy())?;
        let own = (self.node.advertised_host.clone(), self.node.advertised_port);
        let cluster = self.node.broker.cluster.get().filter(|_| entry.queue.replication().is_some());
        let key = StreamKey { vhost: self.vhost().to_string(), name: stream.to_string_lossy() };
        let Some((cluster, leadership)) = cluster.and_then(|cluster| Some((cluster, cluster.stream_leadership(&key)?))) else {
            return Some(Topology { leader: Some(own), replicas: Vec::new() });
        };
        let endpoints = cluster.stream_endpoints();
        let endpoint = |id: u64| if id == cluster.node_id { Some(own.clone()) } else { endpoints.get(&id).cloned() };
        let replicas = leadership.members.iter().filter(|&&id| id != leadership.leader).filter_map(|&id| endpoint(id)).collect();
        Some(Topology { leader: endpoint(leadership.leader), replicas })
    }
}

/// The replication of a stream this node holds but does not lead (its writes go to the leader).
fn led_elsewhere(entry: &StreamEntry) -> Option<Arc<StreamReplication>> {
    entry.queue.replication().filter(|replication| replication.leading_epoch().is_none()).cloned()
}

/// A node's stream endpoint: the host and port its clients connect to.
type Endpoint = (String, u16);

/// A stream's leader and replicas, as `metadata` names them.
struct Topology {
    leader: Option<Endpoint>,
    replicas: Vec<Endpoint>,
}
