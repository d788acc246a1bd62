"""Raw-socket tests (no client library): hostile and malformed input.

Every expectation here was checked against RabbitMQ 3.10 first.  Frame-level
errors are fatal: the broker sends connection.close on channel 0, waits for
close-ok, then closes the socket.
"""

import struct
import threading
import time

import pytest

import rawamqp as r
from rawamqp import assert_connection_close
from conftest import connect, safe_close, unique

BAD_HEADERS = [
    pytest.param(b"AMQP\x00\x00\x09\x00", id="amqp-0-9-0"),
    pytest.param(b"AMQP\x00\x01\x00\x00", id="amqp-1-0"),
    pytest.param(b"HTTP/1.1\r\n\r\n", id="http"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http-get"),
]


@pytest.fixture
def raw(amqp_url):
    clients = []

    def make(handshake=True, channel=None, **kw):
        c = r.RawClient(amqp_url)
        clients.append(c)
        if handshake:
            c.handshake(**kw)
        if channel is not None:
            c.open_channel(channel)
        return c

    yield make
    for c in clients:
        c.close()


# ---------------------------------------------------------------- sanity: the encoder works

def test_raw_publish_and_get_round_trip(raw):
    c = raw(channel=1)
    ok = c.queue_declare(1, "", exclusive=True)
    qname = ok.payload[5:5 + ok.payload[4]].decode()
    assert qname.startswith("amq.gen-")
    body = b"raw hello"
    c.send(r.method_frame(1, r.BASIC_PUBLISH, c.publish_args("", qname))
           + r.content_header_frame(1, 60, len(body))
           + r.body_frame(1, body))
    for _ in range(50):
        c.send(r.method_frame(1, r.BASIC_GET, r.short(0) + r.shortstr(qname) + r.bits(True)))
        f = c.read_frame()
        if f.method == r.BASIC_GET_OK:
            break
        assert f.method == r.BASIC_GET_EMPTY
        time.sleep(0.02)
    assert f.method == r.BASIC_GET_OK
    header = c.read_frame()
    assert header.type == r.FRAME_HEADER
    class_id, _weight, size = struct.unpack(">HHQ", header.payload[:12])
    assert (class_id, size) == (60, len(body))
    content = c.read_frame()
    assert content.type == r.FRAME_BODY and content.payload == body


def test_connection_start_advertises_version_mechanisms_locales(raw):
    c = raw(handshake=False)
    c.send(r.PROTOCOL_HEADER)
    f = c.expect_method(r.CONNECTION_START)
    assert f.channel == 0
    assert f.payload[4:6] == b"\x00\x09"  # version-major 0, version-minor 9
    # the two longstrs at the end: mechanisms, locales
    locales_len = struct.unpack(">I", f.payload[-(4 + 5):-5])[0]
    assert locales_len == 5 and f.payload[-5:] == b"en_US"
    mech_end = len(f.payload) - 9
    mechanisms = None
    for mlen in range(1, 200):  # find "<len>mechanisms" ending right before locales
        start = mech_end - mlen
        if start >= 4 and struct.unpack(">I", f.payload[start - 4:start])[0] == mlen:
            mechanisms = f.payload[start:mech_end].decode().split()
            break
    assert mechanisms is not None
    assert "PLAIN" in mechanisms and "AMQPLAIN" in mechanisms


def test_connection_tune_proposes_rabbitmq_limits(raw):
    """RabbitMQ 3.10.8 proposes channel_max 2047, frame_max 131072 and heartbeat 60 s."""
    c = raw(handshake=False)
    start_ok(c, "PLAIN", b"\x00" + c.user.encode() + b"\x00" + c.password.encode())
    tune = c.expect_method(r.CONNECTION_TUNE)
    assert tune.channel == 0
    assert struct.unpack(">HIH", tune.payload[4:12]) == (2047, 131072, 60)


def test_client_close_gets_close_ok(raw):
    c = raw(channel=1)
    c.send(r.method_frame(0, r.CONNECTION_CLOSE, r.short(200) + r.shortstr("bye") + r.short(0) + r.short(0)))
    f = c.expect_method(r.CONNECTION_CLOSE_OK)
    assert f.channel == 0
    # RabbitMQ leaves closing the socket to the client after close-ok


def test_channel_close_gets_close_ok_and_channel_can_reopen(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, r.CHANNEL_CLOSE, r.short(200) + r.shortstr("bye") + r.short(0) + r.short(0)))
    f = c.expect_method(r.CHANNEL_CLOSE_OK)
    assert f.channel == 1
    c.open_channel(1)


