//! What a clustered node keeps about itself in `DATA_DIR/cluster/node.json`: its Raft id (fixed at
//! its first start), whether it is a member yet, of which cluster, and the voters the cluster
//! started with (a node that joins later replays the log from them).

use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::path::{Path, PathBuf};

/// Where a node is in its cluster's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Membership {
    /// Never a member: it forms the cluster with the other seeds, or joins one.
    Fresh,
    /// A member: its metadata log is under `cluster/metadata`.
    Member,
    /// It left (or was forgotten by) its cluster; the data directory is not used again.
    Left,
}

/// The file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// Raft id.
    pub node_id: u64,
    /// The node name it first started with.
    pub node_name: String,
    /// The cluster name.
    pub cluster_name: String,
    /// The cluster it belongs to (0 until the first leader names it).
    pub cluster_id: u64,
    /// The voters the metadata log starts from.
    pub initial_voters: Vec<u64>,
    /// See [`Membership`].
    pub membership: Membership,
    /// For a node that joined: the metadata index the cluster had applied when it accepted the
    /// join; entries up to it were applied by the others before this node existed.
    #[serde(default)]
    pub history_index: u64,
}

/// The Raft id of a founding node: derived from the cluster name and its seed address, so every
/// founding node computes the same voter set from the same seed list before any of them talked.
pub fn seed_id(cluster_name: &str, address: &str) -> u64 {
    let digest = sha2::Sha256::digest(format!("{cluster_name}\0{address}").as_bytes());
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(bytes).max(1)
}

/// A random id for a node that joins later (never 0).
pub fn random_id() -> u64 {
    rand::random::<u64>().max(1)
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("cluster").join("node.json")
}

impl NodeState {
    /// The stored state, if the node ever started clustered.
    pub fn load(data_dir: &Path) -> Result<Option<NodeState>, String> {
        let path = path(data_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| format!("{}: {error}", path.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(format!("{}: {error}", path.display())),
        }
    }

    /// Stores it durably (temporary file, fsync, rename, directory fsync).
    pub fn store(&self, data_dir: &Path) -> Result<(), String> {
        let path = path(data_dir);
        let directory = data_dir.join("cluster");
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&directory)?;
            let temporary = directory.join("node.json.tmp");
            let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
            let file = std::fs::File::create(&temporary)?;
            std::io::Write::write_all(&mut &file, &bytes)?;
            file.sync_all()?;
            std::fs::rename(&temporary, &path)?;
            std::fs::File::open(&directory)?.sync_all()
        };
        write().map_err(|error| format!("{}: {error}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ids_are_stable_and_differ_by_address_and_cluster() {
        assert_eq!(seed_id("lepus", "h:1"), seed_id("lepus", "h:1"));
        assert_ne!(seed_id("lepus", "h:1"), seed_id("lepus", "h:2"));
        assert_ne!(seed_id("lepus", "h:1"), seed_id("other", "h:1"));
        let directory = std::env::temp_dir().join(format!("lepus-node-state-{}", random_id()));
        assert_eq!(NodeState::load(&directory).expect("no file"), None);
        let state = NodeState {
            node_id: 5,
            node_name: "n@h".into(),
            cluster_name: "lepus".into(),
            cluster_id: 0,
            initial_voters: vec![5, 6],
            membership: Membership::Member,
            history_index: 7,
        };
        state.store(&directory).expect("stores");
        assert_eq!(NodeState::load(&directory).expect("reads"), Some(state));
        let _ = std::fs::remove_dir_all(&directory);
    }
}
