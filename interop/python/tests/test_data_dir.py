"""Start-up refusals with real processes (Lepus only: they start brokers of their own and look at
their data directories and exit codes, which a shared RabbitMQ node does not expose).

- One broker per data directory: a second `lepus server` on a running broker's `--data-dir` exits
  non-zero naming the holder's pid, and the running broker keeps serving and keeps every message
  it confirmed, through a kill -9 and a restart (whose lock, left by the killed process, does not
  block it).
- Every configured listener (AMQP, AMQPS, HTTP, HTTPS, metrics) whose port is taken stops the
  start with a message naming the listener and its address, before the data directory is read or
  written (only the lock file is there).
"""

import os
import socket
import subprocess

import pika
import pytest

from conftest import safe_close
from test_lifecycle import LepusBroker, free_port

pytestmark = pytest.mark.lepus_only

EXIT_TIMEOUT_S = 20
MESSAGES = 50
LOCK_FILE = "lepus.lock"


def run_server(data_dir, *arguments):
    """Runs `lepus server` expected to refuse to start; returns (exit code, stderr)."""
    command = [os.environ["LEPUS_BIN"], "server", "--data-dir", str(data_dir), "--bind", "127.0.0.1", *arguments]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail("lepus server did not exit within %ds: it started where it should have refused:\n%s"
                    % (EXIT_TIMEOUT_S, (expired.stderr or b"")[-3000:]))
    return result.returncode, result.stderr


def publish_confirmed(connection, queue, prefix, count):
    channel = connection.channel()
    channel.confirm_delivery()
    bodies = []
    for number in range(count):
        body = ("%s-%d" % (prefix, number)).encode()
        # Returns once the broker's basic.ack arrived: the message is on disk.
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        bodies.append(body)
    channel.close()
    return bodies


def test_a_second_broker_on_the_same_data_dir_is_refused_and_the_first_keeps_its_messages(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    first = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    first.start()
    connection = None
    try:
        connection = first.connect()
        connection.channel().queue_declare("shared-dir-q", durable=True)
        confirmed = publish_confirmed(connection, "shared-dir-q", "before", MESSAGES)

        code, stderr = run_server(data_dir, "--amqp-port", str(free_port()), "--http-port", "0", "--metrics-port", "0")
        assert code != 0, stderr
        expected = "data directory %s is in use by process %d" % (data_dir, first.proc.pid)
        assert expected in stderr, stderr

        # The first broker did not notice: it still confirms, and nothing it confirmed is lost.
        confirmed += publish_confirmed(connection, "shared-dir-q", "after", MESSAGES)
        assert first.proc.poll() is None, first.log_tail()
        safe_close(connection)
        connection = None
        first.kill()  # SIGKILL: the kernel drops the flock, the lock file stays behind.
        assert (data_dir / LOCK_FILE).exists(), "the lock file is kept (deleting it would race)"

        first.start()  # The killed process's lock file must not block this.
        connection = first.connect()
        channel = connection.channel()
        recovered = []
        while True:
            method, _, body = channel.basic_get("shared-dir-q", auto_ack=True)
            if method is None:
                break
            recovered.append(body)
        assert recovered == confirmed, "lost %d of %d confirmed messages" % (len(set(confirmed) - set(recovered)), len(confirmed))
        with open(data_dir / LOCK_FILE) as file:
            assert file.read().strip() == str(first.proc.pid), "the lock file names the new holder"
    finally:
        safe_close(connection)
        first.kill()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate and its key: enough for the TLS listeners to be configured."""
    directory = tmp_path_factory.mktemp("tls")
    certificate, key = str(directory / "server.pem"), str(directory / "server.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", certificate, "-days", "2", "-subj", "/CN=localhost"],
                   check=True, capture_output=True, timeout=60)
    return certificate, key


LISTENERS = [
    # (flag, name in the message, needs TLS)
    ("--amqp-port", "AMQP", False),
    ("--amqps-port", "AMQPS (AMQP over TLS)", True),
    ("--http-port", "the management HTTP API", False),
    ("--https-port", "the management HTTPS API", True),
    ("--metrics-port", "Prometheus metrics", False),
]


@pytest.mark.parametrize("flag,name,tls", LISTENERS, ids=[flag[2:] for flag, _, _ in LISTENERS])
def test_a_listener_whose_port_is_taken_stops_the_start_before_storage(tmp_path, certificate, flag, name, tls):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        taken_port = taken.getsockname()[1]
        ports = {"--amqp-port": free_port(), "--amqps-port": free_port(), "--http-port": free_port(),
                 "--https-port": free_port(), "--metrics-port": free_port()}
        ports[flag] = taken_port
        arguments = [argument for pair in ports.items() for argument in (pair[0], str(pair[1]))]
        if tls:
            arguments += ["--tls-cert-file", certificate[0], "--tls-key-file", certificate[1]]
        data_dir = tmp_path / "data"
        code, stderr = run_server(data_dir, *arguments)
    assert code != 0, stderr
    expected = "cannot listen on 127.0.0.1:%d for %s (%s)" % (taken_port, name, flag)
    assert expected in stderr, stderr
    # Nothing was recovered, replayed or created: storage was not touched.
    assert sorted(os.listdir(data_dir)) == [LOCK_FILE], sorted(os.listdir(data_dir))
