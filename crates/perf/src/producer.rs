//! A producer: one connection, one channel, a writer loop and a confirm-reader task.
//!
//! Open loop under a rate: message i has an intended send time `start + i / rate`; the timestamp
//! carried in the message and the start of its send-ack time are that intended time, so a broker
//! that stalls the producer shows up as latency instead of silently lowering the load (the
//! coordinated-omission correction Artemis perf and OMB make). How late each send actually went
//! out is recorded as the send delay.

use crate::control::Control;
use crate::stats::{Clock, Metric, WorkerStats};
use amqp_codec::{BasicProperties, FramePayload, Method, TxCommit};
use lepus_client::{AmqpUrl, ClientError, Connection, ConnectionOptions, FrameReader, Publish};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How publishes are completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Publisher confirms, at most `max_pending` unconfirmed.
    Confirms {
        /// The window.
        max_pending: u32,
    },
    /// Batches of a random size in the range, each waited for in full (synchronous confirms).
    Batches {
        /// Smallest batch.
        min: u32,
        /// Largest batch.
        max: u32,
    },
    /// Transactions of `size` messages.
    Transactions {
        /// Messages per tx.commit.
        size: u32,
    },
}

impl Completion {
    fn window(self) -> u64 {
        match self {
            Completion::Confirms { max_pending } => u64::from(max_pending.max(1)),
            Completion::Batches { max, .. } => u64::from(max),
            Completion::Transactions { size } => u64::from(size),
        }
    }
}

/// What one producer does.
#[derive(Clone)]
pub struct ProducerSpec {
    /// For connection names and errors.
    pub name: String,
    /// Broker.
    pub url: AmqpUrl,
    /// Exchange to publish to ("" = default exchange).
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Persistent messages.
    pub persistent: bool,
    /// Confirms, batches or transactions.
    pub completion: Completion,
    /// Stop after this many messages.
    pub message_count: Option<u64>,
    /// Bodies to cycle through, all of one size.
    pub payloads: Arc<Vec<Vec<u8>>>,
    /// Wait for intended send times precisely (thread sleeps) rather than on tokio's timer alone.
    pub precise_pacing: bool,
    /// Stamp messages (and start their send-ack time) when sent rather than when intended.
    pub latency_from_sent: bool,
}

/// Unconfirmed publishes, shared by the writer loop and the confirm reader (of either protocol).
pub(crate) struct Pending {
    /// Send time (monotonic ns + 1; 0 = free) by sequence number modulo the ring size.
    pub(crate) slots: Vec<AtomicU64>,
    pub(crate) mask: u64,
    /// Highest sequence number published.
    pub(crate) published: AtomicU64,
    /// Publishes confirmed, nacked or committed.
    pub(crate) completed: AtomicU64,
    /// The sequence number a tx.commit covers, for the reader to complete on commit-ok.
    commit_mark: AtomicU64,
    pub(crate) notify: Notify,
}

impl Pending {
    pub(crate) fn new(window: u64) -> Pending {
        // Twice the window, so a slot is never reused while the reader may still look at it.
        let size = (2 * window + 2).next_power_of_two();
        Pending {
            slots: (0..size).map(|_| AtomicU64::new(0)).collect(),
            mask: size - 1,
            published: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            commit_mark: AtomicU64::new(0),
            notify: Notify::new(),
        }
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.published.load(Ordering::Acquire) - self.completed.load(Ordering::Acquire)
    }
}