# ---------------------------------------------------------------- protocol header

@pytest.mark.parametrize("header", BAD_HEADERS)
def test_wrong_protocol_header_gets_amqp_0_9_1_header_and_close(raw, header):
    c = raw(handshake=False)
    c.send(header)
    assert c.read_all_until_eof(5) == b"AMQP\x00\x00\x09\x01"


# ---------------------------------------------------------------- authentication

def start_ok(c, mechanism, response, capabilities=True):
    c.send(r.PROTOCOL_HEADER)
    c.expect_method(r.CONNECTION_START)
    props = r.table({"capabilities": {"authentication_failure_close": True}} if capabilities else {})
    c.send(r.method_frame(0, r.CONNECTION_START_OK,
                          props + r.shortstr(mechanism) + r.longstr(response) + r.shortstr("en_US")))


def amqplain(user, password):
    return r.table({"LOGIN": user, "PASSWORD": password})[4:]  # table body without its length


def test_amqplain_authentication(raw):
    c = raw(handshake=False)
    start_ok(c, "AMQPLAIN", amqplain(c.user, c.password))
    tune = c.expect_method(r.CONNECTION_TUNE)
    ch_max, fr_max, hb = struct.unpack(">HIH", tune.payload[4:12])
    c.send(r.method_frame(0, r.CONNECTION_TUNE_OK, r.short(ch_max) + r.long_(fr_max) + r.short(0)))
    c.send(r.method_frame(0, r.CONNECTION_OPEN, r.shortstr(c.vhost) + r.shortstr("") + r.bits(False)))
    c.expect_method(r.CONNECTION_OPEN_OK)
    c.open_channel(1)


def test_amqplain_wrong_password_is_403(raw):
    c = raw(handshake=False)
    start_ok(c, "AMQPLAIN", amqplain(c.user, "wrong-password"))
    text = assert_connection_close(c, 403, "ACCESS_REFUSED")
    assert "AMQPLAIN" in text


def test_plain_wrong_password_is_403_with_auth_failure_close(raw):
    c = raw(handshake=False)
    start_ok(c, "PLAIN", b"\x00" + c.user.encode() + b"\x00wrong-password")
    text = assert_connection_close(c, 403, "ACCESS_REFUSED", (0, 0))
    assert "PLAIN" in text


def test_plain_wrong_password_without_capability_just_closes_socket(raw):
    c = raw(handshake=False)
    start_ok(c, "PLAIN", b"\x00" + c.user.encode() + b"\x00wrong-password", capabilities=False)
    data = c.read_all_until_eof(5)
    assert data == b"", "no connection.close without authentication_failure_close"


def test_unknown_auth_mechanism_closes_socket(raw):
    c = raw(handshake=False)
    start_ok(c, "NO-SUCH-MECHANISM", b"whatever")
    assert c.read_all_until_eof(5) == b""


def test_tune_ok_channel_max_zero_above_server_limit_closes_socket(raw):
    """channel_max=0 means 'no limit', which exceeds the server's 2047: fatal before open."""
    c = raw(handshake=False)
    start_ok(c, "PLAIN", b"\x00" + c.user.encode() + b"\x00" + c.password.encode())
    c.expect_method(r.CONNECTION_TUNE)
    c.send(r.method_frame(0, r.CONNECTION_TUNE_OK, r.short(0) + r.long_(131072) + r.short(0)))
    c.send(r.method_frame(0, r.CONNECTION_OPEN, r.shortstr(c.vhost) + r.shortstr("") + r.bits(False)))
    assert c.read_all_until_eof(5) == b""


def test_unknown_vhost_is_530_with_connection_open_class_method(raw):
    c = raw(handshake=False)
    start_ok(c, "PLAIN", b"\x00" + c.user.encode() + b"\x00" + c.password.encode())
    tune = c.expect_method(r.CONNECTION_TUNE)
    ch_max, fr_max, _ = struct.unpack(">HIH", tune.payload[4:12])
    c.send(r.method_frame(0, r.CONNECTION_TUNE_OK, r.short(ch_max) + r.long_(fr_max) + r.short(0)))
    vhost = unique("no-vhost")
    c.send(r.method_frame(0, r.CONNECTION_OPEN, r.shortstr(vhost) + r.shortstr("") + r.bits(False)))
    text = assert_connection_close(c, 530, "NOT_ALLOWED", r.CONNECTION_OPEN)
    assert vhost in text


