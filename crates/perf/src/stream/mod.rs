//! `lepus perf --protocol stream`: the same producers, consumers, latencies and reports as the
//! AMQP 0-9-1 mode, over the RabbitMQ Stream protocol (port 5552), against Lepus or RabbitMQ.
//!
//! Producers publish with confirms (send-ack latency: publish to confirm), consumers subscribe
//! with credit (transfer latency: send time carried in the message to its delivery), so the
//! figures compare with the AMQP mode's and with RabbitMQ's stream-perf-test. A destination
//! (`stream://NAME`, or `queue://NAME`) is a stream, created when missing and deleted at the end
//! of a client run as the AMQP mode deletes its queues.

pub mod connection;
pub mod consumer;
pub mod message;
pub mod producer;

use crate::cli::{Mode, PerfArgs};
use crate::control::Control;
use crate::run::{conclude, duration_s, Outcome, RunShape, Workers};
use crate::stats::{Clock, Registry};
use connection::{StreamConnection, StreamError, StreamUrl};
use consumer::{parse_offset, run_stream_consumer, StreamConsumerSpec};
use producer::{run_stream_producer, StreamProducerSpec};
use std::sync::Arc;
use std::time::Duration;
use stream_codec::{ClientCommand, ResponseCode, ServerCommand, Text};
use tokio::task::JoinSet;

/// The stream names a destination expands to (`NAME0..` when there are several).
pub fn stream_names(destination: &str, count: u32) -> Result<Vec<String>, String> {
    let name = match destination.split_once("://") {
        Some(("stream" | "queue", name)) => name,
        _ => return Err(format!("destination {destination:?}: expected stream://NAME with --protocol stream")),
    };
    if name.is_empty() || name.len() > 200 {
        return Err(format!("destination {destination:?}: the name must have 1 to 200 bytes"));
    }
    Ok(if count <= 1 { vec![name.to_string()] } else { (0..count).map(|index| format!("{name}{index}")).collect() })
}

/// Runs one perf command over the stream protocol.
pub async fn run(mode: Mode, args: PerfArgs) -> Result<Outcome, String> {
    if args.tx_size.is_some() || args.batch_size.is_some() {
        return Err("--tx-size and --batch-size are AMQP 0-9-1 modes: the stream protocol publishes with confirms".to_string());
    }
    if args.max_pending == 0 {
        return Err("--max-pending must be at least 1".to_string());
    }
    let producing = !matches!(mode, Mode::Consumer(_));
    let consuming = !matches!(mode, Mode::Producer(_));
    // The stream protocol runs against the first --url (spreading over several is AMQP's).
    let url = StreamUrl::parse(&args.url[0])?;
    let consumer_url = match &args.consumer_url {
        Some(text) => StreamUrl::parse(text)?,
        None => url.clone(),
    };
    let streams = stream_names(&args.destination, args.num_destinations)?;
    let offset = parse_offset(args.stream_offset.as_deref().unwrap_or("next"))?;
    if args.message_size < 8 {
        eprintln!("note: messages under 8 bytes carry no timestamp: no transfer latency");
    }
    let setup_url = if producing { &url } else { &consumer_url };
    let broker = create_streams(setup_url, &streams).await.map_err(|error| error.to_string())?;
    println!(
        "lepus perf {} --protocol stream: {} against {} ({}), {} stream(s), {} producer(s) and {} consumer(s) each, {} B messages, {}",
        mode.name(),
        args.destination,
        setup_url.redacted(),
        broker,
        streams.len(),
        if producing { args.producers } else { 0 },
        if consuming { args.consumers } else { 0 },
        args.message_size,
        match args.rate {
            Some(rate) => format!("target {rate} msg/s"),
            None => "all-out".to_string(),
        }
    );

    let clock = Clock::new();
    let registry = Arc::new(Registry::default());
    let producers_total = if producing { args.producers as usize * streams.len() } else { 0 };
    let rate_per_producer = match args.rate {
        Some(rate) if producers_total > 0 => rate / producers_total as f64,
        _ => 0.0,
    };
    let mut workers = Workers {
        registry,
        producer_control: Arc::new(Control::new(rate_per_producer)),
        consumer_control: Arc::new(Control::new(0.0)),
        clock,
        producers: JoinSet::new(),
        consumers: JoinSet::new(),
    };
    if consuming {
        start_consumers(&mut workers, &args, &consumer_url, &streams, offset).await?;
    }
    if producing {
        start_producers(&mut workers, &args, &url, &streams);
    }
    let shape = RunShape { duration_s: duration_s(&args), fanout: u64::from(args.consumers.max(1)), producing, consuming };
    let config = config_json(&args, &url, &consumer_url);
    let cleanup_url = setup_url.clone();
    let cleanup = move || async move { delete_streams(&cleanup_url, &streams).await.map_err(|error| error.to_string()) };
    conclude(&mode, args, workers, shape, broker, config, cleanup).await
}

