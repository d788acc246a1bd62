//! What a Raft entry carries: a batch of logical per-queue commands, cut by the proposing leader
//! at the end of a group-commit window, with the leader's clock at that moment so every replica
//! applies the batch at the same time.

use crate::codec::{decode_limits, encode_limits, DecodeError, Reader, Writer};
use bytes::Bytes;
use queue_core::Limits;

/// A quorum queue's id within the cluster (assigned when its declaration is committed).
pub type QueueId = u64;

/// The body of a replicated message: a slice of the Raft entry it arrived in (no copy).
///
/// The server stores a message as `u32 envelope length (LE) | envelope | payload`, the envelope
/// holding what is not the payload (exchange, routing key, properties); the queue's byte limits
/// count the payload only, as RabbitMQ's `x-max-length-bytes` counts bodies. Bytes without a
/// valid prefix (the crate's own tests use plain bodies) count whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body(pub Bytes);

impl Body {
    /// The payload's size: everything after the envelope.
    pub fn payload_bytes(&self) -> u64 {
        let bytes = &self.0;
        if bytes.len() < 4 {
            return bytes.len() as u64;
        }
        let envelope = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        match bytes.len().checked_sub(4 + envelope) {
            Some(payload) => payload as u64,
            None => bytes.len() as u64,
        }
    }
}

impl queue_core::Payload for Body {
    fn size_bytes(&self) -> u64 {
        self.payload_bytes()
    }
}

/// What a command does to its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueCommand {
    /// Creates the queue, empty, with its limits. The queue's id is the command's `queue` when
    /// not 0, else one the machine assigns (unique, never reused: a stale command of a deleted
    /// queue can never reach a new queue of the same name). `name` (when not empty) finds the
    /// queue again after a restart; a second declare of a name or id answers with the queue
    /// that exists, unless `incarnation` says which of the two came first.
    Declare {
        /// The queue's name as the server keys it (vhost and name), or empty.
        name: Bytes,
        /// Which declaration of the name this is, in an order every node agrees on (a cluster's
        /// metadata log index of it; 0: unordered, any queue of the name is this one). Every node
        /// proposes a cluster's declaration, each when it applies it, so a slow node's declaration
        /// of a queue deleted since can commit after the name was declared again: it must not be
        /// answered with the later queue (that node's deletion would then delete it).
        incarnation: u64,
        /// x-max-length, x-overflow, x-message-ttl, x-delivery-limit, dead-lettering.
        limits: Limits,
        /// x-single-active-consumer.
        single_active_consumer: bool,
    },
    /// Removes the queue and its messages.
    Delete,
    /// A published message.
    Enqueue {
        /// Whether the publisher asked for delivery mode 2.
        persistent: bool,
        /// The message's own expiration, if any.
        own_ttl_ms: Option<u64>,
        /// The message as the broker stores it (see [`Body`]).
        body: Bytes,
        /// With x-message-deduplication, the message's key: a key the queue's cache holds is not
        /// enqueued (still confirmed); a new one is recorded once the message is enqueued.
        deduplication: Option<DeduplicationKey>,
    },
    /// basic.consume. `consumer` is the proposer's own name for it (unique per proposer); the
    /// proposer owns it: its node sends its deliveries, and when the proposer is released (its
    /// node restarted or went away) the consumer goes and its unacked messages come back.
    AddConsumer {
        /// The consumer, as its proposer names it.
        consumer: u64,
        /// x-priority.
        priority: i64,
        /// The channel's prefetch count for it (0: unlimited).
        prefetch: u32,
    },
    /// basic.cancel, or the consumer's channel went away.
    CancelConsumer {
        /// The consumer, as its proposer names it.
        consumer: u64,
    },
    /// basic.ack of the delivery at `position`.
    Settle {
        /// The delivery's queue position.
        position: u64,
    },
    /// A delivery whose consumer or channel went away: back to its place, redelivered.
    Requeue {
        /// The delivery's queue position.
        position: u64,
    },
    /// queue.purge.
    Purge,
    /// basic.reject, basic.nack or basic.recover with requeue: to the back of the queue,
    /// redelivered, under a new position (RabbitMQ 3.10.8's quorum queues, measured).
    RequeueToTail {
        /// The delivery's queue position.
        position: u64,
    },
    /// basic.reject / basic.nack without requeue: the message leaves (dead-lettered, reason
    /// `rejected`, when the queue has a dead-letter exchange).
    Reject {
        /// The delivery's queue position.
        position: u64,
    },
    /// basic.get: the first ready message goes to the proposer (held by it unless `no_ack`).
    Get {
        /// basic.get's no-ack.
        no_ack: bool,
    },
    /// New limits (a policy changed); a lower drop-head length limit drops at once.
    SetLimits {
        /// The limits.
        limits: Limits,
    },
    /// Time passed: expired messages at the head leave (reason `expired`).
    Expire,
    /// Says which node the proposer runs on, so its consumers and basic.gets can be released
    /// when that node restarts or goes away.
    RegisterProposer {
        /// The node's Raft id.
        node: u64,
    },
    /// A use of the queue (a redeclare of a queue with x-expires): changes nothing; every replica
    /// that applies it renews the queue's lease, so the node leading it when the lease runs out
    /// saw the use wherever it was made.
    Touch,
    /// The dead letter the queue keeps at `position` is held by every queue it was dead-lettered
    /// to: the queue forgets it (at-least-once dead-lettering).
    SettleDeadLetter {
        /// The dead letter's position in the queue.
        position: u64,
    },
    /// A message an `x-delayed-message` exchange holds back until `due_ms` (the cluster's
    /// replicated delay store, kept by one internal queue): the node `origin` that took the
    /// publish routes it when it is due, or the shard's leader once it is overdue and its origin
    /// did not (its node is down). Refused (a nack) past [`DELAYED_BYTES_MAX`].
    HoldDelayed {
        /// When it is due (ms since the epoch, the origin's clock).
        due_ms: u64,
        /// The node (Raft id) that took the publish.
        origin: u64,
        /// The message as the broker stores it, its delay envelope included.
        body: Bytes,
    },
    /// A held message was routed and its queues hold it: the store forgets it.
    ReleaseDelayed {
        /// Its id in the store (`state_machine::delayed`).
        id: u64,
    },
    /// Releases every proposer of `node` except `keep`: their consumers are cancelled, the
    /// messages they and their basic.gets held come back (redelivered), and their numbers are
    /// forgotten (a command of a released proposer is refused from then on). `queue` is ignored.
    ReleaseNode {
        /// The node whose earlier (or every) proposer is gone.
        node: u64,
        /// Its proposer that stays (its current one), or 0.
        keep: u64,
    },
}

