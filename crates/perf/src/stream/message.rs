//! The bodies lepus perf publishes on a stream: an AMQP 1.0 message with one data section, as
//! RabbitMQ's stream clients encode a message of raw bytes, so that their consumers (the Java
//! client, the Go client's perfTest) can read what lepus perf writes and the reverse. The payload
//! is `--message-size` bytes; its first 8 carry the send time, as in the AMQP 0-9-1 mode.

/// AMQP 1.0 described type `data` (0x00 0x53 0x75) as a vbin32: 8 bytes before the payload.
pub const DATA_SECTION_HEADER_BYTES: usize = 8;

/// A body of `payload` preceded by its data-section header.
pub fn body(payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(DATA_SECTION_HEADER_BYTES + payload.len());
    body.extend_from_slice(&[0x00, 0x53, 0x75, 0xb0]);
    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    body.extend_from_slice(payload);
    body
}

/// Writes the send time (wall-clock ns) into a body made by [`body`], when its payload holds 8 bytes.
pub fn stamp(body: &mut [u8], wall_ns: u64) {
    if let Some(slot) = body.get_mut(DATA_SECTION_HEADER_BYTES..DATA_SECTION_HEADER_BYTES + 8) {
        slot.copy_from_slice(&wall_ns.to_be_bytes());
    }
}

/// The send time in a received body: the first 8 payload bytes of a leading data section, in
/// either of the encodings RabbitMQ's clients use (vbin8 for short payloads, vbin32). `None`
/// for any other message (another tool's, or too short to carry it).
pub fn send_time_ns(body: &[u8]) -> Option<u64> {
    let payload_at = match body.get(..4)? {
        [0x00, 0x53, 0x75, 0xa0] => 5,
        [0x00, 0x53, 0x75, 0xb0] => 8,
        _ => return None,
    };
    let stamp = body.get(payload_at..payload_at + 8)?;
    Some(u64::from_be_bytes(stamp.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamped_bodies_give_their_time_back() {
        let mut message = body(&[0u8; 16]);
        assert_eq!(message.len(), 24);
        stamp(&mut message, 1_234_567);
        assert_eq!(send_time_ns(&message), Some(1_234_567));
        let mut short = vec![0x00, 0x53, 0x75, 0xa0, 8];
        short.extend_from_slice(&42u64.to_be_bytes());
        assert_eq!(send_time_ns(&short), Some(42));
        assert_eq!(send_time_ns(&body(&[1, 2, 3])), None);
        assert_eq!(send_time_ns(b"raw bytes, not AMQP 1.0"), None);
    }
}
