"""consumer_timeout through pika. RabbitMQ 3.10.8 (measured with consumer_timeout = 2000 ms)
closes the channel of a delivery left unacked too long with 406 and this text, and requeues its
messages; it checks on every channel tick (channel_tick_interval, a minute by default, so the close
came 60 s after the delivery; the test shortens the tick to a second, as RabbitMQ's own
consumer_timeout tests do, and puts it back afterwards). Lepus does the same
by default (checked every quarter of the timeout, at least every second, each delivery timed from
the check before it), and with
`consumer_timeout_mode = cancel` cancels only the consumer holding the delivery (Lepus-only).

Against RabbitMQ the timeout is set on the node with `rabbitmqctl eval` ($RABBITMQCTL) and put back
afterwards; against Lepus each test starts its own broker ($LEPUS_BIN) with the setting.
"""

import os
import shlex
import signal
import subprocess
import time

import pytest

from conftest import broker_is_lepus, connect, safe_close, unique, wait_until

CONSUMER_TIMEOUT_MS = 2000
TIMEOUT_TEXT = ("PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: %d ms. "
                "This timeout value can be configured, see consumers doc guide to learn more" % CONSUMER_TIMEOUT_MS)


def rabbitmq_set_consumer_timeout(milliseconds, channel_tick_milliseconds):
    """consumer_timeout, and how often a channel checks it (read when a channel opens)."""
    command = os.environ.get("RABBITMQCTL")
    if not command:
        pytest.fail("set RABBITMQCTL to reach the RabbitMQ node (the test sets its consumer_timeout)")
    expression = ("application:set_env(rabbit, consumer_timeout, %d), application:set_env(rabbit, channel_tick_interval, %d)."
                  % (milliseconds, channel_tick_milliseconds))
    subprocess.run(shlex.split(command) + ["eval", expression], check=True, capture_output=True, timeout=60)


def start_lepus(tmp_path, *flags):
    from test_lifecycle import LepusBroker

    class ConfiguredBroker(LepusBroker):
        def extra_port_args(self):
            self.extra_args = super().extra_port_args() + list(flags)
            return self.extra_args

    data_dir = tmp_path / "data"
    data_dir.mkdir(exist_ok=True)
    broker = ConfiguredBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    return broker


@pytest.fixture
def timeout_broker_url(tmp_path):
    """The broker under test with consumer_timeout = 2 s, RabbitMQ's close mode."""
    if broker_is_lepus():
        if not os.environ.get("LEPUS_BIN"):
            pytest.fail("the broker is Lepus: set LEPUS_BIN so the test can start one with --consumer-timeout-ms")
        broker = start_lepus(tmp_path, "--consumer-timeout-ms", str(CONSUMER_TIMEOUT_MS))
        try:
            yield broker.url
        finally:
            broker.stop(signal.SIGTERM)
    else:
        rabbitmq_set_consumer_timeout(CONSUMER_TIMEOUT_MS, 1000)
        try:
            yield os.environ["AMQP_URL"]
        finally:
            rabbitmq_set_consumer_timeout(1800000, 60000)


@pytest.mark.timeout(150)
def test_an_unacked_delivery_closes_its_channel_with_406_and_is_requeued(timeout_broker_url):
    conn = connect(timeout_broker_url)
    try:
        channel = conn.channel()
        closed = []
        channel._impl.add_on_close_callback(lambda _channel, reason: closed.append(reason))
        queue = unique("consumer-timeout")
        channel.queue_declare(queue)
        channel.basic_publish("", queue, b"slow")
        got = []
        channel.basic_consume(queue, lambda _channel, method, properties, body: got.append(time.monotonic()))
        # RabbitMQ checks on every channel tick (a minute by default: the wait allows for it).
        wait_until(lambda: closed, timeout=100, conn=conn)
        assert got, "the message was never delivered"
        assert closed, "the channel was not closed within 100 s"
        reason = closed[0]
        assert (reason.reply_code, reason.reply_text) == (406, TIMEOUT_TEXT)
        assert time.monotonic() - got[0] >= CONSUMER_TIMEOUT_MS / 1000.0 * 0.95, "closed before the timeout"
        other = conn.channel()
        wait_until(lambda: other.queue_declare(queue, passive=True).method.message_count == 1, timeout=5)
        assert other.queue_declare(queue, passive=True).method.message_count == 1, "the message was not requeued"
        other.queue_delete(queue)
    finally:
        safe_close(conn)


