//! The one door through which segment logs, the journal, the syncer, its checkpoints, the file
//! cache and the janitor reach the disk.
//!
//! A publisher confirm promises that an fdatasync returned; nothing in a normal run can tell
//! whether it did (the page cache serves every read), and a power cut that loses what was not
//! synced cannot be staged on a real disk in a unit test. So storage takes its files from a
//! [`FileSystem`] chosen at construction: production uses [`RealFileSystem`] (`std::fs` and
//! positioned I/O, one system call per method), and tests use the in-memory
//! [`MemoryFileSystem`](crate::memory_file_system::MemoryFileSystem), which keeps what is durable
//! apart from what is not and can cut the power, tear a write, fail with ENOSPC or EIO, and flip
//! bits on read.
//!
//! Files and file systems are trait objects. A call through one costs an indirect jump (a few
//! nanoseconds) in front of a system call of microseconds, and the syncer makes one per log per
//! batch, never one per message: measured in bench/results/fs-seam.md, the seam costs nothing
//! visible in safe-mode throughput. Generics would have spread a type parameter through every
//! queue log, the syncer and the server for no measurable gain.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// An open file: positioned reads and writes, its length, and fdatasync.
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Writes all of `bytes` at `offset`, growing the file if needed.
    fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()>;

    /// Reads up to `buffer.len()` bytes at `offset`; fewer (or 0) at the end of the file.
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Fills `buffer` from `offset`, or fails with `UnexpectedEof`.
    fn read_exact_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        let mut filled = 0;
        while filled < buffer.len() {
            match self.read_at(&mut buffer[filled..], offset + filled as u64) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "failed to fill whole buffer")),
                Ok(count) => filled += count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// The file's length in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Cuts or extends the file to `bytes`.
    fn set_len(&self, bytes: u64) -> io::Result<()>;

    /// fdatasyncs the file: its data, and the metadata needed to read it back, are on disk when
    /// this returns `Ok`.
    fn sync_data(&self) -> io::Result<()>;

    /// Asks the OS to start writing a range back without waiting (a hint; see
    /// [`crate::queue_log::WRITEBACK_CHUNK_BYTES`]). Does nothing where there is no OS cache.
    fn start_writeback(&self, _offset: u64, _length: u64) {}

    /// The OS descriptor of a real file, for `sendfile` of stream chunks from the page cache;
    /// `None` for a file that is not one (in memory). Valid while the file is held.
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Reading an existing file.
    Read,
    /// Reading and writing an existing file.
    ReadWrite,
    /// Reading and writing, created if missing, never truncated.
    CreateReadWrite,
    /// Writing a file that must not exist yet.
    CreateNew,
}

/// A directory tree of files, and the operations whose order recovery depends on.
pub trait FileSystem: Send + Sync + fmt::Debug {
    /// Opens `path` as `mode` says.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>>;

    /// Renames `from` to `to`, replacing `to`. Durable once the directories are synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// fsyncs a directory: the names created, renamed or removed in it are on disk when this
    /// returns `Ok`.
    fn sync_directory(&self, directory: &Path) -> io::Result<()>;

    /// Removes a file's name.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Removes a directory and everything under it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;

    /// The names in a directory (not `.` or `..`), in no particular order.
    fn list_directory(&self, directory: &Path) -> io::Result<Vec<String>>;

    /// Creates a directory and its missing ancestors.
    fn create_dir_all(&self, directory: &Path) -> io::Result<()>;

    /// Whether something (a file or a directory) has this name.
    fn exists(&self, path: &Path) -> bool;

    /// Whether a directory has this name.
    fn is_dir(&self, path: &Path) -> bool;

    /// Makes everything written on the file system holding `path` durable, every file's data and
    /// every directory's names (`syncfs`): one call instead of one fdatasync per file, for a start
    /// that wrote into thousands of files (journal replay, recovery's seals).
    fn sync_file_system(&self, path: &Path) -> io::Result<()>;
}

/// A file system shared by every part of storage that reaches the same disk.
pub type SharedFileSystem = Arc<dyn FileSystem>;

/// The real disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFileSystem;

/// The process's one [`RealFileSystem`], shared so opening a log allocates nothing for it.
pub fn real() -> SharedFileSystem {
    static REAL: OnceLock<SharedFileSystem> = OnceLock::new();
    REAL.get_or_init(|| Arc::new(RealFileSystem)).clone()
}

/// A file on the real disk.
#[derive(Debug)]
pub struct RealFile(File);

impl StorageFile for RealFile {
    #[inline]
    fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(bytes, offset)
    }

    #[inline]
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(&self.0, buffer, offset)
    }

    #[inline]
    fn read_exact_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, buffer, offset)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, bytes: u64) -> io::Result<()> {
        self.0.set_len(bytes)
    }

    #[inline]
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn start_writeback(&self, offset: u64, length: u64) {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(length)) = (i64::try_from(offset), i64::try_from(length)) else { return };
        // SAFETY: the descriptor is open for the call's duration; sync_file_range reads no memory.
        // A failure is harmless: the checkpoint's fdatasync still covers the range.
        unsafe {
            libc::sync_file_range(self.0.as_raw_fd(), offset, length, libc::SYNC_FILE_RANGE_WRITE);
        }
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.0.as_raw_fd())
    }
}

impl FileSystem for RealFileSystem {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut options = OpenOptions::new();
        match mode {
            OpenMode::Read => options.read(true),
            OpenMode::ReadWrite => options.read(true).write(true),
            OpenMode::CreateReadWrite => options.read(true).write(true).create(true).truncate(false),
            OpenMode::CreateNew => options.write(true).create_new(true),
        };
        Ok(Arc::new(RealFile(options.open(path)?)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_directory(&self, directory: &Path) -> io::Result<()> {
        File::open(directory)?.sync_all()
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }

    fn list_directory(&self, directory: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(directory)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn create_dir_all(&self, directory: &Path) -> io::Result<()> {
        std::fs::create_dir_all(directory)
    }

    fn exists(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok()
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn sync_file_system(&self, path: &Path) -> io::Result<()> {
        let file = File::open(path)?;
        // SAFETY: the descriptor is open for the call's duration; syncfs reads no memory.
        // Since Linux 5.8 it also reports writeback errors of the file system.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&file)) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Reads a file front to back through positioned reads, for a `BufReader` over a [`StorageFile`].
pub struct SequentialReader<'a> {
    file: &'a dyn StorageFile,
    offset: u64,
}

impl<'a> SequentialReader<'a> {
    /// A reader starting at `offset`.
    pub fn new(file: &'a dyn StorageFile, offset: u64) -> SequentialReader<'a> {
        SequentialReader { file, offset }
    }
}

impl io::Read for SequentialReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let count = self.file.read_at(buffer, self.offset)?;
        self.offset += count as u64;
        Ok(count)
    }
}

/// Removes `path` so that a power cut cannot bring it back: unlinks it, then syncs its directory.
/// A missing file is not an error (there is nothing to bring back).
pub fn remove_durably(file_system: &dyn FileSystem, path: &Path) -> io::Result<()> {
    match file_system.remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    }
    match path.parent() {
        Some(directory) => file_system.sync_directory(directory),
        None => Ok(()),
    }
}
