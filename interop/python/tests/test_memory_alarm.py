"""The memory alarm: above the high watermark, connections that publish are blocked
(connection.blocked "low on memory") and connections that only consume are still served.

Against Lepus (LEPUS_BIN set) the test starts a broker with a 1-byte watermark, so the alarm is up
from the first check. Against RabbitMQ (LEPUS_BIN unset; RABBITMQCTL reaches the node) it sets
`set_vm_memory_high_watermark absolute 1` and restores RabbitMQ's default (0.4) afterwards.
"""

import os
import shlex
import subprocess
import time

import pytest

from conftest import connect, safe_close, unique
from test_lifecycle import LepusBroker

WAIT_SECONDS = 10
RABBITMQCTL_TIMEOUT_S = 60
RABBITMQ_DEFAULT_WATERMARK = "0.4"


def pump(conn, predicate, what):
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, "no %s within %ds" % (what, WAIT_SECONDS)
        conn.process_data_events(time_limit=0.1)


class MemoryAlarm:
    """Connections to a broker whose memory alarm `raise_alarm()` puts up."""

    def __init__(self, tmp_path, monkeypatch):
        self.broker = None
        self.rabbitmqctl = None
        binary = os.environ.get("LEPUS_BIN")
        if binary:
            # A watermark below any real process's memory: the alarm is up from the first check.
            monkeypatch.setenv("LEPUS_MEMORY_HIGH_WATERMARK_BYTES", "1")
            data_dir = tmp_path / "data"
            data_dir.mkdir()
            self.broker = LepusBroker(binary, data_dir, tmp_path)
            self.broker.start()
            return
        command = os.environ.get("RABBITMQCTL")
        if not command:
            reason = "neither LEPUS_BIN (a Lepus to start) nor RABBITMQCTL (a RabbitMQ node to configure) is set"
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
        self.rabbitmqctl = shlex.split(command)

    def connect(self):
        return self.broker.connect() if self.broker else connect()

    def set_watermark(self, *arguments):
        subprocess.run(self.rabbitmqctl + ["set_vm_memory_high_watermark", *arguments], check=True,
                       capture_output=True, timeout=RABBITMQCTL_TIMEOUT_S)

    def raise_alarm(self):
        if self.rabbitmqctl:
            self.set_watermark("absolute", "1")

    def close(self):
        if self.broker:
            self.broker.kill()
        elif self.rabbitmqctl:
            self.set_watermark(RABBITMQ_DEFAULT_WATERMARK)


@pytest.fixture
def memory_alarm(tmp_path, monkeypatch):
    alarm = MemoryAlarm(tmp_path, monkeypatch)
    yield alarm
    alarm.close()


def test_memory_above_the_high_watermark_blocks_publishers_not_consumers(memory_alarm):
    queue = unique("memory-q")
    publisher = consumer = None
    try:
        consumer = memory_alarm.connect()
        consumer_channel = consumer.channel()
        consumer_channel.queue_declare(queue)
        publisher = memory_alarm.connect()
        events = []
        publisher.add_on_connection_blocked_callback(lambda _conn, method: events.append(method.method.reason))
        publisher_channel = publisher.channel()
        memory_alarm.raise_alarm()
        publisher_channel.basic_publish("", queue, b"first")
        pump(publisher, lambda: "low on memory" in events, "connection.blocked")
        # The consumer's connection never published: it is still answered. (The publisher was
        # blocked once its basic.publish was read, as RabbitMQ does, so "first" may still wait.)
        method, _, body = consumer_channel.basic_get(queue, auto_ack=True)
        assert method is None or body == b"first"
        assert consumer_channel.queue_declare(queue, passive=True).method.message_count == 0
        consumer_channel.queue_delete(queue)
    finally:
        safe_close(publisher)
        safe_close(consumer)
