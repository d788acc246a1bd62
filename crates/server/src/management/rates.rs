//! The figures behind the API's rates and charts: every [`SAMPLE_INTERVAL_MS`] the node's totals
//! and each queue's, exchange's and connection's counts are sampled into a [`History`] per object.
//! A `*_details.rate` is the change between the last two samples, per second; with RabbitMQ's
//! range parameters (`lengths_age`, ...) the details also carry the samples (see `history.rs`).
//!
//! Memory is bounded per object and over all objects: an object keeps at most
//! [`OBJECT_SAMPLES_MAX`] entries (10 minutes at the interval) and only the entries whose values
//! changed, so an idle queue costs one entry; past [`SAMPLES_TOTAL_MAX`] entries over all objects
//! each object keeps fewer (never under [`OBJECT_SAMPLES_MIN`], which a rate needs), so 100,000
//! busy queues keep 5 samples (20 s of history) each rather than 10 minutes.

use super::history::{History, Range, Rounding};
use super::json;
use crate::broker::Broker;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How often totals are sampled (RabbitMQ's default collect_statistics_interval).
pub const SAMPLE_INTERVAL_MS: u64 = 5_000;
/// How far back an object's history reaches: RabbitMQ's first retention tier (605 s in steps of
/// 5 s), which is the range the console asks for.
pub const OBJECT_HISTORY_MS: u64 = 605_000;
/// Entries an object keeps at most: the window at the sample interval, and the one in force at
/// the window's start.
pub const OBJECT_SAMPLES_MAX: usize = (OBJECT_HISTORY_MS / SAMPLE_INTERVAL_MS) as usize + 1;
/// Entries an object keeps at least, whatever the number of objects: a rate needs two.
pub const OBJECT_SAMPLES_MIN: usize = 2;
/// Entries kept over all sampled objects (about 56 bytes each for a queue): more objects than
/// this divided by [`OBJECT_SAMPLES_MAX`] keep shorter histories each.
pub const SAMPLES_TOTAL_MAX: usize = 500_000;
/// How far back the node's own history (the overview) reaches: an hour.
pub const NODE_HISTORY_MS: u64 = 3_605_000;
/// Entries the node's history keeps at most.
pub const NODE_SAMPLES_MAX: usize = (NODE_HISTORY_MS / SAMPLE_INTERVAL_MS) as usize + 1;
/// RabbitMQ's `sample_retention_policies` as Lepus keeps them, in seconds: the node ("global")
/// for an hour, objects ("basic", "detailed") for 10 minutes. The console offers these ranges.
pub const RETENTION_GLOBAL_S: [u64; 2] = [600, 3600];
/// See [`RETENTION_GLOBAL_S`].
pub const RETENTION_OBJECT_S: [u64; 1] = [600];

/// The node's sampled figures, by index.
pub mod node_field {
    /// Messages published (received on channels).
    pub const PUBLISH: usize = 0;
    /// Publishes confirmed.
    pub const CONFIRM: usize = 1;
    /// Unroutable mandatory publishes returned.
    pub const RETURN_UNROUTABLE: usize = 2;
    /// Unroutable publishes dropped.
    pub const DROP_UNROUTABLE: usize = 3;
    /// Deliveries to consumers that ack.
    pub const DELIVER: usize = 4;
    /// Deliveries to no-ack consumers.
    pub const DELIVER_NO_ACK: usize = 5;
    /// basic.get to be acked.
    pub const GET: usize = 6;
    /// basic.get no-ack.
    pub const GET_NO_ACK: usize = 7;
    /// Redeliveries.
    pub const REDELIVER: usize = 8;
    /// Acks by consumers.
    pub const ACK: usize = 9;
    /// basic.get that found nothing.
    pub const GET_EMPTY: usize = 10;
    /// Ready messages over all queues.
    pub const READY: usize = 11;
    /// Unacked messages over all queues.
    pub const UNACKED: usize = 12;
    /// Churn: connections opened.
    pub const CONNECTION_CREATED: usize = 13;
    /// Churn: connections closed.
    pub const CONNECTION_CLOSED: usize = 14;
    /// Churn: channels opened.
    pub const CHANNEL_CREATED: usize = 15;
    /// Churn: channels closed.
    pub const CHANNEL_CLOSED: usize = 16;
    /// Churn: queue.declare answered.
    pub const QUEUE_DECLARED: usize = 17;
    /// Churn: queues created.
    pub const QUEUE_CREATED: usize = 18;
    /// Churn: queues deleted.
    pub const QUEUE_DELETED: usize = 19;
    /// How many.
    pub const COUNT: usize = 20;
}

/// A queue's sampled figures, by index.
pub mod queue_field {
    /// Messages enqueued.
    pub const PUBLISH: usize = 0;
    /// Delivered or got.
    pub const DELIVER_GET: usize = 1;
    /// Settled by ack or no-ack.
    pub const ACK: usize = 2;
    /// Requeued.
    pub const REDELIVER: usize = 3;
    /// Ready messages.
    pub const READY: usize = 4;
    /// Unacked messages.
    pub const UNACKED: usize = 5;
    /// How many.
    pub const COUNT: usize = 6;
}

/// An exchange's sampled figures, by index.
pub mod exchange_field {
    /// Messages published to it.
    pub const PUBLISH_IN: usize = 0;
    /// Messages it routed into queues (one per queue).
    pub const PUBLISH_OUT: usize = 1;
    /// How many.
    pub const COUNT: usize = 2;
}

/// A connection's sampled figures, by index.
pub mod connection_field {
    /// Bytes received.
    pub const RECV_OCT: usize = 0;
    /// Bytes sent.
    pub const SEND_OCT: usize = 1;
    /// How many.
    pub const COUNT: usize = 2;
}

/// The node's values now, in [`node_field`] order, with the queues' `ready` and `unacked`
/// messages summed by the caller (who has listed the queues).
pub fn node_values(broker: &Broker, ready: u64, unacked: u64) -> [u64; node_field::COUNT] {
    use std::sync::atomic::Ordering::Relaxed;
    let totals = crate::metrics::message_totals(broker);
    let deliveries = totals.deliveries;
    let churn = &broker.churn;
    [
        totals.received,
        totals.confirmed,
        totals.unroutable_returned,
        totals.unroutable_dropped,
        deliveries.consume_manual_ack,
        deliveries.consume_auto_ack,
        deliveries.get_manual_ack,
        deliveries.get_auto_ack,
        deliveries.redelivered,
        deliveries.acknowledged,
        totals.get_empty,
        ready,
        unacked,
        churn.connections_opened.load(Relaxed),
        churn.connections_closed.load(Relaxed),
        churn.channels_opened.load(Relaxed),
        churn.channels_closed.load(Relaxed),
        churn.queues_declared.load(Relaxed),
        churn.queues_created.load(Relaxed),
        churn.queues_deleted.load(Relaxed),
    ]
}

/// A queue's values now, in [`queue_field`] order.
pub fn queue_values(snapshot: &crate::queue_type::QueueSnapshot) -> [u64; queue_field::COUNT] {
    let stats = &snapshot.stats;
    [stats.published, stats.delivered, stats.acked, stats.requeued, snapshot.ready, snapshot.unacked]
}

/// Queues and exchanges are known by vhost and name.
type ObjectKey = (String, String);

#[derive(Debug, Default)]
struct State {
    /// When the last two samples were taken (wall clock, ms since the epoch).
    previous_ms: Option<u64>,
    last_ms: Option<u64>,
    node: Option<History<{ node_field::COUNT }>>,
    queues: HashMap<ObjectKey, History<{ queue_field::COUNT }>>,
    exchanges: HashMap<ObjectKey, History<{ exchange_field::COUNT }>>,
    /// Connections by their broker-unique id.
    connections: HashMap<u64, History<{ connection_field::COUNT }>>,
}

/// Every object's history.
#[derive(Debug, Default)]
pub struct Rates {
    state: Mutex<State>,
}

/// The wall clock in milliseconds since the epoch, as RabbitMQ's sample timestamps.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as u64).unwrap_or(0)
}

