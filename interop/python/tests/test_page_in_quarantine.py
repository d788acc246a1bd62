"""A flipped bit in a sealed, summarised segment (Lepus only, through pika).

A restart trusts the summaries in a queue's index and does not read its sealed segments
(docs/storage.md, "Recovery"), so damage in one is found when a page-in reads the record, which
checks every record's checksum. The bad record is quarantined: a log line names the file, the
offset and the positions lost, the bad bytes are copied aside, the rest of the queue is served
in order, the queue's message count drops by what was lost, and the next start agrees.
"""

import os
import signal
import struct

import pika
import pytest

from conftest import safe_close
from test_corruption import MESSAGES, recovered_indexes
from test_lifecycle import LepusBroker
from test_paging import message_count

pytestmark = pytest.mark.lepus_only

BODY_BYTES = 400
SEGMENT_BYTES = 4096
# Where a segment's first record starts: the header record (length, crc, kind, term, position,
# version, nonce).
SEGMENT_HEADER_RECORD_BYTES = 34
# A persistent publish record as segment format 3 writes it (format 2 wrote kind 1).
KIND_PUBLISH = 8


class SmallSegmentBroker(LepusBroker):
    def extra_port_args(self):
        return super().extra_port_args() + ["--segment-bytes-max", str(SEGMENT_BYTES)]


def queue_directory(data_dir):
    queues = os.path.join(str(data_dir), "queues")
    (name,) = os.listdir(queues)
    return os.path.join(queues, name)


def segments(directory):
    return sorted(os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(".seg"))


def publish_records(path):
    """(offset, length, position) of each publish record of a segment."""
    with open(path, "rb") as f:
        data = f.read()
    offset, found = SEGMENT_HEADER_RECORD_BYTES, []
    while offset + 25 <= len(data):
        (length,) = struct.unpack(">I", data[offset:offset + 4])
        if length == 0:
            break
        if data[offset + 8] == KIND_PUBLISH:
            (position,) = struct.unpack(">Q", data[offset + 17:offset + 25])
            found.append((offset, length, position))
        offset += 8 + length
    return found


def test_a_flipped_bit_in_a_summarised_segment_is_quarantined_at_page_in(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = SmallSegmentBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    try:
        conn = broker.connect()
        try:
            channel = conn.channel()
            channel.queue_declare("quarantine", durable=True)
            channel.confirm_delivery()
            for index in range(MESSAGES):
                channel.basic_publish("", "quarantine", (b"m%04d-" % index).ljust(BODY_BYTES, b"x"),
                                      pika.BasicProperties(delivery_mode=2))
        finally:
            safe_close(conn)
        broker.stop(signal.SIGTERM)
        directory = queue_directory(data_dir)
        assert os.path.exists(os.path.join(directory, "segments.idx")), "no segment index was written"
        files = segments(directory)
        assert len(files) >= 8, "expected several segments, got %d" % len(files)
        victim = files[3]
        offset, length, position = publish_records(victim)[1]
        # The last byte of the record's body: the record fails its checksum, its length still
        # leads to the next record, so only this message is lost.
        with open(victim, "r+b") as f:
            f.seek(offset + 8 + length - 1)
            byte = f.read(1)
            f.seek(offset + 8 + length - 1)
            f.write(bytes([byte[0] ^ 0x5A]))

        broker.start()
        assert message_count(broker, "quarantine") == MESSAGES, "the start read the segment (or lost count)"
        log = broker.log_tail(200000)
        assert "torn or corrupt" not in log, "the start read the summarised segment:\n" + log
        got = recovered_indexes(broker, "quarantine")
        assert got == [i for i in range(MESSAGES) if i != position], "not every intact message, in order"
        assert message_count(broker, "quarantine") == 0, "the lost message still counted"
        log = broker.log_tail(200000)
        line = next((l for l in log.splitlines() if "quarantined" in l), None)
        assert line is not None, "no quarantine reported:\n" + log
        assert os.path.basename(victim) in line and "offset=%d" % offset in line, line
        assert "first_lost=%d" % position in line and "lost=1" in line, line
        assert any(name.endswith(".quarantined") for name in os.listdir(directory)), "bad bytes not set aside"
        assert broker.proc.poll() is None, "the broker died"

        # Published after the quarantine and the restart agree with the counts.
        broker.stop(signal.SIGTERM)
        broker.start()
        assert message_count(broker, "quarantine") == 0, "the lost message came back after a restart"
    finally:
        broker.kill()
