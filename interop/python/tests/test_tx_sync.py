"""tx.commit-ok means the transaction's persistent messages are on disk (Lepus only: it needs the
broker's data directory on a disk the test fills, which a shared RabbitMQ node does not allow).

The data directory is on a small tmpfs (needs root to mount; in CI a machine that cannot is a
failure unless LEPUS_ALLOW_SKIP=1, as for every tmpfs test). A transactional publisher commits persistent messages to a
durable queue while the disk is filled up: a commit whose messages could not be written or synced
must fail (RabbitMQ's answer to a commit it cannot complete: channel.close 406 "partial tx
completion"), never be answered commit-ok. The proof: the broker is killed with SIGKILL while the
disk is still full, restarted with space, and every message of every commit that got commit-ok
must be in the queue.
"""

import errno
import os

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import safe_close
from durability_support import small_tmpfs
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

TMPFS_BYTES = 16 * 1024 * 1024
SEGMENT_BYTES_MAX = 1024 * 1024
BODY_BYTES = 8 * 1024
MESSAGES_PER_COMMIT = 4
COMMITS_BEFORE_FULL = 3
COMMITS_MAX = 200
FAILED_COMMITS_WANTED = 3
QUEUE = "tx-sync-q"


@pytest.fixture
def small_disk(tmp_path):
    yield from small_tmpfs(tmp_path, TMPFS_BYTES)


def fill(path):
    """Writes `path` until the filesystem has no byte left."""
    with open(path, "wb", buffering=0) as file:
        for chunk_bytes in (256 * 1024, 4096, 1):
            chunk = b"\xff" * chunk_bytes
            while True:
                try:
                    file.write(chunk)
                except OSError as error:
                    assert error.errno == errno.ENOSPC, error
                    break


def transactional_channel(connection):
    channel = connection.channel()
    channel.tx_select()
    return channel


def publish_and_commit(channel, commit_number):
    """Publishes one transaction's messages and commits; returns their ids (once commit-ok came)."""
    ids = ["c%d-m%d" % (commit_number, index) for index in range(MESSAGES_PER_COMMIT)]
    for message_id in ids:
        body = message_id.encode().ljust(BODY_BYTES, b".")
        channel.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2, message_id=message_id))
    channel.tx_commit()
    return ids


def test_commit_is_never_ok_for_messages_that_were_not_synced(small_disk, tmp_path, monkeypatch):
    # No disk alarm (it would block the publisher before the disk fills); small segments, so the
    # broker's spare segment files take little of the small disk.
    monkeypatch.setenv("LEPUS_DISK_FREE_LIMIT_BYTES", "0")
    monkeypatch.setenv("LEPUS_SEGMENT_BYTES_MAX", str(SEGMENT_BYTES_MAX))
    data_dir = small_disk / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    connection = None
    committed, failures = [], []
    try:
        connection = broker.connect()
        channel = transactional_channel(connection)
        channel.queue_declare(QUEUE, durable=True)
        for commit_number in range(COMMITS_BEFORE_FULL):
            committed += publish_and_commit(channel, commit_number)

        fill(small_disk / "ballast")
        for commit_number in range(COMMITS_BEFORE_FULL, COMMITS_MAX):
            try:
                committed += publish_and_commit(channel, commit_number)
            except ChannelClosedByBroker as error:
                assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - partial tx completion"), error
                failures.append(commit_number)
                if len(failures) == FAILED_COMMITS_WANTED:
                    break
                channel = transactional_channel(connection)
        assert broker.proc.poll() is None, broker.log_tail()
        safe_close(connection)
        connection = None
        # Killed while the disk is still full: what was not written is gone with the process.
        broker.kill()
        os.remove(small_disk / "ballast")

        broker.start()
        connection = broker.connect()
        channel = connection.channel()
        recovered = set()
        while True:
            method, properties, _ = channel.basic_get(QUEUE, auto_ack=True)
            if method is None:
                break
            recovered.add(properties.message_id)
        lost = [message_id for message_id in committed if message_id not in recovered]
        assert not lost, "%d messages got tx.commit-ok but were not on disk, first: %s" % (len(lost), lost[:5])
        assert len(committed) >= COMMITS_BEFORE_FULL * MESSAGES_PER_COMMIT
        # Without failed commits the test proved nothing: the disk must have filled.
        assert len(failures) == FAILED_COMMITS_WANTED, "only %d of %d commits failed on the full disk" % (
            len(failures), COMMITS_MAX - COMMITS_BEFORE_FULL)
    finally:
        safe_close(connection)
        broker.kill()
