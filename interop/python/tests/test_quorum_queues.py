"""Quorum queues (`x-queue-type: quorum`) through pika, as RabbitMQ 3.10.8 has them on one node.
Every test passes against RabbitMQ and against Lepus (whose one node runs each quorum queue in a
Raft group of one); the texts and codes were measured on the reference node:

- declaration rules: durable only, never exclusive or auto-delete ('exclusive-owner', 'auto-delete',
  'non-durable', in that order, after the arguments); arguments RabbitMQ knows and quorum queues do
  not take (x-max-priority, x-queue-mode, x-max-age ...) refused naming rabbit_quorum_queue; the
  values of x-quorum-initial-group-size, x-dead-letter-strategy, x-queue-leader-locator, x-overflow;
  x-delivery-limit taken whatever its value; no server-named quorum queue; equivalence on redeclare;
- publish with confirms, consume, ack; basic.get with its message count;
- redelivery: `redelivered` and `x-delivery-count` (none on a consumer's first delivery, always on
  basic.get, 0 included);
- x-delivery-limit with dead-lettering (reason delivery_limit); reject without requeue dead-letters
  (reason rejected); x-message-ttl (reason expired);
- x-max-length: drop-head keeps the newest; reject-publish refuses only once the queue is over the
  limit (max 1 takes two); reject-publish-dlx acts as drop-head (the oldest are dead-lettered);
- a max-length policy applies to a quorum queue; purge and delete counts; global QoS refused (540).

Crash survival under confirmed load is Lepus-only: test_quorum_crash.py.
"""

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, NackError

from conftest import connect, get_all, message_count, safe_close, unique, wait_for_count
from test_dead_lettering import get_one, policies  # noqa: F401 (a fixture)

QUORUM = {"x-queue-type": "quorum"}
SETTLE_SECONDS = 0.5


def quorum(**arguments):
    return dict(QUORUM, **arguments)


def declare_quorum(channel, cleanup, prefix="qq", **arguments):
    queue = cleanup.queue(unique(prefix))
    channel.queue_declare(queue, durable=True, arguments=quorum(**arguments))
    return queue


def persistent(**properties):
    return pika.BasicProperties(delivery_mode=2, **properties)


def refusal(connection, name, **declare):
    """The (code, text) a declaration is refused with; the queue must not exist afterwards."""
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(name, **declare)
    check = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as missing:
        check.queue_declare(name, passive=True)
    assert missing.value.reply_code == 404, "nothing half-made"
    return refused.value.reply_code, refused.value.reply_text


INVALID_ARG = "PRECONDITION_FAILED - invalid arg '%s' for queue '{q}' in vhost '/'"
INVALID_PROPERTY = "PRECONDITION_FAILED - invalid property '%s' for queue '{q}' in vhost '/'"
OF_TYPE = INVALID_ARG + " of queue type rabbit_quorum_queue"


