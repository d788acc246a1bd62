"""A message its queue takes and drops at once (x-max-length 0 with the default drop-head
overflow): RabbitMQ 3.10.8 acks its confirm promptly and does not return it to a mandatory
publisher, as it was routed; the queue keeps nothing. Lepus reports such a publish as dropped
(`PublishOutcome::Dropped`): nothing is written to the log, so nothing waits to be settled."""

import time

import pika
import pytest

from conftest import connect, safe_close, unique

# A confirm of a message nothing waits for comes at once; this is far above that.
CONFIRM_WAIT_MAX_S = 2.0


@pytest.mark.parametrize("durable", [True, False])
def test_a_publish_to_a_zero_length_queue_is_confirmed_and_not_returned(durable):
    conn = connect()
    queue = unique("zero-length")
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=durable, arguments={"x-max-length": 0})
        channel.confirm_delivery()
        started = time.monotonic()
        for index in range(20):
            # pika raises NackError on a nack and UnroutableError on a return; neither comes.
            channel.basic_publish("", queue, b"dropped-%d" % index,
                                  pika.BasicProperties(delivery_mode=2), mandatory=True)
        assert time.monotonic() - started < CONFIRM_WAIT_MAX_S * 20
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        assert channel.basic_get(queue, auto_ack=True)[0] is None
        channel.queue_delete(queue)
    finally:
        safe_close(conn)


def publish_with_a_consumer_waiting(arguments, properties):
    """Publishes one confirmed, mandatory message to a new queue with a consumer waiting; returns
    what the consumer got."""
    conn = connect()
    queue = unique("dropped-consumed")
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True, arguments=arguments)
        delivered = []
        channel.basic_consume(queue, lambda ch, method, props, body: delivered.append(body), auto_ack=True)
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"to-a-consumer", properties, mandatory=True)
        conn.process_data_events(time_limit=0.5)
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        channel.queue_delete(queue)
        return delivered
    finally:
        safe_close(conn)


def test_a_zero_length_queue_hands_a_publish_to_a_waiting_consumer():
    """RabbitMQ 3.10.8 delivers such a message to a consumer that can take it (measured), and
    drops it only when none can."""
    delivered = publish_with_a_consumer_waiting({"x-max-length": 0}, pika.BasicProperties(delivery_mode=2))
    assert delivered == [b"to-a-consumer"]


def test_a_message_ttl_of_zero_delivers_to_a_waiting_consumer_and_drops_otherwise():
    delivered = publish_with_a_consumer_waiting({"x-message-ttl": 0}, pika.BasicProperties(delivery_mode=2))
    assert delivered == [b"to-a-consumer"]
    conn = connect()
    queue = unique("ttl-zero")
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-message-ttl": 0})
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"expired", pika.BasicProperties(delivery_mode=2), mandatory=True)
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        assert channel.basic_get(queue, auto_ack=True)[0] is None
        channel.queue_delete(queue)
    finally:
        safe_close(conn)
