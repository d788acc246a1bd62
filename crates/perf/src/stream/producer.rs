//! A stream-protocol producer: one connection, one publisher, publish frames of up to
//! `--stream-batch-size` messages written in place, and a confirm-reader task. Publishing ids are
//! the producer's sequence numbers (1, 2, ...), so the ring of send times the AMQP producer uses
//! (`Pending`) serves here unchanged, and so does its open-loop pacing under `--rate`.

use super::connection::{StreamConnection, StreamError, StreamReader, StreamUrl};
use super::message;
use crate::control::Control;
use crate::producer::{wait_for_room, wait_until, Completion, Pending};
use crate::stats::{Clock, Metric, WorkerStats};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream_codec::{ClientCommand, PublishFrame, ServerCommand, Text, SIMPLE_ENTRY_HEADER_BYTES};

/// The publisher id every lepus perf producer declares (one publisher per connection).
const PUBLISHER_ID: u8 = 1;
/// Bytes of a publish frame around its messages: size, key, version, publisher id, count.
const PUBLISH_FRAME_OVERHEAD_BYTES: usize = 4 + 2 + 2 + 1 + 4;
/// Bytes a message costs in a publish frame besides its body: publishing id and entry header.
const MESSAGE_OVERHEAD_BYTES: usize = 8 + SIMPLE_ENTRY_HEADER_BYTES;
/// Flush once this much is buffered, so the server starts on a batch while the next is built.
const FLUSH_BYTES: usize = 64 * 1024;

/// What one stream producer does.
#[derive(Clone)]
pub struct StreamProducerSpec {
    /// For connection names and errors.
    pub name: String,
    /// Server.
    pub url: StreamUrl,
    /// Stream to publish to.
    pub stream: String,
    /// Most unconfirmed messages.
    pub max_pending: u32,
    /// Most messages per publish frame.
    pub batch_size: u32,
    /// Stop after this many messages.
    pub message_count: Option<u64>,
    /// The payload, `--message-size` bytes.
    pub payload: Vec<u8>,
    /// Wait for intended send times precisely (thread sleeps) rather than on tokio's timer alone.
    pub precise_pacing: bool,
}

/// Runs one producer until the control says stop, the count is reached or the server fails.
pub async fn run_stream_producer(
    spec: StreamProducerSpec,
    control: Arc<Control>,
    stats: Arc<WorkerStats>,
    clock: Clock,
) -> Result<(), StreamError> {
    let mut connection = StreamConnection::open(&spec.url, &spec.name).await?;
    let stream = Text::from(spec.stream.as_str());
    connection
        .request("declare publisher", |correlation_id| ClientCommand::DeclarePublisher {
            correlation_id,
            publisher_id: PUBLISHER_ID,
            reference: Text::default(),
            stream,
        })
        .await?;
    let mut body = message::body(&spec.payload);
    let per_frame = messages_per_frame(connection.frame_max, body.len(), spec.batch_size)?;
    let (reader, mut writer) = connection.split();
    let completion = Completion::Confirms { max_pending: spec.max_pending.max(1) };
    let window = u64::from(spec.max_pending.max(1));
    let pending = Arc::new(Pending::new(window));
    let confirm_task = tokio::spawn(read_confirms(reader, pending.clone(), stats.clone(), clock));

    let mut rate = control.rate();
    let mut schedule_start = Instant::now();
    let mut schedule_sent = 0u64;
    let mut sent = 0u64;
    let result: Result<(), StreamError> = async {
        loop {
            if control.stopped() || spec.message_count.is_some_and(|count| sent >= count) || confirm_task.is_finished() {
                break;
            }
            if pending.in_flight() >= window {
                stats.blocked.fetch_add(1, Ordering::Relaxed);
                writer.flush().await?;
                wait_for_room(&pending, &control, &completion, window).await;
                continue;
            }
            let new_rate = control.rate();
            if new_rate != rate {
                (rate, schedule_start, schedule_sent) = (new_rate, Instant::now(), sent);
            }
            let now = Instant::now();
            let intended_at = |index: u64| schedule_start + Duration::from_secs_f64((index - schedule_sent) as f64 / rate);
            // How many to send now: the room in the window, a frame's worth, what is left of the
            // count, and under a rate only those whose intended time has come.
            let mut batch = (window - pending.in_flight()).min(per_frame);
            if let Some(count) = spec.message_count {
                batch = batch.min(count - sent);
            }
            if rate > 0.0 {
                let first_intended = intended_at(sent);
                if first_intended > now {
                    writer.flush().await?;
                    writer.heartbeat_if_due();
                    wait_until(first_intended, now, &control, spec.precise_pacing).await;
                    continue;
                }
                let due = ((now - schedule_start).as_secs_f64() * rate) as u64 + schedule_sent + 1 - sent;
                batch = batch.min(due.max(1));
            }
            let mut frame = PublishFrame::begin(writer.buffer(), PUBLISHER_ID);
            for _ in 0..batch {
                let intended = if rate > 0.0 {
                    let intended = intended_at(sent);
                    stats.record(Metric::SendDelay, now.saturating_duration_since(intended).as_nanos() as u64);
                    intended
                } else {
                    now
                };
                message::stamp(&mut body, clock.wall_ns(intended));
                let sequence = sent + 1;
                pending.slots[(sequence & pending.mask) as usize].store(clock.mono_ns(intended) + 1, Ordering::Release);
                pending.published.store(sequence, Ordering::Release);
                frame.push(writer.buffer(), sequence, &body);
                sent = sequence;
            }
            frame.finish(writer.buffer());
            stats.sent.fetch_add(batch, Ordering::Relaxed);
            stats.sent_bytes.fetch_add(batch * spec.payload.len() as u64, Ordering::Relaxed);
            if writer.pending_bytes() >= FLUSH_BYTES || pending.in_flight() >= window {
                writer.flush().await?;
            }
        }
        writer.flush().await?;
        // Give outstanding confirms a bounded time to arrive.
        let deadline = Instant::now() + Duration::from_secs(5);
        while pending.in_flight() > 0 && Instant::now() < deadline && !confirm_task.is_finished() {
            let _ = tokio::time::timeout(Duration::from_millis(50), pending.notify.notified()).await;
        }
        Ok(())
    }
    .await;
    if confirm_task.is_finished() {
        match confirm_task.await {
            Ok(Err(error)) => return Err(error),
            Ok(Ok(())) => {}
            Err(join) => return Err(StreamError::Protocol(format!("confirm reader: {join}"))),
        }
    } else {
        confirm_task.abort();
    }
    result?;
    writer.close().await;
    Ok(())
}

