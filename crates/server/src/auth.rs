//! Users, their passwords and tags, their permissions in vhosts, and the SASL mechanisms (PLAIN and
//! AMQPLAIN), with RabbitMQ's rules: `guest` may only log in from a loopback address; passwords are
//! stored as RabbitMQ's salted SHA-256 (so definitions move between RabbitMQ and Lepus); a user's
//! configure, write and read regular expressions decide what it may do with each resource.

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
    /// Too many failed logins from this address; the password was not checked.
    #[error("too many failed logins from this address; refused without checking")]
    Throttled,
}

/// One user.
#[derive(Debug, Clone)]
pub struct User {
    /// Login name.
    pub name: String,
    /// RabbitMQ's `rabbit_password_hashing_sha256` form: base64(salt ++ SHA-256(salt ++ password)).
    password_hash: String,
    /// Tags (administrator, monitoring, management, ...).
    pub tags: Vec<String>,
    /// Whether the user may only log in from loopback (RabbitMQ's `loopback_users`: guest).
    pub loopback_only: bool,
}

/// The users RabbitMQ's `loopback_users` setting names by default.
const LOOPBACK_USERS: &[&str] = &["guest"];

/// Hashes a password the way RabbitMQ's `rabbit_password_hashing_sha256` does.
pub fn hash_password(password: &str) -> String {
    use base64::Engine;
    let salt: [u8; 4] = rand::random();
    base64::engine::general_purpose::STANDARD.encode(salted_digest(&salt, password))
}

fn salted_digest(salt: &[u8], password: &str) -> Vec<u8> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(salt);
    hasher.update(password.as_bytes());
    let mut salted = salt.to_vec();
    salted.extend_from_slice(&hasher.finalize());
    salted
}

impl User {
    /// A user with a password hash in RabbitMQ's sha256 form.
    pub fn new(name: &str, password_hash: String, tags: Vec<String>) -> User {
        User { name: name.to_string(), password_hash, tags, loopback_only: LOOPBACK_USERS.contains(&name) }
    }

    /// The stored password hash (RabbitMQ's sha256 form, for definitions exports).
    pub fn password_hash(&self) -> String {
        self.password_hash.clone()
    }

    /// Whether `password` is this user's.
    pub fn password_matches(&self, password: &str) -> bool {
        use base64::Engine;
        let Ok(stored) = base64::engine::general_purpose::STANDARD.decode(&self.password_hash) else { return false };
        if stored.len() != 4 + 32 {
            return false;
        }
        // Constant-time comparison: the digest is secret-dependent.
        let computed = salted_digest(&stored[..4], password);
        computed.iter().zip(stored.iter()).fold(0u8, |difference, (a, b)| difference | (a ^ b)) == 0
    }

    /// Whether the user carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|own| own == tag)
    }
}

/// The user database, changed at runtime by the management API and persisted by the broker.
#[derive(Debug)]
pub struct Users {
    users: parking_lot::RwLock<Vec<User>>,
}

impl Default for Users {
    /// RabbitMQ's embedded default: `guest`/`guest`, administrator, loopback only.
    fn default() -> Users {
        Users::from_users(vec![User::new("guest", hash_password("guest"), vec!["administrator".to_string()])])
    }
}

impl Users {
    /// A database holding exactly `users`.
    pub fn from_users(users: Vec<User>) -> Users {
        Users { users: parking_lot::RwLock::new(users) }
    }

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
        let users = self.users.read();
        let user = users.iter().find(|user| user.name == name && user.password_matches(password));
        let name = name.to_string();
        match user {
            None => Err(LoginError::InvalidCredentials(name)),
            Some(user) if user.loopback_only && !peer.is_loopback() => Err(LoginError::LoopbackOnly(name)),
            Some(user) => Ok(user.name.clone()),
        }
    }

    /// Every user, in the order they were defined (management API listings and definitions).
    pub fn list(&self) -> Vec<User> {
        self.users.read().clone()
    }

    /// A user by name.
    pub fn get(&self, name: &str) -> Option<User> {
        self.users.read().iter().find(|user| user.name == name).cloned()
    }

    /// Adds a user or replaces the one of the same name; returns whether it was new.
    pub fn put(&self, user: User) -> bool {
        let mut users = self.users.write();
        match users.iter_mut().find(|existing| existing.name == user.name) {
            Some(existing) => {
                *existing = user;
                false
            }
            None => {
                users.push(user);
                true
            }
        }
    }

    /// Removes a user; returns whether it existed.
    pub fn delete(&self, name: &str) -> bool {
        let mut users = self.users.write();
        let before = users.len();
        users.retain(|user| user.name != name);
        users.len() != before
    }
}

/// The three kinds of access RabbitMQ's permissions distinguish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Declare and delete.
    Configure,
    /// Publish to an exchange, bind a queue (as destination).
    Write,
    /// Consume, get, purge, bind from an exchange (as source).
    Read,
}

impl Access {
    fn name(self) -> &'static str {
        match self {
            Access::Configure => "configure",
            Access::Write => "write",
            Access::Read => "read",
        }
    }
}

/// A user's permissions in one vhost, as regular expressions (unanchored, as RabbitMQ matches
/// them; the empty string grants nothing).
#[derive(Debug, Clone)]
pub struct Permission {
    /// User name.
    pub user: String,
    /// Vhost name.
    pub vhost: String,
    /// The configure expression as given.
    pub configure: String,
    /// The write expression as given.
    pub write: String,
    /// The read expression as given.
    pub read: String,
    compiled: [Option<regex::Regex>; 3],
}

/// An expression that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("invalid regular expression '{0}': {1}")]
pub struct BadExpression(String, String);

