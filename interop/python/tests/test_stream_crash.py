"""A stream queue under kill -9 (Lepus only; real processes): publishers with confirms and a reader
run while the broker is killed with SIGKILL at a random moment, four times in a row, each time
restarting on what the kill left. Segments are small, so they roll during the run.

After every restart, reading the stream from `first` must show:
- every confirmed message, exactly once;
- at every offset the reader saw before a kill (a committed offset), the same message: an offset
  is never reused;
- offsets without a gap from the first to the last: an offset is never skipped (AMQP 0-9-1
  publishes write no tracking chunks, so a Lepus stream has no gaps of its own);
- messages never published: none.
"""

import os
import random
import signal
import threading
import time

import pika
import pytest

from conftest import make_params, safe_close, unique
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

ITERATIONS = 4
PUBLISHERS = 2
RUN_SECONDS_MIN = 0.5
RUN_SECONDS_MAX = 2.0
SEGMENT_BYTES = 16 * 1024
READ_QUIET_SECONDS = 1.0
READ_SECONDS_MAX = 60.0


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.confirmed = set()
        self.attempted = set()
        # offset -> message id, as a reader saw it before a kill (committed offsets).
        self.seen = {}


def publisher(url, queue, iteration, index, ledger, stop):
    conn = None
    try:
        conn = pika.BlockingConnection(make_params(url))
        channel = conn.channel()
        channel.confirm_delivery()
        sequence = 0
        while not stop.is_set():
            message_id = "i%d-p%d-%d" % (iteration, index, sequence)
            with ledger.lock:
                ledger.attempted.add(message_id)
            channel.basic_publish("", queue, message_id.encode() + b" " + b"x" * random.randrange(0, 300))
            with ledger.lock:
                ledger.confirmed.add(message_id)
            sequence += 1
    except Exception:
        pass  # The broker was killed: what was confirmed is in the ledger.
    finally:
        safe_close(conn)


def reader(url, queue, ledger, stop):
    """Follows the stream from its first offset, noting what it sees at each offset."""
    conn = None
    try:
        conn = pika.BlockingConnection(make_params(url))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=500)

        def on_message(ch, method, properties, body):
            with ledger.lock:
                ledger.seen[properties.headers["x-stream-offset"]] = body.split(b" ", 1)[0].decode()
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(queue, on_message, arguments={"x-stream-offset": "first"})
        while not stop.is_set():
            conn.process_data_events(time_limit=0.05)
    except Exception:
        pass
    finally:
        safe_close(conn)


def read_everything(broker, queue):
    """(offset, message id) of every message in the stream, from the first."""
    conn = broker.connect()
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=1000)
        got = []
        channel.basic_consume(queue, lambda ch, method, properties, body: (
            got.append((properties.headers["x-stream-offset"], body.split(b" ", 1)[0].decode())),
            ch.basic_ack(method.delivery_tag)), arguments={"x-stream-offset": "first"})
        deadline, last_count, last_change = time.monotonic() + READ_SECONDS_MAX, -1, time.monotonic()
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
            if len(got) != last_count:
                last_count, last_change = len(got), time.monotonic()
            elif time.monotonic() - last_change > READ_QUIET_SECONDS:
                break
        return got
    finally:
        safe_close(conn)


def check(records, ledger, iteration, broker):
    offsets = [offset for offset, _ in records]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), \
        "iteration %d: offsets skipped or repeated: %s" % (iteration, [pair for pair in zip(offsets, offsets[1:]) if pair[1] != pair[0] + 1][:5])
    ids = [message_id for _, message_id in records]
    assert len(ids) == len(set(ids)), "iteration %d: a message is there twice" % iteration
    with ledger.lock:
        missing = ledger.confirmed - set(ids)
        invented = set(ids) - ledger.attempted
        reused = {offset: (before, dict(records).get(offset)) for offset, before in ledger.seen.items() if dict(records).get(offset) != before}
    assert not missing, "iteration %d: %d confirmed messages lost, e.g. %s\n%s" % (iteration, len(missing), sorted(missing)[:5], broker.log_tail())
    assert not invented, "iteration %d: messages never published: %s" % (iteration, sorted(invented)[:5])
    assert not reused, "iteration %d: offsets that held another message before the kill: %s" % (iteration, list(reused.items())[:5])


def test_sigkill_under_confirmed_load_keeps_every_confirmed_record_at_its_offset(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    queue = unique("stream-crash")
    conn = broker.connect()
    conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "stream", "x-stream-max-segment-size-bytes": SEGMENT_BYTES})
    safe_close(conn)
    ledger = Ledger()
    try:
        for iteration in range(ITERATIONS):
            stop = threading.Event()
            threads = [threading.Thread(target=publisher, args=(broker.url, queue, iteration, index, ledger, stop)) for index in range(PUBLISHERS)]
            threads.append(threading.Thread(target=reader, args=(broker.url, queue, ledger, stop)))
            for thread in threads:
                thread.start()
            time.sleep(random.uniform(RUN_SECONDS_MIN, RUN_SECONDS_MAX))
            broker.proc.send_signal(signal.SIGKILL)
            broker.proc.wait(10)
            stop.set()
            for thread in threads:
                thread.join(30)
            broker.start()
            records = read_everything(broker, queue)
            assert records, "iteration %d: the stream is empty after the restart" % iteration
            check(records, ledger, iteration, broker)
            segments = [name for name in os.listdir(next((data_dir / "streams").iterdir())) if name.endswith(".segment")]
            print("stream crash %d: %d confirmed, %d in the stream, %d offsets seen before kills, %d segments"
                  % (iteration, len(ledger.confirmed), len(records), len(ledger.seen), len(segments)))
        assert len(segments) > 1, "the segments never rolled: the test did not cover sealed segments"
    finally:
        broker.kill()
