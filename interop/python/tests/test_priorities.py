"""x-max-priority on classic queues through pika, as RabbitMQ 3.10.8 answers (texts measured against
it): 0 to 255, any integer type; the message `priority` property orders delivery, higher first,
first in first out within a priority; a priority above the maximum counts as the maximum; without
x-max-priority the property is ignored; drop-head drops the highest priority's oldest (RabbitMQ's
priority queue drops from its head, which may be the message just published).

Lepus only: a durable priority queue keeps its order across a restart, and a backlog larger than
the queue's in-memory window is paged to disk like any other queue's and comes back in priority
order, also after a restart.
"""

import signal

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import get_all, safe_close, unique, wait_until
from durability_support import start_broker


@pytest.mark.parametrize("value, problem", [
    (256, "{max_value_exceeded,256}"),
    (1000, "{max_value_exceeded,1000}"),
    (-1, "{value_negative,-1}"),
    ("5", '"expected integer, got longstr"'),
    (True, '"expected integer, got bool"'),
])
def test_an_invalid_x_max_priority_is_406(channel, value, problem):
    name = unique("priority-bad")
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(name, arguments={"x-max-priority": value})
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '%s' in vhost '/': %s" % (name, problem))


@pytest.mark.parametrize("maximum", [0, 1, 10, 255])
def test_the_bounds_are_accepted_and_a_redeclare_must_match(connection, cleanup, maximum):
    name = cleanup.queue(unique("priority-bound"))
    channel = connection.channel()
    channel.queue_declare(name, arguments={"x-max-priority": maximum})
    channel.queue_declare(name, arguments={"x-max-priority": maximum})
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(name, arguments={"x-max-priority": (maximum + 1) % 256})
    assert refused.value.reply_code == 406
    assert "inequivalent arg 'x-max-priority'" in refused.value.reply_text


def publish(channel, queue, published, persistent=False):
    for body, priority in published:
        properties = pika.BasicProperties(priority=priority, delivery_mode=2 if persistent else None)
        channel.basic_publish("", queue, body.encode(), properties)


# (body, priority): b3 has no priority (0); h9 is above the maximum of 5 and counts as 5.
PUBLISHED = [("a0", 0), ("b3", None), ("c5", 5), ("d1", 1), ("h9", 9), ("e5", 5), ("f1", 1), ("g2", 2)]
EXPECTED = ["c5", "h9", "e5", "g2", "d1", "f1", "a0", "b3"]


def test_basic_get_takes_higher_priorities_first_fifo_within_each(channel, cleanup):
    name = cleanup.queue(unique("priority-get"))
    channel.queue_declare(name, arguments={"x-max-priority": 5})
    publish(channel, name, PUBLISHED)
    assert [body.decode() for _, _, body in get_all(channel, name)] == EXPECTED


def test_a_consumer_gets_the_backlog_in_priority_order_and_requeues_keep_it(connection, cleanup):
    name = cleanup.queue(unique("priority-consume"))
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-max-priority": 5})
    publish(channel, name, PUBLISHED, persistent=True)
    channel.basic_qos(prefetch_count=3)
    got = []
    tag = channel.basic_consume(name, lambda ch, method, properties, body: got.append((method.delivery_tag, body.decode())))
    wait_until(lambda: len(got) >= 3, conn=connection)
    assert [body for _, body in got] == EXPECTED[:3]
    # Rejected back with requeue: each returns to its place within its priority.
    channel.basic_cancel(tag)
    channel.basic_nack(0, multiple=True, requeue=True)
    assert [body.decode() for _, _, body in get_all(channel, name)] == EXPECTED


def test_without_x_max_priority_the_property_is_ignored(channel, cleanup):
    name = cleanup.queue(unique("priority-none"))
    channel.queue_declare(name)
    publish(channel, name, PUBLISHED)
    assert [body.decode() for _, _, body in get_all(channel, name)] == [body for body, _ in PUBLISHED]


