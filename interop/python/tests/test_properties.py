"""Message content: basic properties, header tables, body sizes."""

import datetime
import decimal
import os

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import consume_n, get_all, wait_for_count

RICH_HEADERS = {
    "string": "text",
    "unicode": "h\u00e9llo \u2713",
    "int": 42,
    "negative": -7,
    "int64": 2 ** 40,
    "true": True,
    "false": False,
    "bytes": b"\x00\x01\xfe\xff",
    "decimal": decimal.Decimal("3.14"),
    "timestamp": datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
    "void": None,
    "array": [1, "two", True, None, [3, 4]],
    "empty_array": [],
    "empty_table": {},
    "nested": {"level1": {"level2": {"n": 1, "list": [{"deep": "yes"}]}}},
}


def full_properties(user_id):
    return pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers=RICH_HEADERS,
        delivery_mode=2,
        priority=7,
        correlation_id="corr-123",
        reply_to="reply.queue",
        expiration="60000",
        message_id="msg-456",
        timestamp=1700000000,
        type="order.created",
        user_id=user_id,
        app_id="lepus-interop",
    )


PROPERTY_NAMES = ["content_type", "content_encoding", "headers", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                  "user_id", "app_id"]


def assert_same_properties(got, sent):
    for name in PROPERTY_NAMES:
        assert getattr(got, name) == getattr(sent, name), name


def test_all_basic_properties_round_trip_via_get(connection, channel, temp_queue):
    sent = full_properties(connection._impl.params.credentials.username)
    channel.basic_publish("", temp_queue, b"{}", sent)
    assert wait_for_count(temp_queue, 1, channel) == 1
    method, props, body = channel.basic_get(temp_queue, auto_ack=True)
    assert body == b"{}"
    assert_same_properties(props, sent)
    assert props.cluster_id is None


def test_all_basic_properties_round_trip_via_consume(connection, channel, temp_queue):
    sent = full_properties(connection._impl.params.credentials.username)
    channel.basic_publish("", temp_queue, b"payload", sent)
    _, got = consume_n(connection, channel, temp_queue, 1, auto_ack=True)
    assert got[0][2] == b"payload"
    assert_same_properties(got[0][1], sent)


def test_header_table_value_types_round_trip(channel, temp_queue):
    channel.basic_publish("", temp_queue, b"h", pika.BasicProperties(headers=RICH_HEADERS))
    assert wait_for_count(temp_queue, 1, channel) == 1
    _, props, _ = channel.basic_get(temp_queue, auto_ack=True)
    for key, value in RICH_HEADERS.items():
        assert props.headers[key] == value, key
        assert isinstance(props.headers[key], type(value)), key
    assert set(props.headers) == set(RICH_HEADERS)


def test_no_properties_stay_absent(channel, temp_queue):
    channel.basic_publish("", temp_queue, b"bare")
    assert wait_for_count(temp_queue, 1, channel) == 1
    _, props, _ = channel.basic_get(temp_queue, auto_ack=True)
    for name in PROPERTY_NAMES:
        assert getattr(props, name) is None, name


def test_user_id_must_match_authenticated_user(connection, channel, temp_queue):
    channel.basic_publish("", temp_queue, b"x", pika.BasicProperties(user_id="not-" + connection._impl.params.credentials.username))
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED")
    assert "user_id" in ei.value.reply_text
    assert connection.is_open


def test_invalid_delivery_mode_is_406(connection, channel, temp_queue):
    channel.basic_publish("", temp_queue, b"x", pika.BasicProperties(delivery_mode=3))
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 406


def test_per_message_expiration_expires_message(connection, channel, temp_queue):
    channel.confirm_delivery()
    channel.basic_publish("", temp_queue, b"gone", pika.BasicProperties(expiration="1"))
    channel.basic_publish("", temp_queue, b"kept", pika.BasicProperties(expiration="60000"))
    connection.sleep(0.2)
    msgs = get_all(channel, temp_queue)
    assert [b for _, _, b in msgs] == [b"kept"]
    assert msgs[0][1].expiration == "60000"


@pytest.mark.parametrize("size", [0, 1, 131072 - 8, 131072 - 7, 131072, 1024 * 1024, 3 * 1024 * 1024 + 17])
def test_body_sizes_round_trip(connection, channel, temp_queue, size):
    """Empty bodies (no body frame), frame-boundary sizes and multi-frame (1 MiB+) bodies."""
    body = os.urandom(size)
    channel.basic_publish("", temp_queue, body)
    _, got = consume_n(connection, channel, temp_queue, 1, auto_ack=True, timeout=10)
    assert len(got) == 1
    assert len(got[0][2]) == size
    assert got[0][2] == body


def test_large_message_with_small_frame_max(connection_factory):
    conn = connection_factory(frame_max=4096)
    assert conn._impl.params.frame_max == 4096
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = os.urandom(256 * 1024 + 3)
    ch.basic_publish("", q, body, pika.BasicProperties(headers={"k": "v" * 2000}))
    _, got = consume_n(conn, ch, q, 1, auto_ack=True)
    assert got[0][2] == body
    assert got[0][1].headers == {"k": "v" * 2000}


def test_binary_body_all_byte_values(channel, temp_queue):
    body = bytes(range(256)) * 4
    channel.basic_publish("", temp_queue, body)
    assert wait_for_count(temp_queue, 1, channel) == 1
    _, _, got = channel.basic_get(temp_queue, auto_ack=True)
    assert got == body


def test_message_order_is_preserved(connection, channel, temp_queue):
    n = 500
    for i in range(n):
        channel.basic_publish("", temp_queue, str(i).encode())
    _, got = consume_n(connection, channel, temp_queue, n, auto_ack=True)
    assert [int(b) for _, _, b in got] == list(range(n))
