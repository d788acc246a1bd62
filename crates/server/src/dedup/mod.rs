//! Deduplication caches (beyond RabbitMQ; the rules and argument names are in
//! `broker_core::exchange::deduplication`): one per deduplicating exchange or queue.
//!
//! A cache maps a message's key (its deduplication header's value, encoded as the AMQP field it
//! is; a key longer than [`KEY_BYTES_MAX`] is kept as its SHA-256) to when the entry stops
//! counting. Bound and eviction: at most `x-cache-size` entries; a full cache evicts the oldest
//! *inserted* entry first (insertion order, as LavinMQ's cache; a hit does not refresh an entry),
//! and an expired entry is dropped when a lookup meets it or eviction reaches it.
//!
//! Persistence: with `x-cache-persistence: disk`, and by default for a durable exchange or queue
//! (the plugin's default is memory; a cache that forgets at a restart lets through exactly the
//! retries a restart provokes), every entry is a record in a queue log of its own (group commit,
//! recycling, recovery, the node journal), settled when the entry goes. The publish that inserted
//! an entry is confirmed once that record is synced too, so a confirmed message's key survives a
//! crash. A restart rebuilds the cache from the live records, in insertion order.

use amqp_codec::{BasicProperties, ContentHeader, FieldTable, FieldValue, ShortStr};
use broker_core::exchange::deduplication::{DeduplicationSettings, Persistence, CACHE_TTL_ARGUMENT};
use broker_core::Message;
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use storage::queue_log::QueueLog;
use storage::syncer::SharedLog;
use storage::StorageError;

mod exchanges;
pub use exchanges::ExchangeCaches;

/// Keys up to this many bytes are kept as they are; longer ones as their SHA-256, so a cache's
/// memory is bounded by its size whatever the headers hold.
pub const KEY_BYTES_MAX: usize = 32;

/// Records a restart reads at a time while it rebuilds a cache.
const RECOVERY_BATCH_RECORDS_MAX: usize = 4096;

/// What a cache said about a message.
#[derive(Debug)]
pub enum Verdict {
    /// It has no key: not deduplicated.
    NoKey,
    /// Its key is in the cache: drop it.
    Duplicate,
    /// Its key was not in the cache and now is; with a log, the confirm waits for this log too.
    Recorded(Option<SharedLog>),
}

type Key = Box<[u8]>;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Its record's position in the log (its insertion number without one).
    position: u64,
    expires_at_ms: Option<u64>,
}

#[derive(Debug, Default)]
struct CacheState {
    entries: HashMap<Key, Entry>,
    /// Keys in insertion order, with the position they were inserted under (an entry replaced
    /// since leaves a stale pair, skipped when reached, compacted past twice the size).
    order: VecDeque<(u64, Key)>,
    next_position: u64,
    duplicates: u64,
}

/// One exchange's or queue's deduplication cache.
#[derive(Debug)]
pub struct DedupCache {
    settings: DeduplicationSettings,
    state: Mutex<CacheState>,
    log: Option<SharedLog>,
    directory: Option<PathBuf>,
}

/// Whether a cache of an owner `durable` or not keeps its entries on disk.
pub fn persists(settings: &DeduplicationSettings, durable: bool) -> bool {
    match settings.persistence {
        Some(Persistence::Disk) => true,
        Some(Persistence::Memory) => false,
        None => durable,
    }
}

impl DedupCache {
    /// A cache in memory only.
    pub fn in_memory(settings: DeduplicationSettings) -> DedupCache {
        DedupCache { settings, state: Mutex::new(CacheState::default()), log: None, directory: None }
    }

