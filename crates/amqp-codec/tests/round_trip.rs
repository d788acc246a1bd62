//! Property tests driven by the specification: every method of `spec/amqp-rabbitmq-0.9.1.json`
//! with random arguments, and every basic property, encode to the bytes the specification
//! prescribes and decode back to the same value; the same encodings, truncated, altered or
//! extended, make the decoders return a typed error with reply code 501 and never panic.
//!
//! The methods come from the JSON at run time, so a method added to the spec is covered without
//! editing this file. The expected bytes come from the test's own encoder (`support`), so a bug
//! shared by the codec's encoder and decoder still shows.

mod support;

use amqp_codec::*;
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::*;

/// Random cases per method (66 methods): enough for every bit of every bit-packed method to be
/// seen set and clear many times.
const CASES_PER_METHOD: u32 = 48;
/// Random cases for the content header tests.
const HEADER_CASES: u32 = 256;
/// Any channel but 0 (the value does not matter to the codec, only that it survives).
const CHANNEL: u16 = 0x0102;

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() })
}

/// Runs `test` with random arguments for every method of the spec, naming the method that fails.
fn for_every_method<S: Strategy>(
    cases: u32,
    strategy: impl Fn(&SpecMethod) -> S,
    test: impl Fn(&SpecMethod, S::Value) -> Result<(), TestCaseError>,
) {
    let spec = spec();
    assert!(!spec.methods.is_empty(), "the spec lists no methods");
    for method in &spec.methods {
        let result = runner(cases).run(&strategy(method), |value| test(method, value));
        if let Err(failure) = result {
            panic!("{}: {failure}", method.name);
        }
    }
}

fn decode_one(bytes: &[u8]) -> Result<Option<Frame>, DecodeError> {
    let mut buffer = BytesMut::from(bytes);
    let frame = decode_frame(&mut buffer, 0);
    if let Ok(Some(_)) = frame {
        assert!(buffer.is_empty(), "a decoded frame consumes exactly its bytes");
    }
    frame
}

fn decode_method_frame(bytes: &[u8]) -> Result<Method, DecodeError> {
    match decode_one(bytes)? {
        Some(Frame { channel: CHANNEL, payload: FramePayload::Method(method) }) => Ok(method),
        other => panic!("expected a method frame on channel {CHANNEL}, got {other:?}"),
    }
}

#[test]
fn the_generated_methods_are_the_specs_methods() {
    let spec = spec();
    let generated: Vec<(u16, u16, &str)> = every_method().iter().map(|m| (m.class_id(), m.method_id(), m.name())).collect();
    let specified: Vec<(u16, u16, &str)> = spec.methods.iter().map(|m| (m.class_id, m.method_id, m.name.as_str())).collect();
    assert_eq!(generated, specified);
}

#[test]
fn every_method_encodes_as_the_spec_says_and_decodes_back() {
    for_every_method(CASES_PER_METHOD, method_arguments, |spec_method, values| {
        let method = build_method(spec_method, &values);
        prop_assert_eq!(method.name(), spec_method.name.as_str());
        prop_assert_eq!((method.class_id(), method.method_id()), (spec_method.class_id, spec_method.method_id));
        prop_assert_eq!(method.has_content(), spec_method.content);

        let expected = frame(1, CHANNEL, &encode_method_payload(spec_method, &values));
        let mut encoded = BytesMut::new();
        encode_method_frame(&mut encoded, CHANNEL, &method);
        prop_assert_eq!(&encoded[..], &expected[..], "the codec's encoding differs from the spec's");

        let decoded = decode_method_frame(&expected).map_err(|error| TestCaseError::fail(format!("{error}")))?;
        prop_assert_eq!(&decoded, &method);
        let names: Vec<&str> = spec_method.arguments.iter().map(|argument| argument.name.as_str()).collect();
        let listed: Vec<(&str, ArgumentValue)> = arguments_of(&decoded);
        prop_assert_eq!(listed, names.into_iter().zip(values).collect::<Vec<_>>());
        Ok(())
    });
}

