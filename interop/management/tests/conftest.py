"""Fixtures for the Lepus management suite.

Two ways to run it:
- `LEPUS_BIN` set: each broker is a `lepus server` started by the suite on free ports (AMQP,
  management HTTP API, metrics) with its own data directory.
- `LEPUS_BIN` unset, `MANAGEMENT_URL` (http://guest:guest@HOST:PORT/api) and `AMQP_URL` set: the
  suite runs against that running broker, which is how scripts/rabbitmq-reference.sh runs it against
  RabbitMQ with its management plugin. A "fresh" broker is then that broker emptied through its own
  API of everything but its defaults, and a restart goes through `RABBITMQCTL` (stop_app, start_app).

Tests that only Lepus can pass are marked `lepus_only(reason)` and skip, with the reason, when the
broker's /api/overview does not name Lepus as its product.
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
import uuid

import pika
import pytest
import requests

START_TIMEOUT_S = 15
# RabbitMQ's start_app brings back the broker and its management plugin within seconds; this bounds it.
RESTART_TIMEOUT_S = 60
STOP_TIMEOUT_S = 10
HTTP_TIMEOUT_S = 10


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from free_ports import free_port  # noqa: E402  (interop/free_ports.py, shared by the suites)


def unique(prefix="mgmt"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def parse_prometheus_text(text):
    """Samples of the Prometheus text format (and OpenMetrics) as {(name, frozenset(labels)): value}."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        labels = frozenset()
        name = name_labels
        if "{" in name_labels:
            name, rest = name_labels.split("{", 1)
            pairs = [pair for pair in rest.rstrip("}").split(",") if pair]
            labels = frozenset(tuple(part.strip('"') for part in pair.split("=", 1)) for pair in pairs)
        samples[(name, labels)] = float(value)
    return samples


