//! The node's journal: one append-only file that every queue log's writes pass through, so a group
//! commit costs one fdatasync for the whole node however many queues it touched.
//!
//! Each journal entry is a redo record of a physical write: "these bytes go at this offset of this
//! segment file". The syncer appends the batch's writes here, fdatasyncs the journal once, and only
//! then confirms; the segment files get the same writes without a sync. A checkpoint (when the
//! journal has grown past [`JOURNAL_BYTES_MAX`]) fdatasyncs the segment files written since the
//! previous checkpoint and their directories, then starts a new journal file and deletes the old.
//!
//! At start, before queue logs are opened, [`replay`] writes every entry of the journal files left
//! behind into its segment file again. Writing the same bytes at the same offset is idempotent, so
//! replaying entries whose writes did reach the segment is harmless. An entry whose segment file
//! is gone is skipped when the queue has a newer segment (the old one was settled and deleted or
//! recycled since) or no directory (the queue was deleted); it recreates the file when the segment
//! would be the queue's newest (it was created in the batch that stopped).
//!
//! Entry layout: `length u32 | crc32c u32 | target_length u16 | target | offset u64 | payload`, with
//! `length` counting everything after the CRC and the CRC covering the same bytes seeded with the
//! journal file's sequence number, so an entry left over in a reused file is never replayed.
//! `target` is the segment's path relative to the data directory.

use crate::file_cache::{open_segment_files_max, FileCache, FileHandle};
use crate::file_system::{self, FileSystem, OpenMode, SharedFileSystem, StorageFile};
use crate::StorageError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A checkpoint starts once the current journal file holds this many bytes.
pub const JOURNAL_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// The largest entry a journal accepts (a record is at most 600 MiB; a batch splits per segment).
pub const JOURNAL_ENTRY_BYTES_MAX: usize = 1024 * 1024 * 1024;
const ENTRY_HEADER_BYTES: usize = 8;
const SUFFIX: &str = ".wal";
/// A checkpointed journal file kept for reuse.
const SPARE_SUFFIX: &str = ".spare";
/// How many checkpointed journal files are kept for reuse; more are deleted.
///
/// Deleting a large file makes ext4 free its extents, and a concurrent fdatasync of the journal
/// waits for that commit (measured: a 64 MiB journal file deleted every checkpoint gave confirms
/// 40-80 ms stalls at 104,000 msg/s of 1 KiB; a 1 GiB one, 1.2 s). A reused file is overwritten in
/// place: nothing is freed, and its blocks are already allocated. Entries left from its previous
/// life fail their checksum, which is seeded with the file's sequence.
pub const JOURNAL_SPARES_MAX: usize = 2;

/// One replayable write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// The segment file, relative to the data directory.
    pub target: String,
    /// Where in it.
    pub offset: u64,
    /// What.
    pub payload: Vec<u8>,
}

/// The journal being written, reaching the disk through its [`FileSystem`].
#[derive(Debug)]
pub struct Journal {
    directory: PathBuf,
    file: Arc<dyn StorageFile>,
    path: PathBuf,
    sequence: u64,
    /// Bytes written to the current file (the next entry's offset).
    written_bytes: u64,
    /// Entries appended and not yet written.
    pending: Vec<u8>,
    /// The size at which the current file asks for a checkpoint ([`JOURNAL_BYTES_MAX`] unless set).
    checkpoint_bytes: u64,
    file_system: SharedFileSystem,
}

fn file_name(sequence: u64) -> String {
    format!("{sequence:020}{SUFFIX}")
}

fn checksum(sequence: u64, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&sequence.to_be_bytes()), bytes)
}

/// The journal files in `directory`, oldest first, with their sequence numbers.
fn journal_files(file_system: &dyn FileSystem, directory: &Path) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let mut files = Vec::new();
    let names = file_system.list_directory(directory).map_err(|error| StorageError::io(directory, error))?;
    for name in names {
        if let Some(sequence) = name.strip_suffix(SUFFIX).and_then(|stem| stem.parse::<u64>().ok()) {
            files.push((sequence, directory.join(&name)));
        }
    }
    files.sort();
    Ok(files)
}

impl Journal {
    /// Opens the journal directory: returns the entries left by the previous run (to [`replay`]
    /// before anything else writes segments) and a journal that writes a new file after them.
    pub fn open(directory: &Path) -> Result<(Journal, Vec<JournalEntry>), StorageError> {
        Journal::open_in(file_system::real(), directory)
    }

