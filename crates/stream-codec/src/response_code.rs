//! Response codes, by the names PROTOCOL.adoc gives them.

/// A response code (uint16 on the wire). Codes RabbitMQ 3.10.8 does not define are kept as
/// [`ResponseCode::Other`], so decoding never fails on them and they encode back unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseCode {
    /// 0x01
    Ok,
    /// 0x02
    StreamDoesNotExist,
    /// 0x03
    SubscriptionIdAlreadyExists,
    /// 0x04
    SubscriptionIdDoesNotExist,
    /// 0x05
    StreamAlreadyExists,
    /// 0x06
    StreamNotAvailable,
    /// 0x07
    SaslMechanismNotSupported,
    /// 0x08
    AuthenticationFailure,
    /// 0x09
    SaslError,
    /// 0x0a
    SaslChallenge,
    /// 0x0b: the user may only connect from loopback (`guest` by default).
    SaslAuthenticationFailureLoopback,
    /// 0x0c
    VirtualHostAccessFailure,
    /// 0x0d
    UnknownFrame,
    /// 0x0e
    FrameTooLarge,
    /// 0x0f
    InternalError,
    /// 0x10
    AccessRefused,
    /// 0x11
    PreconditionFailed,
    /// 0x12
    PublisherDoesNotExist,
    /// 0x13
    NoOffset,
    /// Any other value.
    Other(u16),
}

/// Every named code with its value, in order (the one table both conversions read).
const NAMED: [(ResponseCode, u16); 19] = [
    (ResponseCode::Ok, 0x01),
    (ResponseCode::StreamDoesNotExist, 0x02),
    (ResponseCode::SubscriptionIdAlreadyExists, 0x03),
    (ResponseCode::SubscriptionIdDoesNotExist, 0x04),
    (ResponseCode::StreamAlreadyExists, 0x05),
    (ResponseCode::StreamNotAvailable, 0x06),
    (ResponseCode::SaslMechanismNotSupported, 0x07),
    (ResponseCode::AuthenticationFailure, 0x08),
    (ResponseCode::SaslError, 0x09),
    (ResponseCode::SaslChallenge, 0x0a),
    (ResponseCode::SaslAuthenticationFailureLoopback, 0x0b),
    (ResponseCode::VirtualHostAccessFailure, 0x0c),
    (ResponseCode::UnknownFrame, 0x0d),
    (ResponseCode::FrameTooLarge, 0x0e),
    (ResponseCode::InternalError, 0x0f),
    (ResponseCode::AccessRefused, 0x10),
    (ResponseCode::PreconditionFailed, 0x11),
    (ResponseCode::PublisherDoesNotExist, 0x12),
    (ResponseCode::NoOffset, 0x13),
];

impl ResponseCode {
    /// Every named code, for tests and tables.
    pub fn named() -> impl Iterator<Item = ResponseCode> {
        NAMED.iter().map(|(code, _)| *code)
    }

    /// The code for a wire value.
    pub fn from_u16(value: u16) -> ResponseCode {
        match value {
            1..=19 => NAMED[usize::from(value) - 1].0,
            other => ResponseCode::Other(other),
        }
    }

    /// The wire value.
    pub fn as_u16(self) -> u16 {
        match self {
            ResponseCode::Other(value) => value,
            named => NAMED.iter().find(|(code, _)| *code == named).map_or(0, |(_, value)| *value),
        }
    }

    /// The name PROTOCOL.adoc gives the code, for logs and error messages.
    pub fn name(self) -> &'static str {
        match self {
            ResponseCode::Ok => "OK",
            ResponseCode::StreamDoesNotExist => "stream does not exist",
            ResponseCode::SubscriptionIdAlreadyExists => "subscription ID already exists",
            ResponseCode::SubscriptionIdDoesNotExist => "subscription ID does not exist",
            ResponseCode::StreamAlreadyExists => "stream already exists",
            ResponseCode::StreamNotAvailable => "stream not available",
            ResponseCode::SaslMechanismNotSupported => "SASL mechanism not supported",
            ResponseCode::AuthenticationFailure => "authentication failure",
            ResponseCode::SaslError => "SASL error",
            ResponseCode::SaslChallenge => "SASL challenge",
            ResponseCode::SaslAuthenticationFailureLoopback => "SASL authentication failure loopback",
            ResponseCode::VirtualHostAccessFailure => "virtual host access failure",
            ResponseCode::UnknownFrame => "unknown frame",
            ResponseCode::FrameTooLarge => "frame too large",
            ResponseCode::InternalError => "internal error",
            ResponseCode::AccessRefused => "access refused",
            ResponseCode::PreconditionFailed => "precondition failed",
            ResponseCode::PublisherDoesNotExist => "publisher does not exist",
            ResponseCode::NoOffset => "no offset",
            ResponseCode::Other(_) => "unknown response code",
        }
    }
}

impl From<u16> for ResponseCode {
    fn from(value: u16) -> ResponseCode {
        ResponseCode::from_u16(value)
    }
}

impl From<ResponseCode> for u16 {
    fn from(code: ResponseCode) -> u16 {
        code.as_u16()
    }
}

impl std::fmt::Display for ResponseCode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{} ({:#04x})", self.name(), self.as_u16())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_maps_back_to_itself() {
        for value in 0..=u16::MAX {
            assert_eq!(ResponseCode::from_u16(value).as_u16(), value);
        }
    }

    #[test]
    fn named_codes_are_the_protocols_values() {
        assert_eq!(ResponseCode::from_u16(0x01), ResponseCode::Ok);
        assert_eq!(ResponseCode::from_u16(0x0d), ResponseCode::UnknownFrame);
        assert_eq!(ResponseCode::from_u16(0x13), ResponseCode::NoOffset);
        assert_eq!(ResponseCode::from_u16(0x14), ResponseCode::Other(0x14));
        assert_eq!(ResponseCode::from_u16(0), ResponseCode::Other(0));
        assert_eq!(ResponseCode::named().count(), 19);
    }
}
