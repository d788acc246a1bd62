"""x-delayed-message exchanges in a cluster (the delayed-message plugin's exchange, a Lepus
extension on the reference side): a delayed message is held in the cluster's replicated delay
store, confirmed once a majority holds it, so the death of the node that took the publish loses
none of it (another node routes it once it is overdue), and a node's own classic queue gets the
messages published through that node at their time."""

import signal
import time

import pika

from cluster_harness import eventually, get_all

DELAYED = {"x-delayed-type": "direct"}


def channel_on(node):
    connection = pika.BlockingConnection(pika.URLParameters(node.url()))
    return connection, connection.channel()


def publish_delayed(channel, exchange, bodies, delay_ms):
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish(exchange, "k", body.encode(), pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay_ms}))


def held(node):
    """The node's lepus_delayed_messages gauge."""
    line = next(line for line in node.metrics().splitlines() if line.startswith("lepus_delayed_messages "))
    return int(float(line.split()[1]))


def count(channel, queue):
    return channel.queue_declare(queue, durable=True, passive=True, arguments=None).method.message_count


def test_delayed_messages_survive_the_death_of_the_node_that_took_them(cluster):
    first, second, third = cluster.nodes
    connection, channel = channel_on(second)
    channel.exchange_declare("delayed.x", "x-delayed-message", durable=True, arguments=DELAYED)
    channel.queue_declare("delayed.quorum", durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_bind("delayed.quorum", "delayed.x", "k")
    connection.close()
    eventually(lambda: third.get("/exchanges/%2F/delayed.x").ok, what="the exchange on every node")
    connection, channel = channel_on(first)
    bodies = [f"d{number}" for number in range(20)]
    publish_delayed(channel, "delayed.x", bodies, 2000)
    # Every node holds them (the replicated store), so every node's gauge counts them.
    for node in cluster.nodes:
        eventually(lambda node=node: held(node) == len(bodies), what=f"{len(bodies)} held delayed messages on {node.name}")
    # Every publish is confirmed: the store's majority holds them. The node that took them dies.
    first.kill(signal.SIGKILL)
    connection, channel = channel_on(second)
    try:
        assert count(channel, "delayed.quorum") == 0, "routed before their delay"
        eventually(lambda: count(channel, "delayed.quorum") >= len(bodies), timeout=30,
                   what="the dead node's delayed messages routed by another node")
    finally:
        connection.close()
    first.start()
    first.wait_listening()
    cluster.wait_formed()
    time.sleep(2.0)
    messages = get_all(first, "delayed.quorum")
    assert all(properties.headers["x-delay"] == -2000 for properties, _ in messages)
    got = [body.decode() for _, body in messages]
    assert sorted(got) == sorted(bodies), "each delayed message routed once, none lost"
    for node in cluster.nodes:
        eventually(lambda node=node: held(node) == 0, what=f"the store released on {node.name}")


def test_a_delayed_message_reaches_the_classic_queue_of_the_node_that_took_it_on_time(cluster):
    for node in cluster.nodes:
        connection, channel = channel_on(node)
        if node is cluster.nodes[0]:
            channel.exchange_declare("delayed.local", "x-delayed-message", durable=True, arguments=DELAYED)
        queue = f"delayed.classic.{node.name}"
        eventually(lambda: node.get("/exchanges/%2F/delayed.local").ok, what="the exchange on every node")
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, "delayed.local", "k")
        connection.close()
    for node in cluster.nodes:
        connection, channel = channel_on(node)
        publish_delayed(channel, "delayed.local", [f"from {node.name}"], 1000)
        published_at = time.time()
        queue = f"delayed.classic.{node.name}"
        eventually(lambda: count(channel, queue) == 1, timeout=10, what=f"the message in {queue}")
        # Routed by its own node at its time, not by another node seconds after it was overdue.
        assert time.time() - published_at < 4.0
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert body.decode() == f"from {node.name}"
        connection.close()
