//! RabbitMQ's topic permissions: per user, vhost and exchange, a write and a read regular
//! expression matched against routing keys. RabbitMQ 3.10.8 checks them only on exchanges of type
//! `topic` (rabbit_channel.erl, `check_topic_authorisation`): basic.publish against the write
//! expression with the message's routing key, and queue.bind/unbind and exchange.bind/unbind from
//! a topic exchange against the read expression with the binding key. A user without an entry for
//! the exchange may use every key.
//!
//! Before matching, RabbitMQ replaces `{username}` and `{vhost}` in the expression by the
//! connection's user and vhost (rabbit_auth_backend_internal.erl, `expand_topic_permission`; an
//! AMQP 0-9-1 client connection has no other variables). Those are the entry's own user and
//! vhost, so Lepus expands and compiles an entry once, when it is set, not per message.
//!
//! The publish path pays for them only when the user has entries: each connection keeps the
//! entries of its user and vhost ([`TopicAccess`]), refreshed when the table's version changes,
//! so a publish costs an atomic load and, for a user without entries, nothing more.

use broker_core::AmqpError;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use storage::definitions::TopicPermissionRecord;

/// The most topic permissions the broker holds: each is compiled into two regular expressions
/// and copied into the access lists of its user's connections, so the table has a bound.
pub const TOPIC_PERMISSIONS_MAX: usize = 10_000;

/// Which of a topic permission's two expressions applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicAccessKind {
    /// basic.publish: the routing key against the write expression.
    Write,
    /// Binding from the exchange: the binding key against the read expression.
    Read,
}

/// Why a topic permission cannot be set.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TopicPermissionError {
    /// An expression does not compile (RabbitMQ: `{invalid_regexp, Expression, Reason}`).
    #[error("invalid regular expression '{expression}': {reason}")]
    InvalidExpression {
        /// The expression as given.
        expression: String,
        /// What the regex compiler said.
        reason: String,
    },
    /// The table is full.
    #[error("more than {TOPIC_PERMISSIONS_MAX} topic permissions")]
    TooMany,
}

/// One user's topic permission on one exchange of one vhost.
#[derive(Debug, Clone)]
pub struct TopicPermission {
    /// User name.
    pub user: String,
    /// Vhost name.
    pub vhost: String,
    /// Exchange name.
    pub exchange: String,
    /// The write expression as given.
    pub write: String,
    /// The read expression as given.
    pub read: String,
    /// The write and read expressions with `{username}` and `{vhost}` expanded, compiled; `None`
    /// when the expansion does not compile (the user's name or the vhost's holds regex syntax),
    /// which refuses every key.
    compiled: [Option<regex::bytes::Regex>; 2],
}

impl TopicPermission {
    /// Checks and compiles both expressions.
    pub fn new(user: &str, vhost: &str, exchange: &str, write: &str, read: &str) -> Result<TopicPermission, TopicPermissionError> {
        // RabbitMQ validates the expressions as given, before expansion.
        for expression in [write, read] {
            compile(expression).map_err(|reason| TopicPermissionError::InvalidExpression { expression: expression.to_string(), reason })?;
        }
        let expanded = |expression: &str| compile(&expand(expression, user, vhost)).ok();
        Ok(TopicPermission {
            user: user.to_string(),
            vhost: vhost.to_string(),
            exchange: exchange.to_string(),
            write: write.to_string(),
            read: read.to_string(),
            compiled: [expanded(write), expanded(read)],
        })
    }

    /// The permission as stored.
    pub fn from_record(record: &TopicPermissionRecord) -> Result<TopicPermission, TopicPermissionError> {
        TopicPermission::new(&record.user, &record.vhost, &record.exchange, &record.write, &record.read)
    }

    /// The permission to store.
    pub fn to_record(&self) -> TopicPermissionRecord {
        TopicPermissionRecord {
            user: self.user.clone(),
            vhost: self.vhost.clone(),
            exchange: self.exchange.clone(),
            write: self.write.clone(),
            read: self.read.clone(),
        }
    }

