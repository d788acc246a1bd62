"""Quorum queues across restarts (Lepus only: these tests start and kill their own broker).

- kill -9 under confirmed load: publishers with confirms and an acking consumer run on a quorum
  queue while the broker is killed at a random moment, four times; after each restart a ledger
  check proves every confirmed message that was not acked is still there (a confirm of a quorum
  queue means the enqueue is in the shard's Raft log, fdatasynced), and nothing appears that no
  publisher sent.
- A graceful stop and a kill -9 keep the queue, its messages, a policy's limit and its
  definition; messages delivered and not acked before come back redelivered (the consumers of the
  node's previous run are released when it starts).
"""

import os
import random
import signal
import threading
import time

import pika
import pytest

from conftest import make_params, safe_close
from test_crash import Ledger, consumer, publisher
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

ITERATIONS = 4
PUBLISHERS = 3
QUEUE = "crash-ledger"
RUN_SECONDS_MIN = 0.3
RUN_SECONDS_MAX = 1.5
DRAIN_SECONDS_MAX = 30.0
QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def broker(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    lepus = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    lepus.start()
    yield lepus
    lepus.kill()


def drain(broker, queue):
    """Every message of `queue` after a restart (body, redelivered), acked as it is read. The first
    basic.get may wait for the shard to elect itself and apply its log."""
    conn = broker.connect()
    try:
        channel = conn.channel()
        messages = []
        deadline = time.monotonic() + DRAIN_SECONDS_MAX
        while time.monotonic() < deadline:
            method, _, body = channel.basic_get(queue)
            if method is None:
                return messages
            channel.basic_ack(method.delivery_tag)
            messages.append((body.decode(), method.redelivered))
        pytest.fail("draining the queue did not finish in %.0fs" % DRAIN_SECONDS_MAX)
    finally:
        safe_close(conn)


def test_kill_9_during_confirmed_publishing_loses_nothing_confirmed(broker):
    conn = broker.connect()
    conn.channel().queue_declare(QUEUE, durable=True, arguments=QUORUM)
    safe_close(conn)
    rng = random.Random()
    total_confirmed = 0
    for iteration in range(ITERATIONS):
        ledger = Ledger()
        stop = threading.Event()
        threads = [threading.Thread(target=publisher, args=(broker.url, iteration, index, ledger, stop)) for index in range(PUBLISHERS)]
        threads.append(threading.Thread(target=consumer, args=(broker.url, ledger, stop)))
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(RUN_SECONDS_MIN, RUN_SECONDS_MAX))
        broker.proc.send_signal(signal.SIGKILL)
        broker.proc.wait(10)
        stop.set()
        for thread in threads:
            thread.join(15)
            assert not thread.is_alive(), "a client thread hung after the broker died"
        broker.start()
        recovered = [body for body, _ in drain(broker, QUEUE)]
        current = {body for body in recovered if body.startswith("i%d-" % iteration)}
        with ledger.lock:
            missing = ledger.confirmed - ledger.acked - current
            unknown = current - ledger.confirmed
            total_confirmed += len(ledger.confirmed)
            attempted = set(ledger.attempted)
        assert not missing, "iteration %d: %d confirmed, unacked messages lost, e.g. %s\n%s" % (
            iteration, len(missing), sorted(missing)[:5], broker.log_tail())
        assert unknown <= attempted, "bodies no publisher sent: %s" % sorted(unknown - attempted)[:5]
        assert len(recovered) == len(set(recovered)), "a message came back twice from one queue"
    assert total_confirmed > 0, "no publish was confirmed in any iteration"
    print("quorum crash test: %d confirmed over %d kills" % (total_confirmed, ITERATIONS))


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL])
def test_a_restart_keeps_the_queue_and_gives_back_what_was_unacked_redelivered(broker, stop_signal):
    queue = "quorum-restart"
    conn = broker.connect()
    channel = conn.channel()
    channel.queue_declare(queue, durable=True, arguments=dict(QUORUM, **{"x-max-length": 5}))
    channel.confirm_delivery()
    for index in range(7):
        channel.basic_publish("", queue, b"m%d" % index, pika.BasicProperties(delivery_mode=2))
    held = conn.channel()
    held.basic_qos(prefetch_count=2)
    seen = []
    held.basic_consume(queue, lambda chan, method, properties, body: seen.append(body))
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert seen == [b"m2", b"m3"], "x-max-length 5 dropped the two oldest"
    broker.stop(stop_signal)
    broker.start()
    conn = broker.connect()
    try:
        declared = conn.channel().queue_declare(queue, durable=True, arguments=dict(QUORUM, **{"x-max-length": 5}))
        assert declared.method.message_count == 5
    finally:
        safe_close(conn)
    messages = drain(broker, queue)
    assert messages == [("m2", True), ("m3", True), ("m4", False), ("m5", False), ("m6", False)], messages
