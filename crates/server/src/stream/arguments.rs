//! The arguments of stream queues and their consumers, read as RabbitMQ 3.10.8 reads them:
//! `x-max-age` and the interval form of `x-stream-offset` (`rabbit_amqqueue:check_max_age`),
//! `x-stream-offset` (`rabbit_stream_queue:parse_offset_arg`), `x-stream-max-segment-size-bytes`.
//! Where RabbitMQ 3.10.8 crashes on a value (a channel process exit, answered with connection
//! error 541 and the bare text `INTERNAL_ERROR`, measured), Lepus answers the same, so a client
//! sees the same outcome from both.

use amqp_codec::{FieldTable, FieldValue, ShortStr};
use broker_core::AmqpError;
use storage::stream::OffsetSpec;

/// The largest `x-stream-max-segment-size-bytes` RabbitMQ 3.10.8 takes (measured: one more is
/// refused with "Exceeded max value for x-stream-max-segment-size-bytes").
pub const SEGMENT_SIZE_BYTES_MAX: u64 = 3_000_000_000;

/// What RabbitMQ's `check_max_age` makes of a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxAge {
    /// A duration, in milliseconds.
    Milliseconds(u64),
    /// Not a duration: `{error, invalid_max_age}`.
    Invalid,
    /// No leading digits: RabbitMQ's `list_to_integer("")` fails (541 INTERNAL_ERROR).
    Crash,
}

/// Parses `<digits><unit>`, the unit one of `Y` (365 days), `M` (30 days), `D`, `h`, `m`, `s`,
/// the number positive.
pub fn parse_max_age(text: &[u8]) -> MaxAge {
    let digits = text.iter().take_while(|byte| byte.is_ascii_digit()).count();
    if digits == 0 {
        return MaxAge::Crash;
    }
    let value = std::str::from_utf8(&text[..digits]).ok().and_then(|digits| digits.parse::<u64>().ok()).unwrap_or(u64::MAX);
    if value == 0 {
        return MaxAge::Invalid;
    }
    let unit_ms: u64 = match &text[digits..] {
        b"Y" => 365 * 86_400_000,
        b"M" => 30 * 86_400_000,
        b"D" => 86_400_000,
        b"h" => 3_600_000,
        b"m" => 60_000,
        b"s" => 1_000,
        _ => return MaxAge::Invalid,
    };
    MaxAge::Milliseconds(value.saturating_mul(unit_ms))
}

/// Connection error 541 with the bare text RabbitMQ 3.10.8 answers when a channel crashes.
pub fn internal_error() -> AmqpError {
    AmqpError { code: amqp_codec::constants::INTERNAL_ERROR, text: "INTERNAL_ERROR".to_string(), class_id: 0, method_id: 0 }
}

/// RabbitMQ's `~p` of an argument value, for the text of an invalid `x-stream-offset`.
fn erlang_term(value: &FieldValue) -> String {
    match value {
        FieldValue::LongStr(text) => format!("{{longstr,<<\"{}\">>}}", String::from_utf8_lossy(text)),
        FieldValue::Bytes(bytes) => format!("{{binary,<<\"{}\">>}}", String::from_utf8_lossy(bytes)),
        other => format!("{other:?}"),
    }
}

/// Where a consumer of a stream starts, by its `x-stream-offset` argument (none: `next`).
/// Checked on every basic.consume, whatever the queue's type, as RabbitMQ checks its consume
/// arguments. `now_ms` turns an interval such as `1h` into a timestamp.
pub fn consume_offset(arguments: &FieldTable, queue: &ShortStr, vhost: &str, now_ms: i64) -> Result<OffsetSpec, AmqpError> {
    let Some(value) = arguments.get("x-stream-offset") else { return Ok(OffsetSpec::Next) };
    let keyword = match value {
        FieldValue::LongStr(text) | FieldValue::Bytes(text) => Some(&text[..]),
        _ => None,
    };
    match keyword {
        Some(b"first") => return Ok(OffsetSpec::First),
        Some(b"last") => return Ok(OffsetSpec::Last),
        Some(b"next") => return Ok(OffsetSpec::Next),
        _ => {}
    }
    match value {
        FieldValue::Timestamp(seconds) => Ok(OffsetSpec::Timestamp((*seconds as i64).saturating_mul(1000))),
        FieldValue::LongStr(text) => match parse_max_age(text) {
            MaxAge::Milliseconds(age) => Ok(OffsetSpec::Timestamp(now_ms.saturating_sub(age.min(i64::MAX as u64) as i64))),
            MaxAge::Invalid => Err(AmqpError::precondition(format!(
                "invalid arg 'x-stream-offset' for queue '{queue}' in vhost '{vhost}': {{invalid_stream_offset_arg,{}}}",
                erlang_term(value)
            ))),
            MaxAge::Crash => Err(internal_error()),
        },
        // osiris reads a negative offset as the first one.
        _ => match value.as_i64() {
            Some(offset) => Ok(OffsetSpec::Offset(offset.max(0) as u64)),
            // osiris has no offset spec of these types: RabbitMQ's channel crashes.
            None => Err(internal_error()),
        },
    }
}