    /// Whether `key` may be used for `kind` (unanchored, as Erlang's `re:run` matches).
    pub fn allows(&self, kind: TopicAccessKind, key: &[u8]) -> bool {
        let index = match kind {
            TopicAccessKind::Write => 0,
            TopicAccessKind::Read => 1,
        };
        self.compiled[index].as_ref().is_some_and(|expression| expression.is_match(key))
    }

    /// 403 unless `key` may be used for `kind`, with RabbitMQ 3.10.8's text.
    pub fn check(&self, kind: TopicAccessKind, key: &[u8]) -> Result<(), AmqpError> {
        if self.allows(kind, key) {
            return Ok(());
        }
        Err(AmqpError::access_refused(format!(
            "access to topic '{}' in exchange '{}' in vhost '{}' refused for user '{}'",
            String::from_utf8_lossy(key),
            self.exchange,
            self.vhost,
            self.user
        )))
    }
}

/// `{username}` then `{vhost}` replaced, each everywhere, in that order: RabbitMQ folds over its
/// variable map, whose keys come in sorted order.
pub fn expand(expression: &str, user: &str, vhost: &str) -> String {
    expression.replace("{username}", user).replace("{vhost}", vhost)
}

/// Compiles an expression as RabbitMQ matches it: the empty expression is `^$` (it grants only
/// the empty key), and braces that do not make a `{n}`, `{n,}` or `{n,m}` repetition are
/// literal, as in PCRE (the `regex` crate refuses them).
fn compile(expression: &str) -> Result<regex::bytes::Regex, String> {
    let pattern = if expression.is_empty() { "^$".to_string() } else { pcre_braces(expression) };
    regex::bytes::Regex::new(&pattern).map_err(|error| error.to_string())
}

/// The expression with every brace that is not part of a repetition escaped. Escaped
/// characters and bracketed classes are copied as they are.
fn pcre_braces(expression: &str) -> String {
    let characters: Vec<char> = expression.chars().collect();
    let mut pattern = String::with_capacity(expression.len() + 8);
    let mut index = 0;
    let mut in_class = false;
    while index < characters.len() {
        let character = characters[index];
        match character {
            '\\' => {
                pattern.push(character);
                if let Some(escaped) = characters.get(index + 1) {
                    pattern.push(*escaped);
                    index += 1;
                }
            }
            '[' if !in_class => {
                in_class = true;
                pattern.push(character);
                // A `]` first in a class (after an optional `^`) is a member, not its end.
                if characters.get(index + 1) == Some(&'^') {
                    pattern.push('^');
                    index += 1;
                }
                if characters.get(index + 1) == Some(&']') {
                    pattern.push_str("\\]");
                    index += 1;
                }
            }
            ']' if in_class => {
                in_class = false;
                pattern.push(character);
            }
            '{' if !in_class => match repetition_length(&characters[index..]) {
                Some(length) => {
                    pattern.extend(&characters[index..index + length]);
                    index += length - 1;
                }
                None => pattern.push_str("\\{"),
            },
            '}' if !in_class => pattern.push_str("\\}"),
            _ => pattern.push(character),
        }
        index += 1;
    }
    pattern
}

/// The length of the `{n}`, `{n,}` or `{n,m}` at the start of `characters`, if one is there.
fn repetition_length(characters: &[char]) -> Option<usize> {
    let close = characters.iter().position(|character| *character == '}')?;
    let inside: String = characters[1..close].iter().collect();
    let (low, high) = inside.split_once(',').unwrap_or((&inside, "0"));
    let digits = |text: &str| !text.is_empty() && text.chars().all(|character| character.is_ascii_digit());
    (digits(low) && (high.is_empty() || digits(high))).then_some(close + 1)
}

/// Every topic permission, with a version that changes on every change.
#[derive(Debug, Default)]
pub struct TopicPermissions {
    entries: RwLock<Vec<Arc<TopicPermission>>>,
    /// Bumped after every change, so connections know to refresh their [`TopicAccess`].
    version: AtomicU64,
}

impl TopicPermissions {
    /// A table holding exactly `entries`.
    pub fn from_entries(entries: Vec<TopicPermission>) -> TopicPermissions {
        TopicPermissions { entries: RwLock::new(entries.into_iter().map(Arc::new).collect()), version: AtomicU64::new(0) }
    }

