"""Quorum queues under confirmed load when a node's disk fills: every node's data directory is a
small tmpfs of its own (as root), and the test fills one (or two) with a file of its own, as
another program eating the disk would.

What an operator of RabbitMQ expects, checked here on real processes:
  - a publisher connected to the full node is blocked (connection.blocked: the disk alarm);
  - publishers on the nodes with room keep getting confirms while a majority has room;
  - a node whose shard log write fails (ENOSPC) says so in its log, confirms nothing it could not
    write, does not panic, and catches up once space is back, without a restart;
  - with two of three disks full nothing is confirmed (confirms wait) and nothing is lost;
  - the history checker finds every confirmed message delivered, nothing delivered that was never
    published, and no delivery after an ack known settled.
"""

import os
import signal
import threading
import time

import pika
import pytest

from cluster_harness import Cluster, eventually
from history import History, check, read
from test_disk_full import fill, small_disks
from test_quorum_cluster import declare_quorum, leader_of, queue_info

DISK_BYTES = 64 << 20
DISK_FREE_LIMIT_BYTES = 4 << 20
BODY_PADDING = b"x" * 256
# Long enough that the shard's leader compacts its log past the full node (1,024 entries a
# snapshot), which then needs the leader's snapshot to catch up.
FULL_FOR_S = 6
# Once space is back the node catches up at once: not after the 10 s a lost snapshot waits.
CATCH_UP_S_MAX = 5
SHARDS = 3


@pytest.fixture
def disks(tmp_path):
    """One small tmpfs per node; unmounted after the test."""
    with small_disks(tmp_path, DISK_BYTES) as mounts:
        yield mounts


@pytest.fixture
def small_disk_cluster(tmp_path, disks):
    cluster = Cluster(str(tmp_path))
    for node, disk in zip(cluster.nodes, disks):
        node.data_dir = str(disk / "data")
        node.extra += ["--disk-free-limit-bytes", str(DISK_FREE_LIMIT_BYTES)]
    cluster.start()
    yield cluster
    cluster.stop()
    for node in cluster.nodes:
        node.kill(signal.SIGKILL)


class Publisher(threading.Thread):
    """Publishes `NAME:N` (persistent, confirmed one at a time) through `node` until stopped,
    recording each publish, confirm and connection.blocked/unblocked in the history."""

    def __init__(self, node, name, queue, history):
        super().__init__(daemon=True)
        self.node, self.name, self.queue, self.history = node, name, queue, history
        self.stopping = threading.Event()
        self.blocked = threading.Event()
        self.unblocked = threading.Event()
        self.confirms = 0
        self.unblocked_at = None
        self.first_confirm_after_unblocked_at = None

    def on_blocked(self, _connection, _frame):
        self.history.record(event="blocked", publisher=self.name)
        self.blocked.set()

    def on_unblocked(self, _connection, _frame):
        self.history.record(event="unblocked", publisher=self.name)
        self.unblocked_at = time.time()
        self.unblocked.set()

    def run(self):
        sequence = 0
        while not self.stopping.is_set():
            try:
                connection = pika.BlockingConnection(pika.URLParameters(self.node.url()))
                # On the underlying connection: BlockingConnection runs its own callbacks only
                # inside process_data_events, never while basic_publish waits for a confirm.
                connection._impl.add_on_connection_blocked_callback(self.on_blocked)
                connection._impl.add_on_connection_unblocked_callback(self.on_unblocked)
                channel = connection.channel()
                channel.confirm_delivery()
                while not self.stopping.is_set():
                    sequence += 1
                    self.history.record(event="publish", publisher=self.name, sequence=sequence)
                    body = f"{self.name}:{sequence}:".encode() + BODY_PADDING
                    try:
                        channel.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2))
                        self.history.record(event="confirm", publisher=self.name, sequence=sequence, ack=True)
                        self.confirms += 1
                        if self.unblocked_at and not self.first_confirm_after_unblocked_at:
                            self.first_confirm_after_unblocked_at = time.time()
                    except pika.exceptions.NackError:
                        self.history.record(event="confirm", publisher=self.name, sequence=sequence, ack=False)
                connection.close()
            except (pika.exceptions.AMQPError, OSError) as error:
                self.history.record(event="publisher_error", publisher=self.name, error=repr(error))
                time.sleep(0.2)


