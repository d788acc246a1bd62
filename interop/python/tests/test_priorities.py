"""x-max-priority on classic queues through pika, as RabbitMQ 3.10.8 answers (texts measured against
it): up to 255; the message `priority` property orders delivery, higher first, first in first out
within a priority; a priority above the maximum counts as the maximum; without x-max-priority the
property is ignored. Lepus also keeps the order of a durable priority queue across a restart.
"""

import os
import signal

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import get_all, safe_close, unique, wait_until


@pytest.mark.parametrize("value, problem", [
    (256, "{max_value_exceeded,256}"),
    (-1, "{value_negative,-1}"),
    ("5", '"expected integer, got longstr"'),
])
def test_an_invalid_x_max_priority_is_406(channel, value, problem):
    name = unique("priority-bad")
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(name, arguments={"x-max-priority": value})
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '%s' in vhost '/': %s" % (name, problem))


@pytest.mark.parametrize("maximum", [0, 255])
def test_the_bounds_are_accepted(channel, cleanup, maximum):
    channel.queue_declare(cleanup.queue(unique("priority-bound")), arguments={"x-max-priority": maximum})


def publish(channel, queue, published):
    for body, priority in published:
        properties = pika.BasicProperties(priority=priority) if priority is not None else None
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
    publish(channel, name, PUBLISHED)
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


@pytest.mark.lepus_only
def test_a_durable_priority_queue_keeps_its_order_across_a_restart(tmp_path):
    from test_lifecycle import LepusBroker
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    name = unique("priority-restart")
    try:
        conn = broker.connect()
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare(name, durable=True, arguments={"x-max-priority": 5})
        for body, priority in PUBLISHED:
            channel.basic_publish("", name, body.encode(), pika.BasicProperties(priority=priority, delivery_mode=2))
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
        broker.stop(signal.SIGTERM)
