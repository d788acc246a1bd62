"""A broker that shuts down closes its clients' connections with 320 CONNECTION_FORCED.

Against Lepus (LEPUS_BIN set) the test starts its own broker and stops it with SIGTERM. Against
RabbitMQ (LEPUS_BIN unset; RABBITMQCTL reaches the node) it runs `rabbitmqctl stop_app`: the same
shutdown of the broker application that `rabbitmqctl stop` runs before the Erlang VM exits (3.10.8
closes every connection with "broker forced connection closure with reason 'shutdown'" either way),
and then `start_app`, so the node stays up for the tests that follow.
"""

import os
import shlex
import signal
import subprocess
import time

import pika
import pytest

from conftest import amqp_url_from_env, connect, safe_close
from test_lifecycle import STOP_TIMEOUT, LepusBroker

SHUTDOWN_TEXT = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
RABBITMQCTL_TIMEOUT_S = 60


def rabbitmqctl():
    """The command prefix that reaches the RabbitMQ node under test, or a failure/skip saying why."""
    command = os.environ.get("RABBITMQCTL")
    if command:
        return shlex.split(command)
    reason = "neither LEPUS_BIN (a Lepus to start) nor RABBITMQCTL (a RabbitMQ node to stop) is set"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def wait_closed_by_broker(conn):
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
    return closed.value


def test_sigterm_closes_clients_with_320_connection_forced(tmp_path):
    binary = os.environ.get("LEPUS_BIN")
    if binary:
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        broker = LepusBroker(binary, data_dir, tmp_path)
        broker.start()
        try:
            conn = broker.connect()
            conn.channel()
            broker.proc.send_signal(signal.SIGTERM)
            closed = wait_closed_by_broker(conn)
            assert (closed.reply_code, closed.reply_text) == (320, SHUTDOWN_TEXT)
            assert broker.proc.wait(STOP_TIMEOUT) == 0, broker.log_tail()
        finally:
            broker.kill()
        return
    command = rabbitmqctl()
    conn = connect()
    try:
        conn.channel()
        stopping = subprocess.Popen(command + ["stop_app"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        closed = wait_closed_by_broker(conn)
        assert (closed.reply_code, closed.reply_text) == (320, SHUTDOWN_TEXT)
        assert stopping.wait(RABBITMQCTL_TIMEOUT_S) == 0, stopping.stderr.read()
    finally:
        safe_close(conn)
        subprocess.run(command + ["start_app"], check=True, capture_output=True, timeout=RABBITMQCTL_TIMEOUT_S)
        wait_until_accepting(amqp_url_from_env())


def wait_until_accepting(url):
    deadline = time.monotonic() + RABBITMQCTL_TIMEOUT_S
    while True:
        try:
            connect(url).close()
            return
        except pika.exceptions.AMQPConnectionError:
            assert time.monotonic() < deadline, "the broker did not accept connections again after start_app"
            time.sleep(0.2)
