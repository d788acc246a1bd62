"""Permissions on AMQP operations, with RabbitMQ 3.10.8's exact 403 ACCESS_REFUSED texts.

One user gets regular-expression permissions that spell themselves out in resource names: a
name `<prefix>-<letters>-...` grants configure when the letters hold `c`, write for `w`, read for
`r`. The administrator from AMQP_URL creates the resources; the limited user then tries one
operation. RabbitMQ's rules (rabbit_channel.erl), checked against 3.10.8:

* queue.declare, exchange.declare, queue.delete, exchange.delete: configure on the resource;
* basic.publish: write on the exchange;
* basic.get, basic.consume, queue.purge: read on the queue;
* queue.bind / unbind: write on the queue, then read on the exchange;
* exchange.bind / unbind: write on the destination, then read on the source.

Users and permissions come from conftest.broker_admin(): rabbitmqctl ($RABBITMQCTL) when the
broker is RabbitMQ, the management API ($LEPUS_MANAGEMENT_URL) when it is Lepus.
"""

import re
from urllib.parse import quote, urlparse, urlunparse

import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import broker_admin, connect, get_all, safe_close, unique

PASSWORD = "perm-secret"


class LimitedUser:
    def __init__(self, amqp_url, prefix):
        self.prefix = prefix
        self.name = prefix + "-user"
        parsed = urlparse(amqp_url)
        netloc = "%s:%s@%s" % (quote(self.name, safe=""), PASSWORD, parsed.netloc.rsplit("@", 1)[-1])
        self.url = urlunparse((parsed.scheme, netloc, parsed.path, "", "", ""))

    def resource(self, letters, kind):
        """A fresh name on which this user has exactly the permissions in `letters` (subset of "cwr")."""
        return "%s-%s-%s" % (self.prefix, letters, unique(kind))

    def refusal(self, kind, name):
        return "ACCESS_REFUSED - access to %s '%s' in vhost '/' refused for user '%s'" % (kind, name, self.name)


@pytest.fixture(scope="module")
def user(amqp_url):
    admin = broker_admin(amqp_url)
    prefix = unique("perm")
    limited = LimitedUser(amqp_url, prefix)
    admin.add_user(limited.name, PASSWORD)

    def letters_with(letter):
        return "^%s-[cwr]*%s[cwr]*-" % (re.escape(prefix), letter)

    admin.set_permissions(limited.name, configure=letters_with("c"), write=letters_with("w"),
                          read=letters_with("r"))
    yield limited
    admin.delete_user(limited.name)


@pytest.fixture
def admin_channel(connection):
    return connection.channel()


@pytest.fixture
def user_connection(user):
    conn = connect(user.url)
    yield conn
    safe_close(conn)


def declare_queue(admin_channel, cleanup, user, letters, messages=0):
    name = cleanup.queue(user.resource(letters, "q"))
    admin_channel.queue_declare(name)
    if messages:
        admin_channel.confirm_delivery()
        for i in range(messages):
            admin_channel.basic_publish("", name, ("m%d" % i).encode())
    return name


def declare_exchange(admin_channel, cleanup, user, letters):
    name = cleanup.exchange(user.resource(letters, "x"))
    admin_channel.exchange_declare(name, "fanout")
    return name


def assert_refused(user_connection, call, refused_text):
    channel = user_connection.channel()
    with pytest.raises(ChannelClosedByBroker) as refused:
        call(channel)
    assert (refused.value.reply_code, refused.value.reply_text) == (403, refused_text)
    assert user_connection.is_open, "a permission failure closes the channel only"


def queue_message_count(admin_connection, name):
    return admin_connection.channel().queue_declare(name, passive=True).method.message_count


def routes_to(admin_connection, exchange, queue):
    """Whether a confirmed publish to `exchange` reaches `queue` (then takes it out again)."""
    channel = admin_connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(exchange, "", b"probe")
    return [body for _, _, body in get_all(channel, queue)] == [b"probe"]


# ---------------------------------------------------------------- allowed

