"""The `redelivered` flag after a restart (Lepus only), as docs/storage.md ("Recovery") says:
after a graceful shutdown (SIGTERM) the delivered markers decide, so a message never delivered
comes back with redelivered=false and one delivered before the stop (unacked, or rejected back
into the queue) with redelivered=true; after a crash (SIGKILL) every recovered message is flagged
redelivered=true, as any of them may have been delivered."""

import signal

import pika
import pytest

from conftest import safe_close
from durability_support import start_broker

pytestmark = pytest.mark.lepus_only

MESSAGES = 30
DELIVERED_UNACKED = {"m01", "m02"}
REJECTED_REQUEUED = "m03"
ACKED = "m00"


@pytest.fixture
def broker(tmp_path):
    broker = start_broker(tmp_path)
    yield broker
    broker.kill()


def publish_and_deliver_some(broker):
    """Publishes m00..m29 with confirms; acks m00, leaves m01 and m02 unacked and rejects m03 back
    into the queue. Returns the open connection (its unacked deliveries must outlive the stop)."""
    conn = broker.connect()
    channel = conn.channel()
    channel.queue_declare("flags", durable=True)
    channel.confirm_delivery()
    for index in range(MESSAGES):
        channel.basic_publish("", "flags", b"m%02d" % index, pika.BasicProperties(delivery_mode=2))
    consumer = conn.channel()
    tags = {}
    for _ in range(4):
        method, _, body = consumer.basic_get("flags", auto_ack=False)
        tags[body.decode()] = method.delivery_tag
    assert sorted(tags) == ["m00", "m01", "m02", "m03"]
    consumer.basic_ack(tags[ACKED])
    consumer.basic_reject(tags[REJECTED_REQUEUED], requeue=True)
    # A synchronous round trip: the ack and the reject were handled before the stop.
    consumer.queue_declare("flags", passive=True)
    return conn


def recovered_flags(broker):
    conn = broker.connect()
    try:
        channel = conn.channel()
        flags = {}
        for _ in range(MESSAGES + 1):
            method, _, body = channel.basic_get("flags", auto_ack=True)
            if method is None:
                return flags
            flags[body.decode()] = method.redelivered
        pytest.fail("more messages than were published")
    finally:
        safe_close(conn)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_redelivered_flags_after_a_restart(broker, stop):
    conn = publish_and_deliver_some(broker)
    broker.stop(stop)
    safe_close(conn)
    broker.start()
    flags = recovered_flags(broker)
    if stop == signal.SIGKILL:
        # The ack's settle record is written by the next group commit, which the kill may have
        # cut off: at-least-once lets the acked message come back.
        flags.pop(ACKED, None)
    assert sorted(flags) == ["m%02d" % index for index in range(1, MESSAGES)], broker.log_tail()
    if stop == signal.SIGKILL:
        expected = {body: True for body in flags}
    else:
        delivered = DELIVERED_UNACKED | {REJECTED_REQUEUED}
        expected = {body: body in delivered for body in flags}
    wrong = {body: flag for body, flag in flags.items() if flag != expected[body]}
    assert not wrong, "wrong redelivered flags after %s: %s" % (signal.Signals(stop).name, wrong)
