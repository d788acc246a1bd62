//! What the codec's tests share: the specification read straight from its JSON (not through the
//! code `build.rs` generated from it), proptest strategies for every wire type, and an encoder of
//! the test's own. Comparing the codec's bytes with this encoder's catches a bug that the codec's
//! encoder and decoder share (a swapped bit, a wrong type tag), which a round trip alone misses.

// Each test file uses a different part of this module.
#![allow(dead_code)]

use amqp_codec::*;
use bytes::Bytes;
use proptest::prelude::*;
use serde_json::Value;

/// One argument value, by wire type. The generated `method_from_arguments` calls the accessor of
/// the type `build.rs` resolved; a different variant here means the two disagree about the spec.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgumentValue {
    Bit(bool),
    Octet(u8),
    Short(u16),
    Long(u32),
    LongLong(u64),
    ShortStr(ShortStr),
    LongStr(LongStr),
    Table(FieldTable),
}

macro_rules! accessor {
    ($name:ident, $variant:ident, $type:ty) => {
        /// The value, or a test failure when the generated code expects another wire type.
        pub fn $name(self) -> $type {
            match self {
                ArgumentValue::$variant(value) => value,
                other => panic!("build.rs expects {} here, the spec gives {other:?}", stringify!($variant)),
            }
        }
    };
}

impl ArgumentValue {
    accessor!(bit, Bit, bool);
    accessor!(octet, Octet, u8);
    accessor!(short, Short, u16);
    accessor!(long, Long, u32);
    accessor!(long_long, LongLong, u64);
    accessor!(short_str, ShortStr, ShortStr);
    accessor!(long_str, LongStr, LongStr);
    accessor!(table, Table, FieldTable);
}

include!(concat!(env!("OUT_DIR"), "/method_arguments.rs"));

/// An argument's wire type, as the JSON names it after resolving its domain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WireType {
    Bit,
    Octet,
    Short,
    Long,
    LongLong,
    ShortStr,
    LongStr,
    Table,
}

/// One argument (or basic property) of the specification.
#[derive(Debug, Clone)]
pub struct SpecArgument {
    pub name: String,
    pub wire: WireType,
}

/// One method of the specification.
#[derive(Debug, Clone)]
pub struct SpecMethod {
    /// `class.method`, as [`Method::name`] gives it.
    pub name: String,
    pub class_id: u16,
    pub method_id: u16,
    pub content: bool,
    pub arguments: Vec<SpecArgument>,
}

/// The parts of the specification the tests check the codec against.
pub struct Spec {
    pub methods: Vec<SpecMethod>,
    /// The basic class's properties, in flag order (the first is bit 15).
    pub basic_properties: Vec<SpecArgument>,
}

fn wire_type(name: &str) -> WireType {
    match name {
        "bit" => WireType::Bit,
        "octet" => WireType::Octet,
        "short" => WireType::Short,
        "long" => WireType::Long,
        "longlong" | "timestamp" => WireType::LongLong,
        "shortstr" => WireType::ShortStr,
        "longstr" => WireType::LongStr,
        "table" => WireType::Table,
        other => panic!("the spec names an unknown wire type {other}"),
    }
}