/// The error a damaged method frame must produce, given what the damage was.
fn check_damaged_method(spec_method: &SpecMethod, damage: &Damage, result: Result<Method, DecodeError>) -> Result<(), TestCaseError> {
    match (damage, result) {
        (_, Ok(method)) => {
            // Only a replaced byte can leave a valid method (another value of the same field). It
            // must then be stable: encoded, decoded and encoded again, the same bytes (bytes, since
            // a replaced byte can make a float NaN, which never equals itself).
            prop_assert!(matches!(damage, Damage::Replace(..)), "a truncated or extended method decoded: {method:?}");
            let mut encoded = BytesMut::new();
            encode_method_frame(&mut encoded, CHANNEL, &method);
            let again = decode_method_frame(&encoded).map_err(|error| TestCaseError::fail(error.to_string()))?;
            let mut encoded_again = BytesMut::new();
            encode_method_frame(&mut encoded_again, CHANNEL, &again);
            prop_assert_eq!(encoded_again, encoded);
        }
        (_, Err(error @ DecodeError::MethodArguments { .. })) => {
            let DecodeError::MethodArguments { class_id, method_id, ref detail } = error else { unreachable!() };
            prop_assert_eq!((class_id, method_id), (spec_method.class_id, spec_method.method_id));
            prop_assert_eq!(error.reply_code(), constants::FRAME_ERROR);
            match damage {
                Damage::Truncate(_) => prop_assert_eq!(detail, &DecodeError::Truncated.to_string()),
                Damage::Append(extra) => prop_assert_eq!(detail, &DecodeError::TrailingBytes(extra.len()).to_string()),
                Damage::Replace(..) => {}
            }
        }
        (damage, Err(error)) => return Err(TestCaseError::fail(format!("{damage:?} gave {error:?}, not a MethodArguments error"))),
    }
    Ok(())
}

#[test]
fn damaged_method_arguments_give_frame_errors_never_panics() {
    for_every_method(
        CASES_PER_METHOD,
        |method| (method_arguments(method), damage()),
        |spec_method, (values, damage)| {
            let payload = encode_method_payload(spec_method, &values);
            // The class and method ids stay intact so the damage reaches the argument decoder.
            let Some(damaged) = apply_damage(&payload, 4, &damage) else { return Ok(()) };
            check_damaged_method(spec_method, &damage, decode_method_frame(&frame(1, CHANNEL, &damaged)))
        },
    );
}

#[test]
fn damaged_method_ids_give_typed_errors() {
    let known: std::collections::HashSet<(u16, u16)> = spec().methods.iter().map(|m| (m.class_id, m.method_id)).collect();
    let strategy = (any::<u16>(), any::<u16>(), proptest::collection::vec(any::<u8>(), 0..64));
    runner(1024)
        .run(&strategy, |(class_id, method_id, rest)| {
            let mut payload = class_id.to_be_bytes().to_vec();
            payload.extend_from_slice(&method_id.to_be_bytes());
            payload.extend_from_slice(&rest);
            match decode_method_frame(&frame(1, CHANNEL, &payload)) {
                Err(error @ DecodeError::UnknownMethod { .. }) => {
                    prop_assert!(!known.contains(&(class_id, method_id)));
                    prop_assert_eq!(error.reply_code(), constants::NOT_IMPLEMENTED);
                }
                Err(error) => {
                    prop_assert!(known.contains(&(class_id, method_id)), "{error:?}");
                    prop_assert_eq!(error.reply_code(), constants::FRAME_ERROR);
                }
                Ok(method) => prop_assert_eq!((method.class_id(), method.method_id()), (class_id, method_id)),
            }
            for cut in 0..4 {
                prop_assert_eq!(decode_method_frame(&frame(1, CHANNEL, &payload[..cut])), Err(DecodeError::Truncated));
            }
            Ok(())
        })
        .unwrap();
}

fn header_strategy() -> impl Strategy<Value = (u64, Vec<Option<ArgumentValue>>)> {
    (any_u64(), basic_property_values(&spec()))
}

fn decode_header_frame(bytes: &[u8]) -> Result<ContentHeader, DecodeError> {
    match decode_one(bytes)? {
        Some(Frame { channel: CHANNEL, payload: FramePayload::Header(header) }) => Ok(header),
        other => panic!("expected a content header frame on channel {CHANNEL}, got {other:?}"),
    }
}

/// Everything a header offers must agree with its decoded properties: the broker reads
/// `delivery_mode`, `has_user_id` and `has_expiration` from the raw bytes without decoding.
fn check_header_accessors(header: &ContentHeader) -> Result<BasicProperties, TestCaseError> {
    let properties = header.properties().map_err(|error| TestCaseError::fail(format!("a decoded header's properties fail: {error}")))?;
    prop_assert_eq!(header.delivery_mode(), properties.delivery_mode);
    prop_assert_eq!(header.priority(), properties.priority);
    prop_assert_eq!(header.has_user_id(), properties.user_id.is_some());
    prop_assert_eq!(header.has_expiration(), properties.expiration.is_some());
    Ok(properties)
}

