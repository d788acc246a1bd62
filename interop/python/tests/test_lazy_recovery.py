"""A backlog recovered lazily serves every message (Lepus only, through pika).

A restart does not replay a durable queue's sealed segments: their summaries in the queue's index
(docs/storage.md, "Recovery") give its live and delivered positions; the segments are only read
to verify their checksums, so damage is still found and reported at start (test_corruption.py),
and only the newest segment is replayed. This test builds a backlog over about 85 small segments (`--segment-bytes-max 64 KiB`),
acks messages spread over half of it, requeues the others of that half (delivered before the
restart), publishes the rest (so the settles and delivered markers are in sealed, summarised
segments), and:

- after a graceful restart (printing the bytes read to start: rchar of /proc/PID/io until the queue
  answers a passive declare), drains the queue: exactly the
  unacked messages, in order, those delivered before flagged redelivered, the others not;
- after a SIGKILL and a restart (every recovered message flagged redelivered), every unacked
  message, in order; acks are not confirmed, so the last of them may be lost with the process
  (at-least-once: those messages come back too, and only those);
- with the index deleted, the start reads every segment and finds the same messages as the start
  with the index (the index is only a shortcut).

The backlog is published in transactions (tx.commit-ok waits for the fdatasync, as a confirm
does) and taken by a consumer, so a run takes seconds.
"""

import os
import signal
import time

import pika
import pytest

from conftest import safe_close
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

SEGMENT_BYTES = 64 * 1024
MESSAGES = 12000
BODY_BYTES = 400
# Messages per transaction while publishing the backlog.
COMMIT_EVERY = 1000
# Seconds a consumer may take to receive its messages.
CONSUME_TIMEOUT_SECONDS = 60
# Published after the messages were taken, so that the segments holding the settles and delivered
# markers of the take are sealed and summarised too (the newest segment is always read).
TAIL = 3000
# Taken before the restart: two thirds of those published before; of those, every ACKED_EVERY-th
# is acked (acks spread over the older segments, their settle records in the newer ones), the rest
# requeued.
FETCHED = (MESSAGES - TAIL) * 2 // 3
ACKED_EVERY = 3

class SmallSegmentBroker(LepusBroker):
    def extra_port_args(self):
        return super().extra_port_args() + ["--segment-bytes-max", str(SEGMENT_BYTES)]


def body(number):
    return (b"m%06d" % number).ljust(BODY_BYTES, b".")


def rchar(broker):
    with open("/proc/%d/io" % broker.proc.pid) as io:
        return int(next(line.split()[1] for line in io if line.startswith("rchar:")))


def backlog_bytes(data_dir):
    total = 0
    for root, _, files in os.walk(os.path.join(str(data_dir), "queues")):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files if name.endswith(".seg"))
    return total


def index_files(data_dir):
    found = []
    for root, _, files in os.walk(os.path.join(str(data_dir), "queues")):
        found += [os.path.join(root, name) for name in files if name == "segments.idx"]
    return found


