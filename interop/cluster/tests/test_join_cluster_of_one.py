"""`lepus ctl cluster join` from a former cluster of one (docs/cluster.md, "Formation"): a node
started with a cluster port and no seeds forms a cluster of one at once, with its own one-node
quorum shards. Joined to a cluster formed by seeds, it leaves those shards and becomes a learner of
the cluster's, exactly as a node that joins through the seeds: quorum queues declared through it
and through a founding node are published to with confirms through one and consumed through the
other, it leads no shard, and after a restart it still serves them. A cluster of one that holds a
quorum queue is refused, saying so, and keeps its queue."""

import signal
import subprocess

import pika

from cluster_harness import LEPUS_BIN, Node, eventually, free_port
from test_quorum_cluster import declare_quorum, publish_confirmed, queue_info
from test_quorum_membership import consume_acked, members_of


def join(node, address):
    return subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{node.http_port}", "join_cluster", address],
                          capture_output=True, text=True, timeout=60)


def start_cluster_of_one(tmp_path, name):
    """A node with a cluster port and no seeds, once it leads its own metadata group."""
    node = Node(str(tmp_path), name, [], free_port()).start()
    node.wait_listening()
    eventually(lambda: node.status()["member"] and node.status()["metadata"]["leader"] == node.name, timeout=20,
               what=f"{node.name} a cluster of one")
    return node


def shard_members(node):
    """Every quorum shard as `node`'s cluster status shows it: (voters, learners, leader)."""
    return [(sorted(shard["voters"]), sorted(shard["learners"]), shard["leader"]) for shard in node.status().get("quorum_shards", [])]


def test_a_former_cluster_of_one_joins_and_serves_quorum_queues_as_a_seed_joined_node(cluster, tmp_path):
    first, second, third = cluster.nodes
    founding = sorted(node.name for node in cluster.nodes)
    declare_quorum(first, "quorum.before")
    late = start_cluster_of_one(tmp_path, "n4")
    cluster.nodes.append(late)
    # The cluster of one runs its own one-node shards before the join (the bug kept them after).
    assert all(voters == [late.name] for voters, _, _ in shard_members(late)), shard_members(late)

    joined = join(late, f"127.0.0.1:{first.cluster_port}")
    assert joined.returncode == 0, joined.stderr
    cluster.wait_formed(expected=4)
    everyone = sorted(node.name for node in cluster.nodes)

    # A queue declared through the joined node and one through a founding node: every node lists
    # all four as members, and no node names the joined node as a leader.
    declare_quorum(late, "quorum.from-joined")
    for queue in ("quorum.before", "quorum.from-joined"):
        for node in cluster.nodes:
            eventually(lambda node=node, queue=queue: members_of(node, queue) == everyone, timeout=30,
                       what=f"{queue} with four members on {node.name}")
            eventually(lambda node=node, queue=queue: (queue_info(node, queue) or {}).get("leader") in founding, timeout=30,
                       what=f"{queue} led by a founding node on {node.name}")

    # Published with confirms through the joined node, consumed through a founding node; and
    # the other way round.
    for queue in ("quorum.before", "quorum.from-joined"):
        publish_confirmed(late, queue, (f"{queue}:{index}".encode() for index in range(10)))
        assert consume_acked(second, queue, 10) == [f"{queue}:{index}" for index in range(10)]
        publish_confirmed(third, queue, (f"back:{index}".encode() for index in range(5)))
        assert consume_acked(late, queue, 5) == [f"back:{index}" for index in range(5)]
        for node in cluster.nodes:
            eventually(lambda node=node, queue=queue: queue_info(node, queue)["messages"] == 0, what=f"{queue} empty on {node.name}")

    # The cluster status shows the joined node as a learner of every shard, as a node joined
    # through the seeds is: the founding nodes vote, nobody but them leads.
    for node in cluster.nodes:
        eventually(lambda node=node: len(shard_members(node)) == 3 and all(voters == founding and learners == [late.name] and leader in founding
                                         for voters, learners, leader in shard_members(node)),
                   timeout=30, what=f"every shard's members on {node.name}")

    # Restarted, the joined node opens its shards as a learner again and serves the queues.
    late.kill(signal.SIGTERM)
    late.start()
    late.wait_listening()
    cluster.wait_formed(expected=4)
    publish_confirmed(late, "quorum.from-joined", (f"again:{index}".encode() for index in range(5)))
    assert consume_acked(first, "quorum.from-joined", 5) == [f"again:{index}" for index in range(5)]
    assert all(learners == [late.name] for _, learners, _ in shard_members(late)), shard_members(late)


def test_a_cluster_of_one_holding_a_quorum_queue_is_refused_to_join(cluster, tmp_path):
    first = cluster.nodes[0]
    alone = start_cluster_of_one(tmp_path, "alone")
    try:
        declare_quorum(alone, "quorum.mine")
        publish_confirmed(alone, "quorum.mine", [b"kept"])
        refused = join(alone, f"127.0.0.1:{first.cluster_port}")
        assert refused.returncode != 0, refused.stdout
        assert "quorum queues ('quorum.mine' in vhost '/')" in refused.stderr and "would discard them" in refused.stderr, refused.stderr
        # Nothing was given up: still its own cluster, its queue and message kept.
        status = alone.status()
        assert status["member"] and [member["name"] for member in status["members"]] == [alone.name], status
        assert (queue_info(alone, "quorum.mine") or {}).get("messages") == 1
        connection = pika.BlockingConnection(pika.URLParameters(alone.url()))
        assert connection.channel().basic_get("quorum.mine", auto_ack=True)[2] == b"kept"
        connection.close()
        assert len(first.get("/nodes").json()) == 3
    finally:
        alone.kill(signal.SIGTERM)
