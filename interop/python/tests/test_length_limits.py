"""`x-max-length-bytes` (and the `max-length-bytes` policy key) through pika, as RabbitMQ 3.10.8
counts it: the body bytes of ready messages, with `x-overflow` drop-head (the oldest go) and
reject-publish (the new one is nacked), alongside `x-max-length`; RabbitMQ's 406 texts for bad values.
"""

import time

import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

from conftest import get_all, message_count, unique
from test_dead_lettering import policies  # noqa: F401 (a fixture)

SETTLE_SECONDS = 0.5


def test_drop_head_drops_the_oldest_until_the_bytes_fit(channel, cleanup):
    queue = cleanup.queue(unique("bytes"))
    channel.queue_declare(queue, arguments={"x-max-length-bytes": 10})
    for body in (b"1234", b"5678", b"9abc"):
        channel.basic_publish("", queue, body)
    assert [body for _, _, body in get_all(channel, queue)] == [b"5678", b"9abc"]


def test_a_body_above_the_limit_is_dropped_on_its_own(channel, cleanup):
    queue = cleanup.queue(unique("bytes"))
    channel.queue_declare(queue, arguments={"x-max-length-bytes": 3})
    channel.basic_publish("", queue, b"ok")
    channel.basic_publish("", queue, b"too long")
    time.sleep(SETTLE_SECONDS)
    assert message_count(queue, channel) == 0, "the big one took the room of the small one, then went too"


def test_reject_publish_nacks_what_does_not_fit(channel, cleanup):
    queue = cleanup.queue(unique("bytes"))
    channel.queue_declare(queue, arguments={"x-max-length-bytes": 10, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"1234")
    channel.basic_publish("", queue, b"5678")
    with pytest.raises(NackError):
        channel.basic_publish("", queue, b"9abc")
    channel.basic_publish("", queue, b"12", mandatory=False)
    assert [body for _, _, body in get_all(channel, queue)] == [b"1234", b"5678", b"12"]


def test_either_limit_applies(channel, cleanup):
    queue = cleanup.queue(unique("both"))
    channel.queue_declare(queue, arguments={"x-max-length-bytes": 1000, "x-max-length": 2})
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", queue, body)
    assert [body for _, _, body in get_all(channel, queue)] == [b"b", b"c"]


def test_policy_max_length_bytes_applies_and_the_lower_limit_wins(channel, cleanup, policies):  # noqa: F811
    prefix = unique("bytespolicy")
    status, body = policies(prefix, "^" + prefix, {"max-length-bytes": 4})
    assert status in (201, 204), body
    queue = cleanup.queue(prefix + "-q")
    channel.queue_declare(queue, arguments={"x-max-length-bytes": 100})
    time.sleep(SETTLE_SECONDS)
    for body in (b"12", b"34", b"56"):
        channel.basic_publish("", queue, body)
    assert [body for _, _, body in get_all(channel, queue)] == [b"34", b"56"]


@pytest.mark.parametrize("value, problem", [
    (-1, "{value_negative,-1}"),
    ("ten", '"expected integer, got longstr"'),
])
def test_bad_x_max_length_bytes_is_refused_with_rabbitmq_texts(connection, value, problem):
    queue = unique("bad")
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(queue, arguments={"x-max-length-bytes": value})
    assert (refused.value.reply_code, refused.value.reply_text) == (
        406, "PRECONDITION_FAILED - invalid arg 'x-max-length-bytes' for queue '%s' in vhost '/': %s" % (queue, problem))
