//! Framing: a uint32 size, then that many bytes (key, version, the command's fields).

use crate::DecodeError;
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Bytes of the size field in front of every frame.
pub const SIZE_FIELD_BYTES: usize = 4;
/// Key and version: the least a frame holds.
pub const KEY_AND_VERSION_BYTES: usize = 4;

/// Takes one frame (its size field removed) off the front of `buffer`, or returns `None` when
/// more bytes are needed.
///
/// `frame_max` bounds the size a frame may announce, its size field not counted, as RabbitMQ
/// checks it (0: no bound). The bound is checked as soon as the size field is in, before any of
/// the frame is buffered, so a hostile size never makes the reader reserve memory for it.
pub fn split_frame(buffer: &mut BytesMut, frame_max: u32) -> Result<Option<Bytes>, DecodeError> {
    let Some(size_field) = buffer.get(..SIZE_FIELD_BYTES) else {
        return Ok(None);
    };
    let frame_bytes = u32::from_be_bytes([size_field[0], size_field[1], size_field[2], size_field[3]]);
    if frame_max != 0 && frame_bytes > frame_max {
        return Err(DecodeError::FrameTooLarge { frame_bytes, frame_max });
    }
    let total_bytes = SIZE_FIELD_BYTES + frame_bytes as usize;
    if buffer.len() < total_bytes {
        buffer.reserve(total_bytes - buffer.len());
        return Ok(None);
    }
    buffer.advance(SIZE_FIELD_BYTES);
    Ok(Some(buffer.split_to(frame_bytes as usize).freeze()))
}

/// The key and version of a frame, without decoding the rest (for logs and dispatch).
pub fn peek_key_and_version(frame: &[u8]) -> Option<(u16, u16)> {
    let head = frame.get(..KEY_AND_VERSION_BYTES)?;
    Some((u16::from_be_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]])))
}

/// Starts a frame: a size field to patch, the key and the version. Returns where the size is.
pub(crate) fn begin_frame(writer: &mut BytesMut, key: u16, version: u16) -> usize {
    let size_at = writer.len();
    writer.put_u32(0);
    writer.put_u16(key);
    writer.put_u16(version);
    size_at
}

/// Patches the size field written by [`begin_frame`].
pub(crate) fn end_frame(writer: &mut BytesMut, size_at: usize) {
    let frame_bytes = (writer.len() - size_at - SIZE_FIELD_BYTES) as u32;
    writer[size_at..size_at + SIZE_FIELD_BYTES].copy_from_slice(&frame_bytes.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_of_exactly_frame_max_is_taken_and_one_byte_more_is_refused_before_its_body() {
        let mut buffer = BytesMut::new();
        buffer.put_u32(8);
        buffer.put_bytes(7, 8);
        assert_eq!(split_frame(&mut buffer, 8).unwrap(), Some(Bytes::from(vec![7u8; 8])));
        assert!(buffer.is_empty());
        buffer.put_u32(9);
        // Only the size field has arrived: the refusal does not wait for the body.
        assert_eq!(split_frame(&mut buffer, 8), Err(DecodeError::FrameTooLarge { frame_bytes: 9, frame_max: 8 }));
    }

    #[test]
    fn a_huge_announced_size_reserves_nothing_when_refused() {
        let mut buffer = BytesMut::new();
        buffer.put_u32(u32::MAX);
        let capacity_before = buffer.capacity();
        assert!(split_frame(&mut buffer, 1_048_576).is_err());
        assert_eq!(buffer.capacity(), capacity_before);
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut buffer = BytesMut::from(&[0u8, 0, 0][..]);
        assert_eq!(split_frame(&mut buffer, 0).unwrap(), None);
        buffer.put_u8(2);
        buffer.put_u8(1);
        assert_eq!(split_frame(&mut buffer, 0).unwrap(), None);
        buffer.put_u8(2);
        assert_eq!(split_frame(&mut buffer, 0).unwrap(), Some(Bytes::from_static(&[1, 2])));
    }
}