/// Reads `spec/amqp-rabbitmq-0.9.1.json`.
pub fn spec() -> Spec {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/spec/amqp-rabbitmq-0.9.1.json");
    let text = std::fs::read_to_string(path).expect("the spec is part of the crate");
    let json: Value = serde_json::from_str(&text).expect("the spec is JSON");
    let domains: std::collections::HashMap<String, String> = json["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .map(|pair| (pair[0].as_str().expect("domain").to_string(), pair[1].as_str().expect("type").to_string()))
        .collect();
    let argument = |argument: &Value| {
        let wire = match argument.get("type").and_then(Value::as_str) {
            Some(wire) => wire.to_string(),
            None => domains[argument["domain"].as_str().expect("domain")].clone(),
        };
        SpecArgument { name: argument["name"].as_str().expect("name").to_string(), wire: wire_type(&wire) }
    };
    let mut methods = Vec::new();
    let mut basic_properties = Vec::new();
    for class in json["classes"].as_array().expect("classes") {
        let class_name = class["name"].as_str().expect("class name");
        if class_name == "basic" {
            basic_properties = class["properties"].as_array().expect("basic properties").iter().map(argument).collect();
        }
        for method in class["methods"].as_array().expect("methods") {
            methods.push(SpecMethod {
                name: format!("{class_name}.{}", method["name"].as_str().expect("method name")),
                class_id: class["id"].as_u64().expect("class id") as u16,
                method_id: method["id"].as_u64().expect("method id") as u16,
                content: method.get("content").and_then(Value::as_bool).unwrap_or(false),
                arguments: method["arguments"].as_array().expect("arguments").iter().map(argument).collect(),
            });
        }
    }
    Spec { methods, basic_properties }
}

// ---- strategies ----

/// Any value of an integer type, with its extremes and zero drawn often (a uniform draw almost
/// never hits them).
macro_rules! integer_strategy {
    ($name:ident, $type:ty) => {
        pub fn $name() -> impl Strategy<Value = $type> {
            prop_oneof![1 => Just(<$type>::MIN), 1 => Just(<$type>::MAX), 1 => Just(0 as $type), 4 => any::<$type>()]
        }
    };
}
integer_strategy!(any_u8, u8);
integer_strategy!(any_i8, i8);
integer_strategy!(any_u16, u16);
integer_strategy!(any_i16, i16);
integer_strategy!(any_u32, u32);
integer_strategy!(any_i32, i32);
integer_strategy!(any_u64, u64);
integer_strategy!(any_i64, i64);

/// Bytes of any value, empty and `length_max` long drawn often. The content comes from a seed
/// rather than a strategy per byte: a byte at a time is slow in a debug build, and the codec does
/// not care what the bytes are, only how many.
fn bytes_up_to(length_max: usize) -> impl Strategy<Value = Bytes> {
    let length = prop_oneof![1 => Just(0), 1 => Just(length_max), 4 => 0..=length_max];
    (length, any::<u64>()).prop_map(|(length, seed)| {
        let mut state = seed | 1;
        let bytes: Vec<u8> = (0..length)
            .map(|_| {
                // xorshift64: cheap, and every byte value occurs.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 56) as u8
            })
            .collect();
        Bytes::from(bytes)
    })
}

/// A short string of any bytes, empty and 255 long included.
pub fn short_str() -> impl Strategy<Value = ShortStr> {
    bytes_up_to(255).prop_map(ShortStr::from_bytes)
}

/// A long string of any bytes (longer than 255, so a one-octet length would be caught).
pub fn long_str() -> impl Strategy<Value = LongStr> {
    bytes_up_to(300).prop_map(LongStr)
}

/// Floats of every class but NaN (which never equals itself, so value comparisons skip it).
pub fn any_f32() -> impl Strategy<Value = f32> {
    let special = [0.0, -0.0, f32::MAX, f32::MIN, f32::MIN_POSITIVE, f32::INFINITY, f32::NEG_INFINITY, f32::from_bits(1)];
    prop_oneof![proptest::sample::select(special.to_vec()), any::<u32>().prop_map(f32::from_bits).prop_filter("not NaN", |v| !v.is_nan())]
}

/// See [`any_f32`].
pub fn any_f64() -> impl Strategy<Value = f64> {
    let special = [0.0, -0.0, f64::MAX, f64::MIN, f64::MIN_POSITIVE, f64::INFINITY, f64::NEG_INFINITY, f64::from_bits(1)];
    prop_oneof![proptest::sample::select(special.to_vec()), any::<u64>().prop_map(f64::from_bits).prop_filter("not NaN", |v| !v.is_nan())]
}

/// A field value of every type RabbitMQ defines, arrays and tables nested up to four deep.
pub fn field_value() -> impl Strategy<Value = FieldValue> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(FieldValue::Bool),
        any_i8().prop_map(FieldValue::I8),
        any_u8().prop_map(FieldValue::U8),
        any_i16().prop_map(FieldValue::I16),
        any_u16().prop_map(FieldValue::U16),
        any_i32().prop_map(FieldValue::I32),
        any_u32().prop_map(FieldValue::U32),
        any_i64().prop_map(FieldValue::I64),
        any_f32().prop_map(FieldValue::F32),
        any_f64().prop_map(FieldValue::F64),
        (any_u8(), any_u32()).prop_map(|(scale, value)| FieldValue::Decimal(Decimal { scale, value })),
        bytes_up_to(300).prop_map(FieldValue::LongStr),
        bytes_up_to(300).prop_map(FieldValue::Bytes),
        any_u64().prop_map(FieldValue::Timestamp),
        Just(FieldValue::Void),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(FieldValue::Array),
            proptest::collection::vec((short_str(), inner), 0..6).prop_map(|entries| FieldValue::Table(FieldTable(entries))),
        ]
    })
}

