//! A consumer: one connection, one channel, manual acks in (optionally random-sized) batches.

use crate::control::Control;
use crate::stats::{Clock, Metric, WorkerStats};
use amqp_codec::{FramePayload, Method};
use lepus_client::{AmqpUrl, ClientError, Connection, ConnectionOptions, FrameReader, FrameWriter};
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Where a consumer takes messages from.
#[derive(Debug, Clone)]
pub enum Source {
    /// An existing queue.
    Queue(String),
    /// A subscription to an exchange: its own queue bound with `#` (and `` for fanout).
    Subscription {
        /// The exchange.
        exchange: String,
        /// Queue name for a durable subscription; `None` = exclusive, server-named.
        durable_queue: Option<String>,
    },
}

/// What one consumer does.
#[derive(Clone)]
pub struct ConsumerSpec {
    /// For connection names and errors.
    pub name: String,
    /// Broker.
    pub url: AmqpUrl,
    /// Queue or subscription.
    pub source: Source,
    /// basic.qos prefetch count.
    pub prefetch: u16,
    /// Ack every A..=B messages (random in the range), multiple=true.
    pub ack_every: (u32, u32),
    /// `x-stream-offset` of the consumer (stream queues), as given.
    pub stream_offset: Option<String>,
}

/// Most frames handled before acks are flushed, so acks go out even under a flood.
const FRAMES_PER_FLUSH_MAX: usize = 4096;

/// Runs one consumer until the control says stop or the broker fails. `ready` fires once the
/// consumer is registered, so producers start only when every subscription exists.
pub async fn run_consumer(
    spec: ConsumerSpec,
    control: Arc<Control>,
    stats: Arc<WorkerStats>,
    clock: Clock,
    ready: oneshot::Sender<Result<(), String>>,
) -> Result<(), ClientError> {
    let setup = async {
        let options = ConnectionOptions { connection_name: spec.name.clone(), ..ConnectionOptions::default() };
        let mut connection = Connection::open(&spec.url, &options).await?;
        connection.channel_open(1).await?;
        // A prefetch below the ack batch would stall: the broker waits for acks we never send.
        let prefetch = spec.prefetch.max(spec.ack_every.1.min(u32::from(u16::MAX)) as u16);
        connection.basic_qos(1, prefetch).await?;
        let queue = match &spec.source {
            Source::Queue(queue) => queue.clone(),
            Source::Subscription { exchange, durable_queue } => {
                let declared = match durable_queue {
                    Some(name) => connection.queue_declare(1, name, true, false, false).await?,
                    None => connection.queue_declare(1, "", false, true, true).await?,
                };
                connection.queue_bind(1, &declared.queue, exchange, "#").await?;
                declared.queue
            }
        };
        let mut arguments = amqp_codec::FieldTable::new();
        if let Some(offset) = &spec.stream_offset {
            arguments.insert("x-stream-offset", stream_offset_value(offset));
        }
        connection.basic_consume_with_arguments(1, &queue, false, arguments).await?;
        Ok::<_, ClientError>(connection.split())
    };
    let (reader, writer) = match setup.await {
        Ok(halves) => {
            let _ = ready.send(Ok(()));
            halves
        }
        Err(error) => {
            let _ = ready.send(Err(error.to_string()));
            return Err(error);
        }
    };
    consume(spec, reader, writer, control, stats, clock).await
}

