"""The node journal: with `--sync always`, a group commit costs one fdatasync for the whole node,
however many durable queues the batch touched (read from the broker's own Prometheus counters)."""

import pika
import pytest

QUEUES = 8
MESSAGES = 1500


def counters(broker):
    metrics = broker.metrics()
    return metrics[("lepus_storage_fsync_seconds_count", frozenset())], metrics[("lepus_storage_group_commits_total", frozenset())]


@pytest.mark.lepus_only("reads Lepus's own fsync and group-commit counters")
def test_one_fdatasync_per_batch_for_many_queues(fresh_lepus):
    conn = fresh_lepus.connect()
    try:
        channel = conn.channel()
        channel.exchange_declare("fan", "fanout", durable=True)
        for index in range(QUEUES):
            channel.queue_declare("journal-q%d" % index, durable=True)
            channel.queue_bind("journal-q%d" % index, "fan")
        channel.confirm_delivery()
        channel.basic_publish("fan", "", b"warm-up", pika.BasicProperties(delivery_mode=2))
        fsyncs_before, commits_before = counters(fresh_lepus)
        for index in range(MESSAGES):
            channel.basic_publish("fan", "", b"m%d" % index, pika.BasicProperties(delivery_mode=2))
        fsyncs, commits = counters(fresh_lepus)
        fsyncs, commits = fsyncs - fsyncs_before, commits - commits_before
        assert commits >= MESSAGES // 2, "synchronous confirms make many small batches"
        # One journal fdatasync per batch; a queue log's own syncs only when a segment is created
        # (its directory) and at a journal checkpoint. Syncing each queue would cost QUEUES per batch.
        assert fsyncs <= commits + 4 * QUEUES, (fsyncs, commits)
        counts = [channel.queue_declare("journal-q%d" % index, passive=True).method.message_count for index in range(QUEUES)]
        assert counts == [MESSAGES + 1] * QUEUES
    finally:
        conn.close()
