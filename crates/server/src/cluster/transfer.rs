//! Raft messages too large for a peer's send queue or one frame, sent in parts: a quorum shard's
//! snapshot holds every ready message of its queues, so a member behind a compacted log may need
//! one of hundreds of MiB. It goes beside the send queue, one part at a time between the queue's
//! frames (heartbeats and appends keep flowing), at most one transfer per peer at a time; the
//! receiver joins the parts in order and takes the message when it is whole.
//!
//! Decided against raising `peer_queue_bytes_max` or the frame bound instead: either would let one
//! snapshot hold a peer's whole queue (and its memory) at once, and a snapshot over the new bound
//! would fail the same way, so a member behind it would never catch up.

use super::frame::LinkFrame;
use bytes::{Bytes, BytesMut};

/// Raft messages longer than this go in parts (a quarter of the default send queue).
pub const RAFT_TRANSFER_BYTES_MIN: usize = 4 << 20;

/// The bytes of one part.
pub const RAFT_PART_BYTES: usize = 1 << 20;

/// The longest message a node joins from parts; a transfer announcing more is refused (its
/// sender's Raft reports the snapshot lost and tries again later).
pub const RAFT_TRANSFER_BYTES_MAX: u64 = 1 << 30;

/// The most a node reserves for a transfer before its parts arrive.
const RESERVED_BYTES_MAX: usize = 64 << 20;

/// A message being sent in parts.
#[derive(Debug)]
pub(super) struct OutgoingTransfer {
    transfer: u64,
    group: u32,
    message: Bytes,
    sent: usize,
}

impl OutgoingTransfer {
    pub(super) fn new(transfer: u64, group: u32, message: Bytes) -> OutgoingTransfer {
        OutgoingTransfer { transfer, group, message, sent: 0 }
    }

    /// Appends the next part's frame to `buffer`; its length, and whether parts remain.
    pub(super) fn encode_next_part(&mut self, buffer: &mut Vec<u8>) -> (usize, bool) {
        let end = (self.sent + RAFT_PART_BYTES).min(self.message.len());
        let before = buffer.len();
        LinkFrame::RaftPart {
            group: self.group,
            transfer: self.transfer,
            total: self.message.len() as u64,
            offset: self.sent as u64,
            bytes: self.message.slice(self.sent..end),
        }
        .encode(buffer);
        self.sent = end;
        (buffer.len() - before, self.sent < self.message.len())
    }
}

/// A message being joined from its parts.
#[derive(Debug)]
pub(super) struct IncomingTransfer {
    transfer: u64,
    group: u32,
    total: u64,
    joined: BytesMut,
}

/// What a part did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PartTaken {
    /// More parts are due.
    Partial,
    /// The message is whole.
    Whole {
        /// Its group.
        group: u32,
        /// The message.
        message: Bytes,
    },
    /// The part does not continue a transfer (or announces one over the bound): the transfer
    /// is dropped, and why.
    Refused(String),
}

/// A part as it arrived.
#[derive(Debug)]
pub(super) struct Part {
    pub(super) group: u32,
    pub(super) transfer: u64,
    pub(super) total: u64,
    pub(super) offset: u64,
    pub(super) bytes: Bytes,
}

