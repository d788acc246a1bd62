"""Journal replay through the binary (Lepus only).

With `--sync always` a confirm waits for the node journal's fdatasync only: segment files are
written to the page cache and synced at checkpoints (docs/storage.md, "The node journal"). A
SIGKILL keeps the page cache, so a plain crash test never needs the journal. Here the broker is
killed during confirmed publishing and then the segment bytes a power loss could take are
destroyed: everything past the segment header of every segment written since the last checkpoint.
After a restart every confirmed message must be back, from the journal alone, and nothing that was
never published.

The rotated variant first makes the journal start new files several times (a checkpoint each), so
the replay reads a reused journal file that still holds entries of its previous life.
"""

import os
import random
import time

import pika
import pytest

from conftest import safe_close
from durability_support import (SEGMENT_HEADER_BYTES, check_segment_header, drain_bodies, journal_files,
                                 kill_during_confirmed_publishing, queue_directories, segments, start_broker)

pytestmark = pytest.mark.lepus_only

PUBLISHERS = 3
CONFIRMED_MIN = 300
BODY_BYTES = 200
# Small segments, so the destroyed queue has several of them (sealed ones and the active one).
SEGMENT_BYTES = 16 * 1024
# JOURNAL_BYTES_MAX in crates/storage/src/journal.rs: a checkpoint starts a new journal file then.
JOURNAL_FILE_BYTES = 64 * 1024 * 1024
ROTATION_BODY_BYTES = 1024 * 1024
ROTATIONS = 3
CHECKPOINT_TIMEOUT_SECONDS = 30


@pytest.fixture
def journaled_broker(tmp_path, monkeypatch):
    monkeypatch.setenv("LEPUS_SYNC", "always")
    monkeypatch.setenv("LEPUS_SEGMENT_BYTES_MAX", str(SEGMENT_BYTES))
    broker = start_broker(tmp_path)
    yield broker
    broker.kill()


def newest_journal_sequence(broker):
    # A checkpoint at start (the seals recovery wrote) turns the first file into a spare and starts
    # the next one: wait out that moment rather than read the directory in it.
    deadline = time.monotonic() + 10
    files = journal_files(broker.data_dir)
    while not files and time.monotonic() < deadline:
        time.sleep(0.05)
        files = journal_files(broker.data_dir)
    assert files, "no journal file in %s/journal" % broker.data_dir
    return files[-1][0]


def rotate_journal(broker, times):
    """Publishes confirmed 1 MiB messages to a queue it keeps purging until the journal has started
    `times` new files, then waits until the last checkpoint has retired every older file."""
    first = newest_journal_sequence(broker)
    conn = broker.connect()
    try:
        channel = conn.channel()
        channel.queue_declare("rotation", durable=True)
        channel.confirm_delivery()
        body = b"r" * ROTATION_BODY_BYTES
        published_max = (times + 1) * JOURNAL_FILE_BYTES // ROTATION_BODY_BYTES
        for index in range(published_max):
            if newest_journal_sequence(broker) >= first + times:
                break
            channel.basic_publish("", "rotation", body, pika.BasicProperties(delivery_mode=2))
            if index % 8 == 7:
                channel.queue_purge("rotation")
        channel.queue_purge("rotation")
    finally:
        safe_close(conn)
    assert newest_journal_sequence(broker) >= first + times, "the journal did not start %d new files" % times
    deadline = time.monotonic() + CHECKPOINT_TIMEOUT_SECONDS
    while len(journal_files(broker.data_dir)) > 1:
        assert time.monotonic() < deadline, "the checkpoint never retired the older journal files: %s" % (
            journal_files(broker.data_dir),)
        time.sleep(0.05)


def unwritten_spare(path):
    with open(path, "rb") as segment:
        return segment.read(SEGMENT_HEADER_BYTES) == b"\0" * SEGMENT_HEADER_BYTES


def destroy_past_headers(data_dir, queue, how):
    """Truncates (or zeroes) every segment of `queue` right after its header record. A segment
    whose header is still all zeros is a zero-filled spare the broker renamed into place and was
    killed before writing (recovery reads it as empty): nothing of it to destroy, not counted."""
    queue_segments = [(first, path) for first, path in segments(queue_directories(data_dir)[queue])
                      if not unwritten_spare(path)]
    for _, path in queue_segments:
        check_segment_header(path)
        size = os.path.getsize(path)
        with open(path, "r+b") as segment:
            if how == "truncate":
                segment.truncate(SEGMENT_HEADER_BYTES)
            else:
                segment.seek(SEGMENT_HEADER_BYTES)
                segment.write(b"\0" * (size - SEGMENT_HEADER_BYTES))
            os.fsync(segment.fileno())
    return len(queue_segments)


@pytest.mark.parametrize("rotations,damage", [(0, "truncate"), (ROTATIONS, "zero")])
def test_confirmed_messages_come_back_from_the_journal_alone(journaled_broker, rotations, damage):
    broker = journaled_broker
    if rotations:
        rotate_journal(broker, rotations)
    sequence_before = newest_journal_sequence(broker)
    conn = broker.connect()
    conn.channel().queue_declare("replayed", durable=True)
    safe_close(conn)

    ledger = kill_during_confirmed_publishing(broker, "replayed", PUBLISHERS, CONFIRMED_MIN, random.Random(),
                                              body_bytes=BODY_BYTES)
    # No checkpoint started since the queue was declared: none of its segment writes was synced,
    # so a power loss could take all of them, and the journal holds them all.
    assert newest_journal_sequence(broker) == sequence_before, "a checkpoint ran during the publishing"
    destroyed = destroy_past_headers(broker.data_dir, "replayed", damage)
    assert destroyed >= 3, "expected several segments, got %d" % destroyed

    broker.start()
    recovered = [body.rstrip(b".").decode() for body in drain_bodies(broker, "replayed")]
    missing = ledger.confirmed - set(recovered)
    assert not missing, "%d of %d confirmed messages lost, e.g. %s\n%s" % (
        len(missing), len(ledger.confirmed), sorted(missing)[:5], broker.log_tail())
    unknown = set(recovered) - ledger.attempted
    assert not unknown, "bodies no publisher sent: %s" % sorted(unknown)[:5]
    assert len(recovered) == len(set(recovered)), "a message came back twice"
    for publisher in range(PUBLISHERS):
        sequences = [int(body.split("-")[1]) for body in recovered if body.startswith("p%d-" % publisher)]
        assert sequences == sorted(sequences), "publisher %d's messages out of order" % publisher
    if rotations:
        # Everything published to it was purged: the reused journal files' stale entries and the
        # recycled segments must not bring any of it back.
        assert drain_bodies(broker, "rotation") == []
    print("journal replay: %d confirmed, %d recovered, %d segments destroyed, journal sequence %d"
          % (len(ledger.confirmed), len(recovered), destroyed, sequence_before))