def test_method_out_of_order_during_handshake_closes_socket(raw):
    c = raw(handshake=False)
    c.send(r.PROTOCOL_HEADER)
    c.expect_method(r.CONNECTION_START)
    c.send(r.method_frame(0, r.CONNECTION_OPEN, r.shortstr("/") + r.shortstr("") + r.bits(False)))
    assert c.read_all_until_eof(5) == b""


# ---------------------------------------------------------------- heartbeats

def test_server_sends_heartbeats_and_drops_silent_client(raw):
    c = raw(heartbeat=1)
    start = time.monotonic()
    heartbeats = 0
    with pytest.raises(r.ConnectionClosedByPeer):
        while time.monotonic() - start < 8:
            f = c.read_frame(8, skip_heartbeats=False)
            assert f.type == r.FRAME_HEARTBEAT and f.channel == 0 and f.payload == b"", f
            heartbeats += 1
    elapsed = time.monotonic() - start
    assert heartbeats >= 1
    assert 1.5 <= elapsed <= 6, "silent client dropped after about 2-3 heartbeat intervals"


def test_server_heartbeats_a_heartbeating_client_every_half_interval(raw):
    """A client that heartbeats every half interval (as amqp091-go and pika do) gets the server's
    heartbeats about as often, never more than an interval apart, and stays open: RabbitMQ 3.10.8
    sends one every T/2 (measured: every 1.0 s for T = 2 s). Lepus answers such a client's
    heartbeat with its own from the same wakeup (connection/heartbeat.rs)."""
    interval_s = 2
    c = raw(heartbeat=interval_s, channel=1)
    start = time.monotonic()
    last_sent = start
    received = []
    while time.monotonic() - start < 4 * interval_s:
        if time.monotonic() - last_sent >= interval_s / 2:
            c.send(r.frame(r.FRAME_HEARTBEAT, 0, b""))
            last_sent = time.monotonic()
        try:
            f = c.read_frame(0.05, skip_heartbeats=False)
        except r.ConnectionClosedByPeer:
            raise AssertionError(f"closed after {time.monotonic() - start:.2f} s while heartbeating")
        except OSError:  # nothing within 50 ms
            continue
        assert f.type == r.FRAME_HEARTBEAT and f.channel == 0, f
        received.append(time.monotonic() - start)
    assert len(received) >= 5, received
    gaps = [later - earlier for earlier, later in zip([0.0] + received, received)]
    assert max(gaps) <= interval_s, gaps
    # Still open and serving.
    c.queue_declare(1, "", exclusive=True)


# ---------------------------------------------------------------- frame errors (501)

def test_bad_frame_end_octet_is_501_frame_error(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, r.QUEUE_DECLARE,
                          r.short(0) + r.shortstr("x") + r.bits() + r.table({}), end=0xAB))
    assert_connection_close(c, 501, "FRAME_ERROR", (0, 0))


def test_bad_frame_end_before_any_channel_is_501(raw):
    c = raw()
    c.send(r.method_frame(1, r.CHANNEL_OPEN, r.shortstr(""), end=0x00))
    assert_connection_close(c, 501, "FRAME_ERROR")


def test_body_frame_larger_than_frame_max_is_501(raw):
    c = raw(channel=1)
    c.send(r.body_frame(1, b"x" * (2 * c.frame_max)))
    text = assert_connection_close(c, 501, "FRAME_ERROR", (0, 0))
    assert "frame_too_large" in text


def test_method_frame_larger_than_negotiated_frame_max_is_501(raw):
    c = raw(channel=1, frame_max=4096)
    assert c.frame_max == 4096
    c.send(r.method_frame(1, r.BASIC_PUBLISH, c.publish_args("", "q") + b"x" * 10000))
    assert_connection_close(c, 501, "FRAME_ERROR", (0, 0))


def test_frame_of_exactly_frame_max_is_accepted(raw):
    c = raw(channel=1, frame_max=4096)
    ok = c.queue_declare(1, "", exclusive=True)
    qname = ok.payload[5:5 + ok.payload[4]].decode()
    body = b"y" * (4096 - 8)  # whole frame == frame_max
    c.send(r.method_frame(1, r.BASIC_PUBLISH, c.publish_args("", qname))
           + r.content_header_frame(1, 60, len(body)) + r.body_frame(1, body))
    c.queue_declare(1, "", exclusive=True)  # still alive


def test_unknown_frame_type_is_501(raw):
    c = raw(channel=1)
    c.send(r.frame(9, 1, b"abc"))
    assert_connection_close(c, 501, "FRAME_ERROR", (0, 0))


