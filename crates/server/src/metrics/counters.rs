//! Counters that only grow, behind RabbitMQ's `rabbitmq_global_*` and churn families.
//!
//! A channel counts its own publishes and deliveries; a scrape adds up the open channels and the
//! totals of the channels already closed (`RetiredTotals`). Nothing here is shared between
//! channels on the message path: a publish bumps counters only its own reader task writes, and a
//! delivery counts under the channel's ledger lock, which the delivery takes anyway.

use broker_core::exchange::ExchangeStats;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// Adds one to a counter that a single task writes (the channel's reader): a load and a store,
/// no read-modify-write instruction, so a publish pays nothing for being counted.
pub fn bump_single_writer(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// What a channel's publishes did. All but `confirmed` are written by the channel's reader task
/// only (see `bump_single_writer`); confirms are sent by the syncer too, so `confirmed` is added to.
#[derive(Debug, Default)]
pub struct PublishCounters {
    /// Messages published (basic.publish with its content), RabbitMQ's messages_received.
    pub received: AtomicU64,
    /// Of those, published on a channel in confirm mode.
    pub received_confirm: AtomicU64,
    /// Routed to at least one queue.
    pub routed: AtomicU64,
    /// Unroutable and not mandatory: dropped.
    pub unroutable_dropped: AtomicU64,
    /// Unroutable and mandatory: returned with basic.return.
    pub unroutable_returned: AtomicU64,
    /// basic.get answered with get-empty.
    pub get_empty: AtomicU64,
    /// Publishes confirmed with basic.ack.
    pub confirmed: AtomicU64,
}

/// What a channel's deliveries did; kept in its delivery ledger, under the ledger's lock.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryCounters {
    /// Delivered to a consumer that acknowledges.
    pub consume_manual_ack: u64,
    /// Delivered to a no-ack consumer.
    pub consume_auto_ack: u64,
    /// Fetched with basic.get, to be acknowledged.
    pub get_manual_ack: u64,
    /// Fetched with basic.get no-ack.
    pub get_auto_ack: u64,
    /// Deliveries and gets with the redelivered flag.
    pub redelivered: u64,
    /// Deliveries acknowledged (basic.ack).
    pub acknowledged: u64,
}

impl DeliveryCounters {
    /// Counts one delivery (`get`: by basic.get).
    pub fn count_delivery(&mut self, get: bool, no_ack: bool, redelivered: bool) {
        let counter = match (get, no_ack) {
            (false, false) => &mut self.consume_manual_ack,
            (false, true) => &mut self.consume_auto_ack,
            (true, false) => &mut self.get_manual_ack,
            (true, true) => &mut self.get_auto_ack,
        };
        *counter += 1;
        self.redelivered += u64::from(redelivered);
    }
}

/// The sum of channels' counters, as plain numbers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MessageTotals {
    /// See `PublishCounters`.
    pub received: u64,
    /// See `PublishCounters`.
    pub received_confirm: u64,
    /// See `PublishCounters`.
    pub routed: u64,
    /// See `PublishCounters`.
    pub unroutable_dropped: u64,
    /// See `PublishCounters`.
    pub unroutable_returned: u64,
    /// See `PublishCounters`.
    pub get_empty: u64,
    /// See `PublishCounters`.
    pub confirmed: u64,
    /// See `DeliveryCounters`.
    pub deliveries: DeliveryCounters,
}

impl MessageTotals {
    /// Adds one channel's counters.
    pub fn add(&mut self, publishes: &PublishCounters, deliveries: &DeliveryCounters) {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        self.received += read(&publishes.received);
        self.received_confirm += read(&publishes.received_confirm);
        self.routed += read(&publishes.routed);
        self.unroutable_dropped += read(&publishes.unroutable_dropped);
        self.unroutable_returned += read(&publishes.unroutable_returned);
        self.get_empty += read(&publishes.get_empty);
        self.confirmed += read(&publishes.confirmed);
        let sum = &mut self.deliveries;
        sum.consume_manual_ack += deliveries.consume_manual_ack;
        sum.consume_auto_ack += deliveries.consume_auto_ack;
        sum.get_manual_ack += deliveries.get_manual_ack;
        sum.get_auto_ack += deliveries.get_auto_ack;
        sum.redelivered += deliveries.redelivered;
        sum.acknowledged += deliveries.acknowledged;
    }

    /// All deliveries, RabbitMQ's messages_delivered (consumers and basic.get, either ack mode).
    pub fn delivered(&self) -> u64 {
        let deliveries = &self.deliveries;
        deliveries.consume_manual_ack + deliveries.consume_auto_ack + deliveries.get_manual_ack + deliveries.get_auto_ack
    }
}

