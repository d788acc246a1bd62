//! A connection's writer task: takes what channels and queues queued for the client, encodes it
//! into one buffer and writes it with as few syscalls as the backlog allows.

use super::heartbeat::HeartbeatClock;
use crate::metrics::latency::DeliveryLatencies;
use crate::shared::{ConnectionShared, Outbound, OUTBOUND_DELIVERIES_RESUME};
use amqp_codec::{
    encode_body_frames, encode_content_header, encode_delivery, encode_heartbeat, encode_method_frame, BasicGetOk, BasicReturn,
    DeliverFields, Method,
};
use broker_core::Message;
use bytes::BytesMut;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// How many items one write gathers at most, so a busy connection still writes regularly.
pub const WRITE_BATCH_ITEMS_MAX: usize = 1024;
/// How many bytes one write gathers at most.
pub const WRITE_BATCH_BYTES_MAX: usize = 1 << 20;
/// How long a socket may take no bytes at all before the connection is given up, as RabbitMQ's
/// `tcp_listen_options.send_timeout` (15 s) closes it: a client that stopped reading (a consumer
/// without prefetch, a publisher that never reads its confirms) then has its unacked messages
/// requeued for others instead of holding them until the consumer timeout. Only a write that
/// makes no progress counts, so a slow reader that drains is never cut off.
pub const SOCKET_SEND_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Settings the handshake fixes and the writer needs.
pub struct WriterSettings {
    /// Negotiated frame_max (0 until tune-ok).
    pub frame_max: Arc<AtomicU32>,
    /// Heartbeat interval, when negotiated, in seconds (0 = none).
    pub heartbeat_s: Arc<AtomicU32>,
    /// When the writer last wrote ([`crate::metrics::latency::clock_ns`]): the reader piggybacks
    /// a heartbeat on a read when this is old enough (see `heartbeat.rs`).
    pub last_write_ns: Arc<AtomicU64>,
}

fn encode_content(buffer: &mut BytesMut, channel: u16, method: &Method, message: &Message, frame_max: u32) {
    encode_method_frame(buffer, channel, method);
    encode_content_header(buffer, channel, &message.header);
    encode_body_frames(buffer, channel, &message.body, frame_max);
}

fn encode_item(
    buffer: &mut BytesMut,
    item: Outbound,
    frame_max: u32,
    connection: &ConnectionShared,
    latencies: &mut DeliveryLatencies,
) -> bool {
    match item {
        Outbound::Frames(frames) => buffer.extend_from_slice(&frames),
        Outbound::Deliver { channel, consumer_tag, delivery_tag, redelivered, message } => {
            let fields = DeliverFields {
                consumer_tag: &consumer_tag,
                delivery_tag,
                redelivered,
                exchange: &message.exchange,
                routing_key: &message.routing_key,
            };
            encode_delivery(buffer, channel, fields, &message.header, &message.body, frame_max);
            connection.outbound_deliveries.fetch_sub(1, Ordering::AcqRel);
            latencies.delivered(message.published_at_ns, redelivered);
        }
        Outbound::GetOk { channel, delivery_tag, redelivered, message_count, message } => {
            let method = Method::BasicGetOk(BasicGetOk {
                delivery_tag,
                redelivered,
                exchange: message.exchange.clone(),
                routing_key: message.routing_key.clone(),
                message_count,
            });
            encode_content(buffer, channel, &method, &message, frame_max);
        }
        Outbound::Return { channel, reply_code, reply_text, message } => {
            let method = Method::BasicReturn(BasicReturn {
                reply_code,
                reply_text,
                exchange: message.exchange.clone(),
                routing_key: message.routing_key.clone(),
            });
            encode_content(buffer, channel, &method, &message, frame_max);
        }
        Outbound::Shutdown => return false,
    }
    true
}

