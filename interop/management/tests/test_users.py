"""Users, tags and permissions: created through the API (and lepus ctl), enforced on AMQP through
pika with RabbitMQ's reply codes, and durable across a restart."""

import subprocess

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import Lepus, lepus_binary


def connect_as(broker, user, password):
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port, credentials=pika.PlainCredentials(user, password),
                                       socket_timeout=5, blocked_connection_timeout=10, connection_attempts=1)
    return pika.BlockingConnection(params)


def test_permissions_are_enforced_with_rabbitmq_reply_codes(fresh_lepus):
    api = fresh_lepus
    assert api.put("/users/bob", {"password": "s3cret", "tags": ""}).status_code == 201
    assert api.put("/permissions/%2F/bob", {"configure": "^bob-.*", "write": "^bob-.*|amq.default", "read": "^bob-.*"}).status_code == 201
    assert {"user": "bob", "vhost": "/", "configure": "^bob-.*", "write": "^bob-.*|amq.default", "read": "^bob-.*"} in api.get("/permissions").json()

    conn = connect_as(api, "bob", "s3cret")
    try:
        channel = conn.channel()
        channel.queue_declare("bob-q")
        channel.basic_publish("", "bob-q", b"hello")
        method, _, body = channel.basic_get("bob-q", auto_ack=True)
        assert body == b"hello"
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare("alice-q")
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == "ACCESS_REFUSED - access to queue 'alice-q' in vhost '/' refused for user 'bob'"

        channel = conn.channel()
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.exchange_declare("shared-x", "fanout")
        assert refused.value.reply_code == 403

        # Publishing to an exchange the user may not write to closes the channel.
        channel = conn.channel()
        channel.basic_publish("amq.fanout", "", b"nope")
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare("bob-q", passive=True)
        assert refused.value.reply_code == 403
        assert "exchange 'amq.fanout'" in refused.value.reply_text
    finally:
        if conn.is_open:
            conn.close()

    # Without any permission in the vhost, connection.open is refused with 530.
    assert api.delete("/permissions/%2F/bob").status_code == 204
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as closed:
        connect_as(api, "bob", "s3cret")
    assert "(530) \"NOT_ALLOWED - access to vhost '/' refused for user 'bob'\"" in str(closed.value)
    # A wrong password is a login failure, not a permission one.
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect_as(api, "bob", "wrong")


def test_management_api_needs_a_management_tag_and_administrator_for_user_changes(fresh_lepus):
    api = fresh_lepus
    assert api.put("/users/plain", {"password": "p", "tags": ""}).status_code == 201
    assert api.put("/users/watcher", {"password": "w", "tags": "monitoring"}).status_code == 201
    assert api.get("/overview", auth=("plain", "p")).status_code == 401
    assert api.get("/overview", auth=("watcher", "w")).status_code == 200
    assert api.put("/users/eve", {"password": "e"}, auth=("watcher", "w")).status_code == 401
    assert api.get("/whoami", auth=("watcher", "w")).json() == {"name": "watcher", "tags": ["monitoring"]}
    users = {user["name"]: user for user in api.get("/users").json()}
    assert users["watcher"]["tags"] == ["monitoring"] and users["guest"]["tags"] == ["administrator"]
    assert users["watcher"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert api.delete("/users/plain").status_code == 204
    assert api.get("/users/plain").status_code == 404


@pytest.mark.lepus_only("lepus ctl manages the users")
def test_users_and_permissions_survive_a_restart_and_lepus_ctl_manages_them(tmp_path_factory):
    binary = lepus_binary()
    data_dir = tmp_path_factory.mktemp("users-restart") / "data"
    broker = Lepus(binary, data_dir)
    try:
        ctl = [binary, "ctl", "--url", "http://127.0.0.1:%d" % broker.http_port]
        subprocess.run(ctl + ["add-user", "carol", "pw", "--tags", "management"], check=True, capture_output=True, timeout=30)
        subprocess.run(ctl + ["set-permissions", "carol", ".*", ".*", ".*"], check=True, capture_output=True, timeout=30)
        listed = subprocess.run(ctl + ["list-users"], check=True, capture_output=True, text=True, timeout=30).stdout
        assert "carol" in listed and "management" in listed
    finally:
        broker.stop()
    broker = Lepus(binary, data_dir)
    try:
        conn = connect_as(broker, "carol", "pw")
        conn.channel().queue_declare("carol-q")
        conn.close()
        assert broker.get("/overview", auth=("carol", "pw")).status_code == 200
        assert broker.get("/permissions/%2F/carol").json()["configure"] == ".*"
    finally:
        broker.stop()
