//! One task per stream consumer: reads committed chunks from the consumer's position (file I/O on
//! tokio's blocking pool, never on an async worker), splits them into records and delivers them
//! while the consumer has credit (its prefetch minus its unacked deliveries), the channel's flow is
//! on and its connection's writer has room. Otherwise it sleeps until woken: by the stream's commit
//! (new chunks), an ack (credit), the writer draining, or a cancel.
//!
//! Bounds: one blocking read takes at most [`READ_BATCH_BYTES`] of chunks (plus one chunk), and a
//! consumer holds at most one such batch of records in memory; the prefetch bounds what is in
//! flight to the client.

use super::queue::StreamQueue;
use crate::queue_type::{Queue, WeakQueue};
use crate::shared::{ConsumerHandle, Outbound, Readiness};
use amqp_codec::{ContentHeader, FieldTable, FieldValue};
use broker_core::Message;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use storage::stream::chunk::{Entries, Entry};
use storage::stream::{StreamError, StreamReader};

/// How many bytes of chunks one blocking read takes at most (it takes at least one chunk).
pub const READ_BATCH_BYTES: usize = 1 << 20;

/// A consumer's half that its queue holds: the handle, and how to wake or stop its task.
#[derive(Debug)]
pub struct ConsumerTask {
    /// The consumer.
    pub handle: Arc<ConsumerHandle>,
    wake: tokio::sync::Notify,
    stopped: AtomicBool,
}

impl ConsumerTask {
    /// A task's shared half for `handle`.
    pub fn new(handle: Arc<ConsumerHandle>) -> ConsumerTask {
        ConsumerTask { handle, wake: tokio::sync::Notify::new(), stopped: AtomicBool::new(false) }
    }

    /// Makes the task look again. A wake while it is busy is kept (one permit), never lost.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Ends the task.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire) || self.handle.cancelled.load(Ordering::Acquire)
    }
}

/// Starts the consumer's task on the current tokio runtime.
pub fn start(queue: Arc<StreamQueue>, task: Arc<ConsumerTask>, reader: StreamReader) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(run(queue, task, reader));
        }
        Err(_) => tracing::error!("a stream consumer was started outside the runtime; it gets nothing"),
    }
}

/// What delivering the records in hand came to.
enum Progress {
    /// All delivered.
    Drained,
    /// The consumer cannot take more now.
    Blocked,
    /// Its channel closed: the task ends.
    ChannelClosed,
}

async fn run(queue: Arc<StreamQueue>, task: Arc<ConsumerTask>, reader: StreamReader) {
    let start_offset = reader.start_offset();
    let mut reader = Some(reader);
    let mut records: VecDeque<(u64, Bytes)> = VecDeque::new();
    loop {
        if task.is_stopped() || queue.is_deleted() {
            return;
        }
        if !records.is_empty() {
            match deliver_ready(&queue, &task.handle, &mut records) {
                Progress::Drained => continue,
                Progress::Blocked => {
                    task.wake.notified().await;
                    continue;
                }
                Progress::ChannelClosed => return,
            }
        }
        let Some(taken) = reader.take() else { return };
        let Ok((returned, read)) = tokio::task::spawn_blocking(move || read_batch(taken)).await else { return };
        reader = Some(returned);
        match read {
            Ok(batch) if batch.is_empty() => task.wake.notified().await,
            Ok(batch) => records.extend(batch.into_iter().filter(|(offset, _)| *offset >= start_offset)),
            Err(StreamError::Deleted) => return,
            Err(error) => {
                tracing::error!(queue = %queue.name(), consumer = %task.handle.tag, %error, "a stream consumer stops: its stream could not be read");
                return;
            }
        }
    }
}

/// Reads committed chunks (at least one, if there is one; at most about [`READ_BATCH_BYTES`]) and
/// splits them into records with their offsets. Runs on a blocking thread.
fn read_batch(mut reader: StreamReader) -> (StreamReader, Result<Vec<(u64, Bytes)>, StreamError>) {
    let mut records = Vec::new();
    let mut bytes = 0;
    while bytes < READ_BATCH_BYTES {
        let mut data = Vec::new();
        let header = match reader.read_chunk(&mut data) {
            Ok(Some(header)) => header,
            Ok(None) => break,
            Err(error) => return (reader, Err(error)),
        };
        bytes += data.len();
        let chunk = Bytes::from(data);
        split_records(&chunk, header.first_offset, &mut records);
    }
    (reader, Ok(records))
}

