//! Durable definitions: exchanges, queues and bindings of every vhost, in one JSON file that is
//! replaced atomically on each change, so a crash never leaves half a declaration.
//!
//! Argument tables are stored as the hex of their AMQP encoding, so they come back byte-exact.
//!
//! The file names the data directory's storage format ([`STORAGE_FORMAT_VERSION`]). Format 3 gives
//! every queue its type (`"type": "classic"`); a format 2 file is upgraded when it is loaded (its
//! queues were all classic) and written back before the broker uses it.

use crate::{write_atomically, StorageError, STORAGE_FORMAT_VERSION};
use amqp_codec::{write_table, FieldTable, Reader};
use broker_core::vhost::QueueType;
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
    /// Its type, by name (`"type": "classic"`); every queue has one since format 3.
    #[serde(rename = "type", with = "queue_type_name")]
    pub queue_type: QueueType,
}

/// A queue type as the file spells it, the name `x-queue-type` takes; a name RabbitMQ does not
/// have makes the file corrupt.
mod queue_type_name {
    use broker_core::vhost::QueueType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(queue_type: &QueueType, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(queue_type.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<QueueType, D::Error> {
        let name = String::deserialize(deserializer)?;
        QueueType::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown queue type '{name}'")))
    }
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
            storage_format_version: STORAGE_FORMAT_VERSION,
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

    /// Reads the definitions; empty when the file does not exist yet. A data directory of an older
    /// format that this build can upgrade (format 2, and format 1 without durable queues, which has
    /// no message logs) is upgraded here: the file is rewritten in the current format, atomically,
    /// before this returns, so a crash leaves either the old file or the upgraded one. Segments
    /// read the same in both formats. Any other format is refused.
    pub fn load(&self) -> Result<Definitions, StorageError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Definitions::default()),
            Err(error) => return Err(StorageError::io(&self.path, error)),
        };
        let document: serde_json::Value = serde_json::from_slice(&bytes).map_err(|error| self.corrupt(error.to_string()))?;
        let found = match document.get("storage_format_version") {
            // Format 1 wrote no version.
            None => 1,
            Some(version) => version
                .as_u64()
                .and_then(|version| u32::try_from(version).ok())
                .ok_or_else(|| self.corrupt(format!("storage_format_version {version} is not a version number")))?,
        };
        let has_queues = document.get("queues").and_then(serde_json::Value::as_array).is_some_and(|queues| !queues.is_empty());
        match found {
            STORAGE_FORMAT_VERSION => self.parse(document),
            2 => self.upgrade(document, found),
            1 if !has_queues => self.upgrade(document, found),
            _ => Err(StorageError::UnsupportedFormat { path: self.path.display().to_string(), found }),
        }
    }

    /// Brings an older file to the current format (every queue of format 2 is classic), and
    /// writes it back.
    fn upgrade(&self, mut document: serde_json::Value, found: u32) -> Result<Definitions, StorageError> {
        let Some(object) = document.as_object_mut() else {
            return Err(self.corrupt("not a JSON object".to_string()));
        };
        if let Some(queues) = object.get_mut("queues").and_then(serde_json::Value::as_array_mut) {
            for queue in queues.iter_mut().filter_map(serde_json::Value::as_object_mut) {
                queue.entry("type").or_insert_with(|| serde_json::Value::from(QueueType::Classic.name()));
            }
        }
        object.insert("storage_format_version".to_string(), serde_json::Value::from(STORAGE_FORMAT_VERSION));
        let definitions = self.parse(document)?;
        self.save(&definitions)?;
        tracing::info!(
            path = %self.path.display(),
            from = found,
            to = STORAGE_FORMAT_VERSION,
            queues = definitions.queues.len(),
            "upgraded the data directory's storage format"
        );
        Ok(definitions)
    }

    fn parse(&self, document: serde_json::Value) -> Result<Definitions, StorageError> {
        serde_json::from_value(document).map_err(|error| self.corrupt(error.to_string()))
    }

    fn corrupt(&self, detail: String) -> StorageError {
        StorageError::Corrupt { path: self.path.display().to_string(), detail }
    }

    /// Replaces the definitions atomically.
    pub fn save(&self, definitions: &Definitions) -> Result<(), StorageError> {
        assert_eq!(definitions.storage_format_version, STORAGE_FORMAT_VERSION, "definitions are written in the current format");
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
        QueueRecord {
            vhost: "/".to_string(),
            name: "q".to_string(),
            auto_delete: false,
            arguments_hex: String::new(),
            queue_type: QueueType::Classic,
        }
    }

    /// A definitions file as format 2 (the release before queue types) wrote it.
    const FORMAT_2_FILE: &str = r#"{
      "storage_format_version": 2,
      "exchanges": [{"vhost": "/", "name": "x", "kind": "direct", "auto_delete": false, "internal": false, "arguments_hex": ""}],
      "queues": [
        {"vhost": "/", "name": "q", "auto_delete": false, "arguments_hex": ""},
        {"vhost": "other", "name": "q2", "auto_delete": true, "arguments_hex": ""}
      ],
      "bindings": [],
      "users": [{"name": "guest", "password_hash": "hash", "tags": ["administrator"]}],
      "vhosts": [{"name": "/", "description": "", "tags": []}, {"name": "other", "description": "", "tags": []}],
      "policies": []
    }"#;

    #[test]
    fn the_format_version_and_queue_types_are_written_and_other_versions_are_refused() {
        let store = store("version");
        let definitions = Definitions { queues: vec![queue()], ..Definitions::default() };
        store.save(&definitions).expect("save");
        assert_eq!(store.load().expect("load"), definitions);
        let text = std::fs::read_to_string(&store.path).expect("read");
        assert!(text.contains(&format!("\"storage_format_version\": {STORAGE_FORMAT_VERSION}")), "{text}");
        assert!(text.contains("\"type\": \"classic\""), "{text}");
        // A newer format, or format 1 (no version) with queues whose logs this build cannot read.
        std::fs::write(&store.path, text.replace(&format!(": {STORAGE_FORMAT_VERSION},"), ": 99,")).expect("write");
        let error = store.load().expect_err("unknown version");
        assert!(matches!(error, StorageError::UnsupportedFormat { found: 99, .. }), "{error}");
        assert!(error.to_string().contains("empty data directory"), "{error}");
        assert!(error.to_string().contains("upgrades format 2"), "{error}");
        std::fs::write(
            &store.path,
            r#"{"exchanges": [], "queues": [{"vhost": "/", "name": "q", "auto_delete": false, "arguments_hex": ""}], "bindings": []}"#,
        )
        .expect("write");
        assert!(matches!(store.load(), Err(StorageError::UnsupportedFormat { found: 1, .. })));
        // Format 1 without queues has no logs: read as the current format.
        std::fs::write(&store.path, r#"{"exchanges": [], "queues": [], "bindings": []}"#).expect("write");
        assert_eq!(store.load().expect("load").storage_format_version, STORAGE_FORMAT_VERSION);
    }

    #[test]
    fn a_format_2_file_is_upgraded_in_place_with_every_queue_classic() {
        let store = store("upgrade");
        std::fs::write(&store.path, FORMAT_2_FILE).expect("write");
        let loaded = store.load().expect("load");
        assert_eq!(loaded.storage_format_version, STORAGE_FORMAT_VERSION);
        assert_eq!(loaded.queues.len(), 2);
        assert!(loaded.queues.iter().all(|queue| queue.queue_type == QueueType::Classic), "{:?}", loaded.queues);
        assert_eq!(loaded.exchanges.len(), 1);
        assert_eq!(loaded.users.as_ref().map(Vec::len), Some(1));
        assert_eq!(loaded.vhosts.as_ref().map(Vec::len), Some(2));
        // Written back in the new format, atomically (no temporary file left), and read the same.
        let text = std::fs::read_to_string(&store.path).expect("read");
        let document: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(document["storage_format_version"], STORAGE_FORMAT_VERSION);
        assert!(document["queues"].as_array().expect("queues").iter().all(|queue| queue["type"] == "classic"), "{text}");
        assert!(!store.path.with_extension("tmp").exists());
        assert_eq!(store.load().expect("load again"), loaded);
    }

    #[test]
    fn a_queue_without_a_type_or_of_an_unknown_type_is_corrupt_in_format_3() {
        let store = store("types");
        let format_3 =
            FORMAT_2_FILE.replace("\"storage_format_version\": 2", &format!("\"storage_format_version\": {STORAGE_FORMAT_VERSION}"));
        std::fs::write(&store.path, &format_3).expect("write");
        let error = store.load().expect_err("a format 3 queue without a type");
        assert!(matches!(&error, StorageError::Corrupt { detail, .. } if detail.contains("type")), "{error}");
        let typed = format_3.replace("\"arguments_hex\": \"\"}", "\"arguments_hex\": \"\", \"type\": \"bogus\"}");
        std::fs::write(&store.path, typed).expect("write");
        let error = store.load().expect_err("an unknown type");
        assert!(error.to_string().contains("unknown queue type 'bogus'"), "{error}");
        // Quorum is a type RabbitMQ has: the file reads, and the broker decides what to do with it.
        let quorum = format_3.replace("\"arguments_hex\": \"\"}", "\"arguments_hex\": \"\", \"type\": \"quorum\"}");
        std::fs::write(&store.path, quorum).expect("write");
        assert!(store.load().expect("load").queues.iter().all(|queue| queue.queue_type == QueueType::Quorum));
    }
}
