//! Decoding errors, each mapped to the response code the server closes the connection with.

use crate::ResponseCode;

/// Why bytes from the network could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The frame ended before the structure it announced.
    #[error("frame truncated")]
    Truncated,
    /// Bytes were left over after a command's last field.
    #[error("{0} trailing bytes after the command")]
    TrailingBytes(usize),
    /// The size prefix announces more than the negotiated frame_max. Checked before any of the
    /// frame is buffered, so a hostile size never makes the reader allocate it.
    #[error("frame of {frame_bytes} bytes is larger than frame_max {frame_max}")]
    FrameTooLarge {
        /// The size the frame announced (its 4-byte size field not counted).
        frame_bytes: u32,
        /// The negotiated maximum.
        frame_max: u32,
    },
    /// The key and version name no command this side accepts (RabbitMQ 3.10.8 speaks version 1
    /// of keys 0x0001 to 0x0019 only).
    #[error("unknown command {key:#06x} version {version}")]
    UnknownCommand {
        /// The frame's key, response bit included.
        key: u16,
        /// The frame's version.
        version: u16,
    },
    /// A subscribe named an offset type other than first, last, next, offset and timestamp.
    #[error("unknown offset type {0}")]
    UnknownOffsetType(u16),
    /// A chunk did not start with osiris's magic (0x5 in the high nibble).
    #[error("chunk magic and version {0:#04x}, expected 0x5_")]
    BadChunkMagic(u8),
}

impl DecodeError {
    /// The response code a server closes the connection with for this error, as RabbitMQ does:
    /// FRAME_TOO_LARGE for an oversized frame, UNKNOWN_FRAME for anything it cannot parse.
    pub fn response_code(&self) -> ResponseCode {
        match self {
            DecodeError::FrameTooLarge { .. } => ResponseCode::FrameTooLarge,
            _ => ResponseCode::UnknownFrame,
        }
    }
}
