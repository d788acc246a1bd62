//! Durable definitions: exchanges, queues and bindings of every vhost, users, permissions, vhosts
//! and policies.
//!
//! They live in a snapshot, `definitions.json`, and a change log beside it, `definitions.log`
//! (see `definitions_log.rs`): each change appends one checksummed record and is acknowledged
//! after one fdatasync shared by every change submitted meanwhile, so the n-th declare costs the
//! same as the first. When the log outgrows the snapshot ([`COMPACTION_LOG_BYTES_MIN`]), the
//! state is written as a new snapshot (atomically: temporary file, fsync, rename) and the log
//! starts afresh; the state in memory is the snapshot with every change applied
//! (`definitions_state.rs`), the same function replay uses at start.
//!
//! Both files are reached through the [`FileSystem`] seam, so tests cut the power, tear the last
//! write and fail writes and syncs with the in-memory one.
//!
//! Argument tables are stored as the hex of their AMQP encoding, so they come back byte-exact.
//!
//! The snapshot names the data directory's storage format ([`STORAGE_FORMAT_VERSION`]). Format 4
//! added the log; format 3 gave every queue its type (`"type": "classic"`). A format 3 or 2 file
//! is upgraded when it is opened (format 2's queues were all classic) and written back before the
//! broker uses it.

use crate::definitions_log::{decode_header, encode_header, encode_record, read_records, LOG_HEADER_BYTES};
use crate::definitions_state::{DefinitionChange, DefinitionState};
use crate::file_system::{self, FileSystem, OpenMode, SharedFileSystem, StorageFile};
use crate::{StorageError, STORAGE_FORMAT_VERSION};
use amqp_codec::{write_table, FieldTable, Reader};
use broker_core::vhost::QueueType;
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A durable exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExchangeRecord {
    /// Vhost name.
    pub vhost: String,
    /// Exchange name.
    pub name: String,
    /// Type name.
    pub kind: String,
    /// Auto-delete flag.
    pub auto_delete: bool,
    /// Internal flag.
    pub internal: bool,
    /// Arguments, hex of the AMQP table encoding.
    pub arguments_hex: String,
}

/// A durable queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueRecord {
    /// Vhost name.
    pub vhost: String,
    /// Queue name.
    pub name: String,
    /// Auto-delete flag.
    pub auto_delete: bool,
    /// Arguments, hex of the AMQP table encoding.
    pub arguments_hex: String,
    /// Its type, by name (`"type": "classic"`); every queue has one since format 3.
    #[serde(rename = "type", with = "queue_type_name")]
    pub queue_type: QueueType,
}

/// A queue type as the file spells it, the name `x-queue-type` takes; a name RabbitMQ does not
/// have makes the file corrupt.
mod queue_type_name {
    use broker_core::vhost::QueueType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(queue_type: &QueueType, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(queue_type.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<QueueType, D::Error> {
        let name = String::deserialize(deserializer)?;
        QueueType::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown queue type '{name}'")))
    }
}

/// A binding between durable ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BindingRecord {
    /// Vhost name.
    pub vhost: String,
    /// Source exchange.
    pub source: String,
    /// Destination name.
    pub destination: String,
    /// Whether the destination is an exchange (else a queue).
    pub destination_is_exchange: bool,
    /// Binding key.
    pub routing_key: String,
    /// Arguments, hex of the AMQP table encoding.
    pub arguments_hex: String,
}

/// Everything durable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Definitions {
    /// The storage format of the whole data directory (see [`STORAGE_FORMAT_VERSION`]); absent
    /// in files written by format 1.
    #[serde(default = "format_version_1")]
    pub storage_format_version: u32,
    /// The generation of this snapshot: its change log starts with the same number (see
    /// `definitions_log.rs`); 0 in a file written before format 4, which had no log.
    #[serde(default)]
    pub log_generation: u64,
    /// Exchanges (not the predeclared ones).
    pub exchanges: Vec<ExchangeRecord>,
    /// Queues.
    pub queues: Vec<QueueRecord>,
    /// Bindings.
    pub bindings: Vec<BindingRecord>,
    /// Users; `None` in a file written before users were stored (or a fresh data directory),
    /// which means the embedded default `guest`.
    #[serde(default)]
    pub users: Option<Vec<UserRecord>>,
    /// Permissions of users in vhosts; `None` means the default (guest has all of `/`).
    #[serde(default)]
    pub permissions: Option<Vec<PermissionRecord>>,
    /// Topic permissions of users on exchanges; absent from files written before they existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topic_permissions: Vec<TopicPermissionRecord>,
    /// Vhosts; `None` in a file written before vhosts were stored (or a fresh data directory),
    /// which means the default vhost `/` alone.
    #[serde(default)]
    pub vhosts: Option<Vec<VhostRecord>>,
    /// Policies (RabbitMQ's: a pattern, what it applies to, a priority and a definition).
    #[serde(default)]
    pub policies: Vec<PolicyRecord>,
    /// Operator policies, in the same form; absent from files written before they existed.
    #[serde(default)]
    pub operator_policies: Vec<PolicyRecord>,
}

/// A vhost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VhostRecord {
    /// Vhost name.
    pub name: String,
    /// Free text shown by the management API.
    #[serde(default)]
    pub description: String,
    /// Free-form tags shown by the management API.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The vhost's limits by RabbitMQ's names (`max-connections`, `max-queues`); `None` when none
    /// was ever set, an empty map when every one was deleted (RabbitMQ keeps the parameter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<std::collections::BTreeMap<String, i64>>,
    /// The type a queue declared in the vhost without `x-queue-type` gets (RabbitMQ's vhost
    /// metadata `default_queue_type`), by its name; `None`: classic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_queue_type: Option<String>,
}

/// A policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// Vhost name.
    pub vhost: String,
    /// Policy name.
    pub name: String,
    /// Regular expression matched against queue or exchange names.
    pub pattern: String,
    /// `queues`, `exchanges` or `all`.
    pub apply_to: String,
    /// The highest priority among matching policies wins.
    pub priority: i64,
    /// The settings, as the JSON object the management API took.
    pub definition: serde_json::Map<String, serde_json::Value>,
}

