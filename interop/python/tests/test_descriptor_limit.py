"""A broker that runs out of file descriptors (Lepus only, through pika).

The broker runs under `ulimit -n 64` (soft and hard), and client connections take every descriptor
it has left, until it can accept no more (`accept` fails with EMFILE). Then, as docs/storage.md
("Open files") says:

- declaring a durable queue still works: a declared queue makes no file until its first message;
- a publish that needs a segment file the broker cannot open is refused with basic.nack, and only
  that publish: no connection is closed, and the queues that already hold confirmed messages keep
  them;
- when the cache of open segment files holds a file, it gives it up for the one that is needed, so
  queues take turns and their publishes are confirmed;
- once descriptors are free again, publishes are confirmed again;
- after a crash (SIGKILL) every confirmed message is there, and no nacked one.

Lepus only: it starts its own broker from LEPUS_BIN under a descriptor limit and reads its /proc
entries; RabbitMQ's own file handle cache is not what is under test.
"""

import os
import signal
import time

import pika
import pytest
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from conftest import make_params, safe_close
import test_many_queues
from test_lifecycle import LepusBroker

pytestmark = pytest.mark.lepus_only

DESCRIPTOR_LIMIT = 64
# How long a connection attempt may take before the broker counts as out of descriptors (it
# leaves the socket in the kernel's backlog when accept fails).
CONNECT_TIMEOUT_SECONDS = 2.0
FILLERS_MAX = DESCRIPTOR_LIMIT
CONNECTION_MAX = 4 * DESCRIPTOR_LIMIT


class UnboundedConnectionsBroker(LepusBroker):
    """Without --connection-max the broker would stop accepting at its default for this limit (16
    connections), long before it runs out of descriptors: here the descriptors run out first."""

    def extra_port_args(self):
        return super().extra_port_args() + ["--connection-max", str(CONNECTION_MAX)]


def limited_broker(tmp_path):
    """A broker whose process runs under `ulimit -n DESCRIPTOR_LIMIT` (soft and hard)."""
    return test_many_queues.limited_broker(tmp_path, DESCRIPTOR_LIMIT, UnboundedConnectionsBroker)


def descriptors(broker):
    return len(os.listdir("/proc/%d/fd" % broker.proc.pid))


def confirming_channel(connection):
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def publish(channel, queue, body):
    """True when the broker confirms the persistent publish, False when it nacks it."""
    try:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        return True
    except pika.exceptions.NackError:
        return False


def fill_descriptors(broker):
    """Opens connections until the broker cannot accept another; returns them."""
    fillers = []
    while len(fillers) < FILLERS_MAX:
        try:
            fillers.append(pika.BlockingConnection(make_params(broker.url, socket_timeout=CONNECT_TIMEOUT_SECONDS,
                                                               stack_timeout=CONNECT_TIMEOUT_SECONDS, heartbeat=0)))
        # A broker that cannot accept leaves the handshake unanswered: pika raises its connector's
        # stack timeout (not an AMQPError) for a single address.
        except (pika.exceptions.AMQPError, AMQPConnectorException):
            break
    assert len(fillers) < FILLERS_MAX, "the broker kept accepting past its descriptor limit"
    assert descriptors(broker) >= DESCRIPTOR_LIMIT - 2, "filled at %d descriptors of %d" % (descriptors(broker), DESCRIPTOR_LIMIT)
    return fillers


def drain(connection, queue):
    channel = connection.channel()
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def test_out_of_descriptors_a_publish_is_nacked_and_nothing_else_is_touched(tmp_path):
    broker = limited_broker(tmp_path)
    broker.start()
    connections = []
    try:
        keeper = broker.connect()
        connections.append(keeper)
        keeper_channel = confirming_channel(keeper)
        keeper_channel.queue_declare("fd-keep", durable=True)
        assert publish(keeper_channel, "fd-keep", b"kept-1")
        publisher = broker.connect()
        connections.append(publisher)
        channel = confirming_channel(publisher)
        fillers = fill_descriptors(broker)
        connections.extend(fillers)

        # Out of descriptors. A declare needs none: it is answered.
        channel.queue_declare("fd-new", durable=True)
        channel.queue_declare("fd-other", durable=True)
        # The cache holds fd-keep's segment: it gives it up for fd-new's, so that publish is
        # confirmed; then fd-keep's publish takes a file back, and fd-other's in turn.
        assert publish(channel, "fd-new", b"new-1"), "the cache's file was not handed over"
        assert publish(keeper_channel, "fd-keep", b"kept-2"), "queues did not take turns"
        assert publish(channel, "fd-other", b"other-1")
        assert publish(channel, "fd-new", b"new-2")
        assert descriptors(broker) <= DESCRIPTOR_LIMIT
        # No connection was closed: the publisher, the keeper and every filler are open.
        assert all(connection.is_open for connection in connections)
        channel.queue_declare("fd-keep", passive=True)
        for connection in connections:
            safe_close(connection)
        connections = []

        # A crash: every confirmed message is on disk, no nacked one came back.
        broker.stop(signal.SIGKILL)
        broker.start()
        after = broker.connect()
        connections.append(after)
        assert drain(after, "fd-keep") == [b"kept-1", b"kept-2"]
        assert drain(after, "fd-new") == [b"new-1", b"new-2"]
        assert drain(after, "fd-other") == [b"other-1"]
    finally:
        for connection in connections:
            safe_close(connection)
        broker.stop(signal.SIGKILL)


def test_the_first_segment_file_a_full_broker_cannot_open_nacks_only_its_publish(tmp_path):
    broker = limited_broker(tmp_path)
    broker.start()
    connections = []
    try:
        publisher = broker.connect()
        bystander = broker.connect()
        connections += [publisher, bystander]
        bystander_channel = bystander.channel()
        bystander_channel.queue_declare("fd-bystander", durable=False)
        bystander_channel.basic_publish("", "fd-bystander", b"in memory")
        channel = confirming_channel(publisher)
        fillers = fill_descriptors(broker)
        connections.extend(fillers)
        # No segment file is open anywhere, so the cache has nothing to give up: the publish to a
        # new durable queue cannot get its file and is nacked, with the reason in the log.
        channel.queue_declare("fd-first", durable=True)
        started = time.monotonic()
        assert not publish(channel, "fd-first", b"refused"), "a publish whose file could not be opened was confirmed"
        assert time.monotonic() - started < 10
        assert "Too many open files" in broker.log_tail(200000)
        # Only that publish: the connection and channel go on, the bystander too.
        assert publisher.is_open and channel.is_open and bystander.is_open
        assert bystander_channel.queue_declare("fd-bystander", passive=True).method.message_count == 1
        for filler in fillers[:8]:
            filler.close()
        assert publish(channel, "fd-first", b"accepted"), "no confirm once descriptors were free"
        for connection in connections:
            safe_close(connection)
        connections = []
        broker.stop(signal.SIGKILL)
        broker.start()
        after = broker.connect()
        connections.append(after)
        # The nacked publish may be in the log (it was not confirmed, so either is allowed); the
        # confirmed one must be.
        assert b"accepted" in drain(after, "fd-first")
    finally:
        for connection in connections:
            safe_close(connection)
        broker.stop(signal.SIGKILL)
