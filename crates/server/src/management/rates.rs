//! Message rates for listings (RabbitMQ's `*_details.rate`): totals are sampled every
//! [`SAMPLE_INTERVAL_MS`] and the rate is the change over the last interval, per second.

use crate::broker::Broker;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often totals are sampled (RabbitMQ's default collect_statistics_interval).
pub const SAMPLE_INTERVAL_MS: u64 = 5_000;

/// Rates of one queue (or of the whole broker), per second.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueRates {
    /// Enqueued.
    pub publish: f64,
    /// Delivered or got.
    pub deliver_get: f64,
    /// Acked.
    pub ack: f64,
    /// Requeued.
    pub redeliver: f64,
    /// Change of ready + unacked.
    pub messages: f64,
    /// Change of ready.
    pub messages_ready: f64,
    /// Change of unacked.
    pub messages_unacknowledged: f64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    published: u64,
    delivered: u64,
    acked: u64,
    requeued: u64,
    ready: u64,
    unacked: u64,
}

#[derive(Debug, Default)]
struct State {
    taken_at: Option<Instant>,
    samples: HashMap<(String, String), Sample>,
    queues: HashMap<(String, String), QueueRates>,
    total: QueueRates,
}

/// The latest rates.
#[derive(Debug, Default)]
pub struct Rates {
    state: Mutex<State>,
}

impl Rates {
    /// One queue's rates (zero until two samples were taken).
    pub fn queue(&self, vhost: &str, name: &str) -> QueueRates {
        self.state.lock().queues.get(&(vhost.to_string(), name.to_string())).copied().unwrap_or_default()
    }

    /// The broker's rates, summed over queues.
    pub fn total(&self) -> QueueRates {
        self.state.lock().total
    }

    fn sample(&self, broker: &Broker) {
        let now = Instant::now();
        let mut samples = HashMap::new();
        for queue in broker.list_queues() {
            let snapshot = &queue.snapshot;
            let sample = Sample {
                published: snapshot.stats.published,
                delivered: snapshot.stats.delivered,
                acked: snapshot.stats.acked,
                requeued: snapshot.stats.requeued,
                ready: snapshot.ready,
                unacked: snapshot.unacked,
            };
            samples.insert((queue.vhost, queue.name), sample);
        }
        let mut state = self.state.lock();
        let elapsed = state.taken_at.map(|taken_at| now.duration_since(taken_at).as_secs_f64()).unwrap_or(0.0);
        let mut queues = HashMap::new();
        let mut total = QueueRates::default();
        if elapsed > 0.0 {
            for (key, new) in &samples {
                let old = state.samples.get(key).copied().unwrap_or_default();
                let rate = |new: u64, old: u64| new.saturating_sub(old) as f64 / elapsed;
                let change = |new: u64, old: u64| (new as f64 - old as f64) / elapsed;
                let rates = QueueRates {
                    publish: rate(new.published, old.published),
                    deliver_get: rate(new.delivered, old.delivered),
                    ack: rate(new.acked, old.acked),
                    redeliver: rate(new.requeued, old.requeued),
                    messages: change(new.ready + new.unacked, old.ready + old.unacked),
                    messages_ready: change(new.ready, old.ready),
                    messages_unacknowledged: change(new.unacked, old.unacked),
                };
                total.publish += rates.publish;
                total.deliver_get += rates.deliver_get;
                total.ack += rates.ack;
                total.redeliver += rates.redeliver;
                total.messages += rates.messages;
                total.messages_ready += rates.messages_ready;
                total.messages_unacknowledged += rates.messages_unacknowledged;
                queues.insert(key.clone(), rates);
            }
        }
        state.taken_at = Some(now);
        state.samples = samples;
        state.queues = queues;
        state.total = total;
    }
}

/// Samples forever.
pub async fn sample_forever(broker: Arc<Broker>, rates: Arc<Rates>) {
    let mut interval = tokio::time::interval(Duration::from_millis(SAMPLE_INTERVAL_MS));
    loop {
        interval.tick().await;
        rates.sample(&broker);
    }
}
