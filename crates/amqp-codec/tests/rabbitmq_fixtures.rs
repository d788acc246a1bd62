//! The codec against frames a real RabbitMQ 3.10.8 sent (`tests/fixtures/rabbitmq-3.10.8.frames`,
//! recorded by `tests/fixtures/capture_rabbitmq_frames.py` over a raw socket): every frame decodes
//! and encodes again to the same bytes, server properties table and message properties included,
//! and a malformed frame makes Lepus's decoder answer what RabbitMQ answered, or what this file
//! says instead and why.

mod support;

use amqp_codec::*;
use bytes::{Bytes, BytesMut};
use support::from_hex;

const FIXTURES: &str = include_str!("fixtures/rabbitmq-3.10.8.frames");

struct Captured {
    from_server: bool,
    label: String,
    bytes: Vec<u8>,
}

fn captured() -> Vec<Captured> {
    let frames: Vec<Captured> = FIXTURES
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let mut fields = line.split(' ');
            let (direction, label, hex) = (fields.next(), fields.next(), fields.next());
            let (Some(direction), Some(label), Some(hex), None) = (direction, label, hex, fields.next()) else {
                panic!("malformed fixture line: {line}");
            };
            let bytes = if hex == "-" { Vec::new() } else { from_hex(hex) };
            Captured { from_server: direction == "server", label: label.to_string(), bytes }
        })
        .collect();
    assert!(frames.len() > 50, "the fixture file lost its frames");
    frames
}

fn decode_exactly(bytes: &[u8]) -> Frame {
    let mut buffer = BytesMut::from(bytes);
    let frame = decode_frame(&mut buffer, 0).unwrap_or_else(|error| panic!("{error}")).expect("a whole frame");
    assert!(buffer.is_empty(), "{} bytes left after the frame", buffer.len());
    frame
}

fn encode_again(frame: &Frame, label: &str) -> Vec<u8> {
    let mut encoded = BytesMut::new();
    match &frame.payload {
        FramePayload::Method(method) => {
            assert!(label.ends_with(method.name()), "{label} decoded as {}", method.name());
            encode_method_frame(&mut encoded, frame.channel, method);
        }
        FramePayload::Header(header) => encode_content_header(&mut encoded, frame.channel, header),
        FramePayload::Body(body) => encode_body_frames(&mut encoded, frame.channel, body, 0),
        FramePayload::Heartbeat => encode_heartbeat(&mut encoded),
    }
    encoded.to_vec()
}

#[test]
fn every_frame_rabbitmq_sent_decodes_and_encodes_to_the_same_bytes() {
    let mut seen = std::collections::BTreeSet::new();
    for captured in captured().iter().filter(|c| c.from_server && !c.bytes.is_empty()) {
        let frame = decode_exactly(&captured.bytes);
        assert_eq!(encode_again(&frame, &captured.label), captured.bytes, "{}", captured.label);
        match &frame.payload {
            FramePayload::Method(Method::BasicDeliver(deliver)) => {
                // The delivery path encodes from borrowed fields: it must give the same bytes.
                let mut encoded = BytesMut::new();
                let fields = DeliverFields {
                    consumer_tag: &deliver.consumer_tag,
                    delivery_tag: deliver.delivery_tag,
                    redelivered: deliver.redelivered,
                    exchange: &deliver.exchange,
                    routing_key: &deliver.routing_key,
                };
                encode_deliver_frame(&mut encoded, frame.channel, fields);
                assert_eq!(encoded.to_vec(), captured.bytes, "{}", captured.label);
                seen.insert(format!("basic.deliver redelivered={}", deliver.redelivered));
            }
            FramePayload::Header(header) if header.property_flags & 0b11 == 0 => {
                // Decoded and encoded property by property, not just passed through.
                let properties = header.properties().expect("RabbitMQ's properties decode");
                let again = ContentHeader::from_properties(header.class_id, header.body_size, &properties);
                assert_eq!(&again, header, "{}", captured.label);
            }
            _ => {}
        }
        seen.insert(captured.label.rsplit('/').next().unwrap_or_default().to_string());
    }
    for expected in ["connection.start", "basic.get-empty", "basic.return", "basic.nack", "basic.cancel", "header", "body"] {
        assert!(seen.contains(expected), "no {expected} in the fixtures");
    }
    assert!(seen.contains("basic.deliver redelivered=true") && seen.contains("basic.deliver redelivered=false"));
}

