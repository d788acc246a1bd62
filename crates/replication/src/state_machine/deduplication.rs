//! Message deduplication on quorum queues (a Lepus extension, as LavinMQ's; classic queues keep
//! theirs beside their log, `server::dedup`): a queue declared with `x-message-deduplication` keeps
//! the keys it enqueued in its replicated state, so every replica holds the same cache, a new
//! leader deduplicates exactly as the old one did, and a snapshot carries it.
//!
//! The rules are the classic cache's: at most `x-cache-size` entries, the oldest *inserted* entry
//! evicted first (a hit does not refresh it), an entry stops counting at its expiry (the batch's
//! `now_ms` plus the key's time to live) and is dropped when a lookup meets it or eviction reaches
//! it. Every decision reads only the commands applied and their batch times: replicas agree.

use crate::command::DeduplicationKey;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};

/// One key's entry: when it was inserted (its place in the order) and when it stops counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CacheEntry {
    insertion: u64,
    expires_at_ms: Option<u64>,
}

/// A quorum queue's deduplication cache.
#[derive(Debug, Clone, Default)]
pub struct DeduplicationCache {
    entries: HashMap<Bytes, CacheEntry>,
    /// Keys in insertion order with their insertion number (a key inserted again since leaves a
    /// stale pair, skipped when reached and compacted away past twice the entries).
    order: VecDeque<(u64, Bytes)>,
    next_insertion: u64,
    /// Messages it kept out since the queue was declared.
    duplicates: u64,
}

/// Stale pairs tolerated in the order beyond twice the entries before it is compacted.
const STALE_ORDER_SLACK: usize = 1024;

impl DeduplicationCache {
    /// Whether `key` is in the cache at `now_ms` (counted as a duplicate when it is); an expired
    /// entry met here is dropped.
    pub(crate) fn is_duplicate(&mut self, key: &Bytes, now_ms: u64) -> bool {
        let Some(entry) = self.entries.get(key).copied() else {
            return false;
        };
        if entry.expires_at_ms.is_none_or(|at| at > now_ms) {
            self.duplicates += 1;
            return true;
        }
        self.entries.remove(key);
        false
    }

    /// Records a key whose message was enqueued at `now_ms`, evicting the oldest entries to stay
    /// within the key's cache size.
    pub(crate) fn record(&mut self, key: &DeduplicationKey, now_ms: u64) {
        let expires_at_ms = key.ttl_ms.map(|ttl| now_ms.saturating_add(ttl));
        self.entries.remove(&key.key);
        while self.entries.len() as u64 >= key.cache_size && self.evict_oldest() {}
        self.insert(key.key.clone(), expires_at_ms);
    }

    fn insert(&mut self, key: Bytes, expires_at_ms: Option<u64>) {
        let insertion = self.next_insertion;
        self.next_insertion += 1;
        self.order.push_back((insertion, key.clone()));
        self.entries.insert(key, CacheEntry { insertion, expires_at_ms });
        if self.order.len() > 2 * self.entries.len() + STALE_ORDER_SLACK {
            let DeduplicationCache { order, entries, .. } = self;
            order.retain(|(insertion, key)| entries.get(key).is_some_and(|entry| entry.insertion == *insertion));
        }
    }

    /// Evicts the oldest inserted entry still here; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((insertion, key)) = self.order.pop_front() {
            if self.entries.get(&key).is_some_and(|entry| entry.insertion == insertion) {
                self.entries.remove(&key);
                return true;
            }
        }
        false
    }

    /// How many entries it holds (expired ones not met yet included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many messages it kept out.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Its entries in insertion order, with their expiry (what a snapshot keeps).
    pub(crate) fn entries_in_order(&self) -> impl Iterator<Item = (&Bytes, Option<u64>)> + '_ {
        self.order.iter().filter_map(|(insertion, key)| {
            let entry = self.entries.get(key).filter(|entry| entry.insertion == *insertion)?;
            Some((key, entry.expires_at_ms))
        })
    }

    /// A cache from a snapshot's entries, in insertion order.
    pub(crate) fn restored(entries: Vec<(Bytes, Option<u64>)>, duplicates: u64) -> DeduplicationCache {
        let mut cache = DeduplicationCache { duplicates, ..DeduplicationCache::default() };
        for (key, expires_at_ms) in entries {
            cache.entries.remove(&key);
            cache.insert(key, expires_at_ms);
        }
        cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &'static str, ttl_ms: Option<u64>, cache_size: u64) -> DeduplicationKey {
        DeduplicationKey { key: Bytes::from_static(name.as_bytes()), ttl_ms, cache_size }
    }

    #[test]
    fn a_key_counts_until_its_expiry_and_a_full_cache_evicts_the_oldest_inserted() {
        let mut cache = DeduplicationCache::default();
        cache.record(&key("a", Some(100), 2), 1_000);
        assert!(cache.is_duplicate(&Bytes::from_static(b"a"), 1_099));
        assert!(!cache.is_duplicate(&Bytes::from_static(b"a"), 1_100), "an entry counts until its expiry, not at it");
        assert!(cache.is_empty(), "an expired entry met by a lookup is dropped");
        for name in ["a", "b", "c"] {
            cache.record(&key(name, None, 2), 2_000);
        }
        assert_eq!(cache.len(), 2);
        assert!(!cache.is_duplicate(&Bytes::from_static(b"a"), 2_000), "the oldest inserted was evicted");
        assert!(cache.is_duplicate(&Bytes::from_static(b"b"), 2_000));
        assert!(cache.is_duplicate(&Bytes::from_static(b"c"), 2_000));
        assert_eq!(cache.duplicates(), 3);
    }

    #[test]
    fn a_restored_cache_keeps_the_order_and_evicts_as_the_original() {
        let mut original = DeduplicationCache::default();
        for name in ["a", "b", "a", "c"] {
            original.record(&key(name, Some(5_000), 3), 10);
        }
        let entries: Vec<_> = original.entries_in_order().map(|(key, expires)| (key.clone(), expires)).collect();
        assert_eq!(entries.iter().map(|(key, _)| key.as_ref()).collect::<Vec<_>>(), [b"b".as_ref(), b"a", b"c"]);
        let mut restored = DeduplicationCache::restored(entries, original.duplicates());
        for cache in [&mut original, &mut restored] {
            cache.record(&key("d", None, 3), 20);
            let left: Vec<_> = cache.entries_in_order().map(|(key, _)| key.clone()).collect();
            assert_eq!(left, [Bytes::from_static(b"a"), Bytes::from_static(b"c"), Bytes::from_static(b"d")]);
        }
    }

    #[test]
    fn re_inserting_one_key_keeps_the_order_bounded() {
        let mut cache = DeduplicationCache::default();
        for round in 0..100_000u64 {
            cache.record(&key("same", Some(1), 10), round * 10);
        }
        assert_eq!(cache.len(), 1);
        assert!(cache.order.len() <= 2 + STALE_ORDER_SLACK + 1, "stale pairs were compacted: {}", cache.order.len());
    }
}
