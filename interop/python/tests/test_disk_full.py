"""Failed writes on a full disk (Lepus only, needs root for a tmpfs).

docs/storage.md ("What a confirm promises"): if a write or sync fails (ENOSPC, EIO) the publishers
get basic.nack, zeros are written over the start of the failed write, and the records stay
buffered for the next attempt, which writes them at the same offset, so the log never holds
garbage in its middle. So, with the data directory on a small tmpfs filled to the last byte
(the free-disk alarm off, or it would block publishers first):
- publishes are nacked while the disk is full, and acked again once space returns;
- after a crash and restart every acked message is back, and so is every nacked one, exactly
  once and in order: their records were buffered and written by the next successful attempt;
- recovery reports no damaged segment.
"""

import os
import signal

import pika
import pytest

from conftest import safe_close
from durability_support import drain_bodies, fill_filesystem, small_tmpfs, start_broker

pytestmark = pytest.mark.lepus_only

TMPFS_BYTES = 48 * 1024 * 1024
BODY_BYTES = 2048
ACKED_BEFORE = 20
# Publishes tried while the disk is full: the first nack must come within these.
FULL_PUBLISHES_MAX = 200
# Publishes after the first nack, still while full: each must be nacked too.
NACKED_AFTER_FIRST = 5
ACKED_AFTER = 20


@pytest.fixture
def small_disk(tmp_path):
    yield from small_tmpfs(tmp_path, TMPFS_BYTES)


def body(name):
    return name.encode().ljust(BODY_BYTES, b".")


def publish(channel, name):
    """Publishes one persistent message; True when acked, False when nacked."""
    try:
        channel.basic_publish("", "full-q", body(name), pika.BasicProperties(delivery_mode=2))
        return True
    except pika.exceptions.NackError:
        return False


def publish_until_full(channel):
    """Publishes until the first nack, then a few more; returns (acked, nacked) names in order."""
    acked, nacked = [], []
    for index in range(FULL_PUBLISHES_MAX):
        name = "full-%d" % index
        (acked if publish(channel, name) else nacked).append(name)
        if nacked:
            break
    assert nacked, "%d publishes acked on a full disk, none nacked" % FULL_PUBLISHES_MAX
    for index in range(len(acked) + 1, len(acked) + 1 + NACKED_AFTER_FIRST):
        name = "full-%d" % index
        assert not publish(channel, name), "%s was acked while the disk was still full" % name
        nacked.append(name)
    return acked, nacked


def fill_the_disk_while_publishing(broker, small_disk):
    """Publishes with space, on a full disk and after space returns; returns every name in order
    and the acked and the nacked ones."""
    conn = None
    try:
        conn = broker.connect()
        channel = conn.channel()
        channel.queue_declare("full-q", durable=True)
        channel.confirm_delivery()
        before = ["before-%d" % index for index in range(ACKED_BEFORE)]
        for name in before:
            assert publish(channel, name), "%s nacked with free space" % name

        ballast = small_disk / "ballast"
        fill_filesystem(ballast)
        acked_while_full, nacked = publish_until_full(channel)
        failures = broker.metric("lepus_storage_sync_failures_total")
        assert failures > 0, "nacks without a failed group commit"

        os.remove(ballast)
        after = ["after-%d" % index for index in range(ACKED_AFTER)]
        for name in after:
            assert publish(channel, name), "%s nacked after space returned:\n%s" % (name, broker.log_tail())
        # While running, the queue holds every message, nacked ones included (they stayed buffered).
        expected = before + acked_while_full + nacked + after
        assert channel.queue_declare("full-q", passive=True).method.message_count == len(expected)
    finally:
        safe_close(conn)
    print("disk full: %d acked before, %d acked while filling, %d nacked, %d acked after"
          % (len(before), len(acked_while_full), len(nacked), len(after)))
    return expected, set(before + acked_while_full + after), nacked


def test_publishes_are_nacked_while_the_disk_is_full_and_the_log_stays_intact(small_disk, tmp_path, monkeypatch):
    monkeypatch.setenv("LEPUS_DISK_FREE_LIMIT_BYTES", "0")
    monkeypatch.setenv("LEPUS_SYNC", "always")
    broker = start_broker(tmp_path, data_dir=small_disk / "data")
    try:
        expected, acked, nacked = fill_the_disk_while_publishing(broker, small_disk)
        broker.stop(signal.SIGKILL)
        broker.start()
        recovered = [message.rstrip(b".").decode() for message in drain_bodies(broker, "full-q")]
        missing = acked - set(recovered)
        assert not missing, "acked messages lost: %s\n%s" % (sorted(missing)[:5], broker.log_tail())
        assert recovered == expected, "recovered %d messages, expected every one (nacked: %s) exactly once in order:\n%s\n%s" % (
            len(recovered), nacked, recovered[:50], broker.log_tail())
        assert "damaged segment" not in broker.log_tail(100_000), broker.log_tail()
    finally:
        broker.kill()
