"""x-single-active-consumer through pika, as RabbitMQ 3.10.8 behaves on classic queues: one
consumer (the earliest subscribed) gets every message; when it cancels or its channel or
connection closes, the next in subscription order takes over, its unacked messages requeued in
order first. The management API names the active consumer (`single_active_consumer_tag`) and each
consumer's `activity_status` ("single_active" / "waiting"). Texts measured against RabbitMQ.
"""

import json
import os
import time
import urllib.parse
import urllib.request

import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import ManagementApiAdmin, amqp_url_from_env, broker_is_lepus, unique, wait_until

SAC = {"x-single-active-consumer": True}


class Recorder:
    """A consumer callback that keeps (tag, body, redelivered) of each delivery; acks if asked."""

    def __init__(self, ack=False):
        self.got = []
        self.ack = ack

    def __call__(self, channel, method, properties, body):
        self.got.append((method.consumer_tag, body.decode(), method.redelivered))
        if self.ack:
            channel.basic_ack(method.delivery_tag)

    def bodies(self):
        return [body for _, body, _ in self.got]


@pytest.mark.parametrize("value, type_name", [(1, "signedint"), ("true", "longstr")])
def test_a_non_boolean_value_is_406(channel, value, type_name):
    name = unique("sac-bad")
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(name, arguments={"x-single-active-consumer": value})
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue '%s' in vhost '/': "
        "{unacceptable_type,%s}" % (name, type_name))


def test_only_the_first_subscriber_gets_messages(connection, cleanup):
    name = cleanup.queue(unique("sac"))
    first_channel, second_channel = connection.channel(), connection.channel()
    first_channel.queue_declare(name, arguments=SAC)
    first, second = Recorder(ack=True), Recorder(ack=True)
    first_channel.basic_consume(name, first, consumer_tag="first")
    # A higher consumer priority does not win: RabbitMQ 3.10's classic queues take the earliest.
    second_channel.basic_consume(name, second, consumer_tag="second", arguments={"x-priority": 10})
    for index in range(10):
        first_channel.basic_publish("", name, str(index).encode())
    wait_until(lambda: len(first.got) >= 10, conn=connection)
    connection.process_data_events(time_limit=0.3)
    assert first.bodies() == [str(index) for index in range(10)]
    assert second.got == []
    declared = first_channel.queue_declare(name, passive=True).method
    assert declared.consumer_count == 2, "a waiting consumer still counts as a consumer"


def test_cancel_of_the_active_consumer_hands_over_in_subscription_order(connection, cleanup):
    name = cleanup.queue(unique("sac-cancel"))
    channels = [connection.channel() for _ in range(3)]
    channels[0].queue_declare(name, arguments=SAC)
    recorders = [Recorder(ack=True) for _ in range(3)]
    for index, (channel, recorder) in enumerate(zip(channels, recorders)):
        channel.basic_consume(name, recorder, consumer_tag="c%d" % index)
    channels[0].basic_publish("", name, b"a")
    wait_until(lambda: recorders[0].got, conn=connection)
    channels[0].basic_cancel("c0")
    channels[0].basic_publish("", name, b"b")
    wait_until(lambda: recorders[1].got, conn=connection)
    # The waiting third one cancelling changes nothing; the second stays active.
    channels[2].basic_cancel("c2")
    channels[0].basic_publish("", name, b"c")
    wait_until(lambda: len(recorders[1].got) >= 2, conn=connection)
    connection.process_data_events(time_limit=0.3)
    assert recorders[0].bodies() == ["a"]
    assert recorders[1].bodies() == ["b", "c"]
    assert recorders[2].got == []


def test_ready_messages_go_to_the_next_consumer_as_soon_as_the_active_one_cancels(connection, cleanup):
    """Lepus does better than RabbitMQ here: RabbitMQ 3.10.8 (measured) activates the next consumer
    only at the next publish, and not at all while the cancelled consumer's channel is at its
    prefetch with unacked messages (the queue then stalls); Lepus hands over at the cancel."""
    if not broker_is_lepus():
        pytest.skip("RabbitMQ 3.10.8 hands over only at the next publish (Lepus-only behaviour)")
    name = cleanup.queue(unique("sac-handover"))
    active_channel, waiting_channel = connection.channel(), connection.channel()
    active_channel.queue_declare(name, arguments=SAC)
    for index in range(4):
        active_channel.basic_publish("", name, str(index).encode())
    active_channel.basic_qos(prefetch_count=1)
    active, waiting = Recorder(ack=False), Recorder(ack=True)
    active_channel.basic_consume(name, active, consumer_tag="active")
    waiting_channel.basic_consume(name, waiting, consumer_tag="waiting")
    wait_until(lambda: active.got, conn=connection)
    connection.process_data_events(time_limit=0.2)
    assert active.bodies() == ["0"] and waiting.got == []
    # Nothing is published or acked after the cancel: the handover alone must deliver.
    active_channel.basic_cancel("active")
    wait_until(lambda: len(waiting.got) >= 3, conn=connection)
    assert waiting.bodies() == ["1", "2", "3"]


