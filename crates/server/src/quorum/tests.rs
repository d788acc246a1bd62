//! Three nodes' quorum hosts in one process, wired by an in-memory network that carries every
//! Raft message through the wire frame (`replication::transport::encode_frame`), each node on its
//! own in-memory disk. The node-to-node protocol is the one the cluster's links carry: Raft
//! messages, proposals forwarded inside them, outcomes and deliveries from each node's own apply.

use super::tickets::SlotOutcome;
use super::{HostConfig, QuorumHost, QuorumQueue};
use crate::queue_type::Settlement;
use crate::shared::{ChannelShared, ConnectionShared, ConsumerHandle, Outbound};
use amqp_codec::{BasicProperties, ContentHeader, FieldTable, ShortStr};
use broker_core::vhost::{QueueDefinition, QueueType};
use broker_core::Message;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use replication::transport::{decode_frame, encode_frame, PeerTransport, ShardId};
use replication::Message as RaftMessage;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use storage::memory_file_system::MemoryFileSystem;
use tokio::sync::mpsc;

/// Every node's host, reachable while it runs and its links are not cut.
#[derive(Default)]
struct Network {
    hosts: RwLock<BTreeMap<u64, Weak<QuorumHost>>>,
    cut: Mutex<HashSet<u64>>,
    /// Nodes the leaders' appends do not reach (a busy node falling behind); every other
    /// message, heartbeats and snapshots included, still does.
    appends_lost: Mutex<HashSet<u64>>,
}

/// One node's side of the network.
struct Link {
    network: Arc<Network>,
    from: u64,
}

impl PeerTransport for Link {
    fn send(&self, shard: ShardId, message: RaftMessage) -> bool {
        let cut = self.network.cut.lock();
        if cut.contains(&self.from) || cut.contains(&message.to) {
            return false;
        }
        drop(cut);
        if message.get_msg_type() == replication::MessageType::MsgAppend && self.network.appends_lost.lock().contains(&message.to) {
            return false;
        }
        let Some(host) = self.network.hosts.read().get(&message.to).and_then(Weak::upgrade) else { return false };
        let frame = Bytes::from(encode_frame(shard, &message).expect("a raft message encodes"));
        let (shard, message) = decode_frame(frame).expect("a frame decodes");
        host.receive(shard, message);
        true
    }
}

const NODES: [u64; 3] = [1, 2, 3];
const WAIT: Duration = Duration::from_secs(20);

struct Cluster {
    network: Arc<Network>,
    hosts: BTreeMap<u64, Arc<QuorumHost>>,
}

fn config(node: u64) -> HostConfig {
    config_on(node, &MemoryFileSystem::new())
}

/// A node's settings on a file system the test keeps (to fill its disk).
fn config_on(node: u64, file_system: &MemoryFileSystem) -> HostConfig {
    HostConfig {
        node_id: node,
        voters: NODES.to_vec(),
        shards: 3,
        data_dir: std::path::PathBuf::from("/data"),
        tick_ms: 10,
        election_ticks: 10,
        heartbeat_ticks: 2,
        snapshot_entries_interval: 64,
        node_down_ticks: 30,
        file_system: file_system.shared(),
        dead_letter_retry_interval_ms: super::DEAD_LETTER_RETRY_INTERVAL_MS_DEFAULT,
    }
}

impl Cluster {
    fn start() -> Cluster {
        Cluster::start_with(|_| {})
    }

    /// A cluster whose nodes' configuration `adjust` changed.
    fn start_with(adjust: impl Fn(&mut HostConfig)) -> Cluster {
        let network = Arc::new(Network::default());
        let mut hosts = BTreeMap::new();
        for node in NODES {
            let link = Arc::new(Link { network: network.clone(), from: node });
            let mut config = config(node);
            adjust(&mut config);
            let host = QuorumHost::start(config, link, None).expect("a host starts");
            for member in NODES {
                host.set_member_name(member, format!("n{member}@localhost"));
            }
            network.hosts.write().insert(node, Arc::downgrade(&host));
            hosts.insert(node, host);
        }
        Cluster { network, hosts }
    }

    /// Stops a node's host (its process died): it sends and receives nothing from now on.
    fn kill(&mut self, node: u64) {
        self.network.cut.lock().insert(node);
        if let Some(host) = self.hosts.remove(&node) {
            host.stop();
        }
    }