/// Takes a part into `slot` (the peer's transfer being joined, if any).
pub(super) fn take_part(slot: &mut Option<IncomingTransfer>, part: Part) -> PartTaken {
    if part.offset == 0 {
        if part.total == 0 || part.total > RAFT_TRANSFER_BYTES_MAX {
            *slot = None;
            return PartTaken::Refused(format!("a transfer of {} bytes (at most {RAFT_TRANSFER_BYTES_MAX})", part.total));
        }
        let reserved = usize::try_from(part.total).unwrap_or(usize::MAX).min(RESERVED_BYTES_MAX);
        *slot = Some(IncomingTransfer {
            transfer: part.transfer,
            group: part.group,
            total: part.total,
            joined: BytesMut::with_capacity(reserved),
        });
    }
    let Some(incoming) = slot.as_mut() else {
        return PartTaken::Refused(format!("a part at {} of transfer {} that did not start here", part.offset, part.transfer));
    };
    let joined = incoming.joined.len() as u64;
    let continues = incoming.transfer == part.transfer && incoming.group == part.group && incoming.total == part.total;
    if !continues || part.offset != joined || joined + part.bytes.len() as u64 > incoming.total {
        *slot = None;
        return PartTaken::Refused(format!("a part at {} of transfer {} where {joined} bytes were joined", part.offset, part.transfer));
    }
    incoming.joined.extend_from_slice(&part.bytes);
    if (incoming.joined.len() as u64) < incoming.total {
        return PartTaken::Partial;
    }
    let (group, message) = (incoming.group, std::mem::take(&mut incoming.joined).freeze());
    *slot = None;
    PartTaken::Whole { group, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts_of(message: &Bytes, transfer: u64) -> Vec<Part> {
        let mut outgoing = OutgoingTransfer::new(transfer, 3, message.clone());
        let mut parts = Vec::new();
        loop {
            let mut buffer = Vec::new();
            let (length, more) = outgoing.encode_next_part(&mut buffer);
            assert_eq!(length, buffer.len());
            match LinkFrame::decode(&buffer).expect("a part decodes") {
                LinkFrame::RaftPart { group, transfer, total, offset, bytes } => parts.push(Part { group, transfer, total, offset, bytes }),
                other => panic!("{other:?}"),
            }
            if !more {
                return parts;
            }
        }
    }

    #[test]
    fn a_message_sent_in_parts_is_joined_whole() {
        let message = Bytes::from((0..(RAFT_PART_BYTES * 2 + 17)).map(|index| index as u8).collect::<Vec<u8>>());
        let parts = parts_of(&message, 1);
        assert_eq!(parts.len(), 3);
        let mut slot = None;
        let mut taken = Vec::new();
        for part in parts {
            taken.push(take_part(&mut slot, part));
        }
        assert_eq!(taken[..2], [PartTaken::Partial, PartTaken::Partial]);
        assert_eq!(taken[2], PartTaken::Whole { group: 3, message });
        assert!(slot.is_none());
    }

    #[test]
    fn a_part_out_of_order_or_of_another_transfer_drops_the_transfer_and_a_new_one_starts_over() {
        let message = Bytes::from(vec![5u8; RAFT_PART_BYTES * 3]);
        let mut parts = parts_of(&message, 1).into_iter();
        let mut slot = None;
        assert_eq!(take_part(&mut slot, parts.next().expect("first")), PartTaken::Partial);
        let _skipped = parts.next();
        assert!(matches!(take_part(&mut slot, parts.next().expect("third")), PartTaken::Refused(_)));
        assert!(slot.is_none());
        // A later part with nothing started is refused too; a new transfer from its start is whole.
        let mut again = parts_of(&message, 2).into_iter();
        let first = again.next().expect("first");
        assert!(matches!(take_part(&mut slot, again.next().expect("second")), PartTaken::Refused(_)));
        assert_eq!(take_part(&mut slot, first), PartTaken::Partial);
        let mut last = PartTaken::Partial;
        for part in parts_of(&message, 2).into_iter().skip(1) {
            last = take_part(&mut slot, part);
        }
        assert_eq!(last, PartTaken::Whole { group: 3, message });
    }

    #[test]
    fn a_transfer_over_the_bound_is_refused_before_anything_is_reserved() {
        let mut slot = None;
        let part = Part { group: 1, transfer: 1, total: RAFT_TRANSFER_BYTES_MAX + 1, offset: 0, bytes: Bytes::from_static(b"x") };
        assert!(matches!(take_part(&mut slot, part), PartTaken::Refused(_)));
        assert!(slot.is_none());
    }
}
