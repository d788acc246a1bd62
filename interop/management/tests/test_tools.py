"""rabbitmqadmin and `lepus ctl` against Lepus, and definitions moved between two brokers."""

import json
import os
import subprocess
import urllib.parse

import pika
import pytest

from conftest import wait_for

RUN_TIMEOUT_S = 30


def q(text):
    return urllib.parse.quote(text, safe="")


def admin(lepus, rabbitmqadmin, *args):
    command = rabbitmqadmin + ["-H", "127.0.0.1", "-P", str(lepus.http_port), "-u", "guest", "-p", "guest"] + list(args)
    result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def ctl(lepus, *args, check=True):
    command = [os.environ["LEPUS_BIN"], "ctl", "--url", "http://127.0.0.1:%d" % lepus.http_port] + list(args)
    result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if check:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def test_rabbitmqadmin(lepus, rabbitmqadmin, names):
    queue, exchange = names("adm-q"), names("adm-ex")
    admin(lepus, rabbitmqadmin, "declare", "queue", "name=" + queue, "durable=false")
    admin(lepus, rabbitmqadmin, "declare", "exchange", "name=" + exchange, "type=fanout")
    admin(lepus, rabbitmqadmin, "declare", "binding", "source=" + exchange, "destination=" + queue)
    admin(lepus, rabbitmqadmin, "publish", "exchange=" + exchange, "routing_key=any", "payload=from rabbitmqadmin")
    def listed():
        return json.loads(admin(lepus, rabbitmqadmin, "-f", "raw_json", "list", "queues", "name", "messages"))

    assert wait_for(lambda: {"name": queue, "messages": 1} in listed()), listed()
    table = admin(lepus, rabbitmqadmin, "list", "queues")
    assert queue in table
    assert exchange in admin(lepus, rabbitmqadmin, "list", "exchanges")
    assert exchange in admin(lepus, rabbitmqadmin, "list", "bindings")
    got = json.loads(admin(lepus, rabbitmqadmin, "-f", "raw_json", "get", "queue=" + queue, "ackmode=ack_requeue_false"))
    assert got[0]["payload"] == "from rabbitmqadmin" and got[0]["exchange"] == exchange
    admin(lepus, rabbitmqadmin, "show", "overview")
    admin(lepus, rabbitmqadmin, "list", "connections")
    admin(lepus, rabbitmqadmin, "list", "nodes")
    admin(lepus, rabbitmqadmin, "list", "vhosts")
    conn = lepus.connect()
    try:
        ch = conn.channel()
        assert ch.queue_declare(queue, passive=True).method.message_count == 0
    finally:
        conn.close()
    admin(lepus, rabbitmqadmin, "delete", "exchange", "name=" + exchange)
    admin(lepus, rabbitmqadmin, "delete", "queue", "name=" + queue)
    assert lepus.get("/queues/%2F/" + q(queue)).status_code == 404


@pytest.mark.lepus_only("lepus ctl export-definitions and import-definitions")
def test_definitions_move_to_a_fresh_broker(lepus, fresh_lepus, names, tmp_path):
    exchange, queue, target = names("def-ex"), names("def-q"), names("def-ex2")
    conn = lepus.connect()
    try:
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", durable=True, arguments={"alternate-exchange": "amq.fanout"})
        ch.exchange_declare(target, "headers", durable=True)
        ch.queue_declare(queue, durable=True, arguments={"x-max-length": 100, "x-message-ttl": 60000})
        ch.queue_bind(queue, exchange, "orders.#")
        ch.exchange_bind(target, exchange, "audit.*")
    finally:
        conn.close()
    path = tmp_path / "definitions.json"
    ctl(lepus, "export-definitions", str(path))
    exported = json.loads(path.read_text())
    assert any(e["name"] == exchange and e["type"] == "topic" for e in exported["exchanges"])
    assert any(item["name"] == queue and item["arguments"]["x-max-length"] == 100 for item in exported["queues"])
    assert not any(e["name"].startswith("amq.") or e["name"] == "" for e in exported["exchanges"])
    assert exported["users"][0]["hashing_algorithm"] == "rabbit_password_hashing_sha256"

    ctl(fresh_lepus, "import-definitions", str(path))
    imported = fresh_lepus.get("/queues/%2F/" + q(queue)).json()
    assert imported["durable"] is True and imported["arguments"] == {"x-max-length": 100, "x-message-ttl": 60000}
    bindings = fresh_lepus.get("/bindings/%%2F/e/%s/q/%s" % (q(exchange), q(queue))).json()
    assert [b["routing_key"] for b in bindings] == ["orders.#"]
    e2e = fresh_lepus.get("/bindings/%%2F/e/%s/e/%s" % (q(exchange), q(target))).json()
    assert [b["routing_key"] for b in e2e] == ["audit.*"]
    conn = fresh_lepus.connect()
    try:
        ch = conn.channel()
        # Same declarations as on the first broker: equivalent, so no channel error.
        ch.exchange_declare(exchange, "topic", durable=True, arguments={"alternate-exchange": "amq.fanout"})
        ch.queue_declare(queue, durable=True, arguments={"x-max-length": 100, "x-message-ttl": 60000})
        ch.confirm_delivery()
        ch.basic_publish(exchange, "orders.new", b"o1", pika.BasicProperties(delivery_mode=2))
        assert ch.queue_declare(queue, passive=True).method.message_count == 1
    finally:
        conn.close()
    # Importing into a vhost Lepus lacks fails whole, before declaring anything.
    bad = {"queues": [{"name": "elsewhere", "vhost": "other", "durable": True, "auto_delete": False, "arguments": {}}]}
    response = fresh_lepus.post("/definitions", bad)
    assert response.status_code == 400
    assert fresh_lepus.get("/queues/%2F/elsewhere").status_code == 404


@pytest.mark.lepus_only("lepus ctl")
def test_ctl_status_list_close(lepus, names):
    queue = names("ctl-q")
    assert lepus.put("/queues/%2F/" + q(queue), {"durable": False}).status_code == 201
    status = ctl(lepus, "status").stdout
    assert "queues:" in status and "disk_free_alarm: false" in status
    assert queue in ctl(lepus, "list", "queues").stdout
    assert "amq.topic" in ctl(lepus, "list", "exchanges").stdout
    assert queue in ctl(lepus, "list", "bindings").stdout
    conn = lepus.connect()
    try:
        listing = ctl(lepus, "list", "connections", "name").stdout.splitlines()
        assert len(listing) >= 2
        name = [c["name"] for c in lepus.get("/connections").json()][0]
        assert name in "\n".join(listing)
        ctl(lepus, "close-connection", name)
        deadline_closed = False
        for _ in range(50):
            try:
                conn.process_data_events(time_limit=0.1)
            except pika.exceptions.ConnectionClosed:
                deadline_closed = True
                break
        assert deadline_closed
    finally:
        if conn.is_open:
            conn.close()
    failed = ctl(lepus, "--password", "wrong", "status", check=False)
    assert failed.returncode != 0 and "401" in failed.stderr
    assert lepus.delete("/queues/%2F/" + q(queue)).status_code == 204
