//! A node-wide, bounded cache of open segment files, so that a durable queue holds no file
//! descriptor while it is idle.
//!
//! Each queue log used to keep its directory and its active segment open (the latter twice with a
//! journal) for its whole life: three descriptors per durable queue, so a few hundred queues filled
//! the common soft limit of 1,024 descriptors and the next declare, definitions write or journal
//! rotation failed with `EMFILE`, nacking the confirms of every queue in that batch. RabbitMQ has a
//! file handle cache for the same reason. Here a log holds a [`FileHandle`] (a slot index and that
//! slot's generation) instead of a `File`; the cache holds at most [`FileCache::capacity`] files
//! and closes the least recently used one to make room. A log whose file was closed reopens it by
//! path on its next write, so an idle queue costs no descriptor and an active one keeps its
//! segment cached.
//!
//! A lookup takes the cache's mutex once, compares the generation, moves the slot to the front of
//! an index-linked LRU list and clones an `Arc<File>`: no system call and no allocation. The
//! syncer makes one lookup per log per batch, never one per message. The `Arc` lets a user finish
//! its write or sync on a file the cache closes meanwhile (the descriptor closes when the last
//! clone drops), so descriptors in use can exceed the bound by the number of threads doing file
//! I/O at that moment; the reserve of [`open_segment_files_max`] covers them.

use crate::file_system::{self, OpenMode, SharedFileSystem, StorageFile};
use parking_lot::Mutex;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The share of the process's descriptor limit (`RLIMIT_NOFILE`, soft) left to everything but
/// cached segment files: client sockets, the journal, definitions writes, directory syncs, the
/// janitor, the HTTP listeners and files briefly opened past the cache. Half, and at least
/// [`DESCRIPTORS_RESERVED_MIN`], so a node at the common limit of 1,024 caches 512 segment files
/// and still accepts hundreds of connections.
pub const DESCRIPTORS_RESERVED_DIVISOR: u64 = 2;
/// The fewest descriptors kept out of the cache, however low the limit.
pub const DESCRIPTORS_RESERVED_MIN: u64 = 64;
/// The fewest files the cache holds, even under a tiny limit: below this, queues active at the
/// same time would evict each other's segment on every batch.
pub const OPEN_SEGMENT_FILES_MIN: usize = 8;
/// The most files the cache holds, however high the limit (its slot array grows up to this).
pub const OPEN_SEGMENT_FILES_MAX_CEILING: usize = 65_536;

/// How many segment files the node keeps open: the soft `RLIMIT_NOFILE` minus the reserve (see
/// [`DESCRIPTORS_RESERVED_DIVISOR`]), between [`OPEN_SEGMENT_FILES_MIN`] and
/// [`OPEN_SEGMENT_FILES_MAX_CEILING`]. Read once, when the node-wide cache is first used.
pub fn open_segment_files_max() -> usize {
    open_segment_files_max_for(descriptor_limit())
}

/// [`open_segment_files_max`] for a given descriptor limit.
pub fn open_segment_files_max_for(descriptor_limit: u64) -> usize {
    let reserved = (descriptor_limit / DESCRIPTORS_RESERVED_DIVISOR).max(DESCRIPTORS_RESERVED_MIN);
    let available = usize::try_from(descriptor_limit.saturating_sub(reserved)).unwrap_or(usize::MAX);
    available.clamp(OPEN_SEGMENT_FILES_MIN, OPEN_SEGMENT_FILES_MAX_CEILING)
}

/// The process's soft descriptor limit (1,024 when it cannot be read, the usual default).
fn descriptor_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur
    } else {
        1024
    }
}

/// A file in the cache: valid while its slot keeps the same generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHandle {
    slot: u32,
    generation: u64,
}

/// No slot: the end of the LRU list.
const NONE: u32 = u32::MAX;

impl FileHandle {
    /// A handle to no file: every lookup misses and removing it does nothing. A queue log holds it
    /// while its active segment has no file yet (it makes the file at its first write).
    pub const DETACHED: FileHandle = FileHandle { slot: NONE, generation: u64::MAX };
}

#[derive(Debug)]
struct Slot {
    file: Option<Arc<dyn StorageFile>>,
    /// Bumped whenever the slot's file is closed, so older handles miss.
    generation: u64,
    /// The LRU list: towards the most recently used, and towards the least.
    newer: u32,
    older: u32,
}

#[derive(Debug)]
struct Slots {
    slots: Vec<Slot>,
    /// Slots without a file.
    free: Vec<u32>,
    newest: u32,
    oldest: u32,
}

/// What the cache has done, for metrics and tests. Counters only grow.
#[derive(Debug, Default)]
pub struct FileCacheStats {
    /// Files opened into the cache (first opens and reopens after an eviction).
    pub opens: AtomicU64,
    /// Files closed to make room for another.
    pub evictions: AtomicU64,
}

