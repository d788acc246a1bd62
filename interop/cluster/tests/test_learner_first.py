"""Learner first (docs/cluster.md, "Learner first"): a node becomes a voter, in a quorum shard or
in the metadata group, only once it holds the leader's commit index. With three voters of which
one is down, a fourth made a voter while it is still catching up would make the majority three of
four, and every commit would wait for it.

- Quorum shards: a fourth node joins while a founding node is down and the shard's snapshot holds
  a backlog of over 20 MiB, and is grown into every shard at once (`lepus ctl queues grow NODE
  all`); a publisher through the two founding nodes left is confirmed throughout (no gap past
  `CONFIRM_GAP_BOUND_S`), the node is a learner while it catches up and a voter of every shard once
  it has.
- Metadata group: a fourth node joins over a slow link (the in-tree proxy delays its pairs) while
  a founding node is down and the metadata log holds ~10 MiB of definitions; definition changes
  through the founding nodes left commit throughout (none waits past `DEFINITION_STALL_BOUND_S`),
  the node is a learner while it catches up, then a voter.
- A shard learner on a slow link under steady publishes is grown to voter within
  `PROMOTION_BOUND_S` (the leader's current commit as the bar never let it vote).
"""

import signal
import subprocess
import threading
import time

import pika

from cluster_harness import LEPUS_BIN, Node, eventually, free_port
from test_quorum_cluster import declare_quorum, leader_of, publish_confirmed, queue_info
from test_quorum_snapshot_transfer import LARGE_MESSAGES, SMALL_MESSAGES, large_body, largest_shard_snapshot_bytes

QUEUE = "quorum.learner-first"
# Longest wait for one confirm while the fourth node catches up and is promoted (no election
# happens: the shard's leader and the other founding node stay up).
CONFIRM_GAP_BOUND_S = 5.0
# Longest a definition change may take while the fourth node catches up the metadata log.
DEFINITION_STALL_BOUND_S = 3.0
# Classic queues whose declarations carry a padding argument: the metadata log the fourth node
# must catch up (each declaration fits one AMQP frame, at most 128 KiB with pika's frame_max).
PADDED_QUEUES = 100
PADDING_BYTES = 100_000
# From joining to voting in the metadata group, under steady definition changes: the log takes
# ~5-10 s over the slow link, and a learner that keeps up is promoted at the next check.
PROMOTION_BOUND_S = 40.0
# Per chunk (at most 64 KiB) on the fourth node's links: at most ~2 MiB/s, so ~10 MiB of log takes
# several seconds, and a 1 MiB Raft message stays well inside the links' 5 s silence timeout.
SLOW_LINK_DELAY_MS = 30


def slow_fourth_node(cluster, tmp_path):
    """A fourth node (not started) whose links to every other node run through the proxy with
    SLOW_LINK_DELAY_MS of delay; it is one of `cluster.nodes`."""
    proxy_port = free_port()
    late = Node(str(tmp_path), "n4", cluster.seeds, free_port(), ["--cluster-advertise", f"127.0.0.1:{proxy_port}"])
    cluster.proxy.add(late.name, proxy_port, late.cluster_port)
    for node in cluster.nodes:
        cluster.proxy.slow(late.name, node.name, SLOW_LINK_DELAY_MS)
    cluster.nodes.append(late)
    return late


class TimedLoop(threading.Thread):
    """Runs `step(channel)` over one connection to `node` until stopped, counting the steps and
    noting the longest one; an error ends it and is kept for the test to report."""

    def __init__(self, node):
        super().__init__(daemon=True)
        self.node = node
        self.stopping = threading.Event()
        self.steps = 0
        self.longest_s = 0.0
        self.error = None

    def run(self):
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.node.url()))
            channel = self.open(connection)
            while not self.stopping.is_set():
                started = time.monotonic()
                self.step(channel)
                self.longest_s = max(self.longest_s, time.monotonic() - started)
                self.steps += 1
            connection.close()
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def open(self, connection):
        return connection.channel()


class ConfirmedPublisher(TimedLoop):
    """Publishes through `node` until stopped, each message confirmed before the next; the longest
    step is the longest wait for a confirm."""

    def __init__(self, node, queue):
        super().__init__(node)
        self.queue = queue

    def open(self, connection):
        channel = connection.channel()
        channel.confirm_delivery()
        return channel

    def step(self, channel):
        channel.basic_publish("", self.queue, f"during:{self.steps}".encode(), pika.BasicProperties(delivery_mode=2))


