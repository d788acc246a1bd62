//! Command-line options of `lepus perf`, named after the Artemis `perf` options they mirror.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// lepus perf: throughput and latency of an AMQP 0-9-1 broker (Lepus, RabbitMQ, ...).
#[derive(Parser, Debug)]
#[command(name = "lepus perf")]
pub struct PerfCli {
    /// Which side(s) to run.
    #[command(subcommand)]
    pub mode: Mode,
}

/// The three ways to run.
#[derive(Subcommand, Debug, Clone)]
pub enum Mode {
    /// Producers and consumers in one process (end-to-end latency on one clock).
    Client(PerfArgs),
    /// Producers only (consumers run elsewhere, maybe later).
    Producer(PerfArgs),
    /// Consumers only.
    Consumer(PerfArgs),
    /// A stand-in broker that confirms every publish at once: run `lepus perf producer` against
    /// it to measure the load generator's own ceiling.
    Sink(SinkArgs),
}

/// Options of `lepus perf sink`.
#[derive(Args, Debug, Clone)]
pub struct SinkArgs {
    /// Loopback port to listen on.
    #[arg(long, default_value_t = 5699)]
    pub port: u16,
    /// Seconds to serve before exiting.
    #[arg(long, default_value_t = 600)]
    pub lifetime: u64,
}

impl Mode {
    /// The options of a load mode (`None` for the sink).
    pub fn args(&self) -> Option<&PerfArgs> {
        match self {
            Mode::Client(args) | Mode::Producer(args) | Mode::Consumer(args) => Some(args),
            Mode::Sink(_) => None,
        }
    }

    /// The mode's name.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Client(_) => "client",
            Mode::Producer(_) => "producer",
            Mode::Consumer(_) => "consumer",
            Mode::Sink(_) => "sink",
        }
    }
}

