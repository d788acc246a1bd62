"""`lepus ctl` with rabbitmqctl's and rabbitmq-diagnostics' habits. Each comparable test runs the same
command line against the broker under test: `lepus ctl --url ...` against Lepus, and
`rabbitmqctl -n NODE` / `rabbitmq-diagnostics -n NODE` (from RABBITMQCTL) against the RabbitMQ
reference node, and checks both answers the same way (JSON output, exit codes)."""

import json
import os
import shlex
import socket
import subprocess

import pytest

from conftest import wait_for

RUN_TIMEOUT_S = 60
EX_USAGE, EX_UNAVAILABLE, EX_NOPERM = 64, 69, 77


def rabbitmq_command(tool):
    """RABBITMQCTL ("rabbitmqctl -n NODE") with its tool swapped for `tool` (rabbitmq-diagnostics)."""
    command = os.environ.get("RABBITMQCTL")
    if not command:
        pytest.fail("RABBITMQCTL is not set: the ctl tests run rabbitmqctl against the RabbitMQ node")
    words = shlex.split(command)
    words[0] = os.path.join(os.path.dirname(words[0]), tool)
    return words


def run(broker, tool, *args, expect=0):
    """Runs one command against `broker` (lepus ctl for Lepus, the RabbitMQ tool otherwise)."""
    if getattr(broker, "is_lepus", False) and os.environ.get("LEPUS_BIN"):
        command = [os.environ["LEPUS_BIN"], "ctl", "--url", "127.0.0.1:%d" % broker.http_port]
    else:
        command = rabbitmq_command(tool)
    result = subprocess.run(command + list(args), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if expect is not None:
        assert result.returncode == expect, (args, result.returncode, result.stdout, result.stderr)
    return result


def ctl_json(broker, *args):
    return json.loads(run(broker, "rabbitmqctl", *args, "--formatter", "json").stdout)


def test_list_commands_select_columns_as_rabbitmqctl(fresh_lepus, names):
    broker = fresh_lepus
    queue, exchange = names("ctl-q"), names("ctl-ex")
    assert broker.put("/queues/%2F/" + queue, {"durable": True, "arguments": {"x-max-length": 10}}).status_code == 201
    assert broker.put("/exchanges/%2F/" + exchange, {"type": "topic", "durable": True}).status_code == 201
    assert broker.post("/bindings/%%2F/e/%s/q/%s" % (exchange, queue), {"routing_key": "a.#"}).status_code == 201
    published = broker.post("/exchanges/%2F/amq.default/publish",
                            {"routing_key": queue, "payload": "m", "payload_encoding": "string", "properties": {}})
    assert published.json()["routed"] is True

    def queue_row():
        rows = ctl_json(broker, "list_queues", "name", "messages", "consumers", "durable", "arguments")
        return [row for row in rows if row["name"] == queue and row["messages"] == 1]

    assert wait_for(queue_row) == [{"name": queue, "messages": 1, "consumers": 0, "durable": True,
                                    "arguments": [["x-max-length", "long", 10]]}]
    # Default columns: name and messages.
    assert {"name": queue, "messages": 1} in ctl_json(broker, "list_queues")
    assert {"name": exchange, "type": "topic"} in ctl_json(broker, "list_exchanges")
    assert {"source_name": exchange, "source_kind": "exchange", "destination_name": queue, "destination_kind": "queue",
            "routing_key": "a.#", "arguments": []} in ctl_json(broker, "list_bindings")
    assert {"user": "guest", "tags": ["administrator"]} in ctl_json(broker, "list_users")
    assert {"name": "/"} in ctl_json(broker, "list_vhosts")
    assert {"user": "guest", "configure": ".*", "write": ".*", "read": ".*"} in ctl_json(broker, "list_permissions", "-p", "/")
    # The table is tab-separated with a header line, as `rabbitmqctl -q` prints it.
    table = run(broker, "rabbitmqctl", "-q", "list_queues", "name", "messages").stdout.splitlines()
    assert table[0] == "name\tmessages" and "%s\t1" % queue in table
    unknown = run(broker, "rabbitmqctl", "list_queues", "no_such_column", expect=EX_USAGE)
    assert "no_such_column" in unknown.stdout + unknown.stderr


def test_consumers_connections_and_channels_are_listed(fresh_lepus, names):
    broker = fresh_lepus
    queue = names("ctl-cq")
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.basic_qos(prefetch_count=7)
        tag = channel.basic_consume(queue, lambda *args: None)

        def consumer_rows():
            rows = ctl_json(broker, "list_consumers", "queue_name", "consumer_tag", "ack_required", "prefetch_count", "active")
            return [row for row in rows if row["queue_name"] == queue]

        assert wait_for(consumer_rows) == [{"queue_name": queue, "consumer_tag": tag, "ack_required": True,
                                            "prefetch_count": 7, "active": True}]
        # peer_host is left out: RabbitMQ on [::] reports an IPv4-mapped address as a list of numbers.
        connections = wait_for(lambda: ctl_json(broker, "list_connections", "user", "state"))
        assert {"user": "guest", "state": "running"} in connections
        channels = wait_for(lambda: [row for row in ctl_json(broker, "list_channels", "user", "consumer_count")
                                     if row["consumer_count"] == 1])
        assert channels == [{"user": "guest", "consumer_count": 1}]
    finally:
        connection.close()


def test_purge_and_delete_queue(fresh_lepus, names):
    broker = fresh_lepus
    queue = names("ctl-pq")
    assert broker.put("/queues/%2F/" + queue, {"durable": False}).status_code == 201
    for body in ("a", "b"):
        broker.post("/exchanges/%2F/amq.default/publish",
                    {"routing_key": queue, "payload": body, "payload_encoding": "string", "properties": {}})
    assert wait_for(lambda: {"name": queue, "messages": 2} in ctl_json(broker, "list_queues"))
    run(broker, "rabbitmqctl", "purge_queue", queue)
    assert wait_for(lambda: {"name": queue, "messages": 0} in ctl_json(broker, "list_queues"))
    run(broker, "rabbitmqctl", "delete_queue", queue)
    assert broker.get("/queues/%2F/" + queue).status_code == 404
    # rabbitmqctl's exit codes for a queue that does not exist.
    run(broker, "rabbitmqctl", "purge_queue", queue, expect=EX_UNAVAILABLE)
    run(broker, "rabbitmqctl", "delete_queue", queue, expect=EX_USAGE)


def test_diagnostics_ping_alarms_ports_status(lepus):
    broker = lepus
    assert run(broker, "rabbitmq-diagnostics", "ping", "--formatter", "json").stdout.strip() == '{"message":"Ping succeeded"}'
    assert json.loads(run(broker, "rabbitmq-diagnostics", "check_alarms", "--formatter", "json").stdout) == {"result": "ok"}
    ports = json.loads(run(broker, "rabbitmq-diagnostics", "check_port_connectivity", "--formatter", "json").stdout)
    assert ports["result"] == "ok"
    listed = {(listener["protocol"], listener["port"]) for listener in ports["listeners"]}
    assert ("amqp", broker.amqp_port) in listed and ("http", broker.http_port) in listed
    status = json.loads(run(broker, "rabbitmqctl", "status", "--formatter", "json").stdout)
    assert status["alarms"] == []
    assert status["disk_free"] > 0 and status["disk_free_limit"] > 0
    assert status["vm_memory_high_watermark_limit"] > 0
    assert status["memory"]["total"]["rss"] > 0
    assert ("amqp", broker.amqp_port) in {(listener["protocol"], listener["port"]) for listener in status["listeners"]}
    assert status["totals"]["virtual_host_count"] >= 1
    run(broker, "rabbitmqctl", "await_startup", "--timeout", "10")


@pytest.mark.lepus_only("lepus ctl's own status lines, errors and spellings")
def test_ctl_errors_say_what_to_do(lepus, names):
    binary = os.environ["LEPUS_BIN"]

    def ctl(url, *args):
        return subprocess.run([binary, "ctl", "--url", url] + list(args), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)

    status = ctl("127.0.0.1:%d" % lepus.http_port, "status").stdout
    for line in ("memory_alarm: false", "disk_free_alarm: false", "memory_high_watermark_bytes: ",
                 "listener: interface 127.0.0.1, port %d, protocol amqp" % lepus.amqp_port):
        assert line in status, status
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    stopped = ctl("http://127.0.0.1:%d" % closed_port, "list_queues")
    assert stopped.returncode == EX_UNAVAILABLE
    assert "no broker answers at http://127.0.0.1:%d; is it running? use --url" % closed_port in stopped.stderr
    amqp = ctl("http://127.0.0.1:%d" % lepus.amqp_port, "ping")
    assert amqp.returncode == EX_UNAVAILABLE and "answers AMQP, not HTTP: point --url at the management port" in amqp.stderr
    refused = subprocess.run([binary, "ctl", "--url", "127.0.0.1:%d" % lepus.http_port, "--password", "wrong", "ping"],
                             capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert refused.returncode == EX_NOPERM and "401" in refused.stderr
    assert ctl("127.0.0.1:%d" % lepus.http_port, "no_such_command").returncode == EX_USAGE
    queue = names("ctl-spelling")
    assert lepus.put("/queues/%2F/" + queue, {"durable": False}).status_code == 201
    for spelling in (["list_queues"], ["list-queues"], ["list", "queues"]):
        assert queue in ctl("127.0.0.1:%d" % lepus.http_port, *spelling, "name").stdout.split("\n"), spelling
    timed_out = ctl("http://127.0.0.1:%d" % closed_port, "await_startup", "--timeout", "1")
    assert timed_out.returncode == 75, (timed_out.returncode, timed_out.stderr)