@pytest.mark.parametrize("declare, text", [
    (dict(durable=False), INVALID_PROPERTY % "non-durable"),
    (dict(exclusive=True), INVALID_PROPERTY % "exclusive-owner"),
    (dict(auto_delete=True), INVALID_PROPERTY % "auto-delete"),
    (dict(exclusive=True, durable=False), INVALID_PROPERTY % "exclusive-owner"),
    (dict(auto_delete=True, exclusive=True, durable=False), INVALID_PROPERTY % "auto-delete"),
    (dict(arguments={"x-max-priority": 5}), OF_TYPE % "x-max-priority"),
    (dict(arguments={"x-max-priority": 5}, durable=False), OF_TYPE % "x-max-priority"),
    (dict(arguments={"x-queue-mode": "lazy"}), OF_TYPE % "x-queue-mode"),
    (dict(arguments={"x-queue-version": 2}), OF_TYPE % "x-queue-version"),
    (dict(arguments={"x-max-age": "1D"}), OF_TYPE % "x-max-age"),
    (dict(arguments={"x-stream-max-segment-size-bytes": 1000}), OF_TYPE % "x-stream-max-segment-size-bytes"),
    (dict(arguments={"x-initial-cluster-size": 1}), OF_TYPE % "x-initial-cluster-size"),
    (dict(arguments={"x-quorum-initial-group-size": 0}), (INVALID_ARG % "x-quorum-initial-group-size") + ": {value_zero,0}"),
    (dict(arguments={"x-quorum-initial-group-size": -1}), (INVALID_ARG % "x-quorum-initial-group-size") + ": {value_negative,-1}"),
    (dict(arguments={"x-quorum-initial-group-size": "x"}),
     (INVALID_ARG % "x-quorum-initial-group-size") + ': "expected integer, got longstr"'),
    (dict(arguments={"x-quorum-initial-group-size": 0}, durable=False),
     (INVALID_ARG % "x-quorum-initial-group-size") + ": {value_zero,0}"),
    (dict(arguments={"x-overflow": "sideways"}), (INVALID_ARG % "x-overflow") + ": invalid_overflow"),
    (dict(arguments={"x-overflow": 1}), (INVALID_ARG % "x-overflow") + ": {unacceptable_type,signedint}"),
    (dict(arguments={"x-dead-letter-strategy": "bad"}), (INVALID_ARG % "x-dead-letter-strategy") + ": invalid_dlx_strategy"),
    (dict(arguments={"x-queue-leader-locator": "bad"}), (INVALID_ARG % "x-queue-leader-locator") + ": invalid_queue_locator_arg"),
    (dict(arguments={"x-max-length": -1}), (INVALID_ARG % "x-max-length") + ": {value_negative,-1}"),
    (dict(arguments={"x-max-length": -1}, durable=False), (INVALID_ARG % "x-max-length") + ": {value_negative,-1}"),
    (dict(arguments={"x-max-in-memory-length": -1}), (INVALID_ARG % "x-max-in-memory-length") + ": {value_negative,-1}"),
    (dict(arguments={"x-dead-letter-routing-key": "k"}), (INVALID_ARG % "x-dead-letter-routing-key") + ": routing_key_but_no_dlx_defined"),
    (dict(arguments={"x-single-active-consumer": "yes"}), (INVALID_ARG % "x-single-active-consumer") + ": {unacceptable_type,longstr}"),
])
def test_declarations_rabbitmq_refuses_are_refused_with_its_code_and_text(connection, declare, text):
    name = unique("qq-refused")
    arguments = quorum(**declare.pop("arguments", {}))
    declare.setdefault("durable", True)
    assert refusal(connection, name, arguments=arguments, **declare) == (406, text.replace("{q}", name))


