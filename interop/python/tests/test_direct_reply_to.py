"""Direct reply-to (`amq.rabbitmq.reply-to`) through pika, as RabbitMQ 3.10.8 answers (texts
measured against it): an RPC client consumes the pseudo-queue with no-ack, publishes its request
with reply_to=amq.rabbitmq.reply-to, the broker rewrites it to amq.rabbitmq.reply-to.<token>, and a
reply published to the default exchange with that routing key reaches the requesting channel.
"""

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import unique, wait_until

REPLY_TO = "amq.rabbitmq.reply-to"


def test_server_properties_advertise_direct_reply_to(connection):
    assert connection._impl.server_properties["capabilities"].get("direct_reply_to") is True


@pytest.mark.parametrize("passive", [True, False])
def test_declaring_the_pseudo_queue_answers_declare_ok(channel, passive):
    declared = channel.queue_declare(REPLY_TO, passive=passive).method
    assert (declared.queue, declared.message_count, declared.consumer_count) == (REPLY_TO, 0, 1)


def test_consuming_with_acks_is_406(channel):
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=False)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


def test_consuming_twice_on_one_channel_is_406(channel):
    channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        406, "PRECONDITION_FAILED - reply consumer already set")


def publish_request_refusal(channel, queue):
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.basic_publish("", queue, b"request", pika.BasicProperties(reply_to=REPLY_TO))
        # The refusal is asynchronous: a synchronous method after the publish collects it.
        channel.queue_declare("", exclusive=True)
    return refused.value.reply_code, refused.value.reply_text


def test_a_request_from_a_channel_not_consuming_replies_is_406(channel):
    assert publish_request_refusal(channel, unique("rpc")) == (
        406, "PRECONDITION_FAILED - fast reply consumer does not exist")


def test_a_request_after_the_reply_consumer_cancelled_is_406(channel):
    tag = channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    channel.basic_cancel(tag)
    assert publish_request_refusal(channel, unique("rpc")) == (
        406, "PRECONDITION_FAILED - fast reply consumer does not exist")


def take_request(channel, queue):
    for _ in range(100):
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return properties, body
        time.sleep(0.05)
    pytest.fail("the request never reached the server's queue")


def test_a_reply_reaches_the_requesting_channel(connection, connection_factory):
    server_connection = connection_factory()
    server = server_connection.channel()
    requests = server.queue_declare("", exclusive=True).method.queue
    client = connection.channel()
    replies = []
    tag = client.basic_consume(REPLY_TO, lambda channel, method, properties, body: replies.append((method, properties, body)),
                               auto_ack=True)
    client.basic_publish("", requests, b"ping", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c-1"))
    properties, body = take_request(server, requests)
    assert body == b"ping" and properties.correlation_id == "c-1"
    assert properties.reply_to.startswith(REPLY_TO + "."), properties.reply_to
    assert len(properties.reply_to) > len(REPLY_TO) + 1
    server.basic_publish("", properties.reply_to, b"pong", pika.BasicProperties(correlation_id="c-1"))
    wait_until(lambda: replies, conn=connection)
    method, reply_properties, reply_body = replies[0]
    assert reply_body == b"pong"
    assert (method.exchange, method.routing_key, method.consumer_tag, method.redelivered) == (
        "", properties.reply_to, tag, False)
    assert reply_properties.correlation_id == "c-1"
    # Another channel's requests get another address.
    other = connection.channel()
    other.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    other.basic_publish("", requests, b"ping-2", pika.BasicProperties(reply_to=REPLY_TO))
    other_properties, _ = take_request(server, requests)
    assert other_properties.reply_to != properties.reply_to


def test_a_reply_to_a_closed_channel_or_a_made_up_address_is_dropped(connection_factory):
    client_connection = connection_factory()
    client = client_connection.channel()
    client.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    server_connection = connection_factory()
    server = server_connection.channel()
    requests = server.queue_declare("", exclusive=True).method.queue
    client.basic_publish("", requests, b"ping", pika.BasicProperties(reply_to=REPLY_TO))
    properties, _ = take_request(server, requests)
    client_connection.close()
    server.basic_publish("", properties.reply_to, b"late")
    server.basic_publish("", REPLY_TO + ".made-up", b"nobody")
    # The replier's channel stays open.
    server.queue_declare("", exclusive=True)