/// A message's deduplication key with its cache's settings, as the proposer read them from the
/// queue's arguments (every replica applies them at the batch's `now_ms`, so the cache is the same
/// on every one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeduplicationKey {
    /// The key (the server's encoding of the header's value, at most [`DEDUPLICATION_KEY_BYTES_MAX`]).
    pub key: Bytes,
    /// How long the entry counts (the message's `x-cache-ttl`, else the queue's; `None`: until evicted).
    pub ttl_ms: Option<u64>,
    /// The cache's `x-cache-size`: a full cache evicts its oldest inserted entry.
    pub cache_size: u64,
}

/// The longest key a command may carry (longer header values are hashed by the proposer).
pub const DEDUPLICATION_KEY_BYTES_MAX: usize = 64;

/// The most payload bytes the replicated delay store of one queue holds; a message past it is
/// refused (its publisher's confirm is a nack). Bodies are in every member's memory (as quorum
/// queues' messages are), so the store is bounded here, the same on every member.
pub const DELAYED_BYTES_MAX: u64 = 512 * 1024 * 1024;

/// The largest cache a command may ask for (the server's `x-cache-size` bound).
pub const DEDUPLICATION_CACHE_SIZE_MAX: u64 = 1_000_000;

/// One command with its queue and the name its proposer gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposedCommand {
    /// The queue it changes.
    pub queue: QueueId,
    /// The node that proposed it (its confirm goes there).
    pub proposer: u64,
    /// The proposer's sequence number for it, from 1, increasing in proposal order; a retry keeps
    /// its number, so the state machine applies it once (0: not deduplicated).
    pub sequence: u64,
    /// What it does.
    pub command: QueueCommand,
}

/// The commands of one Raft entry, applied in order at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The proposing leader's clock when it cut the batch (milliseconds since the epoch).
    pub now_ms: u64,
    /// The commands.
    pub commands: Vec<ProposedCommand>,
}

/// Marks a batch, so an entry of another kind (or garbage) is refused rather than misread.
const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"LQB1");

/// The most commands one batch holds; a proposer cuts a new batch there.
pub const BATCH_COMMANDS_MAX: usize = 4096;

