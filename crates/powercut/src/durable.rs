//! What a disk would still hold after a power cut: for every file, the content its last fsync
//! saw (kept as a file of its own under the state directory), and for every directory, the names
//! its last fsync saw. Everything else the broker wrote reached only the live backing directory,
//! which plays the page cache; `materialize` rebuilds the backing directory from this model.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes copied per read/write call when syncing a dirty range or materializing a file.
const COPY_CHUNK_BYTES: usize = 1 << 20;

/// Which part of a file was written since its last fsync. One range per file: copying bytes
/// in between that did not change is harmless, since they are equal in both copies.
#[derive(Debug, Default, Clone, Copy)]
pub struct DirtyRange {
    pub start: u64,
    pub end: u64,
    /// The smallest length the file had since its last fsync (a truncate), if it shrank.
    pub shrunk_to: Option<u64>,
}

impl DirtyRange {
    pub fn add(&mut self, start: u64, end: u64) {
        if self.start == self.end {
            (self.start, self.end) = (start, end);
        } else {
            self.start = self.start.min(start);
            self.end = self.end.max(end);
        }
    }

    pub fn shrink(&mut self, length: u64) {
        self.shrunk_to = Some(self.shrunk_to.map_or(length, |old| old.min(length)));
    }
}

/// The durable copy of every file and directory, by inode number.
pub struct DurableModel {
    objects_dir: PathBuf,
    /// Directory inode -> the entries its last fsync made durable (name -> inode).
    pub directories: HashMap<u64, BTreeMap<OsString, u64>>,
}

impl DurableModel {
    pub fn new(state_dir: &Path) -> io::Result<Self> {
        let objects_dir = state_dir.join("objects");
        if objects_dir.exists() {
            fs::remove_dir_all(&objects_dir)?;
        }
        fs::create_dir_all(&objects_dir)?;
        Ok(Self { objects_dir, directories: HashMap::new() })
    }

    fn object_path(&self, inode: u64) -> PathBuf {
        self.objects_dir.join(inode.to_string())
    }

    fn object(&self, inode: u64) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.object_path(inode))
    }

    /// What a file's fsync makes durable: its length and the bytes written since the last one.
    pub fn sync_file(&self, inode: u64, live: &File, dirty: DirtyRange) -> io::Result<()> {
        let object = self.object(inode)?;
        let live_length = live.metadata()?.len();
        if let Some(shrunk_to) = dirty.shrunk_to {
            object.set_len(shrunk_to)?;
        }
        object.set_len(live_length)?;
        copy_range(live, &object, dirty.start, dirty.end.min(live_length))
    }

    /// A torn write: only `start..end` of a write that was never synced reached the disk.
    pub fn keep_torn_prefix(&self, inode: u64, live: &File, start: u64, end: u64) -> io::Result<()> {
        let object = self.object(inode)?;
        if object.metadata()?.len() < end {
            object.set_len(end)?;
        }
        copy_range(live, &object, start, end)
    }

    /// Rebuilds `target` (emptied first) from the durable names and contents, from `root`.
    pub fn materialize(&self, root: u64, target: &Path) -> io::Result<()> {
        for entry in fs::read_dir(target)? {
            let path = entry?.path();
            if path.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
        }
        self.materialize_directory(root, target)
    }

    fn materialize_directory(&self, directory: u64, target: &Path) -> io::Result<()> {
        let Some(entries) = self.directories.get(&directory) else { return Ok(()) };
        for (name, inode) in entries {
            let path = target.join(name);
            if self.directories.contains_key(inode) {
                fs::create_dir(&path)?;
                self.materialize_directory(*inode, &path)?;
            } else {
                // A name made durable whose data never was: an empty file, as on a real disk.
                let object = self.object(*inode)?;
                let file = File::create(&path)?;
                copy_range(&object, &file, 0, object.metadata()?.len())?;
            }
        }
        Ok(())
    }
}

fn copy_range(from: &File, to: &File, start: u64, end: u64) -> io::Result<()> {
    let mut buffer = vec![0u8; COPY_CHUNK_BYTES];
    let mut offset = start;
    while offset < end {
        let wanted = usize::try_from(end - offset).unwrap_or(COPY_CHUNK_BYTES).min(COPY_CHUNK_BYTES);
        let read = from.read_at(&mut buffer[..wanted], offset)?;
        if read == 0 {
            break;
        }
        to.write_all_at(&buffer[..read], offset)?;
        offset += read as u64;
    }
    Ok(())
}
