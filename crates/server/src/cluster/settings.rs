//! The cluster settings of `lepus server`: the node's name, the port of the links between nodes,
//! the seeds the cluster forms from, and the bounds of the links.

use std::net::{SocketAddr, ToSocketAddrs};

/// The links' port when seeds are given and no port is (RabbitMQ's inter-node port).
pub const CLUSTER_PORT_DEFAULT: u16 = 25672;

/// The cluster name a node assumes unless told (links from another name are refused).
pub const CLUSTER_NAME_DEFAULT: &str = "lepus";

/// The bytes of frames queued for one peer before the policy applies: Raft messages to it are
/// dropped (Raft resends them), requests to it are refused (the caller answers an error).
pub const PEER_QUEUE_BYTES_MAX_DEFAULT: usize = 16 << 20;

/// How often a link sends a heartbeat when it has sent nothing else.
pub const LINK_HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 500;

/// A link that received nothing for this long is closed and dialled again: the peer is gone or
/// the path to it is. Well above a heartbeat interval, so a busy machine does not flap its links.
pub const LINK_TIMEOUT_MS_DEFAULT: u64 = 5_000;

/// How long a definition change waits to be committed by a majority before the client gets an
/// error (the change may still be applied later: a client that retries a declare gets the same
/// queue).
pub const METADATA_COMMIT_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// The cluster part of the server's settings. Clustering is off (the node runs alone, as before
/// clustering existed) when `cluster_port` is 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// `name@host`, as RabbitMQ's RABBITMQ_NODENAME.
    pub node_name: String,
    /// The port the links between nodes listen on (0: not clustered).
    pub cluster_port: u16,
    /// The founding nodes, `host:port`, this node among them.
    pub seeds: Vec<String>,
    /// The cluster's name: a link from a node of another cluster name is refused.
    pub cluster_name: String,
    /// The address other nodes dial to reach this one, when set explicitly.
    pub advertise: Option<String>,
    /// See [`PEER_QUEUE_BYTES_MAX_DEFAULT`].
    pub peer_queue_bytes_max: usize,
    /// See [`LINK_HEARTBEAT_INTERVAL_MS_DEFAULT`].
    pub link_heartbeat_interval_ms: u64,
    /// See [`LINK_TIMEOUT_MS_DEFAULT`].
    pub link_timeout_ms: u64,
    /// See [`METADATA_COMMIT_TIMEOUT_MS_DEFAULT`].
    pub metadata_commit_timeout_ms: u64,
    /// Applied metadata entries past the latest snapshot that make a node take a new one and
    /// compact its metadata log (see `super::snapshot`).
    pub metadata_snapshot_entries_interval: u64,
}

impl Default for ClusterSettings {
    fn default() -> ClusterSettings {
        ClusterSettings {
            node_name: default_node_name(),
            cluster_port: 0,
            seeds: Vec::new(),
            cluster_name: CLUSTER_NAME_DEFAULT.to_string(),
            advertise: None,
            peer_queue_bytes_max: PEER_QUEUE_BYTES_MAX_DEFAULT,
            link_heartbeat_interval_ms: LINK_HEARTBEAT_INTERVAL_MS_DEFAULT,
            link_timeout_ms: LINK_TIMEOUT_MS_DEFAULT,
            metadata_commit_timeout_ms: METADATA_COMMIT_TIMEOUT_MS_DEFAULT,
            metadata_snapshot_entries_interval: super::snapshot::METADATA_SNAPSHOT_ENTRIES_INTERVAL_DEFAULT,
        }
    }
}

/// This machine's host name (`localhost` when it has none).
pub fn host_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|name| name.trim().to_string()).unwrap_or_default();
    if host.is_empty() {
        "localhost".to_string()
    } else {
        host
    }
}

/// `lepus@HOSTNAME` (RabbitMQ's default is `rabbit@HOSTNAME`).
pub fn default_node_name() -> String {
    format!("lepus@{}", host_name())
}

/// A name without `@host` gets this machine's host name, as RabbitMQ completes `rabbit`.
fn complete_node_name(name: &str) -> Result<String, String> {
    let name = name.trim();
    if name.is_empty() || name.len() > 255 || name.chars().any(|character| character.is_whitespace() || character.is_control()) {
        return Err(format!("node_name '{name}' must have 1 to 255 bytes and no spaces"));
    }
    match name.split_once('@') {
        Some((local, host)) if !local.is_empty() && !host.is_empty() && !host.contains('@') => Ok(name.to_string()),
        Some(_) => Err(format!("node_name '{name}' must be name@host")),
        None => Ok(format!("{name}@{}", host_name())),
    }
}

/// Checks a `host:port` the links can dial (the host is resolved when dialled, not now: a seed
/// whose name does not resolve yet may come up later).
fn check_address(setting: &str, address: &str) -> Result<(), String> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!("{setting} '{address}' must be host:port"));
    };
    match port.parse::<u16>() {
        Ok(port) if port != 0 && !host.is_empty() => Ok(()),
        _ => Err(format!("{setting} '{address}' must be host:port with a port from 1 to 65535")),
    }
}