def test_truncated_method_payload_is_501_frame_error(raw):
    """RabbitMQ reports an undecodable method as 501 FRAME_ERROR (not 502), naming the method."""
    c = raw(channel=1)
    c.send(r.method_frame(1, r.QUEUE_DECLARE, r.short(0) + b"\x10ab"))  # shortstr says 16, has 2
    text = assert_connection_close(c, 501, "FRAME_ERROR", r.QUEUE_DECLARE)
    assert "cannot decode" in text


def test_empty_method_arguments_is_501_frame_error(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, r.QUEUE_DECLARE, b""))
    assert_connection_close(c, 501, "FRAME_ERROR", r.QUEUE_DECLARE)


# ---------------------------------------------------------------- channel errors (504)

def test_channel_method_on_channel_zero_is_504(raw):
    c = raw()
    c.send(r.method_frame(0, r.QUEUE_DECLARE, r.short(0) + r.shortstr("x") + r.bits() + r.table({})))
    assert_connection_close(c, 504, "CHANNEL_ERROR", r.QUEUE_DECLARE)


def test_channel_open_on_channel_zero_is_504(raw):
    c = raw()
    c.send(r.method_frame(0, r.CHANNEL_OPEN, r.shortstr("")))
    assert_connection_close(c, 504, "CHANNEL_ERROR", r.CHANNEL_OPEN)


def test_method_on_unopened_channel_is_504(raw):
    c = raw()
    c.send(r.method_frame(5, r.QUEUE_DECLARE, r.short(0) + r.shortstr("x") + r.bits() + r.table({})))
    text = assert_connection_close(c, 504, "CHANNEL_ERROR", r.QUEUE_DECLARE)
    assert "channel.open" in text


def test_second_channel_open_on_same_channel_is_504(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, r.CHANNEL_OPEN, r.shortstr("")))
    assert_connection_close(c, 504, "CHANNEL_ERROR", r.CHANNEL_OPEN)


def test_channel_number_above_channel_max_still_opens(raw):
    """RabbitMQ 3.10 limits the *count* of open channels, not the channel number."""
    c = raw(channel_max=10)
    c.send(r.method_frame(11, r.CHANNEL_OPEN, r.shortstr("")))
    f = c.read_frame()
    assert (f.channel, f.method) == (11, r.CHANNEL_OPEN_OK), f
    c.queue_declare(11, "", exclusive=True)  # and the channel works


def test_opening_more_channels_than_channel_max_is_530(raw):
    c = raw(channel_max=2)
    c.open_channel(1)
    c.open_channel(2)
    c.send(r.method_frame(3, r.CHANNEL_OPEN, r.shortstr("")))
    text = assert_connection_close(c, 530, "NOT_ALLOWED")
    assert "channel_max" in text


# ---------------------------------------------------------------- unexpected frames (505)

def test_content_body_without_header_is_505(raw):
    c = raw(channel=1)
    c.send(r.body_frame(1, b"hello"))
    assert_connection_close(c, 505, "UNEXPECTED_FRAME", (0, 0))


def test_content_header_without_publish_is_505(raw):
    c = raw(channel=1)
    c.send(r.content_header_frame(1, 60, 5))
    assert_connection_close(c, 505, "UNEXPECTED_FRAME", (0, 0))


def test_content_body_on_unopened_channel_is_505(raw):
    c = raw()
    c.send(r.body_frame(3, b"x"))
    assert_connection_close(c, 505, "UNEXPECTED_FRAME")


def test_publish_followed_by_body_instead_of_header_is_505(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, r.BASIC_PUBLISH, c.publish_args("", "q")) + r.body_frame(1, b"hello"))
    text = assert_connection_close(c, 505, "UNEXPECTED_FRAME", r.BASIC_PUBLISH)
    assert "content header" in text


def test_publish_followed_by_method_instead_of_header_is_505(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, r.BASIC_PUBLISH, c.publish_args("", "q"))
           + r.method_frame(1, r.QUEUE_DECLARE, r.short(0) + r.shortstr("") + r.bits() + r.table({})))
    assert_connection_close(c, 505, "UNEXPECTED_FRAME", r.BASIC_PUBLISH)


def test_content_header_with_wrong_class_is_505(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, r.BASIC_PUBLISH, c.publish_args("", "q"))
           + r.content_header_frame(1, 50, 2) + r.body_frame(1, b"he"))
    assert_connection_close(c, 505, "UNEXPECTED_FRAME", r.BASIC_PUBLISH)


def test_heartbeat_frame_on_non_zero_channel_is_505(raw):
    c = raw(channel=1)
    c.send(r.frame(r.FRAME_HEARTBEAT, 1, b""))
    assert_connection_close(c, 505, "UNEXPECTED_FRAME", (0, 0))