@pytest.mark.timeout(150)
def test_a_timeout_counts_from_its_delivery_not_from_when_it_became_the_oldest(timeout_broker_url):
    """Two deliveries together; the first acked 1.5 s later. The second's timeout still runs
    from its own delivery: the channel closes 2 s after it, within one check (a second on both
    brokers here), not 2 s after the first's ack (Lepus timed the oldest unacked delivery from
    the check that first saw it oldest, and its first check came up to two periods after the
    connection opened: 4 to 5 s here)."""
    conn = connect(timeout_broker_url)
    try:
        channel = conn.channel()
        closed = []
        channel._impl.add_on_close_callback(lambda _channel, reason: closed.append((time.monotonic(), reason)))
        queue = unique("consumer-timeout-oldest")
        channel.queue_declare(queue)
        channel.basic_publish("", queue, b"first")
        channel.basic_publish("", queue, b"second")
        got = []
        channel.basic_consume(queue, lambda _channel, method, properties, body: got.append((time.monotonic(), method.delivery_tag)))
        wait_until(lambda: len(got) == 2, timeout=5, conn=conn)
        assert len(got) == 2, "the messages were not delivered"
        wait_until(lambda: time.monotonic() >= got[0][0] + 1.5 or closed, timeout=3, conn=conn)
        assert not closed, "closed before the timeout"
        channel.basic_ack(got[0][1])
        wait_until(lambda: closed, timeout=100, conn=conn)
        assert closed, "the channel was not closed within 100 s"
        closed_at, reason = closed[0]
        assert (reason.reply_code, reason.reply_text) == (406, TIMEOUT_TEXT)
        elapsed = closed_at - got[1][0]
        assert elapsed >= CONSUMER_TIMEOUT_MS / 1000.0 * 0.95, "closed %.2f s after the delivery, before the timeout" % elapsed
        assert elapsed <= CONSUMER_TIMEOUT_MS / 1000.0 + 1.4, "closed %.2f s after the delivery: over a check late" % elapsed
        other = conn.channel()
        other.queue_delete(queue)
    finally:
        safe_close(conn)


@pytest.mark.lepus_only
def test_acks_in_time_keep_the_channel_open(tmp_path):
    broker = start_lepus(tmp_path, "--consumer-timeout-ms", str(CONSUMER_TIMEOUT_MS))
    conn = broker.connect()
    try:
        channel = conn.channel()
        queue = unique("consumer-timeout-ok")
        channel.queue_declare(queue)
        channel.basic_qos(prefetch_count=1)
        acked = []

        def on_message(ch, method, properties, body):
            acked.append(body)
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(queue, on_message)
        end = time.monotonic() + 3 * CONSUMER_TIMEOUT_MS / 1000.0
        while time.monotonic() < end:
            channel.basic_publish("", queue, b"quick")
            conn.process_data_events(time_limit=0.3)
        assert channel.is_open and len(acked) > 5
    finally:
        safe_close(conn)
        broker.stop(signal.SIGTERM)


