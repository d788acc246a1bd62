"""Page-in racing consumers, basic.get and purge. A durable queue's backlog larger than Lepus's
in-memory window (8,192 messages, docs/storage.md "paging") comes back through reads that run on
a blocking thread while the queue goes on delivering from memory. Every message is delivered
exactly once, in queue order to each consumer; a purge in the middle of a read neither loses
count nor brings purged messages back. These hold for RabbitMQ too, so the first two tests run
against both brokers; the last needs a Lepus restart (all ready messages on disk) and is
Lepus-only."""

import signal
import threading
import time

import pika
import pytest

from conftest import connect, safe_close, unique, wait_until
from durability_support import start_broker

# Publishing and draining 20 MiB takes longer than the suite's default timeout on a loaded machine.
pytestmark = pytest.mark.timeout(240)

# Well past the window, so reads happen while consumers drain it.
BACKLOG = 20000
# Bodies of 1 KiB: a read of half a window is about 4 MiB, long enough to race.
BODY_BYTES = 1024
# How long the consumers may take to drain the backlog.
DRAIN_TIMEOUT_S = 120


def body(index):
    return (b"m%05d" % index).ljust(BODY_BYTES, b".")


def index_of(message_body):
    return int(message_body[1:6])


def publish_backlog(queue, count=BACKLOG, connection_factory=connect):
    """Declares `queue` durable and publishes `count` persistent messages, then waits until the
    queue counts them all (publishing without confirms keeps this fast)."""
    conn = connection_factory()
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        properties = pika.BasicProperties(delivery_mode=2)
        for index in range(count):
            channel.basic_publish("", queue, body(index), properties)
        counted = wait_until(lambda: channel.queue_declare(queue, passive=True).method.message_count == count,
                             timeout=60, conn=conn)
        assert counted, "the queue did not count all %d messages" % count
    finally:
        safe_close(conn)


def delete_queue(queue):
    conn = connect()
    try:
        conn.channel().queue_delete(queue)
    finally:
        safe_close(conn)


class Collector:
    """What every reader of the queue took, and when to stop."""

    def __init__(self, expected):
        self.lock = threading.Lock()
        self.expected = expected
        self.taken = 0
        self.redelivered = 0
        self.errors = []

    def add(self, method):
        with self.lock:
            self.taken += 1
            self.redelivered += 1 if method.redelivered else 0

    def done(self):
        with self.lock:
            return self.taken >= self.expected or bool(self.errors)


def run_consumer(queue, collector, bodies, prefetch):
    conn = None
    try:
        conn = connect()
        channel = conn.channel()
        channel.basic_qos(prefetch_count=prefetch)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for method, _, message_body in channel.consume(queue, inactivity_timeout=0.2):
            if method is not None:
                bodies.append(message_body)
                collector.add(method)
                channel.basic_ack(method.delivery_tag)
            if collector.done() or time.monotonic() > deadline:
                break
        channel.cancel()
    except Exception as error:  # reported by the test, not lost in the thread
        collector.errors.append(error)
    finally:
        safe_close(conn)


def run_getter(queue, collector, bodies):
    conn = None
    try:
        conn = connect()
        channel = conn.channel()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not collector.done() and time.monotonic() < deadline:
            method, _, message_body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                time.sleep(0.01)
                continue
            bodies.append(message_body)
            collector.add(method)
            channel.basic_ack(method.delivery_tag)
    except Exception as error:
        collector.errors.append(error)
    finally:
        safe_close(conn)


def assert_in_queue_order(bodies, who):
    indexes = [index_of(message_body) for message_body in bodies]
    out_of_order = [(a, b) for a, b in zip(indexes, indexes[1:]) if b <= a]
    assert not out_of_order, "%s got messages out of queue order, first: %r" % (who, out_of_order[:3])