/// Runs one producer until the control says stop, the count is reached or the broker fails.
pub async fn run_producer(spec: ProducerSpec, control: Arc<Control>, stats: Arc<WorkerStats>, clock: Clock) -> Result<(), ClientError> {
    let options = ConnectionOptions { connection_name: spec.name.clone(), ..ConnectionOptions::default() };
    let mut connection = Connection::open(&spec.url, &options).await?;
    connection.channel_open(1).await?;
    match spec.completion {
        Completion::Transactions { .. } => connection.tx_select(1).await?,
        _ => connection.confirm_select(1).await?,
    }
    let (reader, mut writer) = connection.split();
    let pending = Arc::new(Pending::new(spec.completion.window()));
    let confirm_task = tokio::spawn(read_confirms(reader, pending.clone(), stats.clone(), clock));
    let body_bytes = spec.payloads.first().map_or(0, Vec::len);
    let properties = BasicProperties { delivery_mode: Some(if spec.persistent { 2 } else { 1 }), ..BasicProperties::default() };
    let publish = Publish::new(1, &spec.exchange, &spec.routing_key, &properties, body_bytes);
    let mut body = spec.payloads.first().cloned().unwrap_or_default();
    let mut rng = rand::rngs::StdRng::from_entropy();
    let window = spec.completion.window();
    let mut batch_left = 0u64;

    // The schedule restarts whenever the rate changes (lepus bench adjusts it while running).
    let mut rate = control.rate();
    let mut schedule_start = Instant::now();
    let mut schedule_sent = 0u64;
    let mut sent = 0u64;
    let result: Result<(), ClientError> = async {
        loop {
            if control.stopped() || spec.message_count.is_some_and(|count| sent >= count) {
                break;
            }
            if confirm_task.is_finished() {
                // The reader only ends on an error; its result is read below.
                break;
            }
            // Wait for room: the window, or the previous batch or transaction to complete.
            let must_wait = match spec.completion {
                Completion::Confirms { .. } => pending.in_flight() >= window,
                _ => batch_left == 0 && pending.in_flight() > 0,
            };
            if must_wait {
                stats.blocked.fetch_add(1, Ordering::Relaxed);
                writer.flush().await?;
                wait_for_room(&pending, &control, &spec.completion, window).await;
                continue;
            }
            if batch_left == 0 {
                batch_left = match spec.completion {
                    Completion::Confirms { .. } => u64::MAX,
                    Completion::Batches { min, max } => u64::from(rng.gen_range(min..=max)),
                    Completion::Transactions { size } => u64::from(size),
                };
            }
            let new_rate = control.rate();
            if new_rate != rate {
                rate = new_rate;
                schedule_start = Instant::now();
                schedule_sent = sent;
            }
            let now = Instant::now();
            let intended = if rate > 0.0 {
                let offset_s = (sent - schedule_sent) as f64 / rate;
                let intended = schedule_start + Duration::from_secs_f64(offset_s);
                if intended > now {
                    writer.flush().await?;
                    writer.heartbeat_if_due();
                    wait_until(intended, now, &control, spec.precise_pacing).await;
                    continue;
                }
                stats.record(Metric::SendDelay, (now - intended).as_nanos() as u64);
                if spec.latency_from_sent {
                    now
                } else {
                    intended
                }
            } else {
                now
            };
            // Body: a pooled payload, its first 8 bytes the wall-clock send time.
            if spec.payloads.len() > 1 {
                body.copy_from_slice(&spec.payloads[(sent as usize) % spec.payloads.len()]);
            }
            if body.len() >= 8 {
                body[..8].copy_from_slice(&clock.wall_ns(intended).to_be_bytes());
            }
            let sequence = sent + 1;
            pending.slots[(sequence & pending.mask) as usize].store(clock.mono_ns(intended) + 1, Ordering::Release);
            pending.published.store(sequence, Ordering::Release);
            writer.publish(&publish, &body);
            sent = sequence;
            stats.sent.fetch_add(1, Ordering::Relaxed);
            stats.sent_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
            batch_left -= 1;
            if batch_left == 0 {
                if let Completion::Transactions { .. } = spec.completion {
                    pending.commit_mark.store(sequence, Ordering::Release);
                    writer.method(1, &Method::TxCommit(TxCommit::default()));
                }
                writer.flush().await?;
            } else if writer.pending_bytes() >= 64 * 1024 {
                writer.flush().await?;
            }
        }
        if let Completion::Transactions { .. } = spec.completion {
            if pending.commit_mark.load(Ordering::Acquire) < sent {
                // Commit the partial last transaction so its messages count.
                pending.commit_mark.store(sent, Ordering::Release);
                writer.method(1, &Method::TxCommit(TxCommit::default()));
            }
        }
        writer.flush().await?;
        // Give outstanding confirms a bounded time to arrive.
        let deadline = Instant::now() + Duration::from_secs(5);
        while pending.in_flight() > 0 && Instant::now() < deadline && !confirm_task.is_finished() {
            let _ = tokio::time::timeout(Duration::from_millis(50), pending.notify.notified()).await;
        }
        Ok(())
    }
    .await;
    if confirm_task.is_finished() {
        match confirm_task.await {
            Ok(Err(error)) => return Err(error),
            Ok(Ok(())) => {}
            Err(join) => return Err(ClientError::Protocol(format!("confirm reader: {join}"))),
        }
    } else {
        confirm_task.abort();
    }
    result?;
    // Polite close: the broker logs an abrupt one as an error.
    writer.method(
        0,
        &Method::ConnectionClose(amqp_codec::ConnectionClose {
            reply_code: 200,
            reply_text: amqp_codec::ShortStr::from_static("Goodbye"),
            ..Default::default()
        }),
    );
    let _ = writer.flush().await;
    Ok(())
}

