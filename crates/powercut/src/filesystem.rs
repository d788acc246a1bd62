//! The FUSE operations: each one is applied to the backing directory at once and recorded in
//! the state, so that fsync and fsyncdir can tell the durable model what they made durable.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::state::State;

/// No attribute or name caching in the kernel: every stat reaches the backing directory.
const TTL: Duration = Duration::ZERO;

pub struct PowerCutFs(pub Arc<Mutex<State>>, pub Option<SlowFsync>);

/// How often a slow fsync looks whether the power went.
const SLOW_FSYNC_POLL: Duration = Duration::from_millis(5);

/// fsyncs of files whose name starts with a prefix take this long before they sync
/// (`--slow-fsync PREFIX:MS`): a test holds one durability step open (the definitions', log or
/// snapshot) while the others go on, on the other FUSE threads.
#[derive(Debug, Clone)]
pub struct SlowFsync {
    /// How the names (not the paths) of the files whose fsyncs are slow start.
    pub prefix: String,
    /// How long each takes before it syncs.
    pub delay: Duration,
}

fn to_errno(error: io::Error) -> Errno {
    Errno::from(error)
}

fn attributes(inode: u64, path: &Path) -> Result<FileAttr, Errno> {
    let metadata = fs::symlink_metadata(path).map_err(to_errno)?;
    let kind = if metadata.is_dir() { FileType::Directory } else { FileType::RegularFile };
    let time = |seconds: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    Ok(FileAttr {
        ino: INodeNo(inode),
        size: metadata.len(),
        blocks: metadata.blocks(),
        atime: time(metadata.atime()),
        mtime: time(metadata.mtime()),
        ctime: time(metadata.ctime()),
        crtime: time(metadata.ctime()),
        kind,
        perm: u16::try_from(metadata.mode() & 0o7777).unwrap_or(0o600),
        nlink: u32::try_from(metadata.nlink()).unwrap_or(1),
        uid: metadata.uid(),
        gid: metadata.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    })
}

impl PowerCutFs {
    /// The state, or EIO once the power is off.
    fn powered(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let state = self.0.lock().map_err(|_| Errno::EIO)?;
        if state.powered_off {
            return Err(Errno::EIO);
        }
        Ok(state)
    }

    fn entry(&self, parent: INodeNo, name: &OsStr) -> Result<(u64, FileAttr), Errno> {
        let mut state = self.powered()?;
        let relative = state.child_path(parent.0, name).ok_or(Errno::ENOENT)?;
        let path = state.backing.join(&relative);
        fs::symlink_metadata(&path).map_err(to_errno)?;
        let inode = state.inode_of(relative);
        Ok((inode, attributes(inode, &path)?))
    }

    fn open_file(&self, inode: u64, flags: OpenFlags) -> Result<u64, Errno> {
        let mut state = self.powered()?;
        let path = state.full_path(inode).ok_or(Errno::ENOENT)?;
        let access = flags.0 & libc::O_ACCMODE;
        let file = OpenOptions::new()
            .read(access != libc::O_WRONLY)
            .write(access != libc::O_RDONLY)
            .append(flags.0 & libc::O_APPEND != 0)
            .open(path)
            .map_err(to_errno)?;
        state.add_handle(inode, file).map_err(to_errno)
    }

    fn create_file(&self, parent: INodeNo, name: &OsStr, mode: u32, flags: i32) -> Result<(u64, FileAttr, u64), Errno> {
        let mut state = self.powered()?;
        let relative = state.child_path(parent.0, name).ok_or(Errno::ENOENT)?;
        let path = state.backing.join(&relative);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(flags & libc::O_TRUNC != 0)
            .create_new(flags & libc::O_EXCL != 0)
            .mode(mode)
            .open(&path)
            .map_err(to_errno)?;
        let inode = state.inode_of(relative);
        let handle = state.add_handle(inode, file).map_err(to_errno)?;
        Ok((inode, attributes(inode, &path)?, handle))
    }