impl Permission {
    /// Compiles the three expressions.
    pub fn new(user: &str, vhost: &str, configure: &str, write: &str, read: &str) -> Result<Permission, BadExpression> {
        let compile = |expression: &str| -> Result<Option<regex::Regex>, BadExpression> {
            if expression.is_empty() {
                return Ok(None);
            }
            regex::Regex::new(expression).map(Some).map_err(|error| BadExpression(expression.to_string(), error.to_string()))
        };
        Ok(Permission {
            user: user.to_string(),
            vhost: vhost.to_string(),
            configure: configure.to_string(),
            write: write.to_string(),
            read: read.to_string(),
            compiled: [compile(configure)?, compile(write)?, compile(read)?],
        })
    }

    /// Whether `access` to the resource `name` is granted. The default exchange is matched as
    /// `amq.default`, as RabbitMQ does.
    pub fn allows(&self, access: Access, name: &[u8]) -> bool {
        let name = if name.is_empty() { "amq.default".as_bytes() } else { name };
        let index = match access {
            Access::Configure => 0,
            Access::Write => 1,
            Access::Read => 2,
        };
        let Some(expression) = &self.compiled[index] else { return false };
        std::str::from_utf8(name).is_ok_and(|text| expression.is_match(text))
    }

    /// 403 unless `access` to the `kind` resource `name` is granted.
    pub fn check(&self, access: Access, kind: &str, name: &[u8]) -> Result<(), broker_core::AmqpError> {
        if self.allows(access, name) {
            return Ok(());
        }
        let shown = if name.is_empty() { "amq.default".to_string() } else { String::from_utf8_lossy(name).into_owned() };
        let _ = access.name();
        Err(broker_core::AmqpError::access_refused(format!(
            "access to {kind} '{shown}' in vhost '{}' refused for user '{}'",
            self.vhost, self.user
        )))
    }
}

/// Every user's permissions in every vhost.
#[derive(Debug)]
pub struct Permissions {
    entries: parking_lot::RwLock<Vec<std::sync::Arc<Permission>>>,
}

impl Permissions {
    /// A table holding exactly `entries`.
    pub fn from_entries(entries: Vec<Permission>) -> Permissions {
        Permissions { entries: parking_lot::RwLock::new(entries.into_iter().map(std::sync::Arc::new).collect()) }
    }

    /// RabbitMQ's default: guest may do everything in `/`.
    pub fn default_for_guest() -> Permissions {
        Permissions::from_entries(vec![Permission::new("guest", "/", ".*", ".*", ".*").expect("constant expressions compile")])
    }

    /// The permission of `user` in `vhost`, if any (none: the vhost is closed to the user).
    pub fn get(&self, user: &str, vhost: &str) -> Option<std::sync::Arc<Permission>> {
        self.entries.read().iter().find(|entry| entry.user == user && entry.vhost == vhost).cloned()
    }

    /// Every entry.
    pub fn list(&self) -> Vec<std::sync::Arc<Permission>> {
        self.entries.read().clone()
    }

    /// Sets (adds or replaces) a user's permission in a vhost.
    pub fn put(&self, permission: Permission) {
        let mut entries = self.entries.write();
        entries.retain(|entry| !(entry.user == permission.user && entry.vhost == permission.vhost));
        entries.push(std::sync::Arc::new(permission));
    }

    /// Removes a user's permission in a vhost; returns whether it existed.
    pub fn delete(&self, user: &str, vhost: &str) -> bool {
        let mut entries = self.entries.write();
        let before = entries.len();
        entries.retain(|entry| !(entry.user == user && entry.vhost == vhost));
        entries.len() != before
    }

    /// Removes every permission of a user (the user was deleted).
    pub fn delete_user(&self, user: &str) {
        self.entries.write().retain(|entry| entry.user != user);
    }

    /// Removes every permission in a vhost (the vhost was deleted).
    pub fn remove_vhost(&self, vhost: &str) {
        self.entries.write().retain(|entry| entry.vhost != vhost);
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
    fn passwords_are_salted_sha256_as_rabbitmq_stores_them() {
        let hash = hash_password("secret");
        let user = User::new("alice", hash.clone(), vec![]);
        assert!(user.password_matches("secret"));
        assert!(!user.password_matches("Secret"));
        assert_ne!(hash, hash_password("secret"), "a fresh salt each time");
        // RabbitMQ 3.10.8's own hash of "secret" with the salt 1,2,3,4, stored as base64(salt ++
        // digest): `rabbitmqctl eval 'rabbit_password:salted_hash(rabbit_password_hashing_sha256,
        // <<1,2,3,4>>, <<"secret">>).'` gave the digest.
        let from_rabbitmq = User::new("carol", "AQIDBDB9kM21iEUzN1lZ+6VReCsdNqS0sERdAQTcY6Xs3PMz".to_string(), vec![]);
        assert!(from_rabbitmq.password_matches("secret"));
        assert!(!from_rabbitmq.password_matches("guest"));
    }

    #[test]
    fn permissions_are_unanchored_regexes_and_empty_grants_nothing() {
        let permission = Permission::new("bob", "/", "^bob-.*", "", ".*").expect("compiles");
        assert!(permission.allows(Access::Configure, b"bob-queue"));
        assert!(!permission.allows(Access::Configure, b"alice-queue"));
        assert!(!permission.allows(Access::Write, b"anything"));
        assert!(permission.allows(Access::Read, b""));
        let error = permission.check(Access::Configure, "queue", b"q").expect_err("refused");
        assert_eq!(error.code, 403);
        assert_eq!(error.text, "ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user 'bob'");
        assert!(Permission::new("bob", "/", "(", ".*", ".*").is_err());
    }

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