    /// [`Journal::open`] in `file_system`.
    pub fn open_in(file_system: SharedFileSystem, directory: &Path) -> Result<(Journal, Vec<JournalEntry>), StorageError> {
        let created = !file_system.exists(directory);
        file_system.create_dir_all(directory).map_err(|error| StorageError::io(directory, error))?;
        if let (true, Some(parent)) = (created, directory.parent()) {
            // Else a power cut can take the new directory, and every journal file in it, away.
            sync_directory(&*file_system, parent)?;
        }
        let mut entries = Vec::new();
        let files = journal_files(&*file_system, directory)?;
        for (sequence, path) in &files {
            read_entries(&*file_system, path, *sequence, &mut entries)?;
        }
        let sequence = files.last().map_or(1, |(sequence, _)| sequence + 1);
        let path = directory.join(file_name(sequence));
        let file = file_system.open(&path, OpenMode::CreateNew).map_err(|error| StorageError::io(&path, error))?;
        sync_directory(&*file_system, directory)?;
        let journal = Journal {
            directory: directory.to_path_buf(),
            file,
            path,
            sequence,
            written_bytes: 0,
            pending: Vec::new(),
            checkpoint_bytes: JOURNAL_BYTES_MAX,
            file_system,
        };
        Ok((journal, entries))
    }

    /// Makes the current file ask for a checkpoint at `bytes` instead of [`JOURNAL_BYTES_MAX`]
    /// (tests use a small size to rotate through several files).
    pub fn set_checkpoint_bytes(&mut self, bytes: u64) {
        self.checkpoint_bytes = bytes;
    }