fn format_version_1() -> u32 {
    1
}

impl Default for Definitions {
    fn default() -> Definitions {
        Definitions {
            storage_format_version: STORAGE_FORMAT_VERSION,
            log_generation: 0,
            exchanges: Vec::new(),
            queues: Vec::new(),
            bindings: Vec::new(),
            users: None,
            permissions: None,
            topic_permissions: Vec::new(),
            vhosts: None,
            policies: Vec::new(),
            operator_policies: Vec::new(),
        }
    }
}

/// A user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserRecord {
    /// Login name.
    pub name: String,
    /// RabbitMQ's `rabbit_password_hashing_sha256` form: base64(salt ++ SHA-256(salt ++ password)).
    pub password_hash: String,
    /// Tags (administrator, monitoring, management, ...).
    pub tags: Vec<String>,
}

/// What a user may do in a vhost: RabbitMQ's configure, write and read regular expressions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionRecord {
    /// User name.
    pub user: String,
    /// Vhost name.
    pub vhost: String,
    /// Resources the user may declare and delete.
    pub configure: String,
    /// Resources the user may publish to and bind queues to.
    pub write: String,
    /// Resources the user may consume from and bind from.
    pub read: String,
}

/// What routing keys a user may publish with (write) and bind with (read) on one topic exchange
/// of a vhost: RabbitMQ's topic permission, two regular expressions as given (`{username}` and
/// `{vhost}` unexpanded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicPermissionRecord {
    /// User name.
    pub user: String,
    /// Vhost name.
    pub vhost: String,
    /// Exchange name.
    pub exchange: String,
    /// Routing keys the user may publish with.
    pub write: String,
    /// Binding keys the user may bind (and unbind) with.
    pub read: String,
}

/// Encodes a table for a record.
pub fn table_to_hex(table: &FieldTable) -> String {
    let mut bytes = BytesMut::new();
    write_table(&mut bytes, table);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Decodes a table from a record.
pub fn table_from_hex(hex: &str) -> Option<FieldTable> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len()).step_by(2).map(|index| u8::from_str_radix(hex.get(index..index + 2)?, 16).ok()).collect();
    Reader::new(Bytes::from(bytes?)).read_table().ok()
}

/// The log is compacted (a new snapshot written, the log started afresh) once it holds more bytes
/// than this and than the snapshot: the snapshot's O(n) rewrite is then paid once for at least n
/// bytes of changes, so each change costs O(1) amortised, and replay at start reads at most about
/// twice the snapshot's size.
pub const COMPACTION_LOG_BYTES_MIN: u64 = 1 << 20;

/// Why a group commit failed, kept for every change of its batch (`io::Error` is not `Clone`).
#[derive(Debug, Clone)]
struct CommitFailure {
    path: String,
    kind: std::io::ErrorKind,
    detail: String,
}

impl CommitFailure {
    fn new(error: &StorageError) -> CommitFailure {
        match error {
            StorageError::Io { path, source } => CommitFailure { path: path.clone(), kind: source.kind(), detail: source.to_string() },
            other => CommitFailure { path: String::new(), kind: std::io::ErrorKind::Other, detail: other.to_string() },
        }
    }

    fn to_error(&self) -> StorageError {
        StorageError::Io { path: self.path.clone(), source: std::io::Error::new(self.kind, self.detail.clone()) }
    }
}

/// The changes that one fdatasync makes durable together.
#[derive(Debug, Default)]
struct Batch {
    outcome: OnceLock<Result<(), CommitFailure>>,
}

/// A submitted change's place in the group commit; [`DefinitionsStore::wait`] returns once it
/// is durable. A clone is the same place: a publish into a queue whose declaration is in flight
/// waits for the declaration's ticket too (`Broker::declare_queue_unwaited`).
#[derive(Debug, Clone)]
pub struct DefinitionsTicket(Arc<Batch>);

impl DefinitionsTicket {
    /// Whether the change is durable already (its batch was committed): one atomic load.
    pub fn is_durable(&self) -> bool {
        matches!(self.0.outcome.get(), Some(Ok(())))
    }
}

/// What submitters share: the state with every submitted change applied, and the framed records
/// not yet written.
struct Submitted {
    state: DefinitionState,
    /// The generation of the snapshot the current log follows; records are framed with it.
    generation: u64,
    pending: Vec<u8>,
    batch: Arc<Batch>,
}

/// What the one committer at a time holds.
struct Writer {
    log: Arc<dyn StorageFile>,
    log_bytes: u64,
    snapshot_bytes: u64,
    /// Set when a write failed: the log may end in a partial record and the state holds changes
    /// it lacks, so the next commit writes a new snapshot instead of appending.
    needs_compaction: bool,
}

/// The durable definitions of a data directory: the snapshot `definitions.json` and the change
/// log `definitions.log` beside it.
///
/// A change is submitted while the lock that ordered it in memory is held ([`submit`], O(size of
/// the change)), so the log has the changes in the order the broker made them, and waited for
/// after that lock is released ([`wait`]): the first waiter writes every record submitted so far
/// and fdatasyncs the log once for all of them (group commit) while the others wait for it.
///
/// [`submit`]: DefinitionsStore::submit
/// [`wait`]: DefinitionsStore::wait
pub struct DefinitionsStore {
    file_system: SharedFileSystem,
    directory: PathBuf,
    snapshot_path: PathBuf,
    log_path: PathBuf,
    submitted: Mutex<Submitted>,
    writer: Mutex<Writer>,
}

/// A snapshot as read from disk, in the current format.
struct LoadedSnapshot {
    definitions: Definitions,
    bytes: u64,
}

impl DefinitionsStore {
    /// Opens the definitions of `data_dir` and returns them: the snapshot with the log's intact
    /// records replayed onto it (a torn last record is dropped and cut off the file). A fresh
    /// data directory gets an empty snapshot and log. A data directory of an older format this
    /// build can upgrade (3 and 2, and 1 without durable queues, which has no message logs) gets a
    /// snapshot in the current format, atomically, and a new log, before this returns; segments
    /// read the same in every format. Any other format is refused.
    pub fn open(data_dir: &Path) -> Result<(DefinitionsStore, Definitions), StorageError> {
        DefinitionsStore::open_on(file_system::real(), data_dir)
    }