def consume(connection, queue, count, auto_ack):
    """A consumer of at most `count` unacked messages on a new channel, until `count` arrived;
    cancelled then (so no more are delivered). Returns the channel and the deliveries as
    (number, redelivered, delivery tag)."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=0 if auto_ack else count)
    got = []

    def on_message(_channel, method, _properties, payload):
        got.append((int(payload[1:7]), method.redelivered, method.delivery_tag))

    tag = channel.basic_consume(queue, on_message, auto_ack=auto_ack)
    deadline = time.monotonic() + CONSUME_TIMEOUT_SECONDS
    while len(got) < count and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    for method, _, payload in channel.basic_cancel(tag):
        got.append((int(payload[1:7]), method.redelivered, method.delivery_tag))
    assert len(got) == count, "%d of %d messages delivered" % (len(got), count)
    return channel, got


def publish(channel, queue, numbers):
    """Persistent messages in transactions of COMMIT_EVERY (tx.commit-ok: they are on disk)."""
    for index, number in enumerate(numbers):
        channel.basic_publish("", queue, body(number), pika.BasicProperties(delivery_mode=2))
        if index % COMMIT_EVERY == COMMIT_EVERY - 1 or index == len(numbers) - 1:
            channel.tx_commit()


def build(broker, queue):
    """Publishes the backlog but its TAIL, takes the first FETCHED messages with a consumer, acks
    every ACKED_EVERY-th and lets the channel's close requeue the others (delivered before the
    restart), then publishes the TAIL. Returns the numbers left in the queue, those delivered and
    those acked."""
    connection = broker.connect()
    try:
        publisher = connection.channel()
        publisher.queue_declare(queue, durable=True)
        publisher.tx_select()
        publish(publisher, queue, range(MESSAGES - TAIL))
        channel, got = consume(connection, queue, FETCHED, auto_ack=False)
        assert [number for number, _, _ in got] == list(range(FETCHED))
        delivered, acked = set(), set()
        for number, _, tag in got:
            if number % ACKED_EVERY == 0:
                channel.basic_ack(tag)
                acked.add(number)
            else:
                delivered.add(number)
        channel.close()
        publish(publisher, queue, range(MESSAGES - TAIL, MESSAGES))
        left = [number for number in range(MESSAGES) if number not in acked]
        return left, delivered, acked
    finally:
        safe_close(connection)


def message_count(broker, queue):
    connection = broker.connect()
    try:
        return connection.channel().queue_declare(queue, durable=True, passive=True).method.message_count
    finally:
        safe_close(connection)


def take_all(broker, queue, auto_ack):
    """Every message of the queue, in order, by a consumer: [(number, redelivered)]. Taken with
    auto_ack, else left in the queue (requeued when the channel closes)."""
    count = message_count(broker, queue)
    connection = broker.connect()
    try:
        channel, got = consume(connection, queue, count, auto_ack=auto_ack)
        channel.close()
        return [(number, redelivered) for number, redelivered, _ in got]
    finally:
        safe_close(connection)


def restart_and_measure(broker, queue, expected_count, signal_number):
    broker.stop(signal_number)
    broker.start()
    started = time.monotonic()
    count = message_count(broker, queue)
    if expected_count is not None:
        assert count == expected_count
    return rchar(broker), time.monotonic() - started


def test_a_lazily_recovered_backlog_serves_every_message_in_order(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = SmallSegmentBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    queue = "lazy-backlog"
    try:
        left, delivered_before, _ = build(broker, queue)
        read, seconds = restart_and_measure(broker, queue, len(left), signal.SIGTERM)
        total = backlog_bytes(data_dir)
        assert index_files(data_dir), "no segment index was written"
        print("backlog %.1f MiB in segments, read %.2f MiB to start (%.2f s)" % (total / 2**20, read / 2**20, seconds))
        got = take_all(broker, queue, auto_ack=True)
        assert message_count(broker, queue) == 0
        assert [number for number, _ in got] == left, "the recovered queue did not serve exactly its messages in order"
        redelivered = {number for number, flag in got if flag}
        assert redelivered == delivered_before, "the delivered markers did not decide the redelivered flags"
    finally:
        broker.stop(signal.SIGKILL)


def test_after_a_crash_and_without_the_index_the_same_messages_come_back(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = SmallSegmentBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    queue = "lazy-crash"
    try:
        left, _, acked = build(broker, queue)
        restart_and_measure(broker, queue, None, signal.SIGKILL)
        recovered = [number for number, _ in take_all(broker, queue, auto_ack=False)]
        assert recovered == sorted(recovered), "the recovered queue served its messages out of order"
        assert set(left) <= set(recovered), "unacked messages lost: %s" % sorted(set(left) - set(recovered))[:10]
        assert set(recovered) - set(left) <= acked, "a message neither published nor requeued came back"
        print("after the crash %d of %d acks were lost (their messages came back)" % (len(set(recovered) - set(left)), len(acked)))
        assert index_files(data_dir), "no segment index was written"
        # Every segment sealed by now is summarised; a crash now, then a start without the index.
        broker.stop(signal.SIGKILL)
        for path in index_files(data_dir):
            os.remove(path)
        broker.start()
        got = take_all(broker, queue, auto_ack=True)
        assert message_count(broker, queue) == 0
        assert [number for number, _ in got] == recovered, "without the index, other messages came back"
        assert all(flag for _, flag in got), "after a crash every recovered message is flagged redelivered"
    finally:
        broker.stop(signal.SIGKILL)
