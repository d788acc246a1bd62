//! Snapshots of the metadata group: the applied definitions as the commands that rebuild them.
//!
//! An image is the log compacted: one command per thing that exists (a vhost, a user, a
//! permission, a policy, an exchange, a queue, a binding), each with the log index it is applied
//! under. A queue keeps the index of the entry that declared it (its incarnation), so applying its
//! command from an image does what replaying that entry did: the node that declared a classic
//! queue opens its log directory of that incarnation and recovers its messages, the others make
//! the remote placeholder, and a quorum queue is found in its shard by name with its incarnation.
//! Installing an image (at start, or one the leader sent) first removes what the node holds and
//! the image does not, then applies the image's commands through the same path as committed
//! entries (`apply.rs`), so there is one way of changing definitions, not two.
//!
//! Bytes: `magic "LMDI" | version u32 | body length u32 | crc32c u32 | body`, the checksum seeded
//! and covering the version, the length and the body; the body is JSON, as the log's entries are
//! (definitions are few; a readable image is worth more than the bytes). The image then rides in
//! `replication::log_store::LogStore`'s snapshot file (written through a temporary file, a rename
//! and a directory sync, with a checksum of its own) and in raft-rs's `MsgSnapshot`.

use super::command::{MetadataCommand, QueueDeclaration};
use crate::broker::Broker;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use storage::definitions::{table_to_hex, BindingRecord, PermissionRecord, UserRecord};

/// The image format this build writes (and the only one it reads).
pub const METADATA_IMAGE_VERSION: u32 = 1;

/// Marks an image.
const IMAGE_MAGIC: [u8; 4] = *b"LMDI";

/// Magic, version, length, checksum.
const IMAGE_HEADER_BYTES: usize = 16;

/// Seeds the image's checksum, so no other record of ours passes for an image.
const IMAGE_CHECKSUM_SEED: u32 = 0x4C4D_4449;

/// The largest image a node writes or takes: about 800,000 queues with their bindings at the
/// sizes measured in the tests (~300 bytes a command). A large one travels to a member in parts
/// (`cluster/transfer.rs`, at most 1 GiB). Past it a node does not snapshot (it says so loudly
/// and keeps its whole log, as before snapshots existed).
pub const METADATA_SNAPSHOT_BYTES_MAX: usize = 256 << 20;

/// Applied entries past the latest snapshot that make a node take a new one and compact its log.
pub const METADATA_SNAPSHOT_ENTRIES_INTERVAL_DEFAULT: u64 = 4096;

/// Why image bytes were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    /// Shorter than its header.
    #[error("a metadata snapshot image of {0} bytes, shorter than its header")]
    TooShort(usize),
    /// Not an image.
    #[error("not a metadata snapshot image (magic {0:02x?})")]
    Magic([u8; 4]),
    /// Another format version.
    #[error("a metadata snapshot image of version {0}; this build reads version {METADATA_IMAGE_VERSION}")]
    Version(u32),
    /// The length field disagrees with the bytes.
    #[error("a metadata snapshot image whose length field says {said} bytes, {held} held")]
    Length {
        /// What the header says.
        said: usize,
        /// What follows the header.
        held: usize,
    },
    /// Damaged.
    #[error("a metadata snapshot image that fails its checksum (damaged)")]
    Checksum,
    /// Over [`METADATA_SNAPSHOT_BYTES_MAX`].
    #[error("a metadata snapshot image of {0} bytes, over the bound of {METADATA_SNAPSHOT_BYTES_MAX}")]
    TooLarge(usize),
    /// The body does not decode.
    #[error("a metadata snapshot image whose body does not decode: {0}")]
    Body(String),
}

/// A member as an image keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageMember {
    /// Raft id.
    pub id: u64,
    /// Node name.
    pub name: String,
    /// Advertised cluster address.
    pub address: String,
}

/// One command of an image and the log index it is applied under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageEntry {
    /// For a queue, the index of the entry that declared it (its incarnation); for the others,
    /// the image's index.
    pub index: u64,
    /// The command.
    pub command: MetadataCommand,
}

/// The applied state of the metadata group at `index`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetadataImage {
    /// The last entry applied.
    pub index: u64,
    /// The cluster's id (0: not formed yet).
    pub cluster_id: u64,
    /// The members that said who they are.
    pub members: Vec<ImageMember>,
    /// Definition changes applied up to `index` (a node that applied none may join another cluster).
    pub definition_changes: u64,
    /// The commands that rebuild the definitions, in the order they must be applied.
    pub entries: Vec<ImageEntry>,
    /// The proposals remembered as applied, (proposer, sequence) oldest first: a second copy of
    /// one after `index` is skipped on a node that installed the image as on the others
    /// (`proposals.rs`). Absent from an image of before: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_proposals: Vec<(u64, u64)>,
    /// The operator's choices of nodes' roles in quorum shards, (shard, node, voter). Absent
    /// from an image of before: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shard_roles: Vec<(u32, u64, bool)>,
}

