"""Three (or more) real `lepus server` processes on loopback, each with its own data directory
and free ports, for the cluster tests. Every node's log stays under the test's temp directory; a
failing test prints where."""

import json
import os
import sys
import signal
import subprocess
import time

import requests

LEPUS_BIN = os.environ.get("LEPUS_BIN", "target/release/lepus")


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from free_ports import free_port  # noqa: E402  (interop/free_ports.py, shared by the suites)


class Node:
    """One `lepus server` process."""

    def __init__(self, directory, name, seeds, cluster_port, extra=(), stream=False):
        self.name = f"{name}@localhost"
        self.data_dir = os.path.join(directory, name)
        self.log_path = os.path.join(directory, f"{name}.log")
        self.cluster_port = cluster_port
        self.amqp_port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()
        # The stream protocol's listener, advertised on loopback (0: none).
        self.stream_port = free_port() if stream else 0
        self.seeds = seeds
        self.extra = list(extra)
        self.process = None

    def start(self):
        arguments = [
            LEPUS_BIN, "server", "--node-name", self.name, "--data-dir", self.data_dir, "--bind", "127.0.0.1",
            "--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port), "--metrics-port", str(self.metrics_port),
            "--cluster-port", str(self.cluster_port), "--stream-port", str(self.stream_port),
        ]
        if self.stream_port:
            arguments += ["--stream-advertised-host", "127.0.0.1"]
        if self.seeds:
            arguments += ["--cluster-seeds", ",".join(self.seeds)]
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(arguments + self.extra, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_listening(self, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}; log: {self.log_path}")
            try:
                if requests.get(self.api("/overview"), auth=("guest", "guest"), timeout=1).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name} did not answer in {timeout} s; log: {self.log_path}")

    def kill(self, sig=signal.SIGKILL):
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.process.wait(timeout=30)

    def running(self):
        return self.process is not None and self.process.poll() is None

    def api(self, path):
        return f"http://127.0.0.1:{self.http_port}/api{path}"

    def get(self, path, **kwargs):
        return requests.get(self.api(path), auth=("guest", "guest"), timeout=30, **kwargs)

    def put(self, path, body=None):
        return requests.put(self.api(path), auth=("guest", "guest"), json=body or {}, timeout=30)

    def status(self):
        return self.get("/lepus/cluster").json()

    def metrics(self):
        return requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30).text

    def url(self, vhost="%2F"):
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/{vhost}"

    def log(self):
        with open(self.log_path, "rb") as file:
            return file.read().decode(errors="replace")


class Cluster:
    """Nodes started from one seed list. `proxied`: every link runs through a `LinkProxy` (the
    seeds and advertised addresses are its ports), so tests can partition, cut and delay links.
    `streams`: each node listens for the stream protocol on a port of its own."""

    def __init__(self, directory, size=3, proxied=False, streams=False):
        self.directory = directory
        ports = [free_port() for _ in range(size)]
        self.proxy = None
        if proxied:
            from link_proxy import LinkProxy

            self.proxy = LinkProxy()
            proxy_ports = [free_port() for _ in range(size)]
            self.seeds = [f"127.0.0.1:{port}" for port in proxy_ports]
            self.nodes = [Node(directory, f"n{index + 1}", self.seeds, port, ["--cluster-advertise", self.seeds[index]])
                          for index, port in enumerate(ports)]
            for node, proxy_port in zip(self.nodes, proxy_ports):
                self.proxy.add(node.name, proxy_port, node.cluster_port)
        else:
            self.seeds = [f"127.0.0.1:{port}" for port in ports]
            self.nodes = [Node(directory, f"n{index + 1}", self.seeds, port, stream=streams) for index, port in enumerate(ports)]

    def start(self):
        try:
            for node in self.nodes:
                node.start()
            for node in self.nodes:
                node.wait_listening()
            self.wait_formed()
        except BaseException:
            # The fixture never reaches its teardown: the nodes that did start must not outlive it.
            self.stop()
            raise
        return self

    def running(self):
        return [node for node in self.nodes if node.running()]

    def wait_formed(self, timeout=30, expected=None):
        """Until every running node sees a leader and `expected` (default: all running) members running."""
        expected = expected if expected is not None else len(self.running())
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                statuses = [node.status() for node in self.running()]
                last = statuses
                if all(status["member"] and status["metadata"]["leader"] and status["cluster_id"] != "0" * 16
                       and sum(member["running"] for member in status["members"]) == expected for status in statuses):
                    return statuses
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"the cluster did not form in {timeout} s: {json.dumps(last)[:2000]}; logs in {self.directory}")

    def leader(self):
        name = self.running()[0].status()["metadata"]["leader"]
        return next(node for node in self.nodes if node.name == name)

    def stop(self):
        for node in self.nodes:
            node.kill(signal.SIGCONT)
            node.kill(signal.SIGTERM)
        if self.proxy:
            self.proxy.close()


def get_all(node, queue):
    """Every message `queue` has ready, taken with basic.get (auto-ack) through `node`, in order:
    (properties, body) pairs."""
    import pika
    connection = pika.BlockingConnection(pika.URLParameters(node.url()))
    channel = connection.channel()
    got = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((properties, body))
    connection.close()
    return got


def eventually(check, timeout=15, what="condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            result = check()
            if result:
                return result
            last = result
        except Exception as error:  # noqa: BLE001 - retried until the deadline
            last = error
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout} s (last: {last!r})")