/// A field table of any values (keys may repeat: a table keeps what the client sent).
pub fn field_table() -> impl Strategy<Value = FieldTable> {
    proptest::collection::vec((short_str(), field_value()), 0..6).prop_map(FieldTable)
}

/// Any value of `wire`.
pub fn argument_value(wire: WireType) -> BoxedStrategy<ArgumentValue> {
    match wire {
        WireType::Bit => any::<bool>().prop_map(ArgumentValue::Bit).boxed(),
        WireType::Octet => any_u8().prop_map(ArgumentValue::Octet).boxed(),
        WireType::Short => any_u16().prop_map(ArgumentValue::Short).boxed(),
        WireType::Long => any_u32().prop_map(ArgumentValue::Long).boxed(),
        WireType::LongLong => any_u64().prop_map(ArgumentValue::LongLong).boxed(),
        WireType::ShortStr => short_str().prop_map(ArgumentValue::ShortStr).boxed(),
        WireType::LongStr => long_str().prop_map(ArgumentValue::LongStr).boxed(),
        WireType::Table => field_table().prop_map(ArgumentValue::Table).boxed(),
    }
}

/// Values for every argument of `method`, in spec order.
pub fn method_arguments(method: &SpecMethod) -> Vec<BoxedStrategy<ArgumentValue>> {
    method.arguments.iter().map(|argument| argument_value(argument.wire)).collect()
}

/// Each basic property present or absent, with any value when present.
pub fn basic_property_values(spec: &Spec) -> Vec<BoxedStrategy<Option<ArgumentValue>>> {
    spec.basic_properties.iter().map(|property| proptest::option::of(argument_value(property.wire)).boxed()).collect()
}

/// Builds the method `spec_method` names from `values` (in spec order) through the generated code.
pub fn build_method(spec_method: &SpecMethod, values: &[ArgumentValue]) -> Method {
    let mut by_name: std::collections::HashMap<&str, ArgumentValue> =
        spec_method.arguments.iter().map(|argument| argument.name.as_str()).zip(values.iter().cloned()).collect();
    let mut value_of = |name: &str| by_name.remove(name).unwrap_or_else(|| panic!("{}: no spec argument {name}", spec_method.name));
    let method = method_from_arguments(spec_method.class_id, spec_method.method_id, &mut value_of)
        .unwrap_or_else(|| panic!("no generated method for {}", spec_method.name));
    assert!(by_name.is_empty(), "{}: spec arguments the struct lacks: {:?}", spec_method.name, by_name.keys());
    method
}

/// The properties struct from values in spec order: the one mapping from spec names to the
/// hand-written [`BasicProperties`] fields. A property the spec gains fails here.
pub fn basic_properties(spec: &Spec, values: &[Option<ArgumentValue>]) -> BasicProperties {
    let mut properties = BasicProperties::default();
    for (property, value) in spec.basic_properties.iter().zip(values.iter().cloned()) {
        let Some(value) = value else { continue };
        match property.name.as_str() {
            "content-type" => properties.content_type = Some(value.short_str()),
            "content-encoding" => properties.content_encoding = Some(value.short_str()),
            "headers" => properties.headers = Some(value.table()),
            "delivery-mode" => properties.delivery_mode = Some(value.octet()),
            "priority" => properties.priority = Some(value.octet()),
            "correlation-id" => properties.correlation_id = Some(value.short_str()),
            "reply-to" => properties.reply_to = Some(value.short_str()),
            "expiration" => properties.expiration = Some(value.short_str()),
            "message-id" => properties.message_id = Some(value.short_str()),
            "timestamp" => properties.timestamp = Some(value.long_long()),
            "type" => properties.message_type = Some(value.short_str()),
            "user-id" => properties.user_id = Some(value.short_str()),
            "app-id" => properties.app_id = Some(value.short_str()),
            "cluster-id" => properties.cluster_id = Some(value.short_str()),
            other => panic!("BasicProperties has no field for the spec's property {other}"),
        }
    }
    properties
}

