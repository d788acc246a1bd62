//! The codec against frames a real RabbitMQ 3.10.8 sent on its stream port
//! (`tests/fixtures/rabbitmq-3.10.8-stream.frames`, recorded over a raw socket by
//! `tests/fixtures/capture_rabbitmq_stream_frames.py`): every server frame decodes to the command
//! its label names and encodes again to the same bytes; delivered chunks parse, their CRC holds and
//! their records are the messages published; every frame RabbitMQ refused is refused by Lepus's
//! decoder with the code RabbitMQ closed the connection with.

use bytes::{Bytes, BytesMut};
use stream_codec::*;

const FIXTURES: &str = include_str!("fixtures/rabbitmq-3.10.8-stream.frames");

struct Captured {
    from_server: bool,
    label: String,
    bytes: Vec<u8>,
}

fn from_hex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length");
    (0..hex.len()).step_by(2).map(|at| u8::from_str_radix(&hex[at..at + 2], 16).expect("hex")).collect()
}

fn captured() -> Vec<Captured> {
    let frames: Vec<Captured> = FIXTURES
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let [direction, label, hex] = fields[..] else { panic!("malformed fixture line: {line}") };
            let bytes = if hex == "-" { Vec::new() } else { from_hex(hex) };
            Captured { from_server: direction == "server", label: label.to_string(), bytes }
        })
        .collect();
    assert!(frames.len() > 60, "the fixture file lost its frames");
    frames
}

fn one_frame(bytes: &[u8]) -> Bytes {
    let mut buffer = BytesMut::from(bytes);
    let frame = split_frame(&mut buffer, DEFAULT_FRAME_MAX).unwrap_or_else(|error| panic!("{error}")).expect("a whole frame");
    assert!(buffer.is_empty(), "{} bytes left after the frame", buffer.len());
    frame
}

/// The label's last part names the command (`streams/create-again-response` is a create answer).
fn expected_key(label: &str) -> u16 {
    let what = label.rsplit('/').next().unwrap_or_default();
    let table: [(&str, u16); 22] = [
        ("peer-properties-response", 0x8011),
        ("sasl-handshake-response", 0x8012),
        ("sasl-authenticate-response", 0x8013),
        ("tune", 0x0014),
        ("open-response", 0x8015),
        ("create", 0x800d),
        ("delete-publisher", 0x8006),
        ("delete", 0x800e),
        ("declare", 0x8001),
        ("publish-confirm", 0x0003),
        ("publish-duplicate-confirm", 0x0003),
        ("publish-unknown-publisher-error", 0x0004),
        ("query-publisher-sequence", 0x8005),
        ("query-sequence", 0x8005),
        ("subscribe", 0x8007),
        ("deliver", 0x0008),
        ("credit", 0x8009),
        ("query-offset", 0x800b),
        ("metadata", 0x800f),
        ("unsubscribe", 0x800c),
        ("close", 0x0016),
        ("heartbeat", 0x0017),
    ];
    let special = [("metadata-update", 0x0010), ("close-response", 0x8016), ("route-response", 0x0018), ("partitions-response", 0x0019)];
    if let Some((_, key)) = special.iter().find(|(name, _)| *name == what) {
        return *key;
    }
    table
        .iter()
        .filter(|(prefix, _)| what.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, key)| *key)
        .unwrap_or_else(|| panic!("no command known for label {label}"))
}

#[test]
fn every_server_frame_decodes_to_its_command_and_encodes_back_to_the_same_bytes() {
    let mut checked = 0;
    for frame in captured().iter().filter(|frame| frame.from_server && !frame.bytes.is_empty()) {
        let command = ServerCommand::decode(one_frame(&frame.bytes)).unwrap_or_else(|error| panic!("{}: {error}", frame.label));
        assert_eq!(command.key(), expected_key(&frame.label), "{}: decoded as {command:?}", frame.label);
        let mut again = BytesMut::new();
        command.encode(&mut again);
        assert_eq!(again.to_vec(), frame.bytes, "{}: {command:?} encodes differently", frame.label);
        checked += 1;
    }
    assert!(checked >= 60, "only {checked} server frames");
}

/// CRC-32 (IEEE 802.3, reflected, as zlib and `erlang:crc32/1` compute it), bit by bit: the
/// test's own, so the chunk check does not lean on code it tests.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn delivered_chunks_parse_with_their_checksum_and_hold_the_published_messages() {
    let delivers: Vec<Captured> = captured().into_iter().filter(|frame| frame.label.contains("/deliver")).collect();
    assert_eq!(delivers.len(), 2);
    for frame in delivers {
        let ServerCommand::Deliver { chunk, .. } = ServerCommand::decode(one_frame(&frame.bytes)).expect("decodes") else {
            panic!("{} is not a deliver", frame.label);
        };
        let chunk = Chunk::parse(chunk).expect("a whole chunk");
        assert_eq!(chunk.header.chunk_type, chunk_type::USER);
        assert_eq!((chunk.header.first_offset, chunk.header.entry_count, chunk.header.record_count), (0, 3, 3));
        assert_eq!(chunk.header.data_crc, crc32(&chunk.data), "{}", frame.label);
        let bodies: Vec<Bytes> =
            chunk.entries().flat_map(|entry| entry.expect("entry").records().expect("uncompressed").map(Result::unwrap)).collect();
        assert_eq!(bodies, ["one", "two", "three"].map(|body| Bytes::from_static(body.as_bytes())));
        // The trailer carries the publisher's deduplication state (its reference and sequence);
        // the header counts it, but osiris sends a subscriber the header and the data only.
        assert!(chunk.header.trailer_bytes > 0 && chunk.trailer.is_empty(), "{}: {:?}", frame.label, chunk.header);
        let mut header_again = BytesMut::new();
        chunk.header.write(&mut header_again);
        assert_eq!(&header_again[..], &frame.bytes[DELIVER_HEADER_BYTES..DELIVER_HEADER_BYTES + CHUNK_HEADER_BYTES]);
    }
}

#[test]
fn frames_rabbitmq_refused_are_refused_by_the_decoder_with_rabbitmqs_code() {
    let frames = captured();
    let mut checked = 0;
    for (index, frame) in frames.iter().enumerate().filter(|(_, frame)| !frame.from_server) {
        let error = ClientCommand::decode(one_frame(&frame.bytes)).expect_err(&frame.label);
        // What RabbitMQ did next: a close with a code (after open), or the socket dropped (before).
        let answer = &frames[index + 1];
        if answer.label.ends_with("socket-closed") {
            assert!(frame.label.starts_with("pre-auth"), "{}: dropped without a close", frame.label);
        } else {
            let ServerCommand::Close { code, reason, .. } = ServerCommand::decode(one_frame(&answer.bytes)).expect("a close") else {
                panic!("{}: answered by {}", frame.label, answer.label);
            };
            assert_eq!(error.response_code(), code, "{}: {error}", frame.label);
            assert_eq!(reason.as_str(), Some("unknown frame"));
        }
        checked += 1;
    }
    assert_eq!(checked, 4);
}
