"""A member that was down while its shard's leader compacted the log past a backlog larger than a
link's send queue (16 MiB, `peer_queue_bytes_max`) catches up by a snapshot sent in parts over the
link, and then serves: with the third node gone, it and the leader are the majority that commits
the consume and acks, and every message, the large ones whole, is delivered through it."""

import glob
import os
import signal

from cluster_harness import eventually
from test_quorum_cluster import declare_quorum, leader_of, publish_confirmed, queue_info
from test_quorum_membership import consume_acked

QUEUE = "quorum.snapshot-transfer"
LARGE_MESSAGES = 24
LARGE_BYTES = 1 << 20
# Each publish confirmed before the next is one entry: past twice the shard's snapshot interval
# (1024), as a node compacts up to the image it took one interval before.
SMALL_MESSAGES = 2200


def largest_shard_snapshot_bytes(node):
    sizes = [os.path.getsize(path) for path in glob.glob(os.path.join(node.data_dir, "raft", "shard-*", "snapshot"))]
    return max(sizes, default=0)


def large_body(index):
    return bytes([index]) * LARGE_BYTES


def test_a_member_behind_a_compacted_log_catches_up_by_a_snapshot_larger_than_a_send_queue(cluster):
    declare_quorum(cluster.nodes[0], QUEUE)
    leader = leader_of(cluster, QUEUE)
    behind, other = [node for node in cluster.nodes if node is not leader]
    behind.kill(signal.SIGTERM)
    publish_confirmed(leader, QUEUE, (large_body(index) for index in range(LARGE_MESSAGES)))
    publish_confirmed(other, QUEUE, (f"small:{index}".encode() for index in range(SMALL_MESSAGES)))
    total = LARGE_MESSAGES + SMALL_MESSAGES
    # The leader compacted its log into a snapshot holding the backlog: more than a send queue.
    eventually(lambda: largest_shard_snapshot_bytes(leader) > 20 * LARGE_BYTES, timeout=30,
               what="a shard snapshot of the leader over 20 MiB")

    behind.start()
    behind.wait_listening()
    eventually(lambda: (queue_info(behind, QUEUE) or {}).get("messages") == total, timeout=90,
               what=f"{total} messages on the restarted member (taken from the snapshot)")
    assert largest_shard_snapshot_bytes(behind) > 20 * LARGE_BYTES, "the member installed the snapshot"

    # Without the third node, the leader and the restarted member are the majority.
    other.kill(signal.SIGKILL)
    received = consume_acked(behind, QUEUE, total, prefetch=50, timeout_s=30)
    assert [body for body in received if len(body) == LARGE_BYTES] == [large_body(index).decode() for index in range(LARGE_MESSAGES)]
    assert [body for body in received if len(body) != LARGE_BYTES] == [f"small:{index}" for index in range(SMALL_MESSAGES)]
    eventually(lambda: queue_info(leader, QUEUE)["messages"] == 0, what="the acks committed by the two")