@pytest.mark.parametrize("arguments", [
    {"x-delivery-limit": -1},
    {"x-delivery-limit": "a"},
    {"x-delivery-limit": 0},
    {"x-quorum-initial-group-size": 5},
    {"x-overflow": "reject-publish-dlx"},
    {"x-dead-letter-strategy": "at-most-once"},
    {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish", "x-dead-letter-exchange": "dlx"},
    # At least once with drop-head: taken, and dead-letters at most once (RabbitMQ logs the fallback).
    {"x-dead-letter-strategy": "at-least-once", "x-dead-letter-exchange": "dlx"},
    {"x-max-in-memory-length": 10, "x-max-in-memory-bytes": 1000},
    {"x-queue-leader-locator": "balanced"},
    {"x-single-active-consumer": True},
    {"x-foo": 1, "x-consumer-timeout": 1000},
])
def test_declarations_rabbitmq_takes_are_taken(channel, cleanup, arguments):
    queue = cleanup.queue(unique("qq-taken"))
    declared = channel.queue_declare(queue, durable=True, arguments=quorum(**arguments)).method
    assert (declared.message_count, declared.consumer_count) == (0, 0)


def test_a_server_named_quorum_queue_is_refused(connection):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare("", durable=True, arguments=quorum(**{"x-max-priority": 3}))
    assert (refused.value.reply_code, refused.value.reply_text) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue")


def test_a_redeclaration_must_be_equivalent(connection, cleanup):
    queue = cleanup.queue(unique("qq-equivalent"))
    connection.channel().queue_declare(queue, durable=True, arguments=QUORUM)
    assert connection.channel().queue_declare(queue, durable=True, arguments=QUORUM).method.queue == queue
    assert connection.channel().queue_declare(queue, passive=True).method.message_count == 0
    expectations = [
        (dict(durable=True, arguments={}),
         "inequivalent arg 'x-queue-type' for queue '%s' in vhost '/': received none but current is the value 'quorum' of type 'longstr'"),
        (dict(durable=True, arguments={"x-queue-type": "classic"}),
         "inequivalent arg 'x-queue-type' for queue '%s' in vhost '/': received 'classic' but current is 'quorum'"),
        (dict(durable=False, arguments=QUORUM),
         "inequivalent arg 'durable' for queue '%s' in vhost '/': received 'false' but current is 'true'"),
    ]
    for declare, text in expectations:
        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare(queue, **declare)
        assert (refused.value.reply_code, refused.value.reply_text) == (406, "PRECONDITION_FAILED - " + text % queue)


def test_confirmed_messages_are_consumed_in_order_and_acked_away(connection, cleanup):
    channel = connection.channel()
    queue = declare_quorum(channel, cleanup)
    channel.confirm_delivery()
    bodies = [b"m%03d" % number for number in range(200)]
    for body in bodies:
        channel.basic_publish("", queue, body, persistent())
    assert wait_for_count(queue, len(bodies), channel) == len(bodies)
    received = []
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=50)

    def on_message(chan, method, properties, body):
        received.append((body, method.redelivered, properties.headers))
        chan.basic_ack(method.delivery_tag)

    consumer.basic_consume(queue, on_message)
    deadline = time.monotonic() + 10
    while len(received) < len(bodies) and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert [body for body, _, _ in received] == bodies
    assert all(not redelivered and headers is None for _, redelivered, headers in received), received[:3]
    assert wait_for_count(queue, 0, channel) == 0


def test_basic_get_counts_what_is_left_and_a_nack_requeues_to_the_back(channel, cleanup):
    """basic.get's message always carries x-delivery-count (0 included); a nack or reject that
    requeues puts the message at the back of a quorum queue (RabbitMQ 3.10.8, measured)."""
    queue = declare_quorum(channel, cleanup)
    for body in (b"one", b"two", b"three"):
        channel.basic_publish("", queue, body, persistent(headers={"mine": "yes"}))
    assert wait_for_count(queue, 3, channel) == 3
    method, properties, body = channel.basic_get(queue)
    assert (body, method.message_count, method.redelivered) == (b"one", 2, False)
    assert properties.headers == {"mine": "yes", "x-delivery-count": 0}
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, properties, body = channel.basic_get(queue)
    assert (body, method.redelivered, properties.headers["x-delivery-count"]) == (b"two", False, 0)
    channel.basic_ack(method.delivery_tag)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.message_count) == (b"three", 1)
    method, properties, body = channel.basic_get(queue)
    assert (body, method.redelivered, properties.headers["x-delivery-count"], method.message_count) == (b"one", True, 1, 0)
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert (body, properties.headers["x-delivery-count"]) == (b"one", 2)
    assert channel.basic_get(queue) == (None, None, None)


def test_basic_recover_requeues_to_the_back(connection, cleanup):
    channel = connection.channel()
    queue = declare_quorum(channel, cleanup)
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", queue, body, persistent())
    assert wait_for_count(queue, 3, channel) == 3
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    seen = []
    consumer.basic_consume(queue, lambda chan, method, properties, body: seen.append((body, method.redelivered)))
    # Generous deadlines, each its own: on a loaded machine a first delivery still on its way when
    # the recover runs would be requeued before it was seen.
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert seen, "no first delivery within 30 s"
    consumer.basic_recover(requeue=True)
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert seen == [(b"a", False), (b"b", False)]
    consumer.close()
    assert wait_for_count(queue, 3, channel) == 3
    rest = [(body, method.redelivered) for method, _, body in get_all(channel, queue)]
    assert rest == [(b"b", True), (b"c", False), (b"a", True)], "a closed channel's message goes back to its place"


