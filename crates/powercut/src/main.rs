//! `lepus-powercut BACKING MOUNTPOINT STATE_DIR [--torn-last-write] [--slow-fsync PREFIX:MS]`: mounts BACKING at
//! MOUNTPOINT through FUSE. Writes go through to BACKING at once (it plays the page cache); what
//! fsync and fsyncdir made durable is copied into a model under STATE_DIR (LazyFS is the model).
//! Commands, one per line on stdin:
//! - `cut`: the power cut. BACKING is rebuilt to hold exactly what was synced (data of a file
//!   since its last fsync, and names created, renamed or unlinked since their directory's last
//!   fsync, are lost; with `--torn-last-write` the first half of the last unsynced write is kept),
//!   then the file system is unmounted and the process exits.
//! - `unmount`, or the end of stdin: a clean shutdown, BACKING keeps everything written.
//!
//! With `--slow-fsync PREFIX:MS`, every fsync of a file whose name starts with PREFIX waits MS
//! milliseconds before it syncs (a cut in the meantime fails it), while other threads serve every
//! other operation: a test holds one durability step open (the definitions') and cuts the power
//! inside it.
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
    let slow_fsync_at = arguments.iter().position(|argument| argument == "--slow-fsync");
    let slow_fsync = slow_fsync_at.map(|at| arguments.get(at + 1).and_then(|value| parse_slow_fsync(value)));
    let paths: Vec<&String> = arguments
        .iter()
        .enumerate()
        .filter(|(at, argument)| !argument.starts_with("--") && slow_fsync_at.is_none_or(|option| *at != option + 1))
        .map(|(_, argument)| argument)
        .collect();
    let ([backing, mount_point, state_dir], None | Some(Some(_))) = (&paths[..], &slow_fsync) else {
        eprintln!("usage: lepus-powercut BACKING MOUNTPOINT STATE_DIR [--torn-last-write] [--slow-fsync PREFIX:MS]");
        return ExitCode::from(2);
    };
    let options = Options { torn_last_write, slow_fsync: slow_fsync.flatten() };
    match run(PathBuf::from(backing), PathBuf::from(mount_point), PathBuf::from(state_dir), options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lepus-powercut: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What the command line asks beyond the paths.
struct Options {
    torn_last_write: bool,
    slow_fsync: Option<filesystem::SlowFsync>,
}

/// `PREFIX:MS`.
fn parse_slow_fsync(value: &str) -> Option<filesystem::SlowFsync> {
    let (name, milliseconds) = value.rsplit_once(':')?;
    let delay = std::time::Duration::from_millis(milliseconds.parse().ok()?);
    (!name.is_empty()).then(|| filesystem::SlowFsync { prefix: name.to_string(), delay })
}

/// FUSE threads with a slow fsync: one sleeps in it while the others serve the broker.
const SLOW_FSYNC_THREADS: usize = 4;

fn run(backing: PathBuf, mount_point: PathBuf, state_dir: PathBuf, options: Options) -> std::io::Result<()> {
    let (torn_last_write, slow_fsync) = (options.torn_last_write, options.slow_fsync.is_some());
    let state = Arc::new(Mutex::new(state::State::boot(backing, &state_dir)?));
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("lepus-powercut".into()), MountOption::RW];
    if options.slow_fsync.is_some() {
        config.n_threads = Some(SLOW_FSYNC_THREADS);
    }
    let session = fuser::spawn_mount(filesystem::PowerCutFs(state.clone(), options.slow_fsync), &mount_point, &config)?;
    println!("mounted {}", mount_point.display());
    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "cut" => {
                let report = state.lock().map_err(|_| std::io::Error::other("state lock poisoned"))?.cut(torn_last_write)?;
                println!("{report}");
                if slow_fsync {
                    // A process killed in a slow fsync exits once it has its EIO: let it go before
                    // the unmount, which it would keep busy.
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
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
