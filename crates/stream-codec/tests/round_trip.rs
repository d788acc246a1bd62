//! Property tests: every command of both directions, with random fields, encodes to one frame
//! that decodes back to the same value; every such frame cut short, or with a byte appended,
//! decodes to a typed error (never a panic, never a different command); arbitrary bytes never
//! make a decoder panic. The byte layouts themselves are checked against RabbitMQ's in
//! `layouts.rs`, so a bug shared by this crate's encoder and decoder still shows.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use stream_codec::*;

fn text() -> impl Strategy<Value = Text> {
    prop_oneof![
        Just(Text::from("")),
        "[a-zA-Z0-9 ._/-]{1,40}".prop_map(Text::from),
        vec(any::<u8>(), 0..300).prop_map(|b| Text::from(Bytes::from(b)))
    ]
}

fn text_map() -> impl Strategy<Value = TextMap> {
    vec((text(), text()), 0..6)
}

fn code() -> impl Strategy<Value = ResponseCode> {
    any::<u16>().prop_map(ResponseCode::from_u16)
}

fn offset_specification() -> impl Strategy<Value = OffsetSpecification> {
    prop_oneof![
        Just(OffsetSpecification::First),
        Just(OffsetSpecification::Last),
        Just(OffsetSpecification::Next),
        any::<u64>().prop_map(OffsetSpecification::Offset),
        any::<i64>().prop_map(OffsetSpecification::Timestamp),
    ]
}

fn data_entry() -> impl Strategy<Value = DataEntry> {
    let simple = vec(any::<u8>(), 0..200).prop_map(|body| DataEntry::simple(&body));
    let sub_batch =
        (0u8..8, any::<u16>(), any::<u32>(), vec(any::<u8>(), 0..200)).prop_map(|(compression, records, uncompressed, body)| {
            let mut raw = BytesMut::new();
            bytes::BufMut::put_u8(&mut raw, 0x80 | (compression << 4));
            bytes::BufMut::put_u16(&mut raw, records);
            bytes::BufMut::put_u32(&mut raw, uncompressed);
            bytes::BufMut::put_u32(&mut raw, body.len() as u32);
            bytes::BufMut::put_slice(&mut raw, &body);
            DataEntry::from_raw(raw.freeze()).expect("a well-formed sub-batch")
        });
    prop_oneof![simple, sub_batch]
}

fn published_messages() -> impl Strategy<Value = PublishedMessages> {
    vec((any::<u64>(), data_entry()), 0..8).prop_map(|entries| {
        let entries: Vec<PublishedEntry> =
            entries.into_iter().map(|(publishing_id, entry)| PublishedEntry { publishing_id, entry }).collect();
        PublishedMessages::from_entries(&entries)
    })
}

