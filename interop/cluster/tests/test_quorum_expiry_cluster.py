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