def test_drop_head_drops_the_highest_priority_even_the_message_just_published(channel, cleanup):
    name = cleanup.queue(unique("priority-maxlen"))
    channel.queue_declare(name, arguments={"x-max-priority": 5, "x-max-length": 3})
    publish(channel, name, [("p1", 1), ("p3", 3), ("p2", 2)])
    # Full: a message of priority 0 pushes out the head, the priority-3 message.
    publish(channel, name, [("p0", 0)])
    # A priority-5 message is enqueued, then is the head: it is the one dropped.
    publish(channel, name, [("p5", 5)])
    assert [body.decode() for _, _, body in get_all(channel, name)] == ["p2", "p1", "p0"]


@pytest.mark.lepus_only
def test_a_durable_priority_queue_keeps_its_order_across_a_restart(tmp_path):
    broker = start_broker(tmp_path)
    name = unique("priority-restart")
    try:
        conn = broker.connect()
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare(name, durable=True, arguments={"x-max-priority": 5})
        publish(channel, name, PUBLISHED, persistent=True)
        safe_close(conn)
        broker.stop(signal.SIGTERM)
        broker.start()
        conn = broker.connect()
        try:
            channel = conn.channel()
            # A message published after the restart takes its place among the recovered ones.
            channel.basic_publish("", name, b"late4", pika.BasicProperties(priority=4, delivery_mode=2))
            assert [body.decode() for _, _, body in get_all(channel, name)] == EXPECTED[:3] + ["late4"] + EXPECTED[3:]
        finally:
            safe_close(conn)
    finally:
        broker.kill()


# The queue's in-memory window (docs/storage.md, "paging"): at most 8,192 ready messages.
WINDOW_MESSAGES = 8192
# Well past the window; ten priorities, interleaved, as a Celery queue with priorities sees them.
BACKLOG = 30000
LEVELS = 10


def backlog_body(index):
    return b"m%05d" % index


def backlog_priority(index):
    return (index * 7) % LEVELS


def publish_priority_backlog(broker, queue):
    conn = broker.connect()
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-max-priority": LEVELS - 1})
        for index in range(BACKLOG):
            channel.basic_publish("", queue, backlog_body(index),
                                  pika.BasicProperties(delivery_mode=2, priority=backlog_priority(index)))
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"end", pika.BasicProperties(delivery_mode=2, priority=0))
    finally:
        safe_close(conn)


def expected_backlog_order():
    by_priority = sorted(range(BACKLOG), key=lambda index: (-backlog_priority(index), index))
    return [backlog_body(index) for index in by_priority] + [b"end"]


def drain(broker, queue):
    conn = broker.connect()
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=500)
        bodies = []
        for method, _, body in channel.consume(queue, inactivity_timeout=5):
            if method is None:
                break
            bodies.append(body)
            if len(bodies) % 100 == 0 or body == b"end":
                channel.basic_ack(method.delivery_tag, multiple=True)
            if body == b"end":
                break
        channel.cancel()
        return bodies
    finally:
        safe_close(conn)


@pytest.mark.lepus_only
def test_a_priority_backlog_beyond_the_window_is_paged_and_comes_back_in_priority_order(tmp_path):
    broker = start_broker(tmp_path)
    try:
        publish_priority_backlog(broker, "priority-paged")
        paged = broker.metric("lepus_queue_messages_paged", queue="priority-paged")
        assert paged >= BACKLOG + 1 - WINDOW_MESSAGES, "only %d of %d ready messages paged" % (paged, BACKLOG + 1)
        assert drain(broker, "priority-paged") == expected_backlog_order()
        assert broker.metric("lepus_queue_messages_paged", queue="priority-paged") == 0
    finally:
        broker.kill()


@pytest.mark.lepus_only
def test_a_paged_priority_backlog_survives_a_restart_in_priority_order(tmp_path):
    broker = start_broker(tmp_path)
    try:
        publish_priority_backlog(broker, "priority-paged-restart")
        broker.stop(signal.SIGTERM)
        broker.start()
        # Recovered messages stay on disk until a consumer needs them: all of them are paged.
        assert broker.metric("lepus_queue_messages_paged", queue="priority-paged-restart") == BACKLOG + 1
        assert drain(broker, "priority-paged-restart") == expected_backlog_order()
    finally:
        broker.kill()
