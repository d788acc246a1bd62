"""Quorum shard membership by hand (docs/cluster.md, "Shard membership by hand"): `lepus ctl
queues shrink NODE` makes the node stop voting in every shard (it stays a learner, and is not
promoted back by itself); the queue keeps working on the two voters with the node down; RabbitMQ's
errors (unknown node, node not running, last voter); `grow NODE all` brings it back as a voter once
it caught up, and then it counts toward commits; `add_member`/`delete_member` act on the queue's
shard and name it."""

import signal
import subprocess
import time

from cluster_harness import LEPUS_BIN, eventually
from test_join_cluster_of_one import shard_members
from test_quorum_cluster import declare_quorum, leader_of, publish_confirmed, queue_info
from test_quorum_membership import consume_acked


def queues(through, *arguments):
    return subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{through.http_port}", "queues", *arguments],
                          capture_output=True, text=True, timeout=60)


def roles_everywhere(cluster, voters, learners, among=None):
    """Until every running node's status shows every shard with these voters and learners."""
    voters, learners = sorted(voters), sorted(learners)
    for node in among or cluster.running():
        eventually(lambda node=node: len(shard_members(node)) == 3 and all(
            shard_voters == voters and shard_learners == learners for shard_voters, shard_learners, _ in shard_members(node)),
            timeout=30, what=f"voters {voters} and learners {learners} of every shard on {node.name}")


def test_shrink_a_node_out_and_grow_it_back(cluster):
    first, second, third = cluster.nodes
    names = [node.name for node in cluster.nodes]
    declare_quorum(first, "quorum.roles")
    publish_confirmed(first, "quorum.roles", (f"before:{index}".encode() for index in range(5)))

    # Errors first, as RabbitMQ words them: an unknown node, a node that does not run.
    unknown = queues(first, "shrink", "nobody@nowhere")
    assert unknown.returncode != 0 and "node nobody@nowhere is not a member of this cluster" in unknown.stderr, unknown.stderr

    # Shrink the third node out: it stops voting in every shard and stays a learner.
    shrunk = queues(first, "shrink", third.name)
    assert shrunk.returncode == 0, shrunk.stderr
    assert shrunk.stdout.count("quorum shard") == 3 and "quorum.roles" in shrunk.stdout, shrunk.stdout
    roles_everywhere(cluster, [first.name, second.name], [third.name])
    time.sleep(2.0)  # no leader promotes it back by itself (the shards are the operator's now)
    roles_everywhere(cluster, [first.name, second.name], [third.name])

    # The queue keeps working on the other two with the shrunk node down.
    third.kill(signal.SIGKILL)
    not_running = queues(first, "grow", third.name, "all")
    assert not_running.returncode != 0 and f"node {third.name} is not running" in not_running.stderr, not_running.stderr
    publish_confirmed(first, "quorum.roles", (f"down:{index}".encode() for index in range(10)))
    assert consume_acked(second, "quorum.roles", 15) == [f"before:{index}" for index in range(5)] + [f"down:{index}" for index in range(10)]
    publish_confirmed(second, "quorum.roles", (f"behind:{index}".encode() for index in range(5)))

    # Grown back once it runs: it catches up, then votes in every shard.
    third.start()
    third.wait_listening()
    cluster.wait_formed(expected=3)
    grown = queues(first, "grow", third.name, "all")
    assert grown.returncode == 0, grown.stderr
    roles_everywhere(cluster, names, [])
    eventually(lambda: (queue_info(third, "quorum.roles") or {}).get("messages") == 5, timeout=30, what="the third node caught up")
    # It counts toward commits now: with the first node gone, the second and third commit.
    first.kill(signal.SIGKILL)
    leader_of(cluster, "quorum.roles", among=[second, third])
    publish_confirmed(third, "quorum.roles", (f"after:{index}".encode() for index in range(5)))
    assert consume_acked(second, "quorum.roles", 10) == [f"behind:{index}" for index in range(5)] + [f"after:{index}" for index in range(5)]


def test_add_and_delete_member_act_on_the_queues_shard_and_the_last_voter_stays(cluster):
    first, second, third = cluster.nodes
    declare_quorum(first, "quorum.one")
    info = queue_info(first, "quorum.one")
    deleted = queues(first, "delete_member", "quorum.one", second.name)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.count("quorum shard") == 1 and "quorum.one" in deleted.stdout, deleted.stdout
    shard = int(deleted.stdout.split("quorum shard ")[1].split(":")[0])
    for node in cluster.nodes:
        eventually(lambda node=node: shard_members(node)[shard][1] == [second.name], what=f"the second node a learner of shard {shard}")
        others = [members for index, members in enumerate(shard_members(node)) if index != shard]
        assert all(voters == sorted(n.name for n in cluster.nodes) for voters, _, _ in others), others
    assert sorted(queue_info(first, "quorum.one")["members"]) == sorted(info["members"])  # still a member, as a learner
    # Down to one voter, which stays: it is the last.
    assert queues(first, "delete_member", "quorum.one", third.name).returncode == 0
    last = queues(first, "delete_member", "quorum.one", first.name)
    assert last.returncode != 0 and f"node {first.name} is the last voter of quorum shard {shard}" in last.stderr, last.stderr
    publish_confirmed(second, "quorum.one", [b"one voter"])
    assert consume_acked(third, "quorum.one", 1) == ["one voter"]
    added = queues(first, "add_member", "quorum.one", second.name)
    assert added.returncode == 0, added.stderr
    for node in cluster.nodes:
        eventually(lambda node=node: shard_members(node)[shard][0] == sorted([first.name, second.name]),
                   what=f"the second node a voter of shard {shard} again")
