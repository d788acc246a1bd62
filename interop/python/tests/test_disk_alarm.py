"""The free-disk alarm (Lepus only): with the data directory on a small tmpfs, filling the disk
below the limit blocks a publishing connection (connection.blocked), and freeing it unblocks it
(connection.unblocked) with its publishes confirmed. Needs root to mount the tmpfs."""

import os
import subprocess
import time

import pika
import pytest

from conftest import safe_close
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

TMPFS_BYTES = 64 * 1024 * 1024
LIMIT_BYTES = 32 * 1024 * 1024
BALLAST_BYTES = 40 * 1024 * 1024
WAIT_SECONDS = 10


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % TMPFS_BYTES, "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root): %s" % result.stderr.strip())
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def pump(conn, predicate, what):
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, "no %s within %ds" % (what, WAIT_SECONDS)
        conn.process_data_events(time_limit=0.1)


def test_low_disk_blocks_publishers_until_space_returns(small_disk, tmp_path, monkeypatch):
    monkeypatch.setenv("LEPUS_DISK_FREE_LIMIT_BYTES", str(LIMIT_BYTES))
    data_dir = small_disk / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    conn = None
    try:
        conn = broker.connect()
        events = []
        conn.add_on_connection_blocked_callback(lambda _conn, method: events.append(("blocked", method.method.reason)))
        conn.add_on_connection_unblocked_callback(lambda _conn, _method: events.append(("unblocked", None)))
        channel = conn.channel()
        channel.queue_declare("disk-q", durable=True)
        channel.confirm_delivery()
        channel.basic_publish("", "disk-q", b"before", pika.BasicProperties(delivery_mode=2))

        ballast = small_disk / "ballast"
        with open(ballast, "wb") as f:
            f.write(b"\0" * BALLAST_BYTES)
        # The next publish is not read while the alarm is up: the broker answers connection.blocked.
        channel_impl = channel._impl
        channel_impl.basic_publish("", "disk-q", b"during", pika.BasicProperties(delivery_mode=2))
        pump(conn, lambda: ("blocked", "low on disk") in events, "connection.blocked")

        os.remove(ballast)
        pump(conn, lambda: ("unblocked", None) in events, "connection.unblocked")
        channel.basic_publish("", "disk-q", b"after", pika.BasicProperties(delivery_mode=2))
        bodies = []
        for _ in range(3):
            method, _, body = channel.basic_get("disk-q", auto_ack=True)
            assert method is not None, "messages missing after the alarm: %s" % bodies
            bodies.append(body)
        assert bodies == [b"before", b"during", b"after"]
    finally:
        safe_close(conn)
        broker.kill()
