"""Stream queues over AMQP 0-9-1 (x-queue-type: stream), through pika, against the broker under
test: RabbitMQ 3.10.8 (which runs stream queues without a plugin) and Lepus alike.

What must hold: a stream is durable only; consumers need a prefetch and acks (an ack only moves
the consumer's credit, it removes nothing); `x-stream-offset` on basic.consume starts a consumer at
first, last, next, an offset, a timestamp or an interval ago; every delivery carries its offset in
the `x-stream-offset` header; any number of consumers read independently; retention (arguments
and policies) trims whole segments from the front; and every refusal has RabbitMQ's code and text.
Each reply text here was measured on RabbitMQ 3.10.8.
"""

import base64
import datetime
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest

from conftest import RECEIVE_TIMEOUT, connect, safe_close, unique, wait_until

STREAM = {"x-queue-type": "stream"}


def declare_stream(channel, name, **arguments):
    channel.queue_declare(name, durable=True, arguments=dict(STREAM, **arguments))
    return name


@pytest.fixture
def stream(cleanup, channel):
    """A new stream queue's name (deleted after the test)."""
    return cleanup.queue(declare_stream(channel, unique("stream")))


def publish_confirmed(channel, routing_key, bodies, properties=None, exchange=""):
    """Publishes each body with a confirm, one at a time: each is its own chunk on both brokers."""
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish(exchange, routing_key, body, properties or pika.BasicProperties(), mandatory=True)


def read(connection, queue, offset=None, count=None, prefetch=100, timeout=RECEIVE_TIMEOUT, quiet=0.5):
    """Consumes (with acks) from `offset` until `count` deliveries, or until nothing comes for
    `quiet` seconds when count is None; returns [(method, properties, body)] and cancels.

    With a count, the prefetch is the count and nothing is acked, so no delivery can be in flight
    when the consumer is cancelled: pika rejects a delivery that arrives during the cancel, and a
    reject on a stream is a connection error (540) on both brokers."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch if count is None else count)
    got = []

    def on_message(ch, method, properties, body):
        got.append((method, properties, body))
        if count is None:
            ch.basic_ack(method.delivery_tag)

    arguments = {} if offset is None else {"x-stream-offset": offset}
    tag = channel.basic_consume(queue, on_message, arguments=arguments)
    if count is not None:
        wait_until(lambda: len(got) >= count, timeout=timeout, conn=connection)
    else:
        last = [-1, time.monotonic()]

        def settled():
            if len(got) != last[0]:
                last[0], last[1] = len(got), time.monotonic()
            return time.monotonic() - last[1] >= quiet

        wait_until(settled, timeout=timeout, conn=connection)
    channel.basic_cancel(tag)
    channel.close()
    return got


def offsets_and_bodies(deliveries):
    return [(properties.headers["x-stream-offset"], body) for _, properties, body in deliveries]


def closed_with(error, code, text):
    assert (error.value.reply_code, error.value.reply_text) == (code, text)


# ------------------------------------------------------------------ declarations


@pytest.mark.parametrize("durable, exclusive, auto_delete, refused", [
    (False, False, False, "non-durable"),
    (False, True, False, "exclusive-owner"),
    (True, True, True, "auto-delete"),
    (False, True, True, "auto-delete"),
])
def test_a_stream_is_durable_not_exclusive_and_not_auto_delete(connection, durable, exclusive, auto_delete, refused):
    name = unique("stream-property")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
        connection.channel().queue_declare(name, durable=durable, exclusive=exclusive, auto_delete=auto_delete, arguments=STREAM)
    closed_with(error, 406, "PRECONDITION_FAILED - invalid property '%s' for queue '%s' in vhost '/'" % (refused, name))


@pytest.mark.parametrize("arguments, text", [
    ({"x-max-length": 10}, "invalid arg 'x-max-length' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    ({"x-message-ttl": 10}, "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    ({"x-dead-letter-exchange": "x"}, "invalid arg 'x-dead-letter-exchange' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    ({"x-overflow": "reject-publish"}, "invalid arg 'x-overflow' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    ({"x-single-active-consumer": True}, "invalid arg 'x-single-active-consumer' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    ({"x-max-priority": 5}, "invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    ({"x-queue-mode": "lazy"}, "invalid arg 'x-queue-mode' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    ({"x-max-age": "1x"}, "invalid arg 'x-max-age' for queue '{q}' in vhost '/': invalid_max_age"),
    ({"x-max-age": "0D"}, "invalid arg 'x-max-age' for queue '{q}' in vhost '/': invalid_max_age"),
    ({"x-max-age": 10}, "invalid arg 'x-max-age' for queue '{q}' in vhost '/': {unacceptable_type,signedint}"),
    ({"x-max-length-bytes": -1}, "invalid arg 'x-max-length-bytes' for queue '{q}' in vhost '/': {value_negative,-1}"),
    ({"x-stream-max-segment-size-bytes": "1000"},
     "invalid arg 'x-stream-max-segment-size-bytes' for queue '{q}' in vhost '/': \"expected integer, got longstr\""),
    ({"x-stream-max-segment-size-bytes": -5},
     "invalid arg 'x-stream-max-segment-size-bytes' for queue '{q}' in vhost '/': {value_negative,-5}"),
    ({"x-stream-max-segment-size-bytes": 3000000001}, "Exceeded max value for x-stream-max-segment-size-bytes"),
    # A bad value of an argument streams take comes before one they do not take.
    ({"x-max-length": 1, "x-max-age": 1}, "invalid arg 'x-max-age' for queue '{q}' in vhost '/': {unacceptable_type,signedint}"),
])
def test_stream_arguments_are_refused_with_rabbitmq_texts(connection, arguments, text):
    name = unique("stream-argument")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
        connection.channel().queue_declare(name, durable=True, arguments=dict(STREAM, **arguments))
    closed_with(error, 406, "PRECONDITION_FAILED - " + text.replace("{q}", name))


def test_an_unparsable_max_age_is_an_internal_error_as_in_rabbitmq(connection):
    """RabbitMQ 3.10.8 crashes on an x-max-age without digits (541, the connection closes)."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
        connection.channel().queue_declare(unique("stream-age"), durable=True, arguments=dict(STREAM, **{"x-max-age": "bad"}))
    closed_with(error, 541, "INTERNAL_ERROR")


