//! The two halves of an open connection: frames in, frames out, each through one reused buffer.

use crate::ClientError;
use amqp_codec::{
    decode_frame, encode_body_frames, encode_content_header, encode_heartbeat, encode_method_frame, BasicAck, BasicProperties,
    BasicPublish, ContentHeader, Frame, FramePayload, Method, ShortStr,
};
use bytes::BytesMut;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// How much the read buffer grows by when it needs room: big enough that a socket read brings in
/// many small frames at once, which is what keeps the per-message cost low.
const READ_CHUNK_BYTES: usize = 256 * 1024;

/// The basic class id, which content headers carry.
const CLASS_BASIC: u16 = 60;

/// Frames from the broker.
pub struct FrameReader {
    stream: OwnedReadHalf,
    buffer: BytesMut,
    frame_max: u32,
    /// With heartbeats on, silence longer than this means the broker is gone.
    idle_limit: Option<Duration>,
}

impl FrameReader {
    pub(crate) fn new(stream: OwnedReadHalf, buffer: BytesMut, frame_max: u32) -> FrameReader {
        FrameReader { stream, buffer, frame_max, idle_limit: None }
    }

    pub(crate) fn set_heartbeat(&mut self, heartbeat_s: u16) {
        self.idle_limit = (heartbeat_s > 0).then(|| Duration::from_secs(u64::from(heartbeat_s) * 2));
    }

    pub(crate) fn set_frame_max(&mut self, frame_max: u32) {
        self.frame_max = frame_max;
    }

    /// The next frame, reading the socket only when no complete frame is buffered.
    ///
    /// `connection.close` and `channel.close` from the broker come back as errors that carry the
    /// reply code and text, since every caller of a load generator treats them as the end.
    pub async fn next_frame(&mut self) -> Result<Frame, ClientError> {
        loop {
            if let Some(frame) = self.buffered_frame()? {
                return Ok(frame);
            }
            self.fill().await?;
        }
    }

    /// A frame that is already buffered, without touching the socket: lets a consumer handle a
    /// whole burst of deliveries before it flushes one batch of acks.
    pub fn buffered_frame(&mut self) -> Result<Option<Frame>, ClientError> {
        let Some(frame) = decode_frame(&mut self.buffer, self.frame_max)? else {
            return Ok(None);
        };
        if let FramePayload::Method(method) = &frame.payload {
            match method {
                Method::ConnectionClose(close) => {
                    return Err(ClientError::ConnectionClosed { code: close.reply_code, text: close.reply_text.to_string_lossy() })
                }
                Method::ChannelClose(close) => {
                    return Err(ClientError::ChannelClosed {
                        channel: frame.channel,
                        code: close.reply_code,
                        text: close.reply_text.to_string_lossy(),
                    })
                }
                _ => {}
            }
        }
        Ok(Some(frame))
    }

    async fn fill(&mut self) -> Result<(), ClientError> {
        if self.buffer.capacity() - self.buffer.len() < READ_CHUNK_BYTES / 4 {
            self.buffer.reserve(READ_CHUNK_BYTES);
        }
        let read = match self.idle_limit {
            Some(limit) => match tokio::time::timeout(limit, self.stream.read_buf(&mut self.buffer)).await {
                Ok(read) => read,
                Err(_) => {
                    return Err(ClientError::Timeout {
                        what: "waiting for the broker (missed heartbeats)".to_string(),
                        timeout_s: limit.as_secs(),
                    })
                }
            },
            None => self.stream.read_buf(&mut self.buffer).await,
        };
        match read {
            Ok(0) => Err(ClientError::BrokerGone),
            Ok(_) => Ok(()),
            Err(error) => Err(ClientError::Io(error)),
        }
    }
}

/// A publish whose method and content-header frames are encoded once, so that sending it again
/// costs two buffer copies (prefix and body) and nothing else.
#[derive(Clone)]
pub struct Publish {
    channel: u16,
    body_bytes: usize,
    prefix: BytesMut,
}

