//! Generates the AMQP 0-9-1 method tables from `spec/amqp-rabbitmq-0.9.1.json`, the machine-readable
//! specification with RabbitMQ's extensions. Generating instead of hand-writing keeps every class id,
//! method id, argument order and bit-packing rule exactly as the specification states them.
//!
//! Output: `$OUT_DIR/methods.rs`, included by `src/methods.rs`. It holds one struct per method, the
//! `Method` enum over them, and `decode`/`encode`/`class_id`/`method_id`/`name`/`has_content`.
//!
//! Also `$OUT_DIR/method_arguments.rs`, which only the tests include: it builds any method from
//! argument values looked up by their specification name and lists a method's arguments back, so
//! the property tests can drive every method from the specification without naming one.

use serde_json::Value;
use std::fmt::Write as _;
use std::path::PathBuf;

const SPEC_PATH: &str = "spec/amqp-rabbitmq-0.9.1.json";

fn main() {
    println!("cargo:rerun-if-changed={SPEC_PATH}");
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string(SPEC_PATH).expect("the AMQP spec JSON is part of the crate");
    let spec: Value = serde_json::from_str(&text).expect("the AMQP spec is valid JSON");
    let code = generate(&spec);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out_dir.join("methods.rs"), code).expect("OUT_DIR is writable");
    let test_support = generate_test_support(&parse_methods(&spec));
    std::fs::write(out_dir.join("method_arguments.rs"), test_support).expect("OUT_DIR is writable");
}

/// The wire type of one argument, after resolving its domain.
#[derive(Clone, Copy, PartialEq)]
enum WireType {
    Bit,
    Octet,
    Short,
    Long,
    LongLong,
    ShortStr,
    LongStr,
    Table,
}

impl WireType {
    fn parse(name: &str) -> WireType {
        match name {
            "bit" => WireType::Bit,
            "octet" => WireType::Octet,
            "short" => WireType::Short,
            "long" => WireType::Long,
            "longlong" | "timestamp" => WireType::LongLong,
            "shortstr" => WireType::ShortStr,
            "longstr" => WireType::LongStr,
            "table" => WireType::Table,
            other => panic!("unknown AMQP wire type {other}"),
        }
    }

    /// The name of the test-side `ArgumentValue` accessor (and variant) for this wire type.
    fn test_accessor(self) -> &'static str {
        match self {
            WireType::Bit => "bit",
            WireType::Octet => "octet",
            WireType::Short => "short",
            WireType::Long => "long",
            WireType::LongLong => "long_long",
            WireType::ShortStr => "short_str",
            WireType::LongStr => "long_str",
            WireType::Table => "table",
        }
    }

    fn test_variant(self) -> &'static str {
        match self {
            WireType::Bit => "Bit",
            WireType::Octet => "Octet",
            WireType::Short => "Short",
            WireType::Long => "Long",
            WireType::LongLong => "LongLong",
            WireType::ShortStr => "ShortStr",
            WireType::LongStr => "LongStr",
            WireType::Table => "Table",
        }
    }

    fn rust_type(self) -> &'static str {
        match self {
            WireType::Bit => "bool",
            WireType::Octet => "u8",
            WireType::Short => "u16",
            WireType::Long => "u32",
            WireType::LongLong => "u64",
            WireType::ShortStr => "ShortStr",
            WireType::LongStr => "LongStr",
            WireType::Table => "FieldTable",
        }
    }
}

struct Argument {
    /// The name in the specification, such as `no-ack`.
    spec_name: String,
    field: String,
    wire: WireType,
}

struct MethodSpec {
    class_name: String,
    method_name: String,
    class_id: u64,
    method_id: u64,
    type_name: String,
    content: bool,
    synchronous: bool,
    arguments: Vec<Argument>,
}

