"""Vhosts, policies, per-channel listings and failed-login rate limiting: created through the API,
rabbitmqadmin and lepus ctl, observed through pika with RabbitMQ's reply codes, durable across a
restart."""

import subprocess
import threading
import time

import pika
import pytest
import requests
from pika.exceptions import (AMQPConnectionError, ConnectionClosedByBroker, NackError, ProbableAccessDeniedError,
                             ProbableAuthenticationError)

from conftest import lepus_binary, wait_for


def connect(broker, vhost="/", user="guest", password="guest"):
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port, virtual_host=vhost,
                                       credentials=pika.PlainCredentials(user, password),
                                       socket_timeout=5, stack_timeout=15, blocked_connection_timeout=10, connection_attempts=1)
    return pika.BlockingConnection(params)


def ctl(broker, *arguments, check=True):
    command = [lepus_binary(), "ctl", "--url", "http://127.0.0.1:%d" % broker.http_port] + list(arguments)
    return subprocess.run(command, check=check, capture_output=True, text=True, timeout=30)


def bodies(channel, queue):
    got = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(body)


def test_vhost_lifecycle_through_api_and_amqp(restartable_broker):
    broker = restartable_broker
    assert broker.put("/vhosts/orders", {"description": "order processing", "tags": "prod,eu"}).status_code == 201
    assert broker.put("/vhosts/orders", {"description": "order processing, v2"}).status_code == 204
    listed = {vhost["name"]: vhost for vhost in broker.get("/vhosts").json()}
    assert set(listed) == {"/", "orders"}
    assert listed["orders"]["description"] == "order processing, v2"
    # As RabbitMQ: the creating administrator gets full permissions in the new vhost.
    assert broker.get("/permissions/orders/guest").json()["configure"] == ".*"
    conn = connect(broker, "orders")
    channel = conn.channel()
    channel.queue_declare("orders-q", durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", "orders-q", b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()
    assert [q["name"] for q in broker.get("/queues/orders").json()] == ["orders-q"]
    assert broker.put("/policies/orders/cap", {"pattern": "^orders", "definition": {"max-length": 5}}).status_code == 201
    assert broker.get("/queues/%2F/orders-q").status_code == 404, "queues are per vhost"
    broker.restart()
    assert broker.get("/vhosts/orders").json()["description"] == "order processing, v2"
    assert wait_for(lambda: broker.get("/queues/orders/orders-q").json().get("policy") == "cap"), "policies survive a restart"
    conn = connect(broker, "orders")
    channel = conn.channel()
    assert bodies(channel, "orders-q") == [b"kept"], "the vhost, its queue and message survive a restart"
    # Deleting a vhost closes its connections with 320, as RabbitMQ does, and removes its queues.
    assert broker.delete("/vhosts/orders").status_code == 204
    with pytest.raises(ConnectionClosedByBroker) as closed:
        for _ in range(50):
            conn.process_data_events(time_limit=0.1)
    assert closed.value.reply_code == 320
    assert broker.get("/vhosts/orders").status_code == 404
    assert broker.get("/permissions/orders/guest").status_code == 404
    assert broker.get("/policies").json() == []
    assert broker.delete("/vhosts/orders").status_code == 404
    with pytest.raises(ProbableAccessDeniedError) as refused:
        connect(broker, "orders")
    assert "530" in str(refused.value) and "vhost orders not found" in str(refused.value)
    connect(broker, "/").close()
    broker.restart()
    assert [vhost["name"] for vhost in broker.get("/vhosts").json()] == ["/"], "the deletion is durable"


def test_vhost_changes_need_an_administrator(fresh_lepus):
    assert fresh_lepus.put("/users/watcher", {"password": "pw", "tags": "monitoring"}).status_code == 201
    assert fresh_lepus.put("/vhosts/x", auth=("watcher", "pw")).status_code == 401
    assert fresh_lepus.put("/policies/%2F/p", {"pattern": ".*", "definition": {"max-length": 1}}, auth=("watcher", "pw")).status_code == 401
    assert fresh_lepus.get("/vhosts/x").status_code == 404


def test_policy_limits_matching_queues_at_once(fresh_lepus):
    broker = fresh_lepus
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("cap.a", durable=True)
    channel.queue_declare("cap.low", durable=True, arguments={"x-max-length": 2})
    channel.queue_declare("other", durable=True)
    for number in range(10):
        for queue in ("cap.a", "cap.low", "other"):
            channel.basic_publish("", queue, str(number).encode(), pika.BasicProperties(delivery_mode=2))
    policy = {"pattern": "^cap\\.", "definition": {"max-length": 3}, "apply-to": "queues", "priority": 1}
    assert broker.put("/policies/%2F/cap", policy).status_code == 201
    assert broker.get("/policies/%2F/cap").json() == dict(policy, vhost="/", name="cap")
    queue = wait_for(lambda: (lambda info: info if "policy" in info else None)(broker.get("/queues/%2F/cap.a").json()))
    assert queue["policy"] == "cap" and queue["effective_policy_definition"] == {"max-length": 3}
    assert broker.get("/queues/%2F/other").json()["policy"] is None
    # drop-head applies at once: the oldest go. The lower of argument and policy wins.
    assert bodies(channel, "cap.a") == [b"7", b"8", b"9"]
    assert bodies(channel, "cap.low") == [b"8", b"9"]
    assert len(bodies(channel, "other")) == 10
    # A policy of higher priority replaces it; reject-publish nacks confirms, as RabbitMQ.
    strict = {"pattern": "^cap\\.a$", "definition": {"max-length": 1, "overflow": "reject-publish"}, "priority": 5}
    assert broker.put("/policies/%2F/strict", strict).status_code == 201
    channel.confirm_delivery()
    channel.basic_publish("", "cap.a", b"first", pika.BasicProperties(delivery_mode=2))
    with pytest.raises(NackError):
        channel.basic_publish("", "cap.a", b"refused", pika.BasicProperties(delivery_mode=2))
    assert wait_for(lambda: broker.get("/queues/%2F/cap.a").json().get("policy") == "strict")
    assert broker.delete("/policies/%2F/strict").status_code == 204
    assert broker.delete("/policies/%2F/cap").status_code == 204
    assert broker.delete("/policies/%2F/cap").status_code == 404
    for number in range(5):
        channel.basic_publish("", "cap.a", b"more", pika.BasicProperties(delivery_mode=2))
    assert len(bodies(channel, "cap.a")) == 6, "no limit once the policies are gone"
    conn.close()


def test_policy_ttl_applies_to_new_messages(fresh_lepus):
    broker = fresh_lepus
    assert broker.put("/policies/%2F/ttl", {"pattern": "^ttl$", "definition": {"message-ttl": 200}}).status_code == 201
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("ttl", durable=True)
    channel.basic_publish("", "ttl", b"short-lived", pika.BasicProperties(delivery_mode=2))
    time.sleep(0.5)
    assert bodies(channel, "ttl") == []
    conn.close()


def test_invalid_policies_are_refused_loudly(fresh_lepus):
    broker = fresh_lepus
    unknown = broker.put("/policies/%2F/p", {"pattern": ".*", "definition": {"colour": "blue"}})
    assert unknown.status_code == 400 and "colour" in unknown.json()["reason"] and "not recognised" in unknown.json()["reason"]
    # dead-letter-strategy (quorum queues) is taken with either of its two values, nothing else.
    strategy = broker.put("/policies/%2F/p", {"pattern": ".*", "definition": {"dead-letter-strategy": "at-least-once"}})
    assert strategy.status_code == 201
    assert broker.delete("/policies/%2F/p").status_code == 204
    bad_strategy = broker.put("/policies/%2F/p", {"pattern": ".*", "definition": {"dead-letter-strategy": "sometimes"}})
    assert bad_strategy.status_code == 400
    # RabbitMQ's policy endpoint escapes its reasons as HTML (an Erlang binary's << and >>).
    expected = 'Validation failed\n\n&lt;&lt;"sometimes"&gt;&gt; is not a valid dead letter strategy\n'
    assert bad_strategy.json() == {"error": "bad_request", "reason": expected}
    # queue-version (3.10's classic queue storage versions) is taken with 1 or 2, nothing else.
    queue_version = broker.put("/policies/%2F/p", {"pattern": ".*", "definition": {"queue-version": 2}})
    assert queue_version.status_code == 201
    assert broker.get("/policies/%2F/p").json()["definition"] == {"queue-version": 2}
    assert broker.delete("/policies/%2F/p").status_code == 204
    bad_version = broker.put("/policies/%2F/p", {"pattern": ".*", "definition": {"queue-version": 3}})
    assert bad_version.json() == {"error": "bad_request", "reason": "Validation failed\n\n3 is not a valid queue-version value\n"}
    # Classic queue mirroring is refused rather than ignored: a Lepus classic queue has no
    # replicas for it to promise (RabbitMQ 3.10.8 takes it).
    mirrored = broker.put("/policies/%2F/p", {"pattern": ".*", "definition": {"ha-mode": "all"}})
    if broker.is_lepus:
        assert mirrored.status_code == 400 and "not implemented" in mirrored.json()["reason"]
    else:
        assert mirrored.status_code == 201
        assert broker.delete("/policies/%2F/p").status_code == 204
    bad_exchange = broker.put("/policies/%2F/p", {"pattern": ".*", "definition": {"dead-letter-exchange": 5}})
    assert bad_exchange.status_code == 400 and "5 is not a valid dead letter exchange name" in bad_exchange.json()["reason"]
    assert broker.put("/policies/%2F/p", {"pattern": "(", "definition": {"max-length": 1}}).status_code == 400
    assert broker.put("/policies/%2F/p", {"pattern": ".*", "definition": {"max-length": "many"}}).status_code == 400
    assert broker.put("/policies/%2F/p", {"definition": {"max-length": 1}}).status_code == 400
    assert broker.put("/policies/nowhere/p", {"pattern": ".*", "definition": {"max-length": 1}}).status_code == 404
    assert broker.get("/policies").json() == []


# The settings RabbitMQ 3.10.8's rabbit_policies and rabbit_queue_location_validator take beside
# the limits, with the value each refuses and RabbitMQ's reason for it (HTML-escaped, as its
# policy endpoint answers), and a queue type that takes the setting.
TAKEN_AS_THEY_ARE = [
    ("max-in-memory-length", 100, -1, "-1 is not a valid maximum memory in bytes", "quorum"),
    ("max-in-memory-bytes", 1048576, "lots", "&lt;&lt;\"lots\"&gt;&gt; is not a valid maximum memory in bytes", "classic"),
    ("queue-leader-locator", "balanced", "nearest", "&lt;&lt;\"nearest\"&gt;&gt; is not a valid queue leader locator value", "quorum"),
    ("initial-cluster-size", 3, -3, "-3 is not a valid cluster size", "stream"),
    ("queue-master-locator", "min-masters", "nearest", "&lt;&lt;\"nearest\"&gt;&gt; invalid queue-master-locator value", "classic"),
    ("queue-mode", "lazy", "eager", "&lt;&lt;\"eager\"&gt;&gt; is not a valid queue-mode value", "classic"),
]


def declared_with_policy(broker, channel, name, queue_type, policy):
    """Declares `name` of `queue_type` and returns its /api/queues answer once it shows `policy`
    (RabbitMQ's after a statistics interval), or None."""
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
    return wait_for(lambda: (lambda q: q if q.get("policy") == policy else None)(broker.get("/queues/%2F/" + name).json()))


@pytest.mark.parametrize("key,good,bad,reason,queue_type", TAKEN_AS_THEY_ARE, ids=[row[0] for row in TAKEN_AS_THEY_ARE])
def test_policy_settings_rabbitmq_takes_are_taken_with_its_validation(fresh_lepus, key, good, bad, reason, queue_type):
    broker = fresh_lepus
    refused = broker.put("/policies/%2F/bad", {"pattern": ".*", "definition": {key: bad}})
    assert (refused.status_code, refused.json()) == (400, {"error": "bad_request", "reason": "Validation failed\n\n%s\n" % reason})
    definition = {key: good, "max-length-bytes": 10000}
    assert broker.put("/policies/%2F/p", {"pattern": "^taken$", "apply-to": "queues", "definition": definition}).status_code == 201
    assert broker.get("/policies/%2F/p").json()["definition"] == definition
    conn = connect(broker)
    channel = conn.channel()
    queue = declared_with_policy(broker, channel, "taken", queue_type, "p")
    assert queue is not None and queue["effective_policy_definition"] == definition
    channel.queue_delete("taken")
    conn.close()
    assert broker.delete("/policies/%2F/p").status_code == 204


def test_a_policy_with_a_setting_the_queue_type_does_not_take_passes_it_by(fresh_lepus):
    """rabbit_queue_type:is_policy_applicable: a policy naming a setting of another queue type does
    not apply, and the matching policy next in priority does."""
    broker = fresh_lepus
    # Quorum queues take both settings of the first, classic ones not the locator, streams not
    # max-length; only classic queues take queue-mode.
    for name, priority, definition in [("quorum-only", 9, {"queue-leader-locator": "balanced", "max-length": 100}),
                                       ("classic-only", 5, {"queue-mode": "lazy"}),
                                       ("any", 1, {"max-length-bytes": 1000})]:
        body = {"pattern": "^applies", "apply-to": "queues", "priority": priority, "definition": definition}
        assert broker.put("/policies/%2F/" + name, body).status_code == 201
    conn = connect(broker)
    channel = conn.channel()
    expected = {"classic": "classic-only", "quorum": "quorum-only", "stream": "any"}
    chosen = {queue_type: (declared_with_policy(broker, channel, "applies-" + queue_type, queue_type, policy) or {}).get("policy")
              for queue_type, policy in expected.items()}
    assert chosen == expected
    for queue_type in expected:
        channel.queue_delete("applies-" + queue_type)
    conn.close()


def test_operator_policies_take_the_in_memory_limits(fresh_lepus):
    broker = fresh_lepus
    definition = {"max-in-memory-length": 5, "max-in-memory-bytes": 4096}
    assert broker.put("/operator-policies/%2F/op", {"pattern": ".*", "definition": definition}).status_code == 201
    assert broker.get("/operator-policies/%2F/op").json()["definition"] == definition
    assert broker.delete("/operator-policies/%2F/op").status_code == 204


def test_a_vhost_default_queue_type_types_what_amqp_declares_without_one(fresh_lepus):
    """RabbitMQ 3.10.8's vhost metadata `default_queue_type` (PUT body `defaultqueuetype`): a
    queue.declare without x-queue-type gets it as an argument when the type can have the queue
    (rabbit_amqqueue:augment_declare_args), the management API's too (its plugin declares over an
    AMQP channel)."""
    broker = fresh_lepus
    assert broker.put("/vhosts/typed", {"defaultqueuetype": "quorum"}).status_code == 201
    vhost = broker.get("/vhosts/typed").json()
    assert (vhost["default_queue_type"], vhost["metadata"]["default_queue_type"]) == ("quorum", "quorum")
    conn = connect(broker, vhost="typed")
    channel = conn.channel()
    channel.queue_declare("made-quorum", durable=True)
    channel.queue_declare("stays-classic", durable=False)
    channel.queue_declare("asked-classic", durable=True, arguments={"x-queue-type": "classic"})
    assert broker.put("/queues/typed/through-api", {"durable": True}).status_code == 201

    def types():
        listed = {queue["name"]: (queue.get("type"), queue.get("arguments")) for queue in broker.get("/queues/typed").json()}
        return listed if len(listed) == 4 else None

    assert wait_for(types) == {"made-quorum": ("quorum", {"x-queue-type": "quorum"}), "stays-classic": ("classic", {}),
                               "asked-classic": ("classic", {"x-queue-type": "classic"}),
                               "through-api": ("quorum", {"x-queue-type": "quorum"})}
    conn.close()
    assert broker.delete("/vhosts/typed").status_code == 204
    # A definitions file carries it in the vhost's metadata.
    imported = broker.post("/definitions", {"vhosts": [{"name": "imported", "metadata": {"default_queue_type": "stream"}}]})
    assert imported.status_code in (200, 201, 204), imported.text
    assert broker.get("/vhosts/imported").json()["default_queue_type"] == "stream"
    assert broker.delete("/vhosts/imported").status_code == 204


def test_rabbitmqadmin_and_ctl_manage_vhosts_and_policies(fresh_lepus, rabbitmqadmin):
    broker = fresh_lepus
    admin = rabbitmqadmin + ["--host", "127.0.0.1", "--port", str(broker.http_port), "--username", "guest", "--password", "guest"]

    def run(*arguments):
        return subprocess.run(admin + list(arguments), check=True, capture_output=True, text=True, timeout=30).stdout

    run("declare", "vhost", "name=staging")
    run("declare", "policy", "--vhost=staging", "name=limit", "pattern=^jobs", 'definition={"max-length": 5}', "apply-to=queues")
    assert "limit" in run("list", "policies")
    assert "staging" in run("list", "vhosts")
    assert broker.get("/policies/staging/limit").json()["definition"] == {"max-length": 5}
    run("delete", "policy", "--vhost=staging", "name=limit")
    run("delete", "vhost", "name=staging")
    assert broker.get("/vhosts/staging").status_code == 404
    if not broker.is_lepus:
        return  # What follows is lepus ctl, Lepus's own tool.

    ctl(broker, "add-vhost", "batch", "--description", "nightly jobs")
    assert "nightly jobs" in ctl(broker, "list", "vhosts", "name", "description").stdout
    ctl(broker, "set-policy", "small", "^b", '{"max-length": 2, "overflow": "reject-publish"}', "--vhost", "batch", "--priority", "3")
    listed = ctl(broker, "list", "policies", "--vhost", "batch").stdout
    assert "small" in listed and "reject-publish" in listed
    bad = ctl(broker, "set-policy", "bad", ".*", '{"ha-mode": "all"}', check=False)
    assert bad.returncode != 0 and "400" in bad.stderr and "not implemented" in bad.stderr
    ctl(broker, "clear-policy", "small", "--vhost", "batch")
    ctl(broker, "delete-vhost", "batch")
    assert "batch" not in ctl(broker, "list", "vhosts").stdout


def test_definitions_carry_vhosts_and_policies(lepus, fresh_lepus, names):
    vhost = names("defs-vhost")
    assert lepus.put("/vhosts/" + vhost, {"description": "moved"}).status_code == 201
    assert lepus.put("/policies/%s/keep" % vhost, {"pattern": "^k", "definition": {"max-length": 9}, "apply-to": "queues"}).status_code == 201
    assert lepus.put("/queues/%s/k1" % vhost, {"durable": True}).status_code == 201
    exported = lepus.get("/definitions").json()
    # On a shared reference node "fresh" is the same broker, emptied only now, after the export.
    fresh_lepus.reset()
    assert {"vhost": vhost, "name": "keep", "pattern": "^k", "apply-to": "queues", "definition": {"max-length": 9}, "priority": 0} in exported["policies"]
    assert fresh_lepus.post("/definitions", exported).status_code == 204
    assert fresh_lepus.get("/vhosts/" + vhost).status_code == 200
    if lepus.is_lepus:
        # Lepus exports a vhost's description too; RabbitMQ 3.10.8 exports only its name (and
        # imports a description when one is given).
        assert fresh_lepus.get("/vhosts/" + vhost).json()["description"] == "moved"
    assert wait_for(lambda: fresh_lepus.get("/queues/%s/k1" % vhost).json().get("policy") == "keep")
    assert lepus.delete("/vhosts/" + vhost).status_code == 204


def test_channels_are_listed_one_by_one(lepus, names):
    queue = names("chan-q")
    conn = lepus.connect()
    try:
        first = conn.channel()
        first.confirm_delivery()
        second = conn.channel()
        second.basic_qos(prefetch_count=7)
        second.queue_declare(queue, auto_delete=True)
        second.basic_consume(queue, lambda *args: None)
        second.tx_select()
        client_port = conn._impl.params.port and conn._impl._transport._sock.getsockname()[1]

        def ours_listed():
            # RabbitMQ lists a channel with `connection_details: []` until its connection's
            # statistics arrive: not ours yet.
            return [c for c in lepus.get("/channels").json()
                    if isinstance(c.get("connection_details"), dict) and c["connection_details"].get("peer_port") == client_port]

        wait_for(lambda: len(ours_listed()) == 2)
        ours = ours_listed()
        by_number = {c["number"]: c for c in ours}
        assert set(by_number) == {first.channel_number, second.channel_number}
        assert by_number[first.channel_number]["confirm"] is True
        assert by_number[second.channel_number]["prefetch_count"] == 7
        assert by_number[second.channel_number]["consumer_count"] == 1
        assert by_number[second.channel_number]["transactional"] is True
        connection_name = ours[0]["connection_details"]["name"]
        assert len(lepus.get("/connections/%s/channels" % requests.utils.quote(connection_name, safe="")).json()) == 2
        assert lepus.get("/channels/%s" % requests.utils.quote(ours[0]["name"], safe="")).json()["name"] == ours[0]["name"]
        first.close()
        wait_for(lambda: len(ours_listed()) == 1)
        remaining = ours_listed()
        assert [c["number"] for c in remaining] == [second.channel_number]
    finally:
        conn.close()


@pytest.mark.lepus_only("RabbitMQ does not throttle failed logins")
def test_failed_logins_are_rate_limited_per_address(fresh_lepus):
    """Five failures a minute are answered at once; later ones wait a second each, one after
    another, and a flood is refused unchecked. The limits are LOGIN_* in login_throttle.rs."""
    broker = fresh_lepus
    for _ in range(5):
        started = time.monotonic()
        with pytest.raises((ProbableAuthenticationError, AMQPConnectionError)):
            connect(broker, password="wrong")
        assert time.monotonic() - started < 0.9
    started = time.monotonic()
    with pytest.raises((ProbableAuthenticationError, AMQPConnectionError)) as refused:
        connect(broker, password="wrong")
    assert time.monotonic() - started >= 0.9, "the sixth failure waits its turn"
    assert isinstance(refused.value, ProbableAuthenticationError) or "403" in str(refused.value)
    # The right password is still accepted at once while the backlog is short.
    started = time.monotonic()
    connect(broker).close()
    assert time.monotonic() - started < 0.9
    # HTTP logins count for the same address.
    started = time.monotonic()
    assert broker.get("/overview", auth=("guest", "wrong")).status_code == 401
    assert time.monotonic() - started >= 0.9
    # A flood of parallel failures is answered one second apart; once more than ten seconds of
    # answers are queued, even the right password is refused without being checked.
    statuses = []

    def fail():
        statuses.append(requests.get(broker.url("/overview"), auth=("guest", "wrong"), timeout=30).status_code)

    flood = [threading.Thread(target=fail) for _ in range(15)]
    for thread in flood:
        thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    assert broker.get("/overview").status_code == 401, "refused unchecked during the flood"
    assert time.monotonic() - started < 0.9, "and answered at once: nothing was checked"
    with pytest.raises((ProbableAuthenticationError, AMQPConnectionError)):
        connect(broker)
    for thread in flood:
        thread.join()
    assert statuses == [401] * 15


def test_http_calls_are_held_to_the_callers_permissions(fresh_lepus):
    broker = fresh_lepus
    assert broker.put("/vhosts/other").status_code == 201
    assert broker.put("/queues/other/hidden", {"durable": False}).status_code == 201
    assert broker.put("/queues/%2F/guest-q", {"durable": False}).status_code == 201
    assert broker.put("/users/mia", {"password": "pw", "tags": "management"}).status_code == 201
    assert broker.put("/permissions/%2F/mia", {"configure": "^mia-", "write": "^mia-|amq.default", "read": "^mia-"}).status_code == 201
    assert broker.put("/users/watcher", {"password": "pw", "tags": "monitoring"}).status_code == 201
    mia = ("mia", "pw")

    assert broker.put("/queues/%2F/mia-q", {"durable": False}, auth=mia).status_code == 201
    refused = broker.put("/queues/%2F/not-mine", {"durable": False}, auth=mia)
    assert refused.status_code == 401
    # As RabbitMQ's management plugin: its own permission check, not the AMQP channel error's text.
    assert refused.json() == {"error": "not_authorised", "reason": "Access refused."}
    assert broker.put("/queues/other/mia-x", {"durable": False}, auth=mia).status_code == 401
    assert broker.get("/queues/other/hidden", auth=mia).status_code == 401
    get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    refused = broker.post("/queues/%2F/guest-q/get", get, auth=mia)
    assert refused.status_code == 401
    # A get runs on a channel in RabbitMQ's management plugin: the AMQP error's text comes back.
    assert refused.json()["reason"] == "ACCESS_REFUSED - access to queue 'guest-q' in vhost '/' refused for user 'mia'"
    assert broker.post("/queues/%2F/mia-q/get", get, auth=mia).status_code == 200
    # So does a publish's, as a 400.
    refused = broker.post("/exchanges/%2F/amq.fanout/publish", {"routing_key": "", "payload": "x", "payload_encoding": "string", "properties": {}}, auth=mia)
    assert (refused.status_code, refused.json()["reason"]) == (400, "403 ACCESS_REFUSED - access to exchange 'amq.fanout' in vhost '/' refused for user 'mia'")
    assert broker.delete("/queues/%2F/guest-q", auth=mia).json() == {"error": "not_authorised", "reason": "Access refused."}
    assert broker.get("/queues/%2F/guest-q").status_code == 200, "still there"

    # Listings show only what the caller may see. Monitoring users see every vhost, but, as in
    # RabbitMQ 3.10, the queues of only those vhosts they may log in to.
    assert {(q["vhost"], q["name"]) for q in broker.get("/queues", auth=mia).json()} == {("/", "guest-q"), ("/", "mia-q")}
    assert [v["name"] for v in broker.get("/vhosts", auth=mia).json()] == ["/"]
    assert sorted(v["name"] for v in broker.get("/vhosts", auth=("watcher", "pw")).json()) == ["/", "other"]
    assert broker.get("/queues", auth=("watcher", "pw")).json() == []
    assert broker.put("/permissions/other/watcher", {"configure": "", "write": "", "read": ""}).status_code == 201
    assert [(q["vhost"], q["name"]) for q in broker.get("/queues", auth=("watcher", "pw")).json()] == [("other", "hidden")]

    # Users, permissions and definitions are for administrators.
    for path in ("/users", "/permissions", "/definitions", "/users/mia"):
        assert broker.get(path, auth=mia).status_code == 401, path

    # Management users see their own connections only, and cannot close others'.
    guest_conn = connect(broker)
    mia_conn = connect(broker, user="mia", password="pw")
    try:
        assert wait_for(lambda: len(broker.get("/connections").json()) == 2)
        assert [c["user"] for c in broker.get("/connections", auth=mia).json()] == ["mia"]
        assert sorted(c["user"] for c in broker.get("/connections").json()) == ["guest", "mia"]
        guest_name = [c["name"] for c in broker.get("/connections").json() if c["user"] == "guest"][0]
        quoted = requests.utils.quote(guest_name, safe="")
        assert broker.delete("/connections/" + quoted, auth=mia).status_code == 401
        assert guest_conn.is_open
    finally:
        guest_conn.close()
        mia_conn.close()