    /// Appends an entry to the batch being built.
    pub fn append(&mut self, target: &str, offset: u64, payload: &[u8]) {
        assert!(target.len() <= usize::from(u16::MAX), "journal targets are relative segment paths");
        let length = 2 + target.len() + 8 + payload.len();
        assert!(length <= JOURNAL_ENTRY_BYTES_MAX, "journal entry of {length} bytes");
        let start = self.pending.len();
        self.pending.extend_from_slice(&(length as u32).to_be_bytes());
        self.pending.extend_from_slice(&[0; 4]);
        self.pending.extend_from_slice(&(target.len() as u16).to_be_bytes());
        self.pending.extend_from_slice(target.as_bytes());
        self.pending.extend_from_slice(&offset.to_be_bytes());
        self.pending.extend_from_slice(payload);
        let crc = checksum(self.sequence, &self.pending[start + ENTRY_HEADER_BYTES..]);
        self.pending[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
    }

    /// Whether entries wait to be written.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes the batch's entries and fdatasyncs the journal: after this, the batch survives a
    /// crash. On failure the entries stay pending and the file is cut back, so the next attempt
    /// rewrites them whole.
    pub fn write_and_sync(&mut self) -> Result<(), StorageError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let written = self.file.write_all_at(&self.pending, self.written_bytes).and_then(|()| self.file.sync_data());
        if let Err(error) = written {
            let _ = self.file.set_len(self.written_bytes);
            return Err(StorageError::io(&self.path, error));
        }
        self.written_bytes += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Whether the current file is large enough for a checkpoint.
    pub fn needs_checkpoint(&self) -> bool {
        self.written_bytes >= self.checkpoint_bytes
    }

    /// Ends a checkpoint, once every segment written since the last one is synced: starts a new
    /// journal file and deletes the older ones, whose writes are all on disk now.
    pub fn start_new_file(&mut self) -> Result<(), StorageError> {
        let sequence = self.rotate()?;
        remove_files_before(&*self.file_system, &self.directory, sequence)
    }

    /// Starts a new journal file (a spare when one is ready) and keeps the older ones: a
    /// background checkpoint syncs the segments their entries wrote, then retires them with
    /// [`remove_files_before`]. Returns the new file's sequence.
    pub fn rotate(&mut self) -> Result<u64, StorageError> {
        assert!(self.pending.is_empty(), "a checkpoint follows a written batch");
        let sequence = self.sequence + 1;
        let path = self.directory.join(file_name(sequence));
        if let Some(spare) = spare_files(&*self.file_system, &self.directory)?.into_iter().next() {
            self.file_system.rename(&spare, &path).map_err(|error| StorageError::io(&spare, error))?;
        }
        let file = self.file_system.open(&path, OpenMode::CreateReadWrite).map_err(|error| StorageError::io(&path, error))?;
        sync_directory(&*self.file_system, &self.directory)?;
        self.file = file;
        self.path = path;
        self.sequence = sequence;
        self.written_bytes = 0;
        Ok(sequence)
    }

    /// The journal's directory.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// The file system it writes to.
    pub fn file_system(&self) -> &SharedFileSystem {
        &self.file_system
    }
}

/// Retires the journal files older than `sequence` (their segments are synced): kept as spares
/// for [`Journal::rotate`] up to [`JOURNAL_SPARES_MAX`], deleted beyond. Then syncs the directory.
pub fn remove_files_before(file_system: &dyn FileSystem, directory: &Path, sequence: u64) -> Result<(), StorageError> {
    let mut spares = spare_files(file_system, directory)?.len();
    for (old_sequence, old_path) in journal_files(file_system, directory)? {
        if old_sequence >= sequence {
            continue;
        }
        if spares < JOURNAL_SPARES_MAX {
            let spare = directory.join(format!("{old_sequence:020}{SPARE_SUFFIX}"));
            file_system.rename(&old_path, &spare).map_err(|error| StorageError::io(&old_path, error))?;
            spares += 1;
        } else {
            file_system.remove_file(&old_path).map_err(|error| StorageError::io(&old_path, error))?;
        }
    }
    sync_directory(file_system, directory)
}

/// The spare journal files in `directory`.
fn spare_files(file_system: &dyn FileSystem, directory: &Path) -> Result<Vec<PathBuf>, StorageError> {
    let names = file_system.list_directory(directory).map_err(|error| StorageError::io(directory, error))?;
    let mut spares = Vec::new();
    for name in names {
        if name.ends_with(SPARE_SUFFIX) {
            spares.push(directory.join(name));
        }
    }
    spares.sort();
    Ok(spares)
}

/// fdatasyncs a directory, so files created, renamed or deleted in it stay so after a power loss.
pub fn sync_directory(file_system: &dyn FileSystem, directory: &Path) -> Result<(), StorageError> {
    file_system.sync_directory(directory).map_err(|error| StorageError::io(directory, error))
}

/// How much of a journal file one read takes while its entries are read.
const ENTRY_READ_BUFFER_BYTES: usize = 1 << 20;

/// Reads the whole entries of one journal file; a torn or corrupt entry ends the file (it was the
/// batch being written when the process stopped, and was not confirmed). The file is read in
/// order up to that entry, not whole: a journal file is a reused spare whose older content fails
/// its checksums (another sequence), and reading all of it cost every start up to 64 MiB of reads
/// however little the previous run journaled since its last checkpoint.
fn read_entries(file_system: &dyn FileSystem, path: &Path, sequence: u64, entries: &mut Vec<JournalEntry>) -> Result<(), StorageError> {
    let io = |error: std::io::Error| StorageError::io(path, error);
    let file = file_system.open(path, OpenMode::Read).map_err(io)?;
    let file_bytes = file.len().map_err(io)?;
    let buffer_bytes = usize::try_from(file_bytes).unwrap_or(usize::MAX).clamp(ENTRY_HEADER_BYTES, ENTRY_READ_BUFFER_BYTES);
    let mut reader = std::io::BufReader::with_capacity(buffer_bytes, file_system::SequentialReader::new(&*file, 0));
    let mut at = 0u64;
    let mut head = [0u8; ENTRY_HEADER_BYTES];
    while file_bytes - at >= ENTRY_HEADER_BYTES as u64 {
        std::io::Read::read_exact(&mut reader, &mut head).map_err(io)?;
        let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        let body_start = at + ENTRY_HEADER_BYTES as u64;
        if !(10..=JOURNAL_ENTRY_BYTES_MAX).contains(&length) || file_bytes - body_start < length as u64 {
            break;
        }
        let mut body = vec![0u8; length];
        std::io::Read::read_exact(&mut reader, &mut body).map_err(io)?;
        if checksum(sequence, &body) != crc {
            break;
        }
        let target_length = usize::from(u16::from_be_bytes([body[0], body[1]]));
        if 2 + target_length + 8 > length {
            break;
        }
        let target = String::from_utf8_lossy(&body[2..2 + target_length]).into_owned();
        let mut offset_bytes = [0u8; 8];
        offset_bytes.copy_from_slice(&body[2 + target_length..2 + target_length + 8]);
        body.drain(..2 + target_length + 8);
        entries.push(JournalEntry { target, offset: u64::from_be_bytes(offset_bytes), payload: body });
        at = body_start + length as u64;
    }
    if at != file_bytes {
        // A torn last entry (an unconfirmed batch) or what a reused file held before.
        tracing::debug!(file = %path.display(), offset = at, "journal replay of this file ends here");
    }
    Ok(())
}

/// How a replay went.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplayStats {
    /// Entries written into their segment again.
    pub applied: usize,
    /// Entries whose segment was deleted or recycled since (a newer segment of the queue exists)
    /// or whose queue was deleted.
    pub skipped: usize,
}