/// How many entries each object keeps when there are `objects` of them.
pub fn object_samples_max(objects: usize) -> usize {
    (SAMPLES_TOTAL_MAX / objects.max(1)).clamp(OBJECT_SAMPLES_MIN, OBJECT_SAMPLES_MAX)
}

/// Records `values` of the object `key` into `histories`, starting a history for a new object and
/// a fresh one when a counter went back (the object was deleted and declared again).
fn record_object<Key: std::hash::Hash + Eq, const FIELDS: usize>(
    histories: &mut HashMap<Key, History<FIELDS>>,
    key: Key,
    values: [u64; FIELDS],
    counters: usize,
    at_ms: u64,
    entries_max: usize,
) {
    match histories.get_mut(&key) {
        Some(history) if history.latest()[..counters].iter().zip(&values[..counters]).all(|(old, new)| old <= new) => {
            history.record(at_ms, values, entries_max, OBJECT_HISTORY_MS)
        }
        _ => {
            histories.insert(key, History::new(at_ms, values));
        }
    }
}

/// Records every object's sample and forgets the objects that are gone.
fn record_all<Key: std::hash::Hash + Eq + Clone, const FIELDS: usize>(
    histories: &mut HashMap<Key, History<FIELDS>>,
    samples: Vec<(Key, [u64; FIELDS])>,
    counters: usize,
    at_ms: u64,
    entries_max: usize,
) {
    let mut present = std::collections::HashSet::with_capacity(samples.len());
    for (key, values) in samples {
        record_object(histories, key.clone(), values, counters, at_ms, entries_max);
        present.insert(key);
    }
    histories.retain(|key, _| present.contains(key));
}