def test_accepted_arguments_declare_and_redeclare(cleanup, channel):
    name = cleanup.queue(unique("stream-accepted"))
    arguments = dict(STREAM, **{"x-max-length-bytes": 1000000, "x-max-age": "7D", "x-stream-max-segment-size-bytes": 500000,
                                "x-initial-cluster-size": 1, "x-custom": "ignored"})
    declared = channel.queue_declare(name, durable=True, arguments=arguments).method
    assert (declared.queue, declared.message_count, declared.consumer_count) == (name, 0, 0)
    channel.queue_declare(name, durable=True, arguments=arguments)
    channel.queue_declare(name, passive=True)
    name = cleanup.queue(declare_stream(channel, unique("stream-plain")))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
        channel.queue_declare(name, durable=True)
    closed_with(error, 406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '%s' in vhost '/': "
                            "received none but current is the value 'stream' of type 'longstr'" % name)


# ------------------------------------------------------------------ consumers and what a stream refuses


def test_a_consumer_needs_a_prefetch_acks_and_no_priority(connection, stream):
    refusals = [
        (dict(prefetch=0, no_ack=False), pika.exceptions.ChannelClosedByBroker, 406,
         "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '%s' in vhost '/''" % stream),
        (dict(prefetch=0, no_ack=True), pika.exceptions.ChannelClosedByBroker, 406,
         "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '%s' in vhost '/''" % stream),
        (dict(prefetch=10, no_ack=True), pika.exceptions.ConnectionClosedByBroker, 540,
         "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue '%s' in vhost '/'" % stream),
        (dict(prefetch=10, no_ack=False, global_prefetch=5), pika.exceptions.ConnectionClosedByBroker, 540,
         "NOT_IMPLEMENTED - queue '%s' in vhost '/' does not support global qos" % stream),
        (dict(prefetch=0, no_ack=True, arguments={"x-priority": 5}), pika.exceptions.ChannelClosedByBroker, 406,
         "PRECONDITION_FAILED - invalid arg 'x-priority' for queue '%s' in vhost '/' of queue type rabbit_stream_queue" % stream),
    ]
    for case, kind, code, text in refusals:
        conn = connect()
        try:
            channel = conn.channel()
            channel.basic_qos(prefetch_count=case["prefetch"])
            if "global_prefetch" in case:
                channel.basic_qos(prefetch_count=case["global_prefetch"], global_qos=True)
            with pytest.raises(kind) as error:
                channel.basic_consume(stream, lambda *args: None, auto_ack=case["no_ack"], arguments=case.get("arguments"))
            closed_with(error, code, text)
        finally:
            safe_close(conn)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    assert channel.basic_consume(stream, lambda *args: None, exclusive=True)