def test_several_consumers_and_gets_beside_page_ins_get_each_message_once():
    queue = unique("page-in-race")
    publish_backlog(queue)
    collector = Collector(BACKLOG)
    consumer_bodies = [[], [], []]
    got_bodies = []
    threads = [threading.Thread(target=run_consumer, args=(queue, collector, bodies, prefetch))
               for bodies, prefetch in zip(consumer_bodies, (50, 200, 1))]
    threads.append(threading.Thread(target=run_getter, args=(queue, collector, got_bodies)))
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DRAIN_TIMEOUT_S + 10)
        assert not collector.errors, collector.errors
        everything = [index_of(b) for bodies in consumer_bodies + [got_bodies] for b in bodies]
        duplicates = len(everything) - len(set(everything))
        assert duplicates == 0, "%d messages delivered twice" % duplicates
        missing = sorted(set(range(BACKLOG)) - set(everything))
        assert not missing, "%d messages never delivered, first %r" % (len(missing), missing[:5])
        assert collector.redelivered == 0, "nothing was requeued, yet %d came redelivered" % collector.redelivered
        for number, bodies in enumerate(consumer_bodies):
            assert_in_queue_order(bodies, "consumer %d" % number)
        assert_in_queue_order(got_bodies, "basic.get")
        assert got_bodies, "the getter raced the consumers and took nothing"
    finally:
        delete_queue(queue)


def test_a_purge_beside_a_page_in_neither_loses_count_nor_brings_messages_back():
    queue = unique("page-in-purge")
    publish_backlog(queue)
    consumer_conn = connect()
    other_conn = connect()
    try:
        channel = consumer_conn.channel()
        channel.basic_qos(prefetch_count=200)
        received = []
        purged = None
        after = [b"after-%03d" % index for index in range(100)]
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for method, _, message_body in channel.consume(queue, inactivity_timeout=0.2):
            assert time.monotonic() < deadline, "only %d messages arrived" % len(received)
            if method is not None:
                received.append(message_body)
                channel.basic_ack(method.delivery_tag)
            # Half the window drained: the broker reads the next part of the backlog now.
            if purged is None and len(received) >= 4000:
                other = other_conn.channel()
                purged = other.queue_purge(queue).method.message_count
                for marker in after:
                    other.basic_publish("", queue, marker, pika.BasicProperties(delivery_mode=2))
            if received[-len(after):] == after:
                break
        channel.cancel()
        backlog = [message_body for message_body in received if message_body.startswith(b"m")]
        assert [index_of(b) for b in backlog] == list(range(len(backlog))), "the backlog came out of order or with gaps"
        assert len(backlog) + purged == BACKLOG, (
            "delivered %d + purged %d != %d published" % (len(backlog), purged, BACKLOG))
        assert received[len(backlog):] == after, "purged messages came back after the purge"
        assert other_conn.channel().queue_declare(queue, passive=True).method.message_count == 0
    finally:
        safe_close(consumer_conn)
        safe_close(other_conn)
        delete_queue(queue)


@pytest.fixture
def restarted_broker(tmp_path):
    broker = start_broker(tmp_path)
    yield broker
    broker.kill()


@pytest.mark.lepus_only
def test_basic_get_on_a_queue_whose_ready_messages_are_all_on_disk_answers_with_the_oldest(restarted_broker):
    """After a restart a queue's messages are all on disk: the first basic.get finds none in memory.
    RabbitMQ answers with the oldest message, not get-empty; Lepus waits for the read."""
    queue = "all-paged"
    publish_backlog(queue, connection_factory=restarted_broker.connect)
    restarted_broker.stop(signal.SIGTERM)
    restarted_broker.start()
    conn = restarted_broker.connect()
    try:
        getter = conn.channel()
        purger = conn.channel()
        method, _, first = getter.basic_get(queue, auto_ack=True)
        assert method is not None, "get-empty on a queue of %d messages" % BACKLOG
        assert (index_of(first), method.message_count) == (0, BACKLOG - 1)
        # The get that follows and a purge on another channel: answered in order, nothing lost.
        method, _, second = getter.basic_get(queue, auto_ack=False)
        assert index_of(second) == 1 and method.redelivered is False
        assert purger.queue_purge(queue).method.message_count == BACKLOG - 2
        assert getter.basic_get(queue, auto_ack=True)[0] is None
        getter.basic_ack(method.delivery_tag)
    finally:
        safe_close(conn)
