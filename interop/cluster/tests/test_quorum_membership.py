"""Quorum shards' membership follows the cluster's (docs/cluster.md, "Quorum queues across
nodes"): a fourth node that joins after formation becomes a learner of every shard and serves
every quorum queue (declare, publish with confirms, consume, get, ack) from its own apply; kill -9
of it loses nothing confirmed, and it catches up from its persisted membership when restarted;
forgetting a killed founding node removes it from every shard and promotes the caught-up learner,
so the shards keep committing with the rest, even once a second founding node is gone."""

import re
import signal
import subprocess
import threading
import time

import pika

from cluster_harness import LEPUS_BIN, Node, eventually, free_port
from history import History, check, publish_until, read
from test_quorum_cluster import declare_quorum, drain, leader_of, publish_confirmed, queue_info


def consume_acked(node, queue, count, prefetch=5, timeout_s=10):
    """Consumes `count` messages through `node`, acking each; their bodies in order."""
    connection = pika.BlockingConnection(pika.URLParameters(node.url()))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    received = []
    for method, _, body in channel.consume(queue, inactivity_timeout=timeout_s):
        assert method is not None, f"only {len(received)} of {count} delivered through {node.name}"
        received.append(body.decode())
        channel.basic_ack(method.delivery_tag)
        if len(received) == count:
            break
    channel.cancel()
    connection.close()
    return received


def members_of(node, queue):
    return sorted((queue_info(node, queue) or {}).get("members", []))


def promoted_shards(*nodes):
    """The shards whose leader (one of `nodes`) proposed a learner's promotion, by their logs."""
    lines = (line for node in nodes for line in node.log().splitlines() if "changing the quorum shard's members" in line)
    return {int(match.group(1)) for line in lines if (match := re.search(r"shard=(\d+).*change=AddNode", line))}


def forget(through, name):
    return subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{through.http_port}", "forget_cluster_node", name],
                          capture_output=True, text=True, timeout=60)


