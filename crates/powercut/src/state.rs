//! The live side: inode numbers for the backing directory's paths, open files, and what was
//! written since each file's last fsync. Every operation is applied to the backing directory at
//! once (it plays the page cache); the durable model learns of it only through fsync.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use crate::durable::{DirtyRange, DurableModel};

pub const ROOT_INODE: u64 = 1;

/// Open file handles at once; past it, open and create fail with EMFILE.
const OPEN_HANDLES_MAX: usize = 65_536;

/// A file's last write since its fsync; the newest of them is the one a power cut may tear.
#[derive(Clone, Copy)]
pub struct LastWrite {
    pub sequence: u64,
    pub start: u64,
    pub end: u64,
}

pub struct State {
    pub backing: PathBuf,
    paths: HashMap<u64, PathBuf>,
    inodes: HashMap<PathBuf, u64>,
    next_inode: u64,
    handles: HashMap<u64, (u64, File)>,
    next_handle: u64,
    dirty: HashMap<u64, DirtyRange>,
    last_writes: HashMap<u64, LastWrite>,
    write_sequence: u64,
    pub durable: DurableModel,
    pub powered_off: bool,
}

impl State {
    /// Takes what the backing directory holds now as durable (the disk as it was at boot).
    pub fn boot(backing: PathBuf, state_dir: &Path) -> io::Result<Self> {
        let mut state = Self {
            backing,
            paths: HashMap::from([(ROOT_INODE, PathBuf::new())]),
            inodes: HashMap::from([(PathBuf::new(), ROOT_INODE)]),
            next_inode: ROOT_INODE + 1,
            handles: HashMap::new(),
            next_handle: 1,
            dirty: HashMap::new(),
            last_writes: HashMap::new(),
            write_sequence: 0,
            durable: DurableModel::new(state_dir)?,
            powered_off: false,
        };
        state.boot_directory(ROOT_INODE)?;
        Ok(state)
    }

    fn boot_directory(&mut self, directory: u64) -> io::Result<()> {
        self.durable.directories.insert(directory, BTreeMap::new());
        let entries = self.list(directory)?;
        for (name, inode) in &entries {
            let path = self.full_path(*inode).ok_or_else(|| io::Error::other("lost path"))?;
            if fs::symlink_metadata(&path)?.is_dir() {
                self.boot_directory(*inode)?;
            } else {
                let file = File::open(&path)?;
                let length = file.metadata()?.len();
                self.durable.sync_file(*inode, &file, DirtyRange { start: 0, end: length, shrunk_to: None })?;
            }
            self.durable.directories.entry(directory).or_default().insert(name.clone(), *inode);
        }
        Ok(())
    }

    pub fn full_path(&self, inode: u64) -> Option<PathBuf> {
        self.paths.get(&inode).map(|relative| self.backing.join(relative))
    }

    pub fn child_path(&self, parent: u64, name: &std::ffi::OsStr) -> Option<PathBuf> {
        self.paths.get(&parent).map(|relative| relative.join(name))
    }

    /// The inode of a relative path, numbered on first sight.
    pub fn inode_of(&mut self, relative: PathBuf) -> u64 {
        if let Some(inode) = self.inodes.get(&relative) {
            return *inode;
        }
        let inode = self.next_inode;
        self.next_inode += 1;
        self.paths.insert(inode, relative.clone());
        self.inodes.insert(relative, inode);
        inode
    }

    /// A directory's live entries, as (name, inode), sorted by name.
    pub fn list(&mut self, directory: u64) -> io::Result<Vec<(std::ffi::OsString, u64)>> {
        let relative = self.paths.get(&directory).cloned().ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let mut names: Vec<_> =
            fs::read_dir(self.backing.join(&relative))?.map(|entry| entry.map(|e| e.file_name())).collect::<Result<_, _>>()?;
        names.sort();
        Ok(names.into_iter().map(|name| (name.clone(), self.inode_of(relative.join(&name)))).collect())
    }

    pub fn forget_path(&mut self, relative: &Path) {
        if let Some(inode) = self.inodes.remove(relative) {
            self.paths.remove(&inode);
        }
    }

    /// After a live rename: the moved inode (and, for a directory, everything under it) now
    /// lives at the new path; an inode the rename replaced loses its name.
    pub fn renamed(&mut self, from: &Path, to: &Path) {
        self.forget_path(to);
        let moved: Vec<(PathBuf, u64)> =
            self.inodes.iter().filter(|(path, _)| path.starts_with(from)).map(|(path, inode)| (path.clone(), *inode)).collect();
        for (old, inode) in moved {
            self.inodes.remove(&old);
            let new = match old.strip_prefix(from) {
                Ok(rest) if !rest.as_os_str().is_empty() => to.join(rest),
                _ => to.to_path_buf(),
            };
            self.paths.insert(inode, new.clone());
            self.inodes.insert(new, inode);
        }
    }

