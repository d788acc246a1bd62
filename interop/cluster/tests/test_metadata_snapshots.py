"""Snapshots of the metadata group (docs/cluster.md, "Snapshots of the metadata log"): three nodes
snapshot their definitions every 40 applied entries and compact their metadata logs. A node killed
with kill -9 starts from its snapshot and replays only the log after it, and gets back every
definition, its classic queue with its persistent messages in order, and a quorum queue; its
transient queue of the last run is deleted. A fourth node that joins after compaction is sent the
leader's snapshot (it cannot replay from index 1: the leader's log starts past it) and holds every
definition."""

import os
import re
import signal

import pika
import requests

from cluster_harness import Cluster, Node, eventually, free_port
from test_quorum_cluster import QUORUM, queue_info

INTERVAL = 40
EXCHANGES = 90
QUEUES = 90
DELETED = 15
CLASSIC_MESSAGES = 30
QUORUM_MESSAGES = 5


def snapshot_args():
    return ["--metadata-snapshot-entries-interval", str(INTERVAL)]


def definitions(node):
    """The node's definitions export, every list sorted: equal on nodes that hold the same."""
    exported = node.get("/definitions").json()
    for user in exported.get("users", []):
        # Each node salts the embedded default guest's hash itself, before any log exists.
        if user["name"] == "guest":
            user.pop("password_hash", None)
    shaped = {}
    for key in ("users", "vhosts", "permissions", "topic_permissions", "policies", "queues", "exchanges", "bindings", "parameters"):
        shaped[key] = sorted(exported.get(key, []), key=lambda item: repr(sorted(item.items())))
    return shaped


def same_definitions(node, expected):
    """True when `node` holds `expected`; else what differs, per key (for the failure message)."""
    held = definitions(node)
    if held == expected:
        return True
    differences = {}
    for key in expected:
        missing = [item for item in expected[key] if item not in held[key]]
        extra = [item for item in held[key] if item not in expected[key]]
        if missing or extra:
            differences[key] = {"missing": missing[:5], "extra": extra[:5]}
    raise AssertionError(f"{node.name} differs: {differences}")


def metadata(node):
    return node.status()["metadata"]


