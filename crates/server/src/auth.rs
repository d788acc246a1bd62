//! Users and SASL mechanisms (PLAIN and AMQPLAIN), with RabbitMQ's rule that `guest` may only log
//! in from a loopback address.

use amqp_codec::Reader;
use bytes::Bytes;
use std::net::IpAddr;

/// Why a login failed; logged, never sent to the client in detail (as RabbitMQ does).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoginError {
    /// The mechanism is not PLAIN or AMQPLAIN.
    #[error("unsupported mechanism {0}")]
    UnsupportedMechanism(String),
    /// The response did not parse.
    #[error("malformed {0} response")]
    Malformed(&'static str),
    /// Unknown user or wrong password.
    #[error("invalid credentials for user '{0}'")]
    InvalidCredentials(String),
    /// `guest` from a non-loopback address.
    #[error("user '{0}' can only connect via localhost")]
    LoopbackOnly(String),
}

/// One user.
#[derive(Debug, Clone)]
pub struct User {
    /// Login name.
    pub name: String,
    password: String,
    /// Whether the user may only log in from loopback.
    pub loopback_only: bool,
}

/// The user database. Issue 5 brings salted hashes, tags and permissions; for now the embedded
/// default is RabbitMQ's: `guest`/`guest`, loopback only.
#[derive(Debug, Clone)]
pub struct Users {
    users: Vec<User>,
}

impl Default for Users {
    fn default() -> Users {
        Users { users: vec![User { name: "guest".to_string(), password: "guest".to_string(), loopback_only: true }] }
    }
}

impl Users {
    /// Checks a start-ok response; returns the user name.
    pub fn authenticate(&self, mechanism: &[u8], response: &Bytes, peer: IpAddr) -> Result<String, LoginError> {
        let (name, password) = match mechanism {
            b"PLAIN" => parse_plain(response)?,
            b"AMQPLAIN" => parse_amqplain(response)?,
            other => return Err(LoginError::UnsupportedMechanism(String::from_utf8_lossy(other).into_owned())),
        };
        self.check_password(&name, &password, peer)
    }

    /// Checks a user name and password from `peer` (AMQP login and the management API's HTTP
    /// basic auth share this); returns the user name.
    pub fn check_password(&self, name: &str, password: &str, peer: IpAddr) -> Result<String, LoginError> {
        let user = self.users.iter().find(|user| user.name == name && user.password == password);
        let name = name.to_string();
        match user {
            None => Err(LoginError::InvalidCredentials(name)),
            Some(user) if user.loopback_only && !peer.is_loopback() => Err(LoginError::LoopbackOnly(name)),
            Some(user) => Ok(user.name.clone()),
        }
    }
}

impl Users {
    /// Every user, in the order they were defined (management API listings and definitions).
    pub fn list(&self) -> &[User] {
        &self.users
    }
}

impl User {
    /// RabbitMQ's `rabbit_password_hashing_sha256` form of the password: base64 of a 4-byte salt
    /// followed by SHA-256(salt ++ password), so an exported definitions file imports into RabbitMQ.
    pub fn password_hash(&self) -> String {
        use base64::Engine;
        use sha2::Digest;
        let salt: [u8; 4] = rand::random();
        let mut hasher = sha2::Sha256::new();
        hasher.update(salt);
        hasher.update(self.password.as_bytes());
        let mut salted = salt.to_vec();
        salted.extend_from_slice(&hasher.finalize());
        base64::engine::general_purpose::STANDARD.encode(salted)
    }
}

/// PLAIN: `authzid NUL authcid NUL password`.
fn parse_plain(response: &Bytes) -> Result<(String, String), LoginError> {
    let parts: Vec<&[u8]> = response.split(|byte| *byte == 0).collect();
    if parts.len() != 3 {
        return Err(LoginError::Malformed("PLAIN"));
    }
    Ok((String::from_utf8_lossy(parts[1]).into_owned(), String::from_utf8_lossy(parts[2]).into_owned()))
}

/// AMQPLAIN: a field table without its length prefix, holding LOGIN and PASSWORD.
fn parse_amqplain(response: &Bytes) -> Result<(String, String), LoginError> {
    let table = Reader::new(response.clone()).read_table_entries(0).map_err(|_| LoginError::Malformed("AMQPLAIN"))?;
    let login = table.get("LOGIN").and_then(|value| value.as_text()).ok_or(LoginError::Malformed("AMQPLAIN"))?;
    let password = table.get("PASSWORD").and_then(|value| value.as_text()).ok_or(LoginError::Malformed("AMQPLAIN"))?;
    Ok((login, password))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_is_loopback_only() {
        let users = Users::default();
        let response = Bytes::from_static(b"\0guest\0guest");
        assert_eq!(users.authenticate(b"PLAIN", &response, IpAddr::from([127, 0, 0, 1])), Ok("guest".to_string()));
        assert_eq!(
            users.authenticate(b"PLAIN", &response, IpAddr::from([10, 0, 0, 1])),
            Err(LoginError::LoopbackOnly("guest".to_string()))
        );
        let wrong = Bytes::from_static(b"\0guest\0nope");
        assert!(matches!(users.authenticate(b"PLAIN", &wrong, IpAddr::from([127, 0, 0, 1])), Err(LoginError::InvalidCredentials(_))));
    }
}
