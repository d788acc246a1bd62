//! Subscriptions: a reader of the store per subscription, chunks sent whole while the client's
//! credit lasts (one chunk per credit), never decoded: the store reads a chunk's data entries
//! with one read (CRC checked) and the deliver frame carries them after the 48-byte header.

use super::registry::StreamEntry;
use super::session::{Flow, Session};
use crate::auth::Access;
use std::sync::Arc;
use storage::stream::{ChunkSelector, OffsetSpec, StreamReader};
use stream_codec::{encode_deliver_header, key, OffsetSpecification, ResponseCode, ServerCommand, Text, CHUNK_HEADER_BYTES};

/// The first byte of a delivered chunk header: magic 5, version 0, as osiris 1.3.1 (RabbitMQ
/// 3.10.8) writes it; the store writes the later version 1, which 3.10's clients never saw.
const DELIVERED_MAGIC_AND_VERSION: u8 = 0x50;
/// The most credit a subscription accumulates (chunks): far above any client's window, it keeps
/// the counter from wrapping under a client that grants without reading.
const CREDIT_MAX: u32 = 1 << 20;

/// One subscription.
pub struct Subscription {
    /// The stream's name.
    pub stream: Text,
    /// The stream.
    pub entry: Arc<StreamEntry>,
    reader: StreamReader,
    /// Chunks the client will take before it grants more.
    credit: u32,
}

fn offset_spec(offset: OffsetSpecification) -> OffsetSpec {
    match offset {
        OffsetSpecification::First => OffsetSpec::First,
        OffsetSpecification::Last => OffsetSpec::Last,
        OffsetSpecification::Next => OffsetSpec::Next,
        OffsetSpecification::Offset(offset) => OffsetSpec::Offset(offset),
        OffsetSpecification::Timestamp(timestamp_ms) => OffsetSpec::Timestamp(timestamp_ms),
    }
}

impl Session {
    pub(super) fn subscribe(
        &mut self,
        correlation_id: u32,
        subscription_id: u8,
        stream: Text,
        offset: OffsetSpecification,
        credit: u16,
    ) -> Flow {
        let code = if !self.permitted(Access::Read, &stream) {
            ResponseCode::AccessRefused
        } else {
            match self.node.registry.get(self.vhost(), &stream.to_string_lossy()) {
                None => ResponseCode::StreamDoesNotExist,
                Some(_) if self.subscriptions.contains_key(&subscription_id) => ResponseCode::SubscriptionIdAlreadyExists,
                Some(entry) => match entry.stream.reader(offset_spec(offset), ChunkSelector::UserData) {
                    Ok(reader) => {
                        entry.watch(&self.wake);
                        let subscription = Subscription { stream, entry, reader, credit: u32::from(credit) };
                        self.subscriptions.insert(subscription_id, subscription);
                        ResponseCode::Ok
                    }
                    Err(error) => {
                        tracing::error!(peer = %self.peer, %error, "stream reader not opened");
                        ResponseCode::InternalError
                    }
                },
            }
        };
        self.respond(key::SUBSCRIBE, correlation_id, code)
    }

    pub(super) fn credit(&mut self, subscription_id: u8, credit: u16) -> Flow {
        match self.subscriptions.get_mut(&subscription_id) {
            Some(subscription) => subscription.credit = (subscription.credit + u32::from(credit)).min(CREDIT_MAX),
            None => {
                // The one answer a credit gets, without a correlation id.
                self.count_refusal(ResponseCode::SubscriptionIdDoesNotExist);
                self.send(&ServerCommand::CreditResponse { code: ResponseCode::SubscriptionIdDoesNotExist, subscription_id });
            }
        }
        Flow::Continue
    }

    pub(super) fn unsubscribe(&mut self, correlation_id: u32, subscription_id: u8) -> Flow {
        let code = match self.subscriptions.remove(&subscription_id) {
            Some(_) => ResponseCode::Ok,
            None => ResponseCode::SubscriptionIdDoesNotExist,
        };
        self.respond(key::UNSUBSCRIBE, correlation_id, code)
    }

    /// Sends committed chunks to the subscriptions that have credit, until the outbox holds
    /// `budget_bytes`. Returns true when it stopped for the budget (more is ready now), false
    /// when every subscription is out of credit or at the committed end (wait for a commit or a
    /// credit). Chunk reads are blocking file reads (of the page cache, mostly): they run in
    /// `block_in_place`, so the runtime moves its other tasks off this worker meanwhile.
    pub fn deliver(&mut self, budget_bytes: usize) -> bool {
        let mut gone: Vec<Text> = Vec::new();
        let mut budget_left = true;
        for (subscription_id, subscription) in self.subscriptions.iter_mut() {
            if subscription.entry.is_deleted() {
                gone.push(subscription.stream.clone());
                continue;
            }
            while subscription.credit > 0 {
                if self.outbox.len() >= budget_bytes {
                    budget_left = false;
                    break;
                }
                let read = tokio::task::block_in_place(|| subscription.reader.read_chunk(&mut self.chunk_buffer));
                match read {
                    Ok(Some(header)) => {
                        let mut header_bytes: [u8; CHUNK_HEADER_BYTES] = header.encode();
                        header_bytes[0] = DELIVERED_MAGIC_AND_VERSION;
                        encode_deliver_header(&mut self.outbox, *subscription_id, CHUNK_HEADER_BYTES + self.chunk_buffer.len());
                        self.outbox.extend_from_slice(&header_bytes);
                        self.outbox.extend_from_slice(&self.chunk_buffer);
                        subscription.credit -= 1;
                        // RabbitMQ counts a chunk's entries (a sub-entry batch is one), as sent.
                        self.counts.delivered += u64::from(header.entries);
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::error!(peer = %self.peer, stream = %subscription.stream, %error, "stream read failed: subscription dropped");
                        gone.push(subscription.stream.clone());
                        break;
                    }
                }
            }
        }
        for stream in gone {
            self.forget_stream(&stream);
        }
        !budget_left
    }
}