/// A bounded set of open files, least recently used closed first.
pub struct FileCache {
    capacity: usize,
    /// Where the files are opened.
    file_system: SharedFileSystem,
    slots: Mutex<Slots>,
    stats: FileCacheStats,
}

impl std::fmt::Debug for FileCache {
    /// The bound and the count, not every slot: each queue log (and its debug output) refers to
    /// the node's cache.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("FileCache").field("capacity", &self.capacity).field("open_files", &self.open_files()).finish()
    }
}

static NODE_CACHE: OnceLock<Arc<FileCache>> = OnceLock::new();

impl FileCache {
    /// A cache holding at most `capacity` open files (at least one) of the real disk.
    pub fn new(capacity: usize) -> Arc<FileCache> {
        FileCache::with_file_system(capacity, file_system::real())
    }

    /// A cache holding at most `capacity` open files (at least one) of `file_system`.
    pub fn with_file_system(capacity: usize, file_system: SharedFileSystem) -> Arc<FileCache> {
        let capacity = capacity.clamp(1, NONE as usize);
        let slots = Slots { slots: Vec::new(), free: Vec::new(), newest: NONE, oldest: NONE };
        Arc::new(FileCache { capacity, file_system, slots: Mutex::new(slots), stats: FileCacheStats::default() })
    }

    /// The file system its files are opened in (and which the logs using it reach the disk through).
    pub fn file_system(&self) -> &SharedFileSystem {
        &self.file_system
    }