class Consumer(threading.Thread):
    """Consumes through `node` with manual acks (prefetch 50) until stopped, recording deliveries
    and acks; reconnects after a failure."""

    def __init__(self, node, name, queue, history):
        super().__init__(daemon=True)
        self.node, self.name, self.queue, self.history = node, name, queue, history
        self.stopping = threading.Event()
        self.acked = []

    def run(self):
        while not self.stopping.is_set():
            try:
                connection = pika.BlockingConnection(pika.URLParameters(self.node.url()))
                channel = connection.channel()
                channel.basic_qos(prefetch_count=50)
                for method, _, body in channel.consume(self.queue, inactivity_timeout=0.5):
                    if self.stopping.is_set():
                        break
                    if method is None:
                        continue
                    self.settle(channel, method, body)
                connection.close()
            except (pika.exceptions.AMQPError, OSError) as error:
                self.history.record(event="consumer_error", consumer=self.name, error=repr(error))
                time.sleep(0.2)

    def settle(self, channel, method, body):
        publisher, sequence = body.decode().split(":")[:2]
        key = dict(publisher=publisher, sequence=int(sequence))
        self.history.record(event="deliver", consumer=self.name, redelivered=method.redelivered, **key)
        channel.basic_ack(method.delivery_tag)
        self.history.record(event="ack", consumer=self.name, **key)
        self.acked.append(key)


def confirms_of(publishers):
    return sum(publisher.confirms for publisher in publishers)


def queue_settled(cluster, queue):
    """Whether every node counts the queue empty, nothing unacknowledged: every ack sent is settled."""
    infos = [queue_info(node, queue) or {} for node in cluster.nodes]
    return all(info.get("messages") == 0 and info.get("messages_unacknowledged", 0) == 0 for info in infos)


def drain_rest(node, queue, history):
    """What is left, consumed and acked through `node` (a single consumer, so the order holds)."""
    connection = pika.BlockingConnection(pika.URLParameters(node.url()))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    count = 0
    for method, _, body in channel.consume(queue, inactivity_timeout=3):
        if method is None:
            break
        publisher, sequence = body.decode().split(":")[:2]
        history.record(event="deliver", consumer="final", publisher=publisher, sequence=int(sequence), redelivered=method.redelivered)
        channel.basic_ack(method.delivery_tag)
        count += 1
    channel.cancel()
    connection.close()
    return count


def assert_no_panic_and_failure_logged(cluster, full_nodes):
    for node in cluster.nodes:
        log = node.log()
        assert "panicked" not in log, f"{node.name} panicked; log: {node.log_path}"
    for node in full_nodes:
        failures = [line for line in node.log().splitlines() if "ERROR" in line and "shard's log" in line]
        assert any("No space left on device" in line for line in failures), f"{node.name} did not log its failed write; log: {node.log_path}"
        # One line per shard that failed, then a summary now and then: not a line a second.
        assert len(failures) <= SHARDS, f"{node.name} logged {len(failures)} write failures in {FULL_FOR_S} s; log: {node.log_path}"


def finish_and_check(cluster, queue, history, history_path, publishers, consumer):
    """Stops the load, waits for every ack to settle, marks those acks settled, drains the rest
    through one node and runs the history checker."""
    for publisher in publishers:
        publisher.stopping.set()
    for publisher in publishers:
        publisher.join(timeout=30)
        assert not publisher.is_alive(), f"publisher {publisher.name} hung"
    consumer.stopping.set()
    consumer.join(timeout=30)
    assert not consumer.is_alive(), "the consumer hung"
    drained = drain_rest(cluster.nodes[0], queue, history)
    eventually(lambda: queue_settled(cluster, queue), timeout=30, what="every ack settled on every node")
    # Every ack is settled now (every node counts the queue empty): none may be delivered again.
    for key in consumer.acked:
        history.record(event="ack_confirmed", **key)
    again = drain_rest(cluster.nodes[1], queue, history)
    history.close()
    events = read(str(history_path))
    violations = check(events)
    assert not violations, f"history {history_path}: {violations[:10]}"
    confirmed = sum(1 for event in events if event["event"] == "confirm" and event["ack"])
    assert again == 0, f"{again} messages delivered after every ack was settled"
    return confirmed, len(consumer.acked) + drained


def start_load(cluster, queue, history, consumer_node):
    publishers = [Publisher(node, f"p{index + 1}", queue, history) for index, node in enumerate(cluster.nodes)]
    consumer = Consumer(consumer_node, "c", queue, history)
    for thread in publishers + [consumer]:
        thread.start()
    eventually(lambda: all(publisher.confirms > 20 for publisher in publishers), timeout=20, what="confirms on every node")
    return publishers, consumer


