"""basic.*: qos, consume, cancel, publish/return, get, ack, nack, reject, recover."""

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import (connect, consume_n, get_all, safe_close, unique,
                      wait_for_count, wait_until)


def fill(ch, queue, n, prefix="m"):
    """Publish n messages with confirms, so they are all enqueued on return."""
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, ("%s%d" % (prefix, i)).encode())


@pytest.fixture
def queue_with(connection, cleanup):
    """queue_with(n) -> a fresh (non-exclusive) queue holding messages m0..m(n-1)."""

    def make(n):
        q = cleanup.queue(unique("q"))
        ch = connection.channel()
        ch.queue_declare(q)
        fill(ch, q, n)
        ch.close()
        return q

    return make


# ---------------------------------------------------------------- qos
#
# "Exactly N deliveries" is decided by a fence, not a quiet period: a basic.get on the same
# channel and queue. The queue answers it after every delivery it has already dispatched to this
# channel, so one delivery too many either arrives before get-ok (and is counted) or has taken
# the message get-ok would name.


def fence_get(connection, channel, queue):
    """basic.get (auto-ack) as a fence; returns (body, message_count) and dispatches every delivery
    that arrived before get-ok to its consumer callback."""
    method, _, body = channel.basic_get(queue, auto_ack=True)
    connection.process_data_events(time_limit=0)
    assert method is not None, "the fence found the queue empty"
    return body, method.message_count


def test_prefetch_count_limits_unacked_deliveries(connection, channel, queue_with):
    q = queue_with(6)
    channel.basic_qos(prefetch_count=2)
    _, got = consume_n(connection, channel, q, 2)
    assert fence_get(connection, channel, q) == (b"m2", 3)
    assert [b for _, _, b in got] == [b"m0", b"m1"], "prefetch 2 and no acks: exactly 2 deliveries"
    channel.basic_ack(got[0][0].delivery_tag)
    wait_until(lambda: len(got) >= 3, conn=connection)
    assert fence_get(connection, channel, q) == (b"m4", 1)
    assert [b for _, _, b in got] == [b"m0", b"m1", b"m3"], "one ack frees exactly one slot"


def test_prefetch_is_per_consumer_by_default(connection, channel, queue_with):
    q = queue_with(10)
    channel.basic_qos(prefetch_count=2)  # global=False: applies to each new consumer
    got_a, got_b = [], []
    channel.basic_consume(q, lambda c, m, p, b: got_a.append(b))
    channel.basic_consume(q, lambda c, m, p, b: got_b.append(b))
    wait_until(lambda: len(got_a) + len(got_b) >= 4, conn=connection)
    assert fence_get(connection, channel, q) == (b"m4", 5)
    assert len(got_a) == 2 and len(got_b) == 2
    assert sorted(got_a + got_b) == [b"m0", b"m1", b"m2", b"m3"]


def test_global_prefetch_is_shared_by_the_channel(connection, channel, queue_with):
    q1, q2 = queue_with(5), queue_with(5)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    got = []
    channel.basic_consume(q1, lambda c, m, p, b: got.append((q1, b)))
    channel.basic_consume(q2, lambda c, m, p, b: got.append((q2, b)))
    wait_until(lambda: len(got) >= 3, conn=connection)
    fenced = {q: fence_get(connection, channel, q) for q in (q1, q2)}
    for q in (q1, q2):
        delivered = sum(1 for queue, _ in got if queue == q)
        assert fenced[q] == (("m%d" % delivered).encode(), 5 - delivered - 1)
    assert len(got) == 3, "global prefetch 3 caps the whole channel at 3 unacked"


def test_qos_prefetch_zero_means_unlimited(connection, channel, queue_with):
    q = queue_with(20)
    channel.basic_qos(prefetch_count=0)
    _, got = consume_n(connection, channel, q, 20)
    assert len(got) == 20


