"""The `x-consistent-hash` exchange type (RabbitMQ's rabbitmq_consistent_hash_exchange plugin).

The reference node scripts/rabbitmq-reference.sh starts enables the plugin (Debian's package ships
it), so these tests run against RabbitMQ 3.10.8 too; against a broker without the plugin they skip,
with that reason. The texts below are what RabbitMQ answered:
  binding key "abc"  -> 406 PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>
  binding key "0"    -> 406 PRECONDITION_FAILED - The binding key must be greater than 0
  hash-property app_id -> 406 PRECONDITION_FAILED - Unsupported property: app_id
  both arguments     -> 406 PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive
RabbitMQ picks a bucket by jump consistent hashing over buckets numbered in binding order; Lepus
uses weighted rendezvous hashing (the choice depends on the set of bindings, not their order, so a
restart cannot change it). Which queue a given key reaches therefore differs between the two;
the properties tested here (shares by weight, one queue per key) hold for both.
"""

import collections

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from conftest import connect, safe_close, unique, wait_until

KEYS = 10_000
# The share of each queue may differ from its weight's by this fraction of the expected count
# (10,000 keys: the standard deviation is about 1.5% of the largest share).
SHARE_TOLERANCE = 0.1


@pytest.fixture
def hash_exchange(amqp_url):
    """Declares x-consistent-hash exchanges (deleted afterwards), or skips without the plugin."""
    conn = connect(amqp_url)
    made = []

    def declare(arguments=None, ch=None):
        name = unique("chx")
        channel = ch or conn.channel()
        try:
            channel.exchange_declare(name, "x-consistent-hash", arguments=arguments)
        except (ChannelClosedByBroker, ConnectionClosedByBroker) as error:
            # An unknown exchange type closes the connection (503 COMMAND_INVALID).
            if error.reply_code == 503:
                pytest.skip("the broker has no x-consistent-hash exchange type (rabbitmq_consistent_hash_exchange plugin)")
            raise
        made.append(name)
        return name

    yield declare
    if not made:
        safe_close(conn)
        return
    if not conn.is_open:
        conn = connect(amqp_url)
    try:
        ch = conn.channel()
        for name in made:
            ch.exchange_delete(name)
    finally:
        safe_close(conn)


def bound_queues(ch, exchange, weights):
    queues = []
    for weight in weights:
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, exchange, routing_key=str(weight))
        queues.append(queue)
    return queues


def drain(ch, queues, total):
    """{queue: [bodies]} once the queues hold `total` messages between them."""
    wait_until(lambda: sum(ch.queue_declare(q, passive=True).method.message_count for q in queues) == total, timeout=60)
    found = {}
    for queue in queues:
        bodies = []
        while True:
            method, _, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        found[queue] = bodies
    assert sum(len(bodies) for bodies in found.values()) == total
    return found


def test_routing_keys_spread_by_weight_and_each_key_keeps_its_queue(connection, hash_exchange):
    ch = connection.channel()
    exchange = hash_exchange(ch=ch)
    weights = [1, 2, 3, 4]
    queues = bound_queues(ch, exchange, weights)
    for key in range(KEYS):
        ch.basic_publish(exchange, "key-%d" % key, b"key-%d" % key)
    # Each key once more: it must reach the queue it reached the first time.
    for key in range(0, KEYS, 10):
        ch.basic_publish(exchange, "key-%d" % key, b"key-%d" % key)
    found = drain(ch, queues, KEYS + KEYS // 10)
    queue_of = collections.defaultdict(set)
    for queue, bodies in found.items():
        for body in bodies:
            queue_of[body].add(queue)
    assert all(len(reached) == 1 for reached in queue_of.values()), "a key reached two queues"
    total_weight = sum(weights)
    for queue, weight in zip(queues, weights):
        share = sum(1 for reached in queue_of.values() if queue in reached)
        expected = KEYS * weight / total_weight
        assert abs(share - expected) <= expected * SHARE_TOLERANCE, (weight, share, expected)


def test_hash_header_routes_by_a_header_value(connection, hash_exchange):
    ch = connection.channel()
    exchange = hash_exchange({"hash-header": "shard"}, ch=ch)
    queues = bound_queues(ch, exchange, [1, 1, 1])
    for round_number in range(5):
        for shard in range(60):
            # The routing key changes every time; only the header decides.
            properties = pika.BasicProperties(headers={"shard": "shard-%d" % shard})
            ch.basic_publish(exchange, "rk-%d-%d" % (round_number, shard), b"shard-%d" % shard, properties)
    found = drain(ch, queues, 300)
    queue_of = collections.defaultdict(set)
    for queue, bodies in found.items():
        for body in bodies:
            queue_of[body].add(queue)
    assert all(len(reached) == 1 for reached in queue_of.values()), "a header value reached two queues"
    assert sum(1 for bodies in found.values() if bodies) == 3, "60 header values reach every queue"


def test_hash_property_routes_by_message_id(connection, hash_exchange):
    ch = connection.channel()
    exchange = hash_exchange({"hash-property": "message_id"}, ch=ch)
    queues = bound_queues(ch, exchange, [1, 1])
    for round_number in range(3):
        for message in range(40):
            properties = pika.BasicProperties(message_id="m-%d" % message)
            ch.basic_publish(exchange, "rk-%d" % round_number, b"m-%d" % message, properties)
    found = drain(ch, queues, 120)
    queue_of = collections.defaultdict(set)
    for queue, bodies in found.items():
        for body in bodies:
            queue_of[body].add(queue)
    assert all(len(reached) == 1 for reached in queue_of.values()), "a message id reached two queues"
    assert all(found.values()), "40 message ids reach both queues"


@pytest.mark.parametrize("key, text", [
    ("abc", 'PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>'),
    ("0", "PRECONDITION_FAILED - The binding key must be greater than 0"),
    ("-3", "PRECONDITION_FAILED - The binding key must be greater than 0"),
])
def test_a_binding_key_must_be_a_positive_integer(connection, hash_exchange, key, text):
    exchange = hash_exchange()
    ch = connection.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    with pytest.raises(ChannelClosedByBroker) as raised:
        ch.queue_bind(queue, exchange, routing_key=key)
    assert (raised.value.reply_code, raised.value.reply_text) == (406, text)


@pytest.mark.parametrize("arguments, text", [
    ({"hash-property": "app_id"}, "PRECONDITION_FAILED - Unsupported property: app_id"),
    ({"hash-property": "message_id", "hash-header": "h"}, "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive"),
])
def test_bad_hash_arguments_are_refused(connection, hash_exchange, arguments, text):
    hash_exchange()  # skips without the plugin
    ch = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as raised:
        ch.exchange_declare(unique("chx-bad"), "x-consistent-hash", arguments=arguments)
    assert (raised.value.reply_code, raised.value.reply_text) == (406, text)


def test_without_bindings_a_mandatory_message_is_returned(connection, hash_exchange):
    ch = connection.channel()
    exchange = hash_exchange(ch=ch)
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(exchange, "any", b"nowhere", mandatory=True)
    queue = bound_queues(ch, exchange, [1])[0]
    ch.basic_publish(exchange, "any", b"somewhere", mandatory=True)
    assert ch.basic_get(queue, auto_ack=True)[2] == b"somewhere"
