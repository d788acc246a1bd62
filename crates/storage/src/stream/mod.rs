//! The stream store: a replayable log of chunks, trimmed only by retention.
//!
//! A stream is a directory of segments, each a segment file of osiris-format chunks ([`chunk`])
//! and an index of one entry per chunk ([`index`]). Records take consecutive offsets; a chunk
//! takes as many as it has records. Writers append whole chunks ([`Stream::append_batch`], one
//! per RabbitMQ Stream protocol publish) or single records ([`Stream::append_record`], AMQP 0-9-1
//! publishes, gathered in an open chunk that is cut per group-commit window). Appends are
//! buffered in memory; the syncer's group commit writes them, fdatasyncs the segment and index
//! files, and only then *commits* them: readers ([`reader`]) see committed chunks only, and a
//! publisher confirm waits for the same batch. Tracking ([`tracking`]) keeps consumer offsets and
//! publisher sequences in the log itself. Retention deletes whole segments, oldest first.
//!
//! Recovery ([`recovery`]) trusts the sealed segments' indexes (each entry checksummed) and
//! scans the newest segment chunk by chunk (CRC of the data, framing of the entries, the chunk
//! id following on from the previous one), cutting a torn tail and reporting damage with the file
//! and offset.
//!
//! See docs/streams.md for the API as the queue type and the stream protocol use it.

pub mod chunk;
pub mod index;
mod log;
pub mod reader;
pub mod recovery;
mod replica;
#[cfg(test)]
mod replica_tests;
#[cfg(test)]
mod tests;
pub mod tracking;

pub use log::{now_ms, ChunkPoint, CommitListener, CommitPoint, Stream, StreamInfo, StreamWritten};
pub use reader::{ChunkLocation, ChunkSelector, OffsetSpec, StreamReader};
pub use recovery::StreamRecovery;
pub use replica::{StreamTail, UNREPLICATED_CHUNKS_MAX};

use crate::StorageError;

/// osiris's default segment size (RabbitMQ's `x-stream-max-segment-size-bytes` default).
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 500_000_000;
/// The largest segment Lepus writes: index entries hold 32-bit file positions.
pub const SEGMENT_BYTES_MAX_CEILING: u64 = 3_000_000_000;
/// osiris's default of chunks per segment; also bounds an index file (256,000 entries of 44
/// bytes, 11 MB), which an offset lookup binary-searches.
pub const SEGMENT_CHUNKS_MAX_DEFAULT: u32 = 256_000;
/// The epoch every chunk is written with on a single node (osiris's first epoch).
pub const EPOCH: u64 = 1;

/// What a stream keeps, by RabbitMQ's `x-max-length-bytes` and `x-max-age`: applied per whole
/// segment, oldest first, never to the segment being written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Delete the oldest segments while the stream holds more than this.
    pub max_bytes: Option<u64>,
    /// Delete a segment once its newest chunk is older than this.
    pub max_age_ms: Option<u64>,
}

/// How a stream's segments are cut and trimmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    /// A segment takes no new chunk once it holds this many bytes (`x-stream-max-segment-size-bytes`).
    pub segment_bytes_max: u64,
    /// ... or this many chunks.
    pub segment_chunks_max: u32,
    /// Retention.
    pub retention: Retention,
}

impl Default for StreamSettings {
    fn default() -> StreamSettings {
        StreamSettings {
            segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT,
            segment_chunks_max: SEGMENT_CHUNKS_MAX_DEFAULT,
            retention: Retention::default(),
        }
    }
}

impl StreamSettings {
    /// The settings with the segment size within what the index can address.
    pub fn bounded(mut self) -> StreamSettings {
        self.segment_bytes_max = self.segment_bytes_max.clamp(1, SEGMENT_BYTES_MAX_CEILING);
        self.segment_chunks_max = self.segment_chunks_max.max(1);
        self
    }
}

/// A stream operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A file could not be read or written.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// One record larger than a simple entry can hold.
    #[error("a record of {bytes} bytes is larger than a chunk entry can hold")]
    RecordTooLarge {
        /// Its size.
        bytes: usize,
    },
    /// Entries handed to [`Stream::append_batch`] that are not valid chunk data.
    #[error("a batch that is not valid chunk data: {0}")]
    BadBatch(chunk::ChunkDefect),
    /// A tracking reference that is empty or longer than 255 bytes.
    #[error("a tracking reference of {bytes} bytes (1 to 255 allowed)")]
    BadReference {
        /// Its length.
        bytes: usize,
    },
    /// The stream tracks [`tracking::TRACKED_OFFSETS_MAX`] consumer references already.
    #[error("the stream tracks as many consumer references as it may")]
    TrackingFull,
    /// The stream was deleted.
    #[error("the stream was deleted")]
    Deleted,
    /// A replicated stream holds [`UNREPLICATED_CHUNKS_MAX`] chunks the cluster has not
    /// committed: its followers are behind.
    #[error("{chunks} chunks wait for the stream's followers")]
    ReplicationBehind {
        /// The bound reached.
        chunks: usize,
    },
    /// A chunk copied from a leader that does not continue this member's log.
    #[error("a replicated chunk at offset {found}, expected {expected}")]
    OutOfSequence {
        /// Its first offset.
        found: u64,
        /// This log's next offset.
        expected: u64,
    },
    /// An epoch older than the stream's last chunk's.
    #[error("epoch {epoch} is older than the stream's last epoch {last}")]
    StaleEpoch {
        /// The epoch given.
        epoch: u64,
        /// The last chunk's.
        last: u64,
    },
    /// A cut that would remove committed chunks, or not at a chunk's start.
    #[error("cannot cut the stream at offset {offset} (readable below {readable}, next {next})")]
    BadTruncation {
        /// Where the cut was asked for.
        offset: u64,
        /// The readable end.
        readable: u64,
        /// The log's end.
        next: u64,
    },
    /// A reset to a leader's first offset asked of a log that does not end before it (or of
    /// a stream that is not replicated): nothing it holds is to go.
    #[error("cannot reset the stream to offset {first_offset}: its log goes on to {next}")]
    NotBehind {
        /// The leader's first offset.
        first_offset: u64,
        /// This log's next offset.
        next: u64,
    },
    /// A replicated stream this node follows: it takes the leader's chunks only.
    #[error("this node does not lead the stream")]
    NotWritable,
    /// Replication set up on a stream in the wrong state.
    #[error("cannot replicate the stream: {0}")]
    ReplicationSetup(&'static str),
    /// A chunk a reader expected is not there or is damaged.
    #[error("{path}: damaged chunk at byte {position}: {defect}")]
    Damaged {
        /// The segment file.
        path: String,
        /// Where the chunk starts.
        position: u64,
        /// What is wrong.
        defect: chunk::ChunkDefect,
    },
}