    /// The version of the table: it differs after every change.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Every entry, sorted by vhost, user and exchange.
    pub fn list(&self) -> Vec<Arc<TopicPermission>> {
        let mut entries = self.entries.read().clone();
        entries.sort_by(|a, b| (&a.vhost, &a.user, &a.exchange).cmp(&(&b.vhost, &b.user, &b.exchange)));
        entries
    }

    /// How many entries there are.
    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// The entries of `user` in `vhost`.
    pub fn of(&self, user: &str, vhost: &str) -> Vec<Arc<TopicPermission>> {
        self.entries.read().iter().filter(|entry| entry.user == user && entry.vhost == vhost).cloned().collect()
    }

    /// Sets (adds or replaces) a user's permission on an exchange of a vhost.
    pub fn put(&self, permission: TopicPermission) -> Result<(), TopicPermissionError> {
        let mut entries = self.entries.write();
        let existing = entries
            .iter()
            .position(|entry| entry.user == permission.user && entry.vhost == permission.vhost && entry.exchange == permission.exchange);
        match existing {
            Some(index) => entries[index] = Arc::new(permission),
            None if entries.len() >= TOPIC_PERMISSIONS_MAX => return Err(TopicPermissionError::TooMany),
            None => entries.push(Arc::new(permission)),
        }
        drop(entries);
        self.changed();
        Ok(())
    }

    /// Removes a user's permissions in a vhost: on `exchange`, or on every exchange when `None`.
    /// Returns whether any existed.
    pub fn delete(&self, user: &str, vhost: &str, exchange: Option<&str>) -> bool {
        self.remove_where(|entry| entry.user == user && entry.vhost == vhost && exchange.is_none_or(|name| entry.exchange == name))
    }

    /// Removes every permission of a user (the user was deleted).
    pub fn delete_user(&self, user: &str) {
        self.remove_where(|entry| entry.user == user);
    }

    /// Removes every permission in a vhost (the vhost was deleted).
    pub fn remove_vhost(&self, vhost: &str) {
        self.remove_where(|entry| entry.vhost == vhost);
    }

    fn remove_where(&self, doomed: impl Fn(&TopicPermission) -> bool) -> bool {
        let removed = {
            let mut entries = self.entries.write();
            let before = entries.len();
            entries.retain(|entry| !doomed(entry));
            entries.len() != before
        };
        if removed {
            self.changed();
        }
        removed
    }
}

/// A connection's copy of its user's topic permissions in its vhost, refreshed when the table
/// changes: the check on the publish path takes no lock and allocates nothing.
#[derive(Debug)]
pub struct TopicAccess {
    /// The table's version the entries were copied at; `u64::MAX` before the first copy.
    version: u64,
    /// The user's entries in the vhost, one per exchange (at most [`TOPIC_PERMISSIONS_MAX`]).
    entries: Vec<Arc<TopicPermission>>,
}

impl Default for TopicAccess {
    fn default() -> TopicAccess {
        TopicAccess { version: u64::MAX, entries: Vec::new() }
    }
}

