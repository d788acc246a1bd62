"""Topic permissions on AMQP operations, with RabbitMQ 3.10.8's exact 403 ACCESS_REFUSED texts.

RabbitMQ checks them in rabbit_channel.erl (`check_topic_authorisation`) only when the exchange is
of type topic: basic.publish against the write expression with the routing key, and queue.bind,
queue.unbind, exchange.bind and exchange.unbind from a topic exchange against the read expression
with the binding key. `{username}` and `{vhost}` in an expression are replaced first; the match is
unanchored; the empty expression grants only the empty key; a user without an entry for the
exchange may use every key. A refusal closes the channel, not the connection.

The user has full permissions in `/`; its topic permissions come from conftest.broker_admin()
(rabbitmqctl against RabbitMQ, the management API against Lepus).
"""

from urllib.parse import quote, urlparse, urlunparse

import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import broker_admin, connect, safe_close, unique

PASSWORD = "topic-secret"


class TopicUser:
    def __init__(self, amqp_url, name):
        self.name = name
        parsed = urlparse(amqp_url)
        netloc = "%s:%s@%s" % (quote(name, safe=""), PASSWORD, parsed.netloc.rsplit("@", 1)[-1])
        self.url = urlunparse((parsed.scheme, netloc, parsed.path, "", "", ""))

    def refusal(self, key, exchange):
        return "ACCESS_REFUSED - access to topic '%s' in exchange '%s' in vhost '/' refused for user '%s'" % (
            key, exchange, self.name)


@pytest.fixture(scope="module")
def admin(amqp_url):
    return broker_admin(amqp_url)


@pytest.fixture(scope="module")
def user(amqp_url, admin):
    limited = TopicUser(amqp_url, unique("topic-perm"))
    admin.add_user(limited.name, PASSWORD)
    admin.set_permissions(limited.name, configure=".*", write=".*", read=".*")
    yield limited
    admin.delete_user(limited.name)


@pytest.fixture
def user_connection(user):
    conn = connect(user.url)
    yield conn
    safe_close(conn)


@pytest.fixture
def exchange(connection, cleanup):
    """A fresh topic exchange (declared by the administrator)."""
    name = cleanup.exchange(unique("topic-perm-x"))
    connection.channel().exchange_declare(name, "topic")
    return name


@pytest.fixture
def permissions(admin, user):
    """Sets the user's topic permissions; clears every one of them after the test."""
    made = []

    def set_permission(exchange, write, read):
        admin.set_topic_permissions(user.name, exchange, write, read)
        made.append(exchange)

    yield set_permission
    if made:
        admin.clear_topic_permissions(user.name)


def publish_outcome(conn, exchange, key):
    """None when the publish was taken, else (reply code, reply text) of the channel's closing."""
    channel = conn.channel()
    try:
        channel.basic_publish(exchange, key, b"m")
        channel.basic_qos(prefetch_count=1)  # a round trip: a refusal has closed the channel by then
    except ChannelClosedByBroker as closed:
        return closed.reply_code, closed.reply_text
    channel.close()
    return None


def bind_outcome(conn, action):
    channel = conn.channel()
    try:
        action(channel)
    except ChannelClosedByBroker as closed:
        return closed.reply_code, closed.reply_text
    channel.close()
    return None


def test_publish_is_refused_by_the_write_expression_and_the_connection_stays(user, user_connection, exchange, permissions):
    permissions(exchange, "^orders\\.", ".*")
    assert publish_outcome(user_connection, exchange, "orders.eu") is None
    assert publish_outcome(user_connection, exchange, "eu.orders") == (403, user.refusal("eu.orders", exchange))
    assert user_connection.is_open, "a topic refusal closes the channel only"
    assert publish_outcome(user_connection, exchange, "orders.us") is None


def test_expressions_are_unanchored_unless_anchored(user, user_connection, exchange, permissions):
    permissions(exchange, "orders", "")
    assert publish_outcome(user_connection, exchange, "eu.orders.new") is None
    assert publish_outcome(user_connection, exchange, "eu.invoices") == (403, user.refusal("eu.invoices", exchange))