@pytest.mark.lepus_only
def test_cancel_mode_cancels_only_the_consumer_holding_the_late_delivery(tmp_path):
    broker = start_lepus(tmp_path, "--consumer-timeout-ms", str(CONSUMER_TIMEOUT_MS), "--consumer-timeout-mode", "cancel")
    conn = broker.connect()
    try:
        channel = conn.channel()
        slow_queue, quick_queue = unique("consumer-timeout-slow"), unique("consumer-timeout-quick")
        channel.queue_declare(slow_queue)
        channel.queue_declare(quick_queue)
        slow_deliveries, quick_bodies, cancelled = [], [], []
        channel.basic_publish("", slow_queue, b"slow")
        slow_tag = channel.basic_consume(slow_queue, lambda ch, method, properties, body: slow_deliveries.append(method.delivery_tag))
        channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))

        def on_quick(ch, method, properties, body):
            quick_bodies.append(body)
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(quick_queue, on_quick)
        wait_until(lambda: cancelled, timeout=10, conn=conn)
        assert cancelled == [slow_tag], "the slow consumer was not cancelled with basic.cancel"
        assert channel.is_open, "cancel mode closed the channel"
        # The other consumer keeps receiving; the late delivery may still be acked.
        channel.basic_publish("", quick_queue, b"after")
        wait_until(lambda: quick_bodies, timeout=5, conn=conn)
        assert quick_bodies == [b"after"]
        channel.basic_ack(slow_deliveries[0])
        channel.queue_declare(slow_queue, passive=True)
        assert channel.is_open
        assert channel.queue_declare(slow_queue, passive=True).method.message_count == 0
    finally:
        safe_close(conn)
        broker.stop(signal.SIGTERM)


def closed_by_timeout(conn, channel, queue, timeout_s):
    """Consumes one message without acking; returns (seconds until the channel closed, reason)."""
    closed = []
    channel._impl.add_on_close_callback(lambda _channel, reason: closed.append(reason))
    channel.basic_publish("", queue, b"slow")
    delivered = []
    channel.basic_consume(queue, lambda _channel, method, properties, body: delivered.append(time.monotonic()))
    wait_until(lambda: closed, timeout=timeout_s, conn=conn)
    assert delivered and closed, "the channel was not closed within %.0f s" % timeout_s
    return closed[0].reply_text, time.monotonic() - delivered[0]


QUEUE_TIMEOUT_MS = 1500
QUEUE_TIMEOUT_TEXT = TIMEOUT_TEXT.replace("%d ms" % CONSUMER_TIMEOUT_MS, "%d ms" % QUEUE_TIMEOUT_MS)


@pytest.mark.lepus_only
def test_x_consumer_timeout_on_a_queue_wins_over_the_node_setting(tmp_path):
    """Lepus-only: RabbitMQ 3.10.8 ignores x-consumer-timeout (later versions honour it)."""
    broker = start_lepus(tmp_path, "--consumer-timeout-ms", "8000")
    conn = broker.connect()
    try:
        channel = conn.channel()
        queue = unique("consumer-timeout-argument")
        channel.queue_declare(queue, arguments={"x-consumer-timeout": QUEUE_TIMEOUT_MS})
        text, waited_s = closed_by_timeout(conn, channel, queue, 7.0)
        assert text == QUEUE_TIMEOUT_TEXT
        assert QUEUE_TIMEOUT_MS / 1000.0 * 0.95 <= waited_s < 7.0
    finally:
        safe_close(conn)
        broker.stop(signal.SIGTERM)


@pytest.mark.lepus_only
def test_the_consumer_timeout_policy_key_applies_to_its_queues(tmp_path):
    import json
    import urllib.request
    import base64
    broker = start_lepus(tmp_path, "--consumer-timeout-ms", "8000")
    conn = broker.connect()
    try:
        http_port = int(broker.extra_args[broker.extra_args.index("--http-port") + 1])
        prefix = unique("consumer-timeout-policy")
        request = urllib.request.Request(
            "http://127.0.0.1:%d/api/policies/%%2F/%s" % (http_port, prefix), method="PUT",
            data=json.dumps({"pattern": "^" + prefix, "definition": {"consumer-timeout": QUEUE_TIMEOUT_MS},
                             "apply-to": "queues"}).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        urllib.request.urlopen(request, timeout=10).close()
        channel = conn.channel()
        queue = prefix + "-q"
        channel.queue_declare(queue)
        text, waited_s = closed_by_timeout(conn, channel, queue, 7.0)
        assert text == QUEUE_TIMEOUT_TEXT
        assert waited_s < 7.0
    finally:
        safe_close(conn)
        broker.stop(signal.SIGTERM)
