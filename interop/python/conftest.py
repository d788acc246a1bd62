"""Shared fixtures and helpers for the Lepus Python (pika) interop suite.

The broker under test comes from ``AMQP_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``).  Every test uses unique names
(``unique('q')``) and cleans up after itself.
"""

import base64
import functools
import json
import os
import shlex
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
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
# which broker, and how to administer it
# --------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def broker_product(url=None):
    """The `product` server property the broker sends in connection.start ("RabbitMQ", "Lepus")."""
    conn = connect(url)
    try:
        return conn._impl.server_properties.get("product")
    finally:
        safe_close(conn)


def broker_is_lepus(url=None):
    """Whether the broker under test says it is Lepus (not whether LEPUS_BIN happens to be set)."""
    return broker_product(url or amqp_url_from_env()) == "Lepus"


class RabbitmqctlAdmin:
    """Users and permissions on a RabbitMQ node through `rabbitmqctl` ($RABBITMQCTL, a command prefix)."""

    def __init__(self, command):
        self.command = shlex.split(command)

    def run(self, *args):
        result = subprocess.run(self.command + list(args), capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            pytest.fail("%s failed (%d): %s%s" % (" ".join(self.command + list(args)), result.returncode,
                                                  result.stdout, result.stderr))
        return result.stdout

    def add_user(self, name, password):
        self.run("add_user", name, password)

    def set_permissions(self, user, configure, write, read, vhost="/"):
        self.run("set_permissions", "-p", vhost, user, configure, write, read)

    def set_topic_permissions(self, user, exchange, write, read, vhost="/"):
        self.run("set_topic_permissions", "-p", vhost, user, exchange, write, read)

    def clear_topic_permissions(self, user, exchange=None, vhost="/"):
        self.run("clear_topic_permissions", "-p", vhost, user, *([exchange] if exchange else []))

    def delete_user(self, name):
        self.run("delete_user", name)


class ManagementApiAdmin:
    """Users and permissions on Lepus through its RabbitMQ-compatible HTTP API.

    $LEPUS_MANAGEMENT_URL is `http://user:password@HOST:PORT/api` (scripts/test.sh); without
    credentials in it, the administrator named in AMQP_URL is used, and without `/api` it is added."""

    def __init__(self, management_url, amqp_url):
        parsed = urllib.parse.urlparse(management_url)
        credentials_from = parsed if parsed.username else urllib.parse.urlparse(amqp_url)
        credentials = "%s:%s" % (urllib.parse.unquote(credentials_from.username or "guest"),
                                 urllib.parse.unquote(credentials_from.password or "guest"))
        self.authorization = "Basic " + base64.b64encode(credentials.encode()).decode()
        path = parsed.path.rstrip("/")
        if not path.endswith("/api"):
            path += "/api"
        self.api_url = "%s://%s:%d%s" % (parsed.scheme, parsed.hostname, parsed.port or 15672, path)

    def request(self, method, path, body=None, missing_ok=False):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.api_url + path, data=data, method=method,
                                         headers={"Authorization": self.authorization,
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            if missing_ok and error.code == 404:
                return error.code
            pytest.fail("%s %s -> %d %s" % (method, path, error.code, error.read()[:500]))
        except urllib.error.URLError as error:
            pytest.fail("management API at %s unreachable: %s" % (self.api_url, error))

    def add_user(self, name, password):
        self.request("PUT", "/users/%s" % urllib.parse.quote(name, safe=""), {"password": password, "tags": ""})

    def set_permissions(self, user, configure, write, read, vhost="/"):
        path = "/permissions/%s/%s" % (urllib.parse.quote(vhost, safe=""), urllib.parse.quote(user, safe=""))
        self.request("PUT", path, {"configure": configure, "write": write, "read": read})

    def set_topic_permissions(self, user, exchange, write, read, vhost="/"):
        path = "/topic-permissions/%s/%s" % (urllib.parse.quote(vhost, safe=""), urllib.parse.quote(user, safe=""))
        self.request("PUT", path, {"exchange": exchange, "write": write, "read": read})

    def clear_topic_permissions(self, user, exchange=None, vhost="/"):
        path = "/topic-permissions/%s/%s" % (urllib.parse.quote(vhost, safe=""), urllib.parse.quote(user, safe=""))
        if exchange:
            path += "/" + urllib.parse.quote(exchange, safe="")
        # 404 when the user has none left there; rabbitmqctl's clear succeeds then too.
        self.request("DELETE", path, missing_ok=True)

    def delete_user(self, name):
        self.request("DELETE", "/users/%s" % urllib.parse.quote(name, safe=""))


def broker_admin(url=None):
    """How to manage users on the broker under test: rabbitmqctl for RabbitMQ, the HTTP API for Lepus.

    Fails (never skips) when the variable for the broker in use is missing, so a run that
    silently tests nothing is impossible."""
    url = url or amqp_url_from_env()
    if broker_is_lepus(url):
        base_url = os.environ.get("LEPUS_MANAGEMENT_URL")
        if not base_url:
            pytest.fail("the broker is Lepus: set LEPUS_MANAGEMENT_URL (e.g. http://guest:guest@127.0.0.1:15672/api) "
                        "so the test can create users and permissions")
        return ManagementApiAdmin(base_url, url)
    command = os.environ.get("RABBITMQCTL")
    if not command:
        pytest.fail("the broker is %r: set RABBITMQCTL (e.g. 'rabbitmqctl -n node@localhost') "
                    "so the test can create users and permissions" % broker_product(url))
    return RabbitmqctlAdmin(command)


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
