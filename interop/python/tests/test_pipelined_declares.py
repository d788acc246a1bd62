"""Declares, binds, a publish and a get sent in one write, before any reply (pipelined), as
asynchronous clients do.

Lepus answers the declares and binds of one socket read after one fdatasync of its definitions
log for all of them (docs/storage.md, "Definitions"), holding their replies until then; anything
else (here the publish and the get) first waits for them. What a client sees must not change:
every reply in the order of the requests, the publish routed through the bindings declared just
before it, the get answered with that message. Run against RabbitMQ too (the reference).

Lepus only, with its own broker: a SIGKILL right after the last reply keeps every pipelined
declare and bind (each reply promised its definition was on disk).
"""

import os
import signal
import struct

import pytest

import rawamqp
from conftest import amqp_url_from_env, unique
from test_lifecycle import LepusBroker

QUEUES = 40
EXCHANGE_DECLARE = (40, 10)
EXCHANGE_DECLARE_OK = (40, 11)
EXCHANGE_DELETE = (40, 20)
QUEUE_BIND = (50, 20)
QUEUE_BIND_OK = (50, 21)
QUEUE_DELETE = (50, 40)
TIMEOUT_SECONDS = 30


def exchange_declare(name, passive=False):
    args = (rawamqp.short(0) + rawamqp.shortstr(name) + rawamqp.shortstr("direct")
            + rawamqp.bits(passive, True, False, False, False) + rawamqp.table({}))
    return rawamqp.method_frame(1, EXCHANGE_DECLARE, args)


def queue_declare(name, passive=False):
    args = rawamqp.short(0) + rawamqp.shortstr(name) + rawamqp.bits(passive, True, False, False, False) + rawamqp.table({})
    return rawamqp.method_frame(1, rawamqp.QUEUE_DECLARE, args)


def queue_bind(queue, exchange, key):
    args = rawamqp.short(0) + rawamqp.shortstr(queue) + rawamqp.shortstr(exchange) + rawamqp.shortstr(key) + rawamqp.bits(False) + rawamqp.table({})
    return rawamqp.method_frame(1, QUEUE_BIND, args)


def publish(exchange, key, body):
    args = rawamqp.short(0) + rawamqp.shortstr(exchange) + rawamqp.shortstr(key) + rawamqp.bits(False, False)
    return (rawamqp.method_frame(1, rawamqp.BASIC_PUBLISH, args)
            + rawamqp.content_header_frame(1, 60, len(body), 0x1000, rawamqp.octet(2))
            + rawamqp.body_frame(1, body))


def get(queue):
    return rawamqp.method_frame(1, rawamqp.BASIC_GET, rawamqp.short(0) + rawamqp.shortstr(queue) + rawamqp.bits(True))


def cleanup(url, exchange, queues):
    client = rawamqp.RawClient(url, timeout=TIMEOUT_SECONDS)
    try:
        client.handshake()
        client.open_channel(1)
        for queue in queues:
            client.send(rawamqp.method_frame(1, QUEUE_DELETE, rawamqp.short(0) + rawamqp.shortstr(queue) + rawamqp.bits(False, False, False)))
            client.read_frame()
        client.send(rawamqp.method_frame(1, EXCHANGE_DELETE, rawamqp.short(0) + rawamqp.shortstr(exchange) + rawamqp.bits(False, False)))
        client.read_frame()
    finally:
        client.close()


def pipeline(url, exchange, queues):
    """Sends everything in one write; returns the methods of the replies, in order."""
    client = rawamqp.RawClient(url, timeout=TIMEOUT_SECONDS)
    try:
        client.handshake()
        client.open_channel(1)
        requests = [exchange_declare(exchange)]
        requests += [queue_declare(queue) for queue in queues]
        requests += [queue_bind(queue, exchange, "key-%d" % index) for index, queue in enumerate(queues)]
        requests += [publish(exchange, "key-7", b"routed"), get(queues[7])]
        client.send(b"".join(requests))
        replies = []
        while len(replies) < 2 + 2 * len(queues):
            frame = client.read_frame(TIMEOUT_SECONDS)
            if frame.method in (rawamqp.CHANNEL_CLOSE, rawamqp.CONNECTION_CLOSE):
                pytest.fail("the broker closed: %r" % (frame.close_args(),))
            replies.append(frame)
            if frame.method == rawamqp.BASIC_GET_OK:
                header = client.read_frame(TIMEOUT_SECONDS)
                body = client.read_frame(TIMEOUT_SECONDS)
                assert body.payload == b"routed"
        return replies
    finally:
        client.close()


def check_order(replies, queues):
    methods = [frame.method for frame in replies]
    expected = [EXCHANGE_DECLARE_OK] + [rawamqp.QUEUE_DECLARE_OK] * len(queues) + [QUEUE_BIND_OK] * len(queues) + [rawamqp.BASIC_GET_OK]
    assert methods == expected
    declared = []
    for frame in replies[1:1 + len(queues)]:
        length = frame.payload[4]
        declared.append(frame.payload[5:5 + length].decode())
    assert declared == queues, "declare-oks out of the requests' order"
    get_ok = replies[-1].payload
    # delivery-tag u64, redelivered bit, exchange, routing key, message-count
    assert struct.unpack(">Q", get_ok[4:12])[0] == 1


def test_pipelined_declares_binds_publish_and_get_keep_their_order():
    url = amqp_url_from_env()
    exchange = unique("pipelined-x")
    queues = [unique("pipelined-q") for _ in range(QUEUES)]
    try:
        check_order(pipeline(url, exchange, queues), queues)
    finally:
        cleanup(url, exchange, queues)


@pytest.mark.lepus_only
def test_a_crash_right_after_the_replies_keeps_every_pipelined_declare(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    try:
        exchange = "crash-x"
        queues = ["crash-q-%03d" % index for index in range(QUEUES)]
        check_order(pipeline(broker.url, exchange, queues), queues)
        broker.stop(signal.SIGKILL)
        broker.start()
        client = rawamqp.RawClient(broker.url, timeout=TIMEOUT_SECONDS)
        try:
            client.handshake()
            client.open_channel(1)
            client.send(exchange_declare(exchange, passive=True) + b"".join(queue_declare(queue, passive=True) for queue in queues))
            assert client.read_frame(TIMEOUT_SECONDS).method == EXCHANGE_DECLARE_OK
            counts = []
            for _ in queues:
                frame = client.read_frame(TIMEOUT_SECONDS)
                assert frame.method == rawamqp.QUEUE_DECLARE_OK, "a pipelined declare was lost: %r" % frame
                counts.append(struct.unpack(">I", frame.payload[5 + frame.payload[4]:9 + frame.payload[4]])[0])
            assert counts == [0] * QUEUES, "the get took the one message"
            # The bindings came back too: a publish routed by them reaches its queue.
            client.send(publish(exchange, "key-3", b"after") + get(queues[3]))
            assert client.read_frame(TIMEOUT_SECONDS).method == rawamqp.BASIC_GET_OK
        finally:
            client.close()
    finally:
        broker.stop(signal.SIGKILL)