class DefinitionProber(TimedLoop):
    """Declares and deletes a classic queue through `node` until stopped; the longest step is the
    longest such change (plus a 50 ms pause)."""

    def step(self, channel):
        channel.queue_declare(f"probe.{self.steps}", durable=True)
        channel.queue_delete(f"probe.{self.steps}")
        time.sleep(0.05)


class RoleWatcher(threading.Thread):
    """Polls `node`'s cluster status until stopped, noting whether `name` was seen a learner of
    quorum shard `shard`, and among its learners pending promotion (chosen as a voter)."""

    def __init__(self, node, name, shard):
        super().__init__(daemon=True)
        self.node, self.name, self.shard = node, name, shard
        self.stopping = threading.Event()
        self.seen_learner = False
        self.seen_pending = False

    def run(self):
        while not self.stopping.is_set():
            try:
                entry = next(entry for entry in self.node.status()["quorum_shards"] if entry["shard"] == self.shard)
                self.seen_learner = self.seen_learner or self.name in entry["learners"]
                self.seen_pending = self.seen_pending or self.name in entry.get("promotion_pending", [])
            except Exception:  # noqa: BLE001 - polled again
                pass
            time.sleep(0.2)


def grow(through, name):
    return subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{through.http_port}", "queues", "grow", name, "all"],
                          capture_output=True, text=True, timeout=60)


def shards(node):
    return node.status().get("quorum_shards", [])


def metadata_voter(node, name):
    """Whether `node`'s cluster status lists `name` as a member, and as a voter: (member, voter)."""
    member = next((member for member in node.status()["members"] if member["name"] == name), None)
    return member is not None, bool(member and member["voter"])


def test_a_node_grown_into_a_shard_far_behind_votes_once_caught_up_and_confirms_never_stall(cluster, tmp_path):
    declare_quorum(cluster.nodes[0], QUEUE)
    leader = leader_of(cluster, QUEUE)
    other, down = [node for node in cluster.nodes if node is not leader]
    down.kill(signal.SIGKILL)
    publish_confirmed(leader, QUEUE, (large_body(index) for index in range(LARGE_MESSAGES)))
    publish_confirmed(other, QUEUE, (f"small:{index}".encode() for index in range(SMALL_MESSAGES)))
    backlog = LARGE_MESSAGES + SMALL_MESSAGES
    eventually(lambda: largest_shard_snapshot_bytes(leader) > 20 * (1 << 20), timeout=30,
               what="a shard snapshot of the leader over 20 MiB (it holds the whole backlog)")
    shard = next(entry["shard"] for entry in shards(leader) if any(queue["name"] == QUEUE for queue in entry["queues"]))

    publisher = ConfirmedPublisher(other, QUEUE)
    publisher.start()
    watcher = RoleWatcher(leader, "n4@localhost", shard)
    watcher.start()
    late = Node(str(tmp_path), "n4", cluster.seeds, free_port()).start()
    cluster.nodes.append(late)
    late.wait_listening()
    eventually(lambda: any(member["name"] == late.name and member["running"] for member in leader.status()["members"]),
               timeout=30, what="the fourth node a running member")
    grown = grow(leader, late.name)
    # grow waits 20 s for the role; a node still catching up past that is recorded, not refused.
    assert grown.returncode == 0 or "the role is recorded" in grown.stderr, grown.stderr

    def voter_everywhere():
        entries = shards(leader)
        return len(entries) == 3 and all(late.name in entry["voters"] for entry in entries)

    eventually(voter_everywhere, timeout=120, what="the fourth node a voter of every shard")
    time.sleep(2.0)  # confirms go on with the fourth node voting
    publisher.stopping.set()
    watcher.stopping.set()
    publisher.join(timeout=30)
    watcher.join(timeout=30)
    print(f"confirms {publisher.steps}, longest gap {publisher.longest_s:.2f} s, "
          f"learner seen {watcher.seen_learner}, pending promotion seen {watcher.seen_pending}")
    assert watcher.seen_learner, "the fourth node was a learner of the backlog's shard while it caught up"
    assert publisher.error is None, publisher.error
    assert publisher.steps > 0
    assert publisher.longest_s < CONFIRM_GAP_BOUND_S, f"a confirm waited {publisher.longest_s:.1f} s"
    total = backlog + publisher.steps
    eventually(lambda: (queue_info(late, QUEUE) or {}).get("messages") == total, timeout=60,
               what=f"{total} messages on the fourth node")
    # Promoted by the shard's leader only once caught up: the leader's log says which changes it made.
    promoted = [line for node in (leader, other) for line in node.log().splitlines()
                if "changing the quorum shard's members" in line and f"shard={shard}" in line and "change=AddNode" in line]
    assert promoted, "the backlog's shard promoted the fourth node"
    # `lepus ctl cluster status` lists every shard's roles: the fourth node votes, none pending.
    status = subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{leader.http_port}", "cluster", "status"],
                            capture_output=True, text=True, timeout=60)
    lines = [line for line in status.stdout.splitlines() if line.startswith("shard ")]
    assert len(lines) == 3 and all(late.name in line.split("voters ")[1].split(";")[0] and line.endswith("promotion pending none")
                                   for line in lines), status.stdout