impl Publish {
    /// Prepares a publish of bodies of exactly `body_bytes` bytes.
    pub fn new(channel: u16, exchange: &str, routing_key: &str, properties: &BasicProperties, body_bytes: usize) -> Publish {
        let mut prefix = BytesMut::new();
        let method = Method::BasicPublish(BasicPublish {
            ticket: 0,
            exchange: ShortStr::truncating(exchange),
            routing_key: ShortStr::truncating(routing_key),
            mandatory: false,
            immediate: false,
        });
        encode_method_frame(&mut prefix, channel, &method);
        let header = ContentHeader::from_properties(CLASS_BASIC, body_bytes as u64, properties);
        encode_content_header(&mut prefix, channel, &header);
        Publish { channel, body_bytes, prefix }
    }

    /// The body size this publish was prepared for.
    pub fn body_bytes(&self) -> usize {
        self.body_bytes
    }
}

/// Frames to the broker, gathered in one buffer and written with one system call per flush.
pub struct FrameWriter {
    stream: OwnedWriteHalf,
    buffer: BytesMut,
    frame_max: u32,
    heartbeat_every: Option<Duration>,
    last_flush: Instant,
}

impl FrameWriter {
    pub(crate) fn new(stream: OwnedWriteHalf, frame_max: u32) -> FrameWriter {
        FrameWriter {
            stream,
            buffer: BytesMut::with_capacity(READ_CHUNK_BYTES),
            frame_max,
            heartbeat_every: None,
            last_flush: Instant::now(),
        }
    }

    pub(crate) fn set_tuning(&mut self, frame_max: u32, heartbeat_s: u16) {
        self.frame_max = frame_max;
        // Send at half the interval, as RabbitMQ's clients do, so one late tick is no miss.
        self.heartbeat_every = (heartbeat_s > 0).then(|| Duration::from_millis(u64::from(heartbeat_s) * 500));
    }

    /// Appends a method frame.
    pub fn method(&mut self, channel: u16, method: &Method) {
        encode_method_frame(&mut self.buffer, channel, method);
    }

    /// Appends a publish: the prepared prefix, then `body` cut into frames as `frame_max` needs.
    /// When `body` is not the prepared size the header is encoded afresh (a slower path).
    pub fn publish(&mut self, publish: &Publish, body: &[u8]) {
        if body.len() == publish.body_bytes {
            self.buffer.extend_from_slice(&publish.prefix);
        } else {
            self.publish_resized(publish, body.len());
        }
        encode_body_frames(&mut self.buffer, publish.channel, body, self.frame_max);
    }

    fn publish_resized(&mut self, publish: &Publish, body_bytes: usize) {
        // The prefix is a method frame followed by a header frame whose 8-byte body size sits at
        // a fixed offset: patch a copy rather than keep the properties around.
        let method_frame_bytes =
            u32::from_be_bytes([publish.prefix[3], publish.prefix[4], publish.prefix[5], publish.prefix[6]]) as usize + 8;
        let start = self.buffer.len();
        self.buffer.extend_from_slice(&publish.prefix);
        let size_at = start + method_frame_bytes + 7 + 4;
        self.buffer[size_at..size_at + 8].copy_from_slice(&(body_bytes as u64).to_be_bytes());
    }

    /// Appends a `basic.ack`.
    pub fn ack(&mut self, channel: u16, delivery_tag: u64, multiple: bool) {
        self.method(channel, &Method::BasicAck(BasicAck { delivery_tag, multiple }));
    }

    /// Appends a heartbeat when nothing was written for half the negotiated interval.
    pub fn heartbeat_if_due(&mut self) {
        if let Some(every) = self.heartbeat_every {
            if self.buffer.is_empty() && self.last_flush.elapsed() >= every {
                encode_heartbeat(&mut self.buffer);
            }
        }
    }

    /// Bytes appended and not yet written.
    pub fn pending_bytes(&self) -> usize {
        self.buffer.len()
    }

    /// Writes everything appended so far.
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        self.stream.write_all(&self.buffer).await?;
        self.buffer.clear();
        self.last_flush = Instant::now();
        Ok(())
    }

    /// Closes the write side (the broker sees end of stream).
    pub async fn shutdown(&mut self) -> Result<(), ClientError> {
        self.stream.shutdown().await?;
        Ok(())
    }
}
