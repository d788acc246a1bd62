//! The RabbitMQ Stream protocol (port 5552) as RabbitMQ 3.10.8 speaks it: framing, every
//! command of `deps/rabbitmq_stream/docs/PROTOCOL.adoc` in both directions, response codes,
//! data entries and osiris chunks. No I/O happens here: the server and the clients feed frames
//! in and take bytes out.
//!
//! The two directions are two types because the same key means different things each way:
//! [`ClientCommand`] is what a client sends (the server decodes it, the perf client encodes
//! it), [`ServerCommand`] what the server sends. Where RabbitMQ's encoder and the protocol
//! document differ, RabbitMQ wins, since real clients were written against it; each such place
//! says so.
//!
//! Like `amqp-codec` this is Lepus's own rather than a crate's because it is the hot path: a
//! publish frame is checked once and its entries stay slices of the frame (they go into a chunk
//! as they came), a deliver's chunk is written from the store without being decoded, and
//! confirms are encoded from a borrowed slice. Decoding never panics: every length is checked
//! against what is left, every count against the bytes it would need before anything is
//! allocated, and the frame size against the negotiated maximum before the frame is buffered.

mod chunk;
mod client_command;
mod constants;
mod entry;
mod error;
mod frame;
mod publish;
mod response_code;
mod server_command;
mod wire;

pub use chunk::{chunk_type, Chunk, ChunkEntries, ChunkHeader, CHUNK_HEADER_BYTES, CHUNK_MAGIC_AND_VERSION};
pub use client_command::{ClientCommand, OffsetSpecification};
pub use constants::*;
pub use entry::{put_simple_entry, DataEntry, Records, COMPRESSION_NONE, SIMPLE_ENTRY_HEADER_BYTES, SUB_BATCH_ENTRY_HEADER_BYTES};
pub use error::DecodeError;
pub use frame::{peek_key_and_version, split_frame, KEY_AND_VERSION_BYTES, SIZE_FIELD_BYTES};
pub use publish::{PublishFrame, PublishedEntries, PublishedEntry, PublishedMessages};
pub use response_code::ResponseCode;
pub use server_command::{
    encode_deliver_header, encode_publish_confirm, Broker, PublishingError, ServerCommand, StreamMetadata, DELIVER_HEADER_BYTES,
    PLAIN_RESPONSE_KEYS,
};
pub use wire::{get, Text, TextMap};
