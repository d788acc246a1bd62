"""Shared fixtures and helpers for the Lepus Python (pika) interop suite.

The broker under test comes from ``AMQP_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``).  Every test uses unique names
(``unique('q')``) and cleans up after itself.
"""

import os
import time
import uuid

import pika
import pytest

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
RECEIVE_TIMEOUT = 5.0


def amqp_url_from_env():
    return os.environ.get("AMQP_URL", DEFAULT_URL)


def unique(prefix="lepus-py"):
    """A name no other test (or other suite sharing the broker) uses."""
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def make_params(url=None, **overrides):
    """pika ConnectionParameters for the broker, with bounded timeouts."""
    params = pika.URLParameters(url or amqp_url_from_env())
    params.socket_timeout = 5
    params.stack_timeout = 10
    params.blocked_connection_timeout = 10
    params.connection_attempts = 1
    for key, value in overrides.items():
        setattr(params, key, value)
    return params


def connect(url=None, **overrides):
    return pika.BlockingConnection(make_params(url, **overrides))


def safe_close(conn):
    try:
        if conn is not None and conn.is_open:
            conn.close()
    except Exception:
        pass


def wait_until(predicate, timeout=RECEIVE_TIMEOUT, interval=0.02, conn=None):
    """Poll predicate() until true or timeout; returns the last value.

    When conn is given, pika I/O is serviced while waiting."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        if conn is not None:
            conn.process_data_events(time_limit=interval)
        else:
            time.sleep(interval)


def consume_n(conn, ch, queue, n, timeout=RECEIVE_TIMEOUT, auto_ack=False, ack=False, **kwargs):
    """Start a consumer on queue, collect n deliveries (or stop at timeout).

    Returns (consumer_tag, [(method, properties, body), ...]).  The consumer is
    left running so the caller can assert that no more messages arrive."""
    got = []

    def on_message(channel, method, properties, body):
        got.append((method, properties, body))
        if ack:
            channel.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message, auto_ack=auto_ack, **kwargs)
    wait_until(lambda: len(got) >= n, timeout=timeout, conn=conn)
    return tag, got


def drain_events(conn, seconds):
    """Service pika I/O for a bounded time (used to prove that nothing more arrives)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=min(0.05, max(0.0, deadline - time.monotonic())))


def get_all(ch, queue, auto_ack=True, limit=10000):
    """basic.get until get-empty; returns the list of (method, props, body)."""
    out = []
    for _ in range(limit):
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is None:
            break
        out.append((method, props, body))
    return out


def message_count(queue, ch=None, url=None):
    """Ready-message count of queue via passive declare.

    Uses ch when given (needed for exclusive queues), else a fresh connection."""
    if ch is not None:
        return ch.queue_declare(queue, passive=True).method.message_count
    conn = connect(url)
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        safe_close(conn)


def wait_for_count(queue, expected, ch=None, timeout=RECEIVE_TIMEOUT, url=None):
    """Poll until the queue holds `expected` ready messages; returns the last count seen."""
    last = [None]

    def check():
        last[0] = message_count(queue, ch, url)
        return last[0] == expected

    wait_until(check, timeout=timeout, interval=0.05)
    return last[0]


def exists(kind, name, url=None):
    """True if exchange/queue `name` exists (passive declare on a fresh connection)."""
    conn = connect(url)
    try:
        ch = conn.channel()
        try:
            if kind == "queue":
                ch.queue_declare(name, passive=True)
            else:
                ch.exchange_declare(name, passive=True)
            return True
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code in (404, 405), e
            return e.reply_code == 405
    finally:
        safe_close(conn)


# --------------------------------------------------------------------------
# pytest hooks and fixtures
# --------------------------------------------------------------------------

def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "lepus_only: broker lifecycle test that starts its own Lepus broker; "
        "skipped unless LEPUS_BIN points at the lepus binary")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LEPUS_BIN"):
        return
    skip = pytest.mark.skip(reason="LEPUS_BIN not set (lifecycle tests start their own Lepus broker)")
    for item in items:
        if "lepus_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def amqp_url():
    return amqp_url_from_env()


@pytest.fixture
def names():
    """names('q') -> a unique name."""
    return unique


@pytest.fixture
def cleanup(amqp_url):
    """Register queues/exchanges to delete after the test: cleanup.queue(n), cleanup.exchange(n)."""

    class Registry:
        def __init__(self):
            self.queues = []
            self.exchanges = []

        def queue(self, name):
            self.queues.append(name)
            return name

        def exchange(self, name):
            self.exchanges.append(name)
            return name

    reg = Registry()
    yield reg
    if not (reg.queues or reg.exchanges):
        return
    conn = None
    try:
        conn = connect(amqp_url)
        for kind, items in (("queue", reg.queues), ("exchange", reg.exchanges)):
            for name in items:
                try:
                    ch = conn.channel()
                    if kind == "queue":
                        ch.queue_delete(name)
                    else:
                        ch.exchange_delete(name)
                    ch.close()
                except Exception:
                    if conn is None or not conn.is_open:
                        conn = connect(amqp_url)
    except Exception:
        pass
    finally:
        safe_close(conn)


@pytest.fixture
def connection(amqp_url):
    conn = connect(amqp_url)
    yield conn
    safe_close(conn)


@pytest.fixture
def channel(connection):
    return connection.channel()


@pytest.fixture
def connection_factory(amqp_url):
    """connection_factory(**param_overrides) -> a BlockingConnection closed after the test."""
    made = []

    def factory(**overrides):
        conn = connect(amqp_url, **overrides)
        made.append(conn)
        return conn

    yield factory
    for conn in made:
        safe_close(conn)


@pytest.fixture
def temp_queue(channel):
    """A server-named exclusive queue on the `channel` fixture."""
    return channel.queue_declare("", exclusive=True).method.queue
