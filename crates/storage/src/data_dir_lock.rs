//! The data directory's lock: one broker process per data directory.
//!
//! Two brokers on one directory (both started with the default `./lepus-data`, or a second one
//! given a running broker's `--data-dir`) would each replay the other's live journal, rename its
//! segment files and write `clean-shutdown` into its directory, and the running broker would lose
//! messages it had confirmed. So a broker takes an exclusive `flock` on [`LOCK_FILE_NAME`] inside
//! the directory before it reads anything there, and holds it for its whole life.
//!
//! `flock` belongs to the open file, so the kernel releases it when the process dies, however it
//! dies: a lock file left by a killed broker blocks nobody. The file is never deleted, because
//! deleting it would let a third process lock a new file while a second still holds the old one.
//! It holds the holder's process id (text), only to name it in the refusal.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE_NAME: &str = "lepus.lock";

/// How often, and how long apart, a refused process reads the holder's pid when the holder has
/// taken the lock but not written its pid yet (a start racing another start).
const HOLDER_READ_ATTEMPTS_MAX: u32 = 50;
const HOLDER_READ_INTERVAL_MS: u64 = 10;

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum DataDirLockError {
    /// Another process holds the lock.
    #[error("data directory {directory} is in use by process {}", holder_text(*.holder))]
    InUse {
        /// The data directory.
        directory: PathBuf,
        /// The holder's process id, when its lock file names one.
        holder: Option<u32>,
    },
    /// Creating the directory, or opening, locking or writing the lock file failed.
    #[error("locking data directory {directory}: {path}: {source}")]
    Io {
        /// The data directory.
        directory: PathBuf,
        /// The file or directory the failed call concerned.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn holder_text(holder: Option<u32>) -> String {
    match holder {
        Some(pid) => pid.to_string(),
        None => format!("unknown (its {LOCK_FILE_NAME} names none)"),
    }
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DataDirLock {
    /// Kept open: closing the file would release the lock.
    _file: File,
}

impl DataDirLock {
    /// Creates `directory` if it is missing and takes its lock, or says which process holds it.
    pub fn acquire(directory: &Path) -> Result<DataDirLock, DataDirLockError> {
        let io_error = |path: &Path, source| DataDirLockError::Io { directory: directory.to_path_buf(), path: path.to_path_buf(), source };
        std::fs::create_dir_all(directory).map_err(|error| io_error(directory, error))?;
        let path = directory.join(LOCK_FILE_NAME);
        // Not truncated on open: while another process holds the lock, its pid must stay readable.
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|error| io_error(&path, error))?;
        // SAFETY: flock on a descriptor this function owns; it reads and writes no memory.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::WouldBlock {
                return Err(io_error(&path, error));
            }
            return Err(DataDirLockError::InUse { directory: directory.to_path_buf(), holder: read_holder(&path) });
        }
        let pid = format!("{}\n", std::process::id());
        file.set_len(0).map_err(|error| io_error(&path, error))?;
        file.write_all_at(pid.as_bytes(), 0).map_err(|error| io_error(&path, error))?;
        Ok(DataDirLock { _file: file })
    }
}

/// The pid the holder wrote, waiting briefly for a holder that has just taken the lock.
fn read_holder(path: &Path) -> Option<u32> {
    for _ in 0..HOLDER_READ_ATTEMPTS_MAX {
        let mut text = String::new();
        if let Ok(mut file) = File::open(path) {
            if file.read_to_string(&mut text).is_ok() {
                if let Ok(pid) = text.trim().parse::<u32>() {
                    return Some(pid);
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(HOLDER_READ_INTERVAL_MS));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_directory(name: &str) -> PathBuf {
        let directory = std::env::temp_dir().join(format!("lepus-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        directory
    }

    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid_until_the_first_is_dropped() {
        let directory = scratch_directory("second");
        let first = DataDirLock::acquire(&directory).expect("the first lock");
        // flock locks belong to open files, so a second open in this process conflicts like
        // another process would.
        match DataDirLock::acquire(&directory) {
            Err(DataDirLockError::InUse { holder, .. }) => assert_eq!(holder, Some(std::process::id())),
            other => panic!("expected InUse, got {other:?}"),
        }
        let message = DataDirLock::acquire(&directory).expect_err("still held").to_string();
        assert_eq!(message, format!("data directory {} is in use by process {}", directory.display(), std::process::id()));
        drop(first);
        let again = DataDirLock::acquire(&directory).expect("free once dropped");
        drop(again);
        let _ = std::fs::remove_dir_all(&directory);
    }

    #[test]
    fn a_lock_file_left_behind_does_not_block() {
        let directory = scratch_directory("stale");
        std::fs::create_dir_all(&directory).expect("create");
        std::fs::write(directory.join(LOCK_FILE_NAME), "4194304999\n").expect("a stale lock file");
        let lock = DataDirLock::acquire(&directory).expect("an unlocked file is no obstacle");
        let pid = std::fs::read_to_string(directory.join(LOCK_FILE_NAME)).expect("read");
        assert_eq!(pid, format!("{}\n", std::process::id()), "the old pid is replaced, not appended to");
        drop(lock);
        let _ = std::fs::remove_dir_all(&directory);
    }
}
