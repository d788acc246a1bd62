//! When a shard's leader publishes its queues' held dead letters again (at-least-once
//! dead-lettering): everything held when this node takes the lead (caught up with the log, so
//! letters settled before are not published again), and, while it leads, the letters still held
//! a retry interval after their last publish. Checked on the shard's ticks; a scan walks the held
//! letters of this node's queues, so scans come every quarter interval, not every tick.

use super::QuorumQueue;
use crate::dead_letter::DeadLetterSender;
use replication::command::QueueId;
use replication::state_machine::QueueStateMachine;
use std::collections::HashMap;
use std::sync::Weak;

/// RabbitMQ's default `dead_letter_worker_publisher_confirm_timeout`: a held dead letter that
/// routed nowhere (or whose publish was not confirmed) is published again after this long.
pub const DEAD_LETTER_RETRY_INTERVAL_MS_DEFAULT: u64 = 180_000;

/// A shard's schedule of held dead-letter scans.
#[derive(Debug)]
pub(crate) struct DeadLetterRetry {
    interval_ms: u64,
    /// Whether this node led the shard (caught up) at the last tick.
    leading: bool,
    next_scan_ms: u64,
}

impl DeadLetterRetry {
    pub(crate) fn new(interval_ms: u64) -> DeadLetterRetry {
        DeadLetterRetry { interval_ms: interval_ms.max(1), leading: false, next_scan_ms: 0 }
    }

    /// One tick: `leading` is whether this node leads the shard and applied its log.
    pub(crate) fn tick(
        &mut self,
        leading: bool,
        machine: &QueueStateMachine,
        queues: &HashMap<QueueId, Weak<QuorumQueue>>,
        sender: Option<&DeadLetterSender>,
    ) {
        let took_lead = leading && !self.leading;
        let lost_lead = !leading && self.leading;
        self.leading = leading;
        if lost_lead {
            // The next leader publishes what is held; if this node leads again, it starts afresh.
            for queue in queues.values().filter_map(Weak::upgrade) {
                queue.forget_dead_letters_in_flight();
            }
        }
        let Some(sender) = sender.filter(|_| leading) else { return };
        let now = super::queue::now_ms();
        if !took_lead && now < self.next_scan_ms {
            return;
        }
        self.next_scan_ms = now.saturating_add((self.interval_ms / 4).max(1));
        for (id, queue) in queues {
            let (Some(queue), Some(held)) = (queue.upgrade(), machine.held_dead_letters(*id)) else { continue };
            if !held.is_empty() {
                queue.publish_due_held_dead_letters(held, self.interval_ms, sender);
            }
        }
    }
}
