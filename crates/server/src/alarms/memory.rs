//! The broker's resident memory and RabbitMQ's default high watermark (the memory alarm's measure).

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
