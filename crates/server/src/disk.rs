//! Resource alarms: when free space in the data directory falls below the limit, or the broker's
//! resident memory rises above the high watermark, connections that publish are blocked
//! (connection.blocked, and their sockets are no longer read) until it passes, as RabbitMQ does;
//! consumers keep draining, which is what brings memory and disk back.

use crate::broker::Broker;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How often free space is measured.
pub const DISK_CHECK_INTERVAL_MS: u64 = 500;

/// Free bytes for unprivileged writers on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::other("path contains NUL"))?;
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and stats a valid, writable statvfs.
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &mut stats) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stats.f_bavail as u64 * stats.f_frsize as u64)
}

/// RabbitMQ's default `vm_memory_high_watermark`: 40% of the machine's memory.
pub const MEMORY_HIGH_WATERMARK_FRACTION: f64 = 0.4;

/// 40% of the machine's memory (from /proc/meminfo), or 1 GiB when that cannot be read.
pub fn default_memory_high_watermark_bytes() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        text.lines().find(|line| line.starts_with("MemTotal:")).and_then(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
    });
    total_kib.map_or(1 << 30, |kib| (kib as f64 * 1024.0 * MEMORY_HIGH_WATERMARK_FRACTION) as u64)
}

/// The broker's resident memory, from /proc/self/statm.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page_bytes).ok()?)
}

fn set_alarm(broker: &Broker, alarm: &std::sync::atomic::AtomicBool, raised: bool, resource: &str, used: u64, limit: u64) {
    if alarm.swap(raised, Ordering::AcqRel) == raised {
        return;
    }
    if raised {
        tracing::warn!(resource, used, limit, "resource alarm raised: blocking publishers");
        broker.disk_alarm_raised.notify_waiters();
    } else {
        tracing::info!(resource, used, limit, "resource alarm cleared");
        if broker.publishers_blocked_by().is_none() {
            broker.disk_alarm_cleared.notify_waiters();
        }
    }
}

/// Measures free space forever, raising and clearing the broker's disk alarm.
pub async fn monitor(broker: Arc<Broker>) {
    let mut interval = tokio::time::interval(Duration::from_millis(DISK_CHECK_INTERVAL_MS));
    loop {
        interval.tick().await;
        let free = match free_bytes(&broker.config.data_dir) {
            Ok(free) => free,
            Err(error) => {
                tracing::warn!(%error, "measuring free disk space failed");
                continue;
            }
        };
        let limit = broker.config.disk_free_limit_bytes;
        set_alarm(&broker, &broker.disk_alarm, free < limit, "disk", free, limit);
        if let Some(resident) = resident_bytes() {
            let watermark = broker.config.memory_high_watermark_bytes;
            set_alarm(&broker, &broker.memory_alarm, resident > watermark, "memory", resident, watermark);
        }
    }
}
