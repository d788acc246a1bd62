//! The state machine as snapshot bytes and back: every queue's `CoreImage` in a checksummed
//! binary encoding. Equal machines encode to equal bytes (queues in id order, unacked messages in
//! position order), which is also how the tests compare replicas.

use crate::codec::{append_checksum, decode_limits, encode_limits, verify_checksum, DecodeError, Reader, Writer};
use crate::command::Body;
use crate::command::DEDUPLICATION_KEY_BYTES_MAX;
use crate::state_machine::{
    dead_letters, ConsumerOwner, DeduplicationCache, DelayedEntries, DelayedEntry, HeldDeadLetters, QueueStateMachine, ReplicatedQueue,
};
use bytes::Bytes;
use queue_core::{ConsumerImage, CoreImage, MessagesImage, QueueCore, QueueStats, QueuedMessage};

/// Marks a snapshot image (and its format version): version 5 adds each queue's deduplication
/// cache and held delayed messages.
const IMAGE_MAGIC: u32 = u32::from_le_bytes(*b"LQS5");

/// Version 4 (incarnations, no deduplication caches), still read.
const IMAGE_MAGIC_V4: u32 = u32::from_le_bytes(*b"LQS4");

/// Version 3 (held dead letters, no incarnations), still read.
const IMAGE_MAGIC_V3: u32 = u32::from_le_bytes(*b"LQS3");

/// Version 2 (no held dead letters), still read.
const IMAGE_MAGIC_V2: u32 = u32::from_le_bytes(*b"LQS2");

/// Seeds the image checksum, so a log record is never taken for an image.
const IMAGE_CHECKSUM_SEED: u32 = 0x5EED_1A6E;

impl QueueStateMachine {
    /// The machine as bytes.
    pub fn encode_image(&self) -> Vec<u8> {
        let mut buffer = Vec::new();
        let mut writer = Writer(&mut buffer);
        writer.u32(IMAGE_MAGIC);
        writer.u64(self.applied_index);
        for map in [&self.last_sequences, &self.proposers, &self.retired] {
            writer.u64(map.len() as u64);
            for (key, value) in map {
                writer.u64(*key);
                writer.u64(*value);
            }
        }
        writer.u64(self.next_consumer_id);
        writer.u64(self.consumers.len() as u64);
        for (id, owner) in &self.consumers {
            for value in [*id, owner.queue, owner.proposer, owner.local] {
                writer.u64(value);
            }
        }
        writer.u64(self.get_holders.len() as u64);
        for ((queue, position), proposer) in &self.get_holders {
            for value in [*queue, *position, *proposer] {
                writer.u64(value);
            }
        }
        writer.u64(self.queues.len() as u64);
        for (queue, replicated) in &self.queues {
            writer.u64(*queue);
            writer.bytes(&replicated.name);
            writer.u64(replicated.incarnation);
            encode_limits(&mut writer, &replicated.limits);
            encode_core(&mut writer, &replicated.core.image());
            encode_held(&mut writer, &replicated.held);
            encode_deduplication(&mut writer, replicated.deduplication.as_deref());
            encode_delayed(&mut writer, replicated.delayed.as_deref());
        }
        append_checksum(&mut buffer, 0, IMAGE_CHECKSUM_SEED);
        buffer
    }