impl MetadataImage {
    /// The image as bytes; refused past [`METADATA_SNAPSHOT_BYTES_MAX`].
    pub fn encode(&self) -> Result<Vec<u8>, ImageError> {
        let body = serde_json::to_vec(self).map_err(|error| ImageError::Body(error.to_string()))?;
        let length = IMAGE_HEADER_BYTES + body.len();
        if length > METADATA_SNAPSHOT_BYTES_MAX {
            return Err(ImageError::TooLarge(length));
        }
        let mut bytes = Vec::with_capacity(length);
        bytes.extend_from_slice(&IMAGE_MAGIC);
        bytes.extend_from_slice(&METADATA_IMAGE_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&body);
        let checksum = image_checksum(&bytes);
        bytes[12..16].copy_from_slice(&checksum.to_le_bytes());
        Ok(bytes)
    }

    /// An image back from bytes read from disk or received from a peer: every field is checked
    /// (magic, version, length, checksum, bound) before the body is decoded.
    pub fn decode(bytes: &[u8]) -> Result<MetadataImage, ImageError> {
        if bytes.len() > METADATA_SNAPSHOT_BYTES_MAX {
            return Err(ImageError::TooLarge(bytes.len()));
        }
        let Some((header, body)) = bytes.split_first_chunk::<IMAGE_HEADER_BYTES>() else {
            return Err(ImageError::TooShort(bytes.len()));
        };
        let field = |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
        let magic = [header[0], header[1], header[2], header[3]];
        if magic != IMAGE_MAGIC {
            return Err(ImageError::Magic(magic));
        }
        let length = field(8) as usize;
        if length != body.len() {
            return Err(ImageError::Length { said: length, held: body.len() });
        }
        if image_checksum(bytes) != field(12) {
            return Err(ImageError::Checksum);
        }
        // Checked after the checksum: a version field is only believed when the bytes are whole.
        let version = field(4);
        if version != METADATA_IMAGE_VERSION {
            return Err(ImageError::Version(version));
        }
        serde_json::from_slice(body).map_err(|error| ImageError::Body(error.to_string()))
    }
}

/// The checksum of an image: over the version, the length and the body (not the checksum field).
fn image_checksum(bytes: &[u8]) -> u32 {
    let checksum = crc32c::crc32c_append(IMAGE_CHECKSUM_SEED, &bytes[4..12]);
    crc32c::crc32c_append(checksum, &bytes[IMAGE_HEADER_BYTES..])
}

/// The queue declarations applied on this node, by vhost and name: each with the index of the
/// entry that declared it, which an image keeps.
pub type QueueDeclarations = HashMap<(String, String), (u64, QueueDeclaration)>;

