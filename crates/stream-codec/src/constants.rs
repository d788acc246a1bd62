//! The protocol's numbers: command keys, offset types, response codes and the defaults RabbitMQ
//! 3.10.8 negotiates (`deps/rabbitmq_stream_common/include/rabbit_stream.hrl`).

/// The only command version RabbitMQ 3.10.8 speaks; every frame carries it.
pub const VERSION_1: u16 = 1;

/// The bit of a key that marks a response (`0x8006` answers `0x0006`).
pub const RESPONSE_BIT: u16 = 0x8000;

/// Command keys (the low 15 bits of a frame's key), as `rabbit_stream.hrl` numbers them.
pub mod key {
    /// Declares a publisher on a stream.
    pub const DECLARE_PUBLISHER: u16 = 0x0001;
    /// Messages from a publisher.
    pub const PUBLISH: u16 = 0x0002;
    /// The server confirms publishing ids.
    pub const PUBLISH_CONFIRM: u16 = 0x0003;
    /// The server refuses publishing ids.
    pub const PUBLISH_ERROR: u16 = 0x0004;
    /// The last publishing id stored for a publisher reference.
    pub const QUERY_PUBLISHER_SEQUENCE: u16 = 0x0005;
    /// Deletes a publisher.
    pub const DELETE_PUBLISHER: u16 = 0x0006;
    /// Subscribes to a stream.
    pub const SUBSCRIBE: u16 = 0x0007;
    /// A chunk for a subscription.
    pub const DELIVER: u16 = 0x0008;
    /// More chunks for a subscription.
    pub const CREDIT: u16 = 0x0009;
    /// Stores a consumer's offset on the server.
    pub const STORE_OFFSET: u16 = 0x000a;
    /// Reads a stored consumer offset.
    pub const QUERY_OFFSET: u16 = 0x000b;
    /// Ends a subscription.
    pub const UNSUBSCRIBE: u16 = 0x000c;
    /// Creates a stream.
    pub const CREATE: u16 = 0x000d;
    /// Deletes a stream.
    pub const DELETE: u16 = 0x000e;
    /// Where the leader and replicas of streams are.
    pub const METADATA: u16 = 0x000f;
    /// The server says a stream moved or went away.
    pub const METADATA_UPDATE: u16 = 0x0010;
    /// Client and server properties.
    pub const PEER_PROPERTIES: u16 = 0x0011;
    /// The SASL mechanisms offered.
    pub const SASL_HANDSHAKE: u16 = 0x0012;
    /// A SASL response.
    pub const SASL_AUTHENTICATE: u16 = 0x0013;
    /// Frame size and heartbeat.
    pub const TUNE: u16 = 0x0014;
    /// Opens a virtual host.
    pub const OPEN: u16 = 0x0015;
    /// Closes the connection (either side).
    pub const CLOSE: u16 = 0x0016;
    /// Keeps the connection alive (either side).
    pub const HEARTBEAT: u16 = 0x0017;
    /// Which streams of a super stream a routing key goes to (experimental in 3.10).
    pub const ROUTE: u16 = 0x0018;
    /// The streams of a super stream (experimental in 3.10).
    pub const PARTITIONS: u16 = 0x0019;
}

/// Offset specification types of a subscribe.
pub mod offset_type {
    /// The first offset of the stream.
    pub const FIRST: u16 = 1;
    /// The last chunk of the stream.
    pub const LAST: u16 = 2;
    /// What is published after the subscription.
    pub const NEXT: u16 = 3;
    /// A numeric offset.
    pub const OFFSET: u16 = 4;
    /// A timestamp, milliseconds since the epoch.
    pub const TIMESTAMP: u16 = 5;
}

/// The frame_max RabbitMQ proposes in its tune (1 MiB): the largest frame, its 4-byte size
/// field not counted, that either side may send once tuned.
pub const DEFAULT_FRAME_MAX: u32 = 1_048_576;
/// The heartbeat RabbitMQ proposes in its tune, in seconds.
pub const DEFAULT_HEARTBEAT_S: u32 = 60;
/// The credit (chunks in flight) RabbitMQ grants a connection's publishers before it stops reading.
pub const DEFAULT_INITIAL_CREDITS: u32 = 50_000;
/// The largest frame accepted before `open` succeeds. RabbitMQ 3.10.8 has no such ceiling;
/// later versions added one (8192, `stream.initial_frame_max`) so that an unauthenticated peer
/// cannot make the server buffer a large frame. Lepus has it from the start: it is large enough
/// for a PLAIN response carrying a JWT.
pub const PRE_OPEN_FRAME_MAX: u32 = 8_192;
/// The longest publisher or consumer reference, in bytes (RabbitMQ's clients refuse 256 and more).
pub const REFERENCE_BYTES_MAX: usize = 255;