impl Batch {
    /// The entry data.
    pub fn encode(&self) -> Vec<u8> {
        let mut buffer = Vec::with_capacity(16 + self.commands.len() * 40);
        let mut writer = Writer(&mut buffer);
        writer.u32(BATCH_MAGIC);
        writer.u64(self.now_ms);
        writer.u32(self.commands.len() as u32);
        for command in &self.commands {
            encode_command(&mut writer, command);
        }
        buffer
    }

    /// A batch from entry data; bodies are slices of `data`.
    pub fn decode(data: Bytes) -> Result<Batch, DecodeError> {
        let mut reader = Reader::new(data);
        let magic = reader.u32()?;
        if magic != BATCH_MAGIC {
            return Err(DecodeError::Invalid { field: "batch magic", value: magic.into() });
        }
        let now_ms = reader.u64()?;
        let count = reader.u32()? as usize;
        if count > BATCH_COMMANDS_MAX {
            return Err(DecodeError::Invalid { field: "batch command count", value: count as u64 });
        }
        let mut commands = Vec::with_capacity(count);
        for _ in 0..count {
            commands.push(decode_command(&mut reader)?);
        }
        if !reader.is_at_end() {
            return Err(DecodeError::Invalid { field: "bytes after the batch", value: 0 });
        }
        Ok(Batch { now_ms, commands })
    }
}

/// The command kind of a declaration with its incarnation (kind 0, without one, is still read).
const DECLARE_WITH_INCARNATION: u8 = 16;

/// The command kind of an enqueue with a deduplication key (kind 2 is one without).
const ENQUEUE_DEDUPLICATED: u8 = 18;

fn encode_command(writer: &mut Writer, proposed: &ProposedCommand) {
    writer.u64(proposed.queue);
    writer.u64(proposed.proposer);
    writer.u64(proposed.sequence);
    match &proposed.command {
        QueueCommand::Declare { name, incarnation, limits, single_active_consumer } => {
            writer.u8(DECLARE_WITH_INCARNATION);
            writer.bytes(name);
            writer.u64(*incarnation);
            encode_limits(writer, limits);
            writer.u8(u8::from(*single_active_consumer));
        }
        QueueCommand::Delete => writer.u8(1),
        QueueCommand::Enqueue { persistent, own_ttl_ms, body, deduplication } => {
            writer.u8(if deduplication.is_some() { ENQUEUE_DEDUPLICATED } else { 2 });
            writer.u8(u8::from(*persistent));
            writer.optional_u64(*own_ttl_ms);
            writer.bytes(body);
            if let Some(DeduplicationKey { key, ttl_ms, cache_size }) = deduplication {
                writer.bytes(key);
                writer.optional_u64(*ttl_ms);
                writer.u64(*cache_size);
            }
        }
        QueueCommand::AddConsumer { consumer, priority, prefetch } => {
            writer.u8(3);
            writer.u64(*consumer);
            writer.i64(*priority);
            writer.u32(*prefetch);
        }
        QueueCommand::CancelConsumer { consumer } => {
            writer.u8(4);
            writer.u64(*consumer);
        }
        QueueCommand::Settle { position } => {
            writer.u8(5);
            writer.u64(*position);
        }
        QueueCommand::Requeue { position } => {
            writer.u8(6);
            writer.u64(*position);
        }
        QueueCommand::Purge => writer.u8(7),
        QueueCommand::Reject { position } => {
            writer.u8(8);
            writer.u64(*position);
        }
        QueueCommand::Get { no_ack } => {
            writer.u8(9);
            writer.u8(u8::from(*no_ack));
        }
        QueueCommand::SetLimits { limits } => {
            writer.u8(10);
            encode_limits(writer, limits);
        }
        QueueCommand::Expire => writer.u8(11),
        QueueCommand::RegisterProposer { node } => {
            writer.u8(12);
            writer.u64(*node);
        }
        QueueCommand::RequeueToTail { position } => {
            writer.u8(14);
            writer.u64(*position);
        }
        QueueCommand::SettleDeadLetter { position } => {
            writer.u8(15);
            writer.u64(*position);
        }
        QueueCommand::Touch => writer.u8(17),
        QueueCommand::HoldDelayed { due_ms, origin, body } => {
            writer.u8(19);
            writer.u64(*due_ms);
            writer.u64(*origin);
            writer.bytes(body);
        }
        QueueCommand::ReleaseDelayed { id } => {
            writer.u8(20);
            writer.u64(*id);
        }
        QueueCommand::ReleaseNode { node, keep } => {
            writer.u8(13);
            writer.u64(*node);
            writer.u64(*keep);
        }
    }
}