/// `x-stream-offset` on a queue that is not a stream: refused with the name of the queue's type
/// (RabbitMQ's module), whatever its value (measured on a classic queue).
pub fn refuse_offset_off_streams(
    arguments: &FieldTable,
    queue: &ShortStr,
    vhost: &str,
    queue_type: broker_core::vhost::QueueType,
) -> Result<(), AmqpError> {
    if arguments.get("x-stream-offset").is_none() {
        return Ok(());
    }
    let module = match queue_type {
        broker_core::vhost::QueueType::Classic => "rabbit_classic_queue",
        broker_core::vhost::QueueType::Quorum => "rabbit_quorum_queue",
        broker_core::vhost::QueueType::Stream => return Ok(()),
    };
    Err(AmqpError::precondition(format!("invalid arg 'x-stream-offset' for queue '{queue}' in vhost '{vhost}' of queue type {module}")))
}

/// `x-max-age` of a stream declaration, checked as RabbitMQ checks it: a string, else
/// `{unacceptable_type,TYPE}`; a string that does not parse, `invalid_max_age` (or 541).
pub fn check_max_age_argument(value: &FieldValue, queue: &ShortStr, vhost: &str) -> Result<Option<u64>, AmqpError> {
    let FieldValue::LongStr(text) = value else {
        return Err(invalid_argument("x-max-age", queue, vhost, &format!("{{unacceptable_type,{}}}", type_name(value))));
    };
    match parse_max_age(text) {
        MaxAge::Milliseconds(age) => Ok(Some(age)),
        MaxAge::Invalid => Err(invalid_argument("x-max-age", queue, vhost, "invalid_max_age")),
        MaxAge::Crash => Err(internal_error()),
    }
}

/// `x-stream-max-segment-size-bytes`: a non-negative integer at most [`SEGMENT_SIZE_BYTES_MAX`].
pub fn check_segment_size_argument(value: &FieldValue, queue: &ShortStr, vhost: &str) -> Result<(), AmqpError> {
    let key = "x-stream-max-segment-size-bytes";
    match value.as_i64() {
        None => Err(invalid_argument(key, queue, vhost, &format!("\"expected integer, got {}\"", type_name(value)))),
        Some(size) if size < 0 => Err(invalid_argument(key, queue, vhost, &format!("{{value_negative,{size}}}"))),
        Some(_) => Ok(()),
    }
}

/// The bound RabbitMQ checks after the queue's properties.
pub fn check_segment_size_bound(arguments: &FieldTable) -> Result<(), AmqpError> {
    match arguments.get("x-stream-max-segment-size-bytes").and_then(FieldValue::as_i64) {
        Some(size) if size as u64 > SEGMENT_SIZE_BYTES_MAX => {
            Err(AmqpError::precondition("Exceeded max value for x-stream-max-segment-size-bytes"))
        }
        _ => Ok(()),
    }
}

/// `x-initial-cluster-size`: a positive integer (RabbitMQ's `check_initial_cluster_size_arg`).
pub fn check_initial_cluster_size_argument(value: &FieldValue, queue: &ShortStr, vhost: &str) -> Result<(), AmqpError> {
    let key = "x-initial-cluster-size";
    match value.as_i64() {
        None => Err(invalid_argument(key, queue, vhost, &format!("\"expected integer, got {}\"", type_name(value)))),
        Some(size) if size < 0 => Err(invalid_argument(key, queue, vhost, &format!("{{value_negative,{size}}}"))),
        Some(0) => Err(invalid_argument(key, queue, vhost, "{value_zero,0}")),
        Some(_) => Ok(()),
    }
}

