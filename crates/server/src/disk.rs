//! The free-disk alarm: when free space in the data directory falls below the limit, connections
//! that publish are blocked (connection.blocked, and their sockets are no longer read) until it
//! rises again, as RabbitMQ does; consumers keep draining.

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
        let alarmed = broker.disk_alarm.load(Ordering::Acquire);
        if free < limit && !alarmed {
            tracing::warn!(free, limit, "free disk space below the limit: blocking publishers");
            broker.disk_alarm.store(true, Ordering::Release);
            broker.disk_alarm_raised.notify_waiters();
        } else if free >= limit && alarmed {
            tracing::info!(free, limit, "free disk space back above the limit: unblocking publishers");
            broker.disk_alarm.store(false, Ordering::Release);
            broker.disk_alarm_cleared.notify_waiters();
        }
    }
}
