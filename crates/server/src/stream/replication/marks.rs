//! Two small files beside a replicated stream's directory: the epoch an election fenced this
//! member at (`.fence`, fdatasynced before the member answers: a restart must not forget it),
//! and how far the cluster had committed the stream when last written (`.commit`, rewritten
//! now and then without a sync: an older value, or none, only makes a restarted member wait
//! for its leader to say it again; the value is written with its complement, so a torn write
//! reads as none, never as more than was committed).

use std::io::Write;
use std::path::{Path, PathBuf};

/// `.commit` is rewritten at most this often.
pub const COMMIT_MARK_INTERVAL_MS: u64 = 1_000;

const COMMIT_MARK_CHECK: u64 = 0x4C50_5343_4F4D_4D54;

/// The fence and commit files of the stream in `directory`.
pub fn paths(directory: &Path) -> (PathBuf, PathBuf) {
    let with = |suffix: &str| {
        let mut path = directory.as_os_str().to_os_string();
        path.push(suffix);
        PathBuf::from(path)
    };
    (with(".fence"), with(".commit"))
}

/// The epoch a member was fenced at (0 when none).
pub fn read_fence(path: &Path) -> u64 {
    std::fs::read(path).ok().and_then(|bytes| bytes.try_into().ok()).map_or(0, u64::from_be_bytes)
}

/// Keeps the fence, durably, before the member answers the election.
pub fn write_fence(path: &Path, epoch: u64) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(path)?;
    file.write_all(&epoch.to_be_bytes())?;
    file.sync_all()
}

/// The commit offset last written (0 when none, or torn).
pub fn read_commit(path: &Path) -> u64 {
    let Ok(bytes) = std::fs::read(path) else { return 0 };
    let Ok(bytes) = <[u8; 16]>::try_from(bytes.as_slice()) else { return 0 };
    let value = u64::from_be_bytes(bytes[..8].try_into().unwrap_or_default());
    let check = u64::from_be_bytes(bytes[8..].try_into().unwrap_or_default());
    if value ^ COMMIT_MARK_CHECK == check {
        value
    } else {
        0
    }
}

/// Writes the commit offset (no sync: see the module's note).
pub fn write_commit(path: &Path, next_offset: u64) -> std::io::Result<()> {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&next_offset.to_be_bytes());
    bytes[8..].copy_from_slice(&(next_offset ^ COMMIT_MARK_CHECK).to_be_bytes());
    let mut file = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(path)?;
    file.write_all(&bytes)
}

/// Removes both (a new stream of an old one's name).
pub fn remove(directory: &Path) {
    let (fence, commit) = paths(directory);
    let _ = std::fs::remove_file(fence);
    let _ = std::fs::remove_file(commit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_read_back_and_a_damaged_commit_reads_as_none() {
        let directory = std::env::temp_dir().join(format!("lepus-marks-{}", std::process::id()));
        let (fence, commit) = paths(&directory);
        assert_eq!((read_fence(&fence), read_commit(&commit)), (0, 0));
        write_fence(&fence, 7).expect("fence");
        write_commit(&commit, 12_345).expect("commit");
        assert_eq!((read_fence(&fence), read_commit(&commit)), (7, 12_345));
        let mut bytes = std::fs::read(&commit).expect("read");
        bytes[3] ^= 1;
        std::fs::write(&commit, &bytes).expect("write");
        assert_eq!(read_commit(&commit), 0, "a flipped bit is no commit, never a larger one");
        remove(&directory);
        assert_eq!((read_fence(&fence), read_commit(&commit)), (0, 0));
    }
}