    fn set_size(&self, inode: u64, size: u64, handle: Option<FileHandle>) -> Result<(), Errno> {
        let mut state = self.powered()?;
        match handle {
            Some(handle) => state.handle(handle.0).and_then(|file| file.set_len(size)),
            None => {
                let path = state.full_path(inode).ok_or(Errno::ENOENT)?;
                OpenOptions::new().write(true).open(path).and_then(|file| file.set_len(size))
            }
        }
        .map_err(to_errno)?;
        state.truncated(inode, size);
        state.wrote(inode, size, size);
        Ok(())
    }

    fn write_at(&self, inode: u64, handle: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let mut state = self.powered()?;
        state.handle(handle).and_then(|file| file.write_all_at(data, offset)).map_err(to_errno)?;
        state.wrote(inode, offset, offset + data.len() as u64);
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    fn read_at(&self, handle: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let state = self.powered()?;
        let file = state.handle(handle).map_err(to_errno)?;
        let mut buffer = vec![0u8; size as usize];
        let mut filled = 0;
        while filled < buffer.len() {
            let read = file.read_at(&mut buffer[filled..], offset + filled as u64).map_err(to_errno)?;
            if read == 0 {
                break;
            }
            filled += read;
        }
        buffer.truncate(filled);
        Ok(buffer)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, directory: bool) -> Result<(), Errno> {
        let mut state = self.powered()?;
        let relative = state.child_path(parent.0, name).ok_or(Errno::ENOENT)?;
        let path = state.backing.join(&relative);
        if directory { fs::remove_dir(path) } else { fs::remove_file(path) }.map_err(to_errno)?;
        state.forget_path(&relative);
        Ok(())
    }

    fn rename_entry(&self, parent: INodeNo, name: &OsStr, new_parent: INodeNo, new_name: &OsStr) -> Result<(), Errno> {
        let mut state = self.powered()?;
        let from = state.child_path(parent.0, name).ok_or(Errno::ENOENT)?;
        let to = state.child_path(new_parent.0, new_name).ok_or(Errno::ENOENT)?;
        fs::rename(state.backing.join(&from), state.backing.join(&to)).map_err(to_errno)?;
        state.renamed(&from, &to);
        Ok(())
    }

    fn statistics(&self) -> Result<libc::statvfs, Errno> {
        let state = self.powered()?;
        let directory = File::open(&state.backing).map_err(to_errno)?;
        // SAFETY: all-zero is a valid statvfs, which fstatvfs then fills.
        let mut statistics: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open for the call and `statistics` is a valid, writable statvfs.
        if unsafe { libc::fstatvfs(directory.as_raw_fd(), &mut statistics) } != 0 {
            return Err(to_errno(io::Error::last_os_error()));
        }
        Ok(statistics)
    }
}

impl Filesystem for PowerCutFs {
    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.entry(parent, name) {
            Ok((_, attributes)) => reply.entry(&TTL, &attributes, Generation(0)),
            Err(error) => reply.error(error),
        }
    }

    fn getattr(&self, _request: &Request, inode: INodeNo, _handle: Option<FileHandle>, reply: ReplyAttr) {
        let path = self.powered().and_then(|state| state.full_path(inode.0).ok_or(Errno::ENOENT));
        match path.and_then(|path| attributes(inode.0, &path)) {
            Ok(attributes) => reply.attr(&TTL, &attributes),
            Err(error) => reply.error(error),
        }
    }

