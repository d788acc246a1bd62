"""The x-delayed-message exchange through pika, as RabbitMQ's rabbitmq-delayed-message-exchange
plugin behaves (read from its README and source: rabbit_exchange_type_delayed_message.erl,
rabbit_delayed_message.erl, rabbit_delayed_message_utils.erl).

Lepus only: the reference node is Debian's rabbitmq-server 3.10.8, which does not ship the plugin,
so these tests cannot run against it.

- `x-delayed-type` is required and names an existing type other than x-delayed-message (406 with
  the plugin's texts; an unknown type is 503 as for any exchange type);
- `x-delay` (ms) holds a message back; missing, zero or negative routes it at once;
- at its time it is routed by the delayed type's rules, with `x-delay` negated;
- a delayed message routes nowhere at publish: mandatory returns it (312 NO_ROUTE) and the
  alternate exchange takes a copy at once, as with the plugin, and it is delivered later anyway;
- a persistent message to a durable delayed exchange is confirmed once it is on disk, and survives
  a restart and a kill -9; a transient one does not survive a restart.
"""

import os
import signal
import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from conftest import safe_close, unique, wait_until
from durability_support import start_broker

pytestmark = pytest.mark.skipif(
    not os.environ.get("LEPUS_BIN"),
    reason="Lepus only: the RabbitMQ reference node lacks rabbitmq_delayed_message_exchange (not in Debian's package)")

# Slack for a message's arrival past its due time: the broker's timer is far tighter (see
# bench/results for its lateness percentiles); this covers a loaded test machine and the client.
ARRIVAL_SLACK_SECONDS = 1.0


def declare_delayed(channel, name, delayed_type="direct", durable=False, **extra):
    arguments = {"x-delayed-type": delayed_type}
    arguments.update(extra)
    channel.exchange_declare(name, "x-delayed-message", durable=durable, arguments=arguments)


def bound_queue(channel, cleanup, exchange, routing_key="k"):
    queue = cleanup.queue(unique("delayed-q"))
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, routing_key)
    return queue


def publish(channel, exchange, body, delay=None, routing_key="k", mandatory=False, persistent=False):
    headers = {"x-delay": delay} if delay is not None else None
    properties = pika.BasicProperties(headers=headers, delivery_mode=2 if persistent else None)
    channel.basic_publish(exchange, routing_key, body.encode() if isinstance(body, str) else body, properties, mandatory=mandatory)


def collect(connection, channel, queue, count, timeout):
    """(monotonic arrival time, body, headers) of `count` messages, consumed with no-ack."""
    got = []
    tag = channel.basic_consume(queue, lambda ch, method, properties, body: got.append((time.monotonic(), body.decode(), properties.headers)),
                                auto_ack=True)
    wait_until(lambda: len(got) >= count, timeout=timeout, conn=connection)
    channel.basic_cancel(tag)
    return got


@pytest.mark.parametrize("arguments, code, text", [
    ({}, 406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": 5}, 406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": "x-delayed-message"}, 406,
     "PRECONDITION_FAILED - Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"),
    ({"x-delayed-type": "nonesuch"}, 503, "COMMAND_INVALID - unknown exchange type 'nonesuch'"),
])
def test_the_delayed_type_is_checked_at_declaration(channel, arguments, code, text):
    # 503 closes the connection, as RabbitMQ's check_type does for any unknown type.
    with pytest.raises((ChannelClosedByBroker, ConnectionClosedByBroker)) as refused:
        channel.exchange_declare(unique("delayed-bad"), "x-delayed-message", arguments=arguments)
    assert (refused.value.reply_code, refused.value.reply_text) == (code, text)


