//! Lepus's storage: what must survive a restart.
//!
//! - [`data_dir_lock`]: the exclusive lock one broker process holds on its data directory.
//! - [`definitions`]: durable exchanges, queues, bindings, users, vhosts and policies: a snapshot
//!   and a checksummed change log ([`definitions_log`]) replayed onto it ([`definitions_state`]).
//! - [`queue_log`]: one log per durable queue, a directory of segment files that are recycled
//!   rather than deleted; each record carries a length, a CRC32C over the record and its
//!   segment's identity, a term and the message's queue position ([`record`]). Recovery replays
//!   it and ends each segment at its seal or its first invalid record.
//! - [`journal`]: the node journal: every journaled segment write as a redo entry, so a group
//!   commit fdatasyncs one file for the whole node; replayed into the segments at start.
//! - [`segment_index`]: per log, the summaries of its sealed segments (what each does to the
//!   live and delivered positions), so recovery reads a few bytes per segment, not the segment.
//! - [`syncer`]: one thread that writes and fdatasyncs every dirty log in a batch (group commit)
//!   and only then runs the callbacks that send publisher confirms.
//! - [`file_cache`]: the node-wide, bounded cache of open segment files (least recently used
//!   closed first), so an idle queue holds no file descriptor.
//! - [`stream`]: the stream store: segments of osiris-format chunks with an offset and
//!   timestamp index, readers from an offset specification, tracking of consumer offsets and
//!   publisher sequences, retention by whole segments; written and committed by the syncer.
//! - [`file_system`]: the seam through which all of the above reach the disk (open, positioned
//!   reads and writes, fdatasync, rename, directory sync, unlink, list), so tests can plug in
//!   [`memory_file_system`], which loses unsynced writes at a power cut, tears writes, fails
//!   with ENOSPC or EIO and flips bits.

pub mod data_dir_lock;
pub mod definitions;
pub mod definitions_log;
pub mod definitions_state;
pub mod entropy;
#[cfg(test)]
mod fault_tests;
pub mod file_cache;
pub mod file_system;
#[cfg(any(test, feature = "test-support"))]
pub mod fuzz_checks;
pub mod janitor;
pub mod journal;
#[cfg(any(test, feature = "test-support"))]
pub mod memory_file_system;
#[cfg(test)]
mod publish_prefix_tests;
pub mod quarantine;
#[cfg(test)]
mod quarantine_tests;
pub mod queue_log;
pub mod range_set;
pub mod record;
pub mod segment_index;
pub mod stream;
pub mod syncer;

/// The storage format of a data directory, in its definitions snapshot. Format 4 keeps the
/// definitions as a snapshot and a change log; format 3 recorded each queue's type in one file
/// rewritten on every change; format 2 had queues without a type (all classic). Formats 3 and 2
/// are upgraded to 4 at start. Segments have their own version ([`record::SEGMENT_FORMAT_VERSION`]),
/// unchanged by formats 3 and 4; segments of version 2 and 3 are both read.
pub const STORAGE_FORMAT_VERSION: u32 = 4;

/// A storage failure, with the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An I/O error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A file written in a storage format this build does not read.
    #[error(
        "{path}: storage format {found} is not supported: this build reads data directories of format {supported} (with \
         segments of format {oldest_segments} to {segments}) and upgrades format 2 and format 3 at start; start with an \
         empty data directory",
        supported = STORAGE_FORMAT_VERSION,
        oldest_segments = crate::record::SEGMENT_FORMAT_VERSION_OLDEST_READ,
        segments = crate::record::SEGMENT_FORMAT_VERSION
    )]
    UnsupportedFormat {
        /// The file.
        path: String,
        /// The format version it says (or appears) to have.
        found: u32,
    },
    /// A file that does not parse.
    #[error("{path}: corrupt: {detail}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
}

impl StorageError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> StorageError {
        StorageError::Io { path: path.display().to_string(), source }
    }
}

/// The file in the data directory that says the previous run shut down cleanly (every delivered
/// marker written), so recovered messages need not all be flagged redelivered.
pub const CLEAN_SHUTDOWN_MARKER: &str = "clean-shutdown";

/// Whether the previous run left the clean-shutdown marker; removes it durably before this run
/// writes anything. Removed without a directory sync, a power cut could bring the marker back,
/// and the next start would take this run's crash for a clean shutdown and hand out recovered,
/// already delivered messages without their `redelivered` flag.
pub fn take_clean_shutdown_marker(
    file_system: &dyn file_system::FileSystem,
    data_directory: &std::path::Path,
) -> Result<bool, StorageError> {
    let marker = data_directory.join(CLEAN_SHUTDOWN_MARKER);
    if !file_system.exists(&marker) {
        return Ok(false);
    }
    file_system::remove_durably(file_system, &marker).map_err(|error| StorageError::io(&marker, error))?;
    Ok(true)
}

/// Leaves the clean-shutdown marker for the next start, durably (file and directory synced).
pub fn write_clean_shutdown_marker(
    file_system: &dyn file_system::FileSystem,
    data_directory: &std::path::Path,
) -> Result<(), StorageError> {
    let marker = data_directory.join(CLEAN_SHUTDOWN_MARKER);
    let file = file_system.open(&marker, file_system::OpenMode::CreateReadWrite).map_err(|error| StorageError::io(&marker, error))?;
    file.sync_data().map_err(|error| StorageError::io(&marker, error))?;
    file_system.sync_directory(data_directory).map_err(|error| StorageError::io(data_directory, error))
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new content: write a
/// temporary file, fsync it, rename it over, fsync the directory.
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<(), StorageError> {
    use std::io::Write;
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temporary).map_err(|error| StorageError::io(&temporary, error))?;
    file.write_all(bytes).map_err(|error| StorageError::io(&temporary, error))?;
    file.sync_all().map_err(|error| StorageError::io(&temporary, error))?;
    std::fs::rename(&temporary, path).map_err(|error| StorageError::io(path, error))?;
    if let Some(directory) = path.parent() {
        let directory_file = std::fs::File::open(directory).map_err(|error| StorageError::io(directory, error))?;
        directory_file.sync_all().map_err(|error| StorageError::io(directory, error))?;
    }
    Ok(())
}