def test_qos_change_applies_to_new_consumers_only(connection, channel, queue_with):
    q = queue_with(7)
    channel.basic_qos(prefetch_count=1)
    _, first = consume_n(connection, channel, q, 1)
    channel.basic_qos(prefetch_count=3)  # per-consumer qos: existing consumer keeps its limit 1
    _, second = consume_n(connection, channel, q, 3)
    assert fence_get(connection, channel, q) == (b"m4", 2)
    assert [b for _, _, b in first] == [b"m0"]
    assert [b for _, _, b in second] == [b"m1", b"m2", b"m3"]


# ---------------------------------------------------------------- consume / cancel

def test_consume_delivers_in_order_with_consumer_tag_and_increasing_tags(connection, channel, queue_with):
    q = queue_with(10)
    tag, got = consume_n(connection, channel, q, 10, consumer_tag="my-tag")
    assert tag == "my-tag"
    assert [b for _, _, b in got] == [("m%d" % i).encode() for i in range(10)]
    assert [m.delivery_tag for m, _, _ in got] == list(range(1, 11))
    assert all(m.consumer_tag == "my-tag" for m, _, _ in got)
    assert all(m.routing_key == q and m.exchange == "" and not m.redelivered for m, _, _ in got)


def test_consume_no_ack_removes_messages_without_ack(connection, channel, queue_with):
    q = queue_with(3)
    _, got = consume_n(connection, channel, q, 3, auto_ack=True)
    assert len(got) == 3
    channel.close()
    ch = connection.channel()
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_ack_of_no_ack_delivery_is_406(connection, channel, queue_with):
    q = queue_with(1)
    _, got = consume_n(connection, channel, q, 1, auto_ack=True)
    channel.basic_ack(got[0][0].delivery_tag)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 406
    assert "unknown delivery tag" in ei.value.reply_text


def test_exclusive_consumer_blocks_second_consumer_with_403(connection, channel, temp_queue):
    channel.basic_consume(temp_queue, lambda *a: None, exclusive=True)
    ch2 = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.basic_consume(temp_queue, lambda *a: None)
    assert ei.value.reply_code == 403
    assert ei.value.reply_text.startswith("ACCESS_REFUSED")
    assert "exclusive use" in ei.value.reply_text
    assert channel.is_open and connection.is_open


def test_exclusive_consume_on_queue_with_consumer_is_403(connection, channel, temp_queue):
    channel.basic_consume(temp_queue, lambda *a: None)
    ch2 = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.basic_consume(temp_queue, lambda *a: None, exclusive=True)
    assert ei.value.reply_code == 403


def test_cancel_stops_deliveries_and_leaves_messages(connection, channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q)
    got = []
    tag = channel.basic_consume(q, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    channel.basic_publish("", q, b"before")
    wait_until(lambda: got, conn=connection)
    channel.basic_cancel(tag)
    assert tag not in channel.consumer_tags
    fill(channel, q, 2, prefix="after")
    # Fence: get-ok comes after any delivery the queue made to the cancelled consumer.
    method, _, body = channel.basic_get(q, auto_ack=True)
    connection.process_data_events(time_limit=0)
    assert (body, method.message_count) == (b"after0", 1)
    assert got == [b"before"]


def test_consumer_round_robin_between_two_consumers(connection, channel, queue_with):
    q = queue_with(0)
    got_a, got_b = [], []
    channel.basic_consume(q, lambda c, m, p, b: got_a.append(b), auto_ack=True)
    channel.basic_consume(q, lambda c, m, p, b: got_b.append(b), auto_ack=True)
    fill(channel, q, 10)
    wait_until(lambda: len(got_a) + len(got_b) >= 10, conn=connection)
    assert len(got_a) == 5 and len(got_b) == 5


def test_consumer_priority_argument(connection, channel, queue_with):
    q = queue_with(0)
    got_low, got_high = [], []
    channel.basic_consume(q, lambda c, m, p, b: got_low.append(b), auto_ack=True,
                          arguments={"x-priority": 1})
    channel.basic_consume(q, lambda c, m, p, b: got_high.append(b), auto_ack=True,
                          arguments={"x-priority": 10})
    fill(channel, q, 6)
    wait_until(lambda: len(got_low) + len(got_high) >= 6, conn=connection)
    assert len(got_high) == 6 and got_low == []


def test_broker_cancels_consumer_when_queue_is_deleted(connection, channel, cleanup):
    q = cleanup.queue(unique("q"))
    channel.queue_declare(q)
    cancelled = []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method))
    tag = channel.basic_consume(q, lambda *a: None)
    connection.channel().queue_delete(q)
    wait_until(lambda: cancelled, conn=connection)
    assert len(cancelled) == 1
    assert isinstance(cancelled[0], pika.spec.Basic.Cancel)
    assert cancelled[0].consumer_tag == tag
    assert channel.is_open, "broker-initiated cancel does not close the channel"
    channel.queue_declare("", exclusive=True)