/// The commands that rebuild `broker`'s definitions at `index`, in the order they apply: vhosts,
/// users, permissions, topic permissions, policies, operator policies, exchanges, queues, bindings,
/// then the vhosts' limits (last: a `max-queues` lowered below the queues a vhost holds must not
/// refuse them on the way back). Declarations of queues that no longer exist are dropped from
/// `declarations` on the way (it would otherwise keep every queue ever declared).
pub fn image_entries(broker: &Broker, index: u64, declarations: &mut QueueDeclarations) -> Vec<ImageEntry> {
    let mut entries = Vec::new();
    let mut push = |command: MetadataCommand| entries.push(ImageEntry { index, command });
    let vhosts = broker.vhost_infos();
    for vhost in &vhosts {
        push(MetadataCommand::PutVhost {
            name: vhost.name.clone(),
            description: vhost.description.clone(),
            tags: vhost.tags.clone(),
            default_queue_type: vhost.default_queue_type.map(|queue_type| queue_type.name().to_string()),
        });
    }
    for user in broker.users.list() {
        push(MetadataCommand::PutUser(UserRecord {
            name: user.name.clone(),
            password_hash: user.password_hash(),
            tags: user.tags.clone(),
        }));
    }
    for permission in broker.permissions.list() {
        push(MetadataCommand::PutPermission(PermissionRecord {
            user: permission.user.clone(),
            vhost: permission.vhost.clone(),
            configure: permission.configure.clone(),
            write: permission.write.clone(),
            read: permission.read.clone(),
        }));
    }
    for permission in broker.topic_permissions.list() {
        push(MetadataCommand::PutTopicPermission(permission.to_record()));
    }
    for policy in broker.policies() {
        push(MetadataCommand::PutPolicy(policy.to_record()));
    }
    for policy in broker.operator_policies() {
        push(MetadataCommand::PutOperatorPolicy(policy.to_record()));
    }
    let topologies = broker.topologies();
    let mut queues = Vec::new();
    let mut bindings = Vec::new();
    for (vhost, topology) in &topologies {
        let topology = topology.read();
        for exchange in topology.exchanges() {
            // The predeclared exchanges come with their vhost.
            if exchange.name.is_empty() || exchange.name.as_bytes().starts_with(b"amq.") {
                continue;
            }
            push(MetadataCommand::DeclareExchange(super::ExchangeDeclarationRecord {
                vhost: vhost.clone(),
                name: exchange.name.to_string_lossy(),
                kind: exchange.kind.name().to_string(),
                durable: exchange.durable,
                auto_delete: exchange.auto_delete,
                internal: exchange.internal,
                arguments_hex: table_to_hex(&exchange.arguments),
            }));
        }
        for queue in topology.queues() {
            let key = (vhost.clone(), queue.definition.name.to_string_lossy());
            match declarations.get(&key) {
                Some((declared_at, declaration)) => {
                    queues.push(ImageEntry { index: *declared_at, command: MetadataCommand::DeclareQueue(declaration.clone()) })
                }
                None => {
                    tracing::error!(vhost, queue = %key.1, "a queue without its declaration's index is left out of the metadata snapshot")
                }
            }
        }
        for (source, binding) in topology.bindings() {
            if source.name.is_empty() {
                continue;
            }
            let (destination, destination_is_exchange) = match &binding.destination {
                broker_core::exchange::Destination::Queue(name) => (name, false),
                broker_core::exchange::Destination::Exchange(name) => (name, true),
            };
            bindings.push(MetadataCommand::Bind(BindingRecord {
                vhost: vhost.clone(),
                source: source.name.to_string_lossy(),
                destination: destination.to_string_lossy(),
                destination_is_exchange,
                routing_key: binding.routing_key.to_string_lossy(),
                arguments_hex: table_to_hex(&binding.arguments),
            }));
        }
    }
    let held: std::collections::HashSet<(&str, &str)> = queues
        .iter()
        .filter_map(|entry| match &entry.command {
            MetadataCommand::DeclareQueue(declaration) => Some((declaration.vhost.as_str(), declaration.name.as_str())),
            _ => None,
        })
        .collect();
    declarations.retain(|(vhost, name), _| held.contains(&(vhost.as_str(), name.as_str())));
    entries.extend(queues);
    entries.extend(bindings.into_iter().map(|command| ImageEntry { index, command }));
    for vhost in vhosts {
        if let Some(limits) = vhost.limits {
            entries.push(ImageEntry { index, command: MetadataCommand::SetVhostLimits { vhost: vhost.name, limits: limits.to_map() } });
        }
    }
    entries
}

/// What a command makes exists under: its kind (the order removals go in: what depends on
/// something before it) and its key. `None`: a command that makes nothing to remove.
fn identity(command: &MetadataCommand) -> Option<(u8, String)> {
    let key = |parts: &[&str]| serde_json::to_string(parts).unwrap_or_default();
    Some(match command {
        MetadataCommand::Bind(record) => (0, serde_json::to_string(record).unwrap_or_default()),
        MetadataCommand::DeclareQueue(declaration) => (1, key(&[&declaration.vhost, &declaration.name])),
        MetadataCommand::DeclareExchange(record) => (2, key(&[&record.vhost, &record.name])),
        MetadataCommand::PutTopicPermission(record) => (3, key(&[&record.user, &record.vhost, &record.exchange])),
        MetadataCommand::PutPermission(record) => (4, key(&[&record.user, &record.vhost])),
        MetadataCommand::PutPolicy(record) => (5, key(&[&record.vhost, &record.name])),
        MetadataCommand::PutOperatorPolicy(record) => (6, key(&[&record.vhost, &record.name])),
        MetadataCommand::PutUser(record) => (7, key(&[&record.name])),
        MetadataCommand::SetVhostLimits { vhost, .. } => (8, key(&[vhost])),
        MetadataCommand::PutVhost { name, .. } => (9, key(&[name])),
        _ => return None,
    })
}