def test_a_joined_node_serves_quorum_queues_and_replaces_a_forgotten_founding_node(cluster, tmp_path):
    first, second, third = cluster.nodes
    declare_quorum(first, "quorum.before")
    publish_confirmed(first, "quorum.before", (f"{first.name}:{index}".encode() for index in range(10)))
    # A name declared, deleted and declared again before the join: the joined node must not
    # replay the old deletion into the shard (it would delete the live queue).
    declare_quorum(second, "quorum.reborn")
    connection = pika.BlockingConnection(pika.URLParameters(second.url()))
    connection.channel().queue_delete("quorum.reborn")
    connection.close()
    declare_quorum(second, "quorum.reborn")
    publish_confirmed(second, "quorum.reborn", (b"kept" for _ in range(3)))

    # A fourth node joins: every shard's leader adds it as a learner.
    late = Node(str(tmp_path), "n4", cluster.seeds, free_port()).start()
    cluster.nodes.append(late)
    late.wait_listening()
    cluster.wait_formed(expected=4)
    four = sorted(node.name for node in cluster.nodes)
    eventually(lambda: members_of(late, "quorum.before") == four, timeout=30, what="the late node a member of the queue's shard")
    eventually(lambda: (queue_info(late, "quorum.before") or {}).get("messages") == 10, timeout=30,
               what="the late node's copy of the queue caught up")
    time.sleep(1.0)  # what the late node would wrongly propose from its replay has committed
    for node in cluster.nodes:
        assert (queue_info(node, "quorum.reborn") or {}).get("messages") == 3, (node.name, queue_info(node, "quorum.reborn"))

    # A queue declared before the join, used through the late node: publish with confirms,
    # consume and ack there; each publisher's order kept; gone on every node once acked.
    publish_confirmed(late, "quorum.before", (f"{late.name}:{index}".encode() for index in range(10)))
    received = consume_acked(late, "quorum.before", 20)
    for node in (first, late):
        assert [body for body in received if body.startswith(node.name + ":")] == [f"{node.name}:{index}" for index in range(10)]
    for node in cluster.nodes:
        eventually(lambda node=node: queue_info(node, "quorum.before")["messages"] == 0, what=f"quorum.before empty on {node.name}")

    # A queue declared through the late node, used through the founding nodes.
    declare_quorum(late, "quorum.joined")
    for node in cluster.nodes:
        eventually(lambda node=node: members_of(node, "quorum.joined") == four, what=f"quorum.joined with four members on {node.name}")
    publish_confirmed(late, "quorum.joined", (f"{late.name}:{index}".encode() for index in range(5)))
    publish_confirmed(second, "quorum.joined", (f"{second.name}:{index}".encode() for index in range(5)))
    received = consume_acked(third, "quorum.joined", 10)
    assert sorted(received) == sorted([f"{late.name}:{index}" for index in range(5)] + [f"{second.name}:{index}" for index in range(5)])
    connection = pika.BlockingConnection(pika.URLParameters(late.url()))
    assert connection.channel().basic_get("quorum.joined")[0] is None
    connection.close()

    # kill -9 of the late node under confirmed load (publishers on it and on a founding node):
    # nothing confirmed is lost; restarted, it catches up from its persisted membership.
    history_path = tmp_path / "history.jsonl"
    history = History(str(history_path))
    stopping = threading.Event()
    publishers = [threading.Thread(target=publish_until, args=(late, "p-late", "quorum.joined", history, stopping, False)),
                  threading.Thread(target=publish_until, args=(second, "p-second", "quorum.joined", history, stopping))]
    for thread in publishers:
        thread.start()
    time.sleep(1.5)
    late.kill(signal.SIGKILL)
    time.sleep(1.0)
    stopping.set()
    for thread in publishers:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a publisher hung"
    late.start()
    late.wait_listening()
    cluster.wait_formed(expected=4)
    drained = drain(first, "quorum.joined", history)
    history.close()
    events = read(str(history_path))
    confirmed = sum(1 for event in events if event["event"] == "confirm" and event["ack"])
    violations = check(events)
    assert not violations, f"history {history_path}: {violations[:10]}"
    assert confirmed > 0 and drained >= confirmed, (confirmed, drained)
    assert any(event["event"] == "confirm" and event["ack"] and event["publisher"] == "p-late" for event in events)
    eventually(lambda: (queue_info(late, "quorum.joined") or {}).get("messages") == 0, timeout=30,
               what="the restarted late node caught up")

    # A founding node dies and is forgotten: it leaves every shard, the learner is promoted.
    third.kill(signal.SIGKILL)
    forgotten = forget(first, third.name)
    assert forgotten.returncode == 0, forgotten.stderr
    three = sorted([first.name, second.name, late.name])
    for queue in ("quorum.before", "quorum.joined"):
        for node in (first, second, late):
            eventually(lambda node=node, queue=queue: members_of(node, queue) == three, timeout=30,
                       what=f"{queue} without the forgotten node on {node.name}")
    # The late node votes now: with the second founding node gone too, the first and the late
    # node are a majority of the shards' voters and still commit (a learner would not count).
    eventually(lambda: promoted_shards(first, second) == {0, 1, 2}, timeout=30, what="the late node promoted in all three shards")
    time.sleep(1.0)  # the promotions' commits reach every voter
    second.kill(signal.SIGKILL)
    for queue in ("quorum.before", "quorum.joined"):
        leader_of(cluster, queue, among=[first, late])
        publish_confirmed(first, queue, (f"after:{index}".encode() for index in range(5)))
        assert consume_acked(late, queue, 5) == [f"after:{index}" for index in range(5)]
    # With the joined node gone as well, forgetting the second node would leave the shards'
    # voters (the first and the joined node) without a running majority: refused, saying why.
    late.kill(signal.SIGKILL)
    eventually(lambda: (queue_info(first, "quorum.joined") or {}).get("online") == [first.name], what="the first node alone online")
    refused = forget(first, second.name)
    assert refused.returncode != 0 and "not a working majority" in refused.stderr, refused.stderr