def test_consume_from_missing_queue_is_404(connection, channel):
    name = unique("q-missing")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.basic_consume(name, lambda *a: None)
    assert ei.value.reply_code == 404
    assert name in ei.value.reply_text
    assert connection.is_open


# ---------------------------------------------------------------- publish / return

def test_mandatory_unroutable_is_returned_with_312_no_route(connection, channel):
    returned = []
    channel.add_on_return_callback(lambda ch, method, props, body: returned.append((method, props, body)))
    key = unique("nowhere")
    channel.basic_publish("amq.direct", key, b"bounce", pika.BasicProperties(message_id="mid-1"),
                          mandatory=True)
    wait_until(lambda: returned, conn=connection)
    assert len(returned) == 1
    method, props, body = returned[0]
    assert method.reply_code == 312
    assert method.reply_text == "NO_ROUTE"
    assert method.exchange == "amq.direct"
    assert method.routing_key == key
    assert body == b"bounce"
    assert props.message_id == "mid-1"
    assert channel.is_open


# In confirm mode a basic.return comes before the publish's basic.ack (pika then raises
# UnroutableError), so a confirmed publish is the fence that proves nothing was returned.

def test_mandatory_routable_is_not_returned(connection, channel, temp_queue):
    returned = []
    channel.add_on_return_callback(lambda *a: returned.append(a))
    channel.confirm_delivery()
    channel.basic_publish("", temp_queue, b"fine", mandatory=True)
    connection.process_data_events(time_limit=0)
    assert returned == []
    assert wait_for_count(temp_queue, 1, channel) == 1


def test_non_mandatory_unroutable_is_dropped_silently(connection, channel):
    returned = []
    channel.add_on_return_callback(lambda *a: returned.append(a))
    channel.confirm_delivery()
    channel.basic_publish("amq.direct", unique("nowhere"), b"dropped")
    connection.process_data_events(time_limit=0)
    assert returned == []
    assert channel.is_open


def test_mandatory_unroutable_in_confirm_mode_is_returned_then_acked(channel):
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as ei:
        channel.basic_publish("amq.direct", unique("nowhere"), b"bounce", mandatory=True)
    assert len(ei.value.messages) == 1
    assert ei.value.messages[0].body == b"bounce"
    assert channel.is_open