@pytest.mark.parametrize("offset, code, text", [
    ("5x", 406, "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{q}' in vhost '/': "
                "{{invalid_stream_offset_arg,{{longstr,<<\"5x\">>}}}}"),
    ("bogus", 541, "INTERNAL_ERROR"),
    (True, 541, "INTERNAL_ERROR"),
])
def test_an_invalid_offset_is_refused_as_rabbitmq_refuses_it(stream, offset, code, text):
    conn = connect()
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=10)
        kind = pika.exceptions.ChannelClosedByBroker if code == 406 else pika.exceptions.ConnectionClosedByBroker
        with pytest.raises(kind) as error:
            channel.basic_consume(stream, lambda *args: None, arguments={"x-stream-offset": offset})
        closed_with(error, code, text.format(q=stream))
    finally:
        safe_close(conn)


def test_basic_get_and_purge_are_not_supported(stream):
    for action, text in [
        (lambda channel: channel.basic_get(stream), "basic.get not supported by stream queues queue '%s' in vhost '/'"),
        (lambda channel: channel.queue_purge(stream), "queue.purge not supported by stream queues queue '%s' in vhost '/'"),
    ]:
        conn = connect()
        try:
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
                action(conn.channel())
            closed_with(error, 540, "NOT_IMPLEMENTED - " + text % stream)
        finally:
            safe_close(conn)


@pytest.mark.parametrize("settle, code, text", [
    (lambda channel, tag: channel.basic_nack(tag, requeue=True), 540,
     "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues queue '{q}' in vhost '/'"),
    (lambda channel, tag: channel.basic_reject(tag, requeue=False), 540,
     "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues queue '{q}' in vhost '/'"),
    (lambda channel, tag: channel.basic_recover(requeue=True), 541, "INTERNAL_ERROR"),
])
def test_a_delivery_is_acked_never_nacked_rejected_or_recovered(connection, stream, settle, code, text):
    publish_confirmed(connection.channel(), stream, [b"one"])
    conn = connect()
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=5)
        got = []
        channel.basic_consume(stream, lambda ch, method, properties, body: got.append(method), arguments={"x-stream-offset": "first"})
        wait_until(lambda: got, conn=conn)
        assert got, "nothing delivered"
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
            settle(channel, got[0].delivery_tag)
            conn.process_data_events(time_limit=2)
        closed_with(error, code, text.format(q=stream))
    finally:
        safe_close(conn)


# ------------------------------------------------------------------ offsets