    /// The machine an image was taken of.
    pub fn decode_image(bytes: Bytes) -> Result<QueueStateMachine, DecodeError> {
        let mut reader = Reader::new(verify_checksum(&bytes, IMAGE_CHECKSUM_SEED)?);
        let magic = reader.u32()?;
        if ![IMAGE_MAGIC, IMAGE_MAGIC_V4, IMAGE_MAGIC_V3, IMAGE_MAGIC_V2].contains(&magic) {
            return Err(DecodeError::Invalid { field: "image magic", value: magic.into() });
        }
        let mut machine = QueueStateMachine::new();
        machine.applied_index = reader.u64()?;
        for map in [&mut machine.last_sequences, &mut machine.proposers, &mut machine.retired] {
            for _ in 0..count(&mut reader, "map length")? {
                let key = reader.u64()?;
                map.insert(key, reader.u64()?);
            }
        }
        machine.next_consumer_id = reader.u64()?;
        for _ in 0..count(&mut reader, "consumer count")? {
            let id = reader.u64()?;
            let owner = ConsumerOwner { queue: reader.u64()?, proposer: reader.u64()?, local: reader.u64()? };
            machine.consumer_ids.insert((owner.proposer, owner.local, owner.queue), id);
            machine.consumers.insert(id, owner);
        }
        for _ in 0..count(&mut reader, "get holder count")? {
            let key = (reader.u64()?, reader.u64()?);
            machine.get_holders.insert(key, reader.u64()?);
        }
        for _ in 0..count(&mut reader, "queue count")? {
            let queue = reader.u64()?;
            let name = reader.bytes()?;
            let incarnation = if [IMAGE_MAGIC, IMAGE_MAGIC_V4].contains(&magic) { reader.u64()? } else { 0 };
            let limits = decode_limits(&mut reader)?;
            let core = QueueCore::from_image(decode_core(&mut reader)?, None);
            let held = if magic == IMAGE_MAGIC_V2 { HeldDeadLetters::default() } else { decode_held(&mut reader)? };
            let (deduplication, delayed) = match magic == IMAGE_MAGIC {
                true => (decode_deduplication(&mut reader)?, decode_delayed(&mut reader)?),
                false => (None, None),
            };
            if !name.is_empty() {
                machine.names.insert(name.clone(), queue);
            }
            machine.queues.insert(queue, ReplicatedQueue { core, limits, name, incarnation, held, deduplication, delayed });
        }
        if !reader.is_at_end() {
            return Err(DecodeError::Invalid { field: "bytes after the image", value: 0 });
        }
        Ok(machine)
    }
}

fn encode_held(writer: &mut Writer, held: &HeldDeadLetters) {
    writer.u64(held.len() as u64);
    for (position, letter) in held.iter() {
        writer.u64(position);
        writer.u8(dead_letters::reason_code(letter.reason));
        writer.bytes(&letter.body);
    }
}

fn decode_held(reader: &mut Reader) -> Result<HeldDeadLetters, DecodeError> {
    let mut held = HeldDeadLetters::default();
    for _ in 0..count(reader, "held dead letter count")? {
        let position = reader.u64()?;
        let code = reader.u8()?;
        let reason =
            dead_letters::reason_from_code(code).ok_or(DecodeError::Invalid { field: "dead letter reason", value: code.into() })?;
        held.hold(position, reason, reader.bytes()?);
    }
    Ok(held)
}

/// `0` without a cache; else `1 | duplicates u64 | count u64 | (key, expiry)*` in insertion order.
fn encode_deduplication(writer: &mut Writer, cache: Option<&DeduplicationCache>) {
    let Some(cache) = cache else {
        writer.u8(0);
        return;
    };
    writer.u8(1);
    writer.u64(cache.duplicates());
    writer.u64(cache.len() as u64);
    for (key, expires_at_ms) in cache.entries_in_order() {
        writer.bytes(key);
        writer.optional_u64(expires_at_ms);
    }
}

fn decode_deduplication(reader: &mut Reader) -> Result<Option<Box<DeduplicationCache>>, DecodeError> {
    if !reader.bool("deduplication cache")? {
        return Ok(None);
    }
    let duplicates = reader.u64()?;
    let mut entries = Vec::new();
    for _ in 0..count(reader, "deduplication entry count")? {
        // Copied: the cache outlives the image's buffer.
        let key = Bytes::copy_from_slice(&reader.bytes()?);
        if key.is_empty() || key.len() > DEDUPLICATION_KEY_BYTES_MAX {
            return Err(DecodeError::Invalid { field: "deduplication key length", value: key.len() as u64 });
        }
        entries.push((key, reader.optional_u64("deduplication expiry")?));
    }
    Ok(Some(Box::new(DeduplicationCache::restored(entries, duplicates))))
}

/// `0` without a store; else `1 | count u64 | (id u64, due u64, origin u64, body)*` by id.
fn encode_delayed(writer: &mut Writer, delayed: Option<&DelayedEntries>) {
    let Some(delayed) = delayed else {
        writer.u8(0);
        return;
    };
    writer.u8(1);
    writer.u64(delayed.len() as u64);
    for (id, entry) in delayed.by_id() {
        writer.u64(id);
        writer.u64(entry.due_ms);
        writer.u64(entry.origin);
        writer.bytes(&entry.body);
    }
}