/// How many messages of `body_bytes` fit a publish frame under `frame_max`, at most `batch_size`.
fn messages_per_frame(frame_max: u32, body_bytes: usize, batch_size: u32) -> Result<u64, StreamError> {
    let frame_max = if frame_max == 0 { usize::MAX } else { frame_max as usize };
    let fit = frame_max.saturating_sub(PUBLISH_FRAME_OVERHEAD_BYTES) / (MESSAGE_OVERHEAD_BYTES + body_bytes);
    if fit == 0 {
        return Err(StreamError::Protocol(format!("a {body_bytes}-byte message does not fit the negotiated frame_max {frame_max}")));
    }
    Ok((fit as u64).min(u64::from(batch_size.max(1))))
}

/// Reads confirms and errors, recording send-to-confirm latencies, until the connection ends.
async fn read_confirms(mut reader: StreamReader, pending: Arc<Pending>, stats: Arc<WorkerStats>, clock: Clock) -> Result<(), StreamError> {
    loop {
        let mut command = Some(reader.next().await?);
        let (mut confirmed, mut errored) = (0u64, 0u64);
        let now_ns = clock.mono_ns(Instant::now());
        let mut failure = None;
        // Everything already buffered is handled under one histogram lock.
        stats.record_with(Metric::SendAck, |histogram| {
            while let Some(current) = command.take() {
                match current {
                    ServerCommand::PublishConfirm { publishing_ids, .. } => {
                        for sequence in publishing_ids {
                            let sent_ns = pending.slots[(sequence & pending.mask) as usize].swap(0, Ordering::AcqRel);
                            if sent_ns != 0 {
                                histogram.saturating_record(now_ns.saturating_sub(sent_ns - 1).max(1));
                                confirmed += 1;
                            }
                        }
                    }
                    ServerCommand::PublishError { errors, .. } => {
                        for error in errors {
                            if pending.slots[(error.publishing_id & pending.mask) as usize].swap(0, Ordering::AcqRel) != 0 {
                                errored += 1;
                            }
                        }
                    }
                    ServerCommand::MetadataUpdate { stream, code } => {
                        failure = Some(StreamError::Protocol(format!("stream {stream} is gone: {code}")));
                    }
                    _ => {}
                }
                match reader.buffered() {
                    Ok(next) if failure.is_none() => command = next,
                    Ok(_) => {}
                    Err(error) => failure = Some(error),
                }
            }
        });
        if let Some(error) = failure {
            return Err(error);
        }
        stats.completed.fetch_add(confirmed, Ordering::Relaxed);
        stats.nacked.fetch_add(errored, Ordering::Relaxed);
        pending.completed.fetch_add(confirmed + errored, Ordering::AcqRel);
        pending.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_hold_what_fits_and_no_more_than_the_batch() {
        // 1 MiB frames: 24-byte bodies (16 B payloads) fit by the tens of thousands, so the
        // batch size decides.
        assert_eq!(messages_per_frame(1_048_576, 24, 100).unwrap(), 100);
        // A 600 KiB body fits once; two would not.
        assert_eq!(messages_per_frame(1_048_576, 600 * 1024, 100).unwrap(), 1);
        assert!(messages_per_frame(1024, 2000, 100).is_err());
        // The frame's own overhead counts: exactly one 1000-byte message in 1025 bytes.
        assert_eq!(messages_per_frame(13 + 12 + 1000, 1000, 100).unwrap(), 1);
        assert!(messages_per_frame(13 + 12 + 999, 1000, 100).is_err());
    }
}
