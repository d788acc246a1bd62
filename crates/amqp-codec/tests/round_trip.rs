//! Property tests: everything the codec encodes decodes back to the same value, and no input,
//! however hostile, makes the decoder panic.

use amqp_codec::*;
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

fn round_trip(channel: u16, method: &Method) -> Method {
    let mut buffer = BytesMut::new();
    encode_method_frame(&mut buffer, channel, method);
    let frame = decode_frame(&mut buffer, 0).expect("decodes").expect("complete");
    assert!(buffer.is_empty(), "the frame consumed exactly its bytes");
    assert_eq!(frame.channel, channel);
    match frame.payload {
        FramePayload::Method(decoded) => decoded,
        other => panic!("expected a method, got {other:?}"),
    }
}

#[test]
fn every_method_of_the_spec_round_trips() {
    let methods = every_method();
    assert_eq!(methods.len(), 66, "the RabbitMQ spec defines 66 methods");
    for method in methods {
        assert_eq!(round_trip(1, &method), method, "{}", method.name());
    }
}

fn short_str() -> impl Strategy<Value = ShortStr> {
    proptest::collection::vec(any::<u8>(), 0..=255).prop_map(|bytes| ShortStr::from_bytes(Bytes::from(bytes)))
}

fn field_value() -> impl Strategy<Value = FieldValue> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(FieldValue::Bool),
        any::<i8>().prop_map(FieldValue::I8),
        any::<u8>().prop_map(FieldValue::U8),
        any::<i16>().prop_map(FieldValue::I16),
        any::<u16>().prop_map(FieldValue::U16),
        any::<i32>().prop_map(FieldValue::I32),
        any::<u32>().prop_map(FieldValue::U32),
        any::<i64>().prop_map(FieldValue::I64),
        any::<u32>().prop_map(|bits| FieldValue::F32(f32::from_bits(bits & 0x7f7f_ffff))),
        any::<u64>().prop_map(|bits| FieldValue::F64(f64::from_bits(bits & 0x7fef_ffff_ffff_ffff))),
        (any::<u8>(), any::<u32>()).prop_map(|(scale, value)| FieldValue::Decimal(Decimal { scale, value })),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(|bytes| FieldValue::LongStr(Bytes::from(bytes))),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(|bytes| FieldValue::Bytes(Bytes::from(bytes))),
        any::<u64>().prop_map(FieldValue::Timestamp),
        Just(FieldValue::Void),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(FieldValue::Array),
            proptest::collection::vec((short_str(), inner), 0..8).prop_map(|entries| FieldValue::Table(FieldTable(entries))),
        ]
    })
}

fn field_table() -> impl Strategy<Value = FieldTable> {
    proptest::collection::vec((short_str(), field_value()), 0..8).prop_map(FieldTable)
}

proptest! {
    #[test]
    fn publish_path_methods_round_trip(
        exchange in short_str(), routing_key in short_str(), tag in any::<u64>(),
        flags in any::<(bool, bool, bool)>(), channel in 1u16..,
    ) {
        let methods: Vec<Method> = vec![
            BasicPublish { ticket: 0, exchange: exchange.clone(), routing_key: routing_key.clone(), mandatory: flags.0, immediate: flags.1 }.into(),
            BasicDeliver { consumer_tag: routing_key.clone(), delivery_tag: tag, redelivered: flags.2, exchange, routing_key }.into(),
            BasicAck { delivery_tag: tag, multiple: flags.0 }.into(),
            BasicNack { delivery_tag: tag, multiple: flags.1, requeue: flags.2 }.into(),
        ];
        for method in methods {
            prop_assert_eq!(round_trip(channel, &method), method);
        }
    }

    #[test]
    fn declarations_with_tables_round_trip(queue in short_str(), arguments in field_table(), bits in any::<[bool; 5]>()) {
        let method: Method = QueueDeclare {
            ticket: 0, queue, passive: bits[0], durable: bits[1], exclusive: bits[2], auto_delete: bits[3], nowait: bits[4], arguments,
        }.into();
        prop_assert_eq!(round_trip(7, &method), method);
    }

    #[test]
    fn properties_round_trip(headers in proptest::option::of(field_table()), mode in proptest::option::of(any::<u8>()),
                             id in proptest::option::of(short_str()), timestamp in proptest::option::of(any::<u64>())) {
        let properties = BasicProperties { headers, delivery_mode: mode, message_id: id, timestamp, ..Default::default() };
        let header = ContentHeader::from_properties(60, 42, &properties);
        let mut buffer = BytesMut::new();
        encode_content_header(&mut buffer, 3, &header);
        let frame = decode_frame(&mut buffer, 0).expect("decodes").expect("complete");
        let FramePayload::Header(decoded) = frame.payload else { panic!("expected a header") };
        prop_assert_eq!(decoded.delivery_mode(), mode);
        prop_assert_eq!(decoded.properties().expect("properties decode"), properties);
    }

    /// Arbitrary bytes after a valid frame header: an error or a frame, never a panic.
    #[test]
    fn hostile_bytes_never_panic(kind in prop_oneof![Just(1u8), Just(2u8), Just(3u8), Just(8u8), any::<u8>()],
                                 payload in proptest::collection::vec(any::<u8>(), 0..512), end in prop_oneof![Just(0xceu8), any::<u8>()]) {
        let mut buffer = BytesMut::new();
        buffer.extend_from_slice(&[kind, 0, 1]);
        buffer.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        buffer.extend_from_slice(&payload);
        buffer.extend_from_slice(&[end]);
        let _ = decode_frame(&mut buffer, 131_072);
    }
}
