//! What can go wrong talking to a broker, worded for the person running the tool.

use amqp_codec::DecodeError;

/// A client failure. Display texts say what happened and, where it helps, what to check.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL could not be parsed.
    #[error("invalid AMQP URL {url:?}: {reason} (expected amqp://user:password@host:port/vhost)")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TCP connection could not be made.
    #[error("cannot connect to {address}: {source} (is a broker listening there?)")]
    Connect {
        /// host:port.
        address: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// A step did not finish in time.
    #[error("{what} timed out after {timeout_s} s")]
    Timeout {
        /// The step.
        what: String,
        /// The limit.
        timeout_s: u64,
    },
    /// The peer does not speak AMQP 0-9-1.
    #[error("the peer at {address} does not speak AMQP 0-9-1: {detail}")]
    NotAmqp {
        /// host:port.
        address: String,
        /// What it sent instead.
        detail: String,
    },
    /// The broker refused the user name or password.
    #[error("the broker refused the credentials of user {user:?} (ACCESS_REFUSED): {text}")]
    AccessRefused {
        /// The user name from the URL.
        user: String,
        /// The broker's reply text, or what we saw.
        text: String,
    },
    /// The broker closed the connection with a reply code.
    #[error("the broker closed the connection: {code} {text}")]
    ConnectionClosed {
        /// The AMQP reply code.
        code: u16,
        /// The broker's reply text.
        text: String,
    },
    /// The broker closed a channel with a reply code.
    #[error("the broker closed channel {channel}: {code} {text}")]
    ChannelClosed {
        /// The channel number.
        channel: u16,
        /// The AMQP reply code.
        code: u16,
        /// The broker's reply text.
        text: String,
    },
    /// The socket ended without a connection.close: the broker went away.
    #[error("the broker went away: the connection was closed without connection.close")]
    BrokerGone,
    /// A socket error after the connection was open.
    #[error("connection lost: {0}")]
    Io(#[from] std::io::Error),
    /// The broker sent bytes that do not decode.
    #[error("undecodable frame from the broker: {0}")]
    Decode(#[from] DecodeError),
    /// The broker sent something valid but unexpected at this point.
    #[error("protocol error: {0}")]
    Protocol(String),
}