/// The values of every queue a command touched since the last sample, and how many queues there
/// are. The queues' handles are taken under each vhost's lock, their figures read after it.
fn changed_queues(broker: &Broker) -> (Vec<(ObjectKey, [u64; queue_field::COUNT])>, usize) {
    let mut present = 0;
    let mut changed = Vec::new();
    for (vhost, topology) in broker.topologies() {
        let handles: Vec<_> = {
            let topology = topology.read();
            present += topology.queues().len();
            topology.queues().filter(|entry| entry.handle.changed_since_sample()).map(|entry| entry.handle.clone()).collect()
        };
        for queue in handles {
            if let Some(snapshot) = queue.sample_if_changed() {
                changed.push(((vhost.clone(), queue.name().to_string_lossy()), queue_values(&snapshot)));
            }
        }
    }
    (changed, present)
}

/// Drops the histories of queues that no longer exist.
fn forget_deleted_queues(histories: &mut HashMap<ObjectKey, History<{ queue_field::COUNT }>>, broker: &Broker) {
    let mut names = std::collections::HashSet::with_capacity(histories.len());
    for (vhost, topology) in broker.topologies() {
        let topology = topology.read();
        names.extend(topology.queues().map(|entry| (vhost.clone(), entry.handle.name().to_string_lossy())));
    }
    histories.retain(|key, _| names.contains(key));
}

