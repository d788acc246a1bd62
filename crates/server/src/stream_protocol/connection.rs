//! The socket task of one stream connection: reads frames into the session, sends what it
//! answers, delivers chunks while subscriptions have credit, passes confirms back from the
//! group commit, sends and checks heartbeats, and times out a handshake that stalls.
//!
//! Bounds: the read buffer holds at most one frame beyond what was read (the frame size is
//! checked first); the outbox is flushed once it reaches `OUTBOX_BYTES_TARGET` of deliveries;
//! at [`UNCONFIRMED_MAX`] unconfirmed messages the task stops reading the socket until confirms
//! come back (RabbitMQ's credit-based blocking), which bounds the confirm channel too.

use super::delivery::FileSpan;
use super::session::{Flow, Phase, Session, UNCONFIRMED_MAX};
use super::Node;
use bytes::BytesMut;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream_codec::{split_frame, ClientCommand, ServerCommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;

/// How much the read buffer grows by when it needs room.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Deliveries gathered before a write: enough for a few chunks per system call.
const OUTBOX_BYTES_TARGET: usize = 1024 * 1024;
/// How long each step of the handshake may take (RabbitMQ's `connection_negotiation_step_timeout`).
const NEGOTIATION_STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection that sent an oversized frame is kept to read our close before the
/// socket is dropped: its later bytes cannot be framed any more.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Serves one connection until it closes.
pub async fn serve(node: Arc<Node>, socket: TcpStream, peer: SocketAddr) {
    let (mut reader, mut writer) = socket.into_split();
    let (confirms, mut confirmed) = tokio::sync::mpsc::unbounded_channel();
    let mut session = Session::new(node, peer, confirms);
    let wake = session.wake.clone();
    let mut buffer = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let (mut last_received, mut last_sent) = (Instant::now(), Instant::now());
    let (mut step, mut step_started) = (session.phase(), Instant::now());
    let mut linger_until: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        if linger_until.is_none() {
            match take_frames(&mut session, &mut buffer) {
                Ok(Flow::Continue) => {}
                Ok(Flow::Close) => {
                    let _ = flush(&mut session, &mut writer).await;
                    return;
                }
                Err(()) => linger_until = Some(Instant::now() + CLOSE_LINGER),
            }
        } else {
            buffer.clear();
        }
        let more = session.deliver(OUTBOX_BYTES_TARGET);
        if !session.outbox.is_empty() || !session.file_spans.is_empty() {
            if flush(&mut session, &mut writer).await.is_err() {
                return;
            }
            last_sent = Instant::now();
        }
        // Once per pass: what the frames read, the chunks sent and the confirms of this pass counted.
        session.flush_counts();
        if more {
            tokio::task::yield_now().await;
            continue;
        }
        if session.phase() != step {
            (step, step_started) = (session.phase(), Instant::now());
        }
        let reading = session.unconfirmed < UNCONFIRMED_MAX;
        tokio::select! {
            read = reader.read_buf(&mut buffer), if reading => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => last_received = Instant::now(),
            },
            Some(first) = confirmed.recv() => {
                session.confirmed(first);
                while let Ok(next) = confirmed.try_recv() {
                    session.confirmed(next);
                }
            }
            _ = wake.notified() => {}
            _ = tick.tick() => {
                if linger_until.is_some_and(|until| Instant::now() >= until) {
                    return;
                }
                if !heartbeat_or_timeout(&mut session, step_started, last_received, last_sent) {
                    return;
                }
            }
        }
    }
}

/// Hands every complete buffered frame to the session. `Err` when the framing is lost (a frame
/// over frame_max): after the session's answer, nothing more can be read.
fn take_frames(session: &mut Session, buffer: &mut BytesMut) -> Result<Flow, ()> {
    while session.unconfirmed < UNCONFIRMED_MAX {
        let frame = match split_frame(buffer, session.frame_max_in_force()) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(error) => {
                return match session.undecodable(&error) {
                    Flow::Close => Ok(Flow::Close),
                    Flow::Continue => Err(()),
                };
            }
        };
        let flow = match ClientCommand::decode(frame) {
            Ok(command) => session.handle(command),
            Err(error) => session.undecodable(&error),
        };
        if flow == Flow::Close {
            return Ok(Flow::Close);
        }
    }
    Ok(Flow::Continue)
}

/// Writes the outbox, with each file span's data sent from its file at its place.
async fn flush(session: &mut Session, writer: &mut OwnedWriteHalf) -> std::io::Result<()> {
    let mut written = 0;
    for span in std::mem::take(&mut session.file_spans) {
        writer.write_all(&session.outbox[written..span.outbox_at]).await?;
        written = span.outbox_at;
        send_file(writer, &span).await?;
    }
    writer.write_all(&session.outbox[written..]).await?;
    session.outbox.clear();
    Ok(())
}

/// Sends a span of a segment file to the socket with `sendfile`: the kernel moves the page
/// cache's pages to the socket and the broker never copies them. A file shorter than the span
/// (it cannot be: chunks are read committed) ends the connection, whose framing would be lost.
async fn send_file(writer: &OwnedWriteHalf, span: &FileSpan) -> std::io::Result<()> {
    let socket = writer.as_ref();
    let file_fd = span.file.raw_fd().ok_or_else(|| std::io::Error::other("a file span without a descriptor"))?;
    let mut offset = libc::off_t::try_from(span.position).map_err(std::io::Error::other)?;
    let mut left = span.bytes;
    while left > 0 {
        socket.writable().await?;
        // A page-cache miss makes sendfile wait for the disk: off the async worker, as reads are.
        let sent = socket.try_io(Interest::WRITABLE, || {
            tokio::task::block_in_place(|| {
                // SAFETY: both descriptors are open (the socket is borrowed, the file held by the
                // span's Arc) and `offset` is a valid pointer for the call.
                let sent = unsafe { libc::sendfile(socket.as_raw_fd(), file_fd, &mut offset, left) };
                usize::try_from(sent).map_err(|_| std::io::Error::last_os_error())
            })
        });
        match sent {
            Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "segment file shorter than its chunk")),
            Ok(count) => left -= count.min(left),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Sends a heartbeat when the connection was quiet for the negotiated interval; false when the
/// client was silent for two intervals, or a handshake step took too long.
fn heartbeat_or_timeout(session: &mut Session, step_started: Instant, last_received: Instant, last_sent: Instant) -> bool {
    match session.phase() {
        Phase::Opened | Phase::CloseSent => {
            if session.heartbeat_s == 0 {
                return true;
            }
            let interval = Duration::from_secs(u64::from(session.heartbeat_s));
            if last_received.elapsed() > 2 * interval {
                tracing::warn!(peer = %session.peer, "stream connection: missed heartbeats, closing");
                return false;
            }
            if last_sent.elapsed() >= interval {
                session.send(&ServerCommand::Heartbeat);
            }
            true
        }
        phase if step_started.elapsed() > NEGOTIATION_STEP_TIMEOUT => {
            tracing::warn!(peer = %session.peer, ?phase, "stream connection: handshake step timed out, closing");
            false
        }
        _ => true,
    }
}
