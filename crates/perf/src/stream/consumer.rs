//! A stream-protocol consumer: one connection, one subscription with `--stream-credit` chunks
//! of initial credit and one more per chunk received (what RabbitMQ's Go client does), the send
//! time read from each message for the end-to-end latency.

use super::connection::{StreamConnection, StreamError, StreamReader, StreamUrl, StreamWriter};
use super::message;
use crate::control::Control;
use crate::stats::{Clock, Metric, WorkerStats};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use stream_codec::{chunk_type, Chunk, ClientCommand, OffsetSpecification, ResponseCode, ServerCommand, Text};
use tokio::sync::oneshot;

/// The subscription id every lepus perf consumer uses (one subscription per connection).
const SUBSCRIPTION_ID: u8 = 1;
/// Most commands handled before credits are flushed, so credit goes out even under a flood.
const COMMANDS_PER_FLUSH_MAX: usize = 1024;

/// What one stream consumer does.
#[derive(Clone)]
pub struct StreamConsumerSpec {
    /// For connection names and errors.
    pub name: String,
    /// Server.
    pub url: StreamUrl,
    /// Stream to read.
    pub stream: String,
    /// Where to start.
    pub offset: OffsetSpecification,
    /// Initial credit, in chunks.
    pub credit: u16,
}

/// Parses `--stream-offset`: `first`, `last`, `next`, a number, or `@MS`.
pub fn parse_offset(text: &str) -> Result<OffsetSpecification, String> {
    Ok(match text {
        "first" => OffsetSpecification::First,
        "last" => OffsetSpecification::Last,
        "next" => OffsetSpecification::Next,
        _ => match text.strip_prefix('@') {
            Some(ms) => {
                OffsetSpecification::Timestamp(ms.parse().map_err(|_| format!("--stream-offset {text:?}: @MS needs milliseconds"))?)
            }
            None => OffsetSpecification::Offset(
                text.parse().map_err(|_| format!("--stream-offset {text:?}: expected first, last, next, an offset or @MS"))?,
            ),
        },
    })
}

/// How long a subscription refused with STREAM_NOT_AVAILABLE is asked for again.
const SUBSCRIBE_RETRY_MS: u64 = 10_000;

/// The pause between those attempts.
const SUBSCRIBE_RETRY_PAUSE_MS: u64 = 200;

/// Runs one consumer until the control says stop or the server fails. `ready` fires once the
/// subscription exists, so producers start only when every consumer can see what they send.
pub async fn run_stream_consumer(
    spec: StreamConsumerSpec,
    control: Arc<Control>,
    stats: Arc<WorkerStats>,
    clock: Clock,
    ready: oneshot::Sender<Result<(), String>>,
) -> Result<(), StreamError> {
    let setup = async {
        let mut connection = StreamConnection::open(&spec.url, &spec.name).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(SUBSCRIBE_RETRY_MS);
        loop {
            let stream = Text::from(spec.stream.as_str());
            let subscribed = connection
                .request("subscribe", |correlation_id| ClientCommand::Subscribe {
                    correlation_id,
                    subscription_id: SUBSCRIPTION_ID,
                    stream,
                    offset: spec.offset,
                    credit: spec.credit,
                    properties: Vec::new(),
                })
                .await;
            match subscribed {
                // A replica just created may not serve readers yet (RabbitMQ's answer until its
                // member starts): asked again, as RabbitMQ's clients do.
                Err(StreamError::Refused { code: ResponseCode::StreamNotAvailable, .. }) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(SUBSCRIBE_RETRY_PAUSE_MS)).await;
                }
                other => {
                    other?;
                    break;
                }
            }
        }
        Ok::<_, StreamError>(connection.split())
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
    let first_offset = match spec.offset {
        OffsetSpecification::Offset(offset) => offset,
        _ => 0,
    };
    consume(reader, writer, first_offset, control, stats, clock).await
}