    /// [`DefinitionsStore::open`] through `file_system` (tests: the in-memory one).
    pub fn open_on(file_system: SharedFileSystem, data_dir: &Path) -> Result<(DefinitionsStore, Definitions), StorageError> {
        let fs = &*file_system;
        let snapshot_path = data_dir.join("definitions.json");
        let log_path = data_dir.join("definitions.log");
        let LoadedSnapshot { definitions, bytes: snapshot_bytes } = match read_snapshot(fs, &snapshot_path)? {
            Some(snapshot) => snapshot,
            None if fs.exists(&log_path) => {
                return Err(StorageError::Corrupt {
                    path: log_path.display().to_string(),
                    detail: "a change log without its snapshot definitions.json".to_string(),
                })
            }
            None => write_snapshot(fs, &snapshot_path, &Definitions { log_generation: 1, ..Definitions::default() })?,
        };
        let generation = definitions.log_generation;
        let mut state = DefinitionState::from_definitions(&definitions);
        let (log, log_bytes) = open_log(fs, &log_path, generation, &mut state)?;
        let recovered = state.to_definitions(STORAGE_FORMAT_VERSION, generation);
        let store = DefinitionsStore {
            file_system,
            directory: data_dir.to_path_buf(),
            snapshot_path,
            log_path,
            submitted: Mutex::new(Submitted { state, generation, pending: Vec::new(), batch: Arc::default() }),
            writer: Mutex::new(Writer { log, log_bytes, snapshot_bytes, needs_compaction: false }),
        };
        Ok((store, recovered))
    }

    /// Records `change` after every change submitted before it, in memory only: call it while
    /// holding the lock under which the change was made, then [`DefinitionsStore::wait`] for the
    /// ticket after releasing that lock. Costs O(size of the change + log n).
    pub fn submit(&self, change: DefinitionChange) -> DefinitionsTicket {
        let mut submitted = self.submitted.lock();
        let generation = submitted.generation;
        encode_record(&mut submitted.pending, generation, &change);
        submitted.state.apply(change);
        DefinitionsTicket(submitted.batch.clone())
    }

    /// Returns once the ticket's change (and every change submitted before it) is durable, or
    /// with the error of the write or fdatasync that should have made it so. Blocks on disk I/O.
    pub fn wait(&self, ticket: DefinitionsTicket) -> Result<(), StorageError> {
        loop {
            if let Some(outcome) = ticket.0.outcome.get() {
                return outcome.clone().map_err(|failure| failure.to_error());
            }
            // Whoever holds the writer commits everything submitted before it took the pending
            // records; a waiter whose batch is still open when it gets the lock commits it, with
            // every record submitted meanwhile.
            let mut writer = self.writer.lock();
            if ticket.0.outcome.get().is_none() {
                self.commit(&mut writer);
            }
        }
    }

    /// Returns once every change submitted so far is durable: after a failed commit, whose
    /// changes the next commit folds into a new snapshot, this is that next commit.
    pub fn wait_for_everything_submitted(&self) -> Result<(), StorageError> {
        let ticket = DefinitionsTicket(self.submitted.lock().batch.clone());
        self.wait(ticket)
    }

    /// [`DefinitionsStore::submit`] then [`DefinitionsStore::wait`], for a change no lock orders.
    pub fn apply(&self, change: DefinitionChange) -> Result<(), StorageError> {
        let ticket = self.submit(change);
        self.wait(ticket)
    }

    /// Writes a new snapshot of every change so far and starts an empty log, if the log holds any
    /// record (at graceful shutdown: the next start reads one file).
    pub fn compact(&self) -> Result<(), StorageError> {
        let mut writer = self.writer.lock();
        if writer.log_bytes <= LOG_HEADER_BYTES && !writer.needs_compaction && self.submitted.lock().pending.is_empty() {
            return Ok(());
        }
        self.compact_locked(&mut writer)
    }

    /// The state with every submitted change applied (what the next snapshot holds).
    pub fn definitions(&self) -> Definitions {
        let submitted = self.submitted.lock();
        submitted.state.to_definitions(STORAGE_FORMAT_VERSION, submitted.generation)
    }

    /// Commits the pending records: appended and fdatasynced, or folded into a new snapshot when
    /// the log has grown past its bound or a write failed.
    fn commit(&self, writer: &mut Writer) {
        if writer.needs_compaction {
            // The error reaches every waiter of the batch through its outcome.
            let _ = self.compact_locked(writer);
            return;
        }
        let (bytes, batch) = {
            let mut submitted = self.submitted.lock();
            (std::mem::take(&mut submitted.pending), std::mem::take(&mut submitted.batch))
        };
        let written = writer.log.write_all_at(&bytes, writer.log_bytes).and_then(|()| writer.log.sync_data());
        match written {
            Ok(()) => {
                writer.log_bytes += bytes.len() as u64;
                let _ = batch.outcome.set(Ok(()));
            }
            Err(error) => {
                writer.needs_compaction = true;
                let error = StorageError::io(&self.log_path, error);
                tracing::error!(%error, "appending to the definitions log failed; the next change writes a new snapshot");
                let _ = batch.outcome.set(Err(CommitFailure::new(&error)));
                return;
            }
        }
        if writer.log_bytes > COMPACTION_LOG_BYTES_MIN.max(writer.snapshot_bytes) {
            if let Err(error) = self.compact_locked(writer) {
                tracing::error!(%error, "compacting the definitions log failed; it is retried at the next change");
            }
        }
    }