    /// The node's cache, bounded by [`open_segment_files_max`].
    pub fn node() -> &'static Arc<FileCache> {
        NODE_CACHE.get_or_init(|| FileCache::new(open_segment_files_max()))
    }

    /// How many files it holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many files it holds now.
    pub fn open_files(&self) -> usize {
        let slots = self.slots.lock();
        slots.slots.len() - slots.free.len()
    }

    /// What it has done.
    pub fn stats(&self) -> &FileCacheStats {
        &self.stats
    }

    /// The file behind `handle`, if the cache still holds it; marks it most recently used.
    #[inline]
    pub fn get(&self, handle: FileHandle) -> Option<Arc<dyn StorageFile>> {
        let mut slots = self.slots.lock();
        let slot = slots.slots.get(handle.slot as usize)?;
        if slot.generation != handle.generation {
            return None;
        }
        let file = slot.file.clone()?;
        if slots.newest != handle.slot {
            slots.unlink(handle.slot);
            slots.push_newest(handle.slot);
        }
        Some(file)
    }

    /// Opens `path` as `mode` says into the cache, closing the least recently used file if it is
    /// full. When the process is out of descriptors (`EMFILE`, `ENFILE`), closes half of the
    /// cached files and tries once more, so a descriptor taken elsewhere does not fail a write
    /// the cache can make room for.
    pub fn open(&self, path: &Path, mode: OpenMode) -> io::Result<(FileHandle, Arc<dyn StorageFile>)> {
        let file = match self.file_system.open(path, mode) {
            Err(error) if is_out_of_descriptors(&error) => {
                self.evict((self.open_files() / 2).max(1));
                self.file_system.open(path, mode)?
            }
            opened => opened?,
        };
        self.stats.opens.fetch_add(1, Ordering::Relaxed);
        Ok((self.insert(file.clone()), file))
    }

    /// Runs `operation`, which opens a descriptor for a moment (a directory to fsync, a segment to
    /// read); when the process is out of descriptors, closes half of the cached files and runs it
    /// once more, as [`FileCache::open`] does.
    pub fn with_a_descriptor<T>(&self, operation: impl Fn() -> io::Result<T>) -> io::Result<T> {
        match operation() {
            Err(error) if is_out_of_descriptors(&error) => {
                self.evict((self.open_files() / 2).max(1));
                operation()
            }
            done => done,
        }
    }

    /// Closes the file behind `handle` (its log no longer needs it); a stale handle is ignored.
    pub fn remove(&self, handle: FileHandle) {
        let closed = {
            let mut slots = self.slots.lock();
            match slots.slots.get(handle.slot as usize) {
                Some(slot) if slot.generation == handle.generation && slot.file.is_some() => slots.release(handle.slot),
                _ => None,
            }
        };
        // Closed outside the lock: close(2) can take a while on some filesystems.
        drop(closed);
    }

    fn insert(&self, file: Arc<dyn StorageFile>) -> FileHandle {
        let mut closed = None;
        let handle = {
            let mut slots = self.slots.lock();
            if slots.slots.len() - slots.free.len() >= self.capacity {
                let oldest = slots.oldest;
                closed = slots.release(oldest);
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            }
            let index = match slots.free.pop() {
                Some(index) => index,
                None => {
                    let index = slots.slots.len() as u32;
                    slots.slots.push(Slot { file: None, generation: 0, newer: NONE, older: NONE });
                    index
                }
            };
            let slot = &mut slots.slots[index as usize];
            slot.file = Some(file);
            let generation = slot.generation;
            slots.push_newest(index);
            FileHandle { slot: index, generation }
        };
        drop(closed);
        handle
    }

    /// Closes up to `count` least recently used files.
    fn evict(&self, count: usize) {
        let mut closed = Vec::with_capacity(count);
        {
            let mut slots = self.slots.lock();
            while closed.len() < count && slots.oldest != NONE {
                let oldest = slots.oldest;
                closed.extend(slots.release(oldest));
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(closed);
    }
}

impl Slots {
    /// Takes the file out of an occupied slot, invalidating its handles; the caller drops it.
    fn release(&mut self, index: u32) -> Option<Arc<dyn StorageFile>> {
        self.unlink(index);
        let slot = &mut self.slots[index as usize];
        let file = slot.file.take();
        slot.generation += 1;
        self.free.push(index);
        file
    }

    fn unlink(&mut self, index: u32) {
        let (newer, older) = {
            let slot = &self.slots[index as usize];
            (slot.newer, slot.older)
        };
        match newer {
            NONE => self.newest = older,
            newer => self.slots[newer as usize].older = older,
        }
        match older {
            NONE => self.oldest = newer,
            older => self.slots[older as usize].newer = newer,
        }
        let slot = &mut self.slots[index as usize];
        slot.newer = NONE;
        slot.older = NONE;
    }

    fn push_newest(&mut self, index: u32) {
        let previous = self.newest;
        {
            let slot = &mut self.slots[index as usize];
            slot.newer = NONE;
            slot.older = previous;
        }
        match previous {
            NONE => self.oldest = index,
            previous => self.slots[previous as usize].newer = index,
        }
        self.newest = index;
    }
}

/// Whether an open failed because the process (`EMFILE`) or the system (`ENFILE`) is out of
/// file descriptors.
pub fn is_out_of_descriptors(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn temporary_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lepus-file-cache-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    fn read_write() -> OpenMode {
        OpenMode::CreateReadWrite
    }

    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
    }

    #[test]
    fn the_least_recently_used_file_is_closed_first() {
        let dir = temporary_dir("lru");
        let cache = FileCache::new(3);
        let handles: Vec<FileHandle> =
            (0..3).map(|index| cache.open(&dir.join(format!("{index}")), read_write()).expect("open").0).collect();
        // Touch 0, so 1 is now the least recently used.
        assert!(cache.get(handles[0]).is_some());
        let (fourth, _) = cache.open(&dir.join("3"), read_write()).expect("open");
        assert_eq!(cache.open_files(), 3);
        assert!(cache.get(handles[1]).is_none(), "the least recently used file was kept");
        assert!(cache.get(handles[0]).is_some());
        assert!(cache.get(handles[2]).is_some());
        assert!(cache.get(fourth).is_some());
        assert_eq!(cache.stats().evictions.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_reused_slot_does_not_answer_an_old_handle() {
        let dir = temporary_dir("generation");
        let cache = FileCache::new(1);
        let (first, file) = cache.open(&dir.join("a"), read_write()).expect("open");
        file.write_all_at(b"a", 0).expect("write");
        let (second, _) = cache.open(&dir.join("b"), read_write()).expect("open");
        assert_eq!(first.slot, second.slot, "one slot, reused");
        assert!(cache.get(first).is_none(), "a stale handle reached another file");
        let mut contents = [0u8; 1];
        assert_eq!(cache.get(second).expect("cached").read_at(&mut contents, 0).expect("read"), 0, "b is empty");
        cache.remove(first);
        assert!(cache.get(second).is_some(), "removing through a stale handle closed another file");
        cache.remove(second);
        assert_eq!(cache.open_files(), 0);
    }

    /// The bound holds for descriptors, not only for entries: however many files go through the
    /// cache, the process holds at most `capacity` more than before.
    #[test]
    fn many_files_hold_at_most_the_bound_of_descriptors() {
        let dir = temporary_dir("bound");
        let cache = FileCache::new(16);
        let before = open_descriptors();
        let mut handles = Vec::new();
        for index in 0..500 {
            let (handle, file) = cache.open(&dir.join(format!("{index}")), read_write()).expect("open");
            file.write_all_at(b"x", 0).expect("write");
            handles.push(handle);
        }
        drop(handles);
        let held = open_descriptors().saturating_sub(before);
        // Other tests of this binary open files concurrently: allow them a few.
        assert!(held <= 16 + 8, "{held} descriptors held by a cache of 16");
        assert_eq!(cache.open_files(), 16);
    }

    #[test]
    fn the_bound_follows_the_descriptor_limit() {
        assert_eq!(open_segment_files_max_for(1024), 512);
        assert_eq!(open_segment_files_max_for(20_000), 10_000);
        assert_eq!(open_segment_files_max_for(100), OPEN_SEGMENT_FILES_MIN.max(36));
        assert_eq!(open_segment_files_max_for(16), OPEN_SEGMENT_FILES_MIN);
        assert_eq!(open_segment_files_max_for(1 << 40), OPEN_SEGMENT_FILES_MAX_CEILING);
    }
}
