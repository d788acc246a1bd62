//! A lean AMQP 0-9-1 client on the Lepus codec, made for load generation (`lepus perf`,
//! `lepus bench`) against Lepus or any other 0-9-1 broker such as RabbitMQ.
//!
//! It is deliberately small: a [`Connection`] does the handshake and synchronous set-up calls
//! (declare, bind, qos, confirm.select, consume) and is then split into a [`FrameReader`] and a
//! [`FrameWriter`] that two tasks drive. The writer encodes every publish into one reused buffer
//! and the reader slices frames out of one reused buffer, so the steady state allocates nothing
//! per message: a general-purpose client's per-message futures, channels and copies would make
//! the load generator, not the broker, the thing being measured.

mod connection;
mod error;
mod io;
mod url;

pub use connection::{Connection, ConnectionOptions, QueueDeclared};
pub use error::ClientError;
pub use io::{FrameReader, FrameWriter, Publish};
pub use url::AmqpUrl;

/// Re-exported so callers can match frames without naming the codec crate themselves.
pub use amqp_codec;