/// The command that removes what `command` made (`node` proposes nothing: it is this node's own
/// deletion of a queue, without an owner check).
fn removal(command: &MetadataCommand, node: u64) -> Option<MetadataCommand> {
    Some(match command {
        MetadataCommand::Bind(record) => MetadataCommand::Unbind(record.clone()),
        MetadataCommand::DeclareQueue(declaration) => MetadataCommand::DeleteQueue {
            vhost: declaration.vhost.clone(),
            name: declaration.name.clone(),
            owner_connection: None,
            owner_node: node,
        },
        MetadataCommand::DeclareExchange(record) => {
            MetadataCommand::DeleteExchange { vhost: record.vhost.clone(), name: record.name.clone(), if_unused: false }
        }
        MetadataCommand::PutTopicPermission(record) => MetadataCommand::DeleteTopicPermissions {
            user: record.user.clone(),
            vhost: record.vhost.clone(),
            exchange: Some(record.exchange.clone()),
        },
        MetadataCommand::PutPermission(record) => {
            MetadataCommand::DeletePermission { user: record.user.clone(), vhost: record.vhost.clone() }
        }
        MetadataCommand::PutPolicy(record) => MetadataCommand::DeletePolicy { vhost: record.vhost.clone(), name: record.name.clone() },
        MetadataCommand::PutOperatorPolicy(record) => {
            MetadataCommand::DeleteOperatorPolicy { vhost: record.vhost.clone(), name: record.name.clone() }
        }
        MetadataCommand::PutUser(record) => MetadataCommand::DeleteUser { name: record.name.clone() },
        MetadataCommand::SetVhostLimits { vhost, .. } => MetadataCommand::SetVhostLimits { vhost: vhost.clone(), limits: BTreeMap::new() },
        MetadataCommand::PutVhost { name, .. } => MetadataCommand::DeleteVhost { name: name.clone() },
        _ => return None,
    })
}