/// Options shared by every mode.
#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// `queue://NAME` (a queue, default exchange) or `topic://NAME` (a topic exchange with one
    /// queue per subscriber).
    #[arg(default_value = "queue://lepus-perf")]
    pub destination: String,
    /// Broker URL. Given several times (one per node of a cluster), producers and consumers are
    /// spread over the URLs, round robin, as RabbitMQ PerfTest spreads them over its --uris.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/", action = clap::ArgAction::Append)]
    pub url: Vec<String>,
    /// The queues' type: classic (declared without x-queue-type), quorum or stream (declared
    /// durable with x-queue-type).
    #[arg(long, value_enum)]
    pub queue_type: Option<QueueType>,
    /// The same as --queue-type quorum (RabbitMQ PerfTest's --quorum-queue).
    #[arg(long, conflicts_with = "queue_type")]
    pub quorum_queue: bool,
    /// Queue arguments as KEY=VALUE pairs separated by commas (RabbitMQ PerfTest's --queue-args,
    /// e.g. x-max-length=100000,x-overflow=reject-publish): integers are sent as longs,
    /// true and false as booleans, anything else as a string.
    #[arg(long)]
    pub queue_args: Option<String>,
    /// Broker URL for consumers (default: --url).
    #[arg(long)]
    pub consumer_url: Option<String>,
    /// Number of destinations: NAME0..NAME(N-1) when N > 1.
    #[arg(long, default_value_t = 1)]
    pub num_destinations: u32,
    /// Producers per destination.
    #[arg(long, default_value_t = 1)]
    pub producers: u32,
    /// Consumers per destination (on a topic: one subscription each).
    #[arg(long, default_value_t = 1)]
    pub consumers: u32,
    /// Runtime worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Message body size in bytes (the first 8 carry the send timestamp).
    #[arg(long, default_value_t = 1024)]
    pub message_size: usize,
    /// Publish persistent messages (delivery-mode 2).
    #[arg(long)]
    pub persistent: bool,
    /// Durable queues, exchanges and subscriptions.
    #[arg(long)]
    pub durable: bool,
    /// Target total publish rate in msg/s over all producers (open loop); all-out when absent.
    #[arg(long)]
    pub rate: Option<f64>,
    /// How sends wait for their intended time under --rate: `precise` sleeps the thread for the
    /// last stretch (about 50 us late, a few us of CPU per wait); `timer` uses tokio's
    /// millisecond timer alone (up to 1 ms late, cheapest).
    #[arg(long, value_enum, default_value_t = Pacing::Precise)]
    pub pacing: Pacing,
    /// Most unconfirmed publishes per producer.
    #[arg(long, default_value_t = 1000)]
    pub max_pending: u32,
    /// Warm-up seconds, reported apart and left out of the summary.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Measured seconds after the warm-up (default 60 unless --message-count is given).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Messages per producer (producer, client) or in total (consumer).
    #[arg(long)]
    pub message_count: Option<u64>,
    /// Publish in transactions of N messages (tx.commit) instead of with confirms.
    #[arg(long)]
    pub tx_size: Option<u32>,
    /// Publish synchronously in batches of A or A-B (random size) messages, waiting for all their
    /// confirms before the next batch.
    #[arg(long)]
    pub batch_size: Option<String>,
    /// Consumers ack every A or A-B (random) messages with multiple=true.
    #[arg(long, default_value = "1")]
    pub ack_every: String,
    /// Consumers start at this `x-stream-offset` (stream queues): first, last, next, an offset or
    /// an interval such as `1h`. With `--protocol stream`, the subscription's offset: `first`,
    /// `last`, `next` (the default there), an offset, or `@MS` (a timestamp, ms since the epoch).
    #[arg(long)]
    pub stream_offset: Option<String>,
    /// Consumer prefetch (basic.qos).
    #[arg(long, default_value_t = 1000)]
    pub prefetch: u16,
    /// Print latency percentiles every second.
    #[arg(long)]
    pub show_latency: bool,
    /// Write an HdrHistogram interval log here.
    #[arg(long)]
    pub hdr: Option<PathBuf>,
    /// Write the per-second series and the summary as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Delete the queues and exchanges at the end (default in client mode).
    #[arg(long)]
    pub cleanup: bool,
    /// Keep the queues and exchanges at the end (client mode).
    #[arg(long, conflicts_with = "cleanup")]
    pub keep: bool,
    /// Seconds consumers may take to drain what was sent once producers stop (client mode).
    #[arg(long, default_value_t = 10)]
    pub drain_timeout: u64,
    /// Quiet: print only the summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// The end-to-end (transfer) p99, in milliseconds, under which a rate that consumers kept up
    /// with counts as sustained (client mode; issue 17's target is 10 ms).
    #[arg(long, default_value_t = 10.0)]
    pub sustained_p99_ms: f64,
    /// Time latencies from when each message was actually sent instead of from its intended time
    /// under `--rate`. Above the rate a broker sustains, flow control delays the sends; the
    /// intended-time latency then grows with the producer's lag, while this one shows what the
    /// broker adds (the send delay still shows the lag).
    #[arg(long)]
    pub latency_from_sent: bool,
    /// The protocol: `amqp` (0-9-1) or `stream`, the RabbitMQ Stream protocol (port 5552), where
    /// destinations (`stream://NAME` or `queue://NAME`) are streams, created when missing, and
    /// --url is `rabbitmq-stream://user:password@host:5552/vhost`.
    #[arg(long, value_enum, default_value_t = Protocol::Amqp)]
    pub protocol: Protocol,
    /// Stream protocol: chunks a subscription may have in flight (its initial credit; it gives
    /// one more per chunk received, as RabbitMQ's clients do).
    #[arg(long, default_value_t = 10)]
    pub stream_credit: u16,
    /// Stream protocol: most messages per publish frame (RabbitMQ's clients batch 100).
    #[arg(long, default_value_t = 100)]
    pub stream_batch_size: u32,
}

/// The wire protocol of a perf run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// AMQP 0-9-1.
    Amqp,
    /// The RabbitMQ Stream protocol.
    Stream,
}

/// A queue type `--queue-type` names.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueType {
    /// A classic queue (no x-queue-type argument).
    Classic,
    /// A quorum queue.
    Quorum,
    /// A stream queue.
    Stream,
}

impl PerfArgs {
    /// The queue type asked for (--queue-type, or --quorum-queue).
    pub fn queue_type(&self) -> QueueType {
        match (self.queue_type, self.quorum_queue) {
            (Some(queue_type), _) => queue_type,
            (None, true) => QueueType::Quorum,
            (None, false) => QueueType::Classic,
        }
    }

    /// The queues' declaration arguments: --queue-args, and x-queue-type unless classic.
    pub fn queue_arguments(&self) -> Result<amqp_codec::FieldTable, String> {
        let mut arguments = match &self.queue_args {
            Some(text) => parse_queue_arguments(text)?,
            None => amqp_codec::FieldTable::default(),
        };
        match self.queue_type() {
            QueueType::Classic => {}
            QueueType::Quorum => arguments.insert("x-queue-type", amqp_codec::FieldValue::LongStr(bytes::Bytes::from_static(b"quorum"))),
            QueueType::Stream => arguments.insert("x-queue-type", amqp_codec::FieldValue::LongStr(bytes::Bytes::from_static(b"stream"))),
        }
        Ok(arguments)
    }
}

