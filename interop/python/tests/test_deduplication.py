"""Message deduplication through pika (beyond RabbitMQ: LavinMQ's feature and the
rabbitmq-message-deduplication plugin's, with their argument and header names). Lepus only: the
RabbitMQ reference node has no such plugin, and ignores the arguments.

- on an exchange of any type with `x-message-deduplication: true` (LavinMQ), or of the plugin's
  type `x-message-deduplication` (routes as fanout; requires `x-cache-size`): a message whose
  `x-deduplication-header` was seen within `x-cache-ttl` is routed nowhere (a mandatory one is
  returned 312 NO_ROUTE, as by LavinMQ and the plugin) and still confirmed;
- on a queue with `x-message-deduplication: true` (classic or quorum): such a message is not
  enqueued;
- the cache holds `x-cache-size` entries and evicts the oldest inserted first; a message's own
  `x-cache-ttl` header overrides the cache's; `x-deduplication-header` names another header;
- a bad value is 406 naming the argument;
- a durable owner's cache survives a restart and a kill -9 (`x-cache-persistence: memory` forgets).
"""

import os
import signal
import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import safe_close, unique, wait_until
from durability_support import start_broker

pytestmark = pytest.mark.skipif(
    not os.environ.get("LEPUS_BIN"),
    reason="Lepus only: RabbitMQ 3.10.8 has no message deduplication (a plugin not shipped by Debian)")


def publish(channel, exchange, routing_key, body, key=None, ttl=None, header="x-deduplication-header", mandatory=False):
    headers = {}
    if key is not None:
        headers[header] = key
    if ttl is not None:
        headers["x-cache-ttl"] = ttl
    channel.basic_publish(exchange, routing_key, body.encode(), pika.BasicProperties(headers=headers or None, delivery_mode=2),
                          mandatory=mandatory)


def bodies(channel, queue):
    got = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(body.decode())


def deduplicating_exchange(channel, cleanup, **arguments):
    exchange = cleanup.exchange(unique("dedup-x"))
    channel.exchange_declare(exchange, "direct", arguments=dict({"x-message-deduplication": True}, **arguments))
    queue = cleanup.queue(unique("dedup-q"))
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, "k")
    return exchange, queue


def test_an_exchange_routes_a_key_once_and_returns_a_mandatory_duplicate(connection, cleanup):
    # Without confirms: pika's confirming channel raises on a returned message instead.
    channel = connection.channel()
    exchange, queue = deduplicating_exchange(channel, cleanup)
    returned = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method.reply_code, body)))
    publish(channel, exchange, "k", "first", key="order-1")
    publish(channel, exchange, "k", "again", key="order-1", mandatory=True)
    publish(channel, exchange, "k", "other", key="order-2")
    publish(channel, exchange, "k", "unkeyed")
    publish(channel, exchange, "k", "unkeyed twice")
    wait_until(lambda: returned, conn=connection)
    assert returned == [(312, b"again")]
    assert bodies(channel, queue) == ["first", "other", "unkeyed", "unkeyed twice"]


def test_the_plugin_exchange_type_routes_as_fanout_and_requires_a_cache_size(connection, cleanup):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.exchange_declare(unique("dedup-plugin-bad"), "x-message-deduplication")
    assert refused.value.reply_code == 406
    assert "invalid arg 'x-cache-size'" in refused.value.reply_text
    channel = connection.channel()
    exchange = cleanup.exchange(unique("dedup-plugin"))
    channel.exchange_declare(exchange, "x-message-deduplication", arguments={"x-cache-size": 10})
    queues = [cleanup.queue(unique("dedup-fan")) for _ in range(2)]
    for queue in queues:
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "ignored")
    publish(channel, exchange, "any", "m", key=1)
    publish(channel, exchange, "any", "m again", key=1)
    assert [bodies(channel, queue) for queue in queues] == [["m"], ["m"]]


def test_a_key_is_routed_again_once_its_ttl_passes_and_a_message_ttl_wins(connection, cleanup):
    channel = connection.channel()
    exchange, queue = deduplicating_exchange(channel, cleanup, **{"x-cache-ttl": 300})
    publish(channel, exchange, "k", "a1", key="a")
    publish(channel, exchange, "k", "b1", key="b", ttl=5000)
    publish(channel, exchange, "k", "a2", key="a")
    time.sleep(0.45)
    publish(channel, exchange, "k", "a3", key="a")
    publish(channel, exchange, "k", "b2", key="b")
    assert bodies(channel, queue) == ["a1", "b1", "a3"]


