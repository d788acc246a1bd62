"""The memory alarm: above the high watermark, connections that publish are blocked
(connection.blocked "low on memory") and connections that only consume are still served.

Against Lepus the fixture starts a private broker ($LEPUS_BIN) with a 1-byte watermark, so the
alarm is up from the first check. Against RabbitMQ ($RABBITMQCTL reaches the node) it sets the
watermark to 0 and restores the node's own value afterwards.
"""

import os
import re
import time

import pytest

from conftest import broker_admin, broker_is_lepus, connect, safe_close, unique, wait_for_count, wait_until
from test_lifecycle import LepusBroker

WAIT_SECONDS = 10


def pump(conn, predicate, what):
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, "no %s within %ds" % (what, WAIT_SECONDS)
        conn.process_data_events(time_limit=0.1)


class MemoryAlarm:
    """A broker whose memory alarm is raised (see the memory_alarm fixture)."""

    def __init__(self, url, clear=None, stop=None):
        self.url = url
        self.can_clear = clear is not None
        self._clear = clear
        self._stop = stop

    def clear(self):
        if self._clear is not None:
            clear, self._clear = self._clear, None
            clear()

    def stop(self):
        """Clear the alarm where possible, else stop the private broker (a blocked connection is not
        read, so closing it gracefully would wait for a close-ok that never comes)."""
        self.clear()
        if self._stop is not None:
            self._stop()


@pytest.fixture
def memory_alarm(amqp_url, tmp_path, monkeypatch):
    """A broker whose memory alarm is raised.

    RabbitMQ: the shared node's watermark goes to 0 through rabbitmqctl and back on clear().
    Lepus cannot change its watermark at run time, so a private broker ($LEPUS_BIN) starts with a
    1-byte watermark and cannot clear (test_disk_alarm.py covers the unblock there)."""
    if broker_is_lepus(amqp_url):
        binary = os.environ.get("LEPUS_BIN")
        if not binary:
            pytest.fail("the broker is Lepus: set LEPUS_BIN so this test can start a broker with its memory alarm raised")
        monkeypatch.setenv("LEPUS_MEMORY_HIGH_WATERMARK_BYTES", "1")
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        broker = LepusBroker(binary, data_dir, tmp_path)
        broker.start()
        alarm = MemoryAlarm(broker.url, stop=broker.kill)
    else:
        admin = broker_admin(amqp_url)
        watermark = admin.run("eval", "vm_memory_monitor:get_vm_memory_high_watermark().").strip()
        assert re.fullmatch(r"[0-9.]+", watermark), "unexpected memory watermark %r" % watermark
        admin.run("set_vm_memory_high_watermark", "0")
        alarm = MemoryAlarm(amqp_url, clear=lambda: admin.run("set_vm_memory_high_watermark", watermark))
    try:
        yield alarm
    finally:
        alarm.stop()


def test_memory_alarm_sends_connection_blocked_to_a_publisher(memory_alarm):
    conn = connect(memory_alarm.url)
    try:
        assert conn._impl.server_capabilities.get("connection.blocked") is True
        events = []
        conn.add_on_connection_blocked_callback(lambda _conn, frame: events.append(("blocked", frame.method.reason)))
        conn.add_on_connection_unblocked_callback(lambda _conn, _frame: events.append(("unblocked",)))
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"held back")  # only a publishing connection is blocked
        wait_until(lambda: events, conn=conn)
        assert events == [("blocked", "low on memory")]
        if not memory_alarm.can_clear:
            return
        memory_alarm.clear()
        wait_until(lambda: len(events) == 2, conn=conn)
        assert events == [("blocked", "low on memory"), ("unblocked",)]
        assert wait_for_count(queue, 1, channel) == 1, "the publish read after the alarm cleared is enqueued"
    finally:
        memory_alarm.stop()
        safe_close(conn)


def test_memory_above_the_high_watermark_blocks_publishers_not_consumers(memory_alarm):
    queue = unique("memory-q")
    publisher = consumer = None
    try:
        consumer = connect(memory_alarm.url)
        consumer_channel = consumer.channel()
        consumer_channel.queue_declare(queue)
        publisher = connect(memory_alarm.url)
        events = []
        publisher.add_on_connection_blocked_callback(lambda _conn, method: events.append(method.method.reason))
        publisher_channel = publisher.channel()
        publisher_channel.basic_publish("", queue, b"first")
        pump(publisher, lambda: "low on memory" in events, "connection.blocked")
        # The consumer's connection never published: it is still answered. (The publisher was
        # blocked once its basic.publish was read, as RabbitMQ does, so "first" may still wait.)
        method, _, body = consumer_channel.basic_get(queue, auto_ack=True)
        assert method is None or body == b"first"
        assert consumer_channel.queue_declare(queue, passive=True).method.message_count == 0
        consumer_channel.queue_delete(queue)
    finally:
        memory_alarm.stop()
        safe_close(publisher)
        safe_close(consumer)
