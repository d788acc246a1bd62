"""Vhost limits through the management API (`/api/vhost-limits`), in RabbitMQ 3.10.8's shapes and
texts: set, listed, validated, deleted, kept across a restart, exported and imported in definitions
(as a parameter of component `vhost-limits` named `limits`), and enforced on AMQP clients."""

import pika
import pytest
from pika.exceptions import ProbableAccessDeniedError

from conftest import quote


def connect(broker, vhost):
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port, virtual_host=vhost,
                                       credentials=pika.PlainCredentials(*broker.auth),
                                       socket_timeout=5, stack_timeout=15, blocked_connection_timeout=10, connection_attempts=1)
    return pika.BlockingConnection(params)


def limits_entry(broker, vhost):
    return [entry for entry in broker.get("/vhost-limits").json() if entry["vhost"] == vhost]


def test_vhost_limits_are_set_listed_validated_and_deleted(fresh_lepus):
    broker = fresh_lepus
    assert broker.put("/vhosts/limited").status_code == 201
    assert broker.get("/vhost-limits/limited").json() == []
    assert limits_entry(broker, "limited") == [], "no limits: not listed"
    assert broker.put("/vhost-limits/limited/max-connections", {"value": 2}).status_code == 204
    assert broker.put("/vhost-limits/limited/max-queues", {"value": 3}).status_code == 204
    expected = [{"vhost": "limited", "value": {"max-connections": 2, "max-queues": 3}}]
    assert broker.get("/vhost-limits/limited").json() == expected
    assert limits_entry(broker, "limited") == expected
    assert broker.put("/vhost-limits/limited/max-queues", {"value": -1}).status_code == 204, "negative: no limit"
    assert broker.get("/vhost-limits/limited").json()[0]["value"]["max-queues"] == -1

    refused = [
        ("max-foo", {"value": 5}, "Validation failed\n\nUnrecognised terms [{<<\"max-foo\">>,5}] in limits\n"),
        ("max-queues", {"value": "x"}, "Validation failed\n\nmax-queues should be a number, actually was <<\"x\">>\n"),
        ("max-queues", {"value": 1.5}, "Validation failed\n\nmax-queues should be a number, actually was 1.5\n"),
        ("max-queues", {"valu": 3}, "[{key_missing,value}]"),
    ]
    for name, body, reason in refused:
        response = broker.put("/vhost-limits/limited/" + name, body)
        assert (response.status_code, response.json()) == (400, {"error": "bad_request", "reason": reason}), name
    response = broker.put("/vhost-limits/missing/max-queues", {"value": 1})
    assert (response.status_code, response.json()) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert broker.get("/vhost-limits/missing").status_code == 404

    # Administrators only; a monitoring user sees every vhost's limits.
    assert broker.put("/users/watcher", {"password": "watcher", "tags": "monitoring"}).status_code == 201
    response = broker.put("/vhost-limits/limited/max-queues", {"value": 1}, auth=("watcher", "watcher"))
    assert (response.status_code, response.json()["reason"]) == (401, "Not administrator user")
    assert broker.delete("/vhost-limits/limited/max-queues", auth=("watcher", "watcher")).status_code == 401
    assert [entry["vhost"] for entry in broker.get("/vhost-limits", auth=("watcher", "watcher")).json()] == ["limited"]

    assert broker.delete("/vhost-limits/limited/max-queues").status_code == 204
    assert broker.get("/vhost-limits/limited").json() == [{"vhost": "limited", "value": {"max-connections": 2}}]
    assert broker.delete("/vhost-limits/limited/max-connections").status_code == 204
    # As RabbitMQ: the vhost's own listing is empty, the full listing keeps an empty set of limits.
    assert broker.get("/vhost-limits/limited").json() == []
    assert limits_entry(broker, "limited") == [{"vhost": "limited", "value": []}]
    assert broker.delete("/vhosts/limited").status_code == 204
    assert limits_entry(broker, "limited") == [], "a deleted vhost takes its limits with it"


def test_vhost_limits_survive_a_restart_travel_in_definitions_and_are_enforced(restartable_broker):
    broker = restartable_broker
    assert broker.put("/vhosts/kept").status_code == 201
    assert broker.put("/vhost-limits/kept/max-connections", {"value": 1}).status_code == 204
    assert broker.put("/vhost-limits/kept/max-queues", {"value": 2}).status_code == 204
    broker.restart()
    expected = {"max-connections": 1, "max-queues": 2}
    assert broker.get("/vhost-limits/kept").json() == [{"vhost": "kept", "value": expected}]

    parameter = {"value": expected, "vhost": "kept", "component": "vhost-limits", "name": "limits"}
    assert parameter in broker.get("/definitions").json()["parameters"]
    assert broker.get("/definitions/kept").json()["parameters"] == [parameter]

    # Imported into a new vhost, the limits apply to its clients at once.
    definitions = {"vhosts": [{"name": "copy"}],
                   "permissions": [{"user": broker.auth[0], "vhost": "copy", "configure": ".*", "write": ".*", "read": ".*"}],
                   "parameters": [dict(parameter, vhost="copy")]}
    assert broker.post("/definitions", definitions).status_code in (201, 204)
    assert broker.get("/vhost-limits/copy").json() == [{"vhost": "copy", "value": expected}]
    first = connect(broker, "copy")
    try:
        with pytest.raises(ProbableAccessDeniedError) as refused:
            connect(broker, "copy")
        assert ("NOT_ALLOWED - access to vhost 'copy' refused for user '%s': connection limit (1) is reached"
                % broker.auth[0]) in str(refused.value)
        channel = first.channel()
        channel.queue_declare("one", auto_delete=True)
        channel.queue_declare("two", auto_delete=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare("three", auto_delete=True)
        assert closed.value.reply_code == 406
        assert closed.value.reply_text == "PRECONDITION_FAILED - cannot declare queue 'three': queue limit in vhost 'copy' (2) is reached"
    finally:
        first.close()
    for vhost in ("kept", "copy"):
        assert broker.delete("/vhosts/" + quote(vhost)).status_code == 204
