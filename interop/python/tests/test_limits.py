"""Limits on what a client can make, hit through pika (and a raw socket where the exact frame
matters), with RabbitMQ 3.10.8's codes and texts:

- a vhost's `max-connections`: connection.open refused with 530 NOT_ALLOWED;
- a vhost's `max-queues`: queue.declare refused with 406 PRECONDITION_FAILED;
- the node's `connection_max`: the listener stops accepting (no AMQP error at all);
- consumers per channel: basic.consume refused with 530 NOT_ALLOWED.

The vhost limits are set with rabbitmqctl ($RABBITMQCTL) on RabbitMQ and through the management
API ($LEPUS_MANAGEMENT_URL) on Lepus. `connection_max` and the consumer limit are settings a broker
reads when it starts, so those tests start their own Lepus ($LEPUS_BIN) and are Lepus-only (see each
test for why RabbitMQ cannot run them).
"""

import json
import os
import socket
import urllib.parse

import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError

import rawamqp
from conftest import ManagementApiAdmin, broker_admin, broker_is_lepus, connect, safe_close, unique
from test_lifecycle import LepusBroker

WAIT_SECONDS = 5
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)


class LimitedVhost:
    """A vhost of its own with limits, on the broker under test; deleted at the end."""

    def __init__(self, amqp_url):
        self.amqp_url = amqp_url
        self.name = unique("limits")
        self.admin = broker_admin(amqp_url)
        parsed = urllib.parse.urlparse(amqp_url)
        self.user = urllib.parse.unquote(parsed.username or "guest")
        if isinstance(self.admin, ManagementApiAdmin):
            self.admin.request("PUT", "/vhosts/" + self.quoted, {})
        else:
            self.admin.run("add_vhost", self.name)
        self.admin.set_permissions(self.user, ".*", ".*", ".*", vhost=self.name)

    @property
    def quoted(self):
        return urllib.parse.quote(self.name, safe="")

    @property
    def url(self):
        parsed = urllib.parse.urlparse(self.amqp_url)
        return urllib.parse.urlunparse(parsed._replace(path="/" + self.quoted))

    def set_limit(self, name, value):
        if isinstance(self.admin, ManagementApiAdmin):
            self.admin.request("PUT", "/vhost-limits/%s/%s" % (self.quoted, name), {"value": value})
        else:
            self.admin.run("set_vhost_limits", "-p", self.name, json.dumps({name: value}))

    def delete(self):
        if isinstance(self.admin, ManagementApiAdmin):
            self.admin.request("DELETE", "/vhosts/" + self.quoted)
        else:
            self.admin.run("delete_vhost", self.name)


@pytest.fixture
def limited_vhost(amqp_url):
    vhost = LimitedVhost(amqp_url)
    try:
        yield vhost
    finally:
        vhost.delete()


def open_raw(url):
    """A raw client through the handshake up to connection.open; returns (client, first frame after open)."""
    client = rawamqp.RawClient(url)
    client.send(rawamqp.PROTOCOL_HEADER)
    client.expect_method(rawamqp.CONNECTION_START)
    user, password = client.user.encode(), client.password.encode()
    client.send(rawamqp.method_frame(0, rawamqp.CONNECTION_START_OK,
                                     rawamqp.table({}) + rawamqp.shortstr("PLAIN")
                                     + rawamqp.longstr(b"\x00" + user + b"\x00" + password) + rawamqp.shortstr("en_US")))
    client.expect_method(rawamqp.CONNECTION_TUNE)
    client.send(rawamqp.method_frame(0, rawamqp.CONNECTION_TUNE_OK, rawamqp.short(2047) + rawamqp.long_(131072) + rawamqp.short(0)))
    client.send(rawamqp.method_frame(0, rawamqp.CONNECTION_OPEN, rawamqp.shortstr(client.vhost) + rawamqp.shortstr("") + rawamqp.bits(False)))
    return client, client.read_frame()


def test_vhost_max_connections_refuses_connection_open_with_530(limited_vhost):
    limited_vhost.set_limit("max-connections", 2)
    held = [connect(limited_vhost.url) for _ in range(2)]
    try:
        with pytest.raises(ProbableAccessDeniedError) as refused:
            connect(limited_vhost.url)
        expected = ("NOT_ALLOWED - access to vhost '%s' refused for user '%s': connection limit (2) is reached"
                    % (limited_vhost.name, limited_vhost.user))
        assert expected in str(refused.value)
        # The exact frame: connection.close 530 for connection.open (10, 40).
        client, frame = open_raw(limited_vhost.url)
        try:
            assert frame.method == rawamqp.CONNECTION_CLOSE, frame
            assert frame.close_args() == (530, expected, 10, 40)
        finally:
            client.close()
        # The limit counts open connections: one closed, one more is let in.
        held.pop().close()
        held.append(connect(limited_vhost.url))
        assert held[-1].is_open
        # Other vhosts are not limited by it.
        other = connect()
        safe_close(other)
    finally:
        for conn in held:
            safe_close(conn)


def test_vhost_max_connections_zero_refuses_every_connection(limited_vhost):
    limited_vhost.set_limit("max-connections", 0)
    with pytest.raises(ProbableAccessDeniedError) as refused:
        connect(limited_vhost.url)
    assert "connection limit (0) is reached" in str(refused.value)
    limited_vhost.set_limit("max-connections", -1)
    safe_close(connect(limited_vhost.url))


def declare_refused(conn, name, **kwargs):
    channel = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as closed:
        channel.queue_declare(name, **kwargs)
    return closed.value.reply_code, closed.value.reply_text


