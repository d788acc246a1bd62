"""Defects that broke real client libraries other than pika, checked through those libraries.

Each case was found by using the library as its users do (aio-pika's robust consumers, py-amqp
under kombu and Celery, rabbitpy with large messages, refused logins), and each
passes against RabbitMQ 3.10.8, which is what the expectations are taken from.
"""

import asyncio
import socket
import struct
import time
from urllib.parse import urlparse

import aio_pika
import amqp
import kombu
import pytest
import rabbitpy

import rawamqp as r
from conftest import amqp_url_from_env, connect, safe_close, unique

LARGE_MESSAGE_BYTES = 300_000


def py_amqp_connection(url, **overrides):
    parts = urlparse(url)
    connection = amqp.Connection(
        "%s:%d" % (parts.hostname, parts.port or 5672),
        userid=overrides.get("userid", parts.username or "guest"),
        password=overrides.get("password", parts.password or "guest"),
        connect_timeout=5,
    )
    connection.connect()
    return connection


def rabbitpy_url(url, user=None, password=None):
    parts = urlparse(url)
    credentials = "%s:%s" % (user or parts.username or "guest", password or parts.password or "guest")
    return "amqp://%s@%s:%d/%%2F" % (credentials, parts.hostname, parts.port or 5672)


def drain_until(connection, predicate, timeout=5.0):
    """Services a py-amqp connection until predicate() holds; returns its last value."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        try:
            connection.drain_events(timeout=0.1)
        except socket.timeout:
            pass
    return predicate()


# ------------------------------------------------------------ consumer tags after a broker cancel

def test_aio_pika_consumer_tag_is_free_again_after_the_broker_cancelled_it(amqp_url):
    """aio-pika's robust connections restore a consumer with its old tag after the broker
    cancelled it; that basic.consume must not be refused as a reused tag (530)."""

    async def scenario():
        connection = await aio_pika.connect(amqp_url, timeout=5)
        try:
            channel = await connection.channel()
            other = await connection.channel()
            name = unique("aio-recover")
            queue = await channel.declare_queue(name, auto_delete=False)
            received = asyncio.Queue()
            await queue.consume(received.put, consumer_tag="recovering", no_ack=True)
            await other.queue_delete(name)
            # The broker's basic.cancel arrives on the consuming channel; aiormq drops the consumer.
            for _ in range(100):
                if "recovering" not in channel.channel.consumers:
                    break
                await asyncio.sleep(0.05)
            assert "recovering" not in channel.channel.consumers, "no basic.cancel from the broker"
            queue = await channel.declare_queue(name, auto_delete=False)
            await queue.consume(received.put, consumer_tag="recovering", no_ack=True)
            await channel.default_exchange.publish(aio_pika.Message(b"after recovery"), routing_key=name)
            message = await asyncio.wait_for(received.get(), 5)
            assert message.body == b"after recovery"
            assert not channel.is_closed
            await queue.delete(if_unused=False)
        finally:
            await connection.close()

    asyncio.run(scenario())


def test_exclusive_queue_name_taken_by_another_connection_survives_the_first_ones_close(amqp_url):
    """An exclusive auto-delete queue deleted by its last consumer's cancel may be declared again
    by another connection; closing the first connection must not delete the second's queue."""
    first, second = connect(amqp_url), connect(amqp_url)
    try:
        name = unique("excl-reuse")
        channel = first.channel()
        channel.queue_declare(name, exclusive=True, auto_delete=True)
        tag = channel.basic_consume(name, lambda *args: None, auto_ack=True)
        channel.basic_cancel(tag)
        second_channel = second.channel()
        second_channel.queue_declare(name, exclusive=True)
        first.close()
        assert second_channel.queue_declare(name, passive=True).method.queue == name
    finally:
        safe_close(first)
        safe_close(second)


# ------------------------------------------------------------ queue.delete on the consuming channel