    /// A cache kept in the log at `directory` (created if missing), rebuilt from what it holds.
    pub fn open(
        settings: DeduplicationSettings,
        directory: &Path,
        segment_bytes_max: u64,
        journaled: bool,
    ) -> Result<DedupCache, StorageError> {
        let (mut log, recovery) = QueueLog::open(directory, segment_bytes_max)?;
        if journaled {
            log.use_journal();
        }
        let mut state = CacheState { next_position: recovery.next_position, ..CacheState::default() };
        let now_ms = crate::queue_runtime::now_ms();
        if recovery.live_count > 0 {
            let mut cursor = log.recovered_tail(&recovery);
            loop {
                let batch = log.read_tail(&mut cursor, RECOVERY_BATCH_RECORDS_MAX, usize::MAX)?;
                if batch.is_empty() {
                    break;
                }
                for (position, record) in batch {
                    match decode_record(&record.body) {
                        Some((key, expires_at_ms)) if expires_at_ms.is_none_or(|at| at > now_ms) => {
                            state.order.push_back((position, key.clone()));
                            state.entries.insert(key, Entry { position, expires_at_ms });
                        }
                        _ => log.append_settled(position),
                    }
                }
            }
        }
        let log: SharedLog = Arc::new(Mutex::new(log));
        let cache = DedupCache { settings, state: Mutex::new(state), log: Some(log), directory: Some(directory.to_path_buf()) };
        // A cache declared smaller than what it held cannot be: the size is fixed at declaration.
        cache.evict_to_size();
        Ok(cache)
    }

    /// The log its entries go to, when it persists.
    pub fn log(&self) -> Option<&SharedLog> {
        self.log.as_ref()
    }

    /// How many duplicates it dropped since it was made (or the broker started).
    #[cfg(test)]
    pub fn duplicates(&self) -> u64 {
        self.state.lock().duplicates
    }

    /// Entries it holds now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.state.lock().entries.len()
    }

    /// Looks `message` up at `now_ms` and records its key when it is new, in one step (an
    /// exchange: the message is routed or not on this answer alone).
    pub fn check(&self, message: &Message, now_ms: u64) -> Verdict {
        let Some(key) = self.key_of(message) else {
            return Verdict::NoKey;
        };
        let mut state = self.state.lock();
        if self.contains_locked(&mut state, &key, now_ms) {
            return Verdict::Duplicate;
        }
        self.insert(&mut state, key, now_ms);
        Verdict::Recorded(self.log.clone())
    }

    /// Whether `key` is in the cache at `now_ms` (counted as a duplicate when it is). A queue asks
    /// this under its own lock, then [`DedupCache::record`]s the key once the message is enqueued.
    pub fn contains(&self, key: &CacheKey, now_ms: u64) -> bool {
        self.contains_locked(&mut self.state.lock(), key, now_ms)
    }

    /// Records `key` at `now_ms`; the log the confirm must wait for, when the cache persists.
    pub fn record(&self, key: CacheKey, now_ms: u64) -> Option<SharedLog> {
        self.insert(&mut self.state.lock(), key, now_ms);
        self.log.clone()
    }

    fn contains_locked(&self, state: &mut CacheState, key: &CacheKey, now_ms: u64) -> bool {
        let Some(entry) = state.entries.get(&key.key).copied() else {
            return false;
        };
        if entry.expires_at_ms.is_none_or(|at| at > now_ms) {
            state.duplicates += 1;
            return true;
        }
        state.entries.remove(&key.key);
        self.settle(entry.position);
        false
    }

    /// Deletes its files (its owner was deleted).
    pub fn remove_files(&self) {
        if let Some(log) = &self.log {
            if let Err(error) = log.lock().delete() {
                tracing::error!(%error, "deleting a deduplication cache's log failed");
            }
        }
        if let Some(directory) = &self.directory {
            let _ = std::fs::remove_dir_all(directory);
        }
    }

    fn insert(&self, state: &mut CacheState, key: CacheKey, now_ms: u64) {
        let CacheKey { key, ttl_ms } = key;
        let expires_at_ms = ttl_ms.map(|ttl| now_ms.saturating_add(ttl));
        if let Some(replaced) = state.entries.remove(&key) {
            self.settle(replaced.position);
        }
        while state.entries.len() as u64 >= self.settings.cache_size && self.evict_oldest(state) {}
        let position = state.next_position;
        state.next_position += 1;
        if let Some(log) = &self.log {
            log.lock().append_publish(position, &record(&key, expires_at_ms), true, None);
        }
        state.order.push_back((position, key.clone()));
        state.entries.insert(key, Entry { position, expires_at_ms });
        if state.order.len() > 2 * state.entries.len() + 1024 {
            // Pairs of entries replaced since: drop them, so the order stays within the size.
            let CacheState { order, entries, .. } = state;
            order.retain(|(position, key)| entries.get(key).is_some_and(|entry| entry.position == *position));
        }
    }

    /// Evicts the oldest inserted entry still there; false when there is none.
    fn evict_oldest(&self, state: &mut CacheState) -> bool {
        while let Some((position, key)) = state.order.pop_front() {
            if state.entries.get(&key).is_some_and(|entry| entry.position == position) {
                state.entries.remove(&key);
                self.settle(position);
                return true;
            }
        }
        false
    }

    fn evict_to_size(&self) {
        let mut state = self.state.lock();
        while state.entries.len() as u64 > self.settings.cache_size && self.evict_oldest(&mut state) {}
    }

    fn settle(&self, position: u64) {
        if let Some(log) = &self.log {
            log.lock().append_settled(position);
        }
    }

    /// The message's key and its own `x-cache-ttl` (else the cache's), when it has a key.
    pub fn key_of(&self, message: &Message) -> Option<CacheKey> {
        key_of(&self.settings, message)
    }
}