def test_publish_to_missing_exchange_is_404_channel_close(connection, channel):
    name = unique("x-missing")
    channel.basic_publish(name, "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 404
    assert ei.value.reply_text.startswith("NOT_FOUND")
    assert name in ei.value.reply_text
    assert connection.is_open


# ---------------------------------------------------------------- get

def test_get_returns_message_and_remaining_count(channel, queue_with):
    q = queue_with(3)
    method, props, body = channel.basic_get(q, auto_ack=True)
    assert isinstance(method, pika.spec.Basic.GetOk)
    assert body == b"m0"
    assert method.message_count == 2
    assert method.redelivered is False
    assert method.exchange == "" and method.routing_key == q
    method, _, _ = channel.basic_get(q, auto_ack=True)
    assert method.message_count == 1


def test_get_on_empty_queue_is_get_empty(channel, temp_queue):
    assert channel.basic_get(temp_queue) == (None, None, None)
    assert channel.is_open


def test_get_from_missing_queue_is_404(channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.basic_get(unique("q-missing"))
    assert ei.value.reply_code == 404


def test_get_and_consume_share_delivery_tag_sequence(connection, channel, queue_with):
    q = queue_with(3)
    m1, _, _ = channel.basic_get(q)
    m2, _, _ = channel.basic_get(q)
    _, got = consume_n(connection, channel, q, 1)
    assert [m1.delivery_tag, m2.delivery_tag, got[0][0].delivery_tag] == [1, 2, 3]


# ---------------------------------------------------------------- ack / nack / reject

def test_ack_multiple_acks_all_up_to_tag(connection, channel, queue_with):
    q = queue_with(5)
    methods = [channel.basic_get(q)[0] for _ in range(5)]
    channel.basic_ack(methods[2].delivery_tag, multiple=True)  # acks 1, 2, 3
    channel.close()
    ch = connection.channel()
    assert wait_for_count(q, 2, ch) == 2
    back = get_all(ch, q)
    assert [b for _, _, b in back] == [b"m3", b"m4"]
    assert all(m.redelivered for m, _, _ in back)


def test_ack_with_tag_zero_and_multiple_acks_everything(connection, channel, queue_with):
    q = queue_with(3)
    for _ in range(3):
        channel.basic_get(q)
    channel.basic_ack(0, multiple=True)
    channel.close()
    ch = connection.channel()
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_nack_multiple_requeue_returns_all_in_order_redelivered(connection, channel, queue_with):
    q = queue_with(4)
    methods = [channel.basic_get(q)[0] for _ in range(3)]
    channel.basic_nack(methods[-1].delivery_tag, multiple=True, requeue=True)
    assert wait_for_count(q, 4, channel) == 4
    back = get_all(channel, q)
    assert [b for _, _, b in back] == [b"m0", b"m1", b"m2", b"m3"]
    assert [m.redelivered for m, _, _ in back] == [True, True, True, False]


def test_nack_without_requeue_discards(connection, channel, queue_with):
    q = queue_with(2)
    method, _, _ = channel.basic_get(q)
    channel.basic_nack(method.delivery_tag, requeue=False)
    back = get_all(channel, q)
    assert [b for _, _, b in back] == [b"m1"]


def test_reject_requeue_redelivers_first_with_redelivered_flag(connection, channel, queue_with):
    q = queue_with(3)
    method, _, body = channel.basic_get(q)
    assert body == b"m0" and method.redelivered is False
    channel.basic_reject(method.delivery_tag, requeue=True)
    assert wait_for_count(q, 3, channel) == 3
    back = get_all(channel, q)
    assert [b for _, _, b in back] == [b"m0", b"m1", b"m2"], "requeued message keeps its place"
    assert [m.redelivered for m, _, _ in back] == [True, False, False]


def test_reject_requeue_to_consumer_comes_back_redelivered(connection, channel, queue_with):
    q = queue_with(1)
    got = []

    def on_message(ch, method, props, body):
        got.append(method)
        if len(got) == 1:
            ch.basic_reject(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(q, on_message)
    wait_until(lambda: len(got) >= 2, conn=connection)
    assert [m.redelivered for m in got] == [False, True]
    assert got[1].delivery_tag > got[0].delivery_tag


def test_reject_without_requeue_discards(connection, channel, queue_with):
    q = queue_with(2)
    method, _, _ = channel.basic_get(q)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert [b for _, _, b in get_all(channel, q)] == [b"m1"]


def test_rejected_message_goes_to_dead_letter_exchange(connection, channel, cleanup):
    dlx = cleanup.exchange(unique("dlx"))
    channel.exchange_declare(dlx, "fanout")
    dead = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(dead, dlx)
    q = channel.queue_declare("", exclusive=True, arguments={"x-dead-letter-exchange": dlx}).method.queue
    channel.basic_publish("", q, b"doomed")
    assert wait_for_count(q, 1, channel) == 1
    method, _, _ = channel.basic_get(q)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert wait_for_count(dead, 1, channel) == 1
    m, props, body = channel.basic_get(dead, auto_ack=True)
    assert body == b"doomed"
    assert props.headers["x-death"][0]["reason"] == "rejected"


def test_unacked_messages_redelivered_when_channel_closes(connection, queue_with):
    q = queue_with(3)
    ch = connection.channel()
    _, got = consume_n(connection, ch, q, 3)
    assert len(got) == 3
    ch.basic_ack(got[0][0].delivery_tag)
    ch.close()
    ch2 = connection.channel()
    assert wait_for_count(q, 2, ch2) == 2
    back = get_all(ch2, q)
    assert [b for _, _, b in back] == [b"m1", b"m2"]
    assert all(m.redelivered for m, _, _ in back)


def test_unacked_messages_redelivered_when_connection_closes(amqp_url, channel, queue_with):
    q = queue_with(2)
    other = connect(amqp_url)
    try:
        och = other.channel()
        m, _, _ = och.basic_get(q)
        m, _, _ = och.basic_get(q)
        assert m.delivery_tag == 2
    finally:
        safe_close(other)
    assert wait_for_count(q, 2, channel) == 2
    back = get_all(channel, q)
    assert [b for _, _, b in back] == [b"m0", b"m1"]
    assert all(m.redelivered for m, _, _ in back)


def test_basic_recover_requeue_redelivers_unacked(connection, channel, queue_with):
    q = queue_with(2)
    _, got = consume_n(connection, channel, q, 2)
    assert [m.redelivered for m, _, _ in got] == [False, False]
    channel.basic_recover(requeue=True)
    wait_until(lambda: len(got) >= 4, conn=connection)
    assert [b for _, _, b in got[2:]] == [b"m0", b"m1"]
    assert [m.redelivered for m, _, _ in got[2:]] == [True, True]
    for m, _, _ in got[2:]:
        channel.basic_ack(m.delivery_tag)
    channel.queue_declare("", exclusive=True)
    assert channel.is_open


def test_unknown_delivery_tag_ack_is_406_channel_close(connection, channel):
    channel.basic_ack(999)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED")
    assert "unknown delivery tag 999" in ei.value.reply_text
    assert connection.is_open


def test_double_ack_is_406(connection, channel, queue_with):
    q = queue_with(1)
    method, _, _ = channel.basic_get(q)
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(method.delivery_tag)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 406
    assert "unknown delivery tag" in ei.value.reply_text


@pytest.mark.parametrize("op", ["nack", "reject"])
def test_unknown_delivery_tag_nack_or_reject_is_406(connection, channel, op):
    if op == "nack":
        channel.basic_nack(77)
    else:
        channel.basic_reject(77)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 406
    assert "unknown delivery tag 77" in ei.value.reply_text


def test_delivery_tags_are_per_channel(connection, queue_with):
    q = queue_with(2)
    ch1, ch2 = connection.channel(), connection.channel()
    m1, _, _ = ch1.basic_get(q)
    m2, _, _ = ch2.basic_get(q)
    assert m1.delivery_tag == 1 and m2.delivery_tag == 1
    # acking tag 1 on ch1 does not ack ch2's message
    ch1.basic_ack(1)
    ch2.close()
    assert wait_for_count(q, 1, ch1) == 1


def test_basic_recover_without_requeue_is_540_not_implemented(connection, channel):
    """RabbitMQ refuses basic.recover(requeue=false) with a connection-level 540."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as ei:
        channel.basic_recover(requeue=False)
    assert ei.value.reply_code == 540
    assert ei.value.reply_text.startswith("NOT_IMPLEMENTED")
    assert connection.is_closed
