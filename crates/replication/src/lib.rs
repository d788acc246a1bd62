//! Quorum-queue replication (issue 11; the design is docs/replication.md).
//!
//! A Raft group (raft-rs, sans-IO) whose entries are batches of per-queue commands
//! ([`command::Batch`]); its log, hard state and snapshots live on the storage crate's filesystem
//! seam ([`log_store::LogStore`]); committed batches are applied in log order to
//! `queue_core::QueueCore`s by [`state_machine::QueueStateMachine`] on every node; [`node::ReplicaNode`]
//! drives one member: ticks, messages in and out, persistence before acknowledgement, snapshots,
//! and the guard that keeps a node with a damaged log from voting.
//!
//! The driver owns time and I/O order, so `tests/simulation.rs` runs three nodes over a seeded
//! in-memory network and replays a failing seed exactly.

pub mod batcher;
pub mod codec;
pub mod command;
pub mod log_store;
pub mod node;
pub mod snapshot_image;
pub mod state_machine;
pub mod transport;

pub use raft::eraftpb::{Message, MessageType};
