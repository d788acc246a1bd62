//! Protocol errors as RabbitMQ reports them: a reply code, a reply text that starts with the
//! code's name, and the method that failed. Soft errors close the channel, hard errors the connection.

use amqp_codec::constants;

/// Whether an error closes the channel or the whole connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorScope {
    /// channel.close; the connection goes on.
    Channel,
    /// connection.close.
    Connection,
}

/// An AMQP error to send to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text}")]
pub struct AmqpError {
    /// The reply code (404, 406, 504, ...).
    pub code: u16,
    /// The reply text, `CODE_NAME - details`, as RabbitMQ writes it.
    pub text: String,
    /// The class id of the method that failed (0 when none).
    pub class_id: u16,
    /// The method id of the method that failed (0 when none).
    pub method_id: u16,
}

/// The name RabbitMQ prefixes a reply text with.
pub fn code_name(code: u16) -> &'static str {
    match code {
        constants::CONTENT_TOO_LARGE => "CONTENT_TOO_LARGE",
        constants::NO_ROUTE => "NO_ROUTE",
        constants::NO_CONSUMERS => "NO_CONSUMERS",
        constants::CONNECTION_FORCED => "CONNECTION_FORCED",
        constants::INVALID_PATH => "INVALID_PATH",
        constants::ACCESS_REFUSED => "ACCESS_REFUSED",
        constants::NOT_FOUND => "NOT_FOUND",
        constants::RESOURCE_LOCKED => "RESOURCE_LOCKED",
        constants::PRECONDITION_FAILED => "PRECONDITION_FAILED",
        constants::FRAME_ERROR => "FRAME_ERROR",
        constants::SYNTAX_ERROR => "SYNTAX_ERROR",
        constants::COMMAND_INVALID => "COMMAND_INVALID",
        constants::CHANNEL_ERROR => "CHANNEL_ERROR",
        constants::UNEXPECTED_FRAME => "UNEXPECTED_FRAME",
        constants::RESOURCE_ERROR => "RESOURCE_ERROR",
        constants::NOT_ALLOWED => "NOT_ALLOWED",
        constants::NOT_IMPLEMENTED => "NOT_IMPLEMENTED",
        constants::INTERNAL_ERROR => "INTERNAL_ERROR",
        _ => "UNKNOWN_ERROR",
    }
}

impl AmqpError {
    /// An error with `code` and a detail text; the code's name is prefixed as RabbitMQ does.
    pub fn new(code: u16, detail: impl AsRef<str>) -> AmqpError {
        AmqpError { code, text: format!("{} - {}", code_name(code), detail.as_ref()), class_id: 0, method_id: 0 }
    }

    /// Names the method that failed (RabbitMQ reports it in channel.close and connection.close).
    pub fn during(mut self, class_id: u16, method_id: u16) -> AmqpError {
        self.class_id = class_id;
        self.method_id = method_id;
        self
    }

    /// Soft errors (3xx and 403-406) close the channel; hard errors close the connection.
    pub fn scope(&self) -> ErrorScope {
        match self.code {
            constants::CONTENT_TOO_LARGE
            | constants::NO_ROUTE
            | constants::NO_CONSUMERS
            | constants::ACCESS_REFUSED
            | constants::NOT_FOUND
            | constants::RESOURCE_LOCKED
            | constants::PRECONDITION_FAILED => ErrorScope::Channel,
            _ => ErrorScope::Connection,
        }
    }

    /// 404 for a missing exchange.
    pub fn no_exchange(name: &str, vhost: &str) -> AmqpError {
        AmqpError::new(constants::NOT_FOUND, format!("no exchange '{name}' in vhost '{vhost}'"))
    }

    /// 404 for a missing queue.
    pub fn no_queue(name: &str, vhost: &str) -> AmqpError {
        AmqpError::new(constants::NOT_FOUND, format!("no queue '{name}' in vhost '{vhost}'"))
    }

    /// 406.
    pub fn precondition(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::PRECONDITION_FAILED, detail)
    }

    /// 403.
    pub fn access_refused(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::ACCESS_REFUSED, detail)
    }

    /// 405.
    pub fn resource_locked(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::RESOURCE_LOCKED, detail)
    }

    /// 503.
    pub fn command_invalid(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::COMMAND_INVALID, detail)
    }

    /// 504.
    pub fn channel_error(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::CHANNEL_ERROR, detail)
    }

    /// 505.
    pub fn unexpected_frame(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::UNEXPECTED_FRAME, detail)
    }

    /// 540.
    pub fn not_implemented(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::NOT_IMPLEMENTED, detail)
    }

    /// 530.
    pub fn not_allowed(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::NOT_ALLOWED, detail)
    }

    /// 541.
    pub fn internal(detail: impl AsRef<str>) -> AmqpError {
        AmqpError::new(constants::INTERNAL_ERROR, detail)
    }
}