fn decode_command(reader: &mut Reader) -> Result<ProposedCommand, DecodeError> {
    let queue = reader.u64()?;
    let proposer = reader.u64()?;
    let sequence = reader.u64()?;
    let command = match reader.u8()? {
        // Logs written before declarations carried their incarnation: unordered.
        0 => QueueCommand::Declare {
            name: reader.bytes()?,
            incarnation: 0,
            limits: decode_limits(reader)?,
            single_active_consumer: reader.bool("single active consumer")?,
        },
        DECLARE_WITH_INCARNATION => QueueCommand::Declare {
            name: reader.bytes()?,
            incarnation: reader.u64()?,
            limits: decode_limits(reader)?,
            single_active_consumer: reader.bool("single active consumer")?,
        },
        1 => QueueCommand::Delete,
        2 => QueueCommand::Enqueue {
            persistent: reader.bool("persistent")?,
            own_ttl_ms: reader.optional_u64("own ttl")?,
            body: reader.bytes()?,
            deduplication: None,
        },
        ENQUEUE_DEDUPLICATED => QueueCommand::Enqueue {
            persistent: reader.bool("persistent")?,
            own_ttl_ms: reader.optional_u64("own ttl")?,
            body: reader.bytes()?,
            deduplication: Some(decode_deduplication_key(reader)?),
        },
        3 => QueueCommand::AddConsumer { consumer: reader.u64()?, priority: reader.i64()?, prefetch: reader.u32()? },
        4 => QueueCommand::CancelConsumer { consumer: reader.u64()? },
        5 => QueueCommand::Settle { position: reader.u64()? },
        6 => QueueCommand::Requeue { position: reader.u64()? },
        7 => QueueCommand::Purge,
        8 => QueueCommand::Reject { position: reader.u64()? },
        9 => QueueCommand::Get { no_ack: reader.bool("no ack")? },
        10 => QueueCommand::SetLimits { limits: decode_limits(reader)? },
        11 => QueueCommand::Expire,
        12 => QueueCommand::RegisterProposer { node: reader.u64()? },
        13 => QueueCommand::ReleaseNode { node: reader.u64()?, keep: reader.u64()? },
        14 => QueueCommand::RequeueToTail { position: reader.u64()? },
        15 => QueueCommand::SettleDeadLetter { position: reader.u64()? },
        17 => QueueCommand::Touch,
        19 => QueueCommand::HoldDelayed { due_ms: reader.u64()?, origin: reader.u64()?, body: reader.bytes()? },
        20 => QueueCommand::ReleaseDelayed { id: reader.u64()? },
        kind => return Err(DecodeError::Invalid { field: "command kind", value: kind.into() }),
    };
    Ok(ProposedCommand { queue, proposer, sequence, command })
}