async fn consume(
    spec: ConsumerSpec,
    mut reader: FrameReader,
    mut writer: FrameWriter,
    control: Arc<Control>,
    stats: Arc<WorkerStats>,
    clock: Clock,
) -> Result<(), ClientError> {
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut next_ack_after = u64::from(rng.gen_range(spec.ack_every.0..=spec.ack_every.1));
    let mut unacked = 0u64;
    let mut last_tag = 0u64;
    let mut last_delivery = Instant::now();
    // Body of the message being assembled: bytes still expected; the timestamp is read from
    // the first body frame.
    let mut body_left = 0u64;
    let mut awaiting_header = false;
    let mut timestamp_pending = false;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        if control.stopped() {
            break;
        }
        if control.paused() {
            // Not reading leaves the messages with the broker: at most a prefetch is in flight.
            tick.tick().await;
            writer.heartbeat_if_due();
            writer.flush().await?;
            continue;
        }
        let first = tokio::select! {
            frame = reader.next_frame() => Some(frame?),
            _ = tick.tick() => None,
        };
        let Some(first) = first else {
            // Idle: ack what a partial batch left behind so the broker can move on.
            if unacked > 0 && last_delivery.elapsed() >= Duration::from_millis(100) {
                writer.ack(1, last_tag, true);
                unacked = 0;
            }
            writer.heartbeat_if_due();
            writer.flush().await?;
            continue;
        };
        let mut frame = Some(first);
        let mut handled = 0;
        let mut received = 0u64;
        let mut received_bytes = 0u64;
        let mut latencies_ns = [0u64; 64];
        let mut latency_count = 0usize;
        while let Some(current) = frame.take() {
            match current.payload {
                FramePayload::Method(Method::BasicDeliver(deliver)) => {
                    last_tag = deliver.delivery_tag;
                    awaiting_header = true;
                }
                FramePayload::Method(Method::BasicCancel(_)) => {
                    return Err(ClientError::Protocol("the broker cancelled the consumer (queue deleted?)".to_string()))
                }
                FramePayload::Header(header) if awaiting_header => {
                    awaiting_header = false;
                    body_left = header.body_size;
                    timestamp_pending = true;
                    received_bytes += header.body_size;
                    if body_left == 0 {
                        received += 1;
                        unacked += 1;
                    }
                }
                FramePayload::Body(body) => {
                    if timestamp_pending && body.len() >= 8 {
                        let mut stamp = [0u8; 8];
                        stamp.copy_from_slice(&body[..8]);
                        let sent_ns = u64::from_be_bytes(stamp);
                        let now_ns = clock.now_wall_ns();
                        latencies_ns[latency_count] = now_ns.saturating_sub(sent_ns);
                        latency_count += 1;
                        if latency_count == latencies_ns.len() {
                            record(&stats, &latencies_ns);
                            latency_count = 0;
                        }
                    }
                    timestamp_pending = false;
                    body_left = body_left.saturating_sub(body.len() as u64);
                    if body_left == 0 {
                        received += 1;
                        unacked += 1;
                    }
                }
                _ => {}
            }
            if unacked >= next_ack_after {
                writer.ack(1, last_tag, true);
                unacked = 0;
                next_ack_after = u64::from(rng.gen_range(spec.ack_every.0..=spec.ack_every.1));
            }
            handled += 1;
            if handled < FRAMES_PER_FLUSH_MAX {
                frame = reader.buffered_frame()?;
            }
        }
        record(&stats, &latencies_ns[..latency_count]);
        stats.received.fetch_add(received, Ordering::Relaxed);
        stats.received_bytes.fetch_add(received_bytes, Ordering::Relaxed);
        if received > 0 {
            last_delivery = Instant::now();
        }
        writer.flush().await?;
    }
    if unacked > 0 {
        writer.ack(1, last_tag, true);
    }
    writer.method(
        0,
        &Method::ConnectionClose(amqp_codec::ConnectionClose {
            reply_code: 200,
            reply_text: amqp_codec::ShortStr::from_static("Goodbye"),
            ..Default::default()
        }),
    );
    let _ = writer.flush().await;
    Ok(())
}

fn record(stats: &WorkerStats, latencies_ns: &[u64]) {
    if latencies_ns.is_empty() {
        return;
    }
    stats.record_with(Metric::Transfer, |histogram| {
        for &latency in latencies_ns {
            histogram.saturating_record(latency.max(1));
        }
    });
}

/// `x-stream-offset` as given on the command line: a number is an offset, `@MS` a timestamp (an
/// AMQP timestamp is in seconds), anything else (first, last, next, an interval such as `1h`) is
/// sent as a string.
fn stream_offset_value(offset: &str) -> amqp_codec::FieldValue {
    if let Some(milliseconds) = offset.strip_prefix('@').and_then(|text| text.parse::<u64>().ok()) {
        return amqp_codec::FieldValue::Timestamp(milliseconds / 1000);
    }
    match offset.parse::<i64>() {
        Ok(number) => amqp_codec::FieldValue::I64(number),
        Err(_) => amqp_codec::FieldValue::LongStr(bytes::Bytes::copy_from_slice(offset.as_bytes())),
    }
}
