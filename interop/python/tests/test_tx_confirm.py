"""tx.select / commit / rollback and confirm.select with basic.ack / basic.nack."""

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import get_all, unique, wait_for_count, wait_until


@pytest.fixture
def queue(channel, cleanup):
    q = cleanup.queue(unique("q-tx"))
    channel.queue_declare(q)
    return q


def test_tx_publish_invisible_until_commit(connection, queue):
    tx = connection.channel()
    ok = tx.tx_select()
    assert isinstance(ok.method, pika.spec.Tx.SelectOk)
    observer = connection.channel()
    tx.basic_publish("", queue, b"t1")
    tx.basic_publish("", queue, b"t2")
    # Fence: the queue answers this passive declare from the tx channel after anything that
    # channel sent it before, so an uncommitted publish that leaked into the queue is counted.
    assert tx.queue_declare(queue, passive=True).method.message_count == 0
    assert observer.basic_get(queue) == (None, None, None)
    ok = tx.tx_commit()
    assert isinstance(ok.method, pika.spec.Tx.CommitOk)
    # commit-ok is sent once the messages are enqueued
    assert observer.queue_declare(queue, passive=True).method.message_count == 2
    assert [b for _, _, b in get_all(observer, queue)] == [b"t1", b"t2"]


def test_tx_rollback_discards_publishes(connection, queue):
    tx = connection.channel()
    tx.tx_select()
    tx.basic_publish("", queue, b"discard me")
    ok = tx.tx_rollback()
    assert isinstance(ok.method, pika.spec.Tx.RollbackOk)
    tx.tx_commit()  # nothing left to commit
    assert tx.queue_declare(queue, passive=True).method.message_count == 0
    # the channel stays transactional: a new publish + commit works
    tx.basic_publish("", queue, b"kept")
    tx.tx_commit()
    assert [b for _, _, b in get_all(tx, queue)] == [b"kept"]


def test_tx_rollback_discards_acks(connection, channel, queue):
    channel.basic_publish("", queue, b"m")
    assert wait_for_count(queue, 1, channel) == 1
    tx = connection.channel()
    tx.tx_select()
    method, _, body = tx.basic_get(queue)
    assert body == b"m"
    tx.basic_ack(method.delivery_tag)
    tx.tx_rollback()
    tx.close()  # the ack was rolled back, so the message is still unacked -> requeued
    assert wait_for_count(queue, 1, channel) == 1
    m, _, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"m" and m.redelivered is True


def test_tx_commit_applies_acks(connection, channel, queue):
    channel.basic_publish("", queue, b"m")
    assert wait_for_count(queue, 1, channel) == 1
    tx = connection.channel()
    tx.tx_select()
    method, _, _ = tx.basic_get(queue)
    tx.basic_ack(method.delivery_tag)
    tx.tx_commit()
    tx.close()
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_tx_commit_without_select_is_406(connection, channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.tx_commit()
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED")
    assert "not transactional" in ei.value.reply_text
    assert connection.is_open


def test_tx_rollback_without_select_is_406(connection, channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.tx_rollback()
    assert ei.value.reply_code == 406


def test_confirm_select_on_tx_channel_is_406(connection, channel):
    channel.tx_select()
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.confirm_delivery()
    assert ei.value.reply_code == 406
    assert "tx" in ei.value.reply_text


def test_tx_select_on_confirm_channel_is_406(connection, channel):
    channel.confirm_delivery()
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.tx_select()
    assert ei.value.reply_code == 406
    assert "confirm" in ei.value.reply_text


def test_confirm_nack_when_queue_rejects_publish(channel):
    q = channel.queue_declare("", exclusive=True,
                              arguments={"x-max-length": 1, "x-overflow": "reject-publish"}).method.queue
    channel.confirm_delivery()
    channel.basic_publish("", q, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", q, b"overflow")
    assert channel.is_open
    assert [b for _, _, b in get_all(channel, q)] == [b"fits"]


def test_confirm_ack_for_unroutable_non_mandatory_publish(channel):
    channel.confirm_delivery()
    channel.basic_publish("amq.direct", unique("nowhere"), b"x")  # acked, no error
    assert channel.is_open


def test_confirm_delivery_tags_count_from_one_and_ack(connection):
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    acks = []
    impl = ch._impl
    ch.confirm_delivery()
    impl.add_callback(lambda frame: acks.append(frame.method), [pika.spec.Basic.Ack], one_shot=False)
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    wait_until(lambda: acks and max(a.delivery_tag for a in acks) >= 2, conn=connection)
    assert max(a.delivery_tag for a in acks) == 2
    assert min(a.delivery_tag for a in acks) == 1