/// `KEY=VALUE,KEY=VALUE` as a field table (see [`PerfArgs::queue_args`]).
pub fn parse_queue_arguments(text: &str) -> Result<amqp_codec::FieldTable, String> {
    use amqp_codec::FieldValue;
    let mut arguments = amqp_codec::FieldTable::default();
    for pair in text.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("--queue-args: {pair:?} is not KEY=VALUE"));
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            return Err(format!("--queue-args: {pair:?} has no key"));
        }
        let value = match (value.parse::<i64>(), value) {
            (Ok(number), _) => FieldValue::I64(number),
            (_, "true") => FieldValue::Bool(true),
            (_, "false") => FieldValue::Bool(false),
            (_, text) => FieldValue::LongStr(bytes::Bytes::from(text.to_string())),
        };
        arguments.insert(key, value);
    }
    Ok(arguments)
}

/// How producers wait for intended send times.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Thread sleep for the last stretch: about 50 us of lateness.
    Precise,
    /// tokio's timer alone: up to 1 ms of lateness, least CPU.
    Timer,
}

/// An inclusive range parsed from `A` or `A-B`.
pub fn parse_range(text: &str) -> Result<(u32, u32), String> {
    let (low, high) = match text.split_once('-') {
        Some((low, high)) => (low, high),
        None => (text, text),
    };
    let parse = |part: &str| part.trim().parse::<u32>().map_err(|_| format!("{text:?} is not N or A-B"));
    let (low, high) = (parse(low)?, parse(high)?);
    if low == 0 || high < low {
        return Err(format!("{text:?}: need 1 <= A <= B"));
    }
    Ok((low, high))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_types_arguments_and_several_urls() {
        let cli = PerfCli::try_parse_from([
            "lepus perf",
            "client",
            "--url",
            "amqp://a/",
            "--url",
            "amqp://b/",
            "--quorum-queue",
            "--queue-args",
            "x-max-length=10, x-overflow=reject-publish,x-single-active-consumer=true",
        ])
        .unwrap();
        let args = cli.mode.args().unwrap();
        assert_eq!(args.url, vec!["amqp://a/", "amqp://b/"]);
        assert_eq!(args.queue_type(), QueueType::Quorum);
        let arguments = args.queue_arguments().unwrap();
        assert_eq!(arguments.get("x-max-length"), Some(&amqp_codec::FieldValue::I64(10)));
        assert_eq!(arguments.get("x-single-active-consumer"), Some(&amqp_codec::FieldValue::Bool(true)));
        assert_eq!(arguments.get("x-overflow").and_then(|value| value.as_text()).as_deref(), Some("reject-publish"));
        assert_eq!(arguments.get("x-queue-type").and_then(|value| value.as_text()).as_deref(), Some("quorum"));
        let default = PerfCli::try_parse_from(["lepus perf", "client", "--queue-type", "stream"]).unwrap();
        let args = default.mode.args().unwrap();
        assert_eq!(args.url, vec!["amqp://guest:guest@127.0.0.1:5672/"]);
        assert_eq!(args.queue_type(), QueueType::Stream);
        assert!(parse_queue_arguments("novalue").is_err());
        assert!(PerfCli::try_parse_from(["lepus perf", "client", "--queue-type", "quorum", "--quorum-queue"]).is_err());
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("5"), Ok((5, 5)));
        assert_eq!(parse_range("1-10"), Ok((1, 10)));
        assert!(parse_range("0").is_err());
        assert!(parse_range("9-2").is_err());
        assert!(parse_range("x").is_err());
    }

    #[test]
    fn parses_artemis_like_command() {
        let cli = PerfCli::try_parse_from([
            "lepus perf",
            "client",
            "--warmup",
            "20",
            "--max-pending",
            "100",
            "--show-latency",
            "--producers",
            "3",
            "--consumers",
            "2",
            "--num-destinations",
            "10",
            "--durable",
            "--persistent",
            "topic://TEST",
        ])
        .unwrap();
        let args = cli.mode.args().unwrap();
        assert_eq!(args.destination, "topic://TEST");
        assert_eq!((args.producers, args.consumers, args.num_destinations), (3, 2, 10));
        assert!(args.durable && args.persistent && args.show_latency);
    }
}
