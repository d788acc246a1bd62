"""Paging (Lepus only): a durable queue's backlog beyond its in-memory window stays in the log and
comes back complete and in order, also across a restart and through a purge. The broker's own
gauge shows the messages held on disk only, and its resident memory stays bounded by the window,
not by the backlog (an all-in-memory queue would give the same order and completeness)."""

import signal
import time

import pika
import pytest

from conftest import safe_close, wait_until
from durability_support import start_broker

pytestmark = pytest.mark.lepus_only

# The queue's in-memory window (docs/storage.md, "paging"): at most 8,192 ready messages or
# 32 MiB of bodies.
WINDOW_MESSAGES = 8192
WINDOW_BODY_BYTES = 32 * 1024 * 1024
# Well past the window's message count.
BACKLOG = 20000
# Past the window's bytes: 192 MiB of bodies, six windows.
LARGE_BODY_BYTES = 64 * 1024
LARGE_BACKLOG = 3072
# The broker's peak resident memory over publishing and draining the large backlog. Measured
# with the window bounded by bytes: about 270 MiB, because each body kept in memory still pins the
# socket read buffer it arrived in (several times its size; a known cost, see the closing note of
# this change and the speed issue), and publishes without confirms are buffered by count, not by
# bytes. With the window unbounded by bytes (the bug this test found) the peak was about 357 MiB.
# The bound catches a queue that holds its whole backlog; the paged gauge above is the sharp check.
RESIDENT_KIB_MAX = 320 * 1024


@pytest.fixture
def paging_broker(tmp_path):
    broker = start_broker(tmp_path)
    yield broker
    broker.kill()


def publish_backlog(broker, queue, transient_every=0, count=BACKLOG, body_bytes=0):
    conn = broker.connect()
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        for index in range(count):
            transient = transient_every and index % transient_every == 0
            channel.basic_publish("", queue, (b"m%05d" % index).ljust(body_bytes, b"."),
                                  pika.BasicProperties(delivery_mode=1 if transient else 2))
        # A confirmed publish after the backlog: everything before it was enqueued.
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"end", pika.BasicProperties(delivery_mode=2))
    finally:
        safe_close(conn)


def consume_all(broker, queue):
    conn = broker.connect()
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=500)
        bodies = []
        for method, _, body in channel.consume(queue, inactivity_timeout=5):
            if method is None:
                break
            bodies.append(body)
            if len(bodies) % 100 == 0 or body == b"end":
                channel.basic_ack(method.delivery_tag, multiple=True)
            if body == b"end":
                break
        channel.cancel()
        return bodies
    finally:
        safe_close(conn)


def message_count(broker, queue):
    conn = broker.connect()
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        safe_close(conn)


def test_backlog_beyond_the_window_comes_back_in_order(paging_broker):
    publish_backlog(paging_broker, "paged")
    assert message_count(paging_broker, "paged") == BACKLOG + 1
    paged = paging_broker.metric("lepus_queue_messages_paged", queue="paged")
    assert paged >= BACKLOG + 1 - WINDOW_MESSAGES, "only %d of %d ready messages paged" % (paged, BACKLOG + 1)
    bodies = consume_all(paging_broker, "paged")
    assert bodies == [b"m%05d" % index for index in range(BACKLOG)] + [b"end"]
    assert message_count(paging_broker, "paged") == 0
    assert paging_broker.metric("lepus_queue_messages_paged", queue="paged") == 0


def test_a_backlog_larger_than_the_window_does_not_stay_in_memory(paging_broker):
    publish_backlog(paging_broker, "paged-large", count=LARGE_BACKLOG, body_bytes=LARGE_BODY_BYTES)
    in_memory_max = WINDOW_BODY_BYTES // LARGE_BODY_BYTES
    paged = paging_broker.metric("lepus_queue_messages_paged", queue="paged-large")
    assert paged >= LARGE_BACKLOG + 1 - in_memory_max, "only %d of %d ready messages paged" % (paged, LARGE_BACKLOG + 1)
    resident_after_publishing_kib = paging_broker.status_kib("VmHWM")
    bodies = consume_all(paging_broker, "paged-large")
    assert [body[:6] for body in bodies] == [b"m%05d" % index for index in range(LARGE_BACKLOG)] + [b"end"]
    peak_kib = paging_broker.status_kib("VmHWM")
    print("paging: %d paged, peak RSS %d KiB after publishing, %d KiB after draining"
          % (paged, resident_after_publishing_kib, peak_kib))
    assert peak_kib <= RESIDENT_KIB_MAX, "peak RSS %d KiB for a %d MiB backlog (%d KiB after publishing)" % (
        peak_kib, LARGE_BACKLOG * LARGE_BODY_BYTES >> 20, resident_after_publishing_kib)


