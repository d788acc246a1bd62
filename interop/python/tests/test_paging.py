"""Paging (Lepus only): a durable queue's backlog beyond its in-memory window stays in the log and
comes back complete and in order, also across a restart and through a purge."""

import os
import signal

import pika
import pytest

from conftest import safe_close
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

# Well past the queue's in-memory window (8192 messages).
BACKLOG = 20000


@pytest.fixture
def paging_broker(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    yield broker
    broker.kill()


def publish_backlog(broker, queue, transient_every=0):
    conn = broker.connect()
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        for index in range(BACKLOG):
            transient = transient_every and index % transient_every == 0
            channel.basic_publish("", queue, b"m%05d" % index, pika.BasicProperties(delivery_mode=1 if transient else 2))
        # A confirmed publish after the backlog: everything before it was enqueued.
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"end", pika.BasicProperties(delivery_mode=2))
    finally:
        safe_close(conn)


def consume_all(broker, queue):
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


def message_count(broker, queue):
    conn = broker.connect()
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        safe_close(conn)


def test_backlog_beyond_the_window_comes_back_in_order(paging_broker):
    publish_backlog(paging_broker, "paged")
    assert message_count(paging_broker, "paged") == BACKLOG + 1
    bodies = consume_all(paging_broker, "paged")
    assert bodies == [b"m%05d" % index for index in range(BACKLOG)] + [b"end"]
    assert message_count(paging_broker, "paged") == 0


def test_paged_backlog_survives_a_restart_without_its_transient_messages(paging_broker):
    publish_backlog(paging_broker, "paged-restart", transient_every=10)
    paging_broker.stop(signal.SIGTERM)
    paging_broker.start()
    persistent = [b"m%05d" % index for index in range(BACKLOG) if index % 10 != 0]
    assert message_count(paging_broker, "paged-restart") == len(persistent) + 1
    assert consume_all(paging_broker, "paged-restart") == persistent + [b"end"]


def test_purging_a_paged_backlog_settles_it_on_disk(paging_broker):
    publish_backlog(paging_broker, "paged-purge")
    conn = paging_broker.connect()
    try:
        assert conn.channel().queue_purge("paged-purge").method.message_count == BACKLOG + 1
    finally:
        safe_close(conn)
    paging_broker.stop(signal.SIGTERM)
    paging_broker.start()
    assert message_count(paging_broker, "paged-purge") == 0