class Broker:
    """Clients for one running broker: the management API with requests, AMQP with pika."""

    amqp_port = http_port = metrics_port = None
    auth = ("guest", "guest")
    host = "127.0.0.1"

    @property
    def api(self):
        return "http://%s:%d/api" % (self.host, self.http_port)

    @property
    def metrics_url(self):
        return "http://%s:%d/metrics" % (self.host, self.metrics_port)

    def metrics(self, path="", params=None):
        """Prometheus samples of /metrics (or /metrics/PATH) as {(name, frozenset(labels)): value}."""
        if self.metrics_port is None:
            pytest.skip("the broker's metrics endpoint is unknown (set METRICS_URL)")
        response = requests.get(self.metrics_url + path, params=params, timeout=HTTP_TIMEOUT_S)
        assert response.status_code == 200, (path, response.status_code, response.text[:200])
        return parse_prometheus_text(response.text)

    def url(self, path):
        return self.api + path

    def get(self, path, **kwargs):
        kwargs.setdefault("auth", self.auth)
        return requests.get(self.url(path), timeout=HTTP_TIMEOUT_S, **kwargs)

    def put(self, path, body=None, **kwargs):
        kwargs.setdefault("auth", self.auth)
        return requests.put(self.url(path), json=body if body is not None else {}, timeout=HTTP_TIMEOUT_S, **kwargs)

    def post(self, path, body=None, **kwargs):
        kwargs.setdefault("auth", self.auth)
        return requests.post(self.url(path), json=body if body is not None else {}, timeout=HTTP_TIMEOUT_S, **kwargs)

    def delete(self, path, **kwargs):
        kwargs.setdefault("auth", self.auth)
        return requests.delete(self.url(path), timeout=HTTP_TIMEOUT_S, **kwargs)

    def connect(self):
        params = pika.ConnectionParameters(self.host, self.amqp_port, credentials=pika.PlainCredentials(*self.auth),
                                           socket_timeout=5, stack_timeout=10, blocked_connection_timeout=10,
                                           connection_attempts=1)
        return pika.BlockingConnection(params)

    def product_name(self):
        return self.get("/overview").json().get("product_name")

    def wait_for_api(self, timeout_s, process=None):
        deadline = time.monotonic() + timeout_s
        while True:
            if process is not None and process.poll() is not None:
                raise RuntimeError("the broker exited with %s" % process.returncode)
            try:
                if requests.get(self.url("/overview"), auth=self.auth, timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the broker did not serve its HTTP API within %ss" % timeout_s)
            time.sleep(0.05)



class Lepus(Broker):
    """One `lepus server` process started by the suite, on free ports and its own data directory."""

    is_lepus = True

    def __init__(self, binary, data_dir, extra_args=()):
        self.binary, self.data_dir, self.extra_args = binary, data_dir, list(extra_args)
        self.log = None
        self.start()

    def start(self):
        self.amqp_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log = open(os.path.join(os.path.dirname(str(self.data_dir)), "lepus-%d.log" % self.amqp_port), "wb")
        self.process = subprocess.Popen(
            [self.binary, "server", "--data-dir", str(self.data_dir), "--amqp-port", str(self.amqp_port),
             "--http-port", str(self.http_port), "--metrics-port", str(self.metrics_port), "--bind", "127.0.0.1",
             *self.extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self.wait_for_api(START_TIMEOUT_S, self.process)
        except RuntimeError:
            self.stop()
            raise

    def restart(self):
        """Stops the broker gracefully and starts it again on the same data directory."""
        self.stop()
        self.start()

    def reset(self):
        """A broker the suite started for one test is already fresh."""

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)
        self.log.close()


class RunningBroker(Broker):
    """A broker the suite did not start (the RabbitMQ reference node), from MANAGEMENT_URL and AMQP_URL."""

    def __init__(self, management_url, amqp_url):
        management = urllib.parse.urlparse(management_url)
        amqp = urllib.parse.urlparse(amqp_url)
        self.host = management.hostname
        self.http_port = management.port
        self.amqp_port = amqp.port or 5672
        metrics = os.environ.get("METRICS_URL")
        if metrics:
            self.metrics_port = urllib.parse.urlparse(metrics).port
        if management.username:
            self.auth = (urllib.parse.unquote(management.username), urllib.parse.unquote(management.password or ""))
        self.wait_for_api(START_TIMEOUT_S)
        self.is_lepus = self.product_name() == "Lepus"

    def stop(self):
        """The broker outlives the suite."""

    def restart(self):
        """Restarts the broker application through RABBITMQCTL (stop_app, start_app), which keeps
        durable definitions and persistent messages as a node restart does."""
        command = os.environ.get("RABBITMQCTL")
        if not command:
            pytest.fail("RABBITMQCTL is not set: this test restarts the broker and needs a command that reaches its node")
        for action in ("stop_app", "start_app"):
            subprocess.run(shlex.split(command) + [action], check=True, capture_output=True, timeout=RESTART_TIMEOUT_S)
        self.wait_for_api(RESTART_TIMEOUT_S)
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while True:
            try:
                self.connect().close()
                return
            except pika.exceptions.AMQPConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def reset(self):
        """Empties the broker of everything a fresh one lacks: connections are left alone (other
        suites' clients are closed by then); users other than guest, vhosts other than /, policies,
        queues and exchanges other than the defaults are deleted through the API."""
        for user in self.get("/users").json():
            if user["name"] != self.auth[0]:
                self.delete("/users/" + quote(user["name"]))
        for vhost in self.get("/vhosts").json():
            if vhost["name"] != "/":
                self.delete("/vhosts/" + quote(vhost["name"]))
        for policy in self.get("/policies").json():
            self.delete("/policies/%s/%s" % (quote(policy["vhost"]), quote(policy["name"])))
        for queue in self.get("/queues/%2F").json():
            self.delete("/queues/%2F/" + quote(queue["name"]))
        for exchange in self.get("/exchanges/%2F").json():
            if exchange["name"] and not exchange["name"].startswith("amq."):
                self.delete("/exchanges/%2F/" + quote(exchange["name"]))
        assert self.put("/permissions/%2F/" + quote(self.auth[0]), {"configure": ".*", "write": ".*", "read": ".*"}).ok


WAIT_S = 15


def publish_twelve_body_bytes_and_hold_three(channel, queue):
    """Publishes bodies of 3, 5 and 4 bytes (with a 50-byte header, which byte counts leave out)
    with confirms, and fetches the first unacked: 9 body bytes ready, 3 unacked. Returns the
    fetched message's delivery tag."""
    channel.confirm_delivery()
    for body in (b"abc", b"defgh", b"ijkl"):
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, headers={"h": "x" * 50}))
    method, _, body = channel.basic_get(queue, auto_ack=False)
    assert body == b"abc"
    return method.delivery_tag


