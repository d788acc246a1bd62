//! The streams the stream protocol serves: name to store, with the arguments each was created
//! with, kept on disk beside the store's directories so they come back after a restart.
//!
//! This is the stream protocol's own registry until stream queues sit behind the queue-type seam
//! (`Queue::Stream`): then a stream created over port 5552 is a stream queue of the vhost's
//! topology, which AMQP 0-9-1 sees too, and this module becomes a lookup into it. Until then a
//! stream made here is not visible over AMQP 0-9-1 (docs/streams.md says so).

use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use storage::file_cache::FileCache;
use storage::stream::{Retention, Stream, StreamSettings};
use stream_codec::TextMap;
use tokio::sync::Notify;

/// The file listing the streams (vhost, name, arguments), one JSON document, replaced whole.
const REGISTRY_FILE: &str = "stream-protocol-streams.json";
/// The most streams the registry holds (every one keeps its newest segment's files open through
/// the node's file cache).
pub const STREAMS_MAX: usize = 10_000;

/// One stream and what its subscribers wait on.
pub struct StreamEntry {
    /// The store.
    pub stream: Arc<Stream>,
    /// The arguments it was created with, as the client sent them (sorted by key).
    pub arguments: BTreeMap<String, String>,
    /// Connections waiting for chunks committed after what they have read: woken by the store's
    /// commit listener (on the syncer's thread: it only wakes).
    waiters: Mutex<Vec<Weak<Notify>>>,
    /// Set once the stream is deleted: its subscribers and publishers are told and dropped.
    deleted: std::sync::atomic::AtomicBool,
}

impl StreamEntry {
    /// Wakes `notify` whenever chunks are committed, until it is dropped.
    pub fn watch(&self, notify: &Arc<Notify>) {
        let mut waiters = self.waiters.lock();
        waiters.retain(|waiter| waiter.strong_count() > 0);
        waiters.push(Arc::downgrade(notify));
    }

    /// Whether the stream was deleted.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(std::sync::atomic::Ordering::Acquire)
    }

    fn wake_all(&self) {
        for waiter in self.waiters.lock().iter() {
            if let Some(notify) = waiter.upgrade() {
                notify.notify_one();
            }
        }
    }
}

/// Why a create refused.
#[derive(Debug, PartialEq, Eq)]
pub enum CreateRefusal {
    /// Exists with the same arguments (STREAM_ALREADY_EXISTS).
    AlreadyExists,
    /// Exists with other arguments, or an argument is not valid (PRECONDITION_FAILED).
    Precondition(String),
    /// The store could not create it (INTERNAL_ERROR).
    Internal(String),
}