async fn consume(
    mut reader: StreamReader,
    mut writer: StreamWriter,
    first_offset: u64,
    control: Arc<Control>,
    stats: Arc<WorkerStats>,
    clock: Clock,
) -> Result<(), StreamError> {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    // Credit withheld while paused, given back on resume.
    let mut credit_owed = 0u32;
    let mut tally = Tally::default();
    loop {
        if control.stopped() {
            break;
        }
        if control.paused() {
            // Without credit the server stops after the chunks in flight: at most the credit.
            tick.tick().await;
            writer.heartbeat_if_due();
            writer.flush().await?;
            continue;
        }
        let first = tokio::select! {
            command = reader.next() => Some(command?),
            _ = tick.tick() => None,
        };
        let mut command = first;
        let mut handled = 0;
        while let Some(current) = command.take() {
            match current {
                ServerCommand::Deliver { chunk, .. } => {
                    tally.chunk(chunk, first_offset, &clock);
                    credit_owed += 1;
                }
                ServerCommand::MetadataUpdate { stream, code } => {
                    return Err(StreamError::Protocol(format!("stream {stream} is gone: {code}")));
                }
                _ => {}
            }
            handled += 1;
            if handled < COMMANDS_PER_FLUSH_MAX {
                command = reader.buffered()?;
            }
        }
        tally.record_and_reset(&stats);
        while credit_owed > 0 {
            let credit = credit_owed.min(u32::from(u16::MAX)) as u16;
            writer.command(&ClientCommand::Credit { subscription_id: SUBSCRIPTION_ID, credit });
            credit_owed -= u32::from(credit);
        }
        writer.heartbeat_if_due();
        writer.flush().await?;
    }
    writer.close().await;
    Ok(())
}

/// What a burst of chunks held: records, payload bytes and end-to-end latencies.
#[derive(Default)]
struct Tally {
    received: u64,
    received_bytes: u64,
    latencies_ns: Vec<u64>,
}

impl Tally {
    /// Counts a delivered chunk's records from `first_offset` on (a chunk is sent whole, so one
    /// that starts before the subscription's offset holds records the consumer did not ask for,
    /// which RabbitMQ's clients skip too).
    fn chunk(&mut self, chunk: Bytes, first_offset: u64, clock: &Clock) {
        let Ok(chunk) = Chunk::parse(chunk) else {
            return;
        };
        if chunk.header.chunk_type != chunk_type::USER {
            return;
        }
        let now_ns = clock.now_wall_ns();
        let mut offset = chunk.header.first_offset;
        for entry in chunk.entries().flatten() {
            let records = u64::from(entry.record_count());
            if offset + records <= first_offset {
                offset += records;
                continue;
            }
            self.received += records;
            let body = entry.body();
            self.received_bytes += (body.len() as u64).saturating_sub(message::DATA_SECTION_HEADER_BYTES as u64 * records);
            if records == 1 {
                if let Some(sent_ns) = message::send_time_ns(&body) {
                    self.latencies_ns.push(now_ns.saturating_sub(sent_ns));
                }
            }
            offset += records;
        }
    }

    fn record_and_reset(&mut self, stats: &WorkerStats) {
        if !self.latencies_ns.is_empty() {
            stats.record_with(Metric::Transfer, |histogram| {
                for latency in &self.latencies_ns {
                    histogram.saturating_record((*latency).max(1));
                }
            });
        }
        stats.received.fetch_add(self.received, Ordering::Relaxed);
        stats.received_bytes.fetch_add(self.received_bytes, Ordering::Relaxed);
        (self.received, self.received_bytes) = (0, 0);
        self.latencies_ns.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use stream_codec::{ChunkHeader, DataEntry};

    #[test]
    fn offsets() {
        assert_eq!(parse_offset("first"), Ok(OffsetSpecification::First));
        assert_eq!(parse_offset("next"), Ok(OffsetSpecification::Next));
        assert_eq!(parse_offset("42"), Ok(OffsetSpecification::Offset(42)));
        assert_eq!(parse_offset("@1700000000000"), Ok(OffsetSpecification::Timestamp(1_700_000_000_000)));
        assert!(parse_offset("yesterday").is_err());
    }

    fn chunk_of(first_offset: u64, bodies: &[Vec<u8>]) -> Bytes {
        let mut data = BytesMut::new();
        for body in bodies {
            data.extend_from_slice(DataEntry::simple(body).raw());
        }
        let header = ChunkHeader {
            entry_count: bodies.len() as u16,
            record_count: bodies.len() as u32,
            first_offset,
            data_bytes: data.len() as u32,
            ..ChunkHeader::default()
        };
        let mut chunk = BytesMut::new();
        header.write(&mut chunk);
        chunk.extend_from_slice(&data);
        chunk.freeze()
    }

    #[test]
    fn a_chunk_counts_its_records_from_the_first_offset_asked_for_with_their_latencies() {
        let clock = Clock::new();
        let mut bodies: Vec<Vec<u8>> = (0..4).map(|_| message::body(&[0u8; 16])).collect();
        for body in &mut bodies {
            message::stamp(body, clock.now_wall_ns());
        }
        let mut tally = Tally::default();
        tally.chunk(chunk_of(10, &bodies), 12, &clock);
        assert_eq!((tally.received, tally.received_bytes, tally.latencies_ns.len()), (2, 32, 2));
        let mut tally = Tally::default();
        tally.chunk(chunk_of(10, &bodies), 0, &clock);
        assert_eq!(tally.received, 4);
    }
}