/// Runs until the connection shuts down or the socket fails.
pub async fn run_writer<W: AsyncWrite + Unpin>(
    mut socket: W,
    mut receiver: mpsc::UnboundedReceiver<Outbound>,
    connection: Arc<ConnectionShared>,
    settings: WriterSettings,
) {
    let mut buffer = BytesMut::with_capacity(64 * 1024);
    let mut heartbeat = HeartbeatClock::new(settings.last_write_ns.clone());
    let mut latencies = DeliveryLatencies::default();
    loop {
        let first = tokio::select! {
            item = receiver.recv() => item,
            _ = heartbeat.silent_too_long() => {
                encode_heartbeat(&mut buffer);
                if write_making_progress(&mut socket, &buffer, &connection).await.is_err() { break; }
                connection.traffic.count_write(buffer.len());
                buffer.clear();
                heartbeat.wrote(settings.heartbeat_s.load(Ordering::Acquire));
                continue;
            }
        };
        let Some(first) = first else { break };
        let frame_max = settings.frame_max.load(Ordering::Acquire);
        let mut keep_going = encode_item(&mut buffer, first, frame_max, &connection, &mut latencies);
        let mut items = 1;
        while keep_going && items < WRITE_BATCH_ITEMS_MAX && buffer.len() < WRITE_BATCH_BYTES_MAX {
            match receiver.try_recv() {
                Ok(item) => keep_going = encode_item(&mut buffer, item, frame_max, &connection, &mut latencies),
                Err(_) => break,
            }
            items += 1;
        }
        let written = write_making_progress(&mut socket, &buffer, &connection).await;
        connection.end_pending(items);
        if written.is_err() {
            break;
        }
        connection.traffic.count_write(buffer.len());
        latencies.written();
        buffer.clear();
        heartbeat.wrote(settings.heartbeat_s.load(Ordering::Acquire));
        if !keep_going {
            let _ = socket.flush().await;
            let _ = socket.shutdown().await;
            break;
        }
        wake_stalled_queues(&connection);
    }
    // Whatever is still queued is dropped: the channels' cleanup requeues unacked deliveries.
    receiver.close();
}

/// Writes all of `buffer`, failing when one write takes no byte for [`SOCKET_SEND_STALL_TIMEOUT`]
/// (logged: the reader ends the connection once the writer is gone).
async fn write_making_progress<W: AsyncWrite + Unpin>(socket: &mut W, buffer: &[u8], connection: &ConnectionShared) -> std::io::Result<()> {
    let mut written = 0;
    while written < buffer.len() {
        match tokio::time::timeout(SOCKET_SEND_STALL_TIMEOUT, socket.write(&buffer[written..])).await {
            Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(count)) => written += count,
            Ok(Err(error)) => return Err(error),
            Err(_) => {
                tracing::warn!(
                    peer = %connection.peer, id = connection.id, stalled_s = SOCKET_SEND_STALL_TIMEOUT.as_secs(), unwritten_bytes = buffer.len() - written,
                    "the client has read nothing for the send timeout: connection closed (RabbitMQ's send_timeout), its unacked messages requeued"
                );
                return Err(std::io::ErrorKind::TimedOut.into());
            }
        }
    }
    Ok(())
}

fn wake_stalled_queues(connection: &ConnectionShared) {
    if connection.outbound_deliveries.load(Ordering::Acquire) > OUTBOUND_DELIVERIES_RESUME {
        return;
    }
    let stalled = std::mem::take(&mut *connection.stalled_queues.lock());
    for queue in stalled.iter().filter_map(|weak| weak.upgrade()) {
        queue.dispatch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    /// A writer on one end of an in-memory socket of `capacity` bytes, and what it needs.
    fn writer_on_duplex(capacity: usize) -> (tokio::io::DuplexStream, Arc<ConnectionShared>, tokio::task::JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(capacity);
        let (sender, receiver) = mpsc::unbounded_channel();
        let connection = Arc::new(ConnectionShared::detached(1, sender));
        let settings = WriterSettings {
            frame_max: Arc::new(AtomicU32::new(131_072)),
            heartbeat_s: Arc::new(AtomicU32::new(0)),
            last_write_ns: Arc::new(AtomicU64::new(0)),
        };
        let writer = tokio::spawn(run_writer(server, receiver, connection.clone(), settings));
        (client, connection, writer)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_nothing_is_given_up_after_the_send_timeout() {
        let (_client, connection, writer) = writer_on_duplex(64);
        connection.send(Outbound::Frames(Bytes::from(vec![1u8; 4096])));
        tokio::time::sleep(SOCKET_SEND_STALL_TIMEOUT - Duration::from_secs(1)).await;
        assert!(!writer.is_finished() && !connection.outbound.is_closed(), "given up before the timeout");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(writer.is_finished(), "a socket that took no bytes for the timeout still written to");
        // The reader ends the connection on this (see connection::EndReason::WriterGone).
        assert!(connection.outbound.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_draining_is_never_given_up() {
        let (mut client, connection, writer) = writer_on_duplex(64);
        let frames = vec![7u8; 4096];
        connection.send(Outbound::Frames(Bytes::from(frames.clone())));
        // 64 bytes every 10 s: the whole frame takes over ten minutes, each write far less than
        // the timeout.
        let mut received = Vec::new();
        let mut chunk = [0u8; 64];
        while received.len() < frames.len() {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let count = client.read(&mut chunk).await.expect("read");
            received.extend_from_slice(&chunk[..count]);
        }
        assert_eq!(received, frames);
        assert!(!writer.is_finished() && !connection.outbound.is_closed(), "a draining reader was given up");
        connection.send(Outbound::Frames(Bytes::from_static(b"more")));
        let mut more = [0u8; 4];
        client.read_exact(&mut more).await.expect("read more");
        assert_eq!(&more, b"more");
    }
}
