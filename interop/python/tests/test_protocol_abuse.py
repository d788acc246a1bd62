"""Protocol abuse under load (issue 15 item 6): abusive clients get RabbitMQ's answer, and while all
of them run, a well-behaved client is served and the broker stays up and under its memory
watermark.

The abusers are in abusive_clients.py. Each answer test runs one kind alone against the broker at
AMQP_URL, so it runs against RabbitMQ 3.10.8 too (scripts/rabbitmq-reference.sh), which is where
the expected answers come from. The load test starts its own Lepus broker (Lepus only: it reads
the broker's /proc entries and sets its watermark) and runs them all at once beside 1,000 idle
connections; scripts/protocol-abuse.sh is the full form (10,000), with the latency figures.
"""

import os
import socket
import time

import pytest

import abusive_clients as abuse
import rawamqp as r
from conftest import connect, safe_close
from test_lifecycle import LepusBroker

# The short form's memory watermark: the broker idles at about 15 MiB and 1,000 idle connections
# cost about 20 MiB (bench/results/connections.md), so this leaves the abusers room to try.
MEMORY_HIGH_WATERMARK_BYTES = 512 * 1024 * 1024
IDLE_CONNECTIONS = 1000


def answered(abuser, abuse_s=0.0):
    """Starts the abuser, lets it abuse for abuse_s, and checks the broker's answer."""
    abuser.start()
    time.sleep(abuse_s)
    abuser.finish()


def test_random_bytes_instead_of_the_protocol_header_get_amqp_0_9_1_and_a_close(amqp_url):
    answered(abuse.RandomBytesClients(amqp_url, 20, after_handshake=False))


def test_random_bytes_after_the_handshake_are_501_frame_error(amqp_url):
    answered(abuse.RandomBytesClients(amqp_url, 10, after_handshake=True))


def test_clients_silent_before_the_handshake_are_closed_at_the_handshake_timeout(amqp_url):
    answered(abuse.SilentClients(amqp_url, 4))


def test_half_a_frame_is_never_enqueued_and_a_client_hanging_after_it_is_dropped_at_its_heartbeat(amqp_url):
    owner = connect(amqp_url)
    try:
        channel = owner.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        answered(abuse.HalfFrameClients(amqp_url, queue, 3, hang=True))
        answered(abuse.HalfFrameClients(amqp_url, queue, 10, hang=False))
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
    finally:
        safe_close(owner)


def test_a_publisher_that_never_reads_its_confirms_gets_every_one_in_order_once_it_reads(amqp_url):
    owner = connect(amqp_url)
    try:
        queue = owner.channel().queue_declare("", exclusive=True, arguments={"x-max-length": 1000}).method.queue
        flood = abuse.ConfirmingPublisher(amqp_url, queue)
        answered(flood, abuse_s=3)
        print("%d publishes confirmed" % flood.published)
        # Well within RabbitMQ's send timeout (15 s): the connection is kept, the confirms wait.
        assert not flood.closed_by_broker
        assert flood.published > 1000, "the flood hardly published: %d" % flood.published
    finally:
        safe_close(owner)


def test_a_slow_consumer_without_prefetch_gets_every_message_in_order_once_it_reads(amqp_url):
    slow = abuse.SlowConsumer(amqp_url, 5000)
    answered(slow, abuse_s=1)
    assert not (slow.closed_by_broker or slow.filler.closed_by_broker)


def test_a_consumer_that_stops_reading_is_closed_after_the_send_timeout_and_its_messages_requeued(amqp_url):
    """RabbitMQ closes a connection whose socket took no bytes for its send timeout (15 s), without
    connection.close, and requeues what its consumers held; so does Lepus."""
    messages, body = 3000, b"x" * 4096  # 12 MB: more than the socket buffers hold
    owner = connect(amqp_url)
    try:
        channel = owner.channel()
        # Not exclusive: the stuck client consumes it from its own connection.
        queue = "abuse-stuck-%d-%d" % (os.getpid(), time.monotonic_ns())
        channel.queue_declare(queue, arguments={"x-expires": 600_000})
        channel.confirm_delivery()
        for _ in range(messages):
            channel.basic_publish("", queue, body)
        stuck = abuse.raw_client(amqp_url)
        stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        stuck.send(r.method_frame(1, r.BASIC_CONSUME, r.short(0) + r.shortstr(queue) + r.shortstr("stuck")
                                        + r.bits(False, False, False, False) + r.table({})))
        # Not read from here on: the broker's writes to it stall once the socket buffers fill.
        stuck.expect_method(r.BASIC_CONSUME_OK)
        assert channel.queue_declare(queue, passive=True).method.consumer_count == 1
        deadline = time.monotonic() + abuse.RABBITMQ_SEND_TIMEOUT_S + abuse.LATE_MARGIN_S + 10
        while True:
            declared = channel.queue_declare(queue, passive=True).method
            if declared.consumer_count == 0 and declared.message_count == messages:
                break
            assert time.monotonic() < deadline, "still held: %d ready, %d consumers" % (declared.message_count, declared.consumer_count)
            owner.sleep(0.5)
        assert stuck.is_closed_by_peer(abuse.FRAME_WAIT_S), "the stuck connection was not closed"
        stuck.close()
        method, _, received = channel.basic_get(queue, auto_ack=True)
        assert received == body and method.redelivered, "the first message, delivered to the stuck consumer, comes back redelivered"
        channel.queue_delete(queue)
    finally:
        safe_close(owner)


class WatermarkedBroker(LepusBroker):
    """A private broker with the short form's memory watermark and no stream listener (whose
    default port another broker may hold)."""

    def extra_port_args(self):
        return super().extra_port_args() + ["--memory-high-watermark-bytes", str(MEMORY_HIGH_WATERMARK_BYTES),
                                            "--stream-port", "0"]


@pytest.mark.lepus_only
def test_abuse_under_load_leaves_the_broker_up_under_its_watermark_and_the_well_behaved_client_served(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = WatermarkedBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    try:
        report = abuse.run_abuse(broker.url, IDLE_CONNECTIONS, quiet_s=4, abused_hold_s=3, pid=broker.proc.pid)
        # Figures for the reader, never asserted: a 2-core machine's scheduling decides them
        # (scripts/protocol-abuse.sh measures them; bench/results/protocol-abuse.md).
        print("well-behaved round trip, ms: quiet %s, under abuse %s; broker peak RSS %d KiB, CPU %s s"
              % (report["quiet_ms"], report["abused_ms"], report["rss_kib_peak"], report["cpu_s"]))
        assert report["failures"] == [], report["failures"]
        assert broker.proc.poll() is None, broker.log_tail()
        assert report["idle_connections"] == IDLE_CONNECTIONS
        assert report["rss_samples"] > 0
        assert report["rss_kib_peak"] * 1024 < MEMORY_HIGH_WATERMARK_BYTES, report
        assert report["quiet_ms"]["round_trips"] > 0 and report["abused_ms"]["round_trips"] > 0, report
        assert "resource alarm raised" not in broker.log_tail(1_000_000)
        # Whether the slow consumer and the flood were stuck past the 15 s send timeout, and so
        # closed, depends on the machine's pace: reported, not asserted (the send timeout has its
        # own test above).
        print({key: value for key, value in report.items() if key.endswith("closed_by_broker")})
    finally:
        broker.kill()
