//! The `x-delayed-message` exchange of RabbitMQ's rabbitmq-delayed-message-exchange plugin: it
//! routes as the type its `x-delayed-type` argument names, except that a message whose `x-delay`
//! header asks for a delay routes nowhere now (so a mandatory publish is returned and the
//! alternate exchange takes it, as with the plugin) and is routed from the exchange once the
//! delay has passed, with `x-delay` turned negative so it is not delayed again.
//!
//! The plugin's rules (`rabbit_delayed_message_utils:get_delay/1`, `rabbit_exchange_type_delayed_message`):
//! a delay is an integer header of any width, or a string or float converted to one; it delays
//! when above 0 and at most 2^32 - 1 ms (Erlang's longest timer); anything else routes at once.

use super::ExchangeKind;
use amqp_codec::{FieldTable, FieldValue};

/// The declaration argument naming the type a delayed exchange routes as.
pub const DELAYED_TYPE_ARGUMENT: &str = "x-delayed-type";

/// The header holding a message's delay in milliseconds.
pub const DELAY_HEADER: &str = "x-delay";

/// The longest delay (Erlang's longest timer, the plugin's bound); a longer one routes at once.
pub const DELAY_MS_MAX: u64 = 4_294_967_295;

/// The type a delayed exchange declared with `arguments` routes as; the reason, with RabbitMQ's
/// text, when the argument is missing, not a string, or names a delayed exchange itself. An
/// unknown type name is `Err(None)`: the caller answers as for any unknown exchange type.
pub fn delayed_type(arguments: &FieldTable) -> Result<ExchangeKind, Option<String>> {
    let Some(name) = arguments.get(DELAYED_TYPE_ARGUMENT).and_then(FieldValue::as_text) else {
        return Err(Some("Invalid argument, 'x-delayed-type' must be an existing exchange type".to_string()));
    };
    match ExchangeKind::parse(name.as_bytes()) {
        Some(ExchangeKind::Delayed) => Err(Some("Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'".to_string())),
        Some(kind) => Ok(kind),
        None => Err(None),
    }
}

/// The delay a message's headers ask for, when it delays (see the module's comment).
pub fn message_delay_ms(headers: Option<&FieldTable>) -> Option<u64> {
    let delay = match headers?.get(DELAY_HEADER)? {
        FieldValue::LongStr(text) => std::str::from_utf8(text).ok()?.trim().parse::<i64>().ok()?,
        FieldValue::F32(value) => f64::from(*value).trunc() as i64,
        FieldValue::F64(value) => value.trunc() as i64,
        FieldValue::Decimal(decimal) => i64::from(decimal.value) / 10i64.checked_pow(u32::from(decimal.scale)).unwrap_or(i64::MAX),
        value => value.as_i64()?,
    };
    u64::try_from(delay).ok().filter(|delay| *delay > 0 && *delay <= DELAY_MS_MAX)
}

/// The `x-delay` header a delayed message is routed with once its delay passed: the delay,
/// negated, as a signed 32-bit integer (the plugin's `swap_delay_header`; a 64-bit one past
/// that range).
pub fn routed_delay_header(delay_ms: u64) -> FieldValue {
    let negated = -(delay_ms.min(DELAY_MS_MAX) as i64);
    match i32::try_from(negated) {
        Ok(value) => FieldValue::I32(value),
        Err(_) => FieldValue::I64(negated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amqp_codec::Decimal;
    use bytes::Bytes;

    fn headers(value: FieldValue) -> FieldTable {
        let mut table = FieldTable::default();
        table.insert(DELAY_HEADER, value);
        table
    }

    #[test]
    fn a_positive_delay_of_any_numeric_type_or_a_numeric_string_delays() {
        for (value, expected) in [
            (FieldValue::I32(5000), Some(5000)),
            (FieldValue::U8(7), Some(7)),
            (FieldValue::I64(1), Some(1)),
            (FieldValue::U32(u32::MAX), Some(DELAY_MS_MAX)),
            (FieldValue::LongStr(Bytes::from("250")), Some(250)),
            (FieldValue::F64(99.9), Some(99)),
            (FieldValue::Decimal(Decimal { scale: 1, value: 1005 }), Some(100)),
            (FieldValue::I32(0), None),
            (FieldValue::I32(-5000), None),
            (FieldValue::I64(DELAY_MS_MAX as i64 + 1), None),
            (FieldValue::LongStr(Bytes::from("soon")), None),
            (FieldValue::Bool(true), None),
            (FieldValue::Timestamp(5), None),
        ] {
            assert_eq!(message_delay_ms(Some(&headers(value.clone()))), expected, "{value:?}");
        }
        assert_eq!(message_delay_ms(None), None);
        assert_eq!(message_delay_ms(Some(&FieldTable::default())), None);
    }

    #[test]
    fn the_routed_header_is_the_negated_delay() {
        assert_eq!(routed_delay_header(5000), FieldValue::I32(-5000));
        assert_eq!(routed_delay_header(DELAY_MS_MAX), FieldValue::I64(-(DELAY_MS_MAX as i64)));
        assert_eq!(message_delay_ms(Some(&headers(routed_delay_header(5000)))), None, "not delayed again");
    }

    #[test]
    fn the_delayed_type_must_be_an_existing_non_delayed_type() {
        let arguments = |value: FieldValue| {
            let mut table = FieldTable::default();
            table.insert(DELAYED_TYPE_ARGUMENT, value);
            table
        };
        assert_eq!(delayed_type(&arguments(FieldValue::LongStr(Bytes::from("topic")))), Ok(ExchangeKind::Topic));
        assert_eq!(delayed_type(&arguments(FieldValue::LongStr(Bytes::from("nonesuch")))), Err(None));
        let missing = delayed_type(&FieldTable::default()).unwrap_err().expect("a reason");
        assert_eq!(missing, "Invalid argument, 'x-delayed-type' must be an existing exchange type");
        assert_eq!(delayed_type(&arguments(FieldValue::I32(1))).unwrap_err().as_deref(), Some(missing.as_str()));
        let recursive = delayed_type(&arguments(FieldValue::LongStr(Bytes::from("x-delayed-message")))).unwrap_err();
        assert_eq!(recursive.as_deref(), Some("Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"));
    }
}
