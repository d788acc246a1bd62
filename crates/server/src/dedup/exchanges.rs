//! The caches of deduplicating exchanges, by vhost and name: opened when an exchange is first
//! published to (so a restart reopens a durable one's log then), forgotten with their exchange.

use super::{persists, DedupCache};
use amqp_codec::ShortStr;
use broker_core::exchange::Exchange;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The caches of a broker's deduplicating exchanges.
#[derive(Debug)]
pub struct ExchangeCaches {
    /// Where persistent caches keep their logs: the data directory's `queues/`.
    queues_directory: PathBuf,
    segment_bytes_max: u64,
    journaled: bool,
    caches: Mutex<HashMap<(String, ShortStr), Arc<DedupCache>>>,
}

/// Where the cache of exchange `name` in `vhost` keeps its log (hex, as queue logs are named, after
/// a prefix that no queue's name can start with).
fn directory_name(vhost: &str, name: &ShortStr) -> String {
    let mut key: Vec<u8> = vhost.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(name.as_bytes());
    let hex: String = key.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("dedup-exchange-{hex}")
}

impl ExchangeCaches {
    /// No caches yet; persistent ones go under `queues_directory`.
    pub fn new(queues_directory: PathBuf, segment_bytes_max: u64, journaled: bool) -> ExchangeCaches {
        ExchangeCaches { queues_directory, segment_bytes_max, journaled, caches: Mutex::new(HashMap::new()) }
    }

    /// The cache of `exchange` in `vhost` (which deduplicates), opened on first use. `None` when
    /// its log cannot be opened: the exchange then routes without deduplicating, and says so.
    pub fn cache(&self, vhost: &str, exchange: &Exchange, syncer: &storage::syncer::Syncer) -> Option<Arc<DedupCache>> {
        let settings = exchange.deduplication.as_ref()?;
        let key = (vhost.to_string(), exchange.name.clone());
        let mut caches = self.caches.lock();
        if let Some(cache) = caches.get(&key) {
            return Some(cache.clone());
        }
        let cache = if persists(settings, exchange.durable) {
            let directory = self.queues_directory.join(directory_name(vhost, &exchange.name));
            match DedupCache::open(settings.clone(), &directory, self.segment_bytes_max, self.journaled) {
                Ok(cache) => {
                    if let Some(log) = cache.log() {
                        syncer.watch(log.clone());
                    }
                    cache
                }
                Err(error) => {
                    tracing::error!(%error, exchange = %exchange.name, "opening a deduplication cache failed; the exchange does not deduplicate");
                    return None;
                }
            }
        } else {
            DedupCache::in_memory(settings.clone())
        };
        let cache = Arc::new(cache);
        caches.insert(key, cache.clone());
        Some(cache)
    }

    /// Forgets the cache of exchange `name` in `vhost` and deletes its files (the exchange was
    /// deleted, or is declared anew and starts with an empty cache).
    pub fn forget(&self, vhost: &str, name: &ShortStr) {
        let removed = self.caches.lock().remove(&(vhost.to_string(), name.clone()));
        match removed {
            Some(cache) => cache.remove_files(),
            None => {
                let _ = std::fs::remove_dir_all(self.queues_directory.join(directory_name(vhost, name)));
            }
        }
    }

    /// Every open cache's log, for flushing at shutdown.
    pub fn logs(&self) -> Vec<storage::syncer::SharedLog> {
        self.caches.lock().values().filter_map(|cache| cache.log().cloned()).collect()
    }
}