def test_messages_arrive_after_their_delay_in_due_order_with_the_delay_negated(connection, cleanup):
    channel = connection.channel()
    exchange = cleanup.exchange(unique("delayed-x"))
    declare_delayed(channel, exchange)
    queue = bound_queue(channel, cleanup, exchange)
    published_at = time.monotonic()
    publish(channel, exchange, "late", delay=900)
    publish(channel, exchange, "early", delay=300)
    publish(channel, exchange, "none")
    publish(channel, exchange, "zero", delay=0)
    publish(channel, exchange, "negative", delay=-50)
    publish(channel, exchange, "string", delay="600")
    got = collect(connection, channel, queue, 6, timeout=5)
    assert [body for _, body, _ in got] == ["none", "zero", "negative", "early", "string", "late"]
    arrival = {body: at - published_at for at, body, _ in got}
    for body, delay_ms in [("early", 300), ("string", 600), ("late", 900)]:
        assert delay_ms / 1000 <= arrival[body] < delay_ms / 1000 + ARRIVAL_SLACK_SECONDS, (body, arrival[body])
    assert arrival["none"] < 0.3, "an undelayed message waited"
    headers = {body: headers for _, body, headers in got}
    assert headers["late"] == {"x-delay": -900}
    assert headers["early"] == {"x-delay": -300}
    assert headers["string"] == {"x-delay": -600}
    # Undelayed messages keep their headers as published.
    assert headers["none"] is None
    assert headers["zero"] == {"x-delay": 0}
    assert headers["negative"] == {"x-delay": -50}


def test_routing_at_the_due_time_follows_the_delayed_type(connection, cleanup):
    channel = connection.channel()
    exchange = cleanup.exchange(unique("delayed-topic"))
    declare_delayed(channel, exchange, delayed_type="topic")
    orders = bound_queue(channel, cleanup, exchange, routing_key="orders.*")
    everything = bound_queue(channel, cleanup, exchange, routing_key="#")
    publish(channel, exchange, "o1", delay=200, routing_key="orders.eu")
    publish(channel, exchange, "p1", delay=200, routing_key="payments.eu")
    assert [body for _, body, _ in collect(connection, channel, everything, 2, timeout=5)] == ["o1", "p1"]
    assert [body for _, body, _ in collect(connection, channel, orders, 1, timeout=5)] == ["o1"]
    assert channel.queue_declare(orders, passive=True).method.message_count == 0


def test_a_mandatory_delayed_message_is_returned_at_once_and_delivered_later(connection, cleanup):
    channel = connection.channel()
    exchange = cleanup.exchange(unique("delayed-mandatory"))
    declare_delayed(channel, exchange)
    queue = bound_queue(channel, cleanup, exchange)
    returned = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method.reply_code, method.reply_text, body)))
    publish(channel, exchange, "delayed", delay=200, mandatory=True)
    publish(channel, exchange, "routed", mandatory=True)
    wait_until(lambda: returned, conn=connection)
    assert returned == [(312, "NO_ROUTE", b"delayed")]
    got = collect(connection, channel, queue, 2, timeout=5)
    assert [body for _, body, _ in got] == ["routed", "delayed"]
    assert returned == [(312, "NO_ROUTE", b"delayed")], "the delivery at the due time is not returned"


def test_the_alternate_exchange_takes_a_copy_at_publish_as_with_the_plugin(connection, cleanup):
    channel = connection.channel()
    alternate = cleanup.exchange(unique("delayed-ae"))
    channel.exchange_declare(alternate, "fanout")
    parked = cleanup.queue(unique("delayed-parked"))
    channel.queue_declare(parked)
    channel.queue_bind(parked, alternate)
    exchange = cleanup.exchange(unique("delayed-with-ae"))
    declare_delayed(channel, exchange, **{"alternate-exchange": alternate})
    queue = bound_queue(channel, cleanup, exchange)
    publish(channel, exchange, "m", delay=300)
    # At once, unchanged (x-delay still positive): what routed nowhere went to the alternate.
    assert [(body, headers) for _, body, headers in collect(connection, channel, parked, 1, timeout=2)] == [("m", {"x-delay": 300})]
    assert [(body, headers) for _, body, headers in collect(connection, channel, queue, 1, timeout=5)] == [("m", {"x-delay": -300})]


