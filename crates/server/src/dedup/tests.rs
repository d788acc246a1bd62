//! A deduplication cache on its own: duplicates within the time to live, the oldest inserted
//! entry evicted when full, a message's own `x-cache-ttl`, the header LavinMQ lets one name, keys
//! of different types, and entries that survive a reopen of a persistent cache.

use super::*;
use broker_core::exchange::deduplication::DEFAULT_HEADER;

fn settings(cache_size: u64, cache_ttl_ms: Option<u64>) -> DeduplicationSettings {
    DeduplicationSettings { cache_size, cache_ttl_ms, persistence: None, header: DEFAULT_HEADER.to_string() }
}

fn message_with(headers: &[(&str, FieldValue)]) -> Message {
    let mut table = FieldTable::new();
    for (key, value) in headers {
        table.insert(key, value.clone());
    }
    let properties = BasicProperties { headers: Some(table), delivery_mode: Some(2), ..Default::default() };
    Message {
        exchange: ShortStr::from("x"),
        routing_key: ShortStr::from("k"),
        header: ContentHeader::from_properties(60, 1, &properties),
        body: Bytes::from_static(b"m"),
        published_at_ns: 0,
        bcc_routing_keys: None,
    }
}

fn keyed(key: &str) -> Message {
    message_with(&[(DEFAULT_HEADER, FieldValue::LongStr(Bytes::copy_from_slice(key.as_bytes())))])
}

fn is_duplicate(cache: &DedupCache, message: &Message, now_ms: u64) -> bool {
    matches!(cache.check(message, now_ms), Verdict::Duplicate)
}

#[test]
fn a_key_is_a_duplicate_until_its_ttl_passes() {
    let cache = DedupCache::in_memory(settings(10, Some(100)));
    assert!(!is_duplicate(&cache, &keyed("a"), 1000));
    assert!(is_duplicate(&cache, &keyed("a"), 1099));
    assert!(!is_duplicate(&cache, &keyed("a"), 1100), "expired: routed again, and recorded anew");
    assert!(is_duplicate(&cache, &keyed("a"), 1150));
    assert!(matches!(cache.check(&message_with(&[]), 1150), Verdict::NoKey));
    assert_eq!(cache.duplicates(), 2);
    // A message's own x-cache-ttl wins over the cache's.
    let short = message_with(&[(DEFAULT_HEADER, FieldValue::LongStr(Bytes::from("b"))), ("x-cache-ttl", FieldValue::I32(10))]);
    assert!(!is_duplicate(&cache, &short, 2000));
    assert!(!is_duplicate(&cache, &keyed("b"), 2010));
}

#[test]
fn a_full_cache_evicts_the_oldest_inserted_entry() {
    let cache = DedupCache::in_memory(settings(3, None));
    for key in ["a", "b", "c"] {
        assert!(!is_duplicate(&cache, &keyed(key), 0));
    }
    // A hit does not refresh: "a" is still the oldest.
    assert!(is_duplicate(&cache, &keyed("a"), 0));
    assert!(!is_duplicate(&cache, &keyed("d"), 0));
    assert_eq!(cache.len(), 3);
    assert!(!is_duplicate(&cache, &keyed("a"), 0), "the oldest was evicted");
    assert!(is_duplicate(&cache, &keyed("c"), 0));
    assert!(!is_duplicate(&cache, &keyed("b"), 0), "evicted when a came back");
}

#[test]
fn keys_are_typed_and_long_ones_hashed_and_the_header_can_be_named() {
    let cache = DedupCache::in_memory(settings(10, None));
    assert!(!is_duplicate(&cache, &message_with(&[(DEFAULT_HEADER, FieldValue::I32(1))]), 0));
    assert!(!is_duplicate(&cache, &message_with(&[(DEFAULT_HEADER, FieldValue::LongStr(Bytes::from("1")))]), 0), "1 and \"1\" differ");
    let long = "k".repeat(1000);
    assert!(!is_duplicate(&cache, &keyed(&long), 0));
    assert!(is_duplicate(&cache, &keyed(&long), 0));
    assert!(!is_duplicate(&cache, &keyed(&format!("{long}!")), 0));
    let named = DedupCache::in_memory(DeduplicationSettings { header: "order-id".to_string(), ..settings(10, None) });
    assert!(matches!(named.check(&keyed("a"), 0), Verdict::NoKey));
    let order = message_with(&[("order-id", FieldValue::I64(7))]);
    assert!(!is_duplicate(&named, &order, 0));
    assert!(is_duplicate(&named, &order, 0));
}

#[test]
fn a_persistent_cache_keeps_its_entries_and_their_order_across_a_reopen() {
    let directory = std::env::temp_dir().join(format!("lepus-dedup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    {
        let cache = DedupCache::open(settings(3, None), &directory, 1 << 20, false).expect("open");
        for key in ["a", "b", "c", "d"] {
            assert!(matches!(cache.check(&keyed(key), 0), Verdict::Recorded(Some(_))));
        }
        let log = cache.log().expect("a log").clone();
        log.lock().write_pending(storage::queue_log::SyncDue::Now).expect("write");
    }
    // The evicted entry's record was settled: the log holds the three entries left.
    let (_, recovery) = QueueLog::open(&directory, 1 << 20).expect("the log alone");
    assert_eq!(recovery.live_count, 3, "the evicted entry's record was not settled");
    let cache = DedupCache::open(settings(3, None), &directory, 1 << 20, false).expect("reopen");
    assert_eq!(cache.len(), 3, "a was evicted");
    assert!(is_duplicate(&cache, &keyed("b"), 0));
    assert!(is_duplicate(&cache, &keyed("d"), 0));
    assert!(!is_duplicate(&cache, &keyed("e"), 0));
    assert!(!is_duplicate(&cache, &keyed("b"), 0), "b, the oldest recovered, was evicted by e");
    cache.remove_files();
    assert!(!directory.exists());
}