// ---- the test's own encoder, written from the specification ----

/// Appends one value of `wire`. Bits are packed by [`encode_arguments`], not here.
fn encode_value(out: &mut Vec<u8>, value: &ArgumentValue) {
    match value {
        ArgumentValue::Bit(_) => unreachable!("bits are packed by encode_arguments"),
        ArgumentValue::Octet(v) => out.push(*v),
        ArgumentValue::Short(v) => out.extend_from_slice(&v.to_be_bytes()),
        ArgumentValue::Long(v) => out.extend_from_slice(&v.to_be_bytes()),
        ArgumentValue::LongLong(v) => out.extend_from_slice(&v.to_be_bytes()),
        ArgumentValue::ShortStr(v) => encode_short_str(out, v.as_bytes()),
        ArgumentValue::LongStr(v) => encode_long_str(out, v.as_bytes()),
        ArgumentValue::Table(v) => encode_table(out, v),
    }
}

/// Arguments in order. Consecutive bits share an octet, the first in the least significant bit,
/// up to eight an octet; any other type ends the run (AMQP 0-9-1, section 4.2.5.2).
pub fn encode_arguments(values: &[ArgumentValue]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut bit_position: Option<(usize, u8)> = None;
    for value in values {
        if let ArgumentValue::Bit(bit) = value {
            let (octet_at, bit_index) = match bit_position {
                Some((octet_at, bit_index)) if bit_index < 8 => (octet_at, bit_index),
                _ => {
                    out.push(0);
                    (out.len() - 1, 0)
                }
            };
            if *bit {
                out[octet_at] |= 1 << bit_index;
            }
            bit_position = Some((octet_at, bit_index + 1));
        } else {
            bit_position = None;
            encode_value(&mut out, value);
        }
    }
    out
}

/// A method frame's payload: class id, method id, arguments.
pub fn encode_method_payload(method: &SpecMethod, values: &[ArgumentValue]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&method.class_id.to_be_bytes());
    out.extend_from_slice(&method.method_id.to_be_bytes());
    out.extend_from_slice(&encode_arguments(values));
    out
}

/// The property flags and property bytes: flag bit 15 for the first property, down to bit 2.
pub fn encode_properties(values: &[Option<ArgumentValue>]) -> (u16, Vec<u8>) {
    let mut flags = 0u16;
    let mut out = Vec::new();
    for (index, value) in values.iter().enumerate() {
        if let Some(value) = value {
            flags |= 1 << (15 - index);
            encode_value(&mut out, value);
        }
    }
    (flags, out)
}

/// A content header frame's payload (class 60, weight 0).
pub fn encode_header_payload(body_size: u64, values: &[Option<ArgumentValue>]) -> Vec<u8> {
    let (flags, properties) = encode_properties(values);
    let mut out = Vec::new();
    out.extend_from_slice(&60u16.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&body_size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&properties);
    out
}

/// A whole frame: type, channel, size, payload, 0xCE.
pub fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(0xce);
    out
}

fn encode_short_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(u8::try_from(bytes.len()).expect("a shortstr is at most 255 bytes"));
    out.extend_from_slice(bytes);
}

fn encode_long_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn with_length_prefix(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let length_at = out.len();
    out.extend_from_slice(&[0; 4]);
    body(out);
    let length = (out.len() - length_at - 4) as u32;
    out[length_at..length_at + 4].copy_from_slice(&length.to_be_bytes());
}

