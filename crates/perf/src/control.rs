//! What the coordinator tells running workers: stop, pause, the current rate; and what they tell
//! it back: the first error.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::Notify;

/// Shared run control.
#[derive(Default)]
pub struct Control {
    stop: AtomicBool,
    paused: AtomicBool,
    /// f64 bits of the publish rate per producer in msg/s; 0 = all-out.
    rate_bits: AtomicU64,
    error: Mutex<Option<String>>,
    /// Woken on stop and on errors.
    pub changed: Notify,
}

impl Control {
    /// A control with a per-producer rate (0 = all-out).
    pub fn new(rate_per_producer: f64) -> Control {
        let control = Control::default();
        control.set_rate(rate_per_producer);
        control
    }

    /// Asks every worker to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Whether workers should stop.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Pauses or resumes consumers (they stop reading; the broker keeps the messages).
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }

    /// Whether consumers are paused.
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Sets the per-producer rate (msg/s, 0 = all-out).
    pub fn set_rate(&self, rate_per_producer: f64) {
        self.rate_bits.store(rate_per_producer.max(0.0).to_bits(), Ordering::Release);
    }

    /// The per-producer rate (msg/s, 0 = all-out).
    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Acquire))
    }

    /// Records a worker's failure (the first one wins) and stops the run.
    pub fn fail(&self, what: String) {
        {
            let mut error = self.error.lock();
            if error.is_none() {
                *error = Some(what);
            }
        }
        self.stop();
    }

    /// The first failure, if any.
    pub fn error(&self) -> Option<String> {
        self.error.lock().clone()
    }
}