fn client_command() -> impl Strategy<Value = ClientCommand> {
    use ClientCommand::*;
    let id = any::<u32>;
    prop_oneof![
        (id(), any::<u8>(), text(), text()).prop_map(|(correlation_id, publisher_id, reference, stream)| DeclarePublisher {
            correlation_id,
            publisher_id,
            reference,
            stream
        }),
        (any::<u8>(), published_messages()).prop_map(|(publisher_id, messages)| Publish { publisher_id, messages }),
        (id(), text(), text()).prop_map(|(correlation_id, reference, stream)| QueryPublisherSequence { correlation_id, reference, stream }),
        (id(), any::<u8>()).prop_map(|(correlation_id, publisher_id)| DeletePublisher { correlation_id, publisher_id }),
        (id(), any::<u8>(), text(), offset_specification(), any::<u16>(), text_map()).prop_map(
            |(correlation_id, subscription_id, stream, offset, credit, properties)| Subscribe {
                correlation_id,
                subscription_id,
                stream,
                offset,
                credit,
                properties
            }
        ),
        (any::<u8>(), any::<u16>()).prop_map(|(subscription_id, credit)| Credit { subscription_id, credit }),
        (text(), text(), any::<u64>()).prop_map(|(reference, stream, offset)| StoreOffset { reference, stream, offset }),
        (id(), text(), text()).prop_map(|(correlation_id, reference, stream)| QueryOffset { correlation_id, reference, stream }),
        (id(), any::<u8>()).prop_map(|(correlation_id, subscription_id)| Unsubscribe { correlation_id, subscription_id }),
        (id(), text(), text_map()).prop_map(|(correlation_id, stream, arguments)| Create { correlation_id, stream, arguments }),
        (id(), text()).prop_map(|(correlation_id, stream)| Delete { correlation_id, stream }),
        (id(), vec(text(), 0..6)).prop_map(|(correlation_id, streams)| Metadata { correlation_id, streams }),
        (id(), text_map()).prop_map(|(correlation_id, properties)| PeerProperties { correlation_id, properties }),
        id().prop_map(|correlation_id| SaslHandshake { correlation_id }),
        (id(), text(), vec(any::<u8>(), 0..100)).prop_map(|(correlation_id, mechanism, response)| SaslAuthenticate {
            correlation_id,
            mechanism,
            response: Bytes::from(response)
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(frame_max, heartbeat_s)| Tune { frame_max, heartbeat_s }),
        (id(), text()).prop_map(|(correlation_id, virtual_host)| Open { correlation_id, virtual_host }),
        (id(), any::<u16>(), text()).prop_map(|(correlation_id, code, reason)| Close { correlation_id, code, reason }),
        (id(), any::<u16>()).prop_map(|(correlation_id, code)| CloseResponse { correlation_id, code }),
        Just(Heartbeat),
        (id(), text(), text()).prop_map(|(correlation_id, routing_key, super_stream)| Route { correlation_id, routing_key, super_stream }),
        (id(), text()).prop_map(|(correlation_id, super_stream)| Partitions { correlation_id, super_stream }),
    ]
}

fn server_command() -> impl Strategy<Value = ServerCommand> {
    use ServerCommand::*;
    let id = any::<u32>;
    let broker = (any::<u16>(), text(), any::<u32>()).prop_map(|(reference, host, port)| Broker { reference, host, port });
    let stream_metadata = (text(), code(), any::<u16>(), vec(any::<u16>(), 0..4))
        .prop_map(|(stream, code, leader, replicas)| StreamMetadata { stream, code, leader, replicas });
    let error = (any::<u64>(), code()).prop_map(|(publishing_id, code)| PublishingError { publishing_id, code });
    prop_oneof![
        (proptest::sample::select(PLAIN_RESPONSE_KEYS.to_vec()), id(), code()).prop_map(|(key, correlation_id, code)| Response {
            key,
            correlation_id,
            code
        }),
        (any::<u8>(), vec(any::<u64>(), 0..20)).prop_map(|(publisher_id, publishing_ids)| PublishConfirm { publisher_id, publishing_ids }),
        (any::<u8>(), vec(error, 0..10)).prop_map(|(publisher_id, errors)| PublishError { publisher_id, errors }),
        (id(), code(), any::<u64>()).prop_map(|(correlation_id, code, sequence)| QueryPublisherSequenceResponse {
            correlation_id,
            code,
            sequence
        }),
        (any::<u8>(), vec(any::<u8>(), 0..300)).prop_map(|(subscription_id, chunk)| Deliver { subscription_id, chunk: Bytes::from(chunk) }),
        (code(), any::<u8>()).prop_map(|(code, subscription_id)| CreditResponse { code, subscription_id }),
        (id(), code(), any::<u64>()).prop_map(|(correlation_id, code, offset)| QueryOffsetResponse { correlation_id, code, offset }),
        (id(), vec(broker, 0..4), vec(stream_metadata, 0..4)).prop_map(|(correlation_id, brokers, streams)| MetadataResponse {
            correlation_id,
            brokers,
            streams
        }),
        (code(), text()).prop_map(|(code, stream)| MetadataUpdate { code, stream }),
        (id(), code(), text_map()).prop_map(|(correlation_id, code, properties)| PeerPropertiesResponse {
            correlation_id,
            code,
            properties
        }),
        (id(), code(), vec(text(), 0..4)).prop_map(|(correlation_id, code, mechanisms)| SaslHandshakeResponse {
            correlation_id,
            code,
            mechanisms
        }),
        (id(), code(), vec(any::<u8>(), 0..50)).prop_map(|(correlation_id, code, challenge)| SaslAuthenticateResponse {
            correlation_id,
            code,
            challenge: Bytes::from(challenge)
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(frame_max, heartbeat_s)| Tune { frame_max, heartbeat_s }),
        (id(), code(), text_map()).prop_map(|(correlation_id, code, properties)| OpenResponse { correlation_id, code, properties }),
        (id(), code(), text()).prop_map(|(correlation_id, code, reason)| Close { correlation_id, code, reason }),
        (id(), code()).prop_map(|(correlation_id, code)| CloseResponse { correlation_id, code }),
        Just(Heartbeat),
        (id(), code(), vec(text(), 0..4)).prop_map(|(correlation_id, code, streams)| RouteResponse { correlation_id, code, streams }),
        (id(), code(), vec(text(), 0..4)).prop_map(|(correlation_id, code, streams)| PartitionsResponse { correlation_id, code, streams }),
    ]
}

/// Splits exactly one frame off `bytes`, checking the size field covers all of it.
fn one_frame(bytes: &[u8]) -> Bytes {
    let mut buffer = BytesMut::from(bytes);
    let frame = split_frame(&mut buffer, 0).expect("no bound").expect("a complete frame");
    assert!(buffer.is_empty(), "the size field covers the whole encoding");
    frame
}

/// The frame's bytes with its size field rewritten for `frame`.
fn with_size(frame: &[u8]) -> Bytes {
    let mut bytes = BytesMut::new();
    bytes::BufMut::put_u32(&mut bytes, frame.len() as u32);
    bytes::BufMut::put_slice(&mut bytes, frame);
    bytes.freeze()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn client_commands_round_trip(command in client_command()) {
        let mut bytes = BytesMut::new();
        command.encode(&mut bytes);
        let decoded = ClientCommand::decode(one_frame(&bytes)).expect("decodes");
        prop_assert_eq!(decoded, command);
    }

    #[test]
    fn server_commands_round_trip(command in server_command()) {
        let mut bytes = BytesMut::new();
        command.encode(&mut bytes);
        let decoded = ServerCommand::decode(one_frame(&bytes)).expect("decodes");
        prop_assert_eq!(decoded, command);
    }

    /// A frame cut anywhere is an error, or (where the tail is optional or open-ended: a
    /// subscribe's properties, an open answer's properties, a publish's or deliver's payload)
    /// a command that re-encodes to the shorter bytes; never a panic.
    #[test]
    fn truncated_client_frames_fail_cleanly(command in client_command(), cut in any::<prop::sample::Index>()) {
        let mut bytes = BytesMut::new();
        command.encode(&mut bytes);
        let frame = one_frame(&bytes);
        let cut = cut.index(frame.len());
        if let Ok(decoded) = ClientCommand::decode(frame.slice(..cut)) {
            let mut again = BytesMut::new();
            decoded.encode(&mut again);
            prop_assert_eq!(&again[4..], &frame[..cut]);
        }
    }

    #[test]
    fn truncated_server_frames_fail_cleanly(command in server_command(), cut in any::<prop::sample::Index>()) {
        let mut bytes = BytesMut::new();
        command.encode(&mut bytes);
        let frame = one_frame(&bytes);
        let cut = cut.index(frame.len());
        if let Ok(decoded) = ServerCommand::decode(frame.slice(..cut)) {
            let mut again = BytesMut::new();
            decoded.encode(&mut again);
            prop_assert_eq!(&again[4..], &frame[..cut]);
        }
    }

    /// A byte appended is trailing garbage, except where the frame ends in an open-ended part.
    #[test]
    fn extended_client_frames_fail_cleanly(command in client_command(), extra in any::<u8>()) {
        let mut bytes = BytesMut::new();
        command.encode(&mut bytes);
        let mut frame = one_frame(&bytes).to_vec();
        frame.push(extra);
        let open_ended = matches!(command, ClientCommand::Subscribe { .. } | ClientCommand::Publish { .. });
        match ClientCommand::decode(Bytes::from(frame.clone())) {
            Ok(decoded) => {
                prop_assert!(open_ended, "{command:?} plus one byte decoded as {decoded:?}");
                let mut again = BytesMut::new();
                decoded.encode(&mut again);
                prop_assert_eq!(&again[..], &with_size(&frame)[..]);
            }
            Err(error) => prop_assert_eq!(error.response_code(), ResponseCode::UnknownFrame),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..400), frame_max in prop_oneof![Just(0u32), 0u32..500]) {
        let mut buffer = BytesMut::from(&bytes[..]);
        for _ in 0..64 {
            match split_frame(&mut buffer, frame_max) {
                Ok(Some(frame)) => {
                    let _ = ClientCommand::decode(frame.clone());
                    if let Ok(ServerCommand::Deliver { chunk, .. }) = ServerCommand::decode(frame) {
                        if let Ok(chunk) = Chunk::parse(chunk) {
                            for entry in chunk.entries().flatten() {
                                entry.records().map(|records| records.count());
                            }
                        }
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
    }

    #[test]
    fn publish_frames_written_in_place_decode_to_their_messages(bodies in vec(vec(any::<u8>(), 0..64), 0..20), first_id in any::<u32>(), publisher_id in any::<u8>()) {
        let mut bytes = BytesMut::new();
        let mut frame = PublishFrame::begin(&mut bytes, publisher_id);
        for (index, body) in bodies.iter().enumerate() {
            frame.push(&mut bytes, u64::from(first_id) + index as u64, body);
        }
        frame.finish(&mut bytes);
        let ClientCommand::Publish { publisher_id: decoded_id, messages } = ClientCommand::decode(one_frame(&bytes)).expect("decodes") else {
            panic!("not a publish");
        };
        prop_assert_eq!(decoded_id, publisher_id);
        prop_assert_eq!(messages.message_count as usize, bodies.len());
        let decoded: Vec<(u64, Bytes)> = messages.iter().map(|published| (published.publishing_id, published.entry.body())).collect();
        let expected: Vec<(u64, Bytes)> = bodies.iter().enumerate().map(|(index, body)| (u64::from(first_id) + index as u64, Bytes::from(body.clone()))).collect();
        prop_assert_eq!(decoded, expected);
    }
}