@pytest.mark.parametrize("close", ["channel", "connection"])
def test_when_the_active_consumer_goes_its_unacked_messages_go_to_the_next_in_order(connection_factory, cleanup, close):
    name = cleanup.queue(unique("sac-close"))
    active_connection, waiting_connection = connection_factory(), connection_factory()
    active_channel = active_connection.channel()
    active_channel.queue_declare(name, arguments=SAC)
    active = Recorder(ack=False)
    active_channel.basic_consume(name, active, consumer_tag="active")
    waiting_channel = waiting_connection.channel()
    waiting = Recorder(ack=True)
    waiting_channel.basic_consume(name, waiting, consumer_tag="waiting")
    for index in range(5):
        active_channel.basic_publish("", name, str(index).encode())
    wait_until(lambda: len(active.got) >= 5, conn=active_connection)
    waiting_connection.process_data_events(time_limit=0.2)
    assert waiting.got == []
    if close == "channel":
        active_channel.close()
    else:
        active_connection.close()
    wait_until(lambda: len(waiting.got) >= 5, conn=waiting_connection)
    assert waiting.bodies() == [str(index) for index in range(5)], "requeued out of order"
    assert all(redelivered for _, _, redelivered in waiting.got)
    waiting_channel.basic_publish("", name, b"after")
    wait_until(lambda: len(waiting.got) >= 6, conn=waiting_connection)
    assert waiting.bodies()[-1] == "after"


def test_an_exclusive_consumer_is_refused_with_403(channel, cleanup):
    name = cleanup.queue(unique("sac-exclusive"))
    channel.queue_declare(name, arguments=SAC)
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.basic_consume(name, lambda *args: None, exclusive=True)
    assert refused.value.reply_code == 403
    assert refused.value.reply_text == "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % name


def management_get(path):
    management_url = os.environ.get("LEPUS_MANAGEMENT_URL") or os.environ.get("MANAGEMENT_URL")
    if not management_url:
        pytest.fail("set LEPUS_MANAGEMENT_URL (Lepus) or MANAGEMENT_URL (RabbitMQ) for the management API")
    api = ManagementApiAdmin(management_url, amqp_url_from_env())
    request = urllib.request.Request(api.api_url + path, headers={"Authorization": api.authorization})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


# A quorum queue names its active consumer `single_active_consumer_ctag` (RabbitMQ 3.10.8's
# rabbit_quorum_queue), a classic one `single_active_consumer_tag`.
TAG_KEYS = {"classic": "single_active_consumer_tag", "quorum": "single_active_consumer_ctag"}


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_management_shows_the_active_consumer_and_who_waits(connection, cleanup, queue_type):
    tag_key = TAG_KEYS[queue_type]
    name = cleanup.queue(unique("sac-api"))
    plain = cleanup.queue(unique("sac-api-plain"))
    first_channel, second_channel = connection.channel(), connection.channel()
    typed = {"x-queue-type": queue_type}
    first_channel.queue_declare(name, durable=True, arguments={**SAC, **typed})
    first_channel.queue_declare(plain, durable=True, arguments=typed)
    first_channel.basic_consume(name, lambda *args: None, consumer_tag="first")
    second_channel.basic_consume(name, lambda *args: None, consumer_tag="second")
    first_channel.basic_consume(plain, lambda *args: None, consumer_tag="plain")
    path = "/queues/%2F/" + urllib.parse.quote(name, safe="")
    # RabbitMQ's statistics arrive after a collection interval.
    queue = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.2)
        queue = management_get(path)
        # The consumer list and the queue's own figures are separate events in RabbitMQ.
        if len(queue.get("consumer_details", [])) == 2 and queue.get(tag_key) == "first":
            break
    assert queue[tag_key] == "first"
    statuses = {consumer["consumer_tag"]: (consumer["active"], consumer["activity_status"]) for consumer in queue["consumer_details"]}
    assert statuses == {"first": (True, "single_active"), "second": (False, "waiting")}
    plain_queue = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        plain_queue = management_get("/queues/%2F/" + urllib.parse.quote(plain, safe=""))
        if plain_queue.get("consumer_details"):
            break
        connection.process_data_events(time_limit=0.2)
    assert plain_queue[tag_key] is None
    assert [(consumer["active"], consumer["activity_status"]) for consumer in plain_queue["consumer_details"]] == [(True, "up")]
    # The consumer list says the same.
    listed = {consumer["consumer_tag"]: consumer["activity_status"]
              for consumer in management_get("/consumers/%2F") if consumer["queue"]["name"] == name}
    assert listed == {"first": "single_active", "second": "waiting"}
    # Cancelling the active one makes the second active.
    first_channel.basic_cancel("first")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.2)
        queue = management_get(path)
        if queue.get(tag_key) == "second" and len(queue.get("consumer_details", [])) == 1:
            break
    assert queue[tag_key] == "second"
    assert [(c["consumer_tag"], c["activity_status"]) for c in queue["consumer_details"]] == [("second", "single_active")]