impl Rates {
    /// Takes one sample of everything. Queues no command touched since the last sample are not
    /// read at all (their histories already end with their values): with 100,000 idle queues a
    /// sample costs one atomic load per queue, no lock of a queue and no allocation for it.
    pub fn sample(&self, broker: &Broker) {
        let at_ms = now_ms();
        let (changed_queues, queues_present) = changed_queues(broker);
        let exchanges: Vec<(ObjectKey, [u64; exchange_field::COUNT])> = broker
            .list_exchanges()
            .into_iter()
            .map(|exchange| ((exchange.vhost, exchange.name), [exchange.published_in, exchange.published_out]))
            .collect();
        let connections: Vec<(u64, [u64; connection_field::COUNT])> = broker
            .connection_handles()
            .iter()
            .map(|connection| {
                let traffic = connection.traffic.read();
                (connection.id, [traffic[0], traffic[2]])
            })
            .collect();
        let mut state = self.state.lock();
        let state = &mut *state;
        let entries_max = object_samples_max(queues_present + exchanges.len() + connections.len());
        for (key, values) in changed_queues {
            record_object(&mut state.queues, key, values, queue_field::READY, at_ms, entries_max);
        }
        // Every queue is sampled once when it is made, so more histories than queues means some
        // were deleted: only then are the histories matched against the queues by name.
        if state.queues.len() > queues_present {
            forget_deleted_queues(&mut state.queues, broker);
        }
        let (ready, unacked) = state.queues.values().fold((0, 0), |(ready, unacked), history| {
            let latest = history.latest();
            (ready + latest[queue_field::READY], unacked + latest[queue_field::UNACKED])
        });
        let node = node_values(broker, ready, unacked);
        match state.node.as_mut() {
            Some(history) => history.record(at_ms, node, NODE_SAMPLES_MAX, NODE_HISTORY_MS),
            None => state.node = Some(History::new(at_ms, node)),
        }
        record_all(&mut state.exchanges, exchanges, exchange_field::COUNT, at_ms, entries_max);
        record_all(&mut state.connections, connections, connection_field::COUNT, at_ms, entries_max);
        state.previous_ms = state.last_ms;
        state.last_ms = Some(at_ms);
    }

    /// Runs `read` with a view of every history.
    pub fn read<R>(&self, read: impl FnOnce(&View) -> R) -> R {
        let state = self.state.lock();
        read(&View { state: &state })
    }
}

/// Every history, as one sample pass left them.
pub struct View<'a> {
    state: &'a State,
}

impl View<'_> {
    /// The node's figures.
    pub fn node(&self) -> Figures<'_, { node_field::COUNT }> {
        Figures { history: self.state.node.as_ref(), ticks: (self.state.previous_ms, self.state.last_ms) }
    }

    /// A queue's figures.
    pub fn queue(&self, vhost: &str, name: &str) -> Figures<'_, { queue_field::COUNT }> {
        let history = self.state.queues.get(&(vhost.to_owned(), name.to_owned()));
        Figures { history, ticks: (self.state.previous_ms, self.state.last_ms) }
    }

    /// An exchange's figures.
    pub fn exchange(&self, vhost: &str, name: &str) -> Figures<'_, { exchange_field::COUNT }> {
        let history = self.state.exchanges.get(&(vhost.to_owned(), name.to_owned()));
        Figures { history, ticks: (self.state.previous_ms, self.state.last_ms) }
    }

    /// A connection's figures.
    pub fn connection(&self, id: u64) -> Figures<'_, { connection_field::COUNT }> {
        Figures { history: self.state.connections.get(&id), ticks: (self.state.previous_ms, self.state.last_ms) }
    }
}

/// One object's history, ready to answer `*_details` objects.
pub struct Figures<'a, const FIELDS: usize> {
    history: Option<&'a History<FIELDS>>,
    /// The last two sample times.
    ticks: (Option<u64>, Option<u64>),
}

impl<const FIELDS: usize> Figures<'_, FIELDS> {
    /// The `*_details` object of the figure `value` computes from the sampled values: the rate
    /// over the last interval, with RabbitMQ's samples when `range` asks for them.
    pub fn details(&self, range: Option<&Range>, value: impl Fn(&[u64; FIELDS]) -> u64) -> Value {
        let at = |at_ms: u64| self.history.map_or(0, |history| value(&history.value_at(at_ms)));
        if let Some(range) = range {
            let values: Vec<(u64, u64)> = range.points().map(|point| (point, at(point))).collect();
            return super::history::sampled_details(range, &values);
        }
        match self.ticks {
            (Some(previous_ms), Some(last_ms)) if last_ms > previous_ms => {
                json::details((at(last_ms) as f64 - at(previous_ms) as f64) * 1000.0 / (last_ms - previous_ms) as f64)
            }
            _ => json::details(0.0),
        }
    }

    /// The `*_details` object of one sampled field.
    pub fn field(&self, range: Option<&Range>, field: usize) -> Value {
        self.details(range, |values| values[field])
    }
}

