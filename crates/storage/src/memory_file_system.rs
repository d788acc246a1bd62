//! A [`FileSystem`] in memory that keeps, for every file and directory, what is durable apart from
//! what is not, so tests can cut the power under storage and check what comes back.
//!
//! A file's data is durable once its `sync_data` returned; a name created, renamed or removed in a
//! directory is durable once that directory's `sync_directory` returned (as on ext4 without
//! `dirsync`). [`MemoryFileSystem::power_cut`] throws away everything else, the way an OS crash or
//! a power loss does, and returns the view the restarted process uses: every earlier view and
//! file opened through one fails with EIO from then on (the process died with the power), so a
//! test may cut while storage threads are still writing. On
//! command it also tears the last write (keeps a prefix of it), fails writes or syncs with an
//! errno (ENOSPC, EIO) under a path, and flips a bit of what a read returns.
//!
//! Directories are nodes with their own identity, so renaming a directory (a deleted queue's log)
//! moves its whole subtree, and a file keeps its data while a handle holds it after an unlink.
//! Compiled for this crate's tests and, with the `test-support` feature, for other crates' tests.

use crate::file_system::{FileSystem, OpenMode, StorageFile};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// What a fault makes fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOperation {
    /// `write_all_at` (nothing of the write lands).
    Write,
    /// `sync_data` and `sync_directory` (nothing becomes durable).
    Sync,
}

/// A change a file system operation makes, as crash points name them: the machine can lose its
/// power at any one of them (see [`MemoryFileSystem::crash_at_operation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    /// A file created by `open`.
    Create,
    /// `write_all_at`.
    Write,
    /// `set_len`.
    SetLength,
    /// A file's `sync_data`.
    SyncFile,
    /// `sync_directory`.
    SyncDirectory,
    /// `rename`.
    Rename,
    /// `remove_file`.
    RemoveFile,
    /// `remove_dir_all`.
    RemoveDirectory,
    /// `create_dir_all`.
    CreateDirectory,
    /// `sync_file_system`.
    SyncFileSystem,
}

/// Where the power went: the operation that never happened, and its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashPoint {
    /// The operation.
    pub operation: Operation,
    /// The file or directory it concerned.
    pub path: PathBuf,
}

/// How a power cut treats the writes that were not synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerCut {
    /// Every unsynced write and directory change is lost.
    LoseUnsynced,
    /// As [`PowerCut::LoseUnsynced`], except that the first `bytes_kept` bytes of the last write
    /// made (if its file survives) reached the disk: a torn write.
    TearLastWrite {
        /// How much of the last write landed.
        bytes_kept: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    File(u64),
    Directory(u64),
}

#[derive(Debug, Default)]
struct FileNode {
    data: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Debug, Default, Clone)]
struct DirectoryNode {
    entries: BTreeMap<String, Node>,
    durable: BTreeMap<String, Node>,
}

#[derive(Debug)]
struct Fault {
    operation: FaultOperation,
    errno: i32,
    under: PathBuf,
    remaining: u64,
}

