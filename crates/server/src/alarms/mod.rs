//! Resource alarms: when free space in the data directory falls below the limit, or the broker's
//! resident memory rises above the high watermark, connections that publish are blocked
//! (connection.blocked, and their sockets are no longer read) until it passes, as RabbitMQ does;
//! consumers keep draining, which is what brings memory and disk back.

//!
//! `disk.rs` measures free space and `memory.rs` resident memory; neither knows the broker, so
//! the configuration can take its defaults from them without an import cycle.

pub mod disk;
pub mod memory;

use crate::broker::Broker;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

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

/// Measures free space and resident memory forever, raising and clearing the broker's disk and
/// memory alarms.
pub async fn monitor(broker: Arc<Broker>) {
    let mut interval = tokio::time::interval(Duration::from_millis(disk::DISK_CHECK_INTERVAL_MS));
    loop {
        interval.tick().await;
        let free = match disk::free_bytes(&broker.config.data_dir) {
            Ok(free) => free,
            Err(error) => {
                tracing::warn!(%error, "measuring free disk space failed");
                continue;
            }
        };
        let limit = broker.config.disk_free_limit_bytes;
        set_alarm(&broker, &broker.disk_alarm, free < limit, "disk", free, limit);
        if let Some(resident) = memory::resident_bytes() {
            let watermark = broker.config.memory_high_watermark_bytes;
            set_alarm(&broker, &broker.memory_alarm, resident > watermark, "memory", resident, watermark);
        }
    }
}
