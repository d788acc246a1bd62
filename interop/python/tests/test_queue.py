"""queue.declare / bind / unbind / purge / delete."""

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import exists, get_all, unique, wait_for_count, wait_until


def test_server_named_queue_has_amq_gen_prefix(channel):
    ok = channel.queue_declare("", exclusive=True)
    assert ok.method.queue.startswith("amq.gen-")
    assert len(ok.method.queue) > len("amq.gen-")
    assert ok.method.message_count == 0
    assert ok.method.consumer_count == 0
    other = channel.queue_declare("", exclusive=True)
    assert other.method.queue != ok.method.queue


def test_declare_ok_reports_message_and_consumer_counts(channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q)
    for i in range(3):
        channel.basic_publish("", q, b"m")
    assert wait_for_count(q, 3, channel) == 3
    channel.basic_consume(q, lambda *a: None)  # takes the 3 messages, leaves them unacked
    ok = channel.queue_declare(q, passive=True)
    assert ok.method.consumer_count == 1
    ok = channel.queue_declare(q)  # non-passive redeclare reports the same
    assert ok.method.queue == q
    assert ok.method.consumer_count == 1
    assert ok.method.message_count == 0, "message_count counts ready messages only"


def test_passive_declare_missing_queue_is_404_and_closes_channel(connection, channel):
    name = unique("q-missing")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare(name, passive=True)
    assert ei.value.reply_code == 404
    assert ei.value.reply_text.startswith("NOT_FOUND")
    assert name in ei.value.reply_text
    assert channel.is_closed
    assert connection.is_open


def test_passive_declare_existing_queue_ignores_other_flags(channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q, durable=False)
    ok = channel.queue_declare(q, passive=True, durable=True, arguments={"x-max-length": 5})
    assert ok.method.queue == q


def test_exclusive_queue_from_other_connection_is_405_resource_locked(connection_factory, channel):
    q = channel.queue_declare(unique("q-excl"), exclusive=True).method.queue
    other = connection_factory()
    for action in ("declare", "passive", "consume", "get", "delete"):
        ch = other.channel()
        with pytest.raises(ChannelClosedByBroker) as ei:
            if action == "declare":
                ch.queue_declare(q, exclusive=True)
            elif action == "passive":
                ch.queue_declare(q, passive=True)
            elif action == "consume":
                ch.basic_consume(q, lambda *a: None)
            elif action == "get":
                ch.basic_get(q)
            else:
                ch.queue_delete(q)
        assert ei.value.reply_code == 405, action
        assert ei.value.reply_text.startswith("RESOURCE_LOCKED"), action
        assert q in ei.value.reply_text
    assert other.is_open


def test_publish_to_exclusive_queue_from_other_connection_is_allowed(connection_factory, channel):
    q = channel.queue_declare("", exclusive=True).method.queue
    other = connection_factory().channel()
    other.basic_publish("", q, b"from outside")
    other.queue_declare("", exclusive=True)  # round trip: no error
    assert wait_for_count(q, 1, channel) == 1


def test_redeclare_exclusive_queue_as_non_exclusive_on_same_connection_is_405(connection, channel):
    q = channel.queue_declare(unique("q"), exclusive=True).method.queue
    with pytest.raises(ChannelClosedByBroker) as ei:
        connection.channel().queue_declare(q, exclusive=False)
    assert ei.value.reply_code == 405


def test_redeclare_with_different_arguments_is_406(connection, channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q, arguments={"x-max-length": 10})
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare(q, arguments={"x-max-length": 20})
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED")
    assert "x-max-length" in ei.value.reply_text
    assert connection.is_open


def test_redeclare_without_original_arguments_is_406(connection, channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q, arguments={"x-message-ttl": 60000})
    with pytest.raises(ChannelClosedByBroker) as ei:
        connection.channel().queue_declare(q)
    assert ei.value.reply_code == 406
    assert "x-message-ttl" in ei.value.reply_text


