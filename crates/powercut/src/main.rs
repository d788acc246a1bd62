//! `lepus-powercut BACKING MOUNTPOINT STATE_DIR [--torn-last-write]`: mounts BACKING at
//! MOUNTPOINT through FUSE. Writes go through to BACKING at once (it plays the page cache); what
//! fsync and fsyncdir made durable is copied into a model under STATE_DIR (LazyFS is the model).
//! Commands, one per line on stdin:
//! - `cut`: the power cut. BACKING is rebuilt to hold exactly what was synced (data of a file
//!   since its last fsync, and names created, renamed or unlinked since their directory's last
//!   fsync, are lost; with `--torn-last-write` the first half of the last unsynced write is kept),
//!   then the file system is unmounted and the process exits.
//! - `unmount`, or the end of stdin: a clean shutdown, BACKING keeps everything written.
//!
//! Not modelled: mmap (writes through a shared mapping reach BACKING and count as synced only
//! when fsynced through a descriptor), hard links, symlinks, extended attributes, fallocate,
//! rename flags, and reordering among unsynced writes (all of them are lost together, but for
//! the torn last write).

mod durable;
mod filesystem;
mod state;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use fuser::{Config, MountOption};

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let torn_last_write = arguments.iter().any(|argument| argument == "--torn-last-write");
    let paths: Vec<&String> = arguments.iter().filter(|argument| !argument.starts_with("--")).collect();
    let [backing, mount_point, state_dir] = paths[..] else {
        eprintln!("usage: lepus-powercut BACKING MOUNTPOINT STATE_DIR [--torn-last-write]");
        return ExitCode::from(2);
    };
    match run(PathBuf::from(backing), PathBuf::from(mount_point), PathBuf::from(state_dir), torn_last_write) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lepus-powercut: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(backing: PathBuf, mount_point: PathBuf, state_dir: PathBuf, torn_last_write: bool) -> std::io::Result<()> {
    let state = Arc::new(Mutex::new(state::State::boot(backing, &state_dir)?));
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("lepus-powercut".into()), MountOption::RW];
    let session = fuser::spawn_mount(filesystem::PowerCutFs(state.clone()), &mount_point, &config)?;
    println!("mounted {}", mount_point.display());
    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "cut" => {
                let report = state.lock().map_err(|_| std::io::Error::other("state lock poisoned"))?.cut(torn_last_write)?;
                println!("{report}");
                break;
            }
            "unmount" => break,
            other => eprintln!("lepus-powercut: unknown command {other:?} (cut, unmount)"),
        }
    }
    session.umount_and_join()?;
    println!("unmounted");
    Ok(())
}
