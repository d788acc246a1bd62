"""Damaged message logs (Lepus only): a flipped byte, a truncated segment and a missing segment
file are detected (a cut or a missing file at restart, a flipped byte in a summarised segment when
a page-in reads it), reported in the log with the file (and offset), and the queue serves every
message that is intact."""

import os
import signal
import time

import pika
import pytest

from conftest import safe_close
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

MESSAGES = 120
BODY_BYTES = 400
SEGMENT_BYTES = 4096


@pytest.fixture
def segmented_broker(tmp_path, monkeypatch):
    monkeypatch.setenv("LEPUS_SEGMENT_BYTES_MAX", str(SEGMENT_BYTES))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    yield broker
    broker.kill()


def queue_segments(data_dir):
    queues = os.path.join(str(data_dir), "queues")
    (queue_dir,) = [os.path.join(queues, name) for name in os.listdir(queues)]
    names = sorted(name for name in os.listdir(queue_dir) if name.endswith(".seg"))
    return [(int(name[:-4]), os.path.join(queue_dir, name)) for name in names]


def publish_all(broker, queue):
    conn = broker.connect()
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for index in range(MESSAGES):
            body = (b"m%04d-" % index).ljust(BODY_BYTES, b"x")
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    finally:
        safe_close(conn)


def recovered_indexes(broker, queue):
    conn = broker.connect()
    try:
        channel = conn.channel()
        indexes = []
        for _ in range(MESSAGES + 1):
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return indexes
            indexes.append(int(body[1:5]))
        pytest.fail("more messages than were published")
    finally:
        safe_close(conn)


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_damaged_segment_is_reported_and_the_rest_recovered(segmented_broker, damage):
    broker = segmented_broker
    publish_all(broker, "damaged")
    broker.stop(signal.SIGTERM)
    segments = queue_segments(broker.data_dir)
    assert len(segments) >= 6, "expected several segments, got %d" % len(segments)
    victim_index = 3
    first, path = segments[victim_index]
    end = segments[victim_index + 1][0]
    size = os.path.getsize(path)
    if damage == "flip":
        with open(path, "r+b") as f:
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    else:
        os.remove(path)
    broker.start()
    indexes = recovered_indexes(broker, "damaged")
    assert indexes == sorted(indexes), "recovered messages out of order"
    outside = [i for i in range(MESSAGES) if not first <= i < end]
    inside = [i for i in indexes if first <= i < end]
    assert [i for i in indexes if not first <= i < end] == outside, "a message outside the damaged segment was lost"
    assert len(inside) < end - first, "the damage went unnoticed"
    if damage == "remove":
        assert inside == []
    else:
        # Everything outside the damaged records survives: what is missing is one run (a cut ends
        # the segment's replay at start; a flipped bit in a summarised segment is quarantined by
        # the page-in that reads it, which steps over that one record to the next that checks).
        missing = [i for i in range(first, end) if i not in inside]
        assert missing == list(range(missing[0], missing[0] + len(missing))), missing
        if damage == "flip":
            assert len(missing) == 1, missing
        log = broker.log_tail(20000)
        assert os.path.basename(path) in log and "offset" in log, log


@pytest.mark.parametrize("field", ["body", "length"])
def test_a_damaged_record_in_the_segment_read_at_start_loses_only_itself(segmented_broker, field):
    """The newest segment is read whole at start (no summary of it exists yet): a damaged record
    there is quarantined and the intact records after it are served, not cut off with it."""
    broker = segmented_broker
    publish_all(broker, "newest")
    broker.stop(signal.SIGTERM)
    first, path = queue_segments(broker.data_dir)[-1]
    in_newest = MESSAGES - first
    assert in_newest >= 3, "the newest segment holds %d messages" % in_newest
    # The second record after the segment header: its length field, or a byte of its body.
    with open(path, "rb") as f:
        data = f.read()
    header_bytes = 34
    second = header_bytes + int.from_bytes(data[header_bytes:header_bytes + 4], "big") + 8
    offset = second + 1 if field == "length" else second + 8 + int.from_bytes(data[second:second + 4], "big") - 1
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes([data[offset] ^ 0xFF]))
    broker.start()
    # The broker binds its port before it reads its data directory: the report comes with the
    # recovery, after the start returns.
    log = log_once_it_says(broker, "quarantined")
    assert "quarantined" in log and os.path.basename(path) in log, log
    # The damage was made a record every later read steps over: a second start reports nothing,
    # and serves every intact message (read first, so the recovery is over when the log is read).
    broker.stop(signal.SIGTERM)
    broker.start()
    indexes = recovered_indexes(broker, "newest")
    assert indexes == [i for i in range(MESSAGES) if i != first + 1], indexes
    assert "quarantined" not in broker.log_tail(20000) and "corrupt" not in broker.log_tail(20000)


def log_once_it_says(broker, text, timeout_s=30):
    """The broker's log once it holds `text`, or as it is after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    log = broker.log_tail(20000)
    while text not in log and time.monotonic() < deadline:
        time.sleep(0.1)
        log = broker.log_tail(20000)
    return log