/// A channel's publishes through its current exchange not yet added to the exchange's shared
/// [`ExchangeStats`]. A publisher sends to one exchange at a time, so the counts gather here in
/// plain integers (the channel's reader task owns them) and reach the shared atomics when the
/// exchange changes, at the end of each socket read and when the channel closes: one atomic add
/// per read, not per message, and none shared between channels on the message path.
#[derive(Debug, Default)]
pub struct PendingExchangeCounts {
    stats: Option<Arc<ExchangeStats>>,
    published_in: u64,
    published_out: u64,
}

impl PendingExchangeCounts {
    /// Counts one publish through the exchange whose stats are `stats`, routed to `queues` queues.
    pub fn count(&mut self, stats: &Arc<ExchangeStats>, queues: usize) {
        if !self.stats.as_ref().is_some_and(|current| Arc::ptr_eq(current, stats)) {
            self.flush();
            self.stats = Some(stats.clone());
        }
        self.published_in += 1;
        self.published_out += queues as u64;
    }

    /// Whether counts wait to be added.
    pub fn is_pending(&self) -> bool {
        self.published_in > 0
    }

    /// Adds the counts to the exchange's stats.
    pub fn flush(&mut self) {
        if let (Some(stats), true) = (&self.stats, self.is_pending()) {
            stats.add(self.published_in, self.published_out);
        }
        self.published_in = 0;
        self.published_out = 0;
    }
}

/// What went through a connection's socket. The reader task alone writes the receiving side and
/// the writer task alone the sending side (see `bump_single_writer`), once per socket read or
/// write: a load and a store each, nothing shared.
#[derive(Debug, Default)]
pub struct ConnectionTraffic {
    /// Bytes read from the socket (RabbitMQ's recv_oct).
    pub received_bytes: AtomicU64,
    /// Socket reads that returned data (recv_cnt).
    pub received_packets: AtomicU64,
    /// Bytes written to the socket (send_oct).
    pub sent_bytes: AtomicU64,
    /// Socket writes (send_cnt).
    pub sent_packets: AtomicU64,
}

impl ConnectionTraffic {
    /// Counts one read of `bytes` (the reader task only).
    pub fn count_read(&self, bytes: usize) {
        add_single_writer(&self.received_bytes, bytes as u64);
        bump_single_writer(&self.received_packets);
    }

    /// Counts one write of `bytes` (the writer task only).
    pub fn count_write(&self, bytes: usize) {
        add_single_writer(&self.sent_bytes, bytes as u64);
        bump_single_writer(&self.sent_packets);
    }

    /// The four counters: received bytes, received packets, sent bytes, sent packets.
    pub fn read(&self) -> [u64; 4] {
        [&self.received_bytes, &self.received_packets, &self.sent_bytes, &self.sent_packets].map(|counter| counter.load(Ordering::Relaxed))
    }
}

/// Adds `amount` to a counter that a single task writes (see [`bump_single_writer`]).
pub fn add_single_writer(counter: &AtomicU64, amount: u64) {
    counter.store(counter.load(Ordering::Relaxed) + amount, Ordering::Relaxed);
}

/// Connections, channels and queues made and gone (RabbitMQ's connection_churn_metrics).
#[derive(Debug, Default)]
pub struct ChurnCounters {
    /// Connections accepted.
    pub connections_opened: AtomicU64,
    /// Connections gone, closed by either side or dropped.
    pub connections_closed: AtomicU64,
    /// channel.open answered.
    pub channels_opened: AtomicU64,
    /// Channels closed, by either side or with their connection.
    pub channels_closed: AtomicU64,
    /// queue.declare answered (new or existing queue).
    pub queues_declared: AtomicU64,
    /// Queues made by a declare.
    pub queues_created: AtomicU64,
    /// Queues deleted (queue.delete, auto-delete, exclusive owner gone, the API).
    pub queues_deleted: AtomicU64,
    /// What closed connections received and sent, as `ConnectionTraffic::read` orders it.
    retired_traffic: [AtomicU64; 4],
}

impl ChurnCounters {
    /// Adds one to `counter` (these events are rare next to messages).
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a closed connection's traffic to the closed connections' totals.
    pub fn retire_traffic(&self, traffic: &ConnectionTraffic) {
        for (total, value) in self.retired_traffic.iter().zip(traffic.read()) {
            total.fetch_add(value, Ordering::Relaxed);
        }
    }

    /// The closed connections' traffic.
    pub fn retired_traffic(&self) -> [u64; 4] {
        self.retired_traffic.each_ref().map(|total| total.load(Ordering::Relaxed))
    }
}