def test_a_node_joining_over_a_slow_link_votes_in_the_metadata_group_once_caught_up(proxied_cluster, tmp_path):
    cluster = proxied_cluster
    metadata_leader = cluster.leader()
    through = metadata_leader
    down = next(node for node in cluster.nodes if node is not metadata_leader)
    connection = pika.BlockingConnection(pika.URLParameters(through.url()))
    channel = connection.channel()
    for index in range(PADDED_QUEUES):
        channel.queue_declare(f"padded.{index}", durable=True, arguments={"x-test-padding": "p" * PADDING_BYTES})
    connection.close()
    down.kill(signal.SIGKILL)

    late = slow_fourth_node(cluster, tmp_path)
    prober = DefinitionProber(through)
    prober.start()
    late.start()
    late.wait_listening()
    seen = {"learner": False, "member_at": None, "voter_at": None}

    def voter():
        member, votes = metadata_voter(through, late.name)
        if member and seen["member_at"] is None:
            seen["member_at"] = time.monotonic()
        if member and not votes:
            seen["learner"] = True
        if votes and seen["voter_at"] is None:
            seen["voter_at"] = time.monotonic()
        return votes

    eventually(voter, timeout=120, what="the fourth node a voter of the metadata group")
    time.sleep(1.0)
    prober.stopping.set()
    prober.join(timeout=30)
    assert prober.error is None, prober.error
    assert prober.steps > 0
    caught_up_s = seen["voter_at"] - seen["member_at"]
    print(f"definition changes {prober.steps}, longest {prober.longest_s:.2f} s, member to voter {caught_up_s:.1f} s")
    assert prober.longest_s < DEFINITION_STALL_BOUND_S, f"a definition change took {prober.longest_s:.1f} s"
    assert seen["learner"], "the fourth node was a metadata learner while it caught up"
    # Promoted once it kept up with the commits, not only in a lull between definition changes.
    assert caught_up_s < PROMOTION_BOUND_S, f"promoted {caught_up_s:.1f} s after it joined"
    # It caught up the whole log: every padded queue is known there.
    eventually(lambda: queue_info(late, f"padded.{PADDED_QUEUES - 1}") is not None, timeout=30,
               what="the last padded queue known on the fourth node")


def test_a_shard_learner_on_a_slow_link_is_promoted_under_steady_publishes(proxied_cluster, tmp_path):
    """A learner whose link is slower than the voters' always has the newest entries in flight
    under steady publishes: it is promoted once it holds the commit of the leader's previous
    check, not only in a lull (the current commit as the bar never let it vote here)."""
    cluster = proxied_cluster
    declare_quorum(cluster.nodes[0], QUEUE)
    leader = leader_of(cluster, QUEUE)
    other, down = [node for node in cluster.nodes if node is not leader]
    down.kill(signal.SIGKILL)
    publish_confirmed(leader, QUEUE, (bytes([index]) * (256 << 10) for index in range(16)))
    late = slow_fourth_node(cluster, tmp_path)
    publisher = ConfirmedPublisher(other, QUEUE)
    publisher.start()
    late.start()
    late.wait_listening()
    eventually(lambda: any(member["name"] == late.name and member["running"] for member in leader.status()["members"]),
               timeout=30, what="the fourth node a running member")
    started = time.monotonic()
    grown = grow(leader, late.name)
    assert grown.returncode == 0 or "the role is recorded" in grown.stderr, grown.stderr
    eventually(lambda: all(late.name in entry["voters"] for entry in shards(leader)), timeout=PROMOTION_BOUND_S,
               what="the fourth node a voter of every shard under steady publishes")
    promoted_s = time.monotonic() - started
    time.sleep(1.0)
    publisher.stopping.set()
    publisher.join(timeout=30)
    assert publisher.error is None, publisher.error
    print(f"confirms {publisher.steps}, longest gap {publisher.longest_s:.2f} s, grown to voter {promoted_s:.1f} s")
    assert publisher.longest_s < CONFIRM_GAP_BOUND_S, f"a confirm waited {publisher.longest_s:.1f} s"
