//! The broker's protocol state, free of I/O: what an exchange routes where, what a declaration
//! means against the existing topology, which message a queue hands out next. The server crate
//! owns sockets, tasks and disks and drives these types; tests drive them directly.

pub mod error;
pub mod exchange;
pub mod message;
pub mod queue;
pub mod vhost;

pub use error::{AmqpError, ErrorScope};
pub use message::Message;