def test_operations_the_permissions_allow_succeed(connection, admin_channel, cleanup, user, user_connection):
    channel = user_connection.channel()
    queue = cleanup.queue(user.resource("cwr", "q"))
    exchange = cleanup.exchange(user.resource("cwr", "x"))
    source = cleanup.exchange(user.resource("cwr", "x"))
    channel.queue_declare(queue)
    channel.exchange_declare(exchange, "fanout")
    channel.exchange_declare(source, "fanout")
    channel.queue_bind(queue, exchange)
    channel.exchange_bind(exchange, source)
    channel.confirm_delivery()
    channel.basic_publish(source, "", b"through two exchanges")
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"through two exchanges" and method.message_count == 0
    channel.basic_publish(exchange, "", b"to purge")
    assert channel.queue_purge(queue).method.message_count == 1
    tag = channel.basic_consume(queue, lambda *a: None)
    channel.basic_cancel(tag)
    channel.exchange_unbind(exchange, source)
    channel.queue_unbind(queue, exchange)
    channel.exchange_delete(source)
    channel.exchange_delete(exchange)
    assert channel.queue_delete(queue).method.message_count == 0


def test_passive_declares_need_no_permission(admin_channel, cleanup, user, user_connection):
    queue = declare_queue(admin_channel, cleanup, user, "", messages=1)
    exchange = declare_exchange(admin_channel, cleanup, user, "")
    channel = user_connection.channel()
    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    channel.exchange_declare(exchange, passive=True)


# ---------------------------------------------------------------- configure

def test_queue_declare_needs_configure(user, user_connection, connection):
    name = user.resource("wr", "q")
    assert_refused(user_connection, lambda ch: ch.queue_declare(name), user.refusal("queue", name))
    with pytest.raises(ChannelClosedByBroker) as missing:
        connection.channel().queue_declare(name, passive=True)
    assert missing.value.reply_code == 404, "the refused declare created nothing"


def test_exchange_declare_needs_configure(user, user_connection, connection):
    name = user.resource("wr", "x")
    assert_refused(user_connection, lambda ch: ch.exchange_declare(name, "fanout"), user.refusal("exchange", name))
    with pytest.raises(ChannelClosedByBroker) as missing:
        connection.channel().exchange_declare(name, passive=True)
    assert missing.value.reply_code == 404, "the refused declare created nothing"


def test_queue_delete_needs_configure(connection, admin_channel, cleanup, user, user_connection):
    queue = declare_queue(admin_channel, cleanup, user, "wr", messages=1)
    assert_refused(user_connection, lambda ch: ch.queue_delete(queue), user.refusal("queue", queue))
    assert queue_message_count(connection, queue) == 1, "the queue and its message are still there"


def test_exchange_delete_needs_configure(connection, admin_channel, cleanup, user, user_connection):
    exchange = declare_exchange(admin_channel, cleanup, user, "wr")
    assert_refused(user_connection, lambda ch: ch.exchange_delete(exchange), user.refusal("exchange", exchange))
    connection.channel().exchange_declare(exchange, passive=True)


def test_delete_of_a_missing_queue_is_still_refused_without_configure(user, user_connection):
    """RabbitMQ checks the permission before looking the queue up: 403, not delete-ok."""
    name = user.resource("wr", "q")
    assert_refused(user_connection, lambda ch: ch.queue_delete(name), user.refusal("queue", name))


# ---------------------------------------------------------------- write

def test_publish_needs_write_on_the_exchange(connection, admin_channel, cleanup, user, user_connection):
    exchange = declare_exchange(admin_channel, cleanup, user, "cr")
    queue = declare_queue(admin_channel, cleanup, user, "cwr")
    admin_channel.queue_bind(queue, exchange)

    def publish(channel):
        channel.basic_publish(exchange, "", b"refused")
        channel.queue_declare(queue, passive=True)  # the 403 arrives as channel.close before this answer

    assert_refused(user_connection, publish, user.refusal("exchange", exchange))
    assert queue_message_count(connection, queue) == 0, "the refused message was not routed"