fn decode_deduplication_key(reader: &mut Reader) -> Result<DeduplicationKey, DecodeError> {
    // A copy: the key outlives the entry it arrived in (the cache keeps it), the entry must not.
    let key = Bytes::copy_from_slice(&reader.bytes()?);
    if key.is_empty() || key.len() > DEDUPLICATION_KEY_BYTES_MAX {
        return Err(DecodeError::Invalid { field: "deduplication key length", value: key.len() as u64 });
    }
    let ttl_ms = reader.optional_u64("deduplication ttl")?;
    let cache_size = reader.u64()?;
    if cache_size == 0 || cache_size > DEDUPLICATION_CACHE_SIZE_MAX {
        return Err(DecodeError::Invalid { field: "deduplication cache size", value: cache_size });
    }
    Ok(DeduplicationKey { key, ttl_ms, cache_size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_decodes_to_what_was_encoded_and_garbage_is_refused() {
        let commands = vec![
            ProposedCommand {
                queue: 1,
                proposer: 2,
                sequence: 3,
                command: QueueCommand::Declare {
                    name: Bytes::from_static(b"/\0q"),
                    incarnation: 41,
                    limits: Limits {
                        max_length: Some(3),
                        delivery_limit: Some(2),
                        overflow: queue_core::Overflow::RejectPublish,
                        dead_letters: true,
                        dead_letter_at_least_once: true,
                        ..Limits::NONE
                    },
                    single_active_consumer: true,
                },
            },
            ProposedCommand {
                queue: 1,
                proposer: 2,
                sequence: 4,
                command: QueueCommand::Enqueue {
                    persistent: true,
                    own_ttl_ms: Some(5),
                    body: Bytes::from_static(b"hello"),
                    deduplication: None,
                },
            },
            ProposedCommand {
                queue: 1,
                proposer: 2,
                sequence: 16,
                command: QueueCommand::Enqueue {
                    persistent: false,
                    own_ttl_ms: None,
                    body: Bytes::from_static(b"keyed"),
                    deduplication: Some(DeduplicationKey { key: Bytes::from_static(b"Sorder-1"), ttl_ms: Some(300), cache_size: 2 }),
                },
            },
            ProposedCommand {
                queue: 1,
                proposer: 2,
                sequence: 5,
                command: QueueCommand::AddConsumer { consumer: 9, priority: -1, prefetch: 10 },
            },
            ProposedCommand { queue: 1, proposer: 2, sequence: 6, command: QueueCommand::Requeue { position: 0 } },
            ProposedCommand { queue: 1, proposer: 2, sequence: 7, command: QueueCommand::Reject { position: 4 } },
            ProposedCommand { queue: 1, proposer: 2, sequence: 8, command: QueueCommand::Get { no_ack: true } },
            ProposedCommand {
                queue: 1,
                proposer: 2,
                sequence: 9,
                command: QueueCommand::SetLimits { limits: Limits { message_ttl_ms: Some(9), ..Limits::NONE } },
            },
            ProposedCommand { queue: 1, proposer: 2, sequence: 10, command: QueueCommand::Expire },
            ProposedCommand { queue: 1, proposer: 2, sequence: 13, command: QueueCommand::RequeueToTail { position: 3 } },
            ProposedCommand { queue: 1, proposer: 2, sequence: 14, command: QueueCommand::SettleDeadLetter { position: 5 } },
            ProposedCommand { queue: 1, proposer: 2, sequence: 15, command: QueueCommand::Touch },
            ProposedCommand {
                queue: 1,
                proposer: 2,
                sequence: 17,
                command: QueueCommand::HoldDelayed { due_ms: 99, origin: 3, body: Bytes::from_static(b"later") },
            },
            ProposedCommand { queue: 1, proposer: 2, sequence: 18, command: QueueCommand::ReleaseDelayed { id: 7 } },
            ProposedCommand { queue: 0, proposer: 2, sequence: 11, command: QueueCommand::RegisterProposer { node: 3 } },
            ProposedCommand { queue: 0, proposer: 2, sequence: 12, command: QueueCommand::ReleaseNode { node: 3, keep: 2 } },
        ];
        let batch = Batch { now_ms: 77, commands };
        let encoded = Bytes::from(batch.encode());
        assert_eq!(Batch::decode(encoded.clone()), Ok(batch));
        for cut in 0..encoded.len() {
            assert!(Batch::decode(encoded.slice(..cut)).is_err(), "a batch cut at {cut} bytes decoded");
        }
    }
}

#[cfg(test)]
mod deduplication_tests {
    use super::*;

    fn keyed(key: Bytes, cache_size: u64) -> Batch {
        let deduplication = Some(DeduplicationKey { key, ttl_ms: None, cache_size });
        let command = QueueCommand::Enqueue { persistent: true, own_ttl_ms: None, body: Bytes::from_static(b"m"), deduplication };
        Batch { now_ms: 1, commands: vec![ProposedCommand { queue: 1, proposer: 2, sequence: 3, command }] }
    }

    #[test]
    fn a_key_or_cache_size_out_of_bounds_is_refused() {
        let fine = keyed(Bytes::from(vec![1u8; DEDUPLICATION_KEY_BYTES_MAX]), DEDUPLICATION_CACHE_SIZE_MAX);
        assert_eq!(Batch::decode(Bytes::from(fine.encode())), Ok(fine));
        for refused in [
            keyed(Bytes::new(), 1),
            keyed(Bytes::from(vec![1u8; DEDUPLICATION_KEY_BYTES_MAX + 1]), 1),
            keyed(Bytes::from_static(b"k"), 0),
            keyed(Bytes::from_static(b"k"), DEDUPLICATION_CACHE_SIZE_MAX + 1),
        ] {
            assert!(Batch::decode(Bytes::from(refused.encode())).is_err(), "{refused:?} decoded");
        }
    }
}