#[derive(Debug)]
struct LastWrite {
    file: u64,
    offset: u64,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct State {
    files: HashMap<u64, FileNode>,
    directories: HashMap<u64, DirectoryNode>,
    next_id: u64,
    /// Bumped by each power cut: handles of an earlier generation fail with EIO.
    generation: u64,
    last_write: Option<LastWrite>,
    faults: Vec<Fault>,
    /// (file, byte offset, mask): reads of that byte return it XORed with the mask.
    bit_flips: Vec<(u64, u64, u8)>,
    syncs: u64,
    /// Changes made so far (see [`Operation`]), over every power cycle.
    operations: u64,
    /// The change at which the power goes (see [`MemoryFileSystem::crash_at_operation`]).
    crash_at: Option<u64>,
    /// Set when it went: from then on every operation fails, as after a power cut.
    crashed: Option<CrashPoint>,
}

const ROOT: u64 = 0;

/// File syncs held back under a path (see [`MemoryFileSystem::hold_syncs`]), and how many
/// threads wait on them.
#[derive(Debug, Default)]
struct Holds {
    held: Mutex<(Option<PathBuf>, usize)>,
    released: Condvar,
}

/// The in-memory file system; clones share the same state and the same view (see
/// [`MemoryFileSystem::power_cut`]).
#[derive(Debug, Clone)]
pub struct MemoryFileSystem {
    state: Arc<Mutex<State>>,
    holds: Arc<Holds>,
    /// The power cycle this view belongs to.
    generation: u64,
}

/// What every operation of a view from before the last power cut gets.
fn powered_off() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl Default for MemoryFileSystem {
    fn default() -> Self {
        MemoryFileSystem::new()
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}: no such file or directory", path.display()))
}

/// The names along `path`, from the root.
fn components(path: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => names.push(name.to_string_lossy().into_owned()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err(io::Error::new(io::ErrorKind::InvalidInput, "`..` in a storage path")),
        }
    }
    Ok(names)
}

impl State {
    fn lookup(&self, path: &Path) -> io::Result<Node> {
        let mut node = Node::Directory(ROOT);
        for name in components(path)? {
            let Node::Directory(directory) = node else { return Err(not_found(path)) };
            node = *self.directories[&directory].entries.get(&name).ok_or_else(|| not_found(path))?;
        }
        Ok(node)
    }

    /// The directory holding `path`'s last component, and that component.
    fn parent(&self, path: &Path) -> io::Result<(u64, String)> {
        let mut names = components(path)?;
        let name = names.pop().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the root has no parent"))?;
        let parent: PathBuf = names.iter().collect();
        match self.lookup(&Path::new("/").join(parent))? {
            Node::Directory(directory) => Ok((directory, name)),
            Node::File(_) => Err(not_found(path)),
        }
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The errno a fault makes `operation` on `path` fail with, counting the fault down.
    fn fault(&mut self, operation: FaultOperation, path: &Path) -> io::Result<()> {
        let Some(index) = self.faults.iter().position(|fault| fault.operation == operation && path.starts_with(&fault.under)) else {
            return Ok(());
        };
        let fault = &mut self.faults[index];
        let errno = fault.errno;
        fault.remaining -= 1;
        if fault.remaining == 0 {
            self.faults.remove(index);
        }
        Err(io::Error::from_raw_os_error(errno))
    }

    /// Counts one change, unless it is the one at which the power goes (then it and every later
    /// operation fail, and nothing of it lands).
    fn operate(&mut self, operation: Operation, path: &Path) -> io::Result<()> {
        if self.crashed.is_some() {
            return Err(powered_off());
        }
        self.operations += 1;
        if self.crash_at == Some(self.operations) {
            self.crashed = Some(CrashPoint { operation, path: path.to_path_buf() });
            return Err(powered_off());
        }
        Ok(())
    }
}

impl MemoryFileSystem {
    /// An empty file system: only the root directory, durable.
    pub fn new() -> MemoryFileSystem {
        let mut directories = HashMap::new();
        directories.insert(ROOT, DirectoryNode::default());
        let state = State {
            files: HashMap::new(),
            directories,
            next_id: ROOT,
            generation: 0,
            last_write: None,
            faults: Vec::new(),
            bit_flips: Vec::new(),
            syncs: 0,
            operations: 0,
            crash_at: None,
            crashed: None,
        };
        MemoryFileSystem { state: Arc::new(Mutex::new(state)), holds: Arc::default(), generation: 0 }
    }

    /// The state, if this view is still powered.
    fn powered(&self) -> io::Result<parking_lot::MutexGuard<'_, State>> {
        let state = self.state.lock();
        if state.generation != self.generation || state.crashed.is_some() {
            return Err(powered_off());
        }
        Ok(state)
    }