/// Waits for a send's intended time, precisely but without spinning: tokio's timer ticks in
/// whole milliseconds, which would add up to a millisecond of the tool's own lateness to every
/// send delay and transfer time. Long waits sleep on the tokio timer to a millisecond before; the
/// last stretch sleeps the thread (Linux timer slack: about 50 us late) with the worker's other
/// tasks handed to another thread meanwhile. Everything that is due is then sent in one go, so at
/// high rates one wait covers several messages. Spinning is avoided on purpose: on a machine the
/// broker shares, a spinning load generator would take CPU from the broker it measures.
pub(crate) async fn wait_until(intended: Instant, now: Instant, control: &Control, precise: bool) {
    let remaining = intended - now;
    if !precise {
        tokio::select! {
            _ = tokio::time::sleep_until(intended.into()) => {}
            _ = control.changed.notified() => {}
        }
    } else if remaining > Duration::from_millis(2) {
        tokio::select! {
            _ = tokio::time::sleep_until((intended - Duration::from_millis(1)).into()) => {}
            _ = control.changed.notified() => {}
        }
    } else {
        tokio::task::block_in_place(|| std::thread::sleep(remaining));
    }
}

pub(crate) async fn wait_for_room(pending: &Pending, control: &Control, completion: &Completion, window: u64) {
    let room = || match completion {
        Completion::Confirms { .. } => pending.in_flight() < window,
        _ => pending.in_flight() == 0,
    };
    while !room() && !control.stopped() {
        let notified = pending.notify.notified();
        if room() {
            break;
        }
        // The timeout bounds the wait should a wake-up be missed or the reader die.
        let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
    }
}

/// Reads confirms (or commit-oks) and records send-ack latencies until the connection ends.
async fn read_confirms(mut reader: FrameReader, pending: Arc<Pending>, stats: Arc<WorkerStats>, clock: Clock) -> Result<(), ClientError> {
    // Lowest sequence number not yet completed.
    let mut lowest = 1u64;
    loop {
        let frame = reader.next_frame().await?;
        let FramePayload::Method(method) = frame.payload else {
            continue;
        };
        let (tag, multiple, nacked) = match method {
            Method::BasicAck(ack) => (ack.delivery_tag, ack.multiple, false),
            Method::BasicNack(nack) => (nack.delivery_tag, nack.multiple, true),
            Method::TxCommitOk(_) => (pending.commit_mark.load(Ordering::Acquire), true, false),
            Method::ConnectionBlocked(blocked) => {
                eprintln!("warning: the broker blocked publishing: {}", blocked.reason.to_string_lossy());
                continue;
            }
            _ => continue,
        };
        let now_ns = clock.mono_ns(Instant::now());
        let first = if multiple { lowest } else { tag };
        let mut count = 0u64;
        stats.record_with(Metric::SendAck, |histogram| {
            for sequence in first..=tag {
                let sent_ns = pending.slots[(sequence & pending.mask) as usize].swap(0, Ordering::AcqRel);
                if sent_ns != 0 {
                    histogram.saturating_record(now_ns.saturating_sub(sent_ns - 1).max(1));
                    count += 1;
                }
            }
        });
        let published = pending.published.load(Ordering::Acquire);
        while lowest <= published && pending.slots[(lowest & pending.mask) as usize].load(Ordering::Acquire) == 0 {
            lowest += 1;
        }
        if nacked {
            stats.nacked.fetch_add(count, Ordering::Relaxed);
        } else {
            stats.completed.fetch_add(count, Ordering::Relaxed);
        }
        pending.completed.fetch_add(count, Ordering::AcqRel);
        pending.notify.notify_one();
    }
}