def wait_for(predicate, timeout=WAIT_S):
    """predicate()'s first true value, or its last value after `timeout` seconds. RabbitMQ's API
    shows some fields (consumers, policy, messages, channels) only once its statistics have been
    collected (every collect_statistics_interval), so the tests wait for them rather than read once."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def quote(text):
    return urllib.parse.quote(text, safe="")


def lepus_binary():
    binary = os.environ.get("LEPUS_BIN")
    if not binary:
        pytest.skip("LEPUS_BIN not set: this test starts its own Lepus brokers")
    return binary


def running_broker():
    """The broker named by MANAGEMENT_URL and AMQP_URL when the suite is not to start its own."""
    if os.environ.get("LEPUS_BIN"):
        return None
    management_url = os.environ.get("MANAGEMENT_URL")
    if not management_url:
        pytest.fail("set LEPUS_BIN (the suite starts Lepus brokers) or MANAGEMENT_URL and AMQP_URL (a running broker)")
    return RunningBroker(management_url, os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))


@pytest.fixture(scope="session")
def shared_running_broker():
    broker = running_broker()
    yield broker
    if broker is not None:
        # Leave the node as the other suites found it.
        broker.reset()


@pytest.fixture(scope="session")
def lepus(tmp_path_factory, shared_running_broker):
    if shared_running_broker is not None:
        yield shared_running_broker
        return
    broker = Lepus(lepus_binary(), tmp_path_factory.mktemp("lepus-a") / "data")
    yield broker
    broker.stop()


@pytest.fixture
def fresh_lepus(tmp_path_factory, shared_running_broker):
    if shared_running_broker is not None:
        shared_running_broker.reset()
        yield shared_running_broker
        return
    broker = Lepus(lepus_binary(), tmp_path_factory.mktemp("lepus-fresh") / "data")
    yield broker
    broker.stop()


@pytest.fixture
def restartable_broker(tmp_path_factory, shared_running_broker):
    """A fresh broker that the test may restart (`broker.restart()`) with its data kept."""
    if shared_running_broker is not None:
        shared_running_broker.reset()
        yield shared_running_broker
        return
    broker = Lepus(lepus_binary(), tmp_path_factory.mktemp("lepus-restart") / "data")
    yield broker
    broker.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "lepus_only(reason): a test of what only Lepus has; skipped, with the "
                                       "reason, against a broker whose /api/overview names another product")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LEPUS_BIN") or not os.environ.get("MANAGEMENT_URL"):
        return
    broker = RunningBroker(os.environ["MANAGEMENT_URL"], os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    if broker.is_lepus:
        return
    for item in items:
        marker = item.get_closest_marker("lepus_only")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason="Lepus only (the broker is %s): %s" % (broker.product_name(), marker.args[0])))


@pytest.fixture(scope="session")
def rabbitmqadmin(shared_running_broker, tmp_path_factory):
    """A command list that runs rabbitmqadmin (stdlib-only Python) with this interpreter: the one a
    running RabbitMQ serves at /cli/rabbitmqadmin, else $RABBITMQADMIN, on PATH, or from Debian's
    rabbitmq-server package (interop/management/run.sh installs it when it can)."""
    if shared_running_broker is not None and not shared_running_broker.is_lepus:
        response = requests.get("http://%s:%d/cli/rabbitmqadmin" % (shared_running_broker.host, shared_running_broker.http_port),
                                timeout=HTTP_TIMEOUT_S)
        assert response.status_code == 200, "RabbitMQ serves no rabbitmqadmin: %s" % response.status_code
        path = tmp_path_factory.mktemp("rabbitmqadmin") / "rabbitmqadmin"
        path.write_bytes(response.content)
        return [sys.executable, str(path)]
    candidates = [os.environ.get("RABBITMQADMIN"), shutil.which("rabbitmqadmin")]
    candidates += sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*/priv/www/cli/rabbitmqadmin"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate):
            return [sys.executable, candidate]
    reason = "rabbitmqadmin not found (install Debian's rabbitmq-server or set RABBITMQADMIN)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason + "; in CI this is a failure")
    pytest.skip(reason)


@pytest.fixture
def names():
    return unique