    /// Writes the state as a new snapshot of the next generation, then an empty log of that
    /// generation; the records pending now are in the snapshot, so their batch completes with it.
    /// A crash between the two leaves a snapshot newer than the log, whose records it holds: the
    /// log is then ignored at start, never replayed twice.
    fn compact_locked(&self, writer: &mut Writer) -> Result<(), StorageError> {
        let (definitions, batch) = {
            let mut submitted = self.submitted.lock();
            submitted.generation += 1;
            submitted.pending.clear();
            let definitions = submitted.state.to_definitions(STORAGE_FORMAT_VERSION, submitted.generation);
            (definitions, std::mem::take(&mut submitted.batch))
        };
        // Until a new log of the new generation is in place, nothing is appended.
        writer.needs_compaction = true;
        let fs = &*self.file_system;
        let compacted = write_snapshot(fs, &self.snapshot_path, &definitions)
            .and_then(|snapshot| Ok((snapshot.bytes, create_log(fs, &self.log_path, &self.directory, definitions.log_generation)?)));
        match compacted {
            Ok((snapshot_bytes, log)) => {
                *writer = Writer { log, log_bytes: LOG_HEADER_BYTES, snapshot_bytes, needs_compaction: false };
                let _ = batch.outcome.set(Ok(()));
                Ok(())
            }
            Err(error) => {
                let _ = batch.outcome.set(Err(CommitFailure::new(&error)));
                Err(error)
            }
        }
    }
}

/// Reads and parses the snapshot, upgrading an older format; `None` when there is none.
fn read_snapshot(fs: &dyn FileSystem, path: &Path) -> Result<Option<LoadedSnapshot>, StorageError> {
    let corrupt = |detail: String| StorageError::Corrupt { path: path.display().to_string(), detail };
    let Some(bytes) = read_whole(fs, path)? else {
        return Ok(None);
    };
    let document: serde_json::Value = serde_json::from_slice(&bytes).map_err(|error| corrupt(error.to_string()))?;
    let found = match document.get("storage_format_version") {
        // Format 1 wrote no version.
        None => 1,
        Some(version) => version
            .as_u64()
            .and_then(|version| u32::try_from(version).ok())
            .ok_or_else(|| corrupt(format!("storage_format_version {version} is not a version number")))?,
    };
    let has_queues = document.get("queues").and_then(serde_json::Value::as_array).is_some_and(|queues| !queues.is_empty());
    match found {
        STORAGE_FORMAT_VERSION => {
            let definitions = serde_json::from_value(document).map_err(|error| corrupt(error.to_string()))?;
            Ok(Some(LoadedSnapshot { definitions, bytes: bytes.len() as u64 }))
        }
        2 | 3 => upgrade(fs, path, document, found).map(Some),
        1 if !has_queues => upgrade(fs, path, document, found).map(Some),
        _ => Err(StorageError::UnsupportedFormat { path: path.display().to_string(), found }),
    }
}

/// Brings an older snapshot to the current format (every queue of format 2 is classic; format 3
/// had no log), and writes it back atomically; the log is created afresh by [`open_log`], as
/// the generation in the new snapshot matches no log.
fn upgrade(fs: &dyn FileSystem, path: &Path, mut document: serde_json::Value, found: u32) -> Result<LoadedSnapshot, StorageError> {
    let corrupt = |detail: String| StorageError::Corrupt { path: path.display().to_string(), detail };
    let Some(object) = document.as_object_mut() else {
        return Err(corrupt("not a JSON object".to_string()));
    };
    if let Some(queues) = object.get_mut("queues").and_then(serde_json::Value::as_array_mut) {
        for queue in queues.iter_mut().filter_map(serde_json::Value::as_object_mut) {
            queue.entry("type").or_insert_with(|| serde_json::Value::from(QueueType::Classic.name()));
        }
    }
    object.insert("storage_format_version".to_string(), serde_json::Value::from(STORAGE_FORMAT_VERSION));
    // A log of the generation after any the directory could hold: a format-3 directory has none,
    // and a stray file of that name is not this snapshot's log.
    object.insert("log_generation".to_string(), serde_json::Value::from(1u64));
    let definitions: Definitions = serde_json::from_value(document).map_err(|error| corrupt(error.to_string()))?;
    let snapshot = write_snapshot(fs, path, &definitions)?;
    tracing::info!(
        path = %path.display(),
        from = found,
        to = STORAGE_FORMAT_VERSION,
        queues = definitions.queues.len(),
        "upgraded the data directory's storage format"
    );
    Ok(snapshot)
}

/// Replaces the snapshot atomically.
fn write_snapshot(fs: &dyn FileSystem, path: &Path, definitions: &Definitions) -> Result<LoadedSnapshot, StorageError> {
    assert_eq!(definitions.storage_format_version, STORAGE_FORMAT_VERSION, "definitions are written in the current format");
    let bytes = serde_json::to_vec_pretty(definitions)
        .map_err(|error| StorageError::Corrupt { path: path.display().to_string(), detail: error.to_string() })?;
    write_atomically(fs, path, &bytes)?;
    Ok(LoadedSnapshot { definitions: definitions.clone(), bytes: bytes.len() as u64 })
}

