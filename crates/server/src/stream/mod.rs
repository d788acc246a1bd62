//! Stream queues over AMQP 0-9-1 (`x-queue-type: stream`), as RabbitMQ 3.10.8 runs them: a
//! durable, replayable log ([`storage::stream`]) that publishes append to and that consumers read
//! from an offset of their choice, each independently; acks only move a consumer's credit.
//!
//! - [`queue`]: the queue at runtime (publish, consumers, settle, delete, figures, policy).
//! - [`consumer`]: one task per consumer, reading committed chunks off the async workers and
//!   delivering their records within the consumer's prefetch.
//! - [`record`] and [`amqp10`]: an AMQP 0-9-1 message as a stream record (AMQP 1.0, as RabbitMQ
//!   stores it, so the RabbitMQ Stream protocol reads the same messages) and back.
//! - [`arguments`]: `x-max-age`, `x-stream-offset`, `x-stream-max-segment-size-bytes`.
//! - [`replication`]: a stream copied to the cluster's members, led by one of them.

pub mod amqp10;
pub mod arguments;
pub mod consumer;
pub mod queue;
pub mod record;
pub mod replication;

pub use queue::StreamQueue;