/// `x-queue-leader-locator`: a string (a single node has one place to put a leader).
pub fn check_leader_locator_argument(value: &FieldValue, queue: &ShortStr, vhost: &str) -> Result<(), AmqpError> {
    match value {
        FieldValue::LongStr(_) => Ok(()),
        other => Err(invalid_argument("x-queue-leader-locator", queue, vhost, &format!("{{unacceptable_type,{}}}", type_name(other)))),
    }
}

fn invalid_argument(key: &str, queue: &ShortStr, vhost: &str, detail: &str) -> AmqpError {
    AmqpError::precondition(format!("invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {detail}"))
}

/// RabbitMQ's name of a field value's type.
fn type_name(value: &FieldValue) -> &'static str {
    match value {
        FieldValue::Bool(_) => "bool",
        FieldValue::I8(_) => "byte",
        FieldValue::U8(_) => "unsignedbyte",
        FieldValue::I16(_) => "short",
        FieldValue::U16(_) => "unsignedshort",
        FieldValue::I32(_) => "signedint",
        FieldValue::U32(_) => "unsignedint",
        FieldValue::I64(_) => "long",
        FieldValue::F32(_) => "float",
        FieldValue::F64(_) => "double",
        FieldValue::Decimal(_) => "decimal",
        FieldValue::LongStr(_) => "longstr",
        FieldValue::Bytes(_) => "binary",
        FieldValue::Array(_) => "array",
        FieldValue::Timestamp(_) => "timestamp",
        FieldValue::Table(_) => "table",
        FieldValue::Void => "void",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn offset(value: FieldValue) -> Result<OffsetSpec, (u16, String)> {
        let mut arguments = FieldTable::new();
        arguments.insert("x-stream-offset", value);
        consume_offset(&arguments, &ShortStr::from("s"), "/", 10_000_000).map_err(|error| (error.code, error.text))
    }

    fn text(value: &'static str) -> FieldValue {
        FieldValue::LongStr(Bytes::from_static(value.as_bytes()))
    }

    #[test]
    fn max_age_reads_as_rabbitmq_reads_it() {
        assert_eq!(parse_max_age(b"1h"), MaxAge::Milliseconds(3_600_000));
        assert_eq!(parse_max_age(b"7D"), MaxAge::Milliseconds(7 * 86_400_000));
        assert_eq!(parse_max_age(b"1Y"), MaxAge::Milliseconds(365 * 86_400_000));
        assert_eq!(parse_max_age(b"2M"), MaxAge::Milliseconds(60 * 86_400_000));
        assert_eq!(parse_max_age(b"0s"), MaxAge::Invalid);
        assert_eq!(parse_max_age(b"10"), MaxAge::Invalid);
        assert_eq!(parse_max_age(b"5x"), MaxAge::Invalid);
        assert_eq!(parse_max_age(b"1hh"), MaxAge::Invalid);
        assert_eq!(parse_max_age(b"h"), MaxAge::Crash);
        assert_eq!(parse_max_age(b"bad"), MaxAge::Crash);
    }

    #[test]
    fn every_offset_form_of_rabbitmq_3_10_8() {
        assert_eq!(offset(text("first")), Ok(OffsetSpec::First));
        assert_eq!(offset(text("last")), Ok(OffsetSpec::Last));
        assert_eq!(offset(text("next")), Ok(OffsetSpec::Next));
        assert_eq!(offset(FieldValue::I64(5)), Ok(OffsetSpec::Offset(5)));
        assert_eq!(offset(FieldValue::I32(-1)), Ok(OffsetSpec::Offset(0)));
        assert_eq!(offset(FieldValue::Timestamp(1_000)), Ok(OffsetSpec::Timestamp(1_000_000)));
        assert_eq!(offset(text("10s")), Ok(OffsetSpec::Timestamp(10_000_000 - 10_000)));
        assert_eq!(
            offset(text("5x")),
            Err((406, "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue 's' in vhost '/': {invalid_stream_offset_arg,{longstr,<<\"5x\">>}}".to_string()))
        );
        assert_eq!(offset(text("bogus")), Err((541, "INTERNAL_ERROR".to_string())));
        assert_eq!(offset(FieldValue::Bool(true)), Err((541, "INTERNAL_ERROR".to_string())));
        assert_eq!(consume_offset(&FieldTable::new(), &ShortStr::from("s"), "/", 0), Ok(OffsetSpec::Next));
    }
}
