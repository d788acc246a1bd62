"""Network faults between real nodes, through the in-tree link proxy (link_proxy.py): a follower
partitioned away, the leader partitioned away, links cut and delayed. The metadata group must
keep a single history: the majority side goes on, the minority side changes nothing, and every
node converges on the majority's definitions once the network heals."""

import time

import pika
import pytest

from cluster_harness import eventually


def leader_name(node):
    return node.status()["metadata"]["leader"]


def test_a_partitioned_follower_changes_nothing_and_catches_up_when_healed(proxied_cluster):
    cluster = proxied_cluster
    leader = cluster.leader()
    follower = next(node for node in cluster.nodes if node is not leader)
    majority = [node for node in cluster.nodes if node is not follower]
    cluster.proxy.partition([follower.name], [node.name for node in majority])
    try:
        assert majority[0].put("/vhosts/during-partition").status_code == 201
        assert majority[1].get("/vhosts/during-partition").ok
        channel = pika.BlockingConnection(pika.URLParameters(follower.url())).channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
            channel.queue_declare("partition.minority", durable=True)
        assert error.value.reply_code == 541 and "majority" in error.value.reply_text
        assert follower.get("/vhosts/during-partition").status_code == 404, "the minority saw a change it cannot have"
        assert cluster.proxy.held_connections > 0, "the proxy held nothing: the partition was not exercised"
    finally:
        cluster.proxy.heal()
    eventually(lambda: follower.get("/vhosts/during-partition").ok, timeout=30, what="the healed follower's catch-up")
    # The minority's declare was never committed: no node has the queue.
    for node in cluster.nodes:
        assert node.get("/queues/%2F/partition.minority").status_code == 404
    statuses = cluster.wait_formed()
    assert len({status["metadata"]["leader"] for status in statuses}) == 1


def test_a_partitioned_leader_steps_down_and_the_majority_elects_another(proxied_cluster):
    cluster = proxied_cluster
    old_leader = cluster.leader()
    others = [node for node in cluster.nodes if node is not old_leader]
    started = time.time()
    cluster.proxy.partition([old_leader.name], [node.name for node in others])
    try:
        new_leader = eventually(lambda: leader_name(others[0]) if leader_name(others[0]) in {node.name for node in others} else None,
                                timeout=15, what="a leader on the majority side")
        elected_s = time.time() - started
        assert leader_name(others[1]) == new_leader
        # Check-quorum: the isolated leader notices it hears from no majority and steps down.
        eventually(lambda: old_leader.status()["metadata"]["role"] != "leader", timeout=15, what="the isolated leader stepping down")
        assert others[1].put("/vhosts/new-leader").status_code == 201
        assert old_leader.put("/vhosts/old-leader").status_code >= 500, "the isolated node committed a change alone"
        for node in cluster.nodes:
            assert node.get("/vhosts/old-leader").status_code == 404, f"{node.name} applied a change no majority committed"
    finally:
        cluster.proxy.heal()
    eventually(lambda: old_leader.get("/vhosts/new-leader").ok, timeout=30, what="the old leader's catch-up")
    # The refused change answered "it may still be applied": its proposal may reach the new
    # leader once healed. Either way every node ends with one history: all have it or none.
    time.sleep(2)
    found = [node.get("/vhosts/old-leader").ok for node in cluster.nodes]
    assert len(set(found)) == 1, f"the nodes disagree on the isolated node's change: {found}"
    statuses = cluster.wait_formed()
    assert len({status["metadata"]["leader"] for status in statuses}) == 1
    print(f"a new leader {new_leader} in {elected_s:.1f} s after the partition")


def test_cut_links_are_dialled_again_and_delayed_links_still_commit(proxied_cluster):
    cluster = proxied_cluster
    # Cut the link between the two followers: both still reach the leader (a follower that
    # cannot reach the leader cannot propose: raft-rs forwards proposals to the leader only).
    third = cluster.leader()
    first, second = [node for node in cluster.nodes if node is not third]
    ups_before = sum(int(float(line.split()[-1])) for line in first.metrics().splitlines()
                     if line.startswith("lepus_cluster_links_up_total"))
    cluster.proxy.cut(first.name, second.name)
    # A majority stays connected through the leader: changes commit from every node.
    for node in cluster.nodes:
        assert node.put(f"/vhosts/cut-{node.name.split('@')[0]}").status_code == 201
    cluster.proxy.heal()
    eventually(lambda: any(peer["name"] == second.name and peer["running"] for peer in first.status()["members"]),
               timeout=20, what="the cut link dialled again")
    ups_after = sum(int(float(line.split()[-1])) for line in first.metrics().splitlines()
                    if line.startswith("lepus_cluster_links_up_total"))
    assert ups_after > ups_before, "no new link came up after the cut"
    # 150 ms each way on every link: heartbeats and appends are late, elections are not due.
    cluster.proxy.set_delay(150)
    try:
        for node in cluster.nodes:
            assert node.put(f"/vhosts/delayed-{node.name.split('@')[0]}").status_code == 201
    finally:
        cluster.proxy.heal()
    for node in cluster.nodes:
        for other in cluster.nodes:
            eventually(lambda node=node, other=other: node.get(f"/vhosts/delayed-{other.name.split('@')[0]}").ok,
                       what="every delayed change on every node")
