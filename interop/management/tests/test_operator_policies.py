"""Operator policies (/api/operator-policies), as RabbitMQ 3.10.8 applies them: limits only, merged
into the policy that applies to a queue with the stricter value winning. Measured on the reference
node: a user policy {max-length 5, message-ttl 60000} and an operator policy {max-length 2} give
effective_policy_definition {max-length 2, message-ttl 60000}, with `policy` and `operator_policy`
naming each; a key other than a limit (overflow, ha-mode) is 400 "are not recognised policy
settings"."""

from conftest import wait_for


def effective(broker, queue):
    info = broker.get("/queues/%2F/" + queue).json()
    return info.get("policy"), info.get("operator_policy"), info.get("effective_policy_definition")


def publish(broker, queue, count):
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for number in range(count):
            ch.basic_publish("", queue, b"m%d" % number)
        return ch.queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def test_an_operator_policy_limit_wins_when_it_is_stricter(fresh_lepus, names):
    broker = fresh_lepus
    queue = names("opq")
    assert broker.put("/queues/%2F/" + queue, {"durable": False}).status_code == 201
    user = {"pattern": "^" + queue + "$", "definition": {"max-length": 5, "message-ttl": 60000}, "apply-to": "queues"}
    operator = {"pattern": "^" + queue + "$", "definition": {"max-length": 2}, "apply-to": "queues"}
    assert broker.put("/policies/%2F/user-limits", user).status_code == 201
    assert broker.put("/operator-policies/%2F/op-limits", operator).status_code == 201
    assert broker.get("/operator-policies/%2F/op-limits").json() == dict(operator, vhost="/", name="op-limits", priority=0)
    assert [policy["name"] for policy in broker.get("/operator-policies").json()] == ["op-limits"]
    assert wait_for(lambda: effective(broker, queue) == ("user-limits", "op-limits", {"max-length": 2, "message-ttl": 60000})), \
        effective(broker, queue)
    assert publish(broker, queue, 5) == 2, "the operator policy's max-length of 2 applies"
    # A stricter user policy wins over a looser operator policy, key by key.
    user["definition"] = {"max-length": 1, "message-ttl": 60000}
    operator["definition"] = {"max-length": 3, "message-ttl": 1000}
    assert broker.put("/policies/%2F/user-limits", user).status_code == 204
    assert broker.put("/operator-policies/%2F/op-limits", operator).status_code == 204
    assert wait_for(lambda: effective(broker, queue) == ("user-limits", "op-limits", {"max-length": 1, "message-ttl": 1000})), \
        effective(broker, queue)
    assert publish(broker, queue, 3) == 1
    # Alone, the operator policy applies as it is.
    assert broker.delete("/policies/%2F/user-limits").status_code == 204
    assert wait_for(lambda: effective(broker, queue) == (None, "op-limits", {"max-length": 3, "message-ttl": 1000})), \
        effective(broker, queue)
    assert broker.delete("/operator-policies/%2F/op-limits").status_code == 204
    assert broker.delete("/operator-policies/%2F/op-limits").status_code == 404
    assert wait_for(lambda: effective(broker, queue)[1] is None), effective(broker, queue)


def test_an_operator_policy_sets_limits_only(fresh_lepus):
    for definition in ({"overflow": "drop-head"}, {"ha-mode": "all"}, {"alternate-exchange": "x"}):
        response = fresh_lepus.put("/operator-policies/%2F/bad", {"pattern": ".*", "definition": definition, "apply-to": "queues"})
        assert response.status_code == 400, definition
        assert "are not recognised policy settings" in response.json()["reason"], response.json()
    assert fresh_lepus.get("/operator-policies/%2F/bad").status_code == 404


def test_operator_policies_survive_a_restart(restartable_broker, names):
    broker = restartable_broker
    queue = names("opq")
    assert broker.put("/queues/%2F/" + queue, {"durable": True}).status_code == 201
    operator = {"pattern": "^" + queue + "$", "definition": {"max-length": 2}, "apply-to": "queues"}
    assert broker.put("/operator-policies/%2F/kept", operator).status_code == 201
    broker.restart()
    assert broker.get("/operator-policies/%2F/kept").status_code == 200
    assert wait_for(lambda: effective(broker, queue)[1] == "kept"), effective(broker, queue)
    assert publish(broker, queue, 4) == 2
    assert broker.delete("/operator-policies/%2F/kept").status_code == 204