def run_one_full_disk(cluster, disks, tmp_path, queue, full_is_leader):
    history_path = tmp_path / "history.jsonl"
    history = History(str(history_path))
    declare_quorum(cluster.nodes[0], queue)
    leader = leader_of(cluster, queue)
    full = leader if full_is_leader else next(node for node in cluster.nodes if node is not leader)
    others = [node for node in cluster.nodes if node is not full]
    publishers, consumer = start_load(cluster, queue, history, others[0])
    full_publisher = publishers[cluster.nodes.index(full)]
    other_publishers = [publisher for publisher in publishers if publisher is not full_publisher]

    filler = fill(str(disks[cluster.nodes.index(full)]), to_the_last_byte=False)
    filled_at = time.time()
    eventually(lambda: full.get("/overview").json()["disk_free_alarm"], timeout=10, what="the full node's disk alarm")
    eventually(full_publisher.blocked.is_set, timeout=10, what="connection.blocked to the full node's publisher")
    # The two nodes with room are a majority: their publishers keep getting confirms.
    before = confirms_of(other_publishers)
    eventually(lambda: confirms_of(other_publishers) > before + 200, timeout=20, what="confirms on the nodes with room")
    if full_is_leader:
        new_leader = leader_of(cluster, queue, among=others)
        assert new_leader is not full
        # The node that stepped down says so too: it names the new leader or none (held, it
        # cannot record the new term); before, it named itself for as long as its rounds failed.
        eventually(lambda: (queue_info(full, queue) or {}).get("leader") in (new_leader.name, None), timeout=5,
                   what="the full node no longer naming itself the leader")
    full_publisher_confirms = full_publisher.confirms
    time.sleep(max(0.0, filled_at + FULL_FOR_S - time.time()))
    assert full_publisher.confirms <= full_publisher_confirms + 1, "the blocked publisher kept getting confirms"
    assert full.running(), f"{full.name} stopped; log: {full.log_path}"

    os.remove(filler)
    full_for_s = time.time() - filled_at
    eventually(lambda: not full.get("/overview").json()["disk_free_alarm"], timeout=10, what="the alarm cleared")
    eventually(full_publisher.unblocked.is_set, timeout=10, what="connection.unblocked")
    confirmed_after = full_publisher.confirms
    eventually(lambda: full_publisher.confirms > confirmed_after + 20, timeout=20, what="confirms through the node that was full")
    # Its confirms come from its own apply: it caught up (no restart).
    caught_up_s = full_publisher.first_confirm_after_unblocked_at - full_publisher.unblocked_at
    assert caught_up_s < CATCH_UP_S_MAX, f"the node that was full confirmed again {caught_up_s:.1f} s after its disk had room"
    # Caught up without a restart: it counts what the others count once the load stops.
    confirmed, delivered = finish_and_check(cluster, queue, history, history_path, publishers, consumer)
    assert full.running(), f"{full.name} stopped; log: {full.log_path}"
    assert_no_panic_and_failure_logged(cluster, [full])
    return confirmed, delivered, full_for_s, caught_up_s


def test_the_quorum_leaders_disk_fills_under_confirmed_load(small_disk_cluster, disks, tmp_path):
    confirmed, delivered, full_for_s, caught_up_s = run_one_full_disk(small_disk_cluster, disks, tmp_path, "qdisk.leader", full_is_leader=True)
    print(f"leader's disk full for {full_for_s:.1f} s: {confirmed} confirmed, {delivered} delivered, none lost; "
          f"confirming again {caught_up_s:.1f} s after space was back")


def test_a_quorum_followers_disk_fills_under_confirmed_load(small_disk_cluster, disks, tmp_path):
    confirmed, delivered, full_for_s, caught_up_s = run_one_full_disk(small_disk_cluster, disks, tmp_path, "qdisk.follower", full_is_leader=False)
    print(f"follower's disk full for {full_for_s:.1f} s: {confirmed} confirmed, {delivered} delivered, none lost; "
          f"confirming again {caught_up_s:.1f} s after space was back")


def test_two_full_disks_confirm_nothing_and_lose_nothing(small_disk_cluster, disks, tmp_path):
    """A majority's disks full: the third node's publisher (not blocked: its disk has room) gets
    no confirm while they are full; once space is back everything it was confirmed is delivered."""
    cluster = small_disk_cluster
    queue = "qdisk.majority"
    history_path = tmp_path / "history.jsonl"
    history = History(str(history_path))
    declare_quorum(cluster.nodes[0], queue)
    leader = leader_of(cluster, queue)
    roomy = next(node for node in cluster.nodes if node is not leader)
    full = [node for node in cluster.nodes if node is not roomy]
    publishers, consumer = start_load(cluster, queue, history, roomy)
    roomy_publisher = publishers[cluster.nodes.index(roomy)]

    fillers = [fill(str(disks[cluster.nodes.index(node)]), to_the_last_byte=False) for node in full]
    for node in full:
        eventually(lambda node=node: node.get("/overview").json()["disk_free_alarm"], timeout=10, what=f"{node.name}'s disk alarm")
    # What was in flight when the disks filled may still commit; then nothing may.
    time.sleep(2)
    stalled_at = roomy_publisher.confirms
    time.sleep(3)
    assert roomy_publisher.confirms == stalled_at, "confirms while a majority's disks were full"
    for node in cluster.nodes:
        assert node.running(), f"{node.name} stopped; log: {node.log_path}"

    for filler in fillers:
        os.remove(filler)
    eventually(lambda: roomy_publisher.confirms > stalled_at + 20, timeout=30, what="confirms once space is back")
    confirmed, delivered = finish_and_check(cluster, queue, history, history_path, publishers, consumer)
    assert_no_panic_and_failure_logged(cluster, full)
    print(f"two disks full: {confirmed} confirmed, {delivered} delivered, none lost")