async fn start_consumers(
    workers: &mut Workers,
    args: &PerfArgs,
    url: &StreamUrl,
    streams: &[String],
    offset: stream_codec::OffsetSpecification,
) -> Result<(), String> {
    let mut readies = Vec::new();
    for stream in streams {
        for index in 0..args.consumers {
            let spec = StreamConsumerSpec {
                name: format!("lepus-perf consumer {stream} #{index}"),
                url: url.clone(),
                stream: stream.clone(),
                offset,
                credit: args.stream_credit.max(1),
            };
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            readies.push(ready_rx);
            let (control, stats, clock) = (workers.consumer_control.clone(), workers.registry.worker(), workers.clock);
            workers.consumers.spawn(async move {
                if let Err(error) = run_stream_consumer(spec.clone(), control.clone(), stats, clock, ready_tx).await {
                    control.fail(format!("{}: {error}", spec.name));
                }
            });
        }
    }
    for ready in readies {
        match tokio::time::timeout(Duration::from_secs(60), ready).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => return Err(format!("a consumer could not start: {error}")),
            _ => return Err("a consumer did not start within 60 s".to_string()),
        }
    }
    Ok(())
}

fn start_producers(workers: &mut Workers, args: &PerfArgs, url: &StreamUrl, streams: &[String]) {
    let payload: Vec<u8> = (0..args.message_size).map(|index| b'a' + (index % 26) as u8).collect();
    for stream in streams {
        for index in 0..args.producers {
            let spec = StreamProducerSpec {
                name: format!("lepus-perf producer {stream} #{index}"),
                url: url.clone(),
                stream: stream.clone(),
                max_pending: args.max_pending,
                batch_size: args.stream_batch_size,
                message_count: args.message_count,
                payload: payload.clone(),
                precise_pacing: args.pacing == crate::cli::Pacing::Precise,
            };
            let (control, stats, clock) = (workers.producer_control.clone(), workers.registry.worker(), workers.clock);
            workers.producers.spawn(async move {
                if let Err(error) = run_stream_producer(spec.clone(), control.clone(), stats, clock).await {
                    control.fail(format!("{}: {error}", spec.name));
                }
            });
        }
    }
}

/// Creates the streams that do not exist yet; returns the server's product and version.
async fn create_streams(url: &StreamUrl, streams: &[String]) -> Result<String, StreamError> {
    let mut connection = StreamConnection::open(url, "lepus-perf setup").await?;
    for stream in streams {
        let stream = Text::from(stream.as_str());
        let answer = connection
            .ask(|correlation_id| ClientCommand::Create { correlation_id, stream: stream.clone(), arguments: Vec::new() })
            .await?;
        match answer {
            ServerCommand::Response { code: ResponseCode::Ok | ResponseCode::StreamAlreadyExists, .. } => {}
            ServerCommand::Response { code, .. } => return Err(StreamError::Refused { what: format!("create stream {stream}"), code }),
            other => return Err(StreamError::Protocol(format!("create stream {stream}: answered {other:?}"))),
        }
    }
    let product = connection.server_product();
    connection.split().1.close().await;
    Ok(product)
}

async fn delete_streams(url: &StreamUrl, streams: &[String]) -> Result<(), StreamError> {
    let work = async {
        let mut connection = StreamConnection::open(url, "lepus-perf cleanup").await?;
        for stream in streams {
            let stream = Text::from(stream.as_str());
            connection
                .request(&format!("delete stream {stream}"), |correlation_id| ClientCommand::Delete { correlation_id, stream })
                .await?;
        }
        connection.split().1.close().await;
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .unwrap_or_else(|_| Err(StreamError::Protocol("cleanup timed out after 30 s".to_string())))
}

fn config_json(args: &PerfArgs, url: &StreamUrl, consumer_url: &StreamUrl) -> serde_json::Value {
    serde_json::json!({
        "protocol": "stream",
        "destination": args.destination,
        "url": url.redacted(),
        "consumer_url": consumer_url.redacted(),
        "num_destinations": args.num_destinations,
        "producers_per_destination": args.producers,
        "consumers_per_destination": args.consumers,
        "message_size_bytes": args.message_size,
        "rate_per_sec": args.rate,
        "max_pending": args.max_pending,
        "stream_batch_size": args.stream_batch_size,
        "stream_credit": args.stream_credit,
        "stream_offset": args.stream_offset.as_deref().unwrap_or("next"),
        "pacing": format!("{:?}", args.pacing).to_lowercase(),
        "warmup_s": args.warmup,
        "duration_s": args.duration,
        "message_count": args.message_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_name_streams() {
        assert_eq!(stream_names("stream://s", 1).unwrap(), ["s"]);
        assert_eq!(stream_names("queue://s", 2).unwrap(), ["s0", "s1"]);
        assert!(stream_names("topic://s", 1).is_err());
        assert!(stream_names("stream://", 1).is_err());
    }
}