def test_vhost_max_queues_refuses_queue_declare_with_406(limited_vhost):
    limited_vhost.set_limit("max-queues", 3)
    conn = connect(limited_vhost.url)
    try:
        channel = conn.channel()
        channel.queue_declare("durable-q", durable=True)
        channel.queue_declare("exclusive-q", exclusive=True)
        server_named = channel.queue_declare("", auto_delete=True).method.queue
        text = "PRECONDITION_FAILED - cannot declare queue '%s': queue limit in vhost '" + limited_vhost.name + "' (3) is reached"
        assert declare_refused(conn, "fourth") == (406, text % "fourth")
        # Checked before the arguments, after the reserved-name check, as RabbitMQ orders them.
        assert declare_refused(conn, "fifth", arguments={"x-max-length": "not a number"}) == (406, text % "fifth")
        assert declare_refused(conn, "amq.reserved")[0] == 403
        assert declare_refused(conn, "missing", passive=True)[0] == 404
        code, reply = declare_refused(conn, "")
        assert code == 406 and reply.startswith("PRECONDITION_FAILED - cannot declare queue 'amq.gen-"), reply
        # What exists can still be declared again, and a deleted queue frees its place.
        channel = conn.channel()
        assert channel.queue_declare("durable-q", durable=True).method.queue == "durable-q"
        channel.queue_delete(server_named)
        channel.queue_declare("fourth", auto_delete=True)
        channel.queue_delete("durable-q")
    finally:
        safe_close(conn)


def lepus_with(amqp_url, tmp_path, monkeypatch, reason, **settings):
    """A private Lepus ($LEPUS_BIN) started with the given environment settings. Against another
    broker the test is skipped with `reason`; against Lepus without LEPUS_BIN it fails."""
    if not broker_is_lepus(amqp_url):
        pytest.skip("Lepus only: " + reason)
    binary = os.environ.get("LEPUS_BIN")
    if not binary:
        pytest.fail("the broker is Lepus: set LEPUS_BIN so this test can start a broker with its own limits")
    for name, value in settings.items():
        monkeypatch.setenv(name, str(value))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = LepusBroker(binary, data_dir, tmp_path)
    broker.start()
    return broker


def test_connection_max_stops_accepting_until_a_connection_closes(amqp_url, tmp_path, monkeypatch):
    """connection_max: the listener takes no more sockets, so the next client waits in the kernel's
    backlog without a connection.start, and is served once a connection closes; RabbitMQ 3.10.8
    does the same (ranch's max_connections) and sends no AMQP error either."""
    broker = lepus_with(amqp_url, tmp_path, monkeypatch,
                        "RabbitMQ reads connection_max only when its listener starts, and its ranch acceptors "
                        "(10 by default) let several connections past the limit before they pause (9 with "
                        "connection_max = 2 when checked), so its threshold is not connection_max",
                        LEPUS_CONNECTION_MAX=2)
    held, waiting = [], None
    try:
        held = [connect(broker.url) for _ in range(2)]
        waiting = rawamqp.RawClient(broker.url, timeout=1)
        waiting.send(rawamqp.PROTOCOL_HEADER)
        with pytest.raises(socket.timeout):
            waiting.read_frame(timeout=1)
        held.pop().close()
        frame = waiting.read_frame(timeout=WAIT_SECONDS)
        assert frame.method == rawamqp.CONNECTION_START, frame
        waiting.close()
        waiting = None
        # The slot the raw client held comes back too: two connections at once, again.
        held.append(connect(broker.url))
        assert all(conn.is_open for conn in held)
    finally:
        if waiting is not None:
            waiting.close()
        for conn in held:
            safe_close(conn)
        broker.kill()


def test_consumer_max_per_channel_refuses_basic_consume_with_530(amqp_url, tmp_path, monkeypatch):
    broker = lepus_with(amqp_url, tmp_path, monkeypatch,
                        "RabbitMQ 3.10.8 has no limit on consumers per channel (its later versions' "
                        "consumer_max_per_channel); Lepus bounds it with that setting's name, code and text",
                        LEPUS_CONSUMER_MAX_PER_CHANNEL=3)
    conn = connect(broker.url)
    try:
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        tags = [channel.basic_consume(queue, lambda *_: None) for _ in range(3)]
        # A cancelled consumer frees its place.
        channel.basic_cancel(tags.pop())
        tags.append(channel.basic_consume(queue, lambda *_: None))
        # The bound is per channel.
        other = conn.channel()
        for _ in range(3):
            other.basic_consume(queue, lambda *_: None)
        with pytest.raises(ConnectionClosedByBroker) as closed:
            channel.basic_consume(queue, lambda *_: None)
        assert (closed.value.reply_code, closed.value.reply_text) == (
            530, "NOT_ALLOWED - reached maximum (3) of consumers per channel")
        # The exact frame: connection.close for basic.consume (60, 20).
        raw = rawamqp.RawClient(broker.url)
        try:
            raw.handshake()
            raw.open_channel(1)
            raw.queue_declare(1, "raw-consumed", exclusive=True)
            for number in range(4):
                arguments = (rawamqp.short(0) + rawamqp.shortstr("raw-consumed") + rawamqp.shortstr("tag-%d" % number)
                             + rawamqp.bits(False, False, False, False) + rawamqp.table({}))
                raw.send(rawamqp.method_frame(1, BASIC_CONSUME, arguments))
                if number < 3:
                    raw.expect_method(BASIC_CONSUME_OK)
            _, close = raw.expect_close()
            assert close == (530, "NOT_ALLOWED - reached maximum (3) of consumers per channel", 60, 20)
        finally:
            raw.close()
    finally:
        safe_close(conn)
        broker.kill()