fn camel(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn field_name(name: &str) -> String {
    // `type` is a Rust keyword; the only argument so named is the exchange type.
    match name {
        "type" => "exchange_type".to_string(),
        other => other.replace('-', "_"),
    }
}

fn constant_name(name: &str) -> String {
    name.replace('-', "_").to_ascii_uppercase()
}

fn parse_methods(spec: &Value) -> Vec<MethodSpec> {
    let mut domains = std::collections::HashMap::new();
    for domain in spec["domains"].as_array().expect("domains") {
        let pair = domain.as_array().expect("domain pair");
        domains.insert(pair[0].as_str().expect("domain name").to_string(), pair[1].as_str().expect("domain type").to_string());
    }
    let mut methods = Vec::new();
    for class in spec["classes"].as_array().expect("classes") {
        let class_name = class["name"].as_str().expect("class name");
        let class_id = class["id"].as_u64().expect("class id");
        for method in class["methods"].as_array().expect("methods") {
            let method_name = method["name"].as_str().expect("method name");
            let arguments = method["arguments"]
                .as_array()
                .expect("arguments")
                .iter()
                .map(|argument| {
                    let wire = match argument.get("type").and_then(Value::as_str) {
                        Some(wire) => wire.to_string(),
                        None => domains[argument["domain"].as_str().expect("domain")].clone(),
                    };
                    let spec_name = argument["name"].as_str().expect("argument name").to_string();
                    Argument { field: field_name(&spec_name), spec_name, wire: WireType::parse(&wire) }
                })
                .collect();
            methods.push(MethodSpec {
                class_name: class_name.to_string(),
                method_name: method_name.to_string(),
                class_id,
                method_id: method["id"].as_u64().expect("method id"),
                type_name: camel(class_name) + &camel(method_name),
                content: method.get("content").and_then(Value::as_bool).unwrap_or(false),
                synchronous: method.get("synchronous").and_then(Value::as_bool).unwrap_or(false),
                arguments,
            });
        }
    }
    methods
}

fn generate(spec: &Value) -> String {
    let methods = parse_methods(spec);
    let mut out = String::new();
    out.push_str("// Generated by build.rs from spec/amqp-rabbitmq-0.9.1.json. Do not edit.\n\n");
    generate_constants(spec, &mut out);
    for method in &methods {
        generate_struct(method, &mut out);
    }
    generate_enum(&methods, &mut out);
    out
}

fn generate_constants(spec: &Value, out: &mut String) {
    out.push_str("/// Frame types, sizes and reply codes named by the specification.\npub mod constants {\n");
    for constant in spec["constants"].as_array().expect("constants") {
        let name = constant_name(constant["name"].as_str().expect("constant name"));
        let value = constant["value"].as_u64().expect("constant value");
        let rust_type = match name.as_str() {
            "FRAME_METHOD" | "FRAME_HEADER" | "FRAME_BODY" | "FRAME_HEARTBEAT" | "FRAME_END" => "u8",
            "FRAME_MIN_SIZE" => "u32",
            _ => "u16",
        };
        let _ = writeln!(out, "    /// `{}` from the specification.", constant["name"].as_str().unwrap_or_default());
        let _ = writeln!(out, "    pub const {name}: {rust_type} = {value};");
    }
    out.push_str("}\n\n/// Class ids.\npub mod class_id {\n");
    for class in spec["classes"].as_array().expect("classes") {
        let name = constant_name(class["name"].as_str().expect("class name"));
        let _ = writeln!(out, "    /// The `{}` class.", class["name"].as_str().unwrap_or_default());
        let _ = writeln!(out, "    pub const {name}: u16 = {};", class["id"]);
    }
    out.push_str("}\n\n");
}

fn generate_struct(method: &MethodSpec, out: &mut String) {
    let _ = writeln!(out, "/// `{}.{}` (class {}, method {}).", method.class_name, method.method_name, method.class_id, method.method_id);
    out.push_str("#[derive(Debug, Clone, PartialEq, Default)]\n");
    let _ = writeln!(out, "pub struct {} {{", method.type_name);
    for argument in &method.arguments {
        let _ = writeln!(out, "    /// The `{}` argument.", argument.field);
        let _ = writeln!(out, "    pub {}: {},", argument.field, argument.wire.rust_type());
    }
    out.push_str("}\n\n");
    let _ = writeln!(out, "impl {} {{", method.type_name);
    // Decoding: consecutive bits share octets, least significant bit first.
    out.push_str("    #[allow(unused_variables)]\n");
    out.push_str("    fn decode_arguments(reader: &mut Reader) -> Result<Self, DecodeError> {\n");
    let mut bit_index = 0;
    for argument in &method.arguments {
        if argument.wire == WireType::Bit {
            if bit_index % 8 == 0 {
                let _ = writeln!(out, "        let bits_{} = reader.read_u8()?;", bit_index / 8);
            }
            let _ = writeln!(out, "        let {} = bits_{} & (1 << {}) != 0;", argument.field, bit_index / 8, bit_index % 8);
            bit_index += 1;
        } else {
            bit_index = 0;
            let read = match argument.wire {
                WireType::Octet => "read_u8()?",
                WireType::Short => "read_u16()?",
                WireType::Long => "read_u32()?",
                WireType::LongLong => "read_u64()?",
                WireType::ShortStr => "read_short_str()?",
                WireType::LongStr => "read_long_str()?",
                WireType::Table => "read_table()?",
                WireType::Bit => unreachable!(),
            };
            let _ = writeln!(out, "        let {} = reader.{read};", argument.field);
        }
        // A new bit group starts after any non-bit argument; reset is handled above.
        if argument.wire != WireType::Bit {
            bit_index = 0;
        }
    }
    let fields: Vec<&str> = method.arguments.iter().map(|a| a.field.as_str()).collect();
    let _ = writeln!(out, "        Ok(Self {{ {} }})", fields.join(", "));
    out.push_str("    }\n\n");
    out.push_str("    fn encode_arguments(&self, writer: &mut BytesMut) {\n");
    let mut index = 0;
    while index < method.arguments.len() {
        let argument = &method.arguments[index];
        if argument.wire == WireType::Bit {
            let mut bit = 0;
            out.push_str("        let mut bits: u8 = 0;\n");
            while index < method.arguments.len() && method.arguments[index].wire == WireType::Bit {
                if bit == 8 {
                    out.push_str("        writer.put_u8(bits);\n        bits = 0;\n");
                    bit = 0;
                }
                let _ = writeln!(out, "        if self.{} {{ bits |= 1 << {bit}; }}", method.arguments[index].field);
                bit += 1;
                index += 1;
            }
            out.push_str("        writer.put_u8(bits);\n");
            continue;
        }
        let write = match argument.wire {
            WireType::Octet => format!("writer.put_u8(self.{});", argument.field),
            WireType::Short => format!("writer.put_u16(self.{});", argument.field),
            WireType::Long => format!("writer.put_u32(self.{});", argument.field),
            WireType::LongLong => format!("writer.put_u64(self.{});", argument.field),
            WireType::ShortStr => format!("write_short_str(writer, &self.{});", argument.field),
            WireType::LongStr => format!("write_long_str(writer, &self.{});", argument.field),
            WireType::Table => format!("write_table(writer, &self.{});", argument.field),
            WireType::Bit => unreachable!(),
        };
        let _ = writeln!(out, "        {write}");
        index += 1;
    }
    if method.arguments.is_empty() {
        out.push_str("        let _ = writer;\n");
    }
    out.push_str("    }\n}\n\n");
}

fn generate_enum(methods: &[MethodSpec], out: &mut String) {
    out.push_str("/// Every AMQP 0-9-1 method, with its arguments.\n#[derive(Debug, Clone, PartialEq)]\npub enum Method {\n");
    for method in methods {
        let _ = writeln!(out, "    /// `{}.{}`.", method.class_name, method.method_name);
        let _ = writeln!(out, "    {0}({0}),", method.type_name);
    }
    out.push_str("}\n\nimpl Method {\n");
    out.push_str("    /// Decodes the arguments of the method named by `class_id` and `method_id`.\n");
    out.push_str("    pub fn decode(class_id: u16, method_id: u16, reader: &mut Reader) -> Result<Method, DecodeError> {\n        match (class_id, method_id) {\n");
    for method in methods {
        let _ = writeln!(
            out,
            "            ({0}, {1}) => Ok(Method::{2}({2}::decode_arguments(reader)?)),",
            method.class_id, method.method_id, method.type_name
        );
    }
    out.push_str("            _ => Err(DecodeError::UnknownMethod { class_id, method_id }),\n        }\n    }\n\n");
    let simple = |out: &mut String, doc: &str, signature: &str, value: &dyn Fn(&MethodSpec) -> String| {
        let _ = writeln!(out, "    /// {doc}\n    pub fn {signature} {{\n        match self {{");
        for method in methods {
            let _ = writeln!(out, "            Method::{}(_) => {},", method.type_name, value(method));
        }
        out.push_str("        }\n    }\n\n");
    };
    simple(out, "The class id on the wire.", "class_id(&self) -> u16", &|m| m.class_id.to_string());
    simple(out, "The method id on the wire.", "method_id(&self) -> u16", &|m| m.method_id.to_string());
    simple(out, "The name RabbitMQ uses in reply texts, such as `basic.publish`.", "name(&self) -> &'static str", &|m| {
        format!("\"{}.{}\"", m.class_name, m.method_name)
    });
    simple(out, "Whether a content header and body frames follow this method.", "has_content(&self) -> bool", &|m| m.content.to_string());
    simple(out, "Whether the specification marks the method as expecting a reply.", "is_synchronous(&self) -> bool", &|m| {
        m.synchronous.to_string()
    });
    out.push_str("    /// Encodes class id, method id and arguments (the method frame's payload).\n");
    out.push_str("    pub fn encode(&self, writer: &mut BytesMut) {\n        writer.put_u16(self.class_id());\n        writer.put_u16(self.method_id());\n        match self {\n");
    for method in methods {
        let _ = writeln!(out, "            Method::{}(arguments) => arguments.encode_arguments(writer),", method.type_name);
    }
    out.push_str("        }\n    }\n}\n\n");
    out.push_str("/// One instance of every method, with default arguments (for round-trip tests).\npub fn every_method() -> Vec<Method> {\n    vec![\n");
    for method in methods {
        let _ = writeln!(out, "        Method::{0}({0}::default()),", method.type_name);
    }
    out.push_str("    ]\n}\n\n");
    for method in methods {
        let _ = writeln!(
            out,
            "impl From<{0}> for Method {{\n    fn from(arguments: {0}) -> Method {{\n        Method::{0}(arguments)\n    }}\n}}\n",
            method.type_name
        );
    }
}

/// The test-only helpers (see the module comment). The including test defines `ArgumentValue`, with
/// one variant per wire type and a same-named accessor that fails the test on another variant.
fn generate_test_support(methods: &[MethodSpec]) -> String {
    let mut out = String::new();
    out.push_str("// Generated by build.rs from spec/amqp-rabbitmq-0.9.1.json for the tests. Do not edit.\n\n");
    out.push_str("/// Builds method `class_id`/`method_id`, taking each argument from `value_of(its spec name)`.\n");
    out.push_str("pub fn method_from_arguments(class_id: u16, method_id: u16, value_of: &mut dyn FnMut(&str) -> ArgumentValue) -> Option<Method> {\n");
    out.push_str("    match (class_id, method_id) {\n");
    for method in methods {
        let _ = writeln!(
            out,
            "        ({}, {}) => Some(Method::{}({} {{",
            method.class_id, method.method_id, method.type_name, method.type_name
        );
        for argument in &method.arguments {
            let _ =
                writeln!(out, "            {}: value_of(\"{}\").{}(),", argument.field, argument.spec_name, argument.wire.test_accessor());
        }
        out.push_str("        })),\n");
    }
    out.push_str("        _ => None,\n    }\n}\n\n");
    out.push_str("/// The arguments of `method` under their spec names, in the order the struct declares them.\n");
    out.push_str("pub fn arguments_of(method: &Method) -> Vec<(&'static str, ArgumentValue)> {\n    match method {\n");
    for method in methods {
        let binding = if method.arguments.is_empty() { "_" } else { "arguments" };
        let _ = writeln!(out, "        Method::{}({binding}) => vec![", method.type_name);
        for argument in &method.arguments {
            // Numbers and bits are Copy; strings and tables are cloned (a reference count each).
            let cloned = matches!(argument.wire, WireType::ShortStr | WireType::LongStr | WireType::Table);
            let clone = if cloned { ".clone()" } else { "" };
            let _ = writeln!(
                out,
                "            (\"{}\", ArgumentValue::{}(arguments.{}{clone})),",
                argument.spec_name,
                argument.wire.test_variant(),
                argument.field
            );
        }
        let _ = writeln!(out, "        ],");
    }
    out.push_str("    }\n}\n");
    out
}
