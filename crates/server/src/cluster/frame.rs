//! The frames of a link between two nodes, without I/O: `length u32 | crc32c u32 | body`, the
//! checksum seeded with [`LINK_CHECKSUM_SEED`] so the bytes of another protocol (an HTTP or AMQP
//! client dialling the cluster port by mistake) never pass for a frame.
//!
//! The first frame each way is the handshake: the dialler's [`Hello`], answered by the acceptor's
//! `Welcome` (its own [`Hello`]) or a `Refuse` with the reason. Then either side sends Raft
//! messages (by group), requests and responses of the control protocol (join, forget, status),
//! payloads of other protocols (quorum queues) and heartbeats when it has nothing else to say.

use bytes::Bytes;
use replication::codec::{DecodeError, Reader, Writer};

/// The largest frame body a node reads from a peer: a Raft snapshot message carries the whole
/// definitions image (replication's own bound, plus room for the frame's fields).
pub const LINK_FRAME_BYTES_MAX: usize = replication::transport::FRAME_BYTES_MAX + 4096;

/// Seeds every frame's checksum ("LEPC").
pub const LINK_CHECKSUM_SEED: u32 = 0x4C45_5043;

/// The version of this protocol; a peer speaking another is refused.
pub const LINK_PROTOCOL_VERSION: u32 = 2;

/// Bytes before a frame's body.
pub const FRAME_HEADER_BYTES: usize = 8;

/// Who a node is, as it says in its handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// [`LINK_PROTOCOL_VERSION`] of the sender.
    pub version: u32,
    /// The cluster name it was started with.
    pub cluster_name: String,
    /// The cluster it belongs to (0: it has not joined one yet).
    pub cluster_id: u64,
    /// Its node name.
    pub node_name: String,
    /// Its Raft id.
    pub node_id: u64,
    /// The address others dial to reach it.
    pub advertise: String,
    /// The host its stream-protocol clients are told to connect to (version 2 on).
    pub stream_host: String,
    /// Its stream-protocol port, 0 when it has no stream listener (version 2 on).
    pub stream_port: u16,
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkFrame {
    /// The dialler's handshake.
    Hello(Hello),
    /// The acceptor's answer: who it is.
    Welcome(Hello),
    /// The acceptor refuses the link, and says why.
    Refuse(String),
    /// Nothing to say: the link is alive.
    Heartbeat,
    /// A Raft message of a group, in raft-rs's protobuf encoding.
    Raft {
        /// The group (the metadata group or a quorum-queue shard).
        group: u32,
        /// `eraftpb::Message` bytes.
        message: Bytes,
    },
    /// A request of the control protocol; answered by a [`LinkFrame::Response`] with its id.
    Request {
        /// Chosen by the asking node, unique among its open requests.
        id: u64,
        /// The request (JSON).
        body: Bytes,
    },
    /// The answer to a request.
    Response {
        /// The request's id.
        id: u64,
        /// The answer (JSON).
        body: Bytes,
    },
    /// A part of a Raft message too large for one frame or a send queue (a snapshot): the
    /// receiver joins the parts of a transfer, in order, and takes the message when whole.
    RaftPart {
        /// The group.
        group: u32,
        /// The sender's number for this transfer (a new one restarts the joining).
        transfer: u64,
        /// The whole message's length.
        total: u64,
        /// Where this part starts in the message.
        offset: u64,
        /// The part's bytes.
        bytes: Bytes,
    },
    /// A message of another protocol riding the link (quorum queues), by channel.
    Payload {
        /// Which protocol.
        channel: u8,
        /// Its bytes.
        body: Bytes,
    },
}

const KIND_HELLO: u8 = 1;
const KIND_WELCOME: u8 = 2;
const KIND_REFUSE: u8 = 3;
const KIND_HEARTBEAT: u8 = 4;
const KIND_RAFT: u8 = 5;
const KIND_REQUEST: u8 = 6;
const KIND_RESPONSE: u8 = 7;
const KIND_PAYLOAD: u8 = 8;
const KIND_RAFT_PART: u8 = 9;

fn write_text(writer: &mut Writer, text: &str) {
    writer.bytes(text.as_bytes());
}

fn read_text(reader: &mut Reader, field: &'static str) -> Result<String, DecodeError> {
    let bytes = reader.bytes()?;
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::Invalid { field, value: 0 })
}

