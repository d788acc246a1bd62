"""Queues touched before the background recovery reached them (Lepus only, through pika).

A start accepts connections once the definitions are loaded; each durable classic queue's log is
recovered afterwards, by a background walker or at the queue's first use (docs/storage.md,
"Lazy recovery"). Here the walker is held back (LEPUS_RECOVERY_WALKER_PAUSE_MS), so every queue
a client touches is recovered on demand, and must show what a full recovery at start gives:
message counts (passive declare), messages in order (consume, basic.get), purge and delete
counts, publishes that add to the recovered messages, a dead letter routed into a queue nobody
touched yet. Then a SIGKILL while most queues are still unrecovered loses no confirmed message,
and a graceful stop after that crash, with a queue never recovered in between, leaves no
clean-shutdown marker: its messages come back flagged redelivered, as after the crash.
"""

import os
import signal

import pika
import pytest

from conftest import safe_close
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

PAUSE_VARIABLE = "LEPUS_RECOVERY_WALKER_PAUSE_MS"
# Longer than the test: the walker reaches no queue meanwhile.
PAUSE_MS = "600000"
DEFERRED_LINE = "their logs are recovered in the background or at first use"
WALKED_LINE = "recovered every restored classic queue's log in the background"

# Messages each queue gets before the first restart.
COUNTS = {
    "lazy-count": 50,
    "lazy-consume": 30,
    "lazy-get": 5,
    "lazy-purge": 7,
    "lazy-delete": 4,
    "lazy-dlx-target": 3,
    "lazy-untouched": 9,
    "lazy-marker": 3,
}
# Taken and acked from lazy-consume before the first restart.
ACKED = 10


def body(queue, number):
    return ("%s:%d" % (queue, number)).encode()


def number_of(payload):
    return int(payload.decode().rsplit(":", 1)[1])


def publish_confirmed(channel, queue, numbers, **properties):
    for number in numbers:
        channel.basic_publish("", queue, body(queue, number), pika.BasicProperties(delivery_mode=2, **properties), mandatory=True)


def count(channel, queue):
    return channel.queue_declare(queue, durable=True, passive=True).method.message_count


def take(channel, queue, expected, auto_ack=True):
    """`expected` messages by basic.get, in order: [(number, redelivered)]."""
    got = []
    for _ in range(expected):
        method, _, payload = channel.basic_get(queue, auto_ack=auto_ack)
        assert method is not None, "%s: %d of %d messages" % (queue, len(got), expected)
        got.append((number_of(payload), method.redelivered))
    return got


def log_of(broker):
    with open(broker.log_path, "rb") as log:
        return log.read().decode("utf-8", "replace")


def fill(broker):
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for queue, messages in COUNTS.items():
            channel.queue_declare(queue, durable=True)
            publish_confirmed(channel, queue, range(messages))
        # Dead letters of lazy-dlx-source go to lazy-dlx-target through the default exchange.
        arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "lazy-dlx-target"}
        channel.queue_declare("lazy-dlx-source", durable=True, arguments=arguments)
        assert [number for number, _ in take(channel, "lazy-consume", ACKED, auto_ack=True)] == list(range(ACKED))
        # Delivered once and requeued: its delivered marker is in the log.
        method, _, _ = channel.basic_get("lazy-marker", auto_ack=False)
        channel.basic_nack(method.delivery_tag, requeue=True)
    finally:
        safe_close(connection)


def touch_before_the_walker(broker):
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        assert count(channel, "lazy-count") == 50
        publish_confirmed(channel, "lazy-count", range(50, 55))
        assert count(channel, "lazy-count") == 55
        got = take(channel, "lazy-consume", 30 - ACKED)
        assert [number for number, _ in got] == list(range(ACKED, 30)), "lazy-consume served other messages"
        assert not any(redelivered for _, redelivered in got), "never delivered, after a graceful stop"
        method, _, payload = channel.basic_get("lazy-get", auto_ack=True)
        assert (number_of(payload), method.message_count) == (0, 4)
        assert channel.queue_purge("lazy-purge").method.message_count == 7
        assert channel.queue_delete("lazy-delete").method.message_count == 4
        # A message that expires at once in the source is dead-lettered into a queue not
        # recovered yet, behind its three messages.
        publish_confirmed(channel, "lazy-dlx-source", [100], expiration="1")
        assert count(channel, "lazy-dlx-source") == 0
        deadline_checks = 0
        while count(channel, "lazy-dlx-target") < 4 and deadline_checks < 100:
            connection.sleep(0.05)
            deadline_checks += 1
        assert [number for number, _ in take(channel, "lazy-dlx-target", 4, auto_ack=False)] == [0, 1, 2, 100]
        channel.close()  # the four requeued
    finally:
        safe_close(connection)


def test_queues_touched_before_the_background_recovery_see_a_full_recovery(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    try:
        fill(broker)
        broker.stop(signal.SIGTERM)
        monkeypatch.setenv(PAUSE_VARIABLE, PAUSE_MS)
        broker.start()
        touch_before_the_walker(broker)
        log = log_of(broker)
        assert DEFERRED_LINE in log, "the start did not defer the queues' recovery:\n" + broker.log_tail()
        assert WALKED_LINE not in log, "the walker ran although held back"

        # A crash while lazy-untouched and lazy-marker were never recovered loses nothing confirmed.
        broker.stop(signal.SIGKILL)
        broker.start()
        connection = broker.connect()
        try:
            channel = connection.channel()
            assert count(channel, "lazy-count") == 55
            assert count(channel, "lazy-untouched") == 9
            assert count(channel, "lazy-get") >= 4
            assert count(channel, "lazy-dlx-target") == 4
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                channel.queue_declare("lazy-delete", durable=True, passive=True)
        finally:
            safe_close(connection)

        # lazy-marker is left untouched through a graceful stop: the crash before this run still
        # decides its flags at the next start.
        broker.stop(signal.SIGTERM)
        monkeypatch.delenv(PAUSE_VARIABLE)
        broker.start()
        connection = broker.connect()
        try:
            channel = connection.channel()
            got = take(channel, "lazy-marker", 3)
            assert [number for number, _ in got] == [0, 1, 2]
            assert all(redelivered for _, redelivered in got), "after a crash every recovered message is flagged redelivered"
            assert [number for number, _ in take(channel, "lazy-untouched", 9)] == list(range(9))
        finally:
            safe_close(connection)
    finally:
        broker.stop(signal.SIGKILL)