def test_paged_backlog_survives_a_restart_without_its_transient_messages(paging_broker):
    publish_backlog(paging_broker, "paged-restart", transient_every=10)
    paging_broker.stop(signal.SIGTERM)
    paging_broker.start()
    persistent = [b"m%05d" % index for index in range(BACKLOG) if index % 10 != 0]
    assert message_count(paging_broker, "paged-restart") == len(persistent) + 1
    assert consume_all(paging_broker, "paged-restart") == persistent + [b"end"]


def test_purging_a_paged_backlog_settles_it_on_disk(paging_broker):
    publish_backlog(paging_broker, "paged-purge")
    conn = paging_broker.connect()
    try:
        assert conn.channel().queue_purge("paged-purge").method.message_count == BACKLOG + 1
    finally:
        safe_close(conn)
    paging_broker.stop(signal.SIGTERM)
    paging_broker.start()
    assert message_count(paging_broker, "paged-purge") == 0


def test_a_message_ttl_counts_through_a_restart_from_the_publish(tmp_path):
    """A restart does not restart the clock of a message's TTL: the expiry its record keeps was
    fixed at publish (RabbitMQ's rule). Messages whose TTL ran out while the broker was down are
    gone when it is back, before any consumer asks (RabbitMQ's start drops them too); one with
    time left expires when its TTL from the publish runs out, not a TTL after the start."""
    broker = start_broker(tmp_path)
    try:
        conn = broker.connect()
        channel = conn.channel()
        channel.queue_declare("ttl-restart", durable=True, arguments={"x-message-ttl": 6000})
        channel.confirm_delivery()
        for index in range(50):
            channel.basic_publish("", "ttl-restart", b"short%02d" % index,
                                  pika.BasicProperties(delivery_mode=2, expiration="2000"))
        channel.basic_publish("", "ttl-restart", b"long", pika.BasicProperties(delivery_mode=2))
        published = time.monotonic()
        safe_close(conn)
        broker.stop(signal.SIGTERM)
        time.sleep(max(0.0, published + 3 - time.monotonic()))
        broker.start()
        assert wait_until(lambda: message_count(broker, "ttl-restart") == 1, timeout=2, interval=0.1), (
            "%d messages after the restart: the 50 expired while it was down" % message_count(broker, "ttl-restart"))
        assert time.monotonic() - published < 6, "the test was too slow to see the long one before its TTL"
        # Counted from the restart the long one would stay until 9 s after its publish.
        assert wait_until(lambda: message_count(broker, "ttl-restart") == 0, timeout=published + 7.5 - time.monotonic(),
                          interval=0.1), "the message outlived its TTL from the publish"
        assert time.monotonic() - published >= 5.5, "expired before its TTL"
    finally:
        broker.kill()


def test_a_dead_letter_is_routed_by_its_bcc_keys_after_a_restart(tmp_path):
    """The BCC keys a persistent message was published with (taken out of its headers) are kept
    in its log record: after a restart its dead letter is still routed by them, as RabbitMQ's
    message store keeps them among the message's routing keys."""
    broker = start_broker(tmp_path)
    try:
        conn = broker.connect()
        channel = conn.channel()
        channel.exchange_declare("dlx-bcc", "direct", durable=True)
        channel.queue_declare("blind-copies", durable=True)
        channel.queue_bind("blind-copies", "dlx-bcc", "bcc-key")
        channel.queue_declare("bcc-source", durable=True, arguments={"x-dead-letter-exchange": "dlx-bcc"})
        channel.confirm_delivery()
        channel.basic_publish("", "bcc-source", b"blind", pika.BasicProperties(delivery_mode=2, headers={"BCC": ["bcc-key"]}))
        safe_close(conn)
        broker.stop(signal.SIGTERM)
        broker.start()
        conn = broker.connect()
        channel = conn.channel()
        method, properties, body = channel.basic_get("bcc-source")
        assert body == b"blind" and "BCC" not in (properties.headers or {})
        channel.basic_reject(method.delivery_tag, requeue=False)
        assert wait_until(lambda: channel.queue_declare("blind-copies", passive=True).method.message_count == 1, timeout=5), (
            "the dead letter was not routed by the BCC key kept across the restart")
        safe_close(conn)
    finally:
        broker.kill()
