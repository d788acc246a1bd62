"""Fixtures for the Lepus management suite: each broker is a `lepus server` started by the suite
on free ports (AMQP, management HTTP API, metrics) with its own data directory."""

import glob
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pika
import pytest
import requests

START_TIMEOUT_S = 15
STOP_TIMEOUT_S = 10
HTTP_TIMEOUT_S = 10


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unique(prefix="mgmt"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


class Lepus:
    """One running broker and clients for it."""

    def __init__(self, binary, data_dir, extra_args=()):
        self.amqp_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.data_dir = data_dir
        self.log = open(os.path.join(os.path.dirname(str(data_dir)), "lepus-%d.log" % self.amqp_port), "wb")
        self.process = subprocess.Popen(
            [binary, "server", "--data-dir", str(data_dir), "--amqp-port", str(self.amqp_port),
             "--http-port", str(self.http_port), "--metrics-port", str(self.metrics_port), "--bind", "127.0.0.1", *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.api = "http://127.0.0.1:%d/api" % self.http_port
        self.metrics_url = "http://127.0.0.1:%d/metrics" % self.metrics_port
        self.auth = ("guest", "guest")
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("lepus exited with %s" % self.process.returncode)
            try:
                if requests.get(self.api + "/overview", auth=self.auth, timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("lepus did not serve its HTTP API within %ss" % START_TIMEOUT_S)
            time.sleep(0.05)

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
        params = pika.ConnectionParameters("127.0.0.1", self.amqp_port, credentials=pika.PlainCredentials("guest", "guest"),
                                           socket_timeout=5, stack_timeout=10, blocked_connection_timeout=10,
                                           connection_attempts=1)
        return pika.BlockingConnection(params)

    def metrics(self):
        """The metrics as {(name, frozenset(labels)): value}."""
        response = requests.get(self.metrics_url, timeout=HTTP_TIMEOUT_S)
        assert response.status_code == 200
        samples = {}
        for line in response.text.splitlines():
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

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)
        self.log.close()


def lepus_binary():
    binary = os.environ.get("LEPUS_BIN")
    if not binary:
        pytest.skip("LEPUS_BIN not set (this suite starts its own Lepus brokers)")
    return binary


@pytest.fixture(scope="session")
def lepus(tmp_path_factory):
    broker = Lepus(lepus_binary(), tmp_path_factory.mktemp("lepus-a") / "data")
    yield broker
    broker.stop()


@pytest.fixture
def fresh_lepus(tmp_path_factory):
    broker = Lepus(lepus_binary(), tmp_path_factory.mktemp("lepus-fresh") / "data")
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def rabbitmqadmin():
    """A command list that runs rabbitmqadmin (stdlib-only Python) with this interpreter."""
    candidates = [os.environ.get("RABBITMQADMIN"), shutil.which("rabbitmqadmin")]
    candidates += sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*/priv/www/cli/rabbitmqadmin"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate):
            return [sys.executable, candidate]
    pytest.skip("rabbitmqadmin not found (install Debian's rabbitmq-server or set RABBITMQADMIN)")


@pytest.fixture
def names():
    return unique
