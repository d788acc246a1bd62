//! Durable definitions: exchanges, queues and bindings of every vhost, in one JSON file that is
//! replaced atomically on each change, so a crash never leaves half a declaration.
//!
//! Argument tables are stored as the hex of their AMQP encoding, so they come back byte-exact.

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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Definitions {
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

    /// Reads the definitions; empty when the file does not exist yet.
    pub fn load(&self) -> Result<Definitions, StorageError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|error| StorageError::Corrupt { path: self.path.display().to_string(), detail: error.to_string() }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Definitions::default()),
            Err(error) => Err(StorageError::io(&self.path, error)),
        }
    }

    /// Replaces the definitions atomically.
    pub fn save(&self, definitions: &Definitions) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec_pretty(definitions)
            .map_err(|error| StorageError::Corrupt { path: self.path.display().to_string(), detail: error.to_string() })?;
        write_atomically(&self.path, &bytes)
    }
}
