//! `amqp://user:password@host:port/vhost?heartbeat=N` URLs, as RabbitMQ's clients read them.

use crate::ClientError;

/// A parsed AMQP URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpUrl {
    /// Host name or address.
    pub host: String,
    /// TCP port (5672 when absent).
    pub port: u16,
    /// User name (guest when absent).
    pub user: String,
    /// Password (guest when absent).
    pub password: String,
    /// Virtual host (`/` when the path is empty).
    pub vhost: String,
    /// Heartbeat interval to ask for, in seconds (0 disables; from `?heartbeat=`).
    pub heartbeat_s: u16,
}

impl AmqpUrl {
    /// Parses `amqp://[user[:password]@]host[:port][/vhost][?heartbeat=N]`.
    pub fn parse(text: &str) -> Result<AmqpUrl, ClientError> {
        let bad = |reason: &str| ClientError::BadUrl { url: text.to_string(), reason: reason.to_string() };
        let rest = match text.split_once("://") {
            Some(("amqp", rest)) => rest,
            Some(("amqps", _)) => return Err(bad("amqps (TLS) is not supported by lepus perf")),
            Some((scheme, _)) => return Err(bad(&format!("unknown scheme {scheme:?}"))),
            None => return Err(bad("missing amqp:// scheme")),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((authority, path)) => (authority, Some(path)),
            None => (rest, None),
        };
        let (credentials, host_port) = match authority.rsplit_once('@') {
            Some((credentials, host_port)) => (Some(credentials), host_port),
            None => (None, authority),
        };
        let (user, password) = match credentials {
            Some(credentials) => match credentials.split_once(':') {
                Some((user, password)) => (decode(user, text)?, decode(password, text)?),
                None => (decode(credentials, text)?, String::new()),
            },
            None => ("guest".to_string(), "guest".to_string()),
        };
        let (host, port) = split_host_port(host_port).ok_or_else(|| bad("bad host or port"))?;
        if host.is_empty() {
            return Err(bad("missing host"));
        }
        let vhost = match path {
            None | Some("") => "/".to_string(),
            Some(path) => decode(path, text)?,
        };
        let mut heartbeat_s = 0;
        for pair in query.unwrap_or("").split('&').filter(|pair| !pair.is_empty()) {
            // Other client options (connection_timeout, channel_max, ...) do not apply here.
            if let Some(("heartbeat", value)) = pair.split_once('=') {
                heartbeat_s = value.parse().map_err(|_| bad("heartbeat is not a number"))?;
            }
        }
        Ok(AmqpUrl { host, port, user, password, vhost, heartbeat_s })
    }

    /// `host:port`, for connecting and for messages.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

fn split_host_port(text: &str) -> Option<(String, u16)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, rest) = rest.split_once(']')?;
        let port = match rest.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if rest.is_empty() => 5672,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match text.rsplit_once(':') {
        Some((host, port)) => Some((host.to_string(), port.parse().ok()?)),
        None => Some((text.to_string(), 5672)),
    }
}

fn decode(part: &str, url: &str) -> Result<String, ClientError> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = part.get(index + 1..index + 3).unwrap_or("");
            let value = u8::from_str_radix(hex, 16)
                .map_err(|_| ClientError::BadUrl { url: url.to_string(), reason: format!("bad percent-escape in {part:?}") })?;
            out.push(value);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ClientError::BadUrl { url: url.to_string(), reason: "not UTF-8 after decoding".to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_url() {
        let url = AmqpUrl::parse("amqp://bob:s%40cret@127.0.0.1:5690/%2f?heartbeat=5").unwrap();
        assert_eq!(url.user, "bob");
        assert_eq!(url.password, "s@cret");
        assert_eq!(url.host, "127.0.0.1");
        assert_eq!(url.port, 5690);
        assert_eq!(url.vhost, "/");
        assert_eq!(url.heartbeat_s, 5);
    }

    #[test]
    fn defaults() {
        let url = AmqpUrl::parse("amqp://localhost").unwrap();
        assert_eq!((url.user.as_str(), url.port, url.vhost.as_str()), ("guest", 5672, "/"));
        let url = AmqpUrl::parse("amqp://[::1]:5673/prod").unwrap();
        assert_eq!((url.host.as_str(), url.port, url.vhost.as_str()), ("::1", 5673, "prod"));
        assert_eq!(url.address(), "[::1]:5673");
    }

    #[test]
    fn rejects_bad_urls() {
        for text in ["http://x", "localhost:5672", "amqp://host:notaport", "amqp://", "amqps://h"] {
            let error = AmqpUrl::parse(text).unwrap_err();
            assert!(matches!(error, ClientError::BadUrl { .. }), "{text}: {error}");
        }
    }
}