    /// The leader of the shard of `key`, once every running node knows the same one.
    fn leader_of(&self, key: &[u8]) -> u64 {
        wait_for("a leader every node knows", || {
            let leaders: HashSet<u64> =
                self.hosts.values().map(|host| host.shard_for(key).figures.leader.load(std::sync::atomic::Ordering::Relaxed)).collect();
            let leader = leaders.iter().next().copied().filter(|leader| leaders.len() == 1 && self.hosts.contains_key(leader));
            leader
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for host in self.hosts.values() {
            host.stop();
        }
    }
}

fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn definition(name: &str) -> QueueDefinition {
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type", amqp_codec::FieldValue::LongStr(Bytes::from_static(b"quorum")));
    QueueDefinition {
        name: ShortStr::from(name),
        durable: true,
        exclusive_owner: None,
        auto_delete: false,
        arguments,
        queue_type: QueueType::Quorum,
    }
}

fn message(body: String) -> Arc<Message> {
    let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
    let body = Bytes::from(body);
    Arc::new(Message {
        exchange: ShortStr::from(""),
        routing_key: ShortStr::from("q"),
        header: ContentHeader::from_properties(60, body.len() as u64, &properties),
        body,
        published_at_ns: 0,
        bcc_routing_keys: None,
    })
}

/// A consumer whose connection has no socket: its deliveries come out of the receiver.
fn consumer(tag: &str, prefetch: u32) -> (Arc<ConsumerHandle>, mpsc::UnboundedReceiver<Outbound>) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let connection = Arc::new(ConnectionShared::detached(7, sender));
    let channel = Arc::new(ChannelShared::new(1, connection));
    let handle = Arc::new(ConsumerHandle {
        tag: ShortStr::from(tag),
        channel,
        no_ack: false,
        prefetch,
        unacked: Default::default(),
        priority: 0,
        cancelled: Default::default(),
    });
    (handle, receiver)
}

/// Deliveries as (body, redelivered, position), until `count` came or the wait ran out.
fn deliveries(consumer: &ConsumerHandle, receiver: &mut mpsc::UnboundedReceiver<Outbound>, count: usize) -> Vec<(String, bool, u64)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    while got.len() < count && Instant::now() < deadline {
        match receiver.try_recv() {
            Ok(Outbound::Deliver { delivery_tag, redelivered, message, .. }) => {
                let position = consumer.channel.ledger.lock().unacked.get(&delivery_tag).expect("on the ledger").position;
                got.push((String::from_utf8_lossy(&message.body).to_string(), redelivered, position));
            }
            Ok(_) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    got
}

/// Publishes `bodies` and waits for every confirm.
fn publish_confirmed(queue: &QuorumQueue, bodies: impl Iterator<Item = String>) -> usize {
    let slots: Vec<_> = bodies
        .map(|body| match queue.publish(message(body)) {
            crate::queue_type::PublishOutcome::Accepted(crate::queue_type::ConfirmTicket::Committed(slot)) => slot,
            other => panic!("a publish to a quorum queue waits for its commit, not {other:?}"),
        })
        .collect();
    for slot in &slots {
        wait_for("a publish's commit", || slot.outcome());
        assert_eq!(slot.outcome(), Some(SlotOutcome::Accepted));
    }
    slots.len()
}

/// The queue on every running node, each with its id known.
fn queue_on_every_node(cluster: &Cluster, declaring: u64, name: &str) -> BTreeMap<u64, Arc<QuorumQueue>> {
    let mut queues = BTreeMap::new();
    for (node, host) in &cluster.hosts {
        let queue = match *node == declaring {
            true => QuorumQueue::declare(definition(name), "/", host, no_expiry(), 0),
            false => QuorumQueue::recover(definition(name), "/", host, no_expiry(), 0),
        };
        queues.insert(*node, queue);
    }
    for queue in queues.values() {
        wait_for("the queue's id on every node", || (queue.id() != 0).then_some(()));
    }
    let ids: HashSet<u64> = queues.values().map(|queue| queue.id()).collect();
    assert_eq!(ids.len(), 1, "every node found the same queue");
    queues
}

#[test]
fn a_message_published_on_a_follower_is_delivered_to_a_consumer_on_another_node() {
    let cluster = Cluster::start();
    let key = super::queue::name_key("/", &ShortStr::from("q1"));
    let leader = cluster.leader_of(&key);
    let followers: Vec<u64> = NODES.iter().copied().filter(|node| *node != leader).collect();
    let (publishing, consuming) = (followers[0], followers[1]);
    let queues = queue_on_every_node(&cluster, publishing, "q1");
    let (handle, mut receiver) = consumer("c", 100);
    queues[&consuming].consume(handle.clone(), false, || {}).expect("the consumer is added");
    publish_confirmed(&queues[&publishing], (0..200).map(|number| format!("m{number:03}")));
    // The plan gives the consumer its prefetch of 100, and the next 100 once those are acked
    // (on the consuming node, through the log).
    let mut got = Vec::new();
    for _ in 0..2 {
        let window = deliveries(&handle, &mut receiver, 100);
        assert_eq!(window.len(), 100, "a full prefetch window");
        std::thread::sleep(Duration::from_millis(100));
        assert!(receiver.try_recv().is_err(), "nothing past the prefetch before an ack");
        let positions: Vec<u64> = window.iter().map(|(_, _, position)| *position).collect();
        handle.channel.ledger.lock().unacked.clear();
        queues[&consuming].settle(&positions, Settlement::Ack);
        got.extend(window);
    }
    let bodies: Vec<&str> = got.iter().map(|(body, _, _)| body.as_str()).collect();
    let expected: Vec<String> = (0..200).map(|number| format!("m{number:03}")).collect();
    assert_eq!(bodies, expected.iter().map(String::as_str).collect::<Vec<_>>(), "in order, each once");
    assert!(got.iter().all(|(_, redelivered, _)| !redelivered));
    for queue in queues.values() {
        wait_for("every node to apply the acks", || {
            let snapshot = queue.snapshot();
            (snapshot.ready == 0 && snapshot.unacked == 0 && snapshot.stats.acked == 200).then_some(())
        });
    }
    let replicas = queues[&publishing].replicas().expect("a quorum queue has replicas");
    assert_eq!(replicas.members, vec!["n1@localhost", "n2@localhost", "n3@localhost"]);
    assert_eq!(replicas.leader, Some(format!("n{leader}@localhost")));
}

#[test]
fn when_the_leader_dies_a_new_one_serves_the_queue_and_redelivers_what_the_dead_node_held() {
    let mut cluster = Cluster::start();
    let key = super::queue::name_key("/", &ShortStr::from("q2"));
    let leader = cluster.leader_of(&key);
    let followers: Vec<u64> = NODES.iter().copied().filter(|node| *node != leader).collect();
    let queues = queue_on_every_node(&cluster, followers[0], "q2");
    // A consumer on the leader's node holds ten messages, unacked, when that node dies.
    let (doomed, mut doomed_receiver) = consumer("doomed", 10);
    queues[&leader].consume(doomed.clone(), false, || {}).expect("added");
    let published = publish_confirmed(&queues[&followers[0]], (0..30).map(|number| format!("a{number:02}")));
    let held = deliveries(&doomed, &mut doomed_receiver, 10);
    assert_eq!(held.len(), 10);
    cluster.kill(leader);
    let new_leader = cluster.leader_of(&key);
    assert_ne!(new_leader, leader);
    let survivor = followers[1];
    let (handle, mut receiver) = consumer("survivor", 1000);
    queues[&survivor].consume(handle.clone(), false, || {}).expect("the new leader adds the consumer");
    // Published through a surviving node after the failover: confirmed too.
    let more = publish_confirmed(&queues[&followers[0]], (0..10).map(|number| format!("b{number:02}")));
    let got = deliveries(&handle, &mut receiver, published + more);
    let bodies: HashSet<&str> = got.iter().map(|(body, _, _)| body.as_str()).collect();
    assert_eq!(got.len(), published + more, "every confirmed message, each once: {got:?}");
    assert_eq!(bodies.len(), published + more);
    let held_bodies: HashSet<&str> = held.iter().map(|(body, _, _)| body.as_str()).collect();
    for (body, redelivered, _) in &got {
        assert_eq!(*redelivered, held_bodies.contains(body.as_str()), "{body}: redelivered only if the dead node held it");
    }
}

#[test]
fn a_consumer_gets_the_queue_in_order_when_several_threads_dispatch_to_it() {
    // Held deliveries are sent by whichever thread dispatches: the shard's, and connections'
    // tasks after a writer drained or an ack. Two at once must still keep the queue's order.
    use crate::shared::OUTBOUND_DELIVERIES_MAX;
    use std::sync::atomic::Ordering;
    const ROUNDS: usize = 15;
    const PER_ROUND: usize = 100;
    let cluster = Cluster::start();
    let queues = queue_on_every_node(&cluster, 1, "ordered");
    let consuming = queues[&2].clone();
    // Without a prefetch, the consumer's credit covers every message: no acks needed.
    let (handle, mut receiver) = consumer("c", 0);
    consuming.consume(handle.clone(), false, || {}).expect("the consumer is added");
    let outbound = &handle.channel.connection.outbound_deliveries;
    for round in 0..ROUNDS {
        // The writer is full: the round's deliveries are held.
        outbound.store(OUTBOUND_DELIVERIES_MAX, Ordering::Release);
        let numbers = round * PER_ROUND..(round + 1) * PER_ROUND;
        publish_confirmed(&queues[&3], numbers.map(|number| format!("m{number:05}")));
        std::thread::sleep(Duration::from_millis(50));
        outbound.store(0, Ordering::Release);
        let start = Arc::new(std::sync::Barrier::new(2));
        let dispatchers: Vec<_> = (0..2)
            .map(|_| {
                let (queue, start) = (consuming.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    queue.dispatch();
                })
            })
            .collect();
        for dispatcher in dispatchers {
            dispatcher.join().expect("a dispatcher ends");
        }
    }
    let got = deliveries(&handle, &mut receiver, ROUNDS * PER_ROUND);
    let bodies: Vec<&str> = got.iter().map(|(body, _, _)| body.as_str()).collect();
    let first_out_of_order = bodies.windows(2).position(|pair| pair[0] > pair[1]);
    assert_eq!(first_out_of_order, None, "deliveries out of order: {:?}", first_out_of_order.map(|at| &bodies[at..at + 2]));
    assert_eq!(bodies.len(), ROUNDS * PER_ROUND, "every message delivered");
    let expected = (0..ROUNDS * PER_ROUND).map(|number| format!("m{number:05}"));
    assert!(bodies.iter().zip(expected).all(|(got, expected)| *got == expected), "every message once");
}

#[test]
fn a_node_released_while_cut_off_serves_its_clients_again_once_the_cut_heals() {
    // Cut off past `node_down_ticks` with a consumer holding messages, a follower is released
    // by the leader: its consumer cancelled, its messages given back, its proposer retired.
    // Healed, the node must publish and consume again (it used to be refused until a restart).
    let cluster = Cluster::start();
    let key = super::queue::name_key("/", &ShortStr::from("q3"));
    let leader = cluster.leader_of(&key);
    let follower = NODES.iter().copied().find(|node| *node != leader).expect("a follower");
    let queues = queue_on_every_node(&cluster, leader, "q3");
    let (held, mut held_receiver) = consumer("held", 10);
    queues[&follower].consume(held.clone(), false, || {}).expect("added");
    publish_confirmed(&queues[&leader], (0..5).map(|number| format!("a{number}")));
    assert_eq!(deliveries(&held, &mut held_receiver, 5).len(), 5);
    let commit_index = || cluster.hosts[&leader].shard_for(&key).figures.commit_index.load(std::sync::atomic::Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(200));
    let before_cut = commit_index();
    cluster.network.cut.lock().insert(follower);
    // Nothing else is proposed meanwhile: the entry committed is the leader's release of the node.
    wait_for("the leader to release the cut-off node", || (commit_index() > before_cut).then_some(()));
    cluster.network.cut.lock().remove(&follower);
    wait_for("the healed node to learn that its consumer was cancelled", || {
        held.cancelled.load(std::sync::atomic::Ordering::Acquire).then_some(())
    });
    // Published through the healed node: committed and confirmed.
    publish_confirmed(&queues[&follower], (0..5).map(|number| format!("b{number}")));
    let (handle, mut receiver) = consumer("after", 100);
    queues[&follower].consume(handle.clone(), false, || {}).expect("the healed node adds a consumer");
    let got = deliveries(&handle, &mut receiver, 10);
    let bodies: Vec<&str> = got.iter().map(|(body, _, _)| body.as_str()).collect();
    assert_eq!(bodies, ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2", "b3", "b4"], "the given-back messages first, then the new ones");
    assert!(got.iter().take(5).all(|(_, redelivered, _)| *redelivered), "the given-back ones are redelivered");
}

/// A clock for a queue without x-expires.
fn no_expiry() -> crate::queue_runtime::ExpiryClock {
    crate::queue_runtime::ExpiryClock::new(Arc::default(), None, None, 0)
}

impl Cluster {
    /// A node that joins later: its shards start from the founding voters, and every running
    /// node's host is told the cluster's members now include it.
    fn join(&mut self, node: u64) {
        let link = Arc::new(Link { network: self.network.clone(), from: node });
        let host = QuorumHost::start(config(node), link, None).expect("a host starts");
        self.network.hosts.write().insert(node, Arc::downgrade(&host));
        self.hosts.insert(node, host);
        let members: Vec<u64> = self.hosts.keys().copied().collect();
        self.set_members(&members);
    }

    fn set_members(&self, members: &[u64]) {
        for host in self.hosts.values() {
            for member in members {
                host.set_member_name(*member, format!("n{member}@localhost"));
            }
            host.set_cluster_members(members.to_vec());
        }
    }

    /// Waits until every shard on every running node has these voters and learners: every shard
    /// changes its members on its own, one change at a time, and a shard left behind (still
    /// holding a killed voter) would stop a later step, however long it waits.
    fn wait_members(&self, voters: &[u64], learners: &[u64]) {
        let expected = (voters.to_vec(), learners.to_vec());
        wait_for("every shard's members on every node", || {
            self.hosts
                .values()
                .flat_map(|host| host.shards.iter())
                .all(|shard| {
                    let (mut voters, mut learners) = shard.figures.members.lock().clone();
                    voters.sort_unstable();
                    learners.sort_unstable();
                    (voters, learners) == expected
                })
                .then_some(())
        });
    }
}

#[test]
fn a_joined_node_serves_as_a_learner_and_replaces_a_forgotten_voter() {
    let mut cluster = Cluster::start();
    let key = super::queue::name_key("/", &ShortStr::from("q-join"));
    cluster.leader_of(&key);
    let before = queue_on_every_node(&cluster, 1, "q-join");
    publish_confirmed(&before[&1], (0..10).map(|number| format!("a{number}")));
    cluster.join(4);
    cluster.wait_members(&[1, 2, 3], &[4]);
    let joined = QuorumQueue::recover(definition("q-join"), "/", &cluster.hosts[&4], no_expiry(), 0);
    wait_for("the queue's id on the joined node", || (joined.id() == before[&1].id()).then_some(()));
    // Published through the learner (forwarded to the leader), consumed there from its own apply.
    publish_confirmed(&joined, (10..20).map(|number| format!("a{number}")));
    let (handle, mut receiver) = consumer("c4", 100);
    joined.consume(handle.clone(), false, || {}).expect("the consumer is added");
    let got = deliveries(&handle, &mut receiver, 20);
    let bodies: Vec<String> = got.iter().map(|(body, _, _)| body.clone()).collect();
    assert_eq!(bodies, (0..20).map(|number| format!("a{number}")).collect::<Vec<_>>());
    let positions: Vec<u64> = got.iter().map(|(_, _, position)| *position).collect();
    handle.channel.ledger.lock().unacked.clear();
    joined.settle(&positions, Settlement::Ack);
    joined.cancel(&handle);
    for queue in before.values() {
        wait_for("the acks applied on every node", || (queue.snapshot().ready == 0 && queue.snapshot().unacked == 0).then_some(()));
    }
    // Node 3 dies and is forgotten: removed from the shard, the learner promoted.
    cluster.kill(3);
    cluster.set_members(&[1, 2, 4]);
    cluster.wait_members(&[1, 2, 4], &[]);
    // With node 2 gone too, nodes 1 and 4 are a majority of the voters: commits go on.
    cluster.kill(2);
    publish_confirmed(&before[&1], (20..25).map(|number| format!("a{number}")));
    wait_for("the joined node applied them", || (joined.snapshot().ready == 5).then_some(()));
    // Removing node 4 now would leave voters 1 and 2 with one of them running: refused.
    let host = &cluster.hosts[&1];
    wait_for("node 2 quiet on node 1", || host.check_removal(4, |_| false).is_err().then_some(()));
    // Whether a voter runs is judged by when it was last heard from: under load node 4 may look
    // quiet for a moment (CI's unit tests run in parallel), so wait rather than sample once.
    wait_for("removing node 2 allowed: voters 1 and 4 both run", || host.check_removal(2, |_| false).is_ok().then_some(()));
}

/// Every node proposes each declaration and deletion of a cluster's queue as it applies them. A
/// node applying a declaration, its deletion and a second declaration of the name late must not
/// find the second queue with its copy of the first declaration: its copy of the deletion would
/// then delete the second queue, messages and all (CI saw a joined cluster's queue emptied so).
#[test]
fn a_slow_node_s_copy_of_a_deleted_incarnation_never_takes_the_queue_declared_again() {
    let cluster = Cluster::start();
    let declared_on =
        |node: u64, incarnation: u64| QuorumQueue::declare(definition("reborn"), "/", &cluster.hosts[&node], no_expiry(), incarnation);
    let first = declared_on(2, 10);
    wait_for("the first incarnation's id", || (first.id() != 0).then_some(()));
    first.delete();
    let second = declared_on(2, 20);
    wait_for("the second incarnation's id", || (second.id() != 0).then_some(()));
    assert_ne!(first.id(), second.id());
    publish_confirmed(&second, (0..3).map(|number| format!("kept{number}")));

    // Node 1 applies the three definitions only now: its deletion of the first waits for its
    // copy of the first declaration, and runs behind its copy of the second.
    let late_first = declared_on(1, 10);
    let late_second = declared_on(1, 20);
    late_first.delete();
    wait_for("the second incarnation's id on node 1", || (late_second.id() == second.id()).then_some(()));
    assert_ne!(late_first.id(), second.id(), "the late copy of the first declaration names the second queue");
    let (handle, mut receiver) = consumer("c-reborn", 10);
    late_second.consume(handle.clone(), false, || {}).expect("the queue declared again is still there");
    let bodies: Vec<String> = deliveries(&handle, &mut receiver, 3).into_iter().map(|(body, _, _)| body).collect();
    assert_eq!(bodies, vec!["kept0", "kept1", "kept2"]);
}

/// The management sampler reads a quorum queue's figures only when a commit changed them, on
/// every node alike (an idle queue costs it one atomic load).
#[test]
fn an_idle_quorum_queue_is_not_sampled_again_until_a_commit_changes_it() {
    let cluster = Cluster::start();
    let queues = queue_on_every_node(&cluster, 1, "sampled");
    publish_confirmed(&queues[&1], (0..3).map(|number| format!("s{number}")));
    for queue in queues.values() {
        wait_for("the publishes sampled", || queue.sample_if_changed().filter(|snapshot| snapshot.ready == 3).map(|_| ()));
        // The commit that set the figures read may set the flag just after they were read.
        std::thread::sleep(Duration::from_millis(50));
        let _ = queue.sample_if_changed();
        assert!(queue.sample_if_changed().is_none(), "sampled again with nothing committed");
    }
    publish_confirmed(&queues[&2], std::iter::once("s3".to_string()));
    for queue in queues.values() {
        wait_for("the next publish sampled", || queue.sample_if_changed().filter(|snapshot| snapshot.ready == 4).map(|_| ()));
    }
}

/// A node that formed a cluster of one runs its shards as groups of one. Joining the cluster, it
/// leaves them (`leave_own_shards`) and its shards open empty: the founding voters the join names
/// start their logs, every shard's leader adds it as a learner, and it serves the cluster's
/// queues, never its own groups. One that holds a queue is refused, naming it, and keeps it.
#[test]
fn a_former_cluster_of_one_leaves_its_own_shards_and_joins_the_clusters_as_a_learner() {
    let mut cluster = Cluster::start();
    let key = super::queue::name_key("/", &ShortStr::from("q-rejoin"));
    cluster.leader_of(&key);
    let founding = queue_on_every_node(&cluster, 1, "q-rejoin");
    publish_confirmed(&founding[&1], (0..5).map(|number| format!("r{number}")));

    let alone = |node: u64| {
        let link = Arc::new(Link { network: cluster.network.clone(), from: node });
        let host = QuorumHost::start(HostConfig { voters: vec![node], ..config(node) }, link, None).expect("a host starts");
        wait_for("the node alone leads its shards", || {
            host.shards.iter().all(|shard| shard.figures.is_leader.load(std::sync::atomic::Ordering::Relaxed)).then_some(())
        });
        host
    };
    // Holding a quorum queue of its own: refused, nothing changed.
    let holding = alone(5);
    let own = QuorumQueue::declare(definition("q-own"), "/", &holding, no_expiry(), 0);
    publish_confirmed(&own, std::iter::once("kept".to_string()));
    let refused = holding.leave_own_shards().expect_err("a node holding a queue is refused");
    assert!(refused.contains("quorum queue 'q-own' in vhost '/'"), "{refused}");
    assert_eq!(own.snapshot().ready, 1);
    holding.stop();

    // Holding nothing: it leaves its groups and joins the cluster's shards as a learner.
    let host = alone(4);
    host.leave_own_shards().expect("a node holding nothing leaves its own shards");
    // Its figures are published at the end of each shard's next round.
    wait_for("the node leads none of its shards", || {
        host.shards.iter().all(|shard| !shard.figures.is_leader.load(std::sync::atomic::Ordering::Relaxed)).then_some(())
    });
    host.set_initial_voters(NODES.to_vec());
    cluster.network.hosts.write().insert(4, Arc::downgrade(&host));
    cluster.hosts.insert(4, host);
    cluster.set_members(&[1, 2, 3, 4]);
    cluster.wait_members(&[1, 2, 3], &[4]);
    let joined = QuorumQueue::recover(definition("q-rejoin"), "/", &cluster.hosts[&4], no_expiry(), 0);
    wait_for("the queue's id on the joined node", || (joined.id() == founding[&1].id()).then_some(()));
    publish_confirmed(&joined, (5..10).map(|number| format!("r{number}")));
    for queue in founding.values() {
        wait_for("every founding node applied them", || (queue.snapshot().ready == 10).then_some(()));
    }
}

/// Publishes one message without waiting: its confirm slot.
fn publish_unconfirmed(queue: &QuorumQueue, body: &str) -> Arc<super::tickets::CommitSlot> {
    match queue.publish(message(body.to_string())) {
        crate::queue_type::PublishOutcome::Accepted(crate::queue_type::ConfirmTicket::Committed(slot)) => slot,
        other => panic!("a publish to a quorum queue waits for its commit, not {other:?}"),
    }
}

#[test]
fn a_follower_that_installs_a_snapshot_performs_the_deliveries_and_confirms_the_snapshot_skipped() {
    // A follower behind the leader's compacted log gets a snapshot instead of the entries. The
    // deliveries those entries made to its consumer used to be lost: unacked in the machine,
    // counted against the prefetch, never sent (a consumer at a few thousand messages a second,
    // or none). And its publish committed in them was nacked once a later one was confirmed.
    // The follower still answers heartbeats; on a loaded machine it may not for the usual 300 ms
    // of `node_down_ticks`, and its consumer would be released as gone: given 10 s here.
    let cluster = Cluster::start_with(|config| config.node_down_ticks = 1000);
    let key = super::queue::name_key("/", &ShortStr::from("q-behind"));
    let leader = cluster.leader_of(&key);
    let behind = NODES.iter().copied().find(|node| *node != leader).expect("a follower");
    let queues = queue_on_every_node(&cluster, leader, "q-behind");
    let (handle, mut receiver) = consumer("behind", 5);
    queues[&behind].consume(handle.clone(), false, || {}).expect("the consumer is added");
    cluster.network.appends_lost.lock().insert(behind);
    // The plan hands the consumer its prefetch in entries the follower does not get, one of
    // them holds the follower's own publish, and the leader compacts past them all (every 64
    // entries here): one entry per publish.
    publish_confirmed(&queues[&leader], (0..5).map(|number| format!("m{number:03}")));
    let early = publish_unconfirmed(&queues[&behind], "early");
    for number in 5..200 {
        publish_confirmed(&queues[&leader], std::iter::once(format!("m{number:03}")));
    }
    let shard = cluster.hosts[&behind].shard_for(&key);
    let installed = || shard.figures.snapshots_installed.load(std::sync::atomic::Ordering::Relaxed);
    cluster.network.appends_lost.lock().remove(&behind);
    wait_for("the follower installs a snapshot", || (installed() > 0).then_some(()));
    let late = publish_unconfirmed(&queues[&behind], "late");
    for slot in [&early, &late] {
        wait_for("a confirm of the follower's publish", || slot.outcome());
    }
    assert_eq!((early.outcome(), late.outcome()), (Some(SlotOutcome::Accepted), Some(SlotOutcome::Accepted)), "neither is nacked");
    // The consumer gets the five messages the skipped entries delivered to it, then the next
    // five once it acks them.
    let mut windows = Vec::new();
    for _ in 0..2 {
        let window = deliveries(&handle, &mut receiver, 5);
        let positions: Vec<u64> = window.iter().map(|(_, _, position)| *position).collect();
        handle.channel.ledger.lock().unacked.clear();
        queues[&behind].settle(&positions, Settlement::Ack);
        windows.push(window.into_iter().map(|(body, _, _)| body).collect::<Vec<_>>());
    }
    let skipped: Vec<String> = (0..5).map(|number| format!("m{number:03}")).collect();
    assert_eq!(windows[0], skipped, "the deliveries the snapshot skipped, in order");
    assert_eq!(windows[1].len(), 5, "the prefetch is whole again: {windows:?}");
    assert!(windows[1].iter().all(|body| !skipped.contains(body)), "each once: {windows:?}");
}

/// Three hosts, each on a file system the test keeps.
fn start_with_disks() -> (Cluster, BTreeMap<u64, MemoryFileSystem>) {
    let network = Arc::new(Network::default());
    let mut hosts = BTreeMap::new();
    let mut disks = BTreeMap::new();
    for node in NODES {
        let disk = MemoryFileSystem::new();
        let link = Arc::new(Link { network: network.clone(), from: node });
        let host = QuorumHost::start(config_on(node, &disk), link, None).expect("a host starts");
        for member in NODES {
            host.set_member_name(member, format!("n{member}@localhost"));
        }
        network.hosts.write().insert(node, Arc::downgrade(&host));
        hosts.insert(node, host);
        disks.insert(node, disk);
    }
    (Cluster { network, hosts }, disks)
}

#[test]
fn a_leader_whose_disk_fills_steps_down_does_not_lead_again_and_catches_up_at_once_when_space_returns() {
    use std::sync::atomic::Ordering;
    use storage::memory_file_system::FaultOperation;
    let (cluster, disks) = start_with_disks();
    let key = super::queue::name_key("/", &ShortStr::from("q-full"));
    let full = cluster.leader_of(&key);
    let others: Vec<u64> = NODES.iter().copied().filter(|node| *node != full).collect();
    let queues = queue_on_every_node(&cluster, others[0], "q-full");
    publish_confirmed(&queues[&others[0]], (0..20).map(|number| format!("before{number:03}")));
    // Every write under the full node's shard logs fails with ENOSPC from now on.
    disks[&full].fail(FaultOperation::Write, libc::ENOSPC, std::path::Path::new("/data/raft"), u64::MAX);
    // The two others are a majority: published through one of them, confirmed (past several
    // snapshots: the full node will need one to catch up).
    for round in 0..100 {
        // A round at a time, so they are many entries, not a few large batches.
        publish_confirmed(&queues[&others[0]], (0..3).map(|number| format!("during{round:03}.{number}")));
    }
    let figures = |node: u64| &cluster.hosts[&node].shard_for(&key).figures;
    let held_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < held_until {
        assert!(!figures(full).is_leader.load(Ordering::Relaxed), "a node that cannot write its log leads");
        std::thread::sleep(Duration::from_millis(5));
    }
    let leader = others.iter().copied().find(|node| figures(*node).is_leader.load(Ordering::Relaxed)).expect("one of the others leads");
    assert_ne!(leader, full);
    disks[&full].clear_faults();
    // Back: caught up through the leader's snapshot sent again at once, not after the lost
    // snapshot's 10 s timeout.
    let cleared_at = Instant::now();
    wait_for("the node that was full to hold every message", || (queues[&full].snapshot().ready == 320).then_some(()));
    assert!(cleared_at.elapsed() < Duration::from_secs(5), "caught up after {:?}", cleared_at.elapsed());
}
