//! Decoding errors, each mapped to the reply code RabbitMQ sends for it.

use crate::constants;

/// Why bytes from the network could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The payload ended before the structure it announced.
    #[error("payload truncated")]
    Truncated,
    /// Bytes were left over after a method's last argument.
    #[error("{0} trailing bytes after the method arguments")]
    TrailingBytes(usize),
    /// A field table value had a type tag that RabbitMQ does not define.
    #[error("unknown field value type {0:#04x}")]
    UnknownFieldType(u8),
    /// Field tables and arrays nest deeper than we accept.
    #[error("field table nesting deeper than {0}")]
    NestingTooDeep(usize),
    /// The class and method ids name no method.
    #[error("unknown method {class_id}/{method_id}")]
    UnknownMethod {
        /// The class id read.
        class_id: u16,
        /// The method id read.
        method_id: u16,
    },
    /// The frame type octet is not method, header, body or heartbeat.
    #[error("unknown frame type {0}")]
    UnknownFrameType(u8),
    /// The octet after the payload was not 0xCE.
    #[error("bad frame end marker {0:#04x}")]
    BadFrameEnd(u8),
    /// The frame's payload is larger than the negotiated maximum allows. The text is RabbitMQ's:
    /// the announced payload size, then the payload size the spec allows (frame_max less the 8
    /// bytes of framing).
    #[error("type {kind}, all octets = <<>>: {{frame_too_large,{payload_bytes},{payload_bytes_allowed}}}")]
    FrameTooLarge {
        /// The frame type.
        kind: u8,
        /// The payload size the frame header announced.
        payload_bytes: u64,
        /// The negotiated frame_max less the 8 bytes of framing.
        payload_bytes_allowed: u64,
    },
    /// A method's arguments could not be decoded.
    #[error("cannot decode the arguments of method {class_id}/{method_id}: {detail}")]
    MethodArguments {
        /// The class id read.
        class_id: u16,
        /// The method id read.
        method_id: u16,
        /// What went wrong.
        detail: String,
    },
}

impl DecodeError {
    /// The connection-level reply code RabbitMQ answers this error with.
    pub fn reply_code(&self) -> u16 {
        // RabbitMQ reports any frame or method it cannot decode as 501 FRAME_ERROR; an unknown
        // method is a feature we do not have, 540.
        match self {
            DecodeError::UnknownMethod { .. } => constants::NOT_IMPLEMENTED,
            _ => constants::FRAME_ERROR,
        }
    }
}