fn server_frame(label: &str) -> Frame {
    let captured = captured().into_iter().find(|c| c.from_server && c.label == label).unwrap_or_else(|| panic!("no {label}"));
    decode_exactly(&captured.bytes)
}

#[test]
fn connection_start_carries_rabbitmqs_server_properties() {
    let FramePayload::Method(Method::ConnectionStart(start)) = server_frame("replies/connection.start").payload else {
        panic!("not a connection.start")
    };
    assert_eq!((start.version_major, start.version_minor), (0, 9));
    let properties = &start.server_properties;
    assert_eq!(properties.get("version").and_then(FieldValue::as_text).as_deref(), Some("3.10.8"));
    assert_eq!(properties.get("product").and_then(FieldValue::as_text).as_deref(), Some("RabbitMQ"));
    let Some(FieldValue::Table(capabilities)) = properties.get("capabilities") else { panic!("no capabilities table") };
    assert_eq!(capabilities.get("publisher_confirms"), Some(&FieldValue::Bool(true)));
    assert_eq!(start.mechanisms.as_bytes(), b"AMQPLAIN PLAIN");
}

/// The properties the capture script published (`all_properties` there), as Lepus must decode them.
fn published_properties(message_id: &str) -> BasicProperties {
    let table = |entries: Vec<(&str, FieldValue)>| {
        let mut table = FieldTable::new();
        entries.into_iter().for_each(|(name, value)| table.insert(name, value));
        table
    };
    let headers = table(vec![
        ("bool", FieldValue::Bool(true)),
        ("i8", FieldValue::I8(-128)),
        ("u8", FieldValue::U8(255)),
        ("i16", FieldValue::I16(-32768)),
        ("u16", FieldValue::U16(65535)),
        ("i32", FieldValue::I32(i32::MIN)),
        ("u32", FieldValue::U32(u32::MAX)),
        ("i64", FieldValue::I64(i64::MIN)),
        ("f32", FieldValue::F32(1.5)),
        ("f64", FieldValue::F64(-2.25)),
        ("decimal", FieldValue::Decimal(Decimal { scale: 2, value: 12345 })),
        ("longstr", FieldValue::LongStr(Bytes::from_static(b"text"))),
        ("bytes", FieldValue::Bytes(Bytes::from_static(b"\x00\xff"))),
        (
            "array",
            FieldValue::Array(vec![
                FieldValue::I32(1),
                FieldValue::LongStr(Bytes::from_static(b"two")),
                FieldValue::Table(table(vec![("nested", FieldValue::Bool(false))])),
                FieldValue::Array(vec![]),
            ]),
        ),
        ("timestamp", FieldValue::Timestamp(1_700_000_000)),
        ("table", FieldValue::Table(table(vec![("inner", FieldValue::I64(i64::MAX)), ("empty", FieldValue::Table(FieldTable::new()))]))),
        ("void", FieldValue::Void),
    ]);
    BasicProperties {
        content_type: Some("application/json".into()),
        content_encoding: Some("gzip".into()),
        headers: Some(headers),
        delivery_mode: Some(2),
        priority: Some(7),
        correlation_id: Some("correlation-1".into()),
        reply_to: Some("reply.queue".into()),
        expiration: Some("60000".into()),
        message_id: Some(message_id.into()),
        timestamp: Some(1_700_000_123),
        message_type: Some("capture.type".into()),
        user_id: Some("guest".into()),
        app_id: Some("capture-app".into()),
        cluster_id: Some("cluster-1".into()),
    }
}

