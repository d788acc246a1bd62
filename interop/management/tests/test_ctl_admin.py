"""rabbitmqctl's commands that change one setting of a user or vhost (change_password,
set_user_tags, clear_permissions, set_vhost_limits, clear_vhost_limits), run as `lepus ctl` against
Lepus and as `rabbitmqctl` against the RabbitMQ reference node, and checked the same way: through
the management API and an AMQP login."""

import pika
import pytest

from test_ctl import run

EX_USAGE = 64


def tags_of(broker, user):
    tags = broker.get("/users/" + user).json()["tags"]
    return sorted(tags.split(",") if isinstance(tags, str) else tags)


def can_log_in(broker, user, password):
    params = pika.ConnectionParameters(broker.host, broker.amqp_port, credentials=pika.PlainCredentials(user, password),
                                       socket_timeout=5, stack_timeout=10, connection_attempts=1)
    try:
        pika.BlockingConnection(params).close()
        return True
    except pika.exceptions.ProbableAuthenticationError:
        return False


def test_change_password_and_set_user_tags_keep_the_other_half(fresh_lepus, names):
    broker = fresh_lepus
    user = names("ctl-user")
    assert broker.put("/users/" + user, {"password": "first-secret", "tags": "monitoring"}).status_code in (201, 204)
    assert broker.put("/permissions/%2F/" + user, {"configure": ".*", "write": ".*", "read": ".*"}).status_code in (201, 204)
    try:
        run(broker, "rabbitmqctl", "change_password", user, "second-secret")
        assert can_log_in(broker, user, "second-secret")
        assert not can_log_in(broker, user, "first-secret")
        assert tags_of(broker, user) == ["monitoring"]

        run(broker, "rabbitmqctl", "set_user_tags", user, "administrator", "management")
        assert tags_of(broker, user) == ["administrator", "management"]
        assert can_log_in(broker, user, "second-secret")
        run(broker, "rabbitmqctl", "set_user_tags", user)
        assert tags_of(broker, user) == []

        run(broker, "rabbitmqctl", "clear_permissions", "-p", "/", user)
        assert broker.get("/permissions/%2F/" + user).status_code == 404
    finally:
        broker.delete("/users/" + user)


def test_a_missing_user_is_refused_as_rabbitmqctl_refuses_it(fresh_lepus, names):
    broker = fresh_lepus
    missing = names("ctl-missing")
    changed = run(broker, "rabbitmqctl", "change_password", missing, "secret", expect=None)
    tagged = run(broker, "rabbitmqctl", "set_user_tags", missing, "management", expect=None)
    # rabbitmqctl 3.10.8 exits 67 (EX_NOUSER) for both, saying: User "NAME" does not exist.
    assert (changed.returncode, tagged.returncode) == (67, 67), (changed.stderr, tagged.stderr)
    assert 'User "%s" does not exist' % missing in changed.stderr
    assert broker.get("/users/" + missing).status_code == 404


def test_vhost_limits_set_and_cleared(fresh_lepus, names):
    broker = fresh_lepus
    vhost = names("ctl-limits")
    assert broker.put("/vhosts/" + vhost).status_code in (201, 204)
    try:
        run(broker, "rabbitmqctl", "set_vhost_limits", "-p", vhost, '{"max-connections": 5, "max-queues": 10}')
        limits = broker.get("/vhost-limits/" + vhost).json()
        assert limits[0]["value"] == {"max-connections": 5, "max-queues": 10}, limits
        # The limits become exactly those named: max-connections is lifted (rabbitmqctl's rule).
        run(broker, "rabbitmqctl", "set_vhost_limits", "-p", vhost, '{"max-queues": 20}')
        assert broker.get("/vhost-limits/" + vhost).json()[0]["value"] == {"max-queues": 20}
        run(broker, "rabbitmqctl", "clear_vhost_limits", "-p", vhost)
        assert broker.get("/vhost-limits/" + vhost).json() in ([], [{"vhost": vhost, "value": {}}])
        not_json = run(broker, "rabbitmqctl", "set_vhost_limits", "-p", vhost, "max-queues=3", expect=None)
        assert not_json.returncode != 0
    finally:
        broker.delete("/vhosts/" + vhost)