/// The refusals RabbitMQ 3.10.8's stream plugin counts, in its order, with its help texts
/// (`rabbit_stream_metrics.hrl`): the response codes 0x02 to 0x12, so a code's counter is at index
/// `code - 2`. Each is written as `rabbitmq_global_stream_error_<name>_total{protocol="stream"}`.
pub const STREAM_ERRORS: [(&str, &str); 17] = [
    ("stream_does_not_exist", "Total number of commands rejected with stream does not exist error"),
    ("subscription_id_already_exists", "Total number of commands failed with subscription id already exists"),
    ("subscription_id_does_not_exist", "Total number of commands failed with subscription id does not exist"),
    ("stream_already_exists", "Total number of commands failed with stream already exists"),
    ("stream_not_available", "Total number of commands failed with stream not available"),
    ("sasl_mechanism_not_supported", "Total number of commands failed with sasl mechanism not supported"),
    ("authentication_failure", "Total number of commands failed with authentication failure"),
    ("sasl_error", "Total number of commands failed with sasl error"),
    ("sasl_challenge", "Total number of commands failed with sasl challenge"),
    ("sasl_authentication_failure_loopback", "Total number of commands failed with sasl authentication failure loopback"),
    ("vhost_access_failure", "Total number of commands failed with vhost access failure"),
    ("unknown_frame", "Total number of commands failed with unknown frame"),
    ("frame_too_large", "Total number of commands failed with frame too large"),
    ("internal_error", "Total number of commands failed with internal error"),
    ("access_refused", "Total number of commands failed with access refused"),
    ("precondition_failed", "Total number of commands failed with precondition failed"),
    ("publisher_does_not_exist", "Total number of commands failed with publisher does not exist"),
];

/// The wire value of the first response code in [`STREAM_ERRORS`] (STREAM_DOES_NOT_EXIST).
const STREAM_ERROR_FIRST_CODE: u16 = 0x02;

/// The RabbitMQ Stream protocol's node-wide counters, RabbitMQ's `rabbit_global_counters` with
/// `protocol="stream"`. Message counts reach them from each connection's
/// [`PendingStreamCounts`] once per pass of its socket loop, not per message; refusals and the
/// two gauges change on commands that are rare next to messages and are added to directly.
#[derive(Debug, Default)]
pub struct StreamProtocolCounters {
    /// Messages in publish frames of declared publishers (messages_received, and
    /// messages_received_confirm: every stream publish expects a confirm).
    pub received: AtomicU64,
    /// Publishing ids confirmed to publishers (messages_confirmed).
    pub confirmed: AtomicU64,
    /// Entries of the chunks sent to subscriptions (messages_delivered).
    pub delivered: AtomicU64,
    /// Publishers declared and not yet deleted, on open connections.
    pub publishers: AtomicI64,
    /// Subscriptions open, on open connections.
    pub consumers: AtomicI64,
    /// Commands refused, by response code (see [`STREAM_ERRORS`]).
    errors: [AtomicU64; STREAM_ERRORS.len()],
}

impl StreamProtocolCounters {
    /// Counts one command answered with the response code `code` (its wire value); codes that
    /// RabbitMQ keeps no counter for (OK, NO_OFFSET, unknown values) are not counted.
    pub fn count_error(&self, code: u16) {
        if let Some(counter) = code.checked_sub(STREAM_ERROR_FIRST_CODE).and_then(|index| self.errors.get(usize::from(index))) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Each refusal counter with its name and help text, in [`STREAM_ERRORS`] order.
    pub fn errors(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
        STREAM_ERRORS.into_iter().zip(&self.errors).map(|((name, help), counter)| (name, help, counter.load(Ordering::Relaxed)))
    }
}

/// One stream connection's message counts and open publishers and subscriptions not yet added to
/// the node's [`StreamProtocolCounters`]: plain integers its socket task owns, added in one step
/// per pass of the task's loop (a few atomic adds per socket read or delivery batch, none per
/// message) and when the connection ends.
#[derive(Debug, Default)]
pub struct PendingStreamCounts {
    /// Messages received, not yet added.
    pub received: u64,
    /// Publishing ids confirmed, not yet added.
    pub confirmed: u64,
    /// Chunk entries delivered, not yet added.
    pub delivered: u64,
    /// The connection's publishers as last added to the node's gauge.
    publishers_added: usize,
    /// The connection's subscriptions as last added to the node's gauge.
    consumers_added: usize,
}

impl PendingStreamCounts {
    /// Adds the counts to `node`, and the change in the connection's `publishers` and
    /// `consumers` since the last flush to its gauges (a closing connection flushes with zeros).
    pub fn flush(&mut self, node: &StreamProtocolCounters, publishers: usize, consumers: usize) {
        for (pending, total) in
            [(&mut self.received, &node.received), (&mut self.confirmed, &node.confirmed), (&mut self.delivered, &node.delivered)]
        {
            if *pending > 0 {
                total.fetch_add(std::mem::take(pending), Ordering::Relaxed);
            }
        }
        for (now, added, gauge) in
            [(publishers, &mut self.publishers_added, &node.publishers), (consumers, &mut self.consumers_added, &node.consumers)]
        {
            if now != *added {
                gauge.fetch_add(now as i64 - *added as i64, Ordering::Relaxed);
                *added = now;
            }
        }
    }
}

/// The counters of channels already closed, so that the broker's totals never go back when a
/// channel closes. A closing channel adds its counters here and leaves its connection's list of
/// open channels under this lock, and a scrape reads this and the open channels under it too:
/// a channel is counted exactly once, never twice and never not at all.
#[derive(Debug, Default)]
pub struct RetiredTotals {
    totals: parking_lot::Mutex<MessageTotals>,
}

impl RetiredTotals {
    /// Runs `retire` (which removes channels from their connection's list) and adds what it
    /// returns, as one step a scrape cannot see half of.
    pub fn retire<R>(&self, retire: impl FnOnce(&mut MessageTotals) -> R) -> R {
        let mut totals = self.totals.lock();
        retire(&mut totals)
    }