def test_py_amqp_queue_delete_answers_before_its_own_consumer_is_cancelled(amqp_url):
    """py-amqp (kombu, Celery) raises ConsumerCancelled for a basic.cancel that arrives while it
    waits for delete-ok; RabbitMQ answers the delete first and cancels the consumer after."""
    connection = py_amqp_connection(amqp_url)
    try:
        channel = connection.channel()
        name = unique("pyamqp-del")
        channel.queue_declare(name, auto_delete=False)
        events = []
        channel.basic_consume(name, consumer_tag="own", callback=lambda message: None,
                              on_cancel=lambda tag: events.append(("cancel", tag)))
        channel.queue_delete(name)
        events.append("delete-ok")
        assert drain_until(connection, lambda: len(events) == 2), events
        assert events == ["delete-ok", ("cancel", "own")]
        assert channel.is_open
    finally:
        connection.collect()


def test_kombu_deletes_a_queue_it_consumes_from_without_consumer_cancelled(amqp_url):
    with kombu.Connection(amqp_url.replace("amqp://", "pyamqp://"), connect_timeout=5) as connection:
        channel = connection.channel()
        queue = kombu.Queue(unique("kombu-del"), exchange=kombu.Exchange("amq.direct", type="direct"),
                            routing_key="kombu-del", auto_delete=False)
        bound = queue(channel)
        bound.declare()
        bound.consume(consumer_tag="kombu-own", callback=lambda message: None)
        # Without an on_cancel callback py-amqp raises ConsumerCancelled for a basic.cancel read
        # while it waits for delete-ok; RabbitMQ sends delete-ok first.
        bound.delete()
        assert channel.is_open


# ------------------------------------------------------------ frames of exactly frame_max payload