def test_a_consumer_sees_redeliveries_counted(connection, cleanup):
    channel = connection.channel()
    queue = declare_quorum(channel, cleanup)
    channel.basic_publish("", queue, b"again", persistent(headers={"a": 1}))
    seen = []

    def on_message(chan, method, properties, body):
        seen.append((method.redelivered, properties.headers))
        if len(seen) < 3:
            chan.basic_nack(method.delivery_tag, requeue=True)
        else:
            chan.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    deadline = time.monotonic() + 10
    while len(seen) < 3 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert seen == [(False, {"a": 1}), (True, {"a": 1, "x-delivery-count": 1}), (True, {"a": 1, "x-delivery-count": 2})]


def test_a_closed_channel_gives_its_unacked_messages_back_redelivered(connection, cleanup):
    channel = connection.channel()
    queue = declare_quorum(channel, cleanup)
    for body in (b"a", b"b"):
        channel.basic_publish("", queue, body, persistent())
    holder = connection.channel()
    holder.basic_qos(prefetch_count=10)
    held = []
    holder.basic_consume(queue, lambda chan, method, properties, body: held.append(body))
    deadline = time.monotonic() + 5
    while len(held) < 2 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert held == [b"a", b"b"]
    holder.close()
    assert wait_for_count(queue, 2, channel) == 2
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.redelivered) == (b"a", True)


