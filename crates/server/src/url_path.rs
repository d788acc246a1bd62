//! Percent-encoding of one URL path segment (a vhost or object name), as RabbitMQ's management
//! API paths need it: `lepus ctl` builds such paths, and the management API builds `location`s.

/// Percent-encodes every byte outside RFC 3986's unreserved set.
pub fn encode_segment(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}