def test_rabbitpy_publishes_and_gets_a_300_kb_message(amqp_url):
    """rabbitpy splits a body into frames of frame_max payload bytes (8 over the spec's size),
    which RabbitMQ accepts."""
    body = bytes(range(256)) * (LARGE_MESSAGE_BYTES // 256)
    with rabbitpy.Connection(rabbitpy_url(amqp_url)) as connection:
        with connection.channel() as channel:
            name = unique("rabbitpy-big")
            queue = rabbitpy.Queue(channel, name, auto_delete=False)
            queue.declare()
            try:
                rabbitpy.Message(channel, body).publish("", name)
                message = None
                for _ in range(100):
                    message = queue.get()
                    if message is not None:
                        break
                    time.sleep(0.05)
                assert message is not None and message.body == body
                message.ack()
            finally:
                queue.delete()


def test_raw_body_frame_one_byte_over_frame_max_payload_is_501(raw_client):
    c = raw_client
    c.open_channel(1)
    payload_bytes = c.frame_max + 1
    c.send(r.method_frame(1, r.BASIC_PUBLISH, c.publish_args("", "nowhere")))
    c.send(r.content_header_frame(1, 60, payload_bytes))
    c.send(r.body_frame(1, b"x" * payload_bytes))
    _, (code, text, _, _) = c.expect_close()
    assert code == 501
    assert "frame_too_large,%d,%d" % (payload_bytes, c.frame_max - 8) in text


@pytest.fixture
def raw_client(amqp_url):
    client = r.RawClient(amqp_url)
    client.handshake()
    yield client
    client.close()


# ------------------------------------------------------------ unbind naming what does not exist

def test_py_amqp_unbind_naming_missing_exchanges_and_queues_is_ok(amqp_url):
    connection = py_amqp_connection(amqp_url)
    try:
        channel = connection.channel()
        name = unique("unbind")
        channel.queue_declare(name, exclusive=True)
        missing_exchange, missing_queue = unique("no-such-x"), unique("no-such-q")
        channel.queue_unbind(name, missing_exchange, "k")
        channel.queue_unbind(missing_queue, "amq.direct", "k")
        channel.exchange_unbind("amq.direct", missing_exchange, "k")
        channel.exchange_unbind(missing_exchange, "amq.direct", "k")
        assert channel.is_open
    finally:
        connection.collect()


# ------------------------------------------------------------ refused logins

REFUSED_TEXT = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN."


def test_rabbitpy_refused_login_is_access_refused_every_time(amqp_url):
    """Past the first failures the broker may delay its answer, but the answer stays
    ACCESS_REFUSED, never a reset socket."""
    for attempt in range(7):
        with pytest.raises(rabbitpy.exceptions.AMQPAccessRefused) as refused:
            with rabbitpy.Connection(rabbitpy_url(amqp_url, "nobody", "wrong-%d" % attempt)):
                pass
        assert REFUSED_TEXT in str(refused.value)


def test_aio_pika_and_py_amqp_refused_logins_are_access_refused(amqp_url):
    with pytest.raises(amqp.exceptions.AccessRefused):
        py_amqp_connection(amqp_url, userid="nobody", password="wrong")

    async def aio():
        url = amqp_url.replace("guest:guest@", "nobody:wrong@")
        await aio_pika.connect(url, timeout=10)

    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        asyncio.run(aio())


def refused_login_start(amqp_url, capabilities):
    c = r.RawClient(amqp_url.replace("guest:guest@", "nobody:wrong@"), timeout=10)
    c.send(r.PROTOCOL_HEADER)
    c.expect_method(r.CONNECTION_START)
    properties = r.table({"product": "lepus-interop", "capabilities": capabilities})
    response = b"\x00nobody\x00wrong"
    c.send(r.method_frame(0, r.CONNECTION_START_OK,
                          properties + r.shortstr("PLAIN") + r.longstr(response) + r.shortstr("en_US")))
    return c


def socket_end_within(c, timeout):
    """'eof' or 'reset', whichever ends the socket within the timeout, else 'open'; frames read
    on the way are discarded."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "open"
        c.sock.settimeout(remaining)
        try:
            if not c.sock.recv(65536):
                return "eof"
        except socket.timeout:
            return "open"
        except ConnectionResetError:
            return "reset"


def test_refused_login_socket_stays_open_until_the_client_answers_the_close(amqp_url):
    """After the 403 connection.close the broker keeps the socket until the client's close-ok
    (RabbitMQ: up to 3 s). Closing at once races the client: rabbitpy, whose I/O thread sees the
    closed socket before its other thread reads the 403, reported a reset instead."""
    c = refused_login_start(amqp_url, {"authentication_failure_close": True})
    try:
        _, (code, _, _, _) = c.expect_close()
        assert code == 403
        assert socket_end_within(c, 1.0) == "open"
        c.send_close_ok()
        assert socket_end_within(c, 5.0) in ("eof", "reset")
    finally:
        c.close()


def test_refused_login_without_the_capability_gets_no_frame_and_a_socket_closed_later(amqp_url):
    """A client that did not ask for authentication_failure_close gets no frame; the socket is
    closed after RabbitMQ's delay (3 s), not at once."""
    c = refused_login_start(amqp_url, {})
    try:
        c.sock.settimeout(1.0)
        with pytest.raises(socket.timeout):
            c.sock.recv(65536)
        c.sock.settimeout(5.0)
        try:
            data = c.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        assert data == b"", "no connection.close for a client that did not ask for one"
    finally:
        c.close()


def test_frame_max_slack_keeps_the_connection_serving(amqp_url):
    """A publish whose body frames carry exactly frame_max bytes is routed like any other."""
    c = r.RawClient(amqp_url)
    try:
        c.handshake()
        c.open_channel(1)
        name = unique("slack")
        c.queue_declare(1, name, exclusive=True)
        body = b"s" * c.frame_max
        c.send(r.method_frame(1, r.BASIC_PUBLISH, c.publish_args("", name)))
        c.send(r.content_header_frame(1, 60, len(body)))
        c.send(r.body_frame(1, body))
        c.send(r.method_frame(1, r.BASIC_GET, r.short(0) + r.shortstr(name) + r.bits(True)))
        get = c.read_frame()
        assert get.method == r.BASIC_GET_OK
        header = c.read_frame()
        assert struct.unpack(">Q", header.payload[4:12])[0] == len(body)
    finally:
        c.close()
