"""`alternate-exchange` as a policy key, as RabbitMQ 3.10.8 applies it: to the exchanges a policy
matches (apply-to exchanges or all), at once for existing exchanges and at declaration for new
ones; an exchange's own `alternate-exchange` argument wins over the policy's; a value that is not
a string is refused with RabbitMQ's text (measured: 400 "Validation failed\\n\\n5 is not a valid
alternate exchange name\\n")."""

import pika

from conftest import wait_for


def channel_of(broker):
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch


def got(ch, queue):
    method, _, body = ch.basic_get(queue, auto_ack=True)
    return body if method else None


def declare_topology(ch, names):
    """An unbound direct exchange `main`, an argument-AE exchange, and the two alternates, each
    with its own queue."""
    main, with_argument, policy_ae, argument_ae = names("main"), names("own-ae"), names("policy-ae"), names("arg-ae")
    for alternate in (policy_ae, argument_ae):
        ch.exchange_declare(alternate, "fanout")
        ch.queue_declare(alternate, auto_delete=True)
        ch.queue_bind(alternate, alternate)
    ch.exchange_declare(main, "direct")
    ch.exchange_declare(with_argument, "direct", arguments={"alternate-exchange": argument_ae})
    return main, with_argument, policy_ae, argument_ae


def test_an_alternate_exchange_policy_takes_what_its_exchanges_cannot_route(fresh_lepus, names):
    broker = fresh_lepus
    conn, ch = channel_of(broker)
    try:
        main, with_argument, policy_ae, argument_ae = declare_topology(ch, names)
        later = names("later")
        ch.basic_publish(main, "nowhere", b"before")
        assert got(ch, policy_ae) is None
        policy = {"pattern": "^(%s|%s|%s)$" % (main, with_argument, later), "definition": {"alternate-exchange": policy_ae}, "apply-to": "exchanges"}
        assert broker.put("/policies/%2F/ae", policy).status_code == 201
        assert wait_for(lambda: broker.get("/exchanges/%2F/" + main).json().get("policy") == "ae")
        ch.basic_publish(main, "nowhere", b"policy")
        assert got(ch, policy_ae) == b"policy"
        # The exchange's own argument wins over the policy.
        ch.basic_publish(with_argument, "nowhere", b"argument")
        assert got(ch, argument_ae) == b"argument" and got(ch, policy_ae) is None
        # An exchange declared after the policy gets it at declaration.
        ch.exchange_declare(later, "topic")
        ch.basic_publish(later, "a.b", b"later")
        assert got(ch, policy_ae) == b"later"
        # Routed messages are not the alternate's.
        ch.queue_declare(main, auto_delete=True)
        ch.queue_bind(main, main, "here")
        ch.basic_publish(main, "here", b"routed")
        assert got(ch, main) == b"routed" and got(ch, policy_ae) is None
        # Without the policy, unroutable messages are dropped again.
        assert broker.delete("/policies/%2F/ae").status_code == 204
        assert wait_for(lambda: broker.get("/exchanges/%2F/" + main).json().get("policy") is None)
        ch.basic_publish(main, "nowhere", b"after")
        assert got(ch, policy_ae) is None
    finally:
        conn.close()


def test_an_alternate_exchange_policy_value_must_be_a_name(fresh_lepus):
    response = fresh_lepus.put("/policies/%2F/bad-ae", {"pattern": ".*", "definition": {"alternate-exchange": 5}, "apply-to": "exchanges"})
    assert response.status_code == 400
    assert response.json()["reason"] == "Validation failed\n\n5 is not a valid alternate exchange name\n"
    assert fresh_lepus.get("/policies/%2F/bad-ae").status_code == 404


def test_a_mandatory_publish_to_an_alternate_exchange_by_policy_is_not_returned(fresh_lepus, names):
    broker = fresh_lepus
    conn, ch = channel_of(broker)
    try:
        main, _, policy_ae, _ = declare_topology(ch, names)
        policy = {"pattern": "^" + main + "$", "definition": {"alternate-exchange": policy_ae}, "apply-to": "all"}
        assert broker.put("/policies/%2F/ae-all", policy).status_code == 201
        assert wait_for(lambda: broker.get("/exchanges/%2F/" + main).json().get("policy") == "ae-all")
        ch.basic_publish(main, "nowhere", b"kept", mandatory=True)  # raises UnroutableError if returned
        assert got(ch, policy_ae) == b"kept"
        # An alternate that routes nowhere: the message is returned, as without one.
        ch.queue_unbind(policy_ae, policy_ae)
        try:
            ch.basic_publish(main, "nowhere", b"lost", mandatory=True)
            raise AssertionError("an unroutable mandatory message was not returned")
        except pika.exceptions.UnroutableError:
            pass
    finally:
        conn.close()


def test_an_alternate_exchange_policy_applies_after_a_restart(restartable_broker, names):
    broker = restartable_broker
    main, alternate = names("main"), names("policy-ae")
    assert broker.put("/exchanges/%2F/" + alternate, {"type": "fanout", "durable": True}).status_code == 201
    assert broker.put("/queues/%2F/" + alternate, {"durable": True}).status_code == 201
    assert broker.post("/bindings/%%2F/e/%s/q/%s" % (alternate, alternate), {"routing_key": ""}).status_code == 201
    assert broker.put("/exchanges/%2F/" + main, {"type": "direct", "durable": True}).status_code == 201
    policy = {"pattern": "^" + main + "$", "definition": {"alternate-exchange": alternate}, "apply-to": "exchanges"}
    assert broker.put("/policies/%2F/ae-kept", policy).status_code == 201
    broker.restart()
    assert wait_for(lambda: broker.get("/exchanges/%2F/" + main).json().get("policy") == "ae-kept")
    conn, ch = channel_of(broker)
    try:
        ch.basic_publish(main, "nowhere", b"after restart", pika.BasicProperties(delivery_mode=2))
        assert got(ch, alternate) == b"after restart"
    finally:
        conn.close()