def test_the_empty_write_expression_grants_only_the_empty_key(user, user_connection, exchange, permissions):
    permissions(exchange, "", ".*")
    assert publish_outcome(user_connection, exchange, "") is None
    assert publish_outcome(user_connection, exchange, "a") == (403, user.refusal("a", exchange))


def test_username_and_vhost_are_expanded(user, user_connection, exchange, permissions):
    permissions(exchange, "^{username}\\.", "^{vhost}\\.")
    assert publish_outcome(user_connection, exchange, user.name + ".events") is None
    assert publish_outcome(user_connection, exchange, "someone-else.events") == (403, user.refusal("someone-else.events", exchange))
    queue = user_connection.channel().queue_declare("", exclusive=True).method.queue
    assert bind_outcome(user_connection, lambda channel: channel.queue_bind(queue, exchange, "/.events")) is None
    refused = bind_outcome(user_connection, lambda channel: channel.queue_bind(queue, exchange, user.name + ".events"))
    assert refused == (403, user.refusal(user.name + ".events", exchange))


def test_bindings_from_a_topic_exchange_meet_the_read_expression(user, user_connection, exchange, permissions, connection, cleanup):
    permissions(exchange, ".*", "^public\\.")
    queue = user_connection.channel().queue_declare("", exclusive=True).method.queue
    assert bind_outcome(user_connection, lambda channel: channel.queue_bind(queue, exchange, "public.#")) is None
    assert bind_outcome(user_connection, lambda channel: channel.queue_unbind(queue, exchange, "public.#")) is None
    assert bind_outcome(user_connection, lambda channel: channel.queue_bind(queue, exchange, "secret.#")) == (
        403, user.refusal("secret.#", exchange))
    assert bind_outcome(user_connection, lambda channel: channel.queue_unbind(queue, exchange, "secret.#")) == (
        403, user.refusal("secret.#", exchange))
    destination = cleanup.exchange(unique("topic-perm-dest"))
    connection.channel().exchange_declare(destination, "fanout")
    assert bind_outcome(user_connection, lambda channel: channel.exchange_bind(destination, exchange, "secret.x")) == (
        403, user.refusal("secret.x", exchange))
    assert bind_outcome(user_connection, lambda channel: channel.exchange_bind(destination, exchange, "public.x")) is None
    # A topic exchange as the destination is not checked: only the source's keys are.
    assert bind_outcome(user_connection, lambda channel: channel.exchange_bind(exchange, destination, "secret.x")) is None
    assert user_connection.is_open


def test_the_topic_check_comes_before_the_queue_is_looked_up(user, user_connection, exchange, permissions):
    permissions(exchange, ".*", "^public\\.")
    missing = unique("topic-perm-missing-q")
    assert bind_outcome(user_connection, lambda channel: channel.queue_bind(missing, exchange, "secret.x")) == (
        403, user.refusal("secret.x", exchange))


def test_exchanges_of_other_types_and_without_an_entry_are_not_checked(user, user_connection, exchange, permissions, connection,
                                                                         cleanup):
    direct = cleanup.exchange(unique("topic-perm-direct"))
    connection.channel().exchange_declare(direct, "direct")
    permissions(direct, "^nothing$", "^nothing$")
    assert publish_outcome(user_connection, direct, "any.key") is None
    queue = user_connection.channel().queue_declare("", exclusive=True).method.queue
    assert bind_outcome(user_connection, lambda channel: channel.queue_bind(queue, direct, "any.key")) is None
    # The entry is for another exchange: this topic exchange has none, every key passes.
    assert publish_outcome(user_connection, exchange, "any.key") is None
    assert publish_outcome(user_connection, "amq.topic", "any.key") is None


def test_clearing_restores_access(user, user_connection, exchange, permissions, admin):
    permissions(exchange, "^allowed$", "^allowed$")
    assert publish_outcome(user_connection, exchange, "other") == (403, user.refusal("other", exchange))
    admin.clear_topic_permissions(user.name, exchange)
    assert publish_outcome(user_connection, exchange, "other") is None
    fresh = connect(user.url)
    try:
        assert publish_outcome(fresh, exchange, "other") is None
    finally:
        safe_close(fresh)
