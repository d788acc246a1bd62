"""A tiny AMQP 0-9-1 frame encoder/decoder over a plain socket.

Only what the hostile-input tests need: the protocol header, frames, the few
field types used by the connection handshake, and decoding of
connection.close / channel.close.  No library, just ``socket`` and ``struct``.
"""

import socket
import struct
import time
from urllib.parse import unquote, urlparse

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE

# (class_id, method_id)
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
BASIC_PUBLISH = (60, 40)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)
BASIC_QOS = (60, 10)
BASIC_QOS_OK = (60, 11)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)


class ConnectionClosedByPeer(Exception):
    """The socket was closed (EOF / reset) before the expected data arrived."""


# --------------------------------------------------------------------------
# field encoders
# --------------------------------------------------------------------------

def octet(v):
    return struct.pack(">B", v)


def short(v):
    return struct.pack(">H", v)


def long_(v):
    return struct.pack(">I", v)


def longlong(v):
    return struct.pack(">Q", v)


def shortstr(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack(">B", len(s)) + s


def longstr(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack(">I", len(s)) + s


def table(d):
    """Encode a field table holding str / bool / int / dict values only."""
    out = b""
    for k, v in (d or {}).items():
        out += shortstr(k)
        if isinstance(v, bool):
            out += b"t" + octet(1 if v else 0)
        elif isinstance(v, int):
            out += b"I" + struct.pack(">i", v)
        elif isinstance(v, dict):
            out += b"F" + table(v)
        else:
            out += b"S" + longstr(v)
    return longstr(out)


def bits(*flags):
    v = 0
    for i, f in enumerate(flags):
        if f:
            v |= 1 << i
    return octet(v)


# --------------------------------------------------------------------------
# frames
# --------------------------------------------------------------------------

def frame(ftype, channel, payload, end=FRAME_END):
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes([end])


def method_frame(channel, method, args=b"", end=FRAME_END):
    class_id, method_id = method
    return frame(FRAME_METHOD, channel, struct.pack(">HH", class_id, method_id) + args, end)


def content_header_frame(channel, class_id, body_size, flags=0, props=b""):
    payload = struct.pack(">HHQH", class_id, 0, body_size, flags) + props
    return frame(FRAME_HEADER, channel, payload)


def body_frame(channel, body):
    return frame(FRAME_BODY, channel, body)


class Frame:
    def __init__(self, ftype, channel, payload):
        self.type = ftype
        self.channel = channel
        self.payload = payload

    @property
    def method(self):
        if self.type != FRAME_METHOD:
            return None
        return struct.unpack(">HH", self.payload[:4])

    def close_args(self):
        """Decode a connection.close / channel.close payload.

        Returns (reply_code, reply_text, class_id, method_id)."""
        p = self.payload[4:]
        code = struct.unpack(">H", p[:2])[0]
        n = p[2]
        text = p[3:3 + n].decode("utf-8", "replace")
        cid, mid = struct.unpack(">HH", p[3 + n:7 + n])
        return code, text, cid, mid

    def __repr__(self):
        return "Frame(type=%d, channel=%d, method=%r, payload=%r)" % (
            self.type, self.channel, self.method, self.payload[:80])


# --------------------------------------------------------------------------
# client
# --------------------------------------------------------------------------

class RawClient:
    """A blocking socket client with a bounded timeout on every read."""

    def __init__(self, url, timeout=5.0):
        u = urlparse(url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 5672
        self.user = unquote(u.username or "guest")
        self.password = unquote(u.password or "guest")
        vhost = u.path[1:] if u.path and len(u.path) > 1 else "/"
        self.vhost = unquote(vhost)
        self.timeout = timeout
        self.sock = socket.create_connection((self.host, self.port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.buf = b""
        self.frame_max = 131072
        self.channel_max = 2047

    # -- raw I/O -----------------------------------------------------------
    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, n, deadline):
        while len(self.buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("timed out waiting for %d bytes" % n)
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError as e:
                raise ConnectionClosedByPeer(str(e))
            if not chunk:
                raise ConnectionClosedByPeer("EOF after %d bytes buffered" % len(self.buf))
            self.buf += chunk

    def recv_exact(self, n, timeout=None):
        self._fill(n, time.monotonic() + (timeout or self.timeout))
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_all_until_eof(self, timeout=None):
        """Read until the server closes the socket; return everything read."""
        deadline = time.monotonic() + (timeout or self.timeout)
        data, self.buf = self.buf, b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("server did not close the socket")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def read_frame(self, timeout=None, skip_heartbeats=True):
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            self._fill(7, deadline)
            ftype, channel, size = struct.unpack(">BHI", self.buf[:7])
            self._fill(7 + size + 1, deadline)
            payload = self.buf[7:7 + size]
            end = self.buf[7 + size]
            self.buf = self.buf[8 + size:]
            if end != FRAME_END:
                raise ValueError("bad frame end from server: %r" % end)
            if skip_heartbeats and ftype == FRAME_HEARTBEAT:
                continue
            return Frame(ftype, channel, payload)

    def expect_method(self, method, timeout=None):
        f = self.read_frame(timeout)
        if f.method != method:
            raise AssertionError("expected %r, got %r" % (method, f))
        return f

    def is_closed_by_peer(self, timeout=None):
        """True when the server closes the socket within the timeout."""
        try:
            self.read_all_until_eof(timeout)
            return True
        except socket.timeout:
            return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    # -- protocol steps ----------------------------------------------------
    def handshake(self, heartbeat=0, frame_max=None, channel_max=None):
        """Protocol header, start/start-ok (PLAIN), tune/tune-ok, open/open-ok."""
        self.send(PROTOCOL_HEADER)
        self.expect_method(CONNECTION_START)
        client_props = table({
            "product": "lepus-interop-rawamqp",
            "capabilities": {"authentication_failure_close": True},
        })
        response = b"\x00" + self.user.encode() + b"\x00" + self.password.encode()
        self.send(method_frame(0, CONNECTION_START_OK,
                               client_props + shortstr("PLAIN") + longstr(response)
                               + shortstr("en_US")))
        tune = self.expect_method(CONNECTION_TUNE)
        ch_max, fr_max, _hb = struct.unpack(">HIH", tune.payload[4:12])
        self.channel_max = channel_max if channel_max is not None else ch_max
        self.frame_max = frame_max if frame_max is not None else fr_max
        self.send(method_frame(0, CONNECTION_TUNE_OK,
                               short(self.channel_max) + long_(self.frame_max) + short(heartbeat)))
        self.send(method_frame(0, CONNECTION_OPEN, shortstr(self.vhost) + shortstr("") + bits(False)))
        self.expect_method(CONNECTION_OPEN_OK)

    def open_channel(self, channel=1):
        self.send(method_frame(channel, CHANNEL_OPEN, shortstr("")))
        f = self.expect_method(CHANNEL_OPEN_OK)
        assert f.channel == channel
        return channel

    def queue_declare(self, channel, name, exclusive=False, auto_delete=True, arguments=None):
        args = short(0) + shortstr(name) + bits(False, False, exclusive, auto_delete, False) + table(arguments)
        self.send(method_frame(channel, QUEUE_DECLARE, args))
        return self.expect_method(QUEUE_DECLARE_OK)

    def declared_queue_name(self, channel, **kwargs):
        """queue.declare with a server-chosen name (amq.gen-...); returns the name."""
        ok = self.queue_declare(channel, "", **kwargs)
        return ok.payload[5:5 + ok.payload[4]].decode()

    def publish_args(self, exchange, routing_key, mandatory=False, immediate=False):
        return short(0) + shortstr(exchange) + shortstr(routing_key) + bits(mandatory, immediate)

    def expect_close(self, timeout=None):
        """Read frames until a connection.close or channel.close arrives.

        Returns (frame, (code, text, class_id, method_id))."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            f = self.read_frame(max(0.01, deadline - time.monotonic()))
            if f.method in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                return f, f.close_args()

    def send_close_ok(self):
        self.send(method_frame(0, CONNECTION_CLOSE_OK))


def assert_connection_close(client, code, text_prefix, class_method=None):
    """Expect connection.close(code) on channel 0; reply close-ok; the socket then closes.

    Returns the reply text."""
    f, (got_code, text, cid, mid) = client.expect_close()
    assert f.channel == 0 and f.method == CONNECTION_CLOSE, f
    assert got_code == code, (got_code, text)
    assert text.startswith(text_prefix), text
    if class_method is not None:
        assert (cid, mid) == class_method, (cid, mid, text)
    client.send_close_ok()
    assert client.is_closed_by_peer(5), "socket must close after close-ok"
    return text
