"""connection.* and channel.* through pika: handshake, tuning, auth, vhosts, channels."""

import threading
import time
from urllib.parse import urlparse, urlunparse

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from conftest import connect, consume_n, get_all, make_params, safe_close, unique, wait_for_count

EXPECTED_CAPABILITIES = [
    "publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
    "connection.blocked", "consumer_priorities", "authentication_failure_close", "per_consumer_qos",
]


def url_with(url, password=None, vhost=None):
    u = urlparse(url)
    netloc = u.netloc
    if password is not None:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = "%s:%s@%s" % (user, password, host)
    path = u.path if vhost is None else "/" + vhost
    return urlunparse((u.scheme, netloc, path, "", "", ""))


def test_server_capabilities_advertised(connection):
    caps = connection._impl.server_capabilities
    for cap in EXPECTED_CAPABILITIES:
        assert caps.get(cap) is True, cap
    assert connection.publisher_confirms_supported
    assert connection.exchange_exchange_bindings_supported
    assert connection.basic_nack_supported
    assert connection.consumer_cancel_notify_supported


def test_server_properties_identify_the_broker(connection):
    props = connection._impl.server_properties
    for key in ("product", "version", "platform"):
        assert isinstance(props.get(key), str) and props[key], key


def test_tune_negotiates_lower_client_frame_max_and_channel_max(connection_factory):
    conn = connection_factory(frame_max=8192, channel_max=16)
    assert conn._impl.params.frame_max == 8192
    assert conn._impl.params.channel_max == 16
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = b"z" * 50000  # 7 body frames at frame_max 8192
    ch.basic_publish("", q, body)
    _, got = consume_n(conn, ch, q, 1, auto_ack=True)
    assert got[0][2] == body


def test_tune_server_limits_when_client_asks_for_more(connection_factory):
    conn = connection_factory(frame_max=pika.spec.FRAME_MAX_SIZE, channel_max=65535)
    # RabbitMQ 3.10.8 proposes frame_max 131072 and channel_max 2047 (as do Lepus's defaults,
    # crates/server/src/config.rs); a client asking for more gets exactly the proposal.
    assert conn._impl.params.frame_max == 131072
    assert conn._impl.params.channel_max == 2047


def test_heartbeat_value_negotiated(connection_factory):
    conn = connection_factory(heartbeat=2)
    assert conn._impl.params.heartbeat == 2


def test_heartbeat_keeps_idle_connection_alive(connection_factory):
    conn = connection_factory(heartbeat=2)
    ch = conn.channel()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.5)
    assert conn.is_open
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"still here")
    assert wait_for_count(q, 1, ch) == 1


def test_heartbeat_disabled_with_zero(connection_factory):
    conn = connection_factory(heartbeat=0)
    assert conn._impl.params.heartbeat == 0
    assert conn.channel().is_open


def test_wrong_password_is_refused_with_access_refused(amqp_url):
    params = pika.URLParameters(url_with(amqp_url, password="definitely-wrong"))
    params.connection_attempts = 1
    params.socket_timeout = 5
    with pytest.raises((pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AuthenticationError)) as ei:
        pika.BlockingConnection(params)
    # The client advertises authentication_failure_close, so the broker sends
    # connection.close 403 ACCESS_REFUSED instead of dropping the socket.
    assert "403" in str(ei.value)
    assert "ACCESS_REFUSED" in str(ei.value)


def test_unknown_vhost_is_530_not_allowed(amqp_url):
    vhost = unique("no-such-vhost")
    params = pika.URLParameters(url_with(amqp_url, vhost=vhost))
    params.connection_attempts = 1
    params.socket_timeout = 5
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as ei:
        pika.BlockingConnection(params)
    assert "530" in str(ei.value)
    assert "NOT_ALLOWED" in str(ei.value)
    assert vhost in str(ei.value)


def test_default_vhost_via_explicit_slash(amqp_url):
    conn = pika.BlockingConnection(make_params(url_with(amqp_url, vhost="%2F")))
    try:
        assert conn.channel().is_open
    finally:
        safe_close(conn)


def test_client_connection_close_is_clean(amqp_url):
    conn = connect(amqp_url)
    conn.channel()
    conn.close()
    assert conn.is_closed


def test_many_channels_on_one_connection(connection):
    channels = [connection.channel() for _ in range(200)]
    numbers = [ch.channel_number for ch in channels]
    assert len(set(numbers)) == 200
    q = channels[0].queue_declare("", exclusive=True).method.queue
    for i, ch in enumerate(channels):
        ch.basic_publish("", q, str(i).encode())
    assert wait_for_count(q, 200, channels[-1]) == 200
    got = sorted(int(b) for _, _, b in get_all(channels[100], q))
    assert got == list(range(200))
    for ch in channels[::2]:
        ch.close()
    for ch in channels[1::2]:
        assert ch.is_open
        ch.queue_declare(q, passive=True)


def test_channel_numbers_are_reusable_after_close(connection):
    ch = connection.channel(channel_number=7)
    ch.close()
    again = connection.channel(channel_number=7)
    assert again.is_open
    again.queue_declare("", exclusive=True)


def test_channel_error_does_not_affect_other_channels(connection):
    good = connection.channel()
    q = good.queue_declare("", exclusive=True).method.queue
    bad = connection.channel()
    with pytest.raises(ChannelClosedByBroker):
        bad.queue_declare(unique("missing"), passive=True)
    good.basic_publish("", q, b"ok")
    assert wait_for_count(q, 1, good) == 1
    assert connection.channel().is_open


def test_many_connections(amqp_url):
    conns = []
    try:
        for _ in range(25):
            conns.append(connect(amqp_url))
        chans = [c.channel() for c in conns]
        q = chans[0].queue_declare("", exclusive=True).method.queue
        for i, ch in enumerate(chans):
            ch.basic_publish("", q, str(i).encode())
        assert wait_for_count(q, 25, chans[0]) == 25
    finally:
        for c in conns:
            safe_close(c)


def test_many_connections_in_parallel_threads(amqp_url, cleanup):
    q = cleanup.queue(unique("q-threads"))
    setup = connect(amqp_url)
    try:
        setup.channel().queue_declare(q)
    finally:
        safe_close(setup)
    errors = []

    def worker(i):
        try:
            c = connect(amqp_url)
            try:
                ch = c.channel()
                ch.confirm_delivery()
                for j in range(20):
                    ch.basic_publish("", q, ("%d-%d" % (i, j)).encode())
            finally:
                safe_close(c)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert wait_for_count(q, 200) == 200


def test_channel_flow_active_true_is_acknowledged(channel):
    # pika's BlockingChannel.flow sends channel.flow and returns flow-ok's active flag.
    assert channel.flow(True) is True
    assert channel.is_open


def test_channel_flow_active_false_is_540_not_implemented(connection, channel):
    with pytest.raises(ConnectionClosedByBroker) as ei:
        channel.flow(False)
    assert ei.value.reply_code == 540
    assert ei.value.reply_text.startswith("NOT_IMPLEMENTED")
    assert connection.is_closed


def test_qos_prefetch_size_is_540_not_implemented(connection, channel):
    with pytest.raises(ConnectionClosedByBroker) as ei:
        channel.basic_qos(prefetch_size=1000)
    assert ei.value.reply_code == 540
    assert ei.value.reply_text.startswith("NOT_IMPLEMENTED")
    assert connection.is_closed


