//! Subscriptions: a reader of the store per subscription, chunks sent whole while the client's
//! credit lasts (one chunk per credit), never decoded. A chunk of [`SENDFILE_BYTES_MIN`] or more
//! goes from the page cache to the socket with `sendfile`, as osiris sends it: the broker writes
//! the deliver frame's header and never touches the data, whose CRC the client checks (RabbitMQ's
//! clients do by default). A smaller chunk is read with one read (CRC checked here) into the
//! outbox, so that many of them leave in one write instead of two system calls each.

use super::registry::StreamEntry;
use super::session::{Flow, Session};
use crate::auth::Access;
use std::sync::Arc;
use storage::file_system::StorageFile;
use storage::stream::chunk::ChunkDefect;
use storage::stream::{ChunkLocation, ChunkSelector, OffsetSpec, StreamReader};
use stream_codec::{encode_deliver_header, key, OffsetSpecification, ResponseCode, ServerCommand, Text, CHUNK_HEADER_BYTES};

/// The first byte of a delivered chunk header: magic 5, version 0, as osiris 1.3.1 (RabbitMQ
/// 3.10.8) writes it; the store writes the later version 1, which 3.10's clients never saw.
const DELIVERED_MAGIC_AND_VERSION: u8 = 0x50;
/// The most credit a subscription accumulates (chunks): far above any client's window, it keeps
/// the counter from wrapping under a client that grants without reading.
const CREDIT_MAX: u32 = 1 << 20;
/// The smallest chunk data sent with `sendfile`: below it, copying into the outbox and one write
/// for many chunks is cheaper than a header write and a `sendfile` per chunk (a 16-byte message
/// stream's chunks are about 3 KiB, a 1 KiB one's about 100 KiB).
pub const SENDFILE_BYTES_MIN: usize = 32 * 1024;

/// Chunk data the connection task sends from its segment file, after the outbox's first
/// `outbox_at` bytes (the frame's header) and before the rest.
pub struct FileSpan {
    /// How much of the outbox goes before it.
    pub outbox_at: usize,
    /// The segment file, held open until it is sent (the file cache may close its own handle).
    pub file: Arc<dyn StorageFile>,
    /// Where the data starts in the file.
    pub position: u64,
    /// How many bytes.
    pub bytes: usize,
}

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

    /// Sends committed chunks to the subscriptions that have credit, until the outbox and the file
    /// spans hold `budget_bytes`. Returns true when it stopped for the budget (more is ready now),
    /// false when every subscription is out of credit or at the committed end (wait for a commit
    /// or a credit). Chunk reads are blocking file reads (of the page cache, mostly): they run in
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
                if self.outbox.len() + span_bytes(&self.file_spans) >= budget_bytes {
                    budget_left = false;
                    break;
                }
                let next = tokio::task::block_in_place(|| subscription.reader.next_chunk());
                let failure = match next {
                    Ok(Some(location)) => {
                        let sent =
                            Self::frame_chunk(&mut self.outbox, &mut self.chunk_buffer, &mut self.file_spans, *subscription_id, &location);
                        match sent {
                            Ok(()) => {
                                subscription.credit -= 1;
                                // RabbitMQ counts a chunk's entries (a sub-entry batch is one), as sent.
                                self.counts.delivered += u64::from(location.header.entries);
                                continue;
                            }
                            Err(defect) => format!("chunk at {} (offset {}): {defect}", location.position, location.header.first_offset),
                        }
                    }
                    Ok(None) => break,
                    Err(error) => error.to_string(),
                };
                tracing::error!(peer = %self.peer, stream = %subscription.stream, error = %failure, "stream read failed: subscription dropped");
                gone.push(subscription.stream.clone());
                break;
            }
        }
        for stream in gone {
            self.forget_stream(&stream);
        }
        !budget_left
    }

    /// Writes one chunk's deliver frame: the header into the outbox, then the data as a file span
    /// (large chunks from a real file) or read into the outbox (CRC checked).
    fn frame_chunk(
        outbox: &mut bytes::BytesMut,
        chunk_buffer: &mut Vec<u8>,
        file_spans: &mut Vec<FileSpan>,
        subscription_id: u8,
        location: &ChunkLocation,
    ) -> Result<(), ChunkDefect> {
        let data_bytes = location.header.data_bytes as usize;
        let from_file = data_bytes >= SENDFILE_BYTES_MIN && location.file.raw_fd().is_some();
        if !from_file {
            tokio::task::block_in_place(|| location.read_data(chunk_buffer))?;
        }
        let mut header_bytes: [u8; CHUNK_HEADER_BYTES] = location.header.encode();
        header_bytes[0] = DELIVERED_MAGIC_AND_VERSION;
        encode_deliver_header(outbox, subscription_id, CHUNK_HEADER_BYTES + data_bytes);
        outbox.extend_from_slice(&header_bytes);
        if from_file {
            let span =
                FileSpan { outbox_at: outbox.len(), file: location.file.clone(), position: location.data_position(), bytes: data_bytes };
            file_spans.push(span);
        } else {
            outbox.extend_from_slice(chunk_buffer);
        }
        Ok(())
    }
}

/// The chunk data waiting in file spans, counted against the delivery budget with the outbox (a
/// few dozen spans at most: each is 32 KiB or more of a 1 MiB budget).
fn span_bytes(file_spans: &[FileSpan]) -> usize {
    file_spans.iter().map(|span| span.bytes).sum()
}