fn write_hello(writer: &mut Writer, hello: &Hello) {
    writer.u32(hello.version);
    write_text(writer, &hello.cluster_name);
    writer.u64(hello.cluster_id);
    write_text(writer, &hello.node_name);
    writer.u64(hello.node_id);
    write_text(writer, &hello.advertise);
    write_text(writer, &hello.stream_host);
    writer.u32(u32::from(hello.stream_port));
}

fn read_hello(reader: &mut Reader) -> Result<Hello, DecodeError> {
    Ok(Hello {
        version: reader.u32()?,
        cluster_name: read_text(reader, "cluster name")?,
        cluster_id: reader.u64()?,
        node_name: read_text(reader, "node name")?,
        node_id: reader.u64()?,
        advertise: read_text(reader, "advertised address")?,
        stream_host: read_text(reader, "stream host")?,
        stream_port: {
            let port = reader.u32()?;
            u16::try_from(port).map_err(|_| DecodeError::Invalid { field: "stream port", value: u64::from(port) })?
        },
    })
}

impl LinkFrame {
    /// Appends the whole frame (header and body) to `buffer`.
    pub fn encode(&self, buffer: &mut Vec<u8>) {
        let start = buffer.len();
        buffer.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
        let body_start = buffer.len();
        let mut writer = Writer(buffer);
        match self {
            LinkFrame::Hello(hello) => {
                writer.u8(KIND_HELLO);
                write_hello(&mut writer, hello);
            }
            LinkFrame::Welcome(hello) => {
                writer.u8(KIND_WELCOME);
                write_hello(&mut writer, hello);
            }
            LinkFrame::Refuse(reason) => {
                writer.u8(KIND_REFUSE);
                write_text(&mut writer, reason);
            }
            LinkFrame::Heartbeat => writer.u8(KIND_HEARTBEAT),
            LinkFrame::Raft { group, message } => {
                writer.u8(KIND_RAFT);
                writer.u32(*group);
                writer.bytes(message);
            }
            LinkFrame::Request { id, body } | LinkFrame::Response { id, body } => {
                writer.u8(if matches!(self, LinkFrame::Request { .. }) { KIND_REQUEST } else { KIND_RESPONSE });
                writer.u64(*id);
                writer.bytes(body);
            }
            LinkFrame::RaftPart { group, transfer, total, offset, bytes } => {
                writer.u8(KIND_RAFT_PART);
                writer.u32(*group);
                writer.u64(*transfer);
                writer.u64(*total);
                writer.u64(*offset);
                writer.bytes(bytes);
            }
            LinkFrame::Payload { channel, body } => {
                writer.u8(KIND_PAYLOAD);
                writer.u8(*channel);
                writer.bytes(body);
            }
        }
        let length = (buffer.len() - body_start) as u32;
        let checksum = crc32c::crc32c_append(LINK_CHECKSUM_SEED, &buffer[body_start..]);
        buffer[start..start + 4].copy_from_slice(&length.to_le_bytes());
        buffer[start + 4..start + 8].copy_from_slice(&checksum.to_le_bytes());
    }