impl TopicAccess {
    /// 403 unless `user` may use `key` for `kind` on the topic exchange `exchange` of `vhost`.
    /// The caller checks that the exchange is of type topic.
    pub fn check(
        &mut self,
        table: &TopicPermissions,
        (user, vhost): (&str, &str),
        exchange: &[u8],
        kind: TopicAccessKind,
        key: &[u8],
    ) -> Result<(), AmqpError> {
        let version = table.version();
        if version != self.version {
            self.entries = table.of(user, vhost);
            self.version = version;
        }
        match self.entries.iter().find(|entry| entry.exchange.as_bytes() == exchange) {
            Some(entry) => entry.check(kind, key),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_expanded_username_first() {
        assert_eq!(expand("^{username}\\.{vhost}\\.", "ann", "prod"), "^ann\\.prod\\.");
        assert_eq!(expand("{username}{username}", "ann", "/"), "annann");
        // A user named "{vhost}" gets the vhost's name, as RabbitMQ's fold in key order gives.
        assert_eq!(expand("^{username}$", "{vhost}", "v"), "^v$");
        assert_eq!(expand("^{client_id}", "ann", "/"), "^{client_id}", "AMQP 0-9-1 has no client_id");
    }

    #[test]
    fn expressions_match_as_erlang_re_run_does() {
        let permission = TopicPermission::new("ann", "/", "amq.topic", "^{username}-", "").expect("compiles");
        assert!(permission.allows(TopicAccessKind::Write, b"ann-orders"));
        assert!(!permission.allows(TopicAccessKind::Write, b"bob-orders"));
        // Unanchored unless the expression anchors.
        let permission = TopicPermission::new("ann", "/", "t", "orders", "{vhost}$").expect("compiles");
        assert!(permission.allows(TopicAccessKind::Write, b"eu.orders.new"));
        assert!(permission.allows(TopicAccessKind::Read, b"key./"));
        assert!(!permission.allows(TopicAccessKind::Read, b"key./x"));
        // The empty expression is ^$: the empty key alone.
        let permission = TopicPermission::new("ann", "/", "t", "", ".*").expect("compiles");
        assert!(permission.allows(TopicAccessKind::Write, b""));
        assert!(!permission.allows(TopicAccessKind::Write, b"a"));
        assert!(permission.allows(TopicAccessKind::Read, b"\xff not utf-8"));
    }

    #[test]
    fn braces_are_literal_unless_they_repeat() {
        assert_eq!(pcre_braces("^{username}-a{2}b{1,}c{1,3}"), "^\\{username\\}-a{2}b{1,}c{1,3}");
        assert_eq!(pcre_braces("[{}]x\\{y}"), "[{}]x\\{y\\}");
        assert_eq!(pcre_braces("[]{]{,2}"), "[\\]{]\\{,2\\}");
        let literal = TopicPermission::new("ann", "/", "t", "^a{x}$", ".*").expect("a brace that repeats nothing is literal");
        assert!(literal.allows(TopicAccessKind::Write, b"a{x}"));
        let repeated = TopicPermission::new("ann", "/", "t", "^a{2}$", ".*").expect("compiles");
        assert!(repeated.allows(TopicAccessKind::Write, b"aa"));
    }

    #[test]
    fn an_invalid_expression_is_refused_and_an_invalid_expansion_refuses_every_key() {
        let error = TopicPermission::new("ann", "/", "t", "(", ".*").expect_err("does not compile");
        assert!(matches!(error, TopicPermissionError::InvalidExpression { ref expression, .. } if expression == "("));
        let permission = TopicPermission::new("a(b", "/", "t", "^{username}", ".*").expect("valid before expansion");
        assert!(!permission.allows(TopicAccessKind::Write, b"a(b"));
        assert!(permission.allows(TopicAccessKind::Read, b"anything"));
    }

    #[test]
    fn refusals_carry_rabbitmq_text() {
        let permission = TopicPermission::new("ann", "/", "amq.topic", "^a", "^b").expect("compiles");
        let error = permission.check(TopicAccessKind::Write, b"x.y").expect_err("refused");
        assert_eq!(error.code, 403);
        assert_eq!(error.text, "ACCESS_REFUSED - access to topic 'x.y' in exchange 'amq.topic' in vhost '/' refused for user 'ann'");
    }

    #[test]
    fn connections_see_changes_and_users_without_entries_pass() {
        let table = TopicPermissions::default();
        let mut access = TopicAccess::default();
        let who = ("ann", "/");
        assert!(access.check(&table, who, b"amq.topic", TopicAccessKind::Write, b"k").is_ok(), "no entry: allowed");
        table.put(TopicPermission::new("ann", "/", "amq.topic", "^a", "^a").expect("compiles")).expect("room");
        assert!(access.check(&table, who, b"amq.topic", TopicAccessKind::Write, b"k").is_err());
        assert!(access.check(&table, who, b"other", TopicAccessKind::Write, b"k").is_ok(), "another exchange: allowed");
        let mut bobs = TopicAccess::default();
        assert!(bobs.check(&table, ("bob", "/"), b"amq.topic", TopicAccessKind::Write, b"k").is_ok());
        assert!(table.delete("ann", "/", None));
        assert!(access.check(&table, who, b"amq.topic", TopicAccessKind::Write, b"k").is_ok(), "cleared: allowed again");
        assert!(!table.delete("ann", "/", Some("amq.topic")));
    }
}
