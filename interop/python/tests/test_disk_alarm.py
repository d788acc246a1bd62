"""The free-disk alarm (Lepus only): with the data directory on a small tmpfs, filling the disk
below the limit blocks a publishing connection (connection.blocked), and freeing it unblocks it
(connection.unblocked) with its publishes confirmed. While blocked, the publishes it sent are not
taken (the queue's depth seen from another connection does not grow) and consumers still drain.
Needs root to mount the tmpfs: without it the test skips, and fails under CI=true unless
LEPUS_ALLOW_SKIP=1."""

import os
import time

import pika
import pytest

from conftest import safe_close
from durability_support import small_tmpfs
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

TMPFS_BYTES = 64 * 1024 * 1024
LIMIT_BYTES = 32 * 1024 * 1024
BALLAST_BYTES = 40 * 1024 * 1024
WAIT_SECONDS = 10
BEFORE = 5
DURING = 20
# How long the queue must not grow while its publisher is blocked.
HELD_BACK_WATCH_SECONDS = 1.5


@pytest.fixture
def small_disk(tmp_path):
    yield from small_tmpfs(tmp_path, TMPFS_BYTES)


def pump(conn, predicate, what):
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, "no %s within %ds" % (what, WAIT_SECONDS)
        conn.process_data_events(time_limit=0.1)


def depth(channel):
    return channel.queue_declare("disk-q", passive=True).method.message_count


def assert_depth_stays(channel, expected, what):
    """The queue's depth, seen from a connection that never published, stays `expected` for a
    while (the held-back publishes were sent before this is called)."""
    deadline = time.monotonic() + HELD_BACK_WATCH_SECONDS
    while time.monotonic() < deadline:
        assert depth(channel) == expected, "the queue grew while the publisher was blocked (%s)" % what
        time.sleep(0.05)


def test_low_disk_blocks_publishers_until_space_returns(small_disk, tmp_path, monkeypatch):
    monkeypatch.setenv("LEPUS_DISK_FREE_LIMIT_BYTES", str(LIMIT_BYTES))
    data_dir = small_disk / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    conn = observer = None
    try:
        conn = broker.connect()
        events = []
        conn.add_on_connection_blocked_callback(lambda _conn, method: events.append(("blocked", method.method.reason)))
        conn.add_on_connection_unblocked_callback(lambda _conn, _method: events.append(("unblocked", None)))
        channel = conn.channel()
        channel.queue_declare("disk-q", durable=True)
        channel.confirm_delivery()
        # Opened now: while blocked, the broker would not read a channel.open either.
        unconfirmed_channel = conn.channel()
        before = [b"before-%d" % index for index in range(BEFORE)]
        for body in before:
            channel.basic_publish("", "disk-q", body, pika.BasicProperties(delivery_mode=2))
        # The consumer's connection never publishes, so the alarm does not block it.
        observer = broker.connect()
        observer_channel = observer.channel()
        assert depth(observer_channel) == BEFORE

        ballast = small_disk / "ballast"
        with open(ballast, "wb") as f:
            f.write(b"\0" * BALLAST_BYTES)
        # A publisher learns of the alarm without publishing again.
        pump(conn, lambda: ("blocked", "low on disk") in events, "connection.blocked")
        # Sent now, on a channel without confirms (nothing to wait for), these are not read while
        # the alarm is up.
        during = [b"during-%d" % index for index in range(DURING)]
        for body in during:
            unconfirmed_channel.basic_publish("", "disk-q", body, pika.BasicProperties(delivery_mode=2))
        conn.process_data_events(time_limit=0.1)
        assert_depth_stays(observer_channel, BEFORE, "before draining")
        # Consumers still drain while publishers are blocked.
        drained = [observer_channel.basic_get("disk-q", auto_ack=True)[2] for _ in range(BEFORE)]
        assert drained == before
        assert_depth_stays(observer_channel, 0, "after draining")
        assert ("unblocked", None) not in events

        os.remove(ballast)
        pump(conn, lambda: ("unblocked", None) in events, "connection.unblocked")
        # Confirmed, so everything this connection sent before it was taken too.
        channel.basic_publish("", "disk-q", b"after", pika.BasicProperties(delivery_mode=2))
        bodies = [observer_channel.basic_get("disk-q", auto_ack=True)[2] for _ in range(DURING + 1)]
        assert bodies == during + [b"after"]
        assert depth(observer_channel) == 0
    finally:
        safe_close(conn)
        safe_close(observer)
        broker.kill()