def test_publish_to_a_missing_exchange_without_write_is_refused_before_it_is_looked_up(user, user_connection):
    # RabbitMQ checks the write permission before the exchange exists: 403, not 404.
    exchange = user.resource("cr", "missing-x")

    def publish(channel):
        channel.basic_publish(exchange, "", b"refused")
        channel.basic_qos(prefetch_count=1)  # the 403 arrives as channel.close before this answer

    assert_refused(user_connection, publish, user.refusal("exchange", exchange))


def closed_by(connection, publish):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as closed:
        publish(channel)
        channel.basic_qos(prefetch_count=1)
    return closed.value.reply_code, closed.value.reply_text


def test_the_exchange_is_checked_before_the_messages_own_properties(connection, cleanup):
    """RabbitMQ 3.10.8's basic.publish checks, in order: write permission, the exchange exists, not
    internal, topic permission; then the message's reply-to, user-id, expiration and delivery
    mode. A message breaking a rule of each kind gets the exchange's answer."""
    import pika
    missing = unique("no-such-x")
    bad = pika.BasicProperties(user_id="someone-else", expiration="soon", delivery_mode=3)
    code, text = closed_by(connection, lambda channel: channel.basic_publish(missing, "k", b"m", bad))
    assert (code, text) == (404, "NOT_FOUND - no exchange '%s' in vhost '/'" % missing)
    internal = cleanup.exchange(unique("internal-x"))
    connection.channel().exchange_declare(internal, "fanout", internal=True)
    code, text = closed_by(connection, lambda channel: channel.basic_publish(internal, "k", b"m", bad))
    assert (code, text) == (403, "ACCESS_REFUSED - cannot publish to internal exchange '%s' in vhost '/'" % internal)
    # Among the properties: user-id before expiration before the delivery mode.
    code, text = closed_by(connection, lambda channel: channel.basic_publish("", "k", b"m", bad))
    assert code == 406 and text.startswith("PRECONDITION_FAILED - user_id property set to 'someone-else'"), text
    no_user = pika.BasicProperties(expiration="soon", delivery_mode=3)
    code, text = closed_by(connection, lambda channel: channel.basic_publish("", "k", b"m", no_user))
    assert (code, text) == (406, "PRECONDITION_FAILED - invalid expiration 'soon': no_integer")
    code, text = closed_by(connection, lambda channel: channel.basic_publish("", "k", b"m", pika.BasicProperties(delivery_mode=3)))
    assert (code, text) == (406, "PRECONDITION_FAILED - invalid message: {delivery_mode_unknown,3}")


def test_publish_to_the_default_exchange_needs_write_on_amq_default(admin_channel, cleanup, user, user_connection):
    queue = declare_queue(admin_channel, cleanup, user, "cwr")

    def publish(channel):
        channel.basic_publish("", queue, b"refused")
        channel.queue_declare(queue, passive=True)

    assert_refused(user_connection, publish, user.refusal("exchange", "amq.default"))


# ---------------------------------------------------------------- read

def test_basic_get_needs_read(connection, admin_channel, cleanup, user, user_connection):
    queue = declare_queue(admin_channel, cleanup, user, "cw", messages=1)
    assert_refused(user_connection, lambda ch: ch.basic_get(queue, auto_ack=True), user.refusal("queue", queue))
    assert queue_message_count(connection, queue) == 1, "the refused get took nothing"


def test_basic_consume_needs_read(connection, admin_channel, cleanup, user, user_connection):
    queue = declare_queue(admin_channel, cleanup, user, "cw", messages=1)
    assert_refused(user_connection, lambda ch: ch.basic_consume(queue, lambda *a: None, auto_ack=True),
                   user.refusal("queue", queue))
    assert queue_message_count(connection, queue) == 1, "the refused consumer got nothing"


def test_queue_purge_needs_read(connection, admin_channel, cleanup, user, user_connection):
    queue = declare_queue(admin_channel, cleanup, user, "cw", messages=2)
    assert_refused(user_connection, lambda ch: ch.queue_purge(queue), user.refusal("queue", queue))
    assert queue_message_count(connection, queue) == 2, "the refused purge removed nothing"