/// Writes every entry into its segment file under `data_directory` again (see the module comment
/// for which entries are skipped), then fdatasyncs the files it wrote and their directories.
///
/// The segments go through a bounded [`FileCache`]: a journal may name more segments than the
/// process may hold open (every queue written since the last checkpoint), so a file closed to make
/// room is reopened when an entry names it again, and synced at the end through a descriptor
/// opened for the sync (fdatasync flushes a file's dirty pages whichever descriptor asks).
pub fn replay(
    data_directory: &Path,
    entries: &[JournalEntry],
    is_newer_segment: impl Fn(&dyn FileSystem, &Path) -> bool,
) -> Result<ReplayStats, StorageError> {
    replay_in(file_system::real(), data_directory, entries, is_newer_segment)
}

/// [`replay`] in `file_system`.
pub fn replay_in(
    file_system: SharedFileSystem,
    data_directory: &Path,
    entries: &[JournalEntry],
    is_newer_segment: impl Fn(&dyn FileSystem, &Path) -> bool,
) -> Result<ReplayStats, StorageError> {
    replay_with_open_files_max(file_system, data_directory, entries, is_newer_segment, open_segment_files_max())
}

/// Past this many segment files written, a replay makes them durable with one `syncfs` of the
/// file system rather than one fdatasync each (and one fsync per directory): after a crash with
/// 100,000 queues written since the last checkpoint, the per-file syncs alone took minutes.
pub const REPLAY_FILE_SYNCS_MAX: usize = 64;