/// A message's key under `settings` and its own `x-cache-ttl` (else the cache's), when it has a
/// key (a quorum queue's replicated cache takes the same keys as this one).
pub fn key_of(settings: &DeduplicationSettings, message: &Message) -> Option<CacheKey> {
    let headers = message.header.properties().ok()?.headers?;
    let value = headers.get(&settings.header)?;
    let ttl_ms = match headers.get(CACHE_TTL_ARGUMENT).and_then(FieldValue::as_i64) {
        Some(ttl) if ttl > 0 => Some(ttl as u64),
        _ => settings.cache_ttl_ms,
    };
    Some(CacheKey { key: encode_key(value), ttl_ms })
}

/// A message's key in a cache, with how long its entry counts.
#[derive(Debug, Clone)]
pub struct CacheKey {
    key: Key,
    ttl_ms: Option<u64>,
}

impl CacheKey {
    /// The key as a quorum queue's enqueue carries it (at most [`KEY_BYTES_MAX`] bytes).
    pub fn into_replicated(self, cache_size: u64) -> replication::command::DeduplicationKey {
        replication::command::DeduplicationKey { key: Bytes::from(self.key), ttl_ms: self.ttl_ms, cache_size }
    }
}

/// A header value as a key: its AMQP encoding (so `1` and `"1"` differ), or its SHA-256 when long.
fn encode_key(value: &FieldValue) -> Key {
    let mut table = FieldTable::new();
    table.insert("k", value.clone());
    let mut encoded = BytesMut::new();
    amqp_codec::write_table(&mut encoded, &table);
    // The table's length and the one-letter name are the same for every key: skip them.
    let encoded = encoded.get(4 + 2..).unwrap_or(&[]).to_vec();
    if encoded.len() <= KEY_BYTES_MAX {
        return encoded.into_boxed_slice();
    }
    Sha256::digest(&encoded).to_vec().into_boxed_slice()
}

/// A cache entry as a log record: a message whose body is `expires_at_ms u64 (0: never) | key`.
fn record(key: &[u8], expires_at_ms: Option<u64>) -> Message {
    let mut body = BytesMut::with_capacity(8 + key.len());
    body.put_u64(expires_at_ms.unwrap_or(0));
    body.put_slice(key);
    let body: Bytes = body.freeze();
    Message {
        exchange: ShortStr::from(""),
        routing_key: ShortStr::from(""),
        header: ContentHeader::from_properties(60, body.len() as u64, &BasicProperties::default()),
        body,
        published_at_ns: 0,
        bcc_routing_keys: None,
    }
}

fn decode_record(body: &[u8]) -> Option<(Key, Option<u64>)> {
    let expires_at_ms = u64::from_be_bytes(body.get(..8)?.try_into().ok()?);
    let key = body.get(8..).filter(|key| !key.is_empty() && key.len() <= KEY_BYTES_MAX.max(32))?;
    Some((key.to_vec().into_boxed_slice(), (expires_at_ms != 0).then_some(expires_at_ms)))
}

#[cfg(test)]
mod tests;