/// A field table with its length prefix, with RabbitMQ's type tags (rabbit_binary_generator).
pub fn encode_table(out: &mut Vec<u8>, table: &FieldTable) {
    with_length_prefix(out, |out| {
        for (name, value) in table.iter() {
            encode_short_str(out, name.as_bytes());
            encode_field_value(out, value);
        }
    });
}

fn encode_field_value(out: &mut Vec<u8>, value: &FieldValue) {
    match value {
        FieldValue::Bool(v) => out.extend_from_slice(&[b't', u8::from(*v)]),
        FieldValue::I8(v) => out.extend_from_slice(&[b'b', v.to_be_bytes()[0]]),
        FieldValue::U8(v) => out.extend_from_slice(&[b'B', *v]),
        FieldValue::I16(v) => tagged(out, b's', &v.to_be_bytes()),
        FieldValue::U16(v) => tagged(out, b'u', &v.to_be_bytes()),
        FieldValue::I32(v) => tagged(out, b'I', &v.to_be_bytes()),
        FieldValue::U32(v) => tagged(out, b'i', &v.to_be_bytes()),
        FieldValue::I64(v) => tagged(out, b'l', &v.to_be_bytes()),
        FieldValue::F32(v) => tagged(out, b'f', &v.to_bits().to_be_bytes()),
        FieldValue::F64(v) => tagged(out, b'd', &v.to_bits().to_be_bytes()),
        FieldValue::Decimal(v) => {
            out.extend_from_slice(&[b'D', v.scale]);
            out.extend_from_slice(&v.value.to_be_bytes());
        }
        FieldValue::LongStr(v) => {
            out.push(b'S');
            encode_long_str(out, v);
        }
        FieldValue::Bytes(v) => {
            out.push(b'x');
            encode_long_str(out, v);
        }
        FieldValue::Array(values) => {
            out.push(b'A');
            with_length_prefix(out, |out| values.iter().for_each(|value| encode_field_value(out, value)));
        }
        FieldValue::Timestamp(v) => tagged(out, b'T', &v.to_be_bytes()),
        FieldValue::Table(table) => {
            out.push(b'F');
            encode_table(out, table);
        }
        FieldValue::Void => out.push(b'V'),
    }
}

fn tagged(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    out.extend_from_slice(bytes);
}

// ---- hostile inputs ----

/// How a valid encoding is spoiled.
#[derive(Debug, Clone)]
pub enum Damage {
    /// Cut at this position (a strict prefix).
    Truncate(proptest::sample::Index),
    /// One byte replaced by another value.
    Replace(proptest::sample::Index, u8),
    /// Bytes added after the end.
    Append(Vec<u8>),
}

/// Any damage.
pub fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<proptest::sample::Index>().prop_map(Damage::Truncate),
        (any::<proptest::sample::Index>(), any::<u8>()).prop_map(|(at, byte)| Damage::Replace(at, byte)),
        proptest::collection::vec(any::<u8>(), 1..16).prop_map(Damage::Append),
    ]
}

/// Applies `damage` to bytes after the first `keep` (which stay intact), or returns `None` when
/// there is nothing to damage there or the replacement equals the byte it replaces.
pub fn apply_damage(bytes: &[u8], keep: usize, damage: &Damage) -> Option<Vec<u8>> {
    let mut out = bytes.to_vec();
    match damage {
        Damage::Truncate(at) => {
            if bytes.len() <= keep {
                return None;
            }
            out.truncate(keep + at.index(bytes.len() - keep));
        }
        Damage::Replace(at, byte) => {
            if bytes.len() <= keep {
                return None;
            }
            let position = keep + at.index(bytes.len() - keep);
            if out[position] == *byte {
                return None;
            }
            out[position] = *byte;
        }
        Damage::Append(extra) => out.extend_from_slice(extra),
    }
    Some(out)
}

/// Hex digits (whitespace ignored) to bytes.
pub fn from_hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|byte| !byte.is_ascii_whitespace()).collect();
    let pairs = digits.chunks_exact(2);
    assert!(pairs.remainder().is_empty(), "odd number of hex digits");
    pairs.map(|pair| u8::from_str_radix(std::str::from_utf8(pair).expect("ASCII"), 16).expect("hex digits")).collect()
}