#[test]
fn delivered_properties_decode_to_what_was_published() {
    for (label, message_id) in [("replies/basic.get-ok/header", "message-1"), ("replies/basic.deliver/header", "message-2")] {
        let FramePayload::Header(header) = server_frame(label).payload else { panic!("{label} is not a header") };
        assert_eq!(header.properties(), Ok(published_properties(message_id)), "{label}");
        assert_eq!(header.delivery_mode(), Some(2));
        assert!(header.has_user_id() && header.has_expiration());
    }
}

#[test]
fn unused_property_flags_pass_through_as_rabbitmq_passes_them() {
    let FramePayload::Header(header) = server_frame("unused-property-flags/basic.get-ok/header").payload else { panic!("not a header") };
    assert_eq!(header.property_flags, 0x8003);
    assert_eq!(header.properties().map(|p| p.content_type), Ok(Some("text/plain".into())));
}

/// What a server does with a malformed frame.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// It went on (the next method got its reply).
    Accepted,
    /// It closed the connection (or channel) with this reply code.
    Closed(u16),
    /// It dropped the socket without a close frame.
    Dropped,
}

/// Where Lepus answers differently from RabbitMQ on purpose: (scenario, Lepus's answer, why).
const DIFFERENCES: &[(&str, Outcome, &str)] = &[
    ("malformed/unknown-method", Outcome::Closed(540), "RabbitMQ's reader crashes on an unknown method id; Lepus closes with 540"),
    ("malformed/unknown-class", Outcome::Closed(540), "as unknown-method"),
    (
        "malformed/unknown-field-type",
        Outcome::Closed(501),
        "RabbitMQ's table parser crashes; Lepus closes with 501 like other bad arguments",
    ),
    ("malformed/truncated-properties", Outcome::Closed(501), "RabbitMQ's channel crashes (541); Lepus refuses at the frame, 501"),
    ("malformed/trailing-property-bytes", Outcome::Closed(501), "as truncated-properties"),
];

#[test]
fn malformed_frames_get_rabbitmqs_answer() {
    let frames = captured();
    let mut compared = 0;
    for (index, sent) in frames.iter().enumerate().filter(|(_, c)| !c.from_server) {
        let scenario = sent.label.trim_end_matches("/frame");
        let answer = frames.get(index + 1).filter(|c| c.from_server).unwrap_or_else(|| panic!("no answer to {scenario}"));
        let rabbitmq = match answer.label.rsplit('/').next() {
            Some("socket-closed") => Outcome::Dropped,
            Some("basic.qos-ok") => Outcome::Accepted,
            Some("connection.close") => match decode_exactly(&answer.bytes).payload {
                FramePayload::Method(Method::ConnectionClose(close)) => Outcome::Closed(close.reply_code),
                other => panic!("{other:?}"),
            },
            other => panic!("{scenario}: unexpected answer {other:?}"),
        };
        let mut buffer = BytesMut::from(&sent.bytes[..]);
        let lepus = match decode_frame(&mut buffer, 0) {
            Ok(Some(_)) => Outcome::Accepted,
            Ok(None) => panic!("{scenario}: incomplete frame"),
            Err(error) => Outcome::Closed(error.reply_code()),
        };
        match DIFFERENCES.iter().find(|(name, _, _)| *name == scenario) {
            Some((_, expected, why)) => {
                assert_ne!(rabbitmq, *expected, "{scenario}: RabbitMQ now answers as Lepus; drop the difference ({why})");
                assert_eq!(lepus, *expected, "{scenario}: {why}");
            }
            None => assert_eq!(lepus, rabbitmq, "{scenario}"),
        }
        compared += 1;
    }
    assert!(compared >= 9, "only {compared} malformed frames in the fixtures");
}
