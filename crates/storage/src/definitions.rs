//! Durable definitions: exchanges, queues and bindings of every vhost, in one JSON file that is
//! replaced atomically on each change, so a crash never leaves half a declaration.
//!
//! Argument tables are stored as the hex of their AMQP encoding, so they come back byte-exact.

use crate::record::STORAGE_FORMAT_VERSION;
use crate::{write_atomically, StorageError};
use amqp_codec::{write_table, FieldTable, Reader};
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A durable exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExchangeRecord {
    /// Vhost name.
    pub vhost: String,
    /// Exchange name.
    pub name: String,
    /// Type name.
    pub kind: String,
    /// Auto-delete flag.
    pub auto_delete: bool,
    /// Internal flag.
    pub internal: bool,
    /// Arguments, hex of the AMQP table encoding.
    pub arguments_hex: String,
}

/// A durable queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueRecord {
    /// Vhost name.
    pub vhost: String,
    /// Queue name.
    pub name: String,
    /// Auto-delete flag.
    pub auto_delete: bool,
    /// Arguments, hex of the AMQP table encoding.
    pub arguments_hex: String,
}

/// A binding between durable ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BindingRecord {
    /// Vhost name.
    pub vhost: String,
    /// Source exchange.
    pub source: String,
    /// Destination name.
    pub destination: String,
    /// Whether the destination is an exchange (else a queue).
    pub destination_is_exchange: bool,
    /// Binding key.
    pub routing_key: String,
    /// Arguments, hex of the AMQP table encoding.
    pub arguments_hex: String,
}

/// Everything durable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Definitions {
    /// The storage format of the whole data directory (see [`STORAGE_FORMAT_VERSION`]); absent
    /// in files written by format 1.
    #[serde(default = "format_version_1")]
    pub storage_format_version: u32,
    /// Exchanges (not the predeclared ones).
    pub exchanges: Vec<ExchangeRecord>,
    /// Queues.
    pub queues: Vec<QueueRecord>,
    /// Bindings.
    pub bindings: Vec<BindingRecord>,
    /// Users; `None` in a file written before users were stored (or a fresh data directory),
    /// which means the embedded default `guest`.
    #[serde(default)]
    pub users: Option<Vec<UserRecord>>,
    /// Permissions of users in vhosts; `None` means the default (guest has all of `/`).
    #[serde(default)]
    pub permissions: Option<Vec<PermissionRecord>>,
    /// Vhosts; `None` in a file written before vhosts were stored (or a fresh data directory),
    /// which means the default vhost `/` alone.
    #[serde(default)]
    pub vhosts: Option<Vec<VhostRecord>>,
    /// Policies (RabbitMQ's: a pattern, what it applies to, a priority and a definition).
    #[serde(default)]
    pub policies: Vec<PolicyRecord>,
}

/// A vhost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VhostRecord {
    /// Vhost name.
    pub name: String,
    /// Free text shown by the management API.
    #[serde(default)]
    pub description: String,
    /// Free-form tags shown by the management API.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The vhost's limits by RabbitMQ's names (`max-connections`, `max-queues`); `None` when none
    /// was ever set, an empty map when every one was deleted (RabbitMQ keeps the parameter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<std::collections::BTreeMap<String, i64>>,
}

/// A policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// Vhost name.
    pub vhost: String,
    /// Policy name.
    pub name: String,
    /// Regular expression matched against queue or exchange names.
    pub pattern: String,
    /// `queues`, `exchanges` or `all`.
    pub apply_to: String,
    /// The highest priority among matching policies wins.
    pub priority: i64,
    /// The settings, as the JSON object the management API took.
    pub definition: serde_json::Map<String, serde_json::Value>,
}

fn format_version_1() -> u32 {
    1
}

impl Default for Definitions {
    fn default() -> Definitions {
        Definitions {
            storage_format_version: u32::from(STORAGE_FORMAT_VERSION),
            exchanges: Vec::new(),
            queues: Vec::new(),
            bindings: Vec::new(),
            users: None,
            permissions: None,
            vhosts: None,
            policies: Vec::new(),
        }
    }
}

/// A user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserRecord {
    /// Login name.
    pub name: String,
    /// RabbitMQ's `rabbit_password_hashing_sha256` form: base64(salt ++ SHA-256(salt ++ password)).
    pub password_hash: String,
    /// Tags (administrator, monitoring, management, ...).
    pub tags: Vec<String>,
}

