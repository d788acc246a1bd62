//! The one door through which the journal, the syncer and the checkpoint reach fdatasync.
//!
//! A publisher confirm promises that a sync returned; nothing in a normal run can tell whether it
//! did (the page cache serves every read). So the code that confirms takes its syncs from a
//! [`FileSync`] chosen at construction: production uses [`DirectSync`], a zero-sized type whose
//! calls the compiler inlines to the plain system call (the syncer and the journal are generic over
//! it, so there is no indirection, allocation or lock), and tests plug in one that records the
//! order of syncs or fails them.

use std::fs::File;
use std::io;

/// How durability-critical files reach the disk.
pub trait FileSync: Send + Sync + 'static {
    /// fdatasyncs a file: its data, and the metadata needed to read it back, are on disk when
    /// this returns `Ok`.
    fn sync_data(&self, file: &File) -> io::Result<()>;

    /// fsyncs a directory: the names created, renamed or removed in it are on disk when this
    /// returns `Ok`.
    fn sync_directory(&self, directory: &File) -> io::Result<()>;
}

/// The real system calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectSync;

impl FileSync for DirectSync {
    #[inline]
    fn sync_data(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    #[inline]
    fn sync_directory(&self, directory: &File) -> io::Result<()> {
        directory.sync_all()
    }
}