    /// This file system as storage takes it.
    pub fn shared(&self) -> crate::file_system::SharedFileSystem {
        Arc::new(self.clone())
    }

    /// Creates `directory` and its ancestors and makes them durable, as a data directory that
    /// existed before the test starts.
    pub fn create_durable_directory(&self, directory: &Path) {
        self.create_dir_all(directory).expect("creating a directory in memory");
        let mut state = self.state.lock();
        for directory in state.directories.values_mut() {
            directory.durable = directory.entries.clone();
        }
    }

    /// Cuts the power: whatever was not synced is lost (see [`PowerCut`]). Returns the view of the
    /// restarted machine; every earlier view, and every file opened through one, fails from now on.
    #[must_use = "the old view is powered off: restart storage on the returned one"]
    pub fn power_cut(&self, cut: PowerCut) -> MemoryFileSystem {
        let mut state = self.state.lock();
        state.generation += 1;
        let restarted = MemoryFileSystem { state: self.state.clone(), holds: self.holds.clone(), generation: state.generation };
        // Injected errors belong to the run they were set for; flipped bits stay (they model the media).
        state.faults.clear();
        state.crash_at = None;
        state.crashed = None;
        for directory in state.directories.values_mut() {
            directory.entries = directory.durable.clone();
        }
        for file in state.files.values_mut() {
            file.data = file.durable.clone();
        }
        let last_write = state.last_write.take();
        if let (PowerCut::TearLastWrite { bytes_kept }, Some(write)) = (cut, last_write) {
            if let Some(file) = state.files.get_mut(&write.file) {
                let kept = &write.bytes[..bytes_kept.min(write.bytes.len())];
                write_into(&mut file.data, write.offset, kept);
                file.durable = file.data.clone();
            }
        }
        restarted
    }

    /// Makes the next `count` operations of this kind on files at or under `under` fail with
    /// `errno` (`libc::ENOSPC`, `libc::EIO`); `u64::MAX` until [`MemoryFileSystem::clear_faults`].
    pub fn fail(&self, operation: FaultOperation, errno: i32, under: &Path, count: u64) {
        self.state.lock().faults.push(Fault { operation, errno, under: under.to_path_buf(), remaining: count.max(1) });
    }

    /// Makes every file sync at or under `under` wait until [`MemoryFileSystem::release_syncs`], so
    /// a test can stop a thread in the middle of its work (a checkpoint, say).
    pub fn hold_syncs(&self, under: &Path) {
        self.holds.held.lock().0 = Some(under.to_path_buf());
    }

    /// Lets held syncs go on.
    pub fn release_syncs(&self) {
        self.holds.held.lock().0 = None;
        self.holds.released.notify_all();
    }

    /// How many file syncs wait on [`MemoryFileSystem::hold_syncs`] now.
    pub fn held_syncs(&self) -> usize {
        self.holds.held.lock().1
    }

    /// Ends every injected failure.
    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    /// Makes every read of byte `offset` of the file at `path` return it with bit `bit` flipped,
    /// as a disk returning corrupt data would.
    pub fn flip_bit_on_read(&self, path: &Path, offset: u64, bit: u8) -> io::Result<()> {
        let mut state = self.state.lock();
        match state.lookup(path)? {
            Node::File(file) => {
                state.bit_flips.push((file, offset, 1u8 << (bit % 8)));
                Ok(())
            }
            Node::Directory(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, "a directory has no bytes")),
        }
    }

    /// The current content of a file (what a read sees, without flipped bits).
    pub fn contents(&self, path: &Path) -> io::Result<Vec<u8>> {
        let state = self.state.lock();
        match state.lookup(path)? {
            Node::File(file) => Ok(state.files[&file].data.clone()),
            Node::Directory(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, "a directory has no bytes")),
        }
    }

    /// Makes the power go at the `count`-th change (see [`Operation`]) from now: that change and
    /// every later operation fail with EIO until [`MemoryFileSystem::power_cut`], as on a machine
    /// that lost its power in the middle of its work.
    pub fn crash_at_operation(&self, count: u64) {
        let mut state = self.state.lock();
        state.crash_at = Some(state.operations + count.max(1));
    }

    /// Where the power went, if a [`MemoryFileSystem::crash_at_operation`] was reached.
    pub fn crashed(&self) -> Option<CrashPoint> {
        self.state.lock().crashed.clone()
    }

    /// Changes made so far (see [`Operation`]).
    pub fn operations(&self) -> u64 {
        self.state.lock().operations
    }

    /// How many file and directory syncs returned `Ok` so far.
    pub fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }
}