impl ClusterSettings {
    /// Merges what flags, environment and file gave with the defaults, and checks it.
    pub fn resolve(
        node_name: Option<String>,
        cluster_port: Option<u16>,
        seeds: Option<Vec<String>>,
        cluster_name: Option<String>,
        advertise: Option<String>,
    ) -> Result<ClusterSettings, String> {
        let seeds: Vec<String> =
            seeds.unwrap_or_default().into_iter().map(|seed| seed.trim().to_string()).filter(|seed| !seed.is_empty()).collect();
        for seed in &seeds {
            check_address("cluster_seeds", seed)?;
        }
        if let Some(advertise) = &advertise {
            check_address("cluster_advertise", advertise)?;
        }
        let cluster_port = cluster_port.unwrap_or(if seeds.is_empty() { 0 } else { CLUSTER_PORT_DEFAULT });
        if cluster_port == 0 && !seeds.is_empty() {
            return Err("cluster_seeds needs a cluster_port (0 turns clustering off)".to_string());
        }
        let cluster_name = cluster_name.unwrap_or_else(|| CLUSTER_NAME_DEFAULT.to_string());
        if cluster_name.is_empty() || cluster_name.len() > 255 {
            return Err("cluster_name must have 1 to 255 bytes".to_string());
        }
        let node_name = match node_name {
            Some(name) => complete_node_name(&name)?,
            None => default_node_name(),
        };
        Ok(ClusterSettings { node_name, cluster_port, seeds, cluster_name, advertise, ..ClusterSettings::default() })
    }

    /// Whether this node joins a cluster (else it runs alone, exactly as an unclustered node).
    pub fn enabled(&self) -> bool {
        self.cluster_port != 0
    }

    /// The address other nodes dial to reach this one: `--cluster-advertise`, else the one seed
    /// whose port is the cluster port and whose host is an address of this machine, else (a node
    /// that is not a seed) the bind address, or the host name when binding every address. An
    /// error when several seeds could be this node (the operator sets `--cluster-advertise`).
    pub fn advertised_address(&self, bind: std::net::IpAddr) -> Result<String, String> {
        if let Some(advertise) = &self.advertise {
            return Ok(advertise.clone());
        }
        let own: Vec<&String> = self.seeds.iter().filter(|seed| self.is_local_seed(seed)).collect();
        match own.as_slice() {
            [one] => Ok((*one).clone()),
            [] if bind.is_unspecified() => Ok(format!("{}:{}", host_name(), self.cluster_port)),
            [] => Ok(SocketAddr::new(bind, self.cluster_port).to_string()),
            _ => Err(format!("several cluster_seeds {own:?} could be this node: set cluster_advertise to the one that is")),
        }
    }

    /// Whether a seed names this machine at the cluster port: its port is ours and one of its
    /// host's addresses can be bound here (an address of a local interface).
    fn is_local_seed(&self, seed: &str) -> bool {
        let Ok(addresses) = seed.to_socket_addrs() else { return false };
        addresses.into_iter().any(|address: SocketAddr| {
            address.port() == self.cluster_port && std::net::UdpSocket::bind(SocketAddr::new(address.ip(), 0)).is_ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clustering_is_off_without_port_or_seeds_and_names_are_completed() {
        let settings = ClusterSettings::resolve(None, None, None, None, None).expect("resolves");
        assert!(!settings.enabled());
        assert!(settings.node_name.starts_with("lepus@"));
        let seeds = Some(vec!["127.0.0.1:25672".to_string(), " 127.0.0.1:25673 ".to_string()]);
        let settings = ClusterSettings::resolve(Some("n1".into()), None, seeds, None, None).expect("resolves");
        assert_eq!(settings.cluster_port, CLUSTER_PORT_DEFAULT, "seeds turn the default port on");
        assert_eq!(settings.seeds, ["127.0.0.1:25672", "127.0.0.1:25673"]);
        assert_eq!(settings.node_name, format!("n1@{}", host_name()));
        let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
        assert_eq!(settings.advertised_address(loopback).expect("the seed on our port"), "127.0.0.1:25672");
        for (name, seeds, port, expected) in [
            (Some("a@b@c"), None, None, "must be name@host"),
            (None, Some(vec!["nohost".to_string()]), None, "must be host:port"),
            (None, Some(vec!["h:0".to_string()]), None, "port from 1"),
            (None, Some(vec!["h:1".to_string()]), Some(0), "needs a cluster_port"),
        ] {
            let error = ClusterSettings::resolve(name.map(String::from), port, seeds, None, None).expect_err(expected);
            assert!(error.contains(expected), "{error}");
        }
        let settings = ClusterSettings::resolve(None, Some(25680), Some(vec!["127.0.0.1:1".into()]), None, None).expect("resolves");
        assert_eq!(settings.advertised_address(loopback).expect("not a seed: the bind address"), "127.0.0.1:25680");
        let seeds = Some(vec!["127.0.0.1:25680".into(), "localhost:25680".into()]);
        let settings = ClusterSettings::resolve(None, Some(25680), seeds, None, None).expect("resolves");
        assert!(settings.advertised_address(loopback).expect_err("two seeds are us").contains("cluster_advertise"));
    }
}