def test_the_delivery_limit_dead_letters_with_reason_delivery_limit(channel, cleanup):
    dead = cleanup.queue(channel.queue_declare(unique("qq-dead")).method.queue)
    queue = declare_quorum(channel, cleanup, **{"x-delivery-limit": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.basic_publish("", queue, b"fragile", persistent(headers={"keep": "me"}))
    assert wait_for_count(queue, 1, channel) == 1
    counts = []
    for _ in range(2):
        method, properties, _ = get_one(channel, queue, auto_ack=False)
        counts.append(properties.headers["x-delivery-count"])
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [0, 1], "a limit of 1 delivers twice"
    _, properties, body = get_one(channel, dead)
    assert body == b"fragile"
    assert properties.headers["keep"] == "me"
    death = properties.headers["x-death"][0]
    assert (death["reason"], death["queue"]) == ("delivery_limit", queue)
    assert wait_for_count(queue, 0, channel) == 0


def test_a_reject_without_requeue_dead_letters_with_reason_rejected(channel, cleanup):
    dead = cleanup.queue(channel.queue_declare(unique("qq-dead")).method.queue)
    queue = declare_quorum(channel, cleanup, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.basic_publish("", queue, b"unwanted", persistent())
    method, _, _ = get_one(channel, queue, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, body = get_one(channel, dead)
    assert (body, properties.headers["x-death"][0]["reason"]) == (b"unwanted", "rejected")


def test_a_message_ttl_expires_messages_and_dead_letters_them(channel, cleanup):
    dead = cleanup.queue(channel.queue_declare(unique("qq-dead")).method.queue)
    queue = declare_quorum(channel, cleanup, **{"x-message-ttl": 200, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.basic_publish("", queue, b"short-lived", persistent())
    _, properties, body = get_one(channel, dead, timeout=10)
    assert (body, properties.headers["x-death"][0]["reason"]) == (b"short-lived", "expired")
    assert message_count(queue, channel) == 0


def test_drop_head_keeps_the_newest(channel, cleanup):
    queue = declare_quorum(channel, cleanup, **{"x-max-length": 2})
    for body in (b"d0", b"d1", b"d2", b"d3"):
        channel.basic_publish("", queue, body, persistent())
    assert wait_for_count(queue, 2, channel) == 2
    assert [body for _, _, body in get_all(channel, queue)] == [b"d2", b"d3"]


def test_reject_publish_refuses_only_once_the_queue_is_over_its_limit(channel, cleanup):
    queue = declare_quorum(channel, cleanup, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"r0", persistent())
    channel.basic_publish("", queue, b"r1", persistent())
    with pytest.raises(NackError):
        channel.basic_publish("", queue, b"r2", persistent())
    assert [body for _, _, body in get_all(channel, queue)] == [b"r0", b"r1"]


def test_reject_publish_dlx_acts_as_drop_head(channel, cleanup):
    dead = cleanup.queue(channel.queue_declare(unique("qq-dead")).method.queue)
    queue = declare_quorum(channel, cleanup, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                                  "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.confirm_delivery()
    for body in (b"x0", b"x1", b"x2"):
        channel.basic_publish("", queue, body, persistent())
    assert wait_for_count(dead, 2, channel) == 2
    assert [body for _, _, body in get_all(channel, dead)] == [b"x0", b"x1"]
    assert [body for _, _, body in get_all(channel, queue)] == [b"x2"]


def test_a_max_length_policy_applies_to_a_quorum_queue(channel, cleanup, policies):  # noqa: F811
    prefix = unique("qqpolicy")
    status, body = policies(prefix, "^" + prefix, {"max-length": 1})
    assert status in (201, 204), body
    queue = cleanup.queue(prefix + "-q")
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    time.sleep(SETTLE_SECONDS)
    for body in (b"p0", b"p1", b"p2"):
        channel.basic_publish("", queue, body, persistent())
    assert wait_for_count(queue, 1, channel) == 1
    assert [body for _, _, body in get_all(channel, queue)] == [b"p2"]


def test_purge_and_delete_count_the_ready_messages(channel, cleanup):
    queue = declare_quorum(channel, cleanup)
    for _ in range(5):
        channel.basic_publish("", queue, b"x", persistent())
    assert wait_for_count(queue, 5, channel) == 5
    held, _, _ = channel.basic_get(queue)
    assert channel.queue_purge(queue).method.message_count == 4, "the unacked one is not purged"
    for _ in range(3):
        channel.basic_publish("", queue, b"y", persistent())
    assert wait_for_count(queue, 3, channel) == 3
    assert channel.queue_delete(queue).method.message_count == 3


def test_a_deleted_queue_cancels_its_consumers(connection, cleanup):
    channel = connection.channel()
    queue = declare_quorum(channel, cleanup)
    cancelled = []
    consumer = connection.channel()
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = consumer.basic_consume(queue, lambda *args: None)
    channel.queue_delete(queue)
    deadline = time.monotonic() + 5
    while not cancelled and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert cancelled == [tag]


def test_global_qos_is_refused_at_consume(connection_factory, cleanup):
    connection = connection_factory()
    queue = declare_quorum(connection.channel(), cleanup)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10, global_qos=True)
    with pytest.raises(ConnectionClosedByBroker) as refused:
        channel.basic_consume(queue, lambda *args: None)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        540, "NOT_IMPLEMENTED - queue '%s' in vhost '/' does not support global qos" % queue)


def test_an_exclusive_consume_is_taken_and_its_exclusivity_ignored(connection, cleanup):
    """RabbitMQ 3.10.8 (measured): a quorum queue takes basic.consume exclusive=true and still
    takes a second consumer, before or after it."""
    channel = connection.channel()
    queue = declare_quorum(channel, cleanup)
    channel.basic_consume(queue, lambda *args: None, exclusive=True)
    other = connection.channel()
    other.basic_consume(queue, lambda *args: None)
    assert connection.channel().queue_declare(queue, passive=True).method.consumer_count == 2


def test_unlimited_prefetch_is_a_credit_of_2000(connection, cleanup):
    """A consumer without a prefetch limit gets at most 2000 unacked messages from a quorum queue
    (RabbitMQ 3.10.8, measured), so one consumer never takes a whole backlog."""
    channel = connection.channel()
    queue = declare_quorum(channel, cleanup)
    for _ in range(2100):
        channel.basic_publish("", queue, b"x")
    assert wait_for_count(queue, 2100, channel, timeout=20) == 2100
    got = []
    consumer = connection.channel()
    consumer.basic_consume(queue, lambda chan, method, properties, body: got.append(method.delivery_tag))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert len(got) == 2000