/// The streams, by vhost and name.
pub struct StreamRegistry {
    data_dir: PathBuf,
    cache: Arc<FileCache>,
    streams: RwLock<BTreeMap<(String, String), Arc<StreamEntry>>>,
    /// Serialises writes of the registry file, so the newest list is the one on disk.
    file_write: Mutex<()>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Listed {
    vhost: String,
    name: String,
    arguments: BTreeMap<String, String>,
}

/// Where a stream's store lives: `DATA_DIR/streams/<hex of vhost>-<hex of name>`.
pub fn stream_directory(data_dir: &Path, vhost: &str, name: &str) -> PathBuf {
    let hex = |text: &str| text.bytes().map(|byte| format!("{byte:02x}")).collect::<String>();
    data_dir.join("streams").join(format!("{}-{}", hex(vhost), hex(name)))
}

impl StreamRegistry {
    /// Opens every stream the registry file lists; one that cannot be opened is logged and left
    /// out (its files stay for an operator to look at).
    pub fn recover(data_dir: &Path) -> StreamRegistry {
        let registry = StreamRegistry {
            data_dir: data_dir.to_path_buf(),
            cache: FileCache::node().clone(),
            streams: RwLock::new(BTreeMap::new()),
            file_write: Mutex::new(()),
        };
        let listed: Vec<Listed> = match std::fs::read(data_dir.join(REGISTRY_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
                tracing::error!(%error, file = REGISTRY_FILE, "the stream registry does not parse: no stream recovered");
                Vec::new()
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(error) => {
                tracing::error!(%error, file = REGISTRY_FILE, "the stream registry cannot be read: no stream recovered");
                Vec::new()
            }
        };
        for Listed { vhost, name, arguments } in listed {
            let settings = settings_of(&arguments).unwrap_or_default();
            match Stream::open(&stream_directory(data_dir, &vhost, &name), settings, registry.cache.clone()) {
                Ok((stream, recovery)) => {
                    tracing::info!(vhost, stream = name, ?recovery, "stream recovered");
                    registry.insert(vhost, name, stream, arguments);
                }
                Err(error) => tracing::error!(vhost, stream = name, %error, "stream not recovered"),
            }
        }
        registry
    }

    fn insert(&self, vhost: String, name: String, stream: Arc<Stream>, arguments: BTreeMap<String, String>) -> Arc<StreamEntry> {
        let entry = Arc::new(StreamEntry {
            stream,
            arguments,
            waiters: Mutex::new(Vec::new()),
            deleted: std::sync::atomic::AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&entry);
        entry.stream.set_commit_listener(Arc::new(move |_next_offset| {
            if let Some(entry) = weak.upgrade() {
                entry.wake_all();
            }
        }));
        self.streams.write().insert((vhost, name), entry.clone());
        entry
    }

    /// The stream `name` of `vhost`.
    pub fn get(&self, vhost: &str, name: &str) -> Option<Arc<StreamEntry>> {
        self.streams.read().get(&(vhost.to_string(), name.to_string())).cloned()
    }

    /// Creates a stream with the client's arguments.
    pub fn create(&self, vhost: &str, name: &str, arguments: &TextMap) -> Result<Arc<StreamEntry>, CreateRefusal> {
        let arguments: BTreeMap<String, String> = arguments
            .iter()
            .map(|(key, value)| (key.to_string_lossy(), value.to_string_lossy()))
            .filter(|(key, _)| KNOWN_ARGUMENTS.contains(&key.as_str()))
            .collect();
        let settings = settings_of(&arguments).map_err(CreateRefusal::Precondition)?;
        let key = (vhost.to_string(), name.to_string());
        let streams = self.streams.write();
        if let Some(existing) = streams.get(&key) {
            return Err(if existing.arguments == arguments {
                CreateRefusal::AlreadyExists
            } else {
                CreateRefusal::Precondition(format!("stream '{name}' exists with other arguments"))
            });
        }
        if streams.len() >= STREAMS_MAX {
            return Err(CreateRefusal::Internal(format!("the node holds {STREAMS_MAX} streams already")));
        }
        let directory = stream_directory(&self.data_dir, vhost, name);
        // A directory left by a stream deleted before a crash is not this stream's history.
        let _ = std::fs::remove_dir_all(&directory);
        let stream =
            Stream::create(&directory, settings, self.cache.clone()).map_err(|error| CreateRefusal::Internal(error.to_string()))?;
        drop(streams);
        let entry = self.insert(key.0, key.1, stream, arguments);
        self.write_file().map_err(CreateRefusal::Internal)?;
        Ok(entry)
    }

    /// Deletes a stream: its subscribers are woken to find it gone. `false` when it does not exist.
    pub fn delete(&self, vhost: &str, name: &str) -> Result<bool, String> {
        let Some(entry) = self.streams.write().remove(&(vhost.to_string(), name.to_string())) else {
            return Ok(false);
        };
        entry.deleted.store(true, std::sync::atomic::Ordering::Release);
        entry.wake_all();
        self.write_file()?;
        entry.stream.delete().map_err(|error| error.to_string())?;
        Ok(true)
    }

    fn write_file(&self) -> Result<(), String> {
        let _writing = self.file_write.lock();
        let listed: Vec<Listed> = self
            .streams
            .read()
            .iter()
            .map(|((vhost, name), entry)| Listed { vhost: vhost.clone(), name: name.clone(), arguments: entry.arguments.clone() })
            .collect();
        let bytes = serde_json::to_vec_pretty(&listed).map_err(|error| error.to_string())?;
        let path = self.data_dir.join(REGISTRY_FILE);
        let temporary = path.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(&bytes)?;
            file.sync_data()?;
            std::fs::rename(&temporary, &path)?;
            std::fs::File::open(&self.data_dir)?.sync_all()
        };
        write().map_err(|error| format!("{}: {error}", path.display()))
    }
}

/// The keys RabbitMQ's stream plugin turns into queue arguments; it ignores any other key, and so
/// does Lepus (they are neither kept nor compared when the stream is declared again).
pub const KNOWN_ARGUMENTS: [&str; 5] =
    ["max-length-bytes", "max-age", "stream-max-segment-size-bytes", "queue-leader-locator", "initial-cluster-size"];

/// The store settings of a stream's arguments, as RabbitMQ's stream plugin takes them
/// (`max-length-bytes`, `max-age`, `stream-max-segment-size-bytes`, and the cluster arguments a
/// single node accepts and ignores). A value that does not parse is refused: RabbitMQ 3.10.8
/// drops the connection on one (its reader crashes); Lepus answers PRECONDITION_FAILED, as later
/// RabbitMQ versions do.
pub fn settings_of(arguments: &BTreeMap<String, String>) -> Result<StreamSettings, String> {
    let mut settings = StreamSettings::default();
    let mut retention = Retention::default();
    for (key, value) in arguments {
        let number = || value.parse::<u64>().map_err(|_| format!("{key}: '{value}' is not a number of bytes"));
        match key.as_str() {
            "max-length-bytes" => retention.max_bytes = Some(number()?),
            "stream-max-segment-size-bytes" => settings.segment_bytes_max = number()?,
            "max-age" => retention.max_age_ms = Some(parse_age_ms(value).ok_or_else(|| format!("max-age: '{value}' is not an age"))?),
            "initial-cluster-size" if value.parse::<u64>().map_or(true, |size| size == 0) => {
                return Err(format!("initial-cluster-size: '{value}' is not a positive number"))
            }
            _ => {}
        }
    }
    settings.retention = retention;
    Ok(settings.bounded())
}

/// An age as RabbitMQ writes them: a number and a unit, `Y M D h m s` (`7D`, `1h`, `30s`).
pub fn parse_age_ms(text: &str) -> Option<u64> {
    let unit_at = text.find(|character: char| !character.is_ascii_digit())?;
    let (number, unit) = text.split_at(unit_at);
    let number: u64 = number.parse().ok()?;
    let unit_ms: u64 = match unit {
        "Y" => 365 * 24 * 3_600_000,
        "M" => 30 * 24 * 3_600_000,
        "D" => 24 * 3_600_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1_000,
        _ => return None,
    };
    number.checked_mul(unit_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_arguments() {
        assert_eq!(parse_age_ms("1h"), Some(3_600_000));
        assert_eq!(parse_age_ms("7D"), Some(7 * 86_400_000));
        assert_eq!(parse_age_ms("30s"), Some(30_000));
        assert_eq!(parse_age_ms("bogus"), None);
        assert_eq!(parse_age_ms("10"), None);
        let arguments: BTreeMap<String, String> =
            [("max-length-bytes", "1000"), ("max-age", "1h")].into_iter().map(|(key, value)| (key.into(), value.into())).collect();
        let settings = settings_of(&arguments).unwrap();
        assert_eq!(settings.retention, Retention { max_bytes: Some(1000), max_age_ms: Some(3_600_000) });
        let bad: BTreeMap<String, String> = [("max-age".to_string(), "soon".to_string())].into_iter().collect();
        assert!(settings_of(&bad).is_err());
        let cluster: BTreeMap<String, String> = [("initial-cluster-size".to_string(), "0".to_string())].into_iter().collect();
        assert!(settings_of(&cluster).is_err());
    }
}
