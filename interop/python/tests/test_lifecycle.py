"""Broker lifecycle: durability across restarts (Lepus only).

These tests start their own broker:
    $LEPUS_BIN server --data-dir <tmpdir> --amqp-port <free port>
and are skipped unless LEPUS_BIN is set.  They stop it with SIGTERM (graceful)
or SIGKILL (crash), restart it on the same data directory and check what
survived: durable exchanges/queues/bindings and confirmed persistent messages
(in order); transient queues/exchanges and non-persistent messages are gone;
messages delivered but not acked before the stop come back redelivered=true.
"""

import os
import sys
import signal
import socket
import subprocess
import time
from urllib.parse import quote, unquote, urlparse

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import amqp_url_from_env, get_all, make_params, safe_close, unique

pytestmark = pytest.mark.lepus_only

START_TIMEOUT = 10.0
STOP_TIMEOUT = 15.0


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from free_ports import free_port  # noqa: E402  (interop/free_ports.py, shared by the suites)


class LepusBroker:
    """One `lepus server` process on a data dir; restartable on a new port."""

    def __init__(self, binary, data_dir, log_dir):
        self.binary = binary
        self.data_dir = str(data_dir)
        self.log_dir = str(log_dir)
        self.proc = None
        self.port = None
        self.starts = 0
        u = urlparse(amqp_url_from_env())
        self.user = unquote(u.username or "guest")
        self.password = unquote(u.password or "guest")

    @property
    def url(self):
        return "amqp://%s:%s@127.0.0.1:%d/" % (quote(self.user, safe=""), quote(self.password, safe=""),
                                                self.port)

    def extra_port_args(self):
        """Free ports for the HTTP API and metrics, when this lepus has them, so that several
        brokers run side by side (their defaults, 15672 and 15692, would collide)."""
        if not hasattr(LepusBroker, "_help"):
            LepusBroker._help = subprocess.run([self.binary, "server", "--help"], capture_output=True, text=True).stdout
        args = []
        for flag in ("--http-port", "--metrics-port"):
            if flag in LepusBroker._help:
                args += [flag, str(free_port())]
        return args

    def log_tail(self, n=4000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return "<no log>"

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.port = free_port()
        self.starts += 1
        self.log_path = os.path.join(self.log_dir, "lepus-%d.log" % self.starts)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, "server", "--data-dir", self.data_dir, "--amqp-port", str(self.port)] + self.extra_port_args(),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail("lepus exited with %s during startup:\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail("lepus did not accept connections on port %d within %.0fs:\n%s"
                            % (self.port, START_TIMEOUT, self.log_tail()))
            time.sleep(0.05)

    def connect(self):
        """A BlockingConnection; retried briefly in case the listener is up before recovery ends."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                return pika.BlockingConnection(make_params(self.url))
            except pika.exceptions.AMQPConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def stop(self, sig):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("lepus did not exit within %.0fs of signal %s:\n%s"
                        % (STOP_TIMEOUT, sig, self.log_tail()))

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def broker(tmp_path):
    binary = os.environ["LEPUS_BIN"]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    b = LepusBroker(binary, data_dir, tmp_path)
    b.cleanup_names = {}
    b.start()
    yield b
    try:
        if b.proc.poll() is None and b.cleanup_names:
            conn = pika.BlockingConnection(make_params(b.url))
            try:
                for key, name in b.cleanup_names.items():
                    ch = conn.channel()
                    if key.endswith("q"):
                        ch.queue_delete(name)
                    else:
                        ch.exchange_delete(name)
            finally:
                safe_close(conn)
    except Exception:
        pass
    finally:
        b.kill()


def declare_topology(ch, names):
    ch.exchange_declare(names["dx"], "direct", durable=True)
    ch.queue_declare(names["dq"], durable=True)
    ch.queue_bind(names["dq"], names["dx"], routing_key="rk")
    ch.exchange_declare(names["tx"], "fanout", durable=False)
    ch.queue_declare(names["tq"], durable=False)
    ch.queue_bind(names["tq"], names["tx"])


def persistent(i):
    return pika.BasicProperties(delivery_mode=2, message_id="p%d" % i, headers={"seq": i})


def publish_messages(ch, names, n_persistent):
    """Confirmed persistent messages p0..p(n-1) via the durable exchange, then
    non-persistent ones into both the durable and the transient queue."""
    ch.confirm_delivery()
    for i in range(n_persistent):
        ch.basic_publish(names["dx"], "rk", ("p%d" % i).encode(), persistent(i), mandatory=True)
    for i in range(3):
        ch.basic_publish(names["dx"], "rk", ("n%d" % i).encode(), pika.BasicProperties(delivery_mode=1),
                         mandatory=True)
        ch.basic_publish(names["tx"], "", ("t%d" % i).encode(), pika.BasicProperties(delivery_mode=2),
                         mandatory=True)
    assert ch.queue_declare(names["dq"], passive=True).method.message_count == n_persistent + 3
    assert ch.queue_declare(names["tq"], passive=True).method.message_count == 3


def assert_gone(conn, kind, name):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
    assert ei.value.reply_code == 404, "%s %s should not survive a restart" % (kind, name)


def assert_recovered(broker, names, expected_bodies, redelivered_bodies):
    conn = broker.connect()
    try:
        ch = conn.channel()
        # durable definitions are back
        ch.exchange_declare(names["dx"], passive=True)
        ok = ch.queue_declare(names["dq"], passive=True)
        assert ok.method.message_count == len(expected_bodies), broker.log_tail()
        # confirmed persistent messages are back, in order, with their properties;
        # non-persistent ones are gone
        msgs = get_all(ch, names["dq"], auto_ack=False)
        assert [b.decode() for _, _, b in msgs] == expected_bodies
        for method, props, body in msgs:
            seq = int(body.decode()[1:])
            assert props.delivery_mode == 2
            assert props.message_id == "p%d" % seq
            assert props.headers == {"seq": seq}
            if body.decode() in redelivered_bodies:
                assert method.redelivered is True, "%s was delivered before the stop" % body
        ch.basic_ack(msgs[-1][0].delivery_tag, multiple=True)

        # the binding is back: routing through the durable exchange still works
        ch.confirm_delivery()
        ch.basic_publish(names["dx"], "rk", b"after-restart", mandatory=True)
        m, _, body = ch.basic_get(names["dq"], auto_ack=True)
        assert body == b"after-restart" and m.redelivered is False
        assert ch.queue_declare(names["dq"], passive=True).method.message_count == 0

        # transient definitions are gone
        assert_gone(conn, "queue", names["tq"])
        assert_gone(conn, "exchange", names["tx"])
    finally:
        safe_close(conn)


def new_names(broker):
    names = {"dx": unique("life-dx"), "dq": unique("life-dq"), "tx": unique("life-tx"), "tq": unique("life-tq")}
    broker.cleanup_names.update(names)
    return names


def test_graceful_restart_keeps_durable_state(broker):
    names = new_names(broker)
    conn = broker.connect()
    try:
        ch = conn.channel()
        declare_topology(ch, names)
        publish_messages(ch, names, 10)
        consumer = conn.channel()
        m0, _, b0 = consumer.basic_get(names["dq"], auto_ack=False)
        consumer.basic_ack(m0.delivery_tag)  # p0 acked: must stay gone
        m1, _, b1 = consumer.basic_get(names["dq"], auto_ack=False)
        m2, _, b2 = consumer.basic_get(names["dq"], auto_ack=False)
        assert (b0, b1, b2) == (b"p0", b"p1", b"p2")
        # round trip so the ack has been processed before the stop
        consumer.queue_declare(names["dq"], passive=True)
    finally:
        broker.stop(signal.SIGTERM)  # p1, p2 stay delivered-but-unacked
        safe_close(conn)

    broker.start()
    assert_recovered(broker, names, ["p%d" % i for i in range(1, 10)], {"p1", "p2"})


def test_crash_restart_keeps_confirmed_persistent_messages(broker):
    names = new_names(broker)
    conn = broker.connect()
    try:
        ch = conn.channel()
        declare_topology(ch, names)
        publish_messages(ch, names, 20)
        consumer = conn.channel()
        delivered = []
        for _ in range(3):
            m, _, body = consumer.basic_get(names["dq"], auto_ack=False)
            delivered.append(body)
        assert delivered == [b"p0", b"p1", b"p2"]
    finally:
        broker.stop(signal.SIGKILL)  # no chance to flush anything
        safe_close(conn)

    broker.start()
    assert_recovered(broker, names, ["p%d" % i for i in range(20)], {"p0", "p1", "p2"})


def test_restart_twice_is_stable(broker):
    names = new_names(broker)
    conn = broker.connect()
    try:
        ch = conn.channel()
        declare_topology(ch, names)
        publish_messages(ch, names, 5)
    finally:
        safe_close(conn)
    broker.stop(signal.SIGTERM)
    broker.start()
    broker.stop(signal.SIGKILL)
    broker.start()
    assert_recovered(broker, names, ["p%d" % i for i in range(5)], set())