#[test]
fn every_basic_property_encodes_as_the_spec_says_and_decodes_back() {
    let spec = spec();
    assert_eq!(spec.basic_properties.len(), 14, "the basic class has 14 properties (flag bits 15 to 2)");
    runner(HEADER_CASES)
        .run(&header_strategy(), |(body_size, values)| {
            let properties = basic_properties(&spec, &values);
            let expected = frame(2, CHANNEL, &encode_header_payload(body_size, &values));
            let header = ContentHeader::from_properties(60, body_size, &properties);
            let mut encoded = BytesMut::new();
            encode_content_header(&mut encoded, CHANNEL, &header);
            prop_assert_eq!(&encoded[..], &expected[..], "the codec's encoding differs from the spec's");

            let decoded = decode_header_frame(&expected).map_err(|error| TestCaseError::fail(format!("{error}")))?;
            prop_assert_eq!((decoded.class_id, decoded.body_size), (60, body_size));
            prop_assert_eq!(check_header_accessors(&decoded)?, properties);
            Ok(())
        })
        .unwrap();
}

#[test]
fn damaged_content_headers_give_frame_errors_never_panics() {
    runner(HEADER_CASES * 2)
        .run(&(header_strategy(), damage()), |((body_size, values), damage)| {
            let payload = encode_header_payload(body_size, &values);
            // Damage anywhere after the class id: weight, body size, flags, properties.
            let Some(damaged) = apply_damage(&payload, 2, &damage) else { return Ok(()) };
            match (decode_header_frame(&frame(2, CHANNEL, &damaged)), &damage) {
                (Ok(header), Damage::Replace(..)) => {
                    let properties = check_header_accessors(&header)?;
                    // Stable as bytes (see check_damaged_method).
                    let again = ContentHeader::from_properties(header.class_id, header.body_size, &properties);
                    let properties_again = again.properties().map_err(|error| TestCaseError::fail(error.to_string()))?;
                    let third = ContentHeader::from_properties(header.class_id, header.body_size, &properties_again);
                    prop_assert_eq!(third, again);
                }
                (Ok(header), damage) => return Err(TestCaseError::fail(format!("{damage:?} decoded as {header:?}"))),
                (Err(error), damage) => {
                    prop_assert_eq!(error.reply_code(), constants::FRAME_ERROR, "{:?}", error);
                    match damage {
                        Damage::Truncate(_) => prop_assert_eq!(error, DecodeError::Truncated),
                        Damage::Append(extra) => prop_assert_eq!(error, DecodeError::TrailingBytes(extra.len())),
                        Damage::Replace(..) => {}
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn damaged_field_tables_give_typed_errors_never_panics() {
    runner(384)
        .run(&(field_table(), damage()), |(table, damage)| {
            let mut encoded = Vec::new();
            encode_table(&mut encoded, &table);
            prop_assert_eq!(Reader::new(Bytes::from(encoded.clone())).read_table(), Ok(table));
            // The length prefix stays intact: the damage lands in the entries.
            let Some(damaged) = apply_damage(&encoded, 4, &damage) else { return Ok(()) };
            let mut reader = Reader::new(Bytes::from(damaged));
            match reader.read_table() {
                Ok(decoded) => {
                    // Stable as bytes (see check_damaged_method).
                    let mut encoded = BytesMut::new();
                    write_table(&mut encoded, &decoded);
                    let again = Reader::new(encoded.clone().freeze()).read_table().map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let mut encoded_again = BytesMut::new();
                    write_table(&mut encoded_again, &again);
                    prop_assert_eq!(encoded_again, encoded);
                }
                Err(error) => {
                    prop_assert_eq!(error.reply_code(), constants::FRAME_ERROR);
                    prop_assert!(
                        matches!(error, DecodeError::Truncated | DecodeError::UnknownFieldType(_) | DecodeError::NestingTooDeep(_)),
                        "{:?}",
                        error
                    );
                }
            }
            Ok(())
        })
        .unwrap();
}

/// NaN never equals itself, so floats of every bit pattern are compared as bytes.
#[test]
fn floats_of_every_bit_pattern_keep_their_bytes() {
    runner(1024)
        .run(&(any::<u32>(), any::<u64>()), |(f32_bits, f64_bits)| {
            let mut table = FieldTable::new();
            table.insert("f", FieldValue::F32(f32::from_bits(f32_bits)));
            table.insert("d", FieldValue::F64(f64::from_bits(f64_bits)));
            let mut expected = Vec::new();
            encode_table(&mut expected, &table);
            let decoded = Reader::new(Bytes::from(expected.clone())).read_table().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut encoded = BytesMut::new();
            write_table(&mut encoded, &decoded);
            prop_assert_eq!(&encoded[..], &expected[..]);
            Ok(())
        })
        .unwrap();
}

/// A table or array nested far deeper than any client sends is refused without exhausting the
/// stack; a moderately nested one decodes.
#[test]
fn nesting_is_bounded() {
    // (levels of the loop below, type tag, whether it decodes); an 'A' level nests two deep.
    for (depth, tag, decodes) in [(10_000, b'F', false), (10_000, b'A', false), (20, b'F', true), (10, b'A', true)] {
        let mut inner = Vec::new();
        encode_table(&mut inner, &FieldTable::new());
        for _ in 0..depth {
            let mut entries = Vec::new();
            if tag == b'F' {
                entries.extend_from_slice(&[1, b'k', b'F']);
                entries.extend_from_slice(&inner);
            } else {
                entries.extend_from_slice(&[1, b'k', b'A']);
                entries.extend_from_slice(&(inner.len() as u32 + 1).to_be_bytes());
                entries.push(b'F');
                entries.extend_from_slice(&inner);
            }
            inner = (entries.len() as u32).to_be_bytes().to_vec();
            inner.extend_from_slice(&entries);
        }
        let result = Reader::new(Bytes::from(inner)).read_table();
        if decodes {
            assert!(result.is_ok(), "depth {depth} {}: {result:?}", tag as char);
        } else {
            assert!(matches!(result, Err(DecodeError::NestingTooDeep(_))), "depth {depth} {}: {result:?}", tag as char);
        }
    }
}

/// Arbitrary bytes after a frame header of any type, with any end octet: an error or a frame,
/// never a panic (the frame layer; the tests above reach the argument and property decoders).
#[test]
fn hostile_frames_never_panic() {
    let kind = prop_oneof![Just(1u8), Just(2u8), Just(3u8), Just(8u8), any::<u8>()];
    let end = prop_oneof![Just(0xceu8), any::<u8>()];
    runner(1024)
        .run(&(kind, proptest::collection::vec(any::<u8>(), 0..512), end), |(kind, payload, end)| {
            let mut bytes = frame(kind, 1, &payload);
            *bytes.last_mut().expect("a frame ends with its end octet") = end;
            match decode_one(&bytes) {
                Ok(Some(Frame { payload: FramePayload::Header(header), .. })) => {
                    check_header_accessors(&header)?;
                }
                Ok(_) => {}
                Err(error) => prop_assert!(matches!(error.reply_code(), constants::FRAME_ERROR | constants::NOT_IMPLEMENTED)),
            }
            Ok(())
        })
        .unwrap();
}

/// py-amqp (kombu, Celery) writes an integer past 32 bits with the tag 'L' (signed 64-bit), as
/// Celery's delayed-delivery queues' x-message-ttl of 2^27 s: read as a long, as RabbitMQ takes it.
#[test]
fn a_py_amqp_long_tagged_l_reads_as_a_signed_64_bit_integer() {
    let mut entries = vec![13u8];
    entries.extend_from_slice(b"x-message-ttl");
    entries.push(b'L');
    entries.extend_from_slice(&134_217_728_000i64.to_be_bytes());
    entries.push(3);
    entries.extend_from_slice(b"neg");
    entries.push(b'L');
    entries.extend_from_slice(&(-5i64).to_be_bytes());
    let mut encoded = (entries.len() as u32).to_be_bytes().to_vec();
    encoded.extend_from_slice(&entries);
    let table = Reader::new(Bytes::from(encoded)).read_table().expect("an 'L' value is read");
    assert_eq!(table.get("x-message-ttl"), Some(&FieldValue::I64(134_217_728_000)));
    assert_eq!(table.get("neg"), Some(&FieldValue::I64(-5)));
}