# ---------------------------------------------------------------- unknown methods

@pytest.mark.parametrize("method", [(99, 10), (50, 99), (60, 999)], ids=["class", "queue-method", "basic-method"])
def test_unknown_class_or_method_terminates_connection(raw, method):
    """RabbitMQ 3.10 drops the TCP connection without a connection.close here.

    A broker that sends connection.close first must use 540 NOT_IMPLEMENTED."""
    c = raw(channel=1)
    c.send(r.method_frame(1, method))
    deadline = time.monotonic() + 5
    while True:
        assert time.monotonic() < deadline, "connection not terminated"
        try:
            f = c.read_frame(max(0.05, deadline - time.monotonic()))
        except r.ConnectionClosedByPeer:
            break
        assert f.method == r.CONNECTION_CLOSE, f
        assert f.close_args()[0] == 540, f.close_args()
        c.send_close_ok()
        assert c.is_closed_by_peer(5)
        break


# ---------------------------------------------------------------- consumers

def test_server_generated_consumer_tag(raw):
    c = raw(channel=1)
    ok = c.queue_declare(1, "", exclusive=True)
    qname = ok.payload[5:5 + ok.payload[4]].decode()
    c.send(r.method_frame(1, (60, 20), r.short(0) + r.shortstr(qname) + r.shortstr("")
                          + r.bits(False, False, False, False) + r.table({})))
    f = c.expect_method((60, 21))
    tag = f.payload[5:5 + f.payload[4]].decode()
    assert tag.startswith("amq.ctag-")


def test_duplicate_consumer_tag_is_530_connection_close(raw):
    c = raw(channel=1)
    ok = c.queue_declare(1, "", exclusive=True)
    qname = ok.payload[5:5 + ok.payload[4]].decode()
    consume = r.method_frame(1, (60, 20), r.short(0) + r.shortstr(qname) + r.shortstr("tag1")
                             + r.bits(False, False, False, False) + r.table({}))
    c.send(consume)
    c.expect_method((60, 21))
    c.send(consume)
    text = assert_connection_close(c, 530, "NOT_ALLOWED", (60, 20))
    assert "tag1" in text


def test_channel_flow_active_false_is_540(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, (20, 20), r.bits(False)))
    assert_connection_close(c, 540, "NOT_IMPLEMENTED", (20, 20))


def test_channel_flow_active_true_gets_flow_ok(raw):
    c = raw(channel=1)
    c.send(r.method_frame(1, (20, 20), r.bits(True)))
    f = c.expect_method((20, 21))
    assert f.channel == 1 and f.payload[4] == 1


# ---------------------------------------------------------------- misbehaving clients don't hurt others

def test_half_frame_and_silent_clients_do_not_affect_others(amqp_url, raw):
    """While one client sends half a frame and hangs up, and another connects and
    says nothing, a well-behaved client keeps publishing and consuming."""
    conn = connect(amqp_url)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()

        raw(handshake=False)  # connects, sends nothing (the fixture keeps it open)
        silent_after_header = raw(handshake=False)
        silent_after_header.send(r.PROTOCOL_HEADER)  # then nothing

        stop = threading.Event()
        hostile_errors = []

        def hostile():
            try:
                for _ in range(20):
                    if stop.is_set():
                        return
                    h = r.RawClient(amqp_url)
                    try:
                        h.handshake()
                        h.open_channel(1)
                        full = r.method_frame(1, r.BASIC_PUBLISH, h.publish_args("", q))
                        h.send(full[: len(full) // 2])  # half a frame
                    finally:
                        h.close()  # disconnect mid-frame
            except Exception as e:  # pragma: no cover
                hostile_errors.append(e)

        t = threading.Thread(target=hostile)
        t.start()
        received = []
        try:
            for i in range(50):
                ch.basic_publish("", q, ("good-%d" % i).encode())
                m, _, body = ch.basic_get(q, auto_ack=True)
                received.append(body)
        finally:
            stop.set()
            t.join(30)
        assert hostile_errors == []
        assert received == [("good-%d" % i).encode() for i in range(50)]

        # the half-frame publishes never reached the queue
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        # and everything still works afterwards, on the same and on a new connection
        ch.basic_publish("", q, b"after")
        assert ch.basic_get(q, auto_ack=True)[2] == b"after"
        other = connect(amqp_url)
        try:
            other.channel().queue_declare("", exclusive=True)
        finally:
            safe_close(other)
    finally:
        safe_close(conn)
