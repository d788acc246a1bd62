//! Checks on a peer's Raft message before it is stepped. raft-rs trusts its peers and asserts on
//! inputs a correct peer never sends (a commit index past the receiver's log, entries that do not
//! follow each other); a faulty, damaged or foreign peer must cost a log line, not the node.

use super::ReplicaNode;
use crate::command::Batch;
use crate::state_machine::QueueStateMachine;
use raft::eraftpb::{EntryType, Message, MessageType};

/// Why a peer's message was not stepped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefusedMessage {
    /// It is addressed to another node.
    #[error("addressed to node {0}")]
    NotForThisNode(u64),
    /// Its entries do not follow each other from the index it names.
    #[error("entries out of sequence after index {0}")]
    EntriesOutOfSequence(u64),
    /// An entry's term is above the message's.
    #[error("an entry of term {entry} in a message of term {message}")]
    EntryTermAbove {
        /// The entry's term.
        entry: u64,
        /// The message's.
        message: u64,
    },
    /// A forwarded proposal that is not a batch of queue commands (or changes the membership).
    #[error("a forwarded proposal that is not a batch of queue commands")]
    ProposalNotABatch,
    /// A snapshot whose state machine image does not decode.
    #[error("a snapshot whose image does not decode")]
    SnapshotImage,
}

impl ReplicaNode {
    /// Steps a peer's message after checking it; a heartbeat's commit index is capped at this
    /// node's log (a leader may believe it holds entries a power cut took).
    pub fn step_checked(&mut self, mut message: Message) -> Result<(), RefusedMessage> {
        if message.to != self.id() {
            return Err(RefusedMessage::NotForThisNode(message.to));
        }
        match message.get_msg_type() {
            MessageType::MsgAppend => check_append(&message)?,
            MessageType::MsgPropose => {
                let is_batch = |entry: &raft::eraftpb::Entry| {
                    entry.get_entry_type() == EntryType::EntryNormal && Batch::decode(entry.data.clone()).is_ok()
                };
                if !message.entries.iter().all(is_batch) {
                    return Err(RefusedMessage::ProposalNotABatch);
                }
            }
            MessageType::MsgSnapshot if QueueStateMachine::decode_image(message.get_snapshot().data.clone()).is_err() => {
                return Err(RefusedMessage::SnapshotImage);
            }
            MessageType::MsgHeartbeat => message.commit = message.commit.min(self.store().last_index_now()),
            _ => {}
        }
        self.step(message);
        Ok(())
    }
}

fn check_append(message: &Message) -> Result<(), RefusedMessage> {
    for (offset, entry) in message.entries.iter().enumerate() {
        if entry.index != message.index + 1 + offset as u64 {
            return Err(RefusedMessage::EntriesOutOfSequence(message.index));
        }
        if entry.term > message.term {
            return Err(RefusedMessage::EntryTermAbove { entry: entry.term, message: message.term });
        }
    }
    if message.log_term > message.term {
        return Err(RefusedMessage::EntryTermAbove { entry: message.log_term, message: message.term });
    }
    Ok(())
}