fn decode_delayed(reader: &mut Reader) -> Result<Option<Box<DelayedEntries>>, DecodeError> {
    if !reader.bool("delayed store")? {
        return Ok(None);
    }
    let mut delayed = DelayedEntries::default();
    for _ in 0..count(reader, "delayed entry count")? {
        let id = reader.u64()?;
        let entry = DelayedEntry { due_ms: reader.u64()?, origin: reader.u64()?, body: reader.bytes()? };
        delayed.hold(id, entry);
    }
    Ok(Some(Box::new(delayed)))
}

fn encode_queued(writer: &mut Writer, queued: &QueuedMessage<Body>) {
    writer.bytes(&queued.message.0);
    writer.u8(u8::from(queued.redelivered));
    writer.optional_u64(queued.expires_at_ms);
    writer.u8(u8::from(queued.logged));
    writer.u32(queued.delivery_count);
}

fn decode_queued(reader: &mut Reader) -> Result<QueuedMessage<Body>, DecodeError> {
    Ok(QueuedMessage {
        message: Body(reader.bytes()?),
        redelivered: reader.bool("redelivered")?,
        expires_at_ms: reader.optional_u64("expires at")?,
        logged: reader.bool("logged")?,
        delivery_count: reader.u32()?,
    })
}

fn encode_core(writer: &mut Writer, image: &CoreImage<Body>) {
    let messages = &image.messages;
    writer.u64(messages.next_position);
    writer.u64(messages.paged);
    writer.u64(messages.ready.len() as u64);
    for (position, queued) in &messages.ready {
        writer.u64(*position);
        encode_queued(writer, queued);
    }
    writer.u64(messages.unacked.len() as u64);
    for (position, queued, consumer) in &messages.unacked {
        writer.u64(*position);
        encode_queued(writer, queued);
        writer.optional_u64(*consumer);
    }
    writer.u64(image.consumers.len() as u64);
    for consumer in &image.consumers {
        writer.u64(consumer.id);
        writer.i64(consumer.priority);
        writer.u32(consumer.prefetch);
        writer.u8(u8::from(consumer.no_ack));
        writer.u32(consumer.unacked);
    }
    writer.u64(image.next_consumer as u64);
    writer.u8(u8::from(image.has_exclusive_consumer));
    writer.u8(u8::from(image.single_active_consumer));
    encode_limits(writer, &image.limits);
    let stats = image.stats;
    for total in [stats.published, stats.delivered, stats.acked, stats.requeued] {
        writer.u64(total);
    }
}

/// Counts read from disk bound the allocations they cause only by the input's length: each element
/// takes at least one byte, so a count above the bytes left is refused before allocating.
fn count(reader: &mut Reader, field: &'static str) -> Result<usize, DecodeError> {
    let value = reader.u64()?;
    if value > reader.remaining() as u64 {
        return Err(DecodeError::Invalid { field, value });
    }
    Ok(value as usize)
}

fn decode_core(reader: &mut Reader) -> Result<CoreImage<Body>, DecodeError> {
    let next_position = reader.u64()?;
    let paged = reader.u64()?;
    let mut ready = Vec::new();
    for _ in 0..count(reader, "ready count")? {
        ready.push((reader.u64()?, decode_queued(reader)?));
    }
    let mut unacked = Vec::new();
    for _ in 0..count(reader, "unacked count")? {
        unacked.push((reader.u64()?, decode_queued(reader)?, reader.optional_u64("holder")?));
    }
    let mut consumers = Vec::new();
    for _ in 0..count(reader, "consumer count")? {
        consumers.push(ConsumerImage {
            id: reader.u64()?,
            priority: reader.i64()?,
            prefetch: reader.u32()?,
            no_ack: reader.bool("no ack")?,
            unacked: reader.u32()?,
        });
    }
    let next_consumer = reader.u64()? as usize;
    let has_exclusive_consumer = reader.bool("exclusive")?;
    let single_active_consumer = reader.bool("single active consumer")?;
    let limits = decode_limits(reader)?;
    let stats = QueueStats { published: reader.u64()?, delivered: reader.u64()?, acked: reader.u64()?, requeued: reader.u64()? };
    let messages = MessagesImage { next_position, ready, unacked, paged };
    Ok(CoreImage { messages, consumers, next_consumer, has_exclusive_consumer, single_active_consumer, limits, stats })
}