/// RabbitMQ's range query parameters, each in seconds.
#[derive(Debug, Default, serde::Deserialize)]
pub struct RangeQuery {
    lengths_age: Option<String>,
    lengths_incr: Option<String>,
    msg_rates_age: Option<String>,
    msg_rates_incr: Option<String>,
    data_rates_age: Option<String>,
    data_rates_incr: Option<String>,
}

/// The ranges a request asked for.
#[derive(Debug, Default, Clone, Copy)]
pub struct Ranges {
    /// Queue lengths (`messages`, `messages_ready`, `messages_unacknowledged`).
    pub lengths: Option<Range>,
    /// Message rates (`message_stats`, `churn_rates`).
    pub msg_rates: Option<Range>,
    /// Data rates (a connection's `recv_oct`, `send_oct`).
    pub data_rates: Option<Range>,
}

impl RangeQuery {
    /// The ranges asked for, as of now; lengths rounded as `lengths` says (RabbitMQ rounds them up
    /// on queue listings and pages, down elsewhere).
    pub fn ranges(&self, lengths: Rounding) -> Result<Ranges, super::ApiError> {
        let now_ms = now_ms();
        Ok(Ranges {
            lengths: Range::parse(self.lengths_age.as_deref(), self.lengths_incr.as_deref(), now_ms, lengths)?,
            msg_rates: Range::parse(self.msg_rates_age.as_deref(), self.msg_rates_incr.as_deref(), now_ms, Rounding::Floor)?,
            data_rates: Range::parse(self.data_rates_age.as_deref(), self.data_rates_incr.as_deref(), now_ms, Rounding::Floor)?,
        })
    }
}

/// Samples forever.
pub async fn sample_forever(broker: Arc<Broker>, rates: Arc<Rates>) {
    let mut interval = tokio::time::interval(Duration::from_millis(SAMPLE_INTERVAL_MS));
    loop {
        interval.tick().await;
        // Listing every queue takes their locks one by one: off the async workers.
        let (broker, rates) = (broker.clone(), rates.clone());
        let _ = tokio::task::spawn_blocking(move || rates.sample(&broker)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_object_keeps_fewer_samples_past_the_total_bound() {
        assert_eq!(OBJECT_SAMPLES_MAX, 122);
        assert_eq!(object_samples_max(10), OBJECT_SAMPLES_MAX);
        assert_eq!(object_samples_max(100_000), 5);
        assert_eq!(object_samples_max(10_000_000), OBJECT_SAMPLES_MIN);
    }

    #[test]
    fn a_queue_declared_again_starts_a_fresh_history() {
        let mut histories = HashMap::new();
        let key = ("/".to_owned(), "q".to_owned());
        record_object(&mut histories, key.clone(), [10, 5, 5, 0, 5, 0], queue_field::READY, 1000, 10);
        record_object(&mut histories, key.clone(), [12, 5, 5, 0, 7, 0], queue_field::READY, 2000, 10);
        assert_eq!(histories[&key].value_at(1500), [10, 5, 5, 0, 5, 0]);
        // Published went back from 12 to 1: a new queue of the same name.
        record_object(&mut histories, key.clone(), [1, 0, 0, 0, 1, 0], queue_field::READY, 3000, 10);
        assert_eq!(histories[&key].value_at(2500), [0; 6], "nothing of the old queue's history");
        assert_eq!(histories[&key].value_at(3000), [1, 0, 0, 0, 1, 0]);
    }
}