    /// The frame as its own buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut buffer = Vec::new();
        self.encode(&mut buffer);
        Bytes::from(buffer)
    }

    /// Reads a header: the body's length and checksum; a length over the limit is refused
    /// before anything is allocated for it.
    pub fn decode_header(header: [u8; FRAME_HEADER_BYTES]) -> Result<(usize, u32), DecodeError> {
        let length = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if length == 0 || length > LINK_FRAME_BYTES_MAX {
            return Err(DecodeError::Invalid { field: "frame length", value: length as u64 });
        }
        Ok((length, u32::from_le_bytes([header[4], header[5], header[6], header[7]])))
    }

    /// Decodes a body read after a header, checking it against the header's checksum.
    pub fn decode_body(body: Bytes, checksum: u32) -> Result<LinkFrame, DecodeError> {
        if crc32c::crc32c_append(LINK_CHECKSUM_SEED, &body) != checksum {
            return Err(DecodeError::Checksum);
        }
        let mut reader = Reader::new(body);
        let frame = match reader.u8()? {
            KIND_HELLO => LinkFrame::Hello(read_hello(&mut reader)?),
            KIND_WELCOME => LinkFrame::Welcome(read_hello(&mut reader)?),
            KIND_REFUSE => LinkFrame::Refuse(read_text(&mut reader, "reason")?),
            KIND_HEARTBEAT => LinkFrame::Heartbeat,
            KIND_RAFT => LinkFrame::Raft { group: reader.u32()?, message: reader.bytes()? },
            KIND_REQUEST => LinkFrame::Request { id: reader.u64()?, body: reader.bytes()? },
            KIND_RESPONSE => LinkFrame::Response { id: reader.u64()?, body: reader.bytes()? },
            KIND_PAYLOAD => LinkFrame::Payload { channel: reader.u8()?, body: reader.bytes()? },
            KIND_RAFT_PART => LinkFrame::RaftPart {
                group: reader.u32()?,
                transfer: reader.u64()?,
                total: reader.u64()?,
                offset: reader.u64()?,
                bytes: reader.bytes()?,
            },
            kind => return Err(DecodeError::Invalid { field: "frame kind", value: kind.into() }),
        };
        if !reader.is_at_end() {
            return Err(DecodeError::Invalid { field: "bytes after the frame", value: reader.remaining() as u64 });
        }
        Ok(frame)
    }

    /// Decodes one whole frame (header and body) from `bytes`.
    #[cfg(test)]
    pub fn decode(bytes: &[u8]) -> Result<LinkFrame, DecodeError> {
        let header: [u8; FRAME_HEADER_BYTES] = bytes
            .get(..FRAME_HEADER_BYTES)
            .and_then(|header| header.try_into().ok())
            .ok_or(DecodeError::Truncated { offset: 0, needed: FRAME_HEADER_BYTES, available: bytes.len() })?;
        let (length, checksum) = LinkFrame::decode_header(header)?;
        let body = bytes.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + length).ok_or(DecodeError::Truncated {
            offset: FRAME_HEADER_BYTES,
            needed: length,
            available: bytes.len() - FRAME_HEADER_BYTES,
        })?;
        LinkFrame::decode_body(Bytes::copy_from_slice(body), checksum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            version: LINK_PROTOCOL_VERSION,
            cluster_name: "lepus".into(),
            cluster_id: 7,
            node_name: "n1@h".into(),
            node_id: 42,
            advertise: "h:25672".into(),
            stream_host: "h".into(),
            stream_port: 5552,
        }
    }

    #[test]
    fn every_frame_round_trips_and_any_flipped_bit_is_refused() {
        let frames = [
            LinkFrame::Hello(hello()),
            LinkFrame::Welcome(hello()),
            LinkFrame::Refuse("another cluster".into()),
            LinkFrame::Heartbeat,
            LinkFrame::Raft { group: u32::MAX, message: Bytes::from_static(b"raft") },
            LinkFrame::Request { id: 3, body: Bytes::from_static(b"{}") },
            LinkFrame::Response { id: 3, body: Bytes::from_static(b"{\"ok\":true}") },
            LinkFrame::Payload { channel: 2, body: Bytes::from_static(b"forward") },
            LinkFrame::RaftPart { group: 1, transfer: 9, total: 10, offset: 4, bytes: Bytes::from_static(b"part") },
        ];
        for frame in frames {
            let bytes = frame.to_bytes();
            assert_eq!(LinkFrame::decode(&bytes).expect("decodes"), frame);
            for position in 0..bytes.len() {
                let mut damaged = bytes.to_vec();
                damaged[position] ^= 0x04;
                assert!(LinkFrame::decode(&damaged).is_err(), "{frame:?}: a flipped bit at {position} passed");
            }
        }
    }

    #[test]
    fn a_stray_client_is_not_a_frame() {
        // An HTTP request and an AMQP protocol header sent to the cluster port.
        for stray in [&b"GET / HTTP/1.1\r\n\r\n"[..], &b"AMQP\x00\x00\x09\x01"[..]] {
            assert!(LinkFrame::decode(stray).is_err(), "{stray:?}");
        }
        let mut oversized = vec![0; FRAME_HEADER_BYTES];
        oversized[..4].copy_from_slice(&((LINK_FRAME_BYTES_MAX + 1) as u32).to_le_bytes());
        assert!(matches!(LinkFrame::decode(&oversized), Err(DecodeError::Invalid { field: "frame length", .. })));
    }
}
