"""A queue's memory and persistence figures (/api/queues/{vhost}/{name}) as RabbitMQ 3.10.8 reports
them. A classic queue (rabbit_variable_queue:info/2) counts a message persistent when it is
persistent (delivery mode 2) in a durable queue, and in memory while it is not paged out, ready and
unacknowledged apart. A quorum queue counts every message persistent and none in memory
(rabbit_quorum_queue's tick, rabbit_fifo:query_in_memory_usage/1 answering {0, 0})."""

import pika
import pytest

from conftest import wait_for

CLASSIC_KEYS = ["messages", "messages_ram", "messages_ready_ram", "messages_unacknowledged_ram", "messages_persistent",
                "messages_paged_out", "message_bytes", "message_bytes_ram", "message_bytes_persistent",
                "message_bytes_paged_out"]
QUORUM_KEYS = ["messages", "messages_ram", "messages_persistent", "message_bytes", "message_bytes_ram",
               "message_bytes_persistent"]


def q(name):
    return name.replace("%", "%25").replace("/", "%2F")


def publish_two_persistent_and_one_transient_and_hold_one(channel, queue):
    """Bodies of 3 and 5 bytes persistent and 4 bytes transient; the first is fetched and held
    unacked. Returns its delivery tag."""
    channel.confirm_delivery()
    for body, mode in ((b"abc", 2), (b"defgh", 2), (b"ijkl", 1)):
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=mode))
    method, _, body = channel.basic_get(queue, auto_ack=False)
    assert body == b"abc"
    return method.delivery_tag


def figures_become(broker, queue, keys, expected):
    """The queue's figures once they are `expected` (RabbitMQ's arrive with its statistics), else
    as they last were."""
    def read():
        info = broker.get("/queues/%2F/" + q(queue)).json()
        return {key: info.get(key) for key in keys}
    return wait_for(lambda: (lambda figures: figures if figures == expected else None)(read())) or read()


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "transient"])
def test_a_classic_queue_counts_its_persistent_messages_and_those_in_memory(lepus, names, durable):
    queue = names("figures")
    conn = lepus.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=durable)
        delivery_tag = publish_two_persistent_and_one_transient_and_hold_one(ch, queue)
        persistent = 1 if durable else 0
        expected = {"messages": 3, "messages_ram": 3, "messages_ready_ram": 2, "messages_unacknowledged_ram": 1,
                    "messages_persistent": 2 * persistent, "messages_paged_out": 0, "message_bytes": 12,
                    "message_bytes_ram": 12, "message_bytes_persistent": 8 * persistent, "message_bytes_paged_out": 0}
        assert figures_become(lepus, queue, CLASSIC_KEYS, expected) == expected
        ch.basic_ack(delivery_tag)
        expected.update({"messages": 2, "messages_ram": 2, "messages_unacknowledged_ram": 0,
                         "messages_persistent": persistent, "message_bytes": 9, "message_bytes_ram": 9,
                         "message_bytes_persistent": 5 * persistent})
        assert figures_become(lepus, queue, CLASSIC_KEYS, expected) == expected
        ch.queue_delete(queue)
    finally:
        conn.close()


def test_a_quorum_queue_counts_every_message_persistent_and_none_in_memory(lepus, names):
    queue = names("figures-quorum")
    conn = lepus.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        publish_two_persistent_and_one_transient_and_hold_one(ch, queue)
        expected = {"messages": 3, "messages_ram": 0, "messages_persistent": 3, "message_bytes": 12,
                    "message_bytes_ram": 0, "message_bytes_persistent": 12}
        assert figures_become(lepus, queue, QUORUM_KEYS, expected) == expected
        info = lepus.get("/queues/%2F/" + q(queue)).json()
        assert not {"messages_ready_ram", "messages_unacknowledged_ram", "message_bytes_paged_out"} & set(info)
        ch.queue_delete(queue)
    finally:
        conn.close()