/// The records of a chunk's data with their offsets. A sub-batch (records a stream protocol
/// client batched) is split when uncompressed; a compressed one is skipped, its offsets too.
fn split_records(chunk: &Bytes, first_offset: u64, records: &mut Vec<(u64, Bytes)>) {
    let mut offset = first_offset;
    for entry in Entries::new(chunk) {
        match entry {
            Ok(Entry::Simple(body)) => {
                records.push((offset, slice_of(chunk, body)));
                offset += 1;
            }
            Ok(Entry::SubBatch { compression: 0, records: count, body, .. }) => {
                let end = offset + u64::from(count);
                let mut rest = body;
                for _ in 0..count {
                    let Some(length) = rest.get(..4).map(|bytes| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize)
                    else {
                        break;
                    };
                    let Some(record) = rest.get(4..4 + length) else { break };
                    records.push((offset, slice_of(chunk, record)));
                    rest = &rest[4 + length..];
                    offset += 1;
                }
                // Offsets of records a damaged sub-batch did not hold are skipped, not reused.
                offset = end;
            }
            Ok(entry) => {
                tracing::warn!(
                    records = entry.records(),
                    "skipping a compressed sub-batch: AMQP 0-9-1 consumers get uncompressed records only"
                );
                offset += u64::from(entry.records());
            }
            // Checked against the header when read: cannot happen.
            Err(_) => break,
        }
    }
}

fn slice_of(chunk: &Bytes, part: &[u8]) -> Bytes {
    let start = part.as_ptr() as usize - chunk.as_ptr() as usize;
    chunk.slice(start..start + part.len())
}

/// Delivers records while the consumer is ready.
fn deliver_ready(queue: &Arc<StreamQueue>, consumer: &Arc<ConsumerHandle>, records: &mut VecDeque<(u64, Bytes)>) -> Progress {
    while let Some((offset, record)) = records.front() {
        match consumer.readiness() {
            Readiness::Ready => {}
            Readiness::WriterFull => {
                consumer.channel.connection.note_stalled(WeakQueue::Stream(Arc::downgrade(queue)));
                // It may have drained between the check and the note: look once more.
                if consumer.readiness() != Readiness::Ready {
                    return Progress::Blocked;
                }
            }
            Readiness::Blocked => return Progress::Blocked,
        }
        let message = match to_message(queue, *offset, record) {
            Some(message) => message,
            None => {
                records.pop_front();
                continue;
            }
        };
        if !deliver(queue, consumer, *offset, message) {
            return Progress::ChannelClosed;
        }
        records.pop_front();
    }
    Progress::Drained
}

/// A record as the message an AMQP 0-9-1 consumer gets, with its `x-stream-offset` header.
fn to_message(queue: &StreamQueue, offset: u64, record: &Bytes) -> Option<Arc<Message>> {
    let decoded = match super::record::decode(record, record, queue.name()) {
        Ok(decoded) => decoded,
        Err(error) => {
            tracing::warn!(queue = %queue.name(), offset, %error, "skipping a stream record that is not an AMQP 1.0 message");
            return None;
        }
    };
    let mut properties = decoded.properties;
    // RabbitMQ adds the header with `rabbit_misc:set_table_value`, which replaces a header of the
    // same name and sorts the table by name (measured: headers come back sorted).
    let headers = properties.headers.get_or_insert_with(FieldTable::new);
    headers.0.retain(|(key, _)| key.as_bytes() != b"x-stream-offset");
    headers.insert("x-stream-offset", FieldValue::I64(offset as i64));
    headers.0.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
    let header = ContentHeader::from_properties(60, decoded.body.len() as u64, &properties);
    Some(Arc::new(Message {
        exchange: decoded.exchange,
        routing_key: decoded.routing_key,
        header,
        body: decoded.body,
        published_at_ns: 0,
        bcc_routing_keys: None,
    }))
}

/// Hands one delivery to the consumer's channel; false when the channel has closed.
fn deliver(queue: &Arc<StreamQueue>, consumer: &Arc<ConsumerHandle>, offset: u64, message: Arc<Message>) -> bool {
    let channel = &consumer.channel;
    let mut ledger = channel.ledger.lock();
    if !ledger.open {
        return false;
    }
    ledger.last_tag += 1;
    let delivery_tag = ledger.last_tag;
    ledger.counters.count_delivery(false, false, false);
    ledger.track(delivery_tag, Queue::Stream(queue.clone()), offset, Some(consumer.clone()));
    consumer.count_delivery();
    channel.connection.outbound_deliveries.fetch_add(1, Ordering::AcqRel);
    channel.connection.send(Outbound::Deliver {
        channel: channel.id,
        consumer_tag: consumer.tag.clone(),
        delivery_tag,
        redelivered: false,
        message,
    });
    queue.delivered.fetch_add(1, Ordering::Relaxed);
    true
}
