//! The cluster's Prometheus metrics: the metadata group's Raft state (term, commit and applied
//! index, leadership, elections, each member's replication lag on the leader), the members, and
//! the links' counters. Quorum-queue shards add theirs under the same names with their `group`.

use super::Cluster;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;

type Labels = Vec<(&'static str, String)>;

fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn group_gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let family = Family::<Labels, Gauge>::default();
    family.get_or_create(&vec![("group", "metadata".to_string())]).set(as_i64(value));
    registry.register(name, help, family);
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let counter: Counter = Counter::default();
    counter.inc_by(value);
    registry.register(name, help, counter);
}

/// Registers the cluster's metrics as they are now.
pub fn register(registry: &mut Registry, cluster: &Cluster) {
    let view = cluster.group_view();
    group_gauge(registry, "lepus_metadata_raft_term", "Current Raft term of the group on this node", view.term);
    group_gauge(registry, "lepus_metadata_raft_commit_index", "Highest log index known committed by the group", view.commit);
    group_gauge(registry, "lepus_metadata_raft_applied_index", "Highest log index applied on this node", view.applied);
    group_gauge(registry, "lepus_metadata_raft_last_index", "Last index of this node's log of the group", view.last_index);
    group_gauge(
        registry,
        "lepus_metadata_raft_snapshot_index",
        "Index the latest snapshot of the group on this node covers (0: none)",
        view.snapshot_index,
    );
    counter(
        registry,
        "lepus_metadata_snapshots_taken",
        "Snapshots of the metadata group this node took (its log compacted up to each)",
        view.snapshots_taken,
    );
    counter(
        registry,
        "lepus_metadata_snapshots_installed",
        "Snapshots of the metadata group this node installed from a leader",
        view.snapshots_installed,
    );
    counter(
        registry,
        "lepus_metadata_snapshots_sent",
        "Snapshots of the metadata group this node sent to members behind its log",
        view.snapshots_sent,
    );
    group_gauge(
        registry,
        "lepus_metadata_write_held",
        "1 while this node's metadata log cannot be written (a full disk): it takes part in no commit until it can",
        u64::from(view.write_held),
    );
    group_gauge(
        registry,
        "lepus_metadata_raft_leader",
        "1 when this node leads the group",
        u64::from(view.leader == Some(cluster.node_id)),
    );
    let elections = Family::<Labels, Counter>::default();
    elections.get_or_create(&vec![("group", "metadata".to_string())]).inc_by(view.elections);
    registry.register("lepus_metadata_raft_elections", "Elections this node started for the group", elections);
    let lag = Family::<Labels, Gauge>::default();
    for (id, matched) in &view.matched {
        let node = cluster.member_name(*id).unwrap_or_else(|| format!("{id:x}"));
        lag.get_or_create(&vec![("group", "metadata".to_string()), ("node", node)]).set(as_i64(view.last_index.saturating_sub(*matched)));
    }
    registry.register("lepus_metadata_raft_replication_lag_entries", "On the leader: entries a member's log is behind the leader's", lag);
    let members = cluster.members();
    let member_gauge = |registry: &mut Registry, name: &str, help: &str, value: usize| {
        let gauge: Gauge = Gauge::default();
        gauge.set(value as i64);
        registry.register(name, help, gauge);
    };
    member_gauge(registry, "lepus_cluster_members", "Members of the cluster as this node knows them", members.len());
    let running = members.iter().filter(|member| member.running).count();
    member_gauge(registry, "lepus_cluster_members_running", "Members running: this node and those linked to it", running);
    let links = cluster.link_counters();
    let load = |value: &std::sync::atomic::AtomicU64| value.load(Ordering::Relaxed);
    counter(
        registry,
        "lepus_cluster_raft_messages_dropped",
        "Raft messages dropped: no link, or the peer's send queue full",
        load(&links.raft_dropped),
    );
    counter(
        registry,
        "lepus_cluster_sends_refused",
        "Requests and payloads refused: no link, or the peer's send queue full",
        load(&links.sends_refused),
    );
    counter(
        registry,
        "lepus_cluster_handshakes_refused",
        "Link handshakes refused (another cluster, a bad id)",
        load(&links.handshakes_refused),
    );
    counter(registry, "lepus_cluster_links_up", "Links to other nodes that came up", load(&links.links_up));
    counter(registry, "lepus_cluster_links_timed_out", "Links closed after link_timeout_ms of silence", load(&links.links_timed_out));
}