/// What must go before `incoming` is applied over `current`: everything `current` holds that
/// `incoming` does not, and every queue or exchange `incoming` holds differently (another
/// incarnation, other arguments: a declaration over it would be refused or find the wrong one).
/// Users, permissions, policies and limits that differ are simply put again. In removal order:
/// bindings, queues, exchanges, ..., vhosts.
pub fn removals(current: &[ImageEntry], incoming: &[ImageEntry], node: u64) -> Vec<MetadataCommand> {
    let incoming: HashMap<(u8, String), &ImageEntry> =
        incoming.iter().filter_map(|entry| identity(&entry.command).map(|identity| (identity, entry))).collect();
    let mut removed: Vec<((u8, String), MetadataCommand)> = Vec::new();
    for entry in current {
        let Some(identity) = identity(&entry.command) else { continue };
        let queue = matches!(entry.command, MetadataCommand::DeclareQueue(_));
        let replaced = queue || matches!(entry.command, MetadataCommand::DeclareExchange(_));
        let gone = match incoming.get(&identity) {
            None => true,
            // A queue's index is its incarnation; the others' is only the image's.
            Some(kept) => replaced && (kept.command != entry.command || queue && kept.index != entry.index),
        };
        if gone {
            if let Some(command) = removal(&entry.command, node) {
                removed.push((identity, command));
            }
        }
    }
    removed.sort_by_key(|(identity, _)| identity.0);
    removed.into_iter().map(|(_, command)| command).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str, home: u64) -> MetadataCommand {
        MetadataCommand::DeclareQueue(QueueDeclaration {
            vhost: "/".into(),
            name: name.into(),
            durable: true,
            exclusive_connection: None,
            auto_delete: false,
            arguments_hex: String::new(),
            server_named: false,
            home,
            stream_members: Vec::new(),
        })
    }

    fn exchange(name: &str, kind: &str) -> MetadataCommand {
        MetadataCommand::DeclareExchange(super::super::ExchangeDeclarationRecord {
            vhost: "/".into(),
            name: name.into(),
            kind: kind.into(),
            durable: true,
            auto_delete: false,
            internal: false,
            arguments_hex: String::new(),
        })
    }

    fn image() -> MetadataImage {
        MetadataImage {
            index: 812,
            cluster_id: 0xABCD,
            members: vec![ImageMember { id: 7, name: "n1@h".into(), address: "127.0.0.1:25001".into() }],
            definition_changes: 640,
            applied_proposals: vec![(7, 1 << 40), (9, 3)],
            shard_roles: vec![(2, 5, false), (0, 5, true)],
            entries: vec![
                ImageEntry {
                    index: 812,
                    command: MetadataCommand::PutVhost {
                        name: "/".into(),
                        description: String::new(),
                        tags: vec![],
                        default_queue_type: None,
                    },
                },
                ImageEntry { index: 812, command: exchange("e", "topic") },
                ImageEntry { index: 31, command: queue("q", 7) },
            ],
        }
    }

    #[test]
    fn images_round_trip() {
        let image = image();
        let bytes = image.encode().expect("encodes");
        assert_eq!(&bytes[..4], b"LMDI");
        assert_eq!(MetadataImage::decode(&bytes).expect("decodes"), image);
        let empty = MetadataImage {
            index: 0,
            cluster_id: 0,
            members: vec![],
            definition_changes: 0,
            entries: vec![],
            applied_proposals: vec![],
            shard_roles: vec![],
        };
        assert_eq!(MetadataImage::decode(&empty.encode().expect("encodes")).expect("decodes"), empty);
    }

    #[test]
    fn damaged_bytes_are_refused() {
        let bytes = image().encode().expect("encodes");
        // Every byte flipped in turn: none passes (the checksum covers all but itself and the
        // magic, which is checked as it is).
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x20;
            assert!(MetadataImage::decode(&damaged).is_err(), "byte {at} flipped was taken");
        }
        let mut body_flipped = bytes.clone();
        let last = body_flipped.len() - 2;
        body_flipped[last] ^= 1;
        assert_eq!(MetadataImage::decode(&body_flipped), Err(ImageError::Checksum));
        assert_eq!(MetadataImage::decode(&bytes[..10]), Err(ImageError::TooShort(10)));
        assert!(matches!(MetadataImage::decode(&bytes[..bytes.len() - 1]), Err(ImageError::Length { .. })));
        assert!(matches!(MetadataImage::decode(b"{\"index\":1} and some more"), Err(ImageError::Magic(_))));
    }

    #[test]
    fn another_version_is_refused() {
        let mut bytes = image().encode().expect("encodes");
        bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
        let checksum = image_checksum(&bytes);
        bytes[12..16].copy_from_slice(&checksum.to_le_bytes());
        assert_eq!(MetadataImage::decode(&bytes), Err(ImageError::Version(2)));
    }

    #[test]
    fn images_over_the_bound_are_refused() {
        let mut image = image();
        let big = "x".repeat(1 << 20);
        let over = METADATA_SNAPSHOT_BYTES_MAX / (1 << 20) + 1;
        image.entries = (0..over).map(|_| ImageEntry { index: 1, command: MetadataCommand::DeleteVhost { name: big.clone() } }).collect();
        assert!(matches!(image.encode(), Err(ImageError::TooLarge(_))));
        assert!(matches!(MetadataImage::decode(&vec![0; METADATA_SNAPSHOT_BYTES_MAX + 1]), Err(ImageError::TooLarge(_))));
    }

    #[test]
    fn removals_take_what_the_image_lacks_and_replace_other_incarnations() {
        let binding = MetadataCommand::Bind(BindingRecord {
            vhost: "/".into(),
            source: "e".into(),
            destination: "gone".into(),
            destination_is_exchange: false,
            routing_key: "k".into(),
            arguments_hex: String::new(),
        });
        let user = |tags: Vec<String>| MetadataCommand::PutUser(UserRecord { name: "u".into(), password_hash: "h".into(), tags });
        let current = vec![
            ImageEntry { index: 5, command: user(vec![]) },
            ImageEntry { index: 5, command: exchange("e", "topic") },
            ImageEntry { index: 5, command: exchange("changed", "topic") },
            ImageEntry { index: 3, command: queue("kept", 1) },
            ImageEntry { index: 4, command: queue("redeclared", 1) },
            ImageEntry { index: 6, command: queue("gone", 1) },
            ImageEntry { index: 5, command: binding.clone() },
        ];
        let incoming = vec![
            ImageEntry { index: 9, command: user(vec!["administrator".into()]) },
            ImageEntry { index: 9, command: exchange("e", "topic") },
            ImageEntry { index: 9, command: exchange("changed", "fanout") },
            ImageEntry { index: 3, command: queue("kept", 1) },
            ImageEntry { index: 8, command: queue("redeclared", 1) },
        ];
        let removed = removals(&current, &incoming, 2);
        let delete_queue =
            |name: &str| MetadataCommand::DeleteQueue { vhost: "/".into(), name: name.into(), owner_connection: None, owner_node: 2 };
        assert_eq!(
            removed,
            vec![
                MetadataCommand::Unbind(match binding {
                    MetadataCommand::Bind(record) => record,
                    _ => unreachable!(),
                }),
                delete_queue("redeclared"),
                delete_queue("gone"),
                MetadataCommand::DeleteExchange { vhost: "/".into(), name: "changed".into(), if_unused: false },
            ],
            "a user put again is not removed first; the kept queue and exchange stay"
        );
        assert!(removals(&incoming, &incoming, 2).is_empty());
    }
}
