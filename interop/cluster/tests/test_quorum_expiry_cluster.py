"""x-expires on a quorum queue in a three-node cluster: a consumer on a node that does not lead the
queue holds it; once it leaves, the node leading the queue's shard deletes the queue (a replicated
deletion), and it is gone from every node. Lepus only (the cluster harness starts Lepus nodes)."""

import time

import pika

from cluster_harness import eventually

EXPIRES_MS = 2000


def test_an_unused_quorum_queue_expires_on_every_node_and_a_consumer_elsewhere_holds_it(cluster):
    first, second, third = cluster.nodes
    connection = pika.BlockingConnection(pika.URLParameters(first.url()))
    connection.channel().queue_declare("quorum.expiring", durable=True,
                                       arguments={"x-queue-type": "quorum", "x-expires": EXPIRES_MS})
    connection.close()
    for node in cluster.nodes:
        eventually(lambda node=node: node.get("/queues/%2F/quorum.expiring").ok, what=f"the queue on {node.name}")
    # A consumer on each of the other nodes in turn, for twice the expiry: the queue stays.
    for node in (second, third):
        consumer = pika.BlockingConnection(pika.URLParameters(node.url()))
        channel = consumer.channel()
        channel.basic_consume("quorum.expiring", lambda *args: None)
        consumer.process_data_events(time_limit=2 * EXPIRES_MS / 1000.0)
        assert first.get("/queues/%2F/quorum.expiring").ok, f"deleted while consumed on {node.name}"
        left_at = time.monotonic()
        consumer.close()
    for node in cluster.nodes:
        eventually(lambda node=node: node.get("/queues/%2F/quorum.expiring").status_code == 404, timeout=20,
                   what=f"the unused queue gone on {node.name}")
    assert time.monotonic() - left_at >= EXPIRES_MS / 1000.0 * 0.9, "deleted before its expiry after the consumer left"


def test_basic_gets_through_nodes_that_do_not_lead_the_queue_hold_it(cluster):
    def empty_get(channel, name):
        method, _, _ = channel.basic_get(name, auto_ack=True)
        assert method is None

    # A basic.get (empty: a use all the same).
    assert_uses_through_other_nodes_hold_it(cluster, "quorum.got", empty_get)


def test_redeclares_through_nodes_that_do_not_lead_the_queue_hold_it(cluster):
    # A passive redeclare (a use, as RabbitMQ's "redeclaring renews the lease"; passive, so a
    # deleted queue is not declared afresh): a declare-ok each time.
    assert_uses_through_other_nodes_hold_it(cluster, "quorum.redeclared",
                                            lambda channel, name: channel.queue_declare(name, passive=True))


def assert_uses_through_other_nodes_hold_it(cluster, name, use):
    """`use` of the queue through each node that does not lead it, every third of the expiry, for
    three expiries: the leading node must count them, or it deletes the queue. Unused, it goes."""
    first = cluster.nodes[0]
    connection = pika.BlockingConnection(pika.URLParameters(first.url()))
    connection.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum", "x-expires": EXPIRES_MS})
    connection.close()
    leader = eventually(lambda: first.get("/queues/%2F/" + name).json().get("leader"), what="the queue's leader")
    others = [node for node in cluster.nodes if node.name != leader]
    channels = [pika.BlockingConnection(pika.URLParameters(node.url())).channel() for node in others]
    until = time.monotonic() + 3 * EXPIRES_MS / 1000.0
    while time.monotonic() < until:
        for channel in channels:
            use(channel, name)
        time.sleep(EXPIRES_MS / 3000.0)
    for node in cluster.nodes:
        assert node.get("/queues/%2F/" + name).ok, f"deleted on {node.name} although it was used through the other nodes"
    for channel in channels:
        channel.connection.close()
    for node in cluster.nodes:
        eventually(lambda node=node: node.get("/queues/%2F/" + name).status_code == 404, timeout=20,
                   what=f"the unused queue gone on {node.name}")
