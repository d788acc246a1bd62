//! How Raft messages leave a node: the [`Transport`] the node's host sends through (the cluster's
//! TCP link per node pair in the server, the seeded in-memory network in the simulation), and the
//! frame a message travels in between nodes.
//!
//! A frame names its shard (Raft group), so one link per node pair carries every group's
//! messages; heartbeats of several groups to one peer leave in one write.

use crate::codec::{append_checksum, verify_checksum, DecodeError, Reader, Writer};
use bytes::Bytes;
use protobuf::Message as _;
use raft::eraftpb::Message;

/// A Raft group's number within the cluster.
pub type ShardId = u32;

/// The largest frame a node accepts from a peer: a snapshot message carries the whole state
/// machine image, so a larger one is refused (and the snapshot is reported failed) rather than
/// read into memory.
pub const FRAME_BYTES_MAX: usize = 64 << 20;

/// Seeds frame checksums, so bytes of another protocol are never taken for a frame.
const FRAME_CHECKSUM_SEED: u32 = 0x7A11_F4A3;

/// Where a node's Raft messages go.
pub trait Transport {
    /// Queues `message` (of group `shard`) for `message.to`. Never blocks: when the peer's queue
    /// is full the message is dropped, which Raft tolerates (it resends), and for a snapshot the
    /// sender is told it failed.
    fn send(&mut self, shard: ShardId, message: Message);
}

/// How a node's quorum-queue host reaches the other nodes: the cluster's links between processes,
/// in-memory channels in tests. Every shard's thread sends through the same one, so a link per
/// node pair carries every group's messages (the frame names the group: [`encode_frame`]).
///
/// This is the whole node-to-node protocol of quorum queues: Raft messages of each shard. A
/// command proposed on a node that does not lead its shard reaches the leader inside them (a
/// raft-rs `MsgPropose`), and its outcome, like every delivery of the plan, comes back to each
/// node by applying the committed log itself. The receiving side hands each decoded frame to the
/// host (`QuorumHost::receive` in the server), which checks it before stepping it.
pub trait PeerTransport: Send + Sync {
    /// Queues `message` (of group `shard`) for node `message.to`. Never blocks: when there is no
    /// link to the peer or its queue is full, the message is dropped and this returns false (Raft
    /// resends; the host reports a dropped snapshot as failed so the leader sends it again).
    fn send(&self, shard: ShardId, message: Message) -> bool;
}

/// A node alone: every group has this node as its only voter, so nothing is ever sent.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPeers;

impl PeerTransport for NoPeers {
    fn send(&self, _shard: ShardId, _message: Message) -> bool {
        false
    }
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Over [`FRAME_BYTES_MAX`].
    #[error("frame of {0} bytes is over the limit")]
    TooLarge(usize),
    /// Its fields or checksum are wrong.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The protobuf message inside does not parse.
    #[error("raft message: {0}")]
    Protobuf(#[from] protobuf::ProtobufError),
}

/// The frame of one message: shard, the message in raft-rs's protobuf encoding, a checksum.
pub fn encode_frame(shard: ShardId, message: &Message) -> Result<Vec<u8>, FrameError> {
    let encoded = message.write_to_bytes()?;
    if encoded.len() + 12 > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge(encoded.len()));
    }
    let mut buffer = Vec::with_capacity(encoded.len() + 12);
    let mut writer = Writer(&mut buffer);
    writer.u32(shard);
    writer.bytes(&encoded);
    append_checksum(&mut buffer, 0, FRAME_CHECKSUM_SEED);
    Ok(buffer)
}

/// A frame read from a peer.
pub fn decode_frame(frame: Bytes) -> Result<(ShardId, Message), FrameError> {
    if frame.len() > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge(frame.len()));
    }
    let mut reader = Reader::new(verify_checksum(&frame, FRAME_CHECKSUM_SEED)?);
    let shard = reader.u32()?;
    let encoded = reader.bytes()?;
    if !reader.is_at_end() {
        return Err(DecodeError::Invalid { field: "bytes after the message", value: 0 }.into());
    }
    let message = Message::parse_from_bytes(&encoded)?;
    Ok((shard, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{Entry, MessageType};

    #[test]
    fn a_frame_carries_its_shard_and_message_and_refuses_damage() {
        let mut message = Message { from: 1, to: 2, term: 3, commit: 4, ..Default::default() };
        message.set_msg_type(MessageType::MsgAppend);
        message.entries = vec![Entry { index: 5, term: 3, data: Bytes::from_static(b"batch"), ..Default::default() }].into();
        let frame = Bytes::from(encode_frame(9, &message).expect("encodes"));
        let (shard, decoded) = decode_frame(frame.clone()).expect("decodes");
        assert_eq!((shard, decoded), (9, message));
        for position in 0..frame.len() {
            let mut damaged = frame.to_vec();
            damaged[position] ^= 0x10;
            assert!(decode_frame(Bytes::from(damaged)).is_err(), "a flipped bit at {position} passed");
        }
    }
}