/// [`replay`], holding at most `open_files_max` segment files open at a time.
fn replay_with_open_files_max(
    file_system: SharedFileSystem,
    data_directory: &Path,
    entries: &[JournalEntry],
    is_newer_segment: impl Fn(&dyn FileSystem, &Path) -> bool,
    open_files_max: usize,
) -> Result<ReplayStats, StorageError> {
    let cache = FileCache::with_file_system(open_files_max, file_system.clone());
    let mut stats = ReplayStats::default();
    // Each segment written, in the order first written, with its file in the cache.
    let mut touched: Vec<PathBuf> = Vec::new();
    let mut handles: HashMap<PathBuf, FileHandle> = HashMap::new();
    for entry in entries {
        let path = data_directory.join(&entry.target);
        let Some(queue_directory) = path.parent() else {
            stats.skipped += 1;
            continue;
        };
        let known = handles.get(&path).copied();
        if known.is_none()
            && (!file_system.is_dir(queue_directory) || (!file_system.exists(&path) && !is_newer_segment(&*file_system, &path)))
        {
            stats.skipped += 1;
            continue;
        }
        let file = match known.and_then(|handle| cache.get(handle)) {
            Some(file) => file,
            None => {
                let (handle, file) = cache.open(&path, OpenMode::CreateReadWrite).map_err(|error| StorageError::io(&path, error))?;
                if handles.insert(path.clone(), handle).is_none() {
                    touched.push(path.clone());
                }
                file
            }
        };
        file.write_all_at(&entry.payload, entry.offset).map_err(|error| StorageError::io(&path, error))?;
        stats.applied += 1;
    }
    if touched.len() > REPLAY_FILE_SYNCS_MAX {
        // One syncfs makes every replayed write and every file the replay created durable.
        drop(handles);
        drop(cache);
        file_system.sync_file_system(data_directory).map_err(|error| StorageError::io(data_directory, error))?;
        return Ok(stats);
    }
    let mut directories: Vec<&Path> = Vec::new();
    for path in &touched {
        let cached = handles.get(path).and_then(|handle| cache.get(*handle));
        let file = match cached {
            Some(file) => file,
            None => file_system.open(path, OpenMode::Read).map_err(|error| StorageError::io(path, error))?,
        };
        file.sync_data().map_err(|error| StorageError::io(path, error))?;
        if let Some(directory) = path.parent() {
            if directories.last() != Some(&directory) {
                directories.push(directory);
            }
        }
    }
    // A queue's segments are adjacent in `touched` only when its entries were: dedupe fully.
    directories.sort_unstable();
    directories.dedup();
    for directory in directories {
        sync_directory(&*file_system, directory)?;
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temporary_directory(name: &str) -> PathBuf {
        let directory = std::env::temp_dir().join(format!("lepus-journal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).expect("create");
        directory
    }

    #[test]
    fn entries_survive_a_reopen_and_replay_rewrites_segments() {
        let data = temporary_directory("replay");
        std::fs::create_dir_all(data.join("queues/q")).expect("create");
        std::fs::write(data.join("queues/q/00000000000000000001.seg"), b"abcXXXghi").expect("write");
        let (mut journal, left) = Journal::open(&data.join("journal")).expect("open");
        assert!(left.is_empty());
        journal.append("queues/q/00000000000000000001.seg", 3, b"def");
        journal.append("queues/q/00000000000000000009.seg", 0, b"new");
        journal.append("queues/gone/00000000000000000001.seg", 0, b"lost");
        journal.write_and_sync().expect("sync");
        journal.append("queues/q/00000000000000000001.seg", 9, b"unsynced");
        drop(journal);
        let (_journal, entries) = Journal::open(&data.join("journal")).expect("reopen");
        assert_eq!(entries.len(), 3, "the unwritten batch is not there");
        let stats = replay(&data, &entries, |_, path| path.ends_with("00000000000000000009.seg")).expect("replay");
        assert_eq!(stats, ReplayStats { applied: 2, skipped: 1 });
        assert_eq!(std::fs::read(data.join("queues/q/00000000000000000001.seg")).expect("read"), b"abcdefghi");
        assert_eq!(std::fs::read(data.join("queues/q/00000000000000000009.seg")).expect("read"), b"new");
        let _ = std::fs::remove_dir_all(&data);
    }

    /// A journal naming more segments than the replay may hold open, its entries interleaved so
    /// each segment is closed and reopened: every write lands, and no more than the bound of
    /// descriptors is held (other tests of this binary open a few files meanwhile). The journal
    /// of a crashed node names every queue written since its last checkpoint.
    #[test]
    fn a_replay_of_more_segments_than_it_may_hold_open_writes_them_all() {
        let data = temporary_directory("bounded");
        let queues = 40usize;
        for queue in 0..queues {
            std::fs::create_dir_all(data.join(format!("queues/q{queue}"))).expect("create");
        }
        let mut entries = Vec::new();
        for round in 0..3u64 {
            for queue in 0..queues {
                let target = format!("queues/q{queue}/00000000000000000000.seg");
                entries.push(JournalEntry { target, offset: round * 4, payload: format!("{queue:03}{round}").into_bytes() });
            }
        }
        let descriptors = || std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count();
        let before = descriptors();
        let highest = std::sync::atomic::AtomicUsize::new(0);
        let stats = replay_with_open_files_max(
            file_system::real(),
            &data,
            &entries,
            // Asked once per segment, each new (the batch that stopped had just begun it), while
            // the replay holds the segments before it: the moment to count descriptors.
            |_, _| {
                highest.fetch_max(descriptors(), std::sync::atomic::Ordering::Relaxed);
                true
            },
            4,
        )
        .expect("replay");
        assert_eq!(stats, ReplayStats { applied: queues * 3, skipped: 0 });
        for queue in 0..queues {
            let contents = std::fs::read(data.join(format!("queues/q{queue}/00000000000000000000.seg"))).expect("read");
            assert_eq!(contents, format!("{queue:03}0{queue:03}1{queue:03}2").into_bytes());
        }
        let held = highest.into_inner().saturating_sub(before);
        assert!(held <= 4 + 8, "replay held {held} descriptors with a bound of 4");
        let _ = std::fs::remove_dir_all(&data);
    }

    /// Past [`REPLAY_FILE_SYNCS_MAX`] segments, one sync of the file system replaces the
    /// fdatasync of each: a power cut right after the replay keeps every write and every file it
    /// created; with fewer segments each is synced alone, which keeps them too.
    #[test]
    fn a_replay_into_many_segments_is_made_durable_by_one_sync_of_the_file_system() {
        use crate::memory_file_system::{MemoryFileSystem, PowerCut};
        for queues in [REPLAY_FILE_SYNCS_MAX, REPLAY_FILE_SYNCS_MAX + 1, 3 * REPLAY_FILE_SYNCS_MAX] {
            let memory = MemoryFileSystem::new();
            let data = Path::new("/data");
            for queue in 0..queues {
                memory.create_durable_directory(&data.join(format!("queues/q{queue}")));
            }
            let entries: Vec<JournalEntry> = (0..queues)
                .map(|queue| JournalEntry {
                    target: format!("queues/q{queue}/00000000000000000000.seg"),
                    offset: 0,
                    payload: format!("{queue:04}").into_bytes(),
                })
                .collect();
            let syncs = memory.syncs();
            let stats = replay_in(Arc::new(memory.clone()), data, &entries, |_, _| true).expect("replay");
            assert_eq!(stats.applied, queues);
            let syncs = memory.syncs() - syncs;
            if queues > REPLAY_FILE_SYNCS_MAX {
                assert_eq!(syncs, 1, "{queues} segments: one sync of the file system");
            } else {
                assert_eq!(syncs, 2 * queues as u64, "{queues} segments: each file and its directory");
            }
            let restarted = memory.power_cut(PowerCut::LoseUnsynced);
            for queue in 0..queues {
                let contents = restarted.contents(&data.join(format!("queues/q{queue}/00000000000000000000.seg"))).expect("durable");
                assert_eq!(contents, format!("{queue:04}").into_bytes());
            }
        }
    }

    #[test]
    fn a_torn_or_stale_entry_ends_the_file_and_a_checkpoint_removes_old_files() {
        let data = temporary_directory("torn");
        let directory = data.join("journal");
        let (mut journal, _) = Journal::open(&directory).expect("open");
        journal.append("a", 0, b"one");
        journal.append("a", 3, b"two");
        journal.write_and_sync().expect("sync");
        let path = journal.path.clone();
        let sequence = journal.sequence;
        drop(journal);
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let mut entries = Vec::new();
        read_entries(&*file_system::real(), &path, sequence, &mut entries).expect("read");
        assert_eq!(entries.len(), 1, "the flipped entry and what follows are dropped");
        entries.clear();
        read_entries(&*file_system::real(), &path, sequence + 1, &mut entries).expect("read");
        assert!(entries.is_empty(), "entries checksummed for another file's sequence are stale");
        let (mut journal, left) = Journal::open(&directory).expect("reopen");
        assert_eq!(left.len(), 1);
        journal.start_new_file().expect("checkpoint");
        assert_eq!(journal_files(&*file_system::real(), &directory).expect("list").len(), 1, "older files are retired");
        assert_eq!(spare_files(&*file_system::real(), &directory).expect("spares").len(), 2, "and kept for reuse (both older files)");
        let _ = std::fs::remove_dir_all(&data);
    }

    #[test]
    fn a_reused_journal_file_never_replays_its_previous_entries() {
        let data = temporary_directory("reuse");
        let directory = data.join("journal");
        let (mut journal, _) = Journal::open(&directory).expect("open");
        for index in 0..10u64 {
            journal.append("old", index, b"a previous life's entry");
        }
        journal.write_and_sync().expect("sync");
        journal.start_new_file().expect("checkpoint: the file becomes a spare");
        journal.start_new_file().expect("rotate into the spare");
        assert!(spare_files(&*file_system::real(), &directory).expect("spares").len() <= JOURNAL_SPARES_MAX);
        journal.append("new", 0, b"x");
        journal.write_and_sync().expect("sync");
        drop(journal);
        let (_, entries) = Journal::open(&directory).expect("reopen");
        assert_eq!(entries, vec![JournalEntry { target: "new".to_string(), offset: 0, payload: b"x".to_vec() }]);
        let _ = std::fs::remove_dir_all(&data);
    }
}