def test_redeclare_with_different_durable_is_406(channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q, durable=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare(q, durable=False)
    assert ei.value.reply_code == 406
    assert "durable" in ei.value.reply_text


def test_redeclare_with_different_auto_delete_is_406(channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q, auto_delete=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare(q, auto_delete=False)
    assert ei.value.reply_code == 406
    assert "auto_delete" in ei.value.reply_text


def test_declare_with_invalid_argument_type_is_406(channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True, arguments={"x-max-length": "ten"})
    assert ei.value.reply_code == 406
    assert "x-max-length" in ei.value.reply_text


@pytest.mark.parametrize("arguments", [
    {"x-max-age": "7D"},
    {"x-stream-max-segment-size-bytes": 1000},
    {"x-initial-cluster-size": 1},
    {"x-quorum-initial-group-size": 3},
    {"x-dead-letter-strategy": "at-least-once"},
    {"x-max-in-memory-length": 10},
    {"x-queue-leader-locator": "client-local"},
    # The classic arguments' values are checked first: this one is valid, the other type's key refused.
    {"x-max-length": 5, "x-max-age": "7D"},
])
def test_another_queue_types_argument_on_a_classic_queue_is_406_naming_the_type(connection, arguments):
    channel = connection.channel()
    name = unique("classic-with-other-type-argument")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare(name, arguments=arguments)
    key = [key for key in arguments if key != "x-max-length"][0]
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/' of queue type rabbit_classic_queue" % (key, name))


def test_declare_reserved_amq_prefix_is_403(channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("amq." + unique("q"))
    assert ei.value.reply_code == 403
    assert ei.value.reply_text.startswith("ACCESS_REFUSED")


def test_exclusive_queue_disappears_when_its_connection_closes(connection_factory):
    owner = connection_factory()
    q = owner.channel().queue_declare(unique("q-excl"), exclusive=True).method.queue
    observer = connection_factory()
    ch = observer.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(q, passive=True)
    assert ei.value.reply_code == 405  # exists, but locked
    owner.close()
    assert wait_until(lambda: not exists("queue", q)), "exclusive queue must be deleted with its connection"


def test_auto_delete_queue_disappears_after_last_consumer_cancels(channel, cleanup):
    q = cleanup.queue(unique("q-ad"))
    channel.queue_declare(q, auto_delete=True)
    t1 = channel.basic_consume(q, lambda *a: None)
    t2 = channel.basic_consume(q, lambda *a: None)
    channel.basic_cancel(t1)
    assert exists("queue", q), "still one consumer left"
    channel.basic_cancel(t2)
    assert wait_until(lambda: not exists("queue", q))


def test_auto_delete_queue_without_consumers_stays(channel, cleanup):
    q = cleanup.queue(unique("q-ad"))
    channel.queue_declare(q, auto_delete=True)
    channel.basic_publish("", q, b"x")
    assert wait_for_count(q, 1, channel) == 1
    assert exists("queue", q)


def test_auto_delete_queue_disappears_when_consumer_channel_closes(connection, cleanup):
    q = cleanup.queue(unique("q-ad"))
    ch = connection.channel()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    assert wait_until(lambda: not exists("queue", q))


# ---------------------------------------------------------------- bind / unbind

def test_bind_and_unbind(channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    x = cleanup.exchange(unique("x"))
    channel.exchange_declare(x, "direct")
    q = channel.queue_declare("", exclusive=True).method.queue
    ok = channel.queue_bind(q, x, "k1")
    assert isinstance(ok.method, pika.spec.Queue.BindOk)
    channel.queue_bind(q, x, "k1")  # binding twice is idempotent
    channel.basic_publish(x, "k1", b"bound")
    assert wait_for_count(q, 1, channel) == 1
    ok = channel.queue_unbind(q, x, "k1")
    assert isinstance(ok.method, pika.spec.Queue.UnbindOk)
    channel.basic_publish(x, "k1", b"after unbind")
    channel.queue_declare("", exclusive=True)
    assert [b for _, _, b in get_all(channel, q)] == [b"bound"]


def test_unbind_nonexistent_binding_is_ok(channel, temp_queue):
    ok = channel.queue_unbind(temp_queue, "amq.direct", "never-bound")
    assert isinstance(ok.method, pika.spec.Queue.UnbindOk)


def test_bind_missing_queue_is_404(channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_bind(unique("q-missing"), "amq.direct", "k")
    assert ei.value.reply_code == 404
    assert "queue" in ei.value.reply_text


def test_bind_missing_exchange_is_404(channel, temp_queue):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_bind(temp_queue, unique("x-missing"), "k")
    assert ei.value.reply_code == 404
    assert "exchange" in ei.value.reply_text


def test_bindings_with_different_arguments_are_distinct(channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    x = cleanup.exchange(unique("x"))
    channel.exchange_declare(x, "headers")
    q = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q, x, arguments={"x-match": "all", "a": "1"})
    channel.queue_bind(q, x, arguments={"x-match": "all", "b": "2"})
    channel.queue_unbind(q, x, arguments={"x-match": "all", "a": "1"})
    channel.basic_publish(x, "", b"a", pika.BasicProperties(headers={"a": "1"}))
    channel.basic_publish(x, "", b"b", pika.BasicProperties(headers={"b": "2"}))
    channel.queue_declare("", exclusive=True)
    wait_for_count(q, 1, channel)
    assert [b for _, _, b in get_all(channel, q)] == [b"b"]


# ---------------------------------------------------------------- purge / delete

def test_purge_returns_message_count(channel, temp_queue):
    for i in range(7):
        channel.basic_publish("", temp_queue, b"m")
    assert wait_for_count(temp_queue, 7, channel) == 7
    ok = channel.queue_purge(temp_queue)
    assert ok.method.message_count == 7
    assert channel.queue_declare(temp_queue, passive=True).method.message_count == 0
    assert channel.queue_purge(temp_queue).method.message_count == 0


def test_purge_does_not_touch_unacked_messages(connection, channel, temp_queue):
    for i in range(3):
        channel.basic_publish("", temp_queue, str(i).encode())
    method, _, _ = channel.basic_get(temp_queue, auto_ack=False)
    ok = channel.queue_purge(temp_queue)
    assert ok.method.message_count == 2
    channel.basic_reject(method.delivery_tag, requeue=True)
    assert wait_for_count(temp_queue, 1, channel) == 1
    m, _, body = channel.basic_get(temp_queue, auto_ack=True)
    assert body == b"0" and m.redelivered is True


def test_purge_missing_queue_is_404(channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_purge(unique("q-missing"))
    assert ei.value.reply_code == 404


def test_delete_returns_message_count(channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q)
    for i in range(4):
        channel.basic_publish("", q, b"m")
    assert wait_for_count(q, 4, channel) == 4
    ok = channel.queue_delete(q)
    assert ok.method.message_count == 4
    assert not exists("queue", q)


def test_delete_if_unused_with_consumer_is_406(connection, channel, temp_queue):
    channel.basic_consume(temp_queue, lambda *a: None)
    ch2 = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.queue_delete(temp_queue, if_unused=True)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED")
    assert "in use" in ei.value.reply_text
    assert channel.is_open  # only the failing channel closed


def test_delete_if_empty_with_messages_is_406(connection, channel, temp_queue):
    channel.basic_publish("", temp_queue, b"m")
    assert wait_for_count(temp_queue, 1, channel) == 1
    with pytest.raises(ChannelClosedByBroker) as ei:
        connection.channel().queue_delete(temp_queue, if_empty=True)
    assert ei.value.reply_code == 406
    assert "not empty" in ei.value.reply_text
    assert channel.queue_declare(temp_queue, passive=True).method.message_count == 1


def test_delete_if_unused_and_if_empty_when_satisfied(channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q)
    ok = channel.queue_delete(q, if_unused=True, if_empty=True)
    assert ok.method.message_count == 0
    assert not exists("queue", q)


def test_delete_missing_queue_is_ok_with_zero_count(channel):
    ok = channel.queue_delete(unique("q-never-existed"))
    assert ok.method.message_count == 0
    assert channel.is_open


def test_deleted_queue_loses_its_bindings(channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    x = cleanup.exchange(unique("x"))
    q = cleanup.queue(unique("q"))
    channel.exchange_declare(x, "direct")
    channel.queue_declare(q)
    channel.queue_bind(q, x, "k")
    channel.queue_delete(q)
    channel.queue_declare(q)
    channel.basic_publish(x, "k", b"lost")
    channel.queue_declare("", exclusive=True)
    assert channel.queue_declare(q, passive=True).method.message_count == 0


def test_max_length_argument_drops_head(channel):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    q = channel.queue_declare("", exclusive=True, arguments={"x-max-length": 2}).method.queue
    for i in range(5):
        channel.basic_publish("", q, str(i).encode())
    assert wait_for_count(q, 2, channel) == 2
    assert [b for _, _, b in get_all(channel, q)] == [b"3", b"4"]


def test_a_backlog_past_memory_expires_its_ttl_from_the_publish(channel, cleanup):
    """10,000 persistent messages: past Lepus's 8,192 in memory per queue, the rest paged to disk.
    Every message's TTL counts from its publish, the paged ones' too (RabbitMQ fixes the expiry
    at enqueue): all are gone by the TTL after the last publish, with no consumer to ask for the
    paged ones (Lepus counted a paged message's TTL again from its read, 8 s here, or never
    without a consumer)."""
    ttl_seconds, backlog = 4, 10000
    q = cleanup.queue(unique("ttl-backlog"))
    channel.queue_declare(q, durable=True, arguments={"x-message-ttl": ttl_seconds * 1000})
    for index in range(backlog):
        channel.basic_publish("", q, b"m%05d" % index, pika.BasicProperties(delivery_mode=2))
    # A confirmed publish after the backlog: everything before it was enqueued.
    channel.confirm_delivery()
    channel.basic_publish("", q, b"end", pika.BasicProperties(delivery_mode=2))
    published = time.monotonic()
    assert channel.queue_declare(q, passive=True).method.message_count > backlog // 2, "expired before its TTL"
    # 1.5 s of slack for the reads and the expiry (RabbitMQ: about 0.1 s).
    assert wait_for_count(q, 0, channel, timeout=ttl_seconds + 1.5) == 0, "messages outlived their TTL"
    assert time.monotonic() - published >= ttl_seconds - 0.5, "expired before its TTL"


def test_message_ttl_argument_expires_messages(channel):
    q = channel.queue_declare("", exclusive=True, arguments={"x-message-ttl": 50}).method.queue
    channel.confirm_delivery()
    channel.basic_publish("", q, b"short-lived")  # returns once the broker has enqueued it
    channel.connection.sleep(0.3)
    assert channel.basic_get(q) == (None, None, None)
    assert channel.queue_declare(q, passive=True).method.message_count == 0