    fn setattr(
        &self,
        _request: &Request,
        inode: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        handle: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = (|| {
            if let Some(size) = size {
                self.set_size(inode.0, size, handle)?;
            }
            let path = self.powered()?.full_path(inode.0).ok_or(Errno::ENOENT)?;
            if let Some(mode) = mode {
                fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777)).map_err(to_errno)?;
            }
            attributes(inode.0, &path)
        })();
        match result {
            Ok(attributes) => reply.attr(&TTL, &attributes),
            Err(error) => reply.error(error),
        }
    }

    fn mkdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let result = (|| {
            let state = self.powered()?;
            let path = state.backing.join(state.child_path(parent.0, name).ok_or(Errno::ENOENT)?);
            fs::create_dir(&path).map_err(to_errno)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777)).map_err(to_errno)?;
            drop(state);
            self.entry(parent, name)
        })();
        match result {
            Ok((_, attributes)) => reply.entry(&TTL, &attributes, Generation(0)),
            Err(error) => reply.error(error),
        }
    }

    fn unlink(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove(parent, name, false));
    }

    fn rmdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove(parent, name, true));
    }

    fn rename(
        &self,
        _request: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL); // RENAME_EXCHANGE and RENAME_NOREPLACE are not modelled.
        }
        reply_empty(reply, self.rename_entry(parent, name, new_parent, new_name));
    }

    fn open(&self, _request: &Request, inode: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(inode.0, flags) {
            Ok(handle) => reply.opened(FileHandle(handle), FopenFlags::empty()),
            Err(error) => reply.error(error),
        }
    }

    fn read(
        &self,
        _request: &Request,
        _inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.read_at(handle.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(error) => reply.error(error),
        }
    }

    fn write(
        &self,
        _request: &Request,
        inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.write_at(inode.0, handle.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(error) => reply.error(error),
        }
    }

    fn flush(&self, _request: &Request, _inode: INodeNo, _handle: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok(); // close(2) is not a sync.
    }

    fn release(
        &self,
        _request: &Request,
        _inode: INodeNo,
        handle: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Ok(mut state) = self.0.lock() {
            state.release(handle.0);
        }
        reply.ok();
    }

    fn fsync(&self, _request: &Request, inode: INodeNo, handle: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        if let Some(slow) = &self.1 {
            let path = self.0.lock().ok().and_then(|state| state.full_path(inode.0));
            let name = path.as_ref().and_then(|path| path.file_name()).map(|name| name.to_string_lossy().into_owned());
            if name.is_some_and(|name| name.starts_with(&slow.prefix)) {
                // Without the state's lock: the other threads serve every other operation meanwhile.
                // A cut in the middle fails it, as the power would: a killed process waits for
                // the answer to the fsync it is in, which must not make its data durable.
                let started = std::time::Instant::now();
                while started.elapsed() < slow.delay {
                    if self.0.lock().map_or(true, |state| state.powered_off) {
                        return reply.error(Errno::EIO);
                    }
                    std::thread::sleep(SLOW_FSYNC_POLL);
                }
            }
        }
        reply_empty(reply, self.powered().and_then(|mut state| state.sync_file(inode.0, handle.0).map_err(to_errno)));
    }

    fn readdir(&self, _request: &Request, inode: INodeNo, _handle: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = self.powered().and_then(|mut state| {
            let entries = state.list(inode.0).map_err(to_errno)?;
            Ok(entries
                .into_iter()
                .map(|(name, child)| {
                    let is_directory = state.full_path(child).is_some_and(|path| path.is_dir());
                    (name, child, if is_directory { FileType::Directory } else { FileType::RegularFile })
                })
                .collect::<Vec<_>>())
        });
        let entries = match entries {
            Ok(entries) => entries,
            Err(error) => return reply.error(error),
        };
        let dots = [(".".into(), inode.0, FileType::Directory), ("..".into(), inode.0, FileType::Directory)];
        for (index, (name, child, kind)) in dots.into_iter().chain(entries).enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), index as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _request: &Request, inode: INodeNo, _handle: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.powered().and_then(|mut state| state.sync_directory(inode.0).map_err(to_errno)));
    }

    fn statfs(&self, _request: &Request, _inode: INodeNo, reply: ReplyStatfs) {
        match self.statistics() {
            Ok(s) => reply.statfs(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize as u32, 255, s.f_frsize as u32),
            Err(error) => reply.error(error),
        }
    }

    fn access(&self, _request: &Request, _inode: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(&self, _request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        match self.create_file(parent, name, mode & !umask & 0o7777, flags) {
            Ok((_, attributes, handle)) => reply.created(&TTL, &attributes, Generation(0), FileHandle(handle), FopenFlags::empty()),
            Err(error) => reply.error(error),
        }
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(error) => reply.error(error),
    }
}