# ---------------------------------------------------------------- bindings: both ends

@pytest.mark.parametrize("queue_letters, exchange_letters, refused_kind", [
    pytest.param("cr", "cr", "queue", id="queue-without-write"),
    pytest.param("cw", "cw", "exchange", id="exchange-without-read"),
    pytest.param("c", "c", "queue", id="neither-queue-first"),
])
def test_queue_bind_needs_write_on_queue_and_read_on_exchange(
        connection, admin_channel, cleanup, user, user_connection, queue_letters, exchange_letters, refused_kind):
    queue = declare_queue(admin_channel, cleanup, user, queue_letters)
    exchange = declare_exchange(admin_channel, cleanup, user, exchange_letters)
    refused_name = queue if refused_kind == "queue" else exchange
    assert_refused(user_connection, lambda ch: ch.queue_bind(queue, exchange), user.refusal(refused_kind, refused_name))
    assert not routes_to(connection, exchange, queue), "the refused bind made no binding"


@pytest.mark.parametrize("queue_letters, exchange_letters, refused_kind", [
    pytest.param("cr", "cr", "queue", id="queue-without-write"),
    pytest.param("cw", "cw", "exchange", id="exchange-without-read"),
])
def test_queue_unbind_needs_write_on_queue_and_read_on_exchange(
        connection, admin_channel, cleanup, user, user_connection, queue_letters, exchange_letters, refused_kind):
    queue = declare_queue(admin_channel, cleanup, user, queue_letters)
    exchange = declare_exchange(admin_channel, cleanup, user, exchange_letters)
    admin_channel.queue_bind(queue, exchange)
    refused_name = queue if refused_kind == "queue" else exchange
    assert_refused(user_connection, lambda ch: ch.queue_unbind(queue, exchange),
                   user.refusal(refused_kind, refused_name))
    assert routes_to(connection, exchange, queue), "the refused unbind left the binding in place"


@pytest.mark.parametrize("destination_letters, source_letters, refused_end", [
    pytest.param("cr", "cr", "destination", id="destination-without-write"),
    pytest.param("cw", "cw", "source", id="source-without-read"),
    pytest.param("c", "c", "destination", id="neither-destination-first"),
])
def test_exchange_bind_needs_write_on_destination_and_read_on_source(
        connection, admin_channel, cleanup, user, user_connection, destination_letters, source_letters, refused_end):
    destination = declare_exchange(admin_channel, cleanup, user, destination_letters)
    source = declare_exchange(admin_channel, cleanup, user, source_letters)
    queue = declare_queue(admin_channel, cleanup, user, "cwr")
    admin_channel.queue_bind(queue, destination)
    refused_name = destination if refused_end == "destination" else source
    assert_refused(user_connection, lambda ch: ch.exchange_bind(destination, source),
                   user.refusal("exchange", refused_name))
    assert not routes_to(connection, source, queue), "the refused exchange.bind made no binding"


@pytest.mark.parametrize("destination_letters, source_letters, refused_end", [
    pytest.param("cr", "cr", "destination", id="destination-without-write"),
    pytest.param("cw", "cw", "source", id="source-without-read"),
])
def test_exchange_unbind_needs_write_on_destination_and_read_on_source(
        connection, admin_channel, cleanup, user, user_connection, destination_letters, source_letters, refused_end):
    destination = declare_exchange(admin_channel, cleanup, user, destination_letters)
    source = declare_exchange(admin_channel, cleanup, user, source_letters)
    queue = declare_queue(admin_channel, cleanup, user, "cwr")
    admin_channel.queue_bind(queue, destination)
    admin_channel.exchange_bind(destination, source)
    refused_name = destination if refused_end == "destination" else source
    assert_refused(user_connection, lambda ch: ch.exchange_unbind(destination, source),
                   user.refusal("exchange", refused_name))
    assert routes_to(connection, source, queue), "the refused exchange.unbind left the binding in place"