fn write_into(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let start = offset as usize;
    let end = start + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[start..end].copy_from_slice(bytes);
}

/// An open file of a [`MemoryFileSystem`].
#[derive(Debug)]
pub struct MemoryFile {
    state: Arc<Mutex<State>>,
    holds: Arc<Holds>,
    file: u64,
    /// The path it was opened by, which faults match.
    path: PathBuf,
    generation: u64,
    writable: bool,
}

impl MemoryFile {
    fn check(&self, state: &State) -> io::Result<()> {
        if state.generation != self.generation || state.crashed.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

impl StorageFile for MemoryFile {
    fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        self.check(&state)?;
        if !self.writable {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        state.fault(FaultOperation::Write, &self.path)?;
        state.operate(Operation::Write, &self.path)?;
        let file = state.files.get_mut(&self.file).expect("an open file's node exists");
        write_into(&mut file.data, offset, bytes);
        // Rewritten bytes read back as written: a flip models a bad copy, not a stuck bit.
        let (id, end) = (self.file, offset + bytes.len() as u64);
        state.bit_flips.retain(|(file, at, _)| *file != id || *at < offset || *at >= end);
        state.last_write = Some(LastWrite { file: self.file, offset, bytes: bytes.to_vec() });
        Ok(())
    }

    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        let state = self.state.lock();
        self.check(&state)?;
        let data = &state.files[&self.file].data;
        let start = (offset as usize).min(data.len());
        let count = buffer.len().min(data.len() - start);
        buffer[..count].copy_from_slice(&data[start..start + count]);
        for (file, at, mask) in &state.bit_flips {
            if *file == self.file && *at >= offset && *at < offset + count as u64 {
                buffer[(*at - offset) as usize] ^= mask;
            }
        }
        Ok(count)
    }

    fn len(&self) -> io::Result<u64> {
        let state = self.state.lock();
        self.check(&state)?;
        Ok(state.files[&self.file].data.len() as u64)
    }

    fn set_len(&self, bytes: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        self.check(&state)?;
        state.fault(FaultOperation::Write, &self.path)?;
        state.operate(Operation::SetLength, &self.path)?;
        state.files.get_mut(&self.file).expect("an open file's node exists").data.resize(bytes as usize, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        {
            let mut held = self.holds.held.lock();
            if held.0.as_ref().is_some_and(|under| self.path.starts_with(under)) {
                held.1 += 1;
                while held.0.as_ref().is_some_and(|under| self.path.starts_with(under)) {
                    self.holds.released.wait(&mut held);
                }
                held.1 -= 1;
            }
        }
        let mut state = self.state.lock();
        self.check(&state)?;
        state.fault(FaultOperation::Sync, &self.path)?;
        state.operate(Operation::SyncFile, &self.path)?;
        let file = state.files.get_mut(&self.file).expect("an open file's node exists");
        file.durable = file.data.clone();
        state.syncs += 1;
        Ok(())
    }
}

impl FileSystem for MemoryFileSystem {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut state = self.powered()?;
        let file = match (state.lookup(path), mode) {
            (Ok(Node::File(_)), OpenMode::CreateNew) => return Err(io::Error::from(io::ErrorKind::AlreadyExists)),
            (Ok(Node::File(file)), _) => file,
            (Ok(Node::Directory(_)), _) => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
            (Err(error), OpenMode::Read | OpenMode::ReadWrite) => return Err(error),
            (Err(_), OpenMode::CreateReadWrite | OpenMode::CreateNew) => {
                let (directory, name) = state.parent(path)?;
                state.operate(Operation::Create, path)?;
                let file = state.new_id();
                state.files.insert(file, FileNode::default());
                state.directories.get_mut(&directory).expect("a resolved directory exists").entries.insert(name, Node::File(file));
                file
            }
        };
        Ok(Arc::new(MemoryFile {
            state: self.state.clone(),
            holds: self.holds.clone(),
            file,
            path: path.to_path_buf(),
            generation: state.generation,
            writable: mode != OpenMode::Read,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.powered()?;
        let (from_directory, from_name) = state.parent(from)?;
        let (to_directory, to_name) = state.parent(to)?;
        let node = state.directories[&from_directory].entries.get(&from_name).copied().ok_or_else(|| not_found(from))?;
        if let Some(Node::Directory(existing)) = state.directories[&to_directory].entries.get(&to_name) {
            if !state.directories[existing].entries.is_empty() {
                return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
            }
        }
        state.operate(Operation::Rename, to)?;
        state.directories.get_mut(&from_directory).expect("resolved").entries.remove(&from_name);
        state.directories.get_mut(&to_directory).expect("resolved").entries.insert(to_name, node);
        Ok(())
    }

    fn sync_directory(&self, directory: &Path) -> io::Result<()> {
        let mut state = self.powered()?;
        let Node::Directory(node) = state.lookup(directory)? else { return Err(io::Error::from_raw_os_error(libc::ENOTDIR)) };
        state.fault(FaultOperation::Sync, directory)?;
        state.operate(Operation::SyncDirectory, directory)?;
        let node = state.directories.get_mut(&node).expect("resolved");
        node.durable = node.entries.clone();
        state.syncs += 1;
        Ok(())
    }

    fn sync_file_system(&self, path: &Path) -> io::Result<()> {
        let mut state = self.powered()?;
        state.lookup(path)?;
        state.fault(FaultOperation::Sync, path)?;
        state.operate(Operation::SyncFileSystem, path)?;
        for file in state.files.values_mut() {
            file.durable = file.data.clone();
        }
        for directory in state.directories.values_mut() {
            directory.durable = directory.entries.clone();
        }
        state.syncs += 1;
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.powered()?;
        let (directory, name) = state.parent(path)?;
        state.operate(Operation::RemoveFile, path)?;
        let entries = &mut state.directories.get_mut(&directory).expect("resolved").entries;
        match entries.get(&name) {
            Some(Node::File(_)) => {
                entries.remove(&name);
                Ok(())
            }
            Some(Node::Directory(_)) => Err(io::Error::from_raw_os_error(libc::EISDIR)),
            None => Err(not_found(path)),
        }
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.powered()?;
        let (directory, name) = state.parent(path)?;
        state.operate(Operation::RemoveDirectory, path)?;
        match state.directories.get_mut(&directory).expect("resolved").entries.remove(&name) {
            Some(_) => Ok(()),
            None => Err(not_found(path)),
        }
    }

    fn list_directory(&self, directory: &Path) -> io::Result<Vec<String>> {
        let state = self.powered()?;
        match state.lookup(directory)? {
            Node::Directory(node) => Ok(state.directories[&node].entries.keys().cloned().collect()),
            Node::File(_) => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }

    fn create_dir_all(&self, directory: &Path) -> io::Result<()> {
        let mut state = self.powered()?;
        state.operate(Operation::CreateDirectory, directory)?;
        let mut node = ROOT;
        for name in components(directory)? {
            let existing = state.directories[&node].entries.get(&name).copied();
            node = match existing {
                Some(Node::Directory(child)) => child,
                Some(Node::File(_)) => return Err(io::Error::from(io::ErrorKind::AlreadyExists)),
                None => {
                    let child = state.new_id();
                    state.directories.insert(child, DirectoryNode::default());
                    state.directories.get_mut(&node).expect("resolved").entries.insert(name, Node::Directory(child));
                    child
                }
            };
        }
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        self.powered().is_ok_and(|state| state.lookup(path).is_ok())
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.powered().is_ok_and(|state| matches!(state.lookup(path), Ok(Node::Directory(_))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(file_system: &MemoryFileSystem, path: &str) -> Arc<dyn StorageFile> {
        file_system.open(Path::new(path), OpenMode::CreateReadWrite).expect("open")
    }

    #[test]
    fn only_synced_data_and_synced_names_survive_a_power_cut() {
        let file_system = MemoryFileSystem::new();
        file_system.create_durable_directory(Path::new("/data"));
        let synced = open(&file_system, "/data/synced");
        synced.write_all_at(b"durable", 0).expect("write");
        synced.sync_data().expect("sync");
        file_system.sync_directory(Path::new("/data")).expect("sync directory");
        synced.write_all_at(b"lost", 7).expect("write");
        let unnamed = open(&file_system, "/data/unnamed");
        unnamed.write_all_at(b"x", 0).expect("write");
        unnamed.sync_data().expect("sync");
        let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
        assert_eq!(file_system.contents(Path::new("/data/synced")).expect("read"), b"durable");
        assert!(!file_system.exists(Path::new("/data/unnamed")), "a name whose directory was never synced came back");
        assert!(synced.read_at(&mut [0u8; 1], 0).is_err(), "a handle from before the cut still works");
    }

    #[test]
    fn a_torn_write_keeps_a_prefix_and_faults_fail_then_clear() {
        let file_system = MemoryFileSystem::new();
        file_system.create_durable_directory(Path::new("/data"));
        let file = open(&file_system, "/data/f");
        file_system.sync_directory(Path::new("/data")).expect("sync directory");
        file.write_all_at(b"abcdef", 0).expect("write");
        let file_system = file_system.power_cut(PowerCut::TearLastWrite { bytes_kept: 2 });
        assert_eq!(file_system.contents(Path::new("/data/f")).expect("read"), b"ab");
        let file = open(&file_system, "/data/f");
        file_system.fail(FaultOperation::Write, libc::ENOSPC, Path::new("/data"), 1);
        assert_eq!(file.write_all_at(b"x", 0).expect_err("fails").raw_os_error(), Some(libc::ENOSPC));
        file.write_all_at(b"x", 0).expect("the fault was used up");
        file_system.fail(FaultOperation::Sync, libc::EIO, Path::new("/data"), u64::MAX);
        assert_eq!(file.sync_data().expect_err("fails").raw_os_error(), Some(libc::EIO));
        file_system.clear_faults();
        file.sync_data().expect("cleared");
        file_system.flip_bit_on_read(Path::new("/data/f"), 1, 0).expect("flip");
        let mut read = [0u8; 2];
        file.read_exact_at(&mut read, 0).expect("read");
        assert_eq!(read, [b'x', b'b' ^ 1]);
    }

    #[test]
    fn a_renamed_directory_takes_its_files_along() {
        let file_system = MemoryFileSystem::new();
        file_system.create_durable_directory(Path::new("/data/q"));
        open(&file_system, "/data/q/s").write_all_at(b"x", 0).expect("write");
        file_system.rename(Path::new("/data/q"), Path::new("/data/q.deleted")).expect("rename");
        assert_eq!(file_system.contents(Path::new("/data/q.deleted/s")).expect("read"), b"x");
        assert!(!file_system.exists(Path::new("/data/q")));
        let restarted = file_system.power_cut(PowerCut::LoseUnsynced);
        assert!(!file_system.exists(Path::new("/data")), "a view from before the cut still works");
        let file_system = restarted;
        assert!(file_system.is_dir(Path::new("/data/q")), "an unsynced rename was undone");
    }
}
