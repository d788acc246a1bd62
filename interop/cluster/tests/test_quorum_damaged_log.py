"""A quorum shard's log damaged on one node (a record in the middle fails its checksum, as after a
bad sector): the node says so, neither votes nor campaigns, is repaired from the leader, and then
serves as half of a majority: with the leader's node killed, every confirmed message is delivered
through it, in order. Nothing committed is truncated away (docs/replication.md, "Recovery and
damaged logs"); the failure Jepsen found in NATS JetStream in 2025 was the opposite."""

import glob
import os
import signal

from cluster_harness import eventually
from test_quorum_cluster import declare_quorum, leader_of, publish_confirmed, queue_info
from test_quorum_membership import consume_acked

QUEUE = "quorum.damaged-log"
MESSAGES = 300


def damage_the_middle_of_each_shard_log(node):
    """Flips one byte halfway through every shard log of `node` holding more than 64 KiB; how many."""
    damaged = 0
    for path in glob.glob(os.path.join(node.data_dir, "raft", "shard-*", "log")):
        size = os.path.getsize(path)
        if size < 64 * 1024:
            continue
        with open(path, "r+b") as log:
            log.seek(size // 2)
            byte = log.read(1)
            log.seek(size // 2)
            log.write(bytes([byte[0] ^ 0x5A]))
        damaged += 1
    return damaged


def test_a_damaged_shard_log_is_repaired_from_the_leader_and_loses_nothing_committed(cluster):
    declare_quorum(cluster.nodes[0], QUEUE)
    leader = leader_of(cluster, QUEUE)
    damaged_node, other = [node for node in cluster.nodes if node is not leader]
    bodies = [f"m:{index}:".encode() + b"x" * 512 for index in range(MESSAGES)]
    publish_confirmed(other, QUEUE, bodies)
    eventually(lambda: (queue_info(damaged_node, QUEUE) or {}).get("messages") == MESSAGES, what="every message on the node to damage")

    damaged_node.kill(signal.SIGTERM)
    assert damage_the_middle_of_each_shard_log(damaged_node) >= 1, "no shard log to damage"
    damaged_node.start()
    damaged_node.wait_listening()
    eventually(lambda: "the quorum shard's log is damaged" in damaged_node.log(), what="the damage reported")
    eventually(lambda: (queue_info(damaged_node, QUEUE) or {}).get("messages") == MESSAGES, timeout=30,
               what="the damaged node repaired from the leader")

    # The repaired node and the third one are the majority now.
    leader.kill(signal.SIGKILL)
    leader_of(cluster, QUEUE, among=[damaged_node, other])
    received = consume_acked(damaged_node, QUEUE, MESSAGES, prefetch=100, timeout_s=30)
    assert received == [body.decode() for body in bodies]