/// What a user may do in a vhost: RabbitMQ's configure, write and read regular expressions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionRecord {
    /// User name.
    pub user: String,
    /// Vhost name.
    pub vhost: String,
    /// Resources the user may declare and delete.
    pub configure: String,
    /// Resources the user may publish to and bind queues to.
    pub write: String,
    /// Resources the user may consume from and bind from.
    pub read: String,
}

/// Encodes a table for a record.
pub fn table_to_hex(table: &FieldTable) -> String {
    let mut bytes = BytesMut::new();
    write_table(&mut bytes, table);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Decodes a table from a record.
pub fn table_from_hex(hex: &str) -> Option<FieldTable> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len()).step_by(2).map(|index| u8::from_str_radix(hex.get(index..index + 2)?, 16).ok()).collect();
    Reader::new(Bytes::from(bytes?)).read_table().ok()
}

/// The definitions file of a data directory.
#[derive(Debug, Clone)]
pub struct DefinitionsStore {
    path: PathBuf,
}

impl DefinitionsStore {
    /// The store in `data_dir`.
    pub fn new(data_dir: &Path) -> DefinitionsStore {
        DefinitionsStore { path: data_dir.join("definitions.json") }
    }

    /// Reads the definitions; empty when the file does not exist yet. A data directory of another
    /// storage format is refused, except a format 1 one without durable queues: its file holds no
    /// message logs, and the definitions themselves read the same.
    pub fn load(&self) -> Result<Definitions, StorageError> {
        let mut definitions: Definitions = match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|error| StorageError::Corrupt { path: self.path.display().to_string(), detail: error.to_string() })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Definitions::default()),
            Err(error) => return Err(StorageError::io(&self.path, error)),
        };
        let current = u32::from(STORAGE_FORMAT_VERSION);
        if definitions.storage_format_version != current {
            if definitions.storage_format_version == 1 && definitions.queues.is_empty() {
                definitions.storage_format_version = current;
            } else {
                return Err(StorageError::UnsupportedFormat {
                    path: self.path.display().to_string(),
                    found: definitions.storage_format_version,
                });
            }
        }
        Ok(definitions)
    }

    /// Replaces the definitions atomically.
    pub fn save(&self, definitions: &Definitions) -> Result<(), StorageError> {
        assert_eq!(definitions.storage_format_version, u32::from(STORAGE_FORMAT_VERSION), "definitions are written in the current format");
        let bytes = serde_json::to_vec_pretty(definitions)
            .map_err(|error| StorageError::Corrupt { path: self.path.display().to_string(), detail: error.to_string() })?;
        write_atomically(&self.path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(name: &str) -> DefinitionsStore {
        let dir = std::env::temp_dir().join(format!("lepus-definitions-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        DefinitionsStore::new(&dir)
    }

    fn queue() -> QueueRecord {
        QueueRecord { vhost: "/".to_string(), name: "q".to_string(), auto_delete: false, arguments_hex: String::new() }
    }

    #[test]
    fn the_format_version_is_written_and_other_versions_are_refused() {
        let store = store("version");
        let definitions = Definitions { queues: vec![queue()], ..Definitions::default() };
        store.save(&definitions).expect("save");
        assert_eq!(store.load().expect("load"), definitions);
        let text = std::fs::read_to_string(&store.path).expect("read");
        assert!(text.contains(&format!("\"storage_format_version\": {STORAGE_FORMAT_VERSION}")), "{text}");
        // A newer format, or format 1 (no version) with queues whose logs this build cannot read.
        std::fs::write(&store.path, text.replace(&format!(": {STORAGE_FORMAT_VERSION},"), ": 99,")).expect("write");
        let error = store.load().expect_err("unknown version");
        assert!(matches!(error, StorageError::UnsupportedFormat { found: 99, .. }), "{error}");
        assert!(error.to_string().contains("empty data directory"), "{error}");
        std::fs::write(
            &store.path,
            r#"{"exchanges": [], "queues": [{"vhost": "/", "name": "q", "auto_delete": false, "arguments_hex": ""}], "bindings": []}"#,
        )
        .expect("write");
        assert!(matches!(store.load(), Err(StorageError::UnsupportedFormat { found: 1, .. })));
        // Format 1 without queues has no logs: read as the current format.
        std::fs::write(&store.path, r#"{"exchanges": [], "queues": [], "bindings": []}"#).expect("write");
        assert_eq!(store.load().expect("load").storage_format_version, u32::from(STORAGE_FORMAT_VERSION));
    }
}