def test_confirms_come_for_delayed_messages(connection, cleanup):
    channel = connection.channel()
    channel.confirm_delivery()
    exchange = cleanup.exchange(unique("delayed-confirm"))
    declare_delayed(channel, exchange, durable=True)
    queue = bound_queue(channel, cleanup, exchange)
    for index in range(20):
        # pika's blocking channel raises on a nack: each publish returns once it is acked.
        publish(channel, exchange, "c%d" % index, delay=100 + index, persistent=True)
    got = collect(connection, channel, queue, 20, timeout=5)
    assert [body for _, body, _ in got] == ["c%d" % index for index in range(20)]


def test_a_deleted_exchange_drops_its_pending_messages(connection, cleanup):
    channel = connection.channel()
    exchange = unique("delayed-deleted")
    declare_delayed(channel, exchange)
    queue = bound_queue(channel, cleanup, exchange)
    publish(channel, exchange, "gone", delay=200)
    channel.exchange_delete(exchange)
    time.sleep(0.6)
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_many_timers_fire_in_due_order(connection, cleanup):
    channel = connection.channel()
    exchange = cleanup.exchange(unique("delayed-many"))
    declare_delayed(channel, exchange)
    queue = bound_queue(channel, cleanup, exchange)
    delays = [(index * 37) % 500 + 50 for index in range(300)]
    due = []
    for index, delay in enumerate(delays):
        due.append(time.monotonic() + delay / 1000)
        publish(channel, exchange, "%d" % index, delay=delay)
    got = collect(connection, channel, queue, len(delays), timeout=10)
    # The broker starts a clock when it reads the publish, which on a loaded machine may be some
    # milliseconds after the client sent it: due times closer than that may swap.
    arrived_due = [due[int(body)] for _, body, _ in got]
    disorder = [(earlier, later) for earlier, later in zip(arrived_due, arrived_due[1:]) if later < earlier - 0.05]
    assert not disorder, disorder
    early = [(body, due[int(body)] - at) for at, body, _ in got if at < due[int(body)] - 0.002]
    assert not early, "arrived before their time: %s" % early
    late = [(body, at - due[int(body)]) for at, body, _ in got if at > due[int(body)] + ARRIVAL_SLACK_SECONDS]
    assert not late, late


@pytest.mark.lepus_only
@pytest.mark.parametrize("how", ["restart", "kill"])
def test_a_persistent_delayed_message_survives_a_restart_and_a_kill(tmp_path, how):
    broker = start_broker(tmp_path)
    try:
        conn = broker.connect()
        channel = conn.channel()
        channel.confirm_delivery()
        declare_delayed(channel, "delayed-durable", durable=True)
        channel.queue_declare("delayed-target", durable=True)
        channel.queue_bind("delayed-target", "delayed-durable", "k")
        published_at = time.monotonic()
        publish(channel, "delayed-durable", "kept", delay=1500, persistent=True)
        publish(channel, "delayed-durable", "transient", delay=1500, persistent=False)
        safe_close(conn)
        if how == "kill":
            broker.kill()
        else:
            broker.stop(signal.SIGTERM)
        broker.start()
        assert broker.metric("lepus_delayed_messages") >= 1
        conn = broker.connect()
        try:
            channel = conn.channel()
            got = collect(conn, channel, "delayed-target", 1, timeout=10)
            assert [(body, headers) for _, body, headers in got] == [("kept", {"x-delay": -1500})]
            assert got[0][0] - published_at >= 1.5, "delivered before its time"
            time.sleep(0.5)
            if how == "restart":
                assert channel.queue_declare("delayed-target", passive=True).method.message_count == 0, "the transient one came back"
        finally:
            safe_close(conn)
        # Routed once: after another restart nothing comes again.
        broker.stop(signal.SIGTERM)
        broker.start()
        assert broker.metric("lepus_delayed_messages") == 0
    finally:
        broker.kill()