def test_a_full_cache_forgets_its_oldest_key_and_the_header_can_be_named(connection, cleanup):
    channel = connection.channel()
    exchange, queue = deduplicating_exchange(channel, cleanup, **{"x-cache-size": 2, "x-deduplication-header": "id"})
    for key in ["a", "b", "c", "a", "c"]:
        publish(channel, exchange, "k", key, key=key, header="id")
    # An x-deduplication-header here is not the key: never deduplicated.
    publish(channel, exchange, "k", "d", key="d")
    publish(channel, exchange, "k", "d", key="d")
    assert bodies(channel, queue) == ["a", "b", "c", "a", "d", "d"]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_queue_enqueues_a_key_once(connection, cleanup, queue_type):
    channel = connection.channel()
    channel.confirm_delivery()
    queue = cleanup.queue(unique("dedup-queue"))
    arguments = {"x-message-deduplication": True, "x-cache-size": 2, "x-queue-type": queue_type}
    channel.queue_declare(queue, durable=True, arguments=arguments)
    for body, key in [("q1", "x"), ("q2", "x"), ("q3", "y")]:
        publish(channel, "", queue, body, key=key)
    assert bodies(channel, queue) == ["q1", "q3"]
    # Consumed, but within its time to live: still a duplicate (one cache, as on exchanges).
    publish(channel, "", queue, "q4", key="x")
    publish(channel, "", queue, "unkeyed")
    # A message's own x-cache-ttl: "z" counts 300 ms; the cache holds 2 keys, so "z" evicts "x".
    publish(channel, "", queue, "z1", key="z", ttl=300)
    publish(channel, "", queue, "z2", key="z")
    publish(channel, "", queue, "x again", key="x")
    time.sleep(0.45)
    publish(channel, "", queue, "z3", key="z")
    assert bodies(channel, queue) == ["unkeyed", "z1", "x again", "z3"]


@pytest.mark.parametrize("kind, arguments, key, problem", [
    ("exchange", {"x-message-deduplication": True, "x-cache-size": 0}, "x-cache-size", "{value_not_positive,0}"),
    ("exchange", {"x-message-deduplication": True, "x-cache-persistence": "tape"}, "x-cache-persistence", '{unacceptable_value,<<"tape">>}'),
    ("queue", {"x-message-deduplication": "yes"}, "x-message-deduplication", "{unacceptable_type,longstr}"),
    ("queue", {"x-message-deduplication": True, "x-cache-ttl": -5}, "x-cache-ttl", "{value_negative,-5}"),
])
def test_a_bad_argument_is_406_naming_it(channel, kind, arguments, key, problem):
    name = unique("dedup-bad")
    with pytest.raises(ChannelClosedByBroker) as refused:
        if kind == "exchange":
            channel.exchange_declare(name, "direct", arguments=arguments)
        else:
            channel.queue_declare(name, arguments=arguments)
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == "PRECONDITION_FAILED - invalid arg '%s' for %s '%s' in vhost '/': %s" % (key, kind, name, problem)


@pytest.mark.lepus_only
@pytest.mark.parametrize("how", ["restart", "kill"])
def test_a_durable_cache_survives_a_restart_and_a_kill(tmp_path, how):
    broker = start_broker(tmp_path)
    try:
        conn = broker.connect()
        channel = conn.channel()
        channel.confirm_delivery()
        channel.exchange_declare("dedup-durable", "direct", durable=True, arguments={"x-message-deduplication": True})
        channel.exchange_declare("dedup-memory", "direct", durable=True,
                                 arguments={"x-message-deduplication": True, "x-cache-persistence": "memory"})
        channel.queue_declare("dedup-target", durable=True)
        channel.queue_declare("dedup-queue", durable=True, arguments={"x-message-deduplication": True})
        channel.queue_declare("dedup-quorum", durable=True, arguments={"x-message-deduplication": True, "x-queue-type": "quorum"})
        for exchange in ["dedup-durable", "dedup-memory"]:
            channel.queue_bind("dedup-target", exchange, "k")
            publish(channel, exchange, "k", "before " + exchange, key="once")
        publish(channel, "", "dedup-queue", "queued before", key="once")
        publish(channel, "", "dedup-quorum", "quorum before", key="once")
        safe_close(conn)
        if how == "kill":
            broker.kill()
        else:
            broker.stop(signal.SIGTERM)
        broker.start()
        conn = broker.connect()
        try:
            channel = conn.channel()
            channel.confirm_delivery()
            for exchange in ["dedup-durable", "dedup-memory"]:
                publish(channel, exchange, "k", "after " + exchange, key="once")
            publish(channel, "", "dedup-queue", "queued after", key="once")
            publish(channel, "", "dedup-quorum", "quorum after", key="once")
            assert bodies(channel, "dedup-target") == ["before dedup-durable", "before dedup-memory", "after dedup-memory"]
            assert bodies(channel, "dedup-queue") == ["queued before"]
            # A quorum queue's cache is its replicated state: back from its log (or snapshot).
            assert bodies(channel, "dedup-quorum") == ["quorum before"]
        finally:
            safe_close(conn)
    finally:
        broker.kill()
