//! Headers-exchange matching, as RabbitMQ does it: `x-match` = `all` (default), `any`,
//! `all-with-x` or `any-with-x`; binding arguments starting with `x-` are ignored unless the mode
//! ends in `-with-x`; a binding value of type void matches the header's presence alone.

use amqp_codec::{FieldTable, FieldValue};

/// Whether a message with `headers` matches a binding with `arguments`.
pub fn headers_match(arguments: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let mode = arguments.get("x-match").and_then(FieldValue::as_text).unwrap_or_else(|| "all".to_string());
    let (any, with_x) = match mode.as_str() {
        "any" => (true, false),
        "all-with-x" => (false, true),
        "any-with-x" => (true, true),
        _ => (false, false),
    };
    let empty = FieldTable::new();
    let headers = headers.unwrap_or(&empty);
    let mut considered = 0usize;
    let mut matched = 0usize;
    for (name, expected) in arguments.iter() {
        if name.as_bytes() == b"x-match" || (name.as_bytes().starts_with(b"x-") && !with_x) {
            continue;
        }
        considered += 1;
        let found = headers.get(&name.to_string_lossy());
        let is_match = match (expected, found) {
            (FieldValue::Void, Some(_)) => true,
            (expected, Some(actual)) => values_equal(expected, actual),
            (_, None) => false,
        };
        if is_match {
            matched += 1;
            if any {
                return true;
            }
        } else if !any {
            return false;
        }
    }
    if any {
        // RabbitMQ: `any` with nothing to compare matches nothing.
        false
    } else {
        matched == considered
    }
}

/// RabbitMQ compares header values by type and value; integers of different widths that hold the
/// same number are equal (Erlang compares them as numbers).
fn values_equal(left: &FieldValue, right: &FieldValue) -> bool {
    match (left.as_i64(), right.as_i64()) {
        (Some(a), Some(b)) => a == b,
        _ => left == right,
    }
}

#[cfg(test)]
mod tests {
    use super::headers_match;
    use amqp_codec::{FieldTable, FieldValue};
    use bytes::Bytes;

    fn text(value: &str) -> FieldValue {
        FieldValue::LongStr(Bytes::copy_from_slice(value.as_bytes()))
    }

    fn table(entries: &[(&str, FieldValue)]) -> FieldTable {
        let mut table = FieldTable::new();
        for (name, value) in entries {
            table.insert(name, value.clone());
        }
        table
    }

    #[test]
    fn all_requires_every_header() {
        let binding = table(&[("x-match", text("all")), ("a", text("1")), ("b", text("2"))]);
        assert!(headers_match(&binding, Some(&table(&[("a", text("1")), ("b", text("2")), ("c", text("3"))]))));
        assert!(!headers_match(&binding, Some(&table(&[("a", text("1"))]))));
        assert!(!headers_match(&binding, None));
    }

    #[test]
    fn any_requires_one_header() {
        let binding = table(&[("x-match", text("any")), ("a", text("1")), ("b", text("2"))]);
        assert!(headers_match(&binding, Some(&table(&[("b", text("2"))]))));
        assert!(!headers_match(&binding, Some(&table(&[("b", text("3"))]))));
    }

    #[test]
    fn x_arguments_count_only_with_x_modes() {
        let plain = table(&[("x-match", text("all")), ("x-tag", text("t"))]);
        assert!(headers_match(&plain, Some(&FieldTable::new())));
        let with_x = table(&[("x-match", text("all-with-x")), ("x-tag", text("t"))]);
        assert!(!headers_match(&with_x, Some(&FieldTable::new())));
        assert!(headers_match(&with_x, Some(&table(&[("x-tag", text("t"))]))));
        let any_with_x = table(&[("x-match", text("any-with-x")), ("x-tag", text("t")), ("a", text("1"))]);
        assert!(headers_match(&any_with_x, Some(&table(&[("x-tag", text("t"))]))));
    }

    #[test]
    fn integers_compare_by_value_and_void_by_presence() {
        let binding = table(&[("n", FieldValue::I32(5)), ("present", FieldValue::Void)]);
        assert!(headers_match(&binding, Some(&table(&[("n", FieldValue::I64(5)), ("present", text("anything"))]))));
        assert!(!headers_match(&binding, Some(&table(&[("n", FieldValue::I64(5))]))));
    }
}