    /// Reads the retired totals and, under the same lock, adds what `open` counts.
    pub fn read_with(&self, open: impl FnOnce(&mut MessageTotals)) -> MessageTotals {
        let totals = self.totals.lock();
        let mut sum = *totals;
        open(&mut sum);
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_are_counted_by_kind_and_summed() {
        let mut deliveries = DeliveryCounters::default();
        deliveries.count_delivery(false, false, false);
        deliveries.count_delivery(false, true, true);
        deliveries.count_delivery(true, false, false);
        deliveries.count_delivery(true, true, true);
        deliveries.count_delivery(true, true, false);
        let publishes = PublishCounters::default();
        bump_single_writer(&publishes.received);
        bump_single_writer(&publishes.received);
        publishes.confirmed.fetch_add(2, Ordering::Relaxed);
        let mut totals = MessageTotals::default();
        totals.add(&publishes, &deliveries);
        totals.add(&publishes, &deliveries);
        assert_eq!(totals.received, 4);
        assert_eq!(totals.confirmed, 4);
        assert_eq!(totals.deliveries.get_auto_ack, 4);
        assert_eq!(totals.deliveries.redelivered, 4);
        assert_eq!(totals.delivered(), 10);
    }

    #[test]
    fn exchange_counts_reach_the_exchange_when_flushed_or_when_the_exchange_changes() {
        let (first, second) = (Arc::new(ExchangeStats::default()), Arc::new(ExchangeStats::default()));
        let mut pending = PendingExchangeCounts::default();
        pending.count(&first, 3);
        pending.count(&first, 0);
        assert_eq!(first.published_in.load(Ordering::Relaxed), 0, "not before a flush");
        pending.count(&second, 1);
        assert_eq!((first.published_in.load(Ordering::Relaxed), first.published_out.load(Ordering::Relaxed)), (2, 3));
        assert!(pending.is_pending());
        pending.flush();
        pending.flush();
        assert_eq!((second.published_in.load(Ordering::Relaxed), second.published_out.load(Ordering::Relaxed)), (1, 1));
        assert!(!pending.is_pending());
    }

    #[test]
    fn a_retired_channel_is_counted_once() {
        let retired = RetiredTotals::default();
        let publishes = PublishCounters::default();
        bump_single_writer(&publishes.routed);
        let mut open = true;
        let before = retired.read_with(|sum| {
            if open {
                sum.add(&publishes, &DeliveryCounters::default())
            }
        });
        retired.retire(|totals| {
            open = false;
            totals.add(&publishes, &DeliveryCounters::default());
        });
        let after = retired.read_with(|sum| {
            if open {
                sum.add(&publishes, &DeliveryCounters::default())
            }
        });
        assert_eq!((before.routed, after.routed), (1, 1));
    }

    #[test]
    fn stream_refusals_are_counted_by_response_code_and_gauges_follow_the_connection() {
        let node = StreamProtocolCounters::default();
        for code in [0x01, 0x02, 0x02, 0x12, 0x13, 0x99] {
            node.count_error(code);
        }
        let errors: Vec<(&str, u64)> = node.errors().filter(|(_, _, value)| *value > 0).map(|(name, _, value)| (name, value)).collect();
        assert_eq!(errors, [("stream_does_not_exist", 2), ("publisher_does_not_exist", 1)]);
        let mut pending = PendingStreamCounts { received: 5, confirmed: 4, delivered: 3, ..Default::default() };
        pending.flush(&node, 2, 1);
        pending.flush(&node, 1, 3);
        let read = |counter: &AtomicI64| counter.load(Ordering::Relaxed);
        assert_eq!((read(&node.publishers), read(&node.consumers)), (1, 3));
        assert_eq!(node.received.load(Ordering::Relaxed), 5, "flushed once");
        pending.flush(&node, 0, 0);
        assert_eq!((read(&node.publishers), read(&node.consumers)), (0, 0));
    }
}