def make_definitions(first, second, third):
    """Several hundred metadata entries through all three nodes; the classic queue on `second`."""
    assert first.put("/vhosts/snap-vhost").status_code in (201, 204)
    assert first.put("/users/snapuser", {"password": "secret", "tags": "management"}).status_code in (201, 204)
    assert second.put("/permissions/snap-vhost/snapuser", {"configure": ".*", "write": "^snap", "read": ".*"}).status_code in (201, 204)
    policy = {"pattern": "^snap\\.q\\.", "definition": {"max-length": 1000}, "apply-to": "queues", "priority": 3}
    assert third.put("/policies/%2F/snap-policy", policy).status_code in (201, 204)
    for index, node in enumerate((first, second, third) * (EXCHANGES // 3)):
        connection = getattr(node, "_snap_connection", None)
        if connection is None:
            connection = pika.BlockingConnection(pika.URLParameters(node.url()))
            node._snap_connection = connection
        channel = connection.channel()
        channel.exchange_declare(f"snap.x.{index}", "topic", durable=True)
        channel.queue_declare(f"snap.q.{index}", durable=True)
        channel.queue_bind(f"snap.q.{index}", f"snap.x.{index}", routing_key=f"key.{index}.#")
        channel.close()
    # Deleted ones must stay deleted after a restart from a snapshot, and on the joined node.
    channel = first._snap_connection.channel()
    for index in range(DELETED):
        channel.queue_delete(f"snap.q.{index}")
    channel.exchange_delete("snap.x.0")
    channel.close()
    for node in (first, second, third):
        node._snap_connection.close()
        node._snap_connection = None

    # The classic queue lives on `second`, with persistent confirmed messages; its transient
    # queue goes with its process.
    connection = pika.BlockingConnection(pika.URLParameters(second.url()))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("snap.classic", durable=True)
    channel.queue_declare("snap.transient", durable=False)
    channel.queue_declare("snap.quorum", durable=True, arguments=QUORUM)
    for index in range(CLASSIC_MESSAGES):
        channel.basic_publish("", "snap.classic", f"c{index}".encode(), pika.BasicProperties(delivery_mode=2))
    for index in range(QUORUM_MESSAGES):
        channel.basic_publish("", "snap.quorum", f"q{index}".encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    # A few more entries after the classic queue's declaration: its incarnation is inside a
    # snapshot, not at its end.
    for index in range(INTERVAL + 5):
        assert first.put(f"/vhosts/snap-late-{index}").status_code in (201, 204)


def test_snapshots_restart_a_node_and_bring_a_joined_node_up_to_date(tmp_path):
    cluster = Cluster(str(tmp_path))
    for node in cluster.nodes:
        node.extra += snapshot_args()
    cluster.start()
    try:
        run(cluster, tmp_path)
    finally:
        cluster.stop()


def run(cluster, tmp_path):
    first, second, third = cluster.nodes
    make_definitions(first, second, third)
    applied = metadata(first)["applied_index"]
    assert applied > 4 * INTERVAL, applied
    for node in cluster.nodes:
        eventually(lambda node=node: metadata(node)["snapshots_taken"] >= 3 and metadata(node)["snapshot_index"] > applied - 2 * INTERVAL,
                   what=f"{node.name} snapshotted several times")
    expected = definitions(first)
    assert len([queue for queue in expected["queues"] if queue["name"].startswith("snap.q.")]) == QUEUES - DELETED
    assert len([exchange for exchange in expected["exchanges"] if exchange["name"].startswith("snap.x.")]) == EXCHANGES - 1
    assert any(user["name"] == "snapuser" for user in expected["users"])
    assert any(policy["name"] == "snap-policy" for policy in expected["policies"])
    for node in (second, third):
        eventually(lambda node=node: same_definitions(node, expected), what=f"{node.name} holds the same definitions")
    metrics = second.metrics()
    assert 'lepus_metadata_raft_snapshot_index{group="metadata"}' in metrics, metrics[:2000]

    # (a) kill -9 of the classic queue's node; it starts from its snapshot and replays the log
    # after it, where a second classic queue was declared.
    connection = pika.BlockingConnection(pika.URLParameters(second.url()))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("snap.classic.tail", durable=True)
    for index in range(5):
        channel.basic_publish("", "snap.classic.tail", f"t{index}".encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    for index in range(INTERVAL):
        status = metadata(second)
        if 3 <= status["applied_index"] - status["snapshot_index"] <= INTERVAL - 5:
            break
        assert first.put(f"/vhosts/snap-tail-{index}").status_code in (201, 204)
    snapshot_before = metadata(second)["snapshot_index"]
    second.kill(signal.SIGKILL)
    second.start()
    second.wait_listening()
    cluster.wait_formed()
    log = second.log()
    started = re.search(r"starting from the metadata snapshot index=(\d+)", log)
    replayed = re.findall(r"metadata log replayed applied=(\d+)", log)
    assert started and replayed, log[-3000:]
    # (The entries after it apply once the leader confirms their commit: the hard state's commit
    # index is written with term changes only, so the replay line may name the snapshot's index.)
    assert int(replayed[-1]) >= int(started.group(1)) >= snapshot_before, (started.group(0), replayed)
    assert metadata(second)["snapshot_index"] >= snapshot_before
    eventually(lambda: same_definitions(second, definitions(first)), what="the restarted node holds every definition")
    assert second.get("/queues/%2F/snap.classic").json()["messages"] == CLASSIC_MESSAGES
    connection = pika.BlockingConnection(pika.URLParameters(second.url()))
    channel = connection.channel()
    bodies = [channel.basic_get("snap.classic", auto_ack=True)[2] for _ in range(CLASSIC_MESSAGES)]
    assert bodies == [f"c{index}".encode() for index in range(CLASSIC_MESSAGES)]
    bodies = [channel.basic_get("snap.classic.tail", auto_ack=True)[2] for _ in range(5)]
    assert bodies == [f"t{index}".encode() for index in range(5)]
    connection.close()
    eventually(lambda: (queue_info(second, "snap.quorum") or {}).get("messages") == QUORUM_MESSAGES, timeout=20,
               what="the quorum queue found by its incarnation on the restarted node")
    for node in cluster.nodes:
        eventually(lambda node=node: not node.get("/queues/%2F/snap.transient").ok, timeout=20,
                   what=f"the restarted node's transient queue deleted on {node.name}")

    # (c) A follower down while the others delete and make definitions and compact past its
    # log: it starts from its own (older) snapshot, is sent the leader's, and installing it
    # removes what was deleted meanwhile and adds what was made.
    third.kill(signal.SIGKILL)
    eventually(lambda: metadata(first)["leader"] in {first.name, second.name}, what="a leader among the two others")
    connection = pika.BlockingConnection(pika.URLParameters(first.url()))
    channel = connection.channel()
    for index in range(DELETED, DELETED + 10):
        channel.queue_delete(f"snap.q.{index}")
        channel.exchange_delete(f"snap.x.{index}")
        channel.queue_declare(f"snap.while-down.{index}", durable=True)
    connection.close()
    assert requests.delete(first.api("/users/snapuser"), auth=("guest", "guest"), timeout=30).status_code == 204
    behind = metadata(first)["applied_index"]
    for index in range(2 * INTERVAL):
        assert first.put(f"/vhosts/snap-while-down-{index}").status_code in (201, 204)
    eventually(lambda: metadata(first)["snapshot_index"] > behind, what="the leader compacted past the stopped node's log")
    third.start()
    third.wait_listening()
    cluster.wait_formed()
    eventually(lambda: same_definitions(third, definitions(first)), timeout=30, what="the restarted follower holds every definition")
    assert metadata(third)["snapshots_installed"] >= 1, metadata(third)
    assert "metadata snapshot installed from the leader" in third.log()

    # (b) A fourth node joins after compaction (it finds the formed cluster through the seeds and
    # asks to join, as `lepus ctl cluster join` makes a node do).
    assert metadata(first)["snapshot_index"] > 1
    late = Node(str(tmp_path), "n4", cluster.seeds, free_port(), snapshot_args())
    late.start()
    cluster.nodes.append(late)
    late.wait_listening()
    cluster.wait_formed(expected=4)
    eventually(lambda: same_definitions(late, definitions(first)), timeout=30, what="the joined node holds every definition")
    status = metadata(late)
    assert status["snapshots_installed"] >= 1 and status["snapshot_index"] > 1, status
    assert "metadata snapshot installed from the leader" in late.log()
    assert late.get("/queues/%2F/snap.classic").json()["node"] == second.name
    eventually(lambda: (queue_info(late, "snap.quorum") or {}).get("messages") == QUORUM_MESSAGES, timeout=30,
               what="the quorum queue on the joined node")
    # It follows the log after the snapshot.
    assert third.put("/vhosts/after-join").status_code in (201, 204)
    eventually(lambda: late.get("/vhosts/after-join").ok, what="a change after the join on the joined node")
    sent = sum(metadata(node)["snapshots_sent"] for node in cluster.nodes[:3])
    assert sent >= 2, [metadata(node) for node in cluster.nodes]


def test_a_damaged_metadata_snapshot_is_refused_loudly(tmp_path):
    cluster = Cluster(str(tmp_path))
    for node in cluster.nodes:
        node.extra += ["--metadata-snapshot-entries-interval", "10"]
    cluster.start()
    try:
        first, _, third = cluster.nodes
        for index in range(25):
            assert first.put(f"/vhosts/damaged-{index}").status_code in (201, 204)
        eventually(lambda: metadata(third)["snapshot_index"] >= 20, what="the third node snapshotted")
        third.kill(signal.SIGTERM)
        path = os.path.join(third.data_dir, "cluster", "metadata", "snapshot")
        with open(path, "r+b") as file:
            data = bytearray(file.read())
            data[len(data) // 2] ^= 0x01
            file.seek(0)
            file.write(data)
        third.start()
        third.process.wait(timeout=30)
        assert third.process.returncode != 0
        log = third.log()
        assert "snapshot" in log and "checksum mismatch" in log, log[-2000:]
        # The two others go on (once they agree on a leader: a change proposed to a leader that
        # just stopped is lost with it and answered 500 after metadata_commit_timeout_ms).
        eventually(lambda: metadata(first)["leader"] in {node.name for node in cluster.nodes[:2]}, what="a leader among the two others")
        answer = first.put("/vhosts/after-damage")
        assert answer.status_code in (201, 204), answer.text
    finally:
        cluster.stop()