def test_every_offset_specification(connection, stream):
    channel = connection.channel()
    exchange = unique("stream-exchange")
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    channel.queue_bind(stream, exchange, "rk")
    publish_confirmed(channel, "rk", [b"a0", b"a1", b"a2"], exchange=exchange)
    # Chunks are timestamped in milliseconds; AMQP timestamps are seconds: leave a whole second.
    time.sleep(1.2)
    middle = datetime.datetime.now()
    time.sleep(1.2)
    publish_confirmed(channel, "rk", [b"b0", b"b1", b"b2"], exchange=exchange)
    everything = [(offset, body) for offset, body in enumerate([b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"])]
    assert offsets_and_bodies(read(connection, stream, "first", count=6)) == everything
    # No argument is `next`: only what comes after.
    assert read(connection, stream, None) == []
    assert read(connection, stream, "next") == []
    # `last` is the last chunk: one message, as each confirmed publish was its own chunk.
    assert offsets_and_bodies(read(connection, stream, "last", count=1)) == everything[5:]
    assert offsets_and_bodies(read(connection, stream, 2, count=4)) == everything[2:]
    assert offsets_and_bodies(read(connection, stream, -1, count=6)) == everything
    assert read(connection, stream, 100) == []
    assert offsets_and_bodies(read(connection, stream, middle, count=3)) == everything[3:]
    assert offsets_and_bodies(read(connection, stream, "1h", count=6)) == everything
    # An interval reaching back less than the age of every message: nothing.
    time.sleep(1.5)
    assert read(connection, stream, "1s") == []
    deliveries = read(connection, stream, "first", count=6)
    for method, properties, body in deliveries:
        assert (method.exchange, method.routing_key, method.redelivered) == (exchange, "rk", False)


def test_a_numeric_offset_skips_the_earlier_records_of_its_chunk(connection, stream):
    """Published without waiting, messages share chunks; a consumer starting inside one gets only
    the records from its offset on, on both brokers whatever their chunk boundaries."""
    channel = connection.channel()
    for index in range(50):
        channel.basic_publish("", stream, b"m%d" % index)
    got = read(connection, stream, 25, count=25, timeout=10)
    assert offsets_and_bodies(got) == [(index, b"m%d" % index) for index in range(25, 50)]


def test_next_delivers_what_comes_after_the_consumer_started(connection, stream):
    publish_confirmed(connection.channel(), stream, [b"before"])
    consuming = connection.channel()
    consuming.basic_qos(prefetch_count=10)
    got = []

    def on_message(channel, method, properties, body):
        got.append((properties.headers["x-stream-offset"], body))
        channel.basic_ack(method.delivery_tag)

    consuming.basic_consume(stream, on_message, arguments={"x-stream-offset": "next"})
    connection.process_data_events(time_limit=0.5)
    publisher = connect()
    try:
        publish_confirmed(publisher.channel(), stream, [b"after-1", b"after-2"])
    finally:
        safe_close(publisher)
    wait_until(lambda: len(got) >= 2, conn=connection)
    assert got == [(1, b"after-1"), (2, b"after-2")]


def test_acks_move_the_credit_and_remove_nothing(connection, stream):
    publish_confirmed(connection.channel(), stream, [b"m%d" % index for index in range(6)])
    channel = connection.channel()
    channel.basic_qos(prefetch_count=2)
    got = []
    channel.basic_consume(stream, lambda ch, method, properties, body: got.append(method), arguments={"x-stream-offset": "first"})
    wait_until(lambda: len(got) >= 2, conn=connection)
    connection.process_data_events(time_limit=0.5)
    assert len(got) == 2, "more deliveries than the prefetch before any ack"
    channel.basic_ack(got[1].delivery_tag, multiple=True)
    wait_until(lambda: len(got) >= 4, conn=connection)
    connection.process_data_events(time_limit=0.5)
    assert len(got) == 4
    assert [method.delivery_tag for method in got] == [1, 2, 3, 4]
    # Everything is still there for the next reader.
    assert len(read(connection, stream, "first", count=6)) == 6


def test_several_consumers_read_independently(connection, stream):
    publish_confirmed(connection.channel(), stream, [b"old-%d" % index for index in range(5)])
    readers = []
    for offset in ["first", 3, "next"]:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=3)
        got = []

        def on_message(ch, method, properties, body, got=got):
            got.append((properties.headers["x-stream-offset"], body))
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(stream, on_message, arguments={"x-stream-offset": offset})
        readers.append(got)
    connection.process_data_events(time_limit=0.5)
    publisher = connect()
    try:
        publish_confirmed(publisher.channel(), stream, [b"new-%d" % index for index in range(3)])
    finally:
        safe_close(publisher)
    wait_until(lambda: len(readers[0]) >= 8 and len(readers[1]) >= 5 and len(readers[2]) >= 3, conn=connection)
    everything = [(index, b"old-%d" % index) for index in range(5)] + [(5 + index, b"new-%d" % index) for index in range(3)]
    assert readers[0] == everything
    assert readers[1] == everything[3:]
    assert readers[2] == everything[5:]


def test_properties_and_headers_come_back_as_rabbitmq_keeps_them(connection, stream):
    properties = pika.BasicProperties(
        content_type="text/plain", content_encoding="utf-8", delivery_mode=2, priority=3, correlation_id="cid",
        reply_to="rt", expiration="60000", message_id="mid", timestamp=1700000000, type="tp", user_id="guest",
        app_id="app", headers={"zeta": "last", "count": 7, "flag": True, "big": 2 ** 40, "table": {"a": 1},
                               "array": [1, 2], "raw": b"\x00\x01"})
    publish_confirmed(connection.channel(), stream, [b"body"], properties)
    [(method, got, body)] = read(connection, stream, "first", count=1)
    assert body == b"body"
    for field in ["content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                  "expiration", "message_id", "timestamp", "type", "user_id", "app_id"]:
        assert getattr(got, field) == getattr(properties, field), field
    # Tables and arrays are dropped on the way into the stream; the rest come back sorted by
    # name, with the offset among them.
    assert list(got.headers.items()) == [("big", 2 ** 40), ("count", 7), ("flag", True), ("raw", b"\x00\x01"),
                                         ("x-stream-offset", 0), ("zeta", "last")]


# ------------------------------------------------------------------ retention


def first_offset(connection, queue):
    deliveries = read(connection, queue, "first", count=1)
    assert deliveries, "the stream holds nothing"
    return deliveries[0][1].headers["x-stream-offset"]


def test_max_length_bytes_trims_whole_segments_from_the_front(connection, cleanup, channel):
    name = cleanup.queue(declare_stream(channel, unique("stream-bytes"), **{"x-max-length-bytes": 20000,
                                                                         "x-stream-max-segment-size-bytes": 5000}))
    body = b"x" * 500
    publish_confirmed(channel, name, [body] * 200)
    # Retention runs after segments roll (asynchronously in RabbitMQ): wait for the front to go.
    assert wait_until(lambda: first_offset(connection, name) > 0, timeout=15, interval=0.3), "retention kept everything"
    # Whole segments only: every message from the first one kept on is still there. (Offsets
    # increase but need not be consecutive: RabbitMQ starts each segment with a tracking chunk.)
    kept = read(connection, name, "first")
    offsets = [properties.headers["x-stream-offset"] for _, properties, _ in kept]
    assert offsets == sorted(set(offsets)) and offsets[0] > 0
    assert 20 <= len(kept) < 200, len(kept)


def test_max_age_trims_segments_older_than_it(connection, cleanup, channel):
    name = cleanup.queue(declare_stream(channel, unique("stream-age"), **{"x-max-age": "2s",
                                                                       "x-stream-max-segment-size-bytes": 3000}))
    publish_confirmed(channel, name, [b"old" * 100] * 30)
    time.sleep(3)
    # New segments roll, and retention finds the old ones past their age.
    publish_confirmed(channel, name, [b"new" * 100] * 30)
    assert wait_until(lambda: first_offset(connection, name) > 0, timeout=15, interval=0.3), "old segments were kept"
    kept = read(connection, name, "first")
    assert kept[-1][2] == b"new" * 100
    assert all(body == b"new" * 100 for _, _, body in kept[-30:])


def management(path, method="GET", body=None):
    base = os.environ.get("MANAGEMENT_URL") or os.environ.get("LEPUS_MANAGEMENT_URL")
    if not base:
        pytest.fail("set MANAGEMENT_URL (the broker's management API) for the policy and listing tests")
    parsed = urllib.parse.urlparse(base)
    user, password = urllib.parse.unquote(parsed.username or "guest"), urllib.parse.unquote(parsed.password or "guest")
    prefix = parsed.path.rstrip("/")
    if not prefix.endswith("/api"):
        prefix += "/api"
    request = urllib.request.Request("%s://%s:%d%s%s" % (parsed.scheme, parsed.hostname, parsed.port or 15672, prefix, path),
                                     method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode(),
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read()
        return json.loads(text) if text else None


def test_a_policy_sets_retention_and_segment_size(connection, cleanup, channel):
    name = cleanup.queue(unique("stream-policy"))
    policy = unique("stream-policy")
    management("/policies/%2F/" + policy, "PUT", {"pattern": "^%s$" % name, "apply-to": "queues", "priority": 5,
                                                  "definition": {"max-length-bytes": 20000, "stream-max-segment-size-bytes": 5000}})
    try:
        declare_stream(channel, name)
        publish_confirmed(channel, name, [b"y" * 500] * 200)
        assert wait_until(lambda: first_offset(connection, name) > 0, timeout=15, interval=0.3), "the policy's retention did nothing"
    finally:
        management("/policies/%2F/" + policy, "DELETE")


def test_invalid_stream_policies_are_refused(connection):
    for definition in [{"max-age": "1x"}, {"stream-max-segment-size-bytes": "big"}]:
        with pytest.raises(urllib.error.HTTPError) as error:
            management("/policies/%2F/" + unique("bad"), "PUT", {"pattern": "^nothing$", "definition": definition})
        assert error.value.code == 400, definition


def test_management_lists_a_stream_with_rabbitmq_fields(connection, stream):
    publish_confirmed(connection.channel(), stream, [b"a", b"b", b"c"])
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume(stream, lambda ch, method, properties, body: ch.basic_ack(method.delivery_tag),
                          arguments={"x-stream-offset": "first"})
    connection.process_data_events(time_limit=0.3)

    def listed():
        queue = management("/queues/%2F/" + urllib.parse.quote(stream, safe=""))
        return queue if queue.get("messages") == 3 and queue.get("consumers") == 1 else None

    queue = wait_until(listed, timeout=10, interval=0.3)
    assert queue, management("/queues/%2F/" + urllib.parse.quote(stream, safe=""))
    assert (queue["type"], queue["durable"], queue["messages_ready"]) == ("stream", True, 3)
    assert queue["members"] == [queue["node"]] and queue["online"] == [queue["node"]]
    assert queue["readers"] == {queue["node"]: 1}
    [consumer] = queue["consumer_details"]
    assert (consumer["ack_required"], consumer["prefetch_count"], consumer["active"]) == (True, 10, False)


@pytest.mark.parametrize("offset", ["5x", "first"])
def test_x_stream_offset_is_refused_on_a_classic_queue(connection, cleanup, offset):
    """RabbitMQ checks consume arguments against the queue's type: a classic queue takes none."""
    channel = connection.channel()
    queue = cleanup.queue(channel.queue_declare(unique("classic")).method.queue)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
        channel.basic_consume(queue, lambda *args: None, arguments={"x-stream-offset": offset})
    closed_with(error, 406, "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '%s' in vhost '/' "
                            "of queue type rabbit_classic_queue" % queue)