/// A whole file, or `None` when there is none.
fn read_whole(fs: &dyn FileSystem, path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    if !fs.exists(path) {
        return Ok(None);
    }
    let file = fs.open(path, OpenMode::Read).map_err(|error| StorageError::io(path, error))?;
    let length = file.len().map_err(|error| StorageError::io(path, error))?;
    let length = usize::try_from(length)
        .map_err(|_| StorageError::Corrupt { path: path.display().to_string(), detail: format!("{length} bytes do not fit in memory") })?;
    let mut bytes = vec![0; length];
    file.read_exact_at(&mut bytes, 0).map_err(|error| StorageError::io(path, error))?;
    Ok(Some(bytes))
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new content: a temporary
/// file written and synced, renamed over `path`, the directory synced.
fn write_atomically(fs: &dyn FileSystem, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let temporary = path.with_extension(format!("{}.tmp", path.extension().and_then(|extension| extension.to_str()).unwrap_or("")));
    // A temporary file a crash left behind is not part of anything.
    file_system::remove_durably(fs, &temporary).map_err(io_error(&temporary))?;
    let file = fs.open(&temporary, OpenMode::CreateNew).map_err(io_error(&temporary))?;
    file.write_all_at(bytes, 0).and_then(|()| file.sync_data()).map_err(io_error(&temporary))?;
    drop(file);
    fs.rename(&temporary, path).map_err(io_error(path))?;
    let directory = path.parent().unwrap_or(Path::new("."));
    fs.sync_directory(directory).map_err(io_error(directory))
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |error| StorageError::io(path, error)
}

/// Replays the log of `generation` onto `state` and opens it for appending after its last intact
/// record; a missing log, or one of another generation (left by a compaction that a crash cut
/// short, whose records the snapshot holds), is replaced by an empty one.
fn open_log(
    fs: &dyn FileSystem,
    path: &Path,
    generation: u64,
    state: &mut DefinitionState,
) -> Result<(Arc<dyn StorageFile>, u64), StorageError> {
    let bytes = read_whole(fs, path)?.unwrap_or_default();
    let directory = path.parent().unwrap_or(Path::new("."));
    if decode_header(&bytes) != Some(generation) {
        if !bytes.is_empty() {
            tracing::info!(path = %path.display(), "the definitions log precedes the snapshot, which holds its changes; starting a new log");
        }
        return Ok((create_log(fs, path, directory, generation)?, LOG_HEADER_BYTES));
    }
    let replayed = read_records(path, &bytes, generation)?;
    let replayed_count = replayed.changes.len();
    for change in replayed.changes {
        state.apply(change);
    }
    let file = fs.open(path, OpenMode::ReadWrite).map_err(|error| StorageError::io(path, error))?;
    if let Some(reason) = &replayed.torn {
        // Nothing past the last intact record was acknowledged: cut it off, so that new records
        // follow the intact ones.
        tracing::warn!(path = %path.display(), %reason, dropped_bytes = bytes.len() as u64 - replayed.valid_bytes,
            "the definitions log ends in a torn record (a crash during a write); it is ignored");
        file.set_len(replayed.valid_bytes).and_then(|()| file.sync_data()).map_err(|error| StorageError::io(path, error))?;
    }
    tracing::debug!(path = %path.display(), records = replayed_count, "replayed the definitions log");
    Ok((file, replayed.valid_bytes))
}

/// An empty log of `generation`, in place of `path` atomically, opened for appending after its
/// header.
fn create_log(fs: &dyn FileSystem, path: &Path, directory: &Path, generation: u64) -> Result<Arc<dyn StorageFile>, StorageError> {
    debug_assert_eq!(path.parent(), Some(directory), "the log lives in the data directory");
    write_atomically(fs, path, &encode_header(generation))?;
    fs.open(path, OpenMode::ReadWrite).map_err(|error| StorageError::io(path, error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definitions_state::ControlPlaneRecord;
    use crate::memory_file_system::{FaultOperation, MemoryFileSystem, PowerCut};

    fn data_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lepus-definitions-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    fn open(dir: &Path) -> (DefinitionsStore, Definitions) {
        DefinitionsStore::open(dir).expect("open")
    }

    fn queue(vhost: &str, name: &str) -> QueueRecord {
        QueueRecord {
            vhost: vhost.to_string(),
            name: name.to_string(),
            auto_delete: false,
            arguments_hex: String::new(),
            queue_type: QueueType::Classic,
        }
    }

    fn exchange(vhost: &str, name: &str) -> ExchangeRecord {
        ExchangeRecord {
            vhost: vhost.to_string(),
            name: name.to_string(),
            kind: "topic".to_string(),
            auto_delete: false,
            internal: false,
            arguments_hex: String::new(),
        }
    }

    fn binding(vhost: &str, source: &str, destination: &str, to_exchange: bool, key: &str) -> BindingRecord {
        BindingRecord {
            vhost: vhost.to_string(),
            source: source.to_string(),
            destination: destination.to_string(),
            destination_is_exchange: to_exchange,
            routing_key: key.to_string(),
            arguments_hex: String::new(),
        }
    }

    fn vhost(name: &str) -> VhostRecord {
        VhostRecord { name: name.to_string(), description: String::new(), tags: Vec::new(), limits: None, default_queue_type: None }
    }

    /// Exchanges, queues and bindings without the generation, which a compaction changes.
    fn contents(definitions: &Definitions) -> Definitions {
        Definitions { log_generation: 0, ..definitions.clone() }
    }

    fn names<T>(records: &[T], name: impl Fn(&T) -> String) -> Vec<String> {
        records.iter().map(name).collect()
    }

    /// A run of changes whose cascades the expected result below spells out.
    fn changes() -> Vec<DefinitionChange> {
        let control_plane = ControlPlaneRecord {
            users: Some(vec![UserRecord { name: "ann".to_string(), password_hash: "h".to_string(), tags: vec![] }]),
            permissions: Some(vec![PermissionRecord {
                user: "ann".to_string(),
                vhost: "other".to_string(),
                configure: ".*".to_string(),
                write: ".*".to_string(),
                read: ".*".to_string(),
            }]),
            topic_permissions: ["/", "other"]
                .map(|vhost| TopicPermissionRecord {
                    user: "ann".to_string(),
                    vhost: vhost.to_string(),
                    exchange: "amq.topic".to_string(),
                    write: "^{username}\\.".to_string(),
                    read: String::new(),
                })
                .to_vec(),
            vhosts: Some(vec![vhost("/"), vhost("other")]),
            policies: Vec::new(),
            operator_policies: Vec::new(),
        };
        vec![
            DefinitionChange::ControlPlane(control_plane),
            DefinitionChange::PutExchange(exchange("/", "x")),
            DefinitionChange::PutExchange(exchange("/", "y")),
            DefinitionChange::PutQueue(queue("/", "q1")),
            DefinitionChange::PutQueue(queue("/", "q2")),
            DefinitionChange::PutBinding(binding("/", "x", "q1", false, "a")),
            DefinitionChange::PutBinding(binding("/", "x", "q2", false, "b")),
            DefinitionChange::PutBinding(binding("/", "y", "x", true, "c")),
            DefinitionChange::PutBinding(binding("/", "y", "q2", false, "d")),
            // Deleting q1 takes x -> q1; deleting x takes y -> x as well.
            DefinitionChange::DeleteQueue { vhost: "/".to_string(), name: "q1".to_string() },
            DefinitionChange::DeleteExchange { vhost: "/".to_string(), name: "x".to_string() },
            DefinitionChange::PutQueue(queue("other", "q3")),
            DefinitionChange::PutExchange(exchange("other", "z")),
            DefinitionChange::PutBinding(binding("other", "z", "q3", false, "e")),
            DefinitionChange::PutQueue(queue("/", "q4")),
            DefinitionChange::DeleteBinding(binding("/", "y", "q2", false, "d")),
            DefinitionChange::PutBinding(binding("/", "y", "q4", false, "f")),
            // Deleting q5 takes y -> q5, and y -> q4 stays.
            DefinitionChange::PutQueue(queue("/", "q5")),
            DefinitionChange::PutBinding(binding("/", "y", "q5", false, "g")),
            DefinitionChange::DeleteQueue { vhost: "/".to_string(), name: "q5".to_string() },
            DefinitionChange::DeleteVhost { name: "other".to_string() },
        ]
    }

    fn check_expected(definitions: &Definitions) {
        assert_eq!(names(&definitions.exchanges, |record| format!("{}/{}", record.vhost, record.name)), ["//y"]);
        assert_eq!(names(&definitions.queues, |record| format!("{}/{}", record.vhost, record.name)), ["//q2", "//q4"]);
        assert_eq!(names(&definitions.bindings, |record| format!("{}->{}", record.source, record.destination)), ["y->q4"]);
        assert_eq!(definitions.vhosts.as_ref().map(|vhosts| names(vhosts, |record| record.name.clone())), Some(vec!["/".to_string()]));
        assert_eq!(definitions.permissions.as_ref().map(Vec::len), Some(0), "the deleted vhost's permission stays");
        assert_eq!(definitions.users.as_ref().map(Vec::len), Some(1));
        let topic_permissions = names(&definitions.topic_permissions, |record| format!("{}/{}", record.vhost, record.exchange));
        assert_eq!(topic_permissions, ["//amq.topic"], "the deleted vhost's topic permission goes with it");
    }

    #[test]
    fn replaying_the_log_rebuilds_the_state_the_changes_made() {
        let dir = data_dir("replay");
        let (store, fresh) = open(&dir);
        assert_eq!(contents(&fresh), Definitions::default());
        for change in changes() {
            store.apply(change).expect("apply");
        }
        let in_memory = store.definitions();
        check_expected(&in_memory);
        let log_bytes = std::fs::metadata(dir.join("definitions.log")).expect("log").len();
        assert!(log_bytes > LOG_HEADER_BYTES, "the changes went to the log");
        drop(store);
        let (_, reopened) = open(&dir);
        assert_eq!(contents(&reopened), contents(&in_memory));
        check_expected(&reopened);
    }

    #[test]
    fn concurrent_changes_are_all_durable_when_their_waits_return() {
        let dir = data_dir("concurrent");
        let (store, _) = open(&dir);
        let store = Arc::new(store);
        let log = dir.join("definitions.log");
        let threads: Vec<_> = (0..8)
            .map(|thread| {
                let (store, log) = (store.clone(), log.clone());
                std::thread::spawn(move || {
                    for index in 0..50 {
                        let name = format!("q-{thread}-{index}");
                        store.apply(DefinitionChange::PutQueue(queue("/", &name))).expect("apply");
                        // Returned: the record is in the file (written before the fdatasync that
                        // made it durable), whichever thread wrote it.
                        let text = String::from_utf8_lossy(&std::fs::read(&log).expect("read")).into_owned();
                        assert!(text.contains(&format!("\"name\":\"{name}\"")), "{name} is not in the log when its wait returns");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("thread");
        }
        drop(store);
        let (_, reopened) = open(&dir);
        assert_eq!(reopened.queues.len(), 400);
    }

    #[test]
    fn a_torn_last_record_is_ignored_and_cut_off_so_later_changes_follow_the_intact_ones() {
        let dir = data_dir("torn");
        let log = dir.join("definitions.log");
        let (store, _) = open(&dir);
        store.apply(DefinitionChange::PutQueue(queue("/", "kept"))).expect("apply");
        let intact = std::fs::metadata(&log).expect("log").len();
        store.apply(DefinitionChange::PutQueue(queue("/", "torn"))).expect("apply");
        drop(store);
        // A crash during the second append: only part of its record reached the disk.
        let full = std::fs::metadata(&log).expect("log").len();
        std::fs::OpenOptions::new().write(true).open(&log).expect("open").set_len(full - 5).expect("truncate");
        let (store, reopened) = open(&dir);
        assert_eq!(names(&reopened.queues, |record| record.name.clone()), ["kept"]);
        assert_eq!(std::fs::metadata(&log).expect("log").len(), intact, "the torn record is cut off");
        store.apply(DefinitionChange::PutQueue(queue("/", "after"))).expect("apply");
        drop(store);
        let (store, reopened) = open(&dir);
        assert_eq!(names(&reopened.queues, |record| record.name.clone()), ["after", "kept"]);
        drop(store);
        // A last record whose bytes are all there but wrong (a torn page): its checksum fails.
        let mut bytes = std::fs::read(&log).expect("read");
        let last = bytes.len() - 3;
        bytes[last] ^= 0x20;
        std::fs::write(&log, &bytes).expect("write");
        let (_, reopened) = open(&dir);
        assert_eq!(names(&reopened.queues, |record| record.name.clone()), ["kept"]);
    }

    #[test]
    fn compaction_writes_a_snapshot_of_the_same_state_and_starts_a_new_log() {
        let dir = data_dir("compaction");
        let log = dir.join("definitions.log");
        let (store, _) = open(&dir);
        // Past the log's bound: declares and deletes, so the snapshot is much smaller than the log.
        let name = |index: usize| format!("queue-with-a-long-name-{index}");
        // About 5,000 declares and 2,500 deletes fill 1 MiB; twice that is past any doubt.
        let changes = (0..10_000).flat_map(|index| {
            let put = DefinitionChange::PutQueue(queue("/", &name(index)));
            let delete = (index % 2 == 1).then(|| DefinitionChange::DeleteQueue { vhost: "/".to_string(), name: name(index - 1) });
            std::iter::once(put).chain(delete)
        });
        for change in changes {
            store.apply(change).expect("apply");
            if store.definitions().log_generation != 1 {
                break;
            }
        }
        let compacted = store.definitions();
        assert_eq!(compacted.log_generation, 2);
        assert!(std::fs::metadata(&log).expect("log").len() < COMPACTION_LOG_BYTES_MIN / 4, "the log started afresh");
        let snapshot: Definitions = serde_json::from_slice(&std::fs::read(dir.join("definitions.json")).expect("read")).expect("parse");
        assert_eq!(snapshot.log_generation, 2);
        assert_eq!(snapshot.queues.len(), compacted.queues.len(), "the snapshot holds every queue");
        // Changes after the compaction go to the new log, and everything comes back.
        store.apply(DefinitionChange::PutQueue(queue("/", "after-compaction"))).expect("apply");
        let in_memory = store.definitions();
        drop(store);
        let (_, reopened) = open(&dir);
        assert_eq!(reopened, in_memory);
        assert_eq!(reopened.queues.len(), compacted.queues.len() + 1);
    }

    fn memory_store(memory: &MemoryFileSystem) -> (DefinitionsStore, Definitions) {
        DefinitionsStore::open_on(memory.shared(), Path::new("/data")).expect("open in memory")
    }

    fn memory_data_dir() -> MemoryFileSystem {
        let memory = MemoryFileSystem::new();
        memory.create_durable_directory(Path::new("/data"));
        memory
    }

    #[test]
    fn after_a_failed_append_the_next_change_writes_a_new_snapshot_with_both() {
        let memory = memory_data_dir();
        let (store, _) = memory_store(&memory);
        store.apply(DefinitionChange::PutQueue(queue("/", "before"))).expect("apply");
        memory.fail(FaultOperation::Write, libc::ENOSPC, Path::new("/data/definitions.log"), 1);
        let error = store.apply(DefinitionChange::PutQueue(queue("/", "failed"))).expect_err("the append fails");
        assert!(matches!(error, StorageError::Io { .. }), "{error}");
        // The broker keeps what it declared in memory, as the store keeps it in its state: the next
        // change writes both, in a new snapshot and log, rather than appending after a partial record.
        store.apply(DefinitionChange::PutQueue(queue("/", "after"))).expect("apply after the failure");
        assert_eq!(store.definitions().log_generation, 2);
        store.apply(DefinitionChange::PutQueue(queue("/", "appended"))).expect("apply to the new log");
        drop(store);
        let restarted = memory.power_cut(PowerCut::LoseUnsynced);
        let (_, reopened) = memory_store(&restarted);
        assert_eq!(names(&reopened.queues, |record| record.name.clone()), ["after", "appended", "before", "failed"]);
    }

    #[test]
    fn a_power_cut_keeps_every_acknowledged_change_and_drops_a_torn_unacknowledged_one() {
        let memory = memory_data_dir();
        let (store, _) = memory_store(&memory);
        for change in changes() {
            store.apply(change).expect("apply");
        }
        let acknowledged = store.definitions();
        // The next append reaches the page cache but its fdatasync fails: not acknowledged.
        memory.fail(FaultOperation::Sync, libc::EIO, Path::new("/data/definitions.log"), 1);
        store.apply(DefinitionChange::PutQueue(queue("/", "unacknowledged"))).expect_err("the sync fails");
        let restarted = memory.power_cut(PowerCut::TearLastWrite { bytes_kept: 11 });
        let (store, reopened) = memory_store(&restarted);
        assert_eq!(contents(&reopened), contents(&acknowledged));
        check_expected(&reopened);
        // The torn record was cut off: what comes next is read back after the intact records.
        store.apply(DefinitionChange::PutQueue(queue("/", "later"))).expect("apply");
        drop(store);
        let restarted = restarted.power_cut(PowerCut::LoseUnsynced);
        let (_, reopened) = memory_store(&restarted);
        assert_eq!(names(&reopened.queues, |record| record.name.clone()), ["later", "q2", "q4"]);
    }

    #[test]
    fn a_log_older_than_its_snapshot_is_not_replayed() {
        let dir = data_dir("stale-log");
        let log = dir.join("definitions.log");
        let (store, _) = open(&dir);
        store.apply(DefinitionChange::PutQueue(queue("/", "q"))).expect("apply");
        store.apply(DefinitionChange::DeleteQueue { vhost: "/".to_string(), name: "q".to_string() }).expect("apply");
        let old_log = std::fs::read(&log).expect("read");
        store.apply(DefinitionChange::PutQueue(queue("/", "q"))).expect("apply");
        store.compact().expect("compact");
        drop(store);
        // A crash after the new snapshot was renamed into place, before the new log was: the old
        // log's records are in the snapshot, and replaying them would delete q again.
        std::fs::write(&log, &old_log).expect("write");
        let (store, reopened) = open(&dir);
        assert_eq!(names(&reopened.queues, |record| record.name.clone()), ["q"]);
        store.apply(DefinitionChange::PutQueue(queue("/", "r"))).expect("apply");
        drop(store);
        assert_eq!(names(&open(&dir).1.queues, |record| record.name.clone()), ["q", "r"]);
    }

    /// A definitions file as main's format 3 wrote it (`to_vec_pretty` of the format-3 struct).
    const FORMAT_3_FILE: &str = r#"{
  "storage_format_version": 3,
  "exchanges": [
    {"vhost": "/", "name": "x", "kind": "topic", "auto_delete": false, "internal": false, "arguments_hex": ""}
  ],
  "queues": [
    {"vhost": "/", "name": "q", "auto_delete": false, "arguments_hex": "0000000f0a782d6d61782d6c656e677468490000000a", "type": "classic"}
  ],
  "bindings": [
    {"vhost": "/", "source": "x", "destination": "q", "destination_is_exchange": false, "routing_key": "k", "arguments_hex": ""}
  ],
  "users": [{"name": "guest", "password_hash": "hash", "tags": ["administrator"]}],
  "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
  "vhosts": [{"name": "/", "description": "Default virtual host", "tags": []}],
  "policies": []
}"#;

    #[test]
    fn a_format_3_file_is_upgraded_to_a_snapshot_and_a_log() {
        let dir = data_dir("format-3");
        std::fs::write(dir.join("definitions.json"), FORMAT_3_FILE).expect("write");
        let (store, loaded) = open(&dir);
        assert_eq!(loaded.storage_format_version, STORAGE_FORMAT_VERSION);
        assert_eq!(names(&loaded.queues, |record| record.name.clone()), ["q"]);
        assert_eq!(loaded.queues[0].arguments_hex, "0000000f0a782d6d61782d6c656e677468490000000a");
        assert_eq!(names(&loaded.bindings, |record| record.routing_key.clone()), ["k"]);
        assert_eq!(loaded.users.as_ref().map(Vec::len), Some(1));
        assert_eq!(loaded.permissions.as_ref().map(Vec::len), Some(1));
        let document: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("definitions.json")).expect("read")).expect("json");
        assert_eq!(document["storage_format_version"], STORAGE_FORMAT_VERSION);
        assert_eq!(decode_header(&std::fs::read(dir.join("definitions.log")).expect("log")), Some(loaded.log_generation));
        store.apply(DefinitionChange::PutQueue(queue("/", "new"))).expect("apply");
        drop(store);
        let (_, reopened) = open(&dir);
        assert_eq!(names(&reopened.queues, |record| record.name.clone()), ["new", "q"]);
        assert_eq!(contents(&reopened), Definitions { queues: reopened.queues.clone(), ..contents(&loaded) });
    }

    /// A definitions file as format 2 (the release before queue types) wrote it.
    const FORMAT_2_FILE: &str = r#"{
      "storage_format_version": 2,
      "exchanges": [{"vhost": "/", "name": "x", "kind": "direct", "auto_delete": false, "internal": false, "arguments_hex": ""}],
      "queues": [
        {"vhost": "/", "name": "q", "auto_delete": false, "arguments_hex": ""},
        {"vhost": "other", "name": "q2", "auto_delete": true, "arguments_hex": ""}
      ],
      "bindings": [],
      "users": [{"name": "guest", "password_hash": "hash", "tags": ["administrator"]}],
      "vhosts": [{"name": "/", "description": "", "tags": []}, {"name": "other", "description": "", "tags": []}],
      "policies": []
    }"#;

    #[test]
    fn the_format_version_and_queue_types_are_written_and_other_versions_are_refused() {
        let dir = data_dir("version");
        let path = dir.join("definitions.json");
        let (store, _) = open(&dir);
        store.apply(DefinitionChange::PutQueue(queue("/", "q"))).expect("apply");
        store.compact().expect("compact");
        drop(store);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains(&format!("\"storage_format_version\": {STORAGE_FORMAT_VERSION}")), "{text}");
        assert!(text.contains("\"type\": \"classic\""), "{text}");
        // A newer format, or format 1 (no version) with queues whose logs this build cannot read.
        std::fs::write(&path, text.replace(&format!(": {STORAGE_FORMAT_VERSION},"), ": 99,")).expect("write");
        let error = DefinitionsStore::open(&dir).err().expect("unknown version");
        assert!(matches!(error, StorageError::UnsupportedFormat { found: 99, .. }), "{error}");
        assert!(error.to_string().contains("empty data directory"), "{error}");
        assert!(error.to_string().contains("upgrades format 2 and format 3"), "{error}");
        std::fs::write(
            &path,
            r#"{"exchanges": [], "queues": [{"vhost": "/", "name": "q", "auto_delete": false, "arguments_hex": ""}], "bindings": []}"#,
        )
        .expect("write");
        assert!(matches!(DefinitionsStore::open(&dir).err(), Some(StorageError::UnsupportedFormat { found: 1, .. })));
        // Format 1 without queues has no logs: read as the current format.
        std::fs::write(&path, r#"{"exchanges": [], "queues": [], "bindings": []}"#).expect("write");
        assert_eq!(open(&dir).1.storage_format_version, STORAGE_FORMAT_VERSION);
    }

    #[test]
    fn a_format_2_file_is_upgraded_in_place_with_every_queue_classic() {
        let dir = data_dir("upgrade");
        let path = dir.join("definitions.json");
        std::fs::write(&path, FORMAT_2_FILE).expect("write");
        let (_, loaded) = open(&dir);
        assert_eq!(loaded.storage_format_version, STORAGE_FORMAT_VERSION);
        assert_eq!(loaded.queues.len(), 2);
        assert!(loaded.queues.iter().all(|queue| queue.queue_type == QueueType::Classic), "{:?}", loaded.queues);
        assert_eq!(loaded.exchanges.len(), 1);
        assert_eq!(loaded.users.as_ref().map(Vec::len), Some(1));
        assert_eq!(loaded.vhosts.as_ref().map(Vec::len), Some(2));
        // Written back in the new format, atomically (no temporary file left), and read the same.
        let text = std::fs::read_to_string(&path).expect("read");
        let document: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(document["storage_format_version"], STORAGE_FORMAT_VERSION);
        assert!(document["queues"].as_array().expect("queues").iter().all(|queue| queue["type"] == "classic"), "{text}");
        assert!(!path.with_extension("json.tmp").exists());
        assert_eq!(open(&dir).1, loaded);
    }

    #[test]
    fn a_queue_without_a_type_or_of_an_unknown_type_is_corrupt_in_the_current_format() {
        let dir = data_dir("types");
        let path = dir.join("definitions.json");
        let current =
            FORMAT_2_FILE.replace("\"storage_format_version\": 2", &format!("\"storage_format_version\": {STORAGE_FORMAT_VERSION}"));
        std::fs::write(&path, &current).expect("write");
        let error = DefinitionsStore::open(&dir).err().expect("a queue without a type");
        assert!(matches!(&error, StorageError::Corrupt { detail, .. } if detail.contains("type")), "{error}");
        let typed = current.replace("\"arguments_hex\": \"\"}", "\"arguments_hex\": \"\", \"type\": \"bogus\"}");
        std::fs::write(&path, typed).expect("write");
        let error = DefinitionsStore::open(&dir).err().expect("an unknown type");
        assert!(error.to_string().contains("unknown queue type 'bogus'"), "{error}");
        // Quorum is a type RabbitMQ has: the file reads, and the broker decides what to do with it.
        let quorum = current.replace("\"arguments_hex\": \"\"}", "\"arguments_hex\": \"\", \"type\": \"quorum\"}");
        std::fs::write(&path, quorum).expect("write");
        assert!(open(&dir).1.queues.iter().all(|queue| queue.queue_type == QueueType::Quorum));
    }
}