    pub fn add_handle(&mut self, inode: u64, file: File) -> io::Result<u64> {
        if self.handles.len() >= OPEN_HANDLES_MAX {
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(handle, (inode, file));
        Ok(handle)
    }

    pub fn handle(&self, handle: u64) -> io::Result<&File> {
        self.handles.get(&handle).map(|(_, file)| file).ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    pub fn release(&mut self, handle: u64) {
        self.handles.remove(&handle);
    }

    pub fn wrote(&mut self, inode: u64, start: u64, end: u64) {
        self.dirty.entry(inode).or_default().add(start, end);
        self.write_sequence += 1;
        self.last_writes.insert(inode, LastWrite { sequence: self.write_sequence, start, end });
    }

    pub fn truncated(&mut self, inode: u64, length: u64) {
        self.dirty.entry(inode).or_default().shrink(length);
    }

    /// fsync/fdatasync of a file: its data and length become durable (not its name).
    pub fn sync_file(&mut self, inode: u64, handle: u64) -> io::Result<()> {
        let dirty = self.dirty.remove(&inode).unwrap_or_default();
        let file = self.handles.get(&handle).map(|(_, file)| file).ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        self.durable.sync_file(inode, file, dirty)?;
        self.last_writes.remove(&inode);
        Ok(())
    }

    /// fsync of a directory: its current names (creates, renames, unlinks) become durable.
    pub fn sync_directory(&mut self, directory: u64) -> io::Result<()> {
        let entries = self.list(directory)?;
        for (_, inode) in &entries {
            let is_directory = self.full_path(*inode).is_some_and(|path| path.is_dir());
            if is_directory {
                self.durable.directories.entry(*inode).or_default();
            }
        }
        self.durable.directories.insert(directory, entries.into_iter().collect());
        Ok(())
    }

    /// The power cut: keeps a torn prefix of the last unsynced write if asked, then rebuilds the
    /// backing directory from what was synced. Every later operation fails with EIO.
    pub fn cut(&mut self, torn_last_write: bool) -> io::Result<String> {
        self.powered_off = true;
        let mut torn = String::from("no torn write");
        let newest = self.last_writes.iter().max_by_key(|(_, write)| write.sequence).map(|(inode, write)| (*inode, *write));
        if let (true, Some((inode, write))) = (torn_last_write, newest) {
            let end = write.start + (write.end - write.start) / 2;
            if let Some(path) = self.full_path(inode) {
                self.durable.keep_torn_prefix(inode, &File::open(&path)?, write.start, end)?;
                torn = format!("kept {} of {} bytes of the last write to {}", end - write.start, write.end - write.start, path.display());
            }
        }
        let unsynced_files = self.dirty.len();
        self.durable.materialize(ROOT_INODE, &self.backing)?;
        Ok(format!("power cut: dropped unsynced writes to {unsynced_files} files; {torn}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    fn scratch(name: &str) -> (PathBuf, PathBuf) {
        let root = std::env::temp_dir().join(format!("lepus-powercut-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (backing, state_dir) = (root.join("backing"), root.join("state"));
        fs::create_dir_all(&backing).expect("backing");
        fs::create_dir_all(&state_dir).expect("state");
        fs::write(backing.join("old"), b"old").expect("old file");
        (backing, state_dir)
    }

    /// Writes `data` at `offset` of `name` the way the FUSE write does: to the backing file, then
    /// recorded as unsynced. Returns the inode and the handle.
    fn write(state: &mut State, name: &str, offset: u64, data: &[u8]) -> (u64, u64) {
        let inode = state.inode_of(PathBuf::from(name));
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(state.backing.join(name)).expect("open");
        file.write_all_at(data, offset).expect("write");
        state.wrote(inode, offset, offset + data.len() as u64);
        (inode, state.add_handle(inode, file).expect("handle"))
    }

    fn cut_scenario(torn_last_write: bool) -> PathBuf {
        let (backing, state_dir) = scratch(if torn_last_write { "torn" } else { "whole" });
        let mut state = State::boot(backing.clone(), &state_dir).expect("boot");
        let (inode, handle) = write(&mut state, "a", 0, b"synced");
        state.sync_file(inode, handle).expect("fsync a");
        state.sync_directory(ROOT_INODE).expect("fsync root");
        write(&mut state, "a", 6, b"-lost");
        let (inode, handle) = write(&mut state, "b", 0, b"data synced, name not");
        state.sync_file(inode, handle).expect("fsync b");
        fs::rename(backing.join("old"), backing.join("renamed")).expect("rename");
        state.renamed(Path::new("old"), Path::new("renamed"));
        state.cut(torn_last_write).expect("cut");
        assert!(state.powered_off);
        backing
    }

    #[test]
    fn a_cut_keeps_exactly_what_was_synced() {
        let backing = cut_scenario(false);
        assert_eq!(fs::read(backing.join("a")).expect("a"), b"synced");
        assert_eq!(fs::read(backing.join("old")).expect("old"), b"old", "the unsynced rename is undone");
        assert!(!backing.join("b").exists(), "a name its directory never synced is lost");
        assert!(!backing.join("renamed").exists());
    }

    #[test]
    fn a_torn_cut_keeps_half_of_the_newest_unsynced_write() {
        let backing = cut_scenario(true);
        assert_eq!(fs::read(backing.join("a")).expect("a"), b"synced-l");
    }
}
