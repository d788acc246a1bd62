"""RabbitMQ's Prometheus names: every `rabbitmq_*` metric that RabbitMQ's published RabbitMQ-Overview
Grafana dashboard (rabbitmq-server deps/rabbitmq_prometheus/docker/grafana/dashboards, 3.10.8)
queries, answered with data by a broker under a little load, on /metrics, and the per-object and
detailed endpoints with their labels and filters.

Against RabbitMQ these run on the reference node with its rabbitmq_prometheus plugin
(scripts/rabbitmq-reference.sh exports METRICS_URL): what Lepus must answer is what RabbitMQ answers.
The RabbitMQ-Quorum-Queues-Raft dashboard's Raft families (ra_metrics) are answered for a quorum queue
under load too; Lepus's queues share Raft groups (shards), so a queue's figures are its shard's.
The RabbitMQ-Stream dashboard's `protocol="stream"` families are answered for load and refusals
driven through the RabbitMQ Stream protocol with rstream, RabbitMQ's Python stream client."""

import asyncio
import os
import time

import pika
import pytest
from rstream import Consumer, Producer, exceptions as stream_errors
from rstream.client import Addr, ClientPool
from rstream.constants import OffsetType
from rstream.schema import OffsetSpec

from conftest import WAIT_S, Lepus, free_port, lepus_binary, publish_twelve_body_bytes_and_hold_three, wait_for

# The RabbitMQ-Overview dashboard's metric names (the list is kept here, not the dashboard file).
DASHBOARD_METRICS = [
    "rabbitmq_identity_info",
    "rabbitmq_build_info",
    "rabbitmq_connections",
    "rabbitmq_channels",
    "rabbitmq_queues",
    "rabbitmq_consumers",
    "rabbitmq_channel_consumers",
    "rabbitmq_queue_messages_ready",
    "rabbitmq_queue_messages_unacked",
    "rabbitmq_connections_opened_total",
    "rabbitmq_connections_closed_total",
    "rabbitmq_channels_opened_total",
    "rabbitmq_channels_closed_total",
    "rabbitmq_queues_declared_total",
    "rabbitmq_queues_created_total",
    "rabbitmq_queues_deleted_total",
    "rabbitmq_global_messages_received_total",
    "rabbitmq_global_messages_received_confirm_total",
    "rabbitmq_global_messages_routed_total",
    "rabbitmq_global_messages_unroutable_dropped_total",
    "rabbitmq_global_messages_unroutable_returned_total",
    "rabbitmq_global_messages_confirmed_total",
    "rabbitmq_global_messages_delivered_consume_manual_ack_total",
    "rabbitmq_global_messages_delivered_consume_auto_ack_total",
    "rabbitmq_global_messages_delivered_get_manual_ack_total",
    "rabbitmq_global_messages_delivered_get_auto_ack_total",
    "rabbitmq_global_messages_redelivered_total",
    "rabbitmq_global_messages_get_empty_total",
    "rabbitmq_global_messages_acknowledged_total",
    "rabbitmq_process_resident_memory_bytes",
    "rabbitmq_resident_memory_limit_bytes",
    "rabbitmq_process_open_fds",
    "rabbitmq_process_max_fds",
    "rabbitmq_process_open_tcp_sockets",
    "rabbitmq_process_max_tcp_sockets",
    "rabbitmq_disk_space_available_bytes",
]

# Beyond the Overview dashboard: the connection traffic families RabbitMQ's monitoring guide
# charts ("Network Bytes Transmitted/Received", connection_coarse_metrics and connection_metrics)
# and the node's fdatasync count and time (node_persister_metrics).
TRAFFIC_AND_IO_METRICS = [
    "rabbitmq_connection_incoming_bytes_total",
    "rabbitmq_connection_outgoing_bytes_total",
    "rabbitmq_connection_incoming_packets_total",
    "rabbitmq_connection_outgoing_packets_total",
    "rabbitmq_io_sync_ops_total",
    "rabbitmq_io_sync_time_seconds_total",
]

# The RabbitMQ-Quorum-Queues-Raft dashboard's names (rabbitmq_raft_log_last_applied_index is not
# charted there but is the same ra_metrics family, so it is held to the same standard).
RAFT_DASHBOARD_METRICS = [
    "rabbitmq_raft_term_total",
    "rabbitmq_raft_log_snapshot_index",
    "rabbitmq_raft_log_last_applied_index",
    "rabbitmq_raft_log_commit_index",
    "rabbitmq_raft_log_last_written_index",
    "rabbitmq_raft_entry_commit_latency_seconds",
]

# What publishing to a quorum queue makes above zero on both brokers (no snapshot is taken for a
# few entries; RabbitMQ's commit latency has millisecond resolution, so it may read 0 there).
RAFT_NONZERO = ["rabbitmq_raft_term_total", "rabbitmq_raft_log_last_applied_index", "rabbitmq_raft_log_commit_index",
                "rabbitmq_raft_log_last_written_index"]

# What the load below makes above zero, on both brokers. Each count the load makes is at least 1,
# so a family that is written but never counted fails here, naming itself.
NONZERO = [
    "rabbitmq_connections", "rabbitmq_channels", "rabbitmq_queues", "rabbitmq_consumers", "rabbitmq_channel_consumers",
    "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
    "rabbitmq_connections_opened_total", "rabbitmq_connections_closed_total",
    "rabbitmq_channels_opened_total", "rabbitmq_channels_closed_total",
    "rabbitmq_queues_declared_total", "rabbitmq_queues_created_total", "rabbitmq_queues_deleted_total",
    "rabbitmq_global_messages_received_total", "rabbitmq_global_messages_received_confirm_total",
    "rabbitmq_global_messages_routed_total", "rabbitmq_global_messages_unroutable_dropped_total",
    "rabbitmq_global_messages_unroutable_returned_total", "rabbitmq_global_messages_confirmed_total",
    "rabbitmq_global_messages_delivered_consume_manual_ack_total",
    "rabbitmq_global_messages_delivered_consume_auto_ack_total",
    "rabbitmq_global_messages_delivered_get_manual_ack_total",
    "rabbitmq_global_messages_delivered_get_auto_ack_total",
    "rabbitmq_global_messages_redelivered_total", "rabbitmq_global_messages_get_empty_total",
    "rabbitmq_global_messages_acknowledged_total",
    "rabbitmq_process_resident_memory_bytes", "rabbitmq_process_open_fds", "rabbitmq_process_open_tcp_sockets",
    "rabbitmq_disk_space_available_bytes", "rabbitmq_identity_info",
    "rabbitmq_connection_incoming_bytes_total", "rabbitmq_connection_outgoing_bytes_total",
    "rabbitmq_connection_incoming_packets_total", "rabbitmq_connection_outgoing_packets_total",
    "rabbitmq_io_sync_ops_total",
]


def summed(samples):
    values = {}
    for (name, _labels), value in samples.items():
        values[name] = values.get(name, 0) + value
    return values


def make_load(broker, names):
    """Leaves, on a fresh broker: queue `work` with 3 unacked and some ready, a held queue, a
    consumer on an open channel; and behind it every counter above at least once: confirmed and
    unroutable publishes (dropped and returned), gets with and without ack and an empty get, a
    redelivery, an ack, a no-ack consumer, a closed channel and connection, a deleted queue."""
    work, held, gone = names("prom-work"), names("prom-held"), names("prom-gone")
    brief = broker.connect()
    side = brief.channel()
    side.queue_declare(gone)
    side.queue_delete(gone)
    side.close()
    brief.close()
    connection = broker.connect()
    channel = connection.channel()
    channel.queue_declare(work)
    channel.queue_declare(held)
    channel.confirm_delivery()
    # A persistent message confirmed from a durable queue: an fdatasync on both brokers.
    durable = names("prom-durable")
    channel.queue_declare(durable, durable=True)
    channel.basic_publish("", durable, b"synced", pika.BasicProperties(delivery_mode=2))
    for index in range(10):
        channel.basic_publish("", work, b"m%d" % index)
        channel.basic_publish("", held, b"h%d" % index)
    channel.basic_publish("", names("nowhere"), b"dropped")
    # pika's confirming channel raises for a returned message: the return is what is counted.
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", names("nowhere"), b"returned", mandatory=True)
    _, _, _ = channel.basic_get(held, auto_ack=True)
    method, _, _ = channel.basic_get(held, auto_ack=False)
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, _ = channel.basic_get(held, auto_ack=False)
    assert method.redelivered
    channel.basic_ack(method.delivery_tag)
    empty = channel.queue_declare(names("prom-empty"), auto_delete=True).method.queue
    assert channel.basic_get(empty, auto_ack=True) == (None, None, None)
    no_ack = connection.channel()
    auto = no_ack.queue_declare(names("prom-auto"), auto_delete=True).method.queue
    no_ack.basic_publish("", auto, b"to no-ack")
    no_ack_received = []
    no_ack.basic_consume(auto, lambda ch, m, p, b: no_ack_received.append(b), auto_ack=True)
    wait_for(lambda: connection.process_data_events(time_limit=0.05) or no_ack_received)
    no_ack.close()
    channel.basic_qos(prefetch_count=3)
    received = []
    channel.basic_consume(work, lambda ch, m, p, b: received.append(m.delivery_tag))
    wait_for(lambda: connection.process_data_events(time_limit=0.05) or len(received) >= 3)
    channel.basic_ack(received[0])
    wait_for(lambda: connection.process_data_events(time_limit=0.05) or len(received) >= 4)
    return connection, work, held


def test_every_overview_dashboard_metric_answers_with_data(fresh_lepus, names):
    broker = fresh_lepus
    if broker.metrics_port is None:
        pytest.skip("the broker's metrics endpoint is unknown (set METRICS_URL)")
    connection, _, _ = make_load(broker, names)
    try:
        last = {}

        def scraped():
            values = summed(broker.metrics())
            last.clear()
            last.update(values)
            return values if all(values.get(name, 0) > 0 for name in NONZERO) else None

        # RabbitMQ refreshes its core metrics every collect_statistics_interval; on a timeout
        # the last scrape is checked, so the failure names what is missing or zero.
        values = wait_for(scraped, timeout=15) or last
        missing = [name for name in DASHBOARD_METRICS + TRAFFIC_AND_IO_METRICS if name not in values]
        assert not missing, missing
        empty = [name for name in NONZERO if values.get(name, 0) <= 0]
        assert not empty, (empty, values)
        samples = broker.metrics()
        identity = [labels for (name, labels) in samples if name == "rabbitmq_identity_info"]
        assert {key for key, _ in identity[0]} == {"rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"}
        # One sample per protocol (amqp091, stream), in no particular order.
        received = [labels for (name, labels) in samples if name == "rabbitmq_global_messages_received_total"]
        assert any(("protocol", "amqp091") in labels for labels in received), received
        delivered = [labels for (name, labels) in samples if name == "rabbitmq_global_messages_acknowledged_total"]
        assert any({("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue")} <= labels for labels in delivered), delivered
    finally:
        connection.close()


def amqp_publishers(broker):
    """rabbitmq_global_publishers{protocol="amqp091"}: the open channels that have published."""
    return broker.metrics()[("rabbitmq_global_publishers", frozenset({("protocol", "amqp091")}))]


def test_counters_count_exactly(fresh_lepus, names):
    """Counters of a fresh broker move by exactly what the client did (RabbitMQ's counters are
    node-wide and other suites share the reference node, so only Lepus is checked exactly)."""
    broker = fresh_lepus
    if not getattr(broker, "is_lepus", False) or broker.metrics_port is None:
        pytest.skip("exact counts need a broker no other client uses (a Lepus the suite started)")
    before = summed(broker.metrics())
    connection = broker.connect()
    try:
        channel = connection.channel()
        queue = channel.queue_declare(names("prom-exact")).method.queue
        channel.confirm_delivery()
        for index in range(7):
            channel.basic_publish("", queue, b"x%d" % index)
        channel.basic_publish("", names("nowhere"), b"dropped")
        for _ in range(7):
            method, _, _ = channel.basic_get(queue, auto_ack=False)
            channel.basic_ack(method.delivery_tag)
        # A channel that has published is a publisher until it closes; one that has not is none.
        connection.channel()
        assert amqp_publishers(broker) == 1
        channel.close()
        assert amqp_publishers(broker) == 0
    finally:
        connection.close()
    expected = {
        "rabbitmq_global_messages_received_total": 8,
        "rabbitmq_global_messages_received_confirm_total": 8,
        "rabbitmq_global_messages_confirmed_total": 8,
        "rabbitmq_global_messages_routed_total": 7,
        "rabbitmq_global_messages_unroutable_dropped_total": 1,
        "rabbitmq_global_messages_delivered_get_manual_ack_total": 7,
        "rabbitmq_global_messages_acknowledged_total": 7,
        "rabbitmq_queues_declared_total": 1,
        "rabbitmq_queues_created_total": 1,
        "rabbitmq_channels_opened_total": 2,
        "rabbitmq_channels_closed_total": 2,
    }

    def moved():
        after = summed(broker.metrics())
        return {name: after.get(name, 0) - before.get(name, 0) for name in expected}

    # The connection's close is counted once its reader task has gone.
    deadline = time.monotonic() + 5
    while moved() != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert moved() == expected


def test_per_object_metrics_label_each_queue_and_channel(fresh_lepus, names):
    broker = fresh_lepus
    if broker.metrics_port is None:
        pytest.skip("the broker's metrics endpoint is unknown (set METRICS_URL)")
    connection, work, held = make_load(broker, names)
    try:
        def per_queue():
            samples = broker.metrics("/per-object")
            ready = {dict(labels).get("queue"): value for (name, labels), value in samples.items()
                     if name == "rabbitmq_queue_messages_ready" and ("vhost", "/") in labels}
            unacked = {dict(labels).get("queue"): value for (name, labels), value in samples.items()
                       if name == "rabbitmq_queue_messages_unacked"}
            channels = [labels for (name, labels) in samples if name == "rabbitmq_channel_consumers"]
            done = ready.get(held, 0) >= 8 and unacked.get(work) == 3 and channels
            return (ready, unacked, channels) if done else None

        found = wait_for(per_queue, timeout=15)
        assert found, broker.metrics("/per-object")
        ready, unacked, channels = found
        assert ready[held] == 8 and unacked[work] == 3
        assert all(dict(labels).get("channel") for labels in channels)
    finally:
        connection.close()


def test_detailed_metrics_give_only_the_families_and_vhosts_asked_for(fresh_lepus, names):
    broker = fresh_lepus
    if broker.metrics_port is None:
        pytest.skip("the broker's metrics endpoint is unknown (set METRICS_URL)")
    other_vhost = names("prom-vhost")
    assert broker.put("/vhosts/" + other_vhost).status_code in (201, 204)
    connection, work, _ = make_load(broker, names)
    try:
        nothing = broker.metrics("/detailed")
        assert not [name for (name, _) in nothing if name.startswith("rabbitmq_detailed_")], sorted(nothing)[:20]

        def asked():
            samples = broker.metrics("/detailed", params=[("family", "queue_coarse_metrics"), ("vhost", "/")])
            ready = {dict(labels).get("queue"): value for (name, labels), value in samples.items()
                     if name == "rabbitmq_detailed_queue_messages_ready"}
            return samples if ready.get(work, 0) >= 6 else None

        samples = wait_for(asked, timeout=15)
        assert samples, broker.metrics("/detailed", params=[("family", "queue_coarse_metrics"), ("vhost", "/")])
        detailed = {name for (name, _) in samples if name.startswith("rabbitmq_detailed_")}
        assert detailed == {"rabbitmq_detailed_queue_messages_ready", "rabbitmq_detailed_queue_messages_unacked",
                            "rabbitmq_detailed_queue_messages", "rabbitmq_detailed_queue_process_reductions_total"} \
            or detailed == {"rabbitmq_detailed_queue_messages_ready", "rabbitmq_detailed_queue_messages_unacked",
                            "rabbitmq_detailed_queue_messages"}, detailed
        assert all(dict(labels).get("vhost") == "/" for (name, labels) in samples if name.startswith("rabbitmq_detailed_"))
        other = broker.metrics("/detailed", params=[("family", "queue_coarse_metrics"), ("vhost", other_vhost)])
        assert not [name for (name, labels) in other if name.startswith("rabbitmq_detailed_queue")], other
    finally:
        connection.close()
        broker.delete("/vhosts/" + other_vhost)


def test_queue_metrics_give_each_queues_body_bytes(fresh_lepus, names):
    """`queue_metrics` carries a queue's ready, unacknowledged and total body bytes (RabbitMQ's
    rabbitmq_queue_messages_ready_bytes, _unacked_bytes and _bytes)."""
    broker = fresh_lepus
    if broker.metrics_port is None:
        pytest.skip("the broker's metrics endpoint is unknown (set METRICS_URL)")
    queue = names("bytes")
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        delivery_tag = publish_twelve_body_bytes_and_hold_three(channel, queue)

        def byte_gauges():
            samples = broker.metrics("/detailed", params=[("family", "queue_metrics"), ("vhost", "/")])
            mine = {name: value for (name, labels), value in samples.items() if dict(labels).get("queue") == queue}
            found = {suffix: mine.get("rabbitmq_detailed_queue_messages" + suffix) for suffix in ("_bytes", "_ready_bytes", "_unacked_bytes")}
            return found if found == {"_bytes": 12, "_ready_bytes": 9, "_unacked_bytes": 3} else None

        found = wait_for(byte_gauges, timeout=15)
        assert found, sorted((name, value) for (name, labels), value in
                             broker.metrics("/detailed", params=[("family", "queue_metrics"), ("vhost", "/")]).items()
                             if dict(labels).get("queue") == queue)
        channel.basic_ack(delivery_tag)
        channel.queue_delete(queue)
    finally:
        connection.close()


@pytest.mark.lepus_only("Lepus's own confirm latency histogram")
def test_confirm_latency_histogram_counts_every_synced_confirm(fresh_lepus, names):
    broker = fresh_lepus
    before = summed(broker.metrics()).get("lepus_confirm_latency_seconds_count", 0)
    connection = broker.connect()
    try:
        channel = connection.channel()
        queue = channel.queue_declare(names("prom-latency"), durable=True).method.queue
        channel.confirm_delivery()
        for index in range(20):
            channel.basic_publish("", queue, b"p%d" % index, pika.BasicProperties(delivery_mode=2))
        channel.queue_delete(queue)
    finally:
        connection.close()
    samples = broker.metrics()
    values = summed(samples)
    assert values["lepus_confirm_latency_seconds_count"] - before == 20
    buckets = sorted(value for (name, _), value in samples.items() if name == "lepus_confirm_latency_seconds_bucket")
    assert buckets[-1] == values["lepus_confirm_latency_seconds_count"]
    assert values["lepus_confirm_latency_seconds_sum"] > 0


@pytest.mark.lepus_only("Lepus's own delivery latency histogram")
def test_delivery_latency_histogram_counts_first_deliveries(fresh_lepus, names):
    broker = fresh_lepus
    before = summed(broker.metrics()).get("lepus_delivery_latency_seconds_count", 0)
    connection = broker.connect()
    try:
        channel = connection.channel()
        queue = channel.queue_declare(names("prom-delivery"), durable=True).method.queue
        for index in range(20):
            channel.basic_publish("", queue, b"d%d" % index, pika.BasicProperties(delivery_mode=2))
        received = []
        channel.basic_consume(queue, lambda ch, m, p, b: received.append(m))
        wait_for(lambda: connection.process_data_events(time_limit=0.05) or len(received) >= 20)
        # Put back and delivered again: redeliveries are not counted.
        channel.basic_nack(received[-1].delivery_tag, multiple=True, requeue=True)
        wait_for(lambda: connection.process_data_events(time_limit=0.05) or len(received) >= 40)
        assert len(received) == 40 and all(m.redelivered for m in received[20:])
        channel.basic_ack(received[-1].delivery_tag, multiple=True)
        channel.queue_delete(queue)
    finally:
        connection.close()
    samples = broker.metrics()
    values = summed(samples)
    assert values["lepus_delivery_latency_seconds_count"] - before == 20
    buckets = sorted(value for (name, _), value in samples.items() if name == "lepus_delivery_latency_seconds_bucket")
    assert buckets[-1] == values["lepus_delivery_latency_seconds_count"]
    assert values["lepus_delivery_latency_seconds_sum"] > 0


@pytest.mark.lepus_only("Lepus's own traffic and exchange counters, exact on a broker the suite started")
def test_traffic_and_exchange_counters(fresh_lepus, names):
    broker = fresh_lepus
    exchange, first, second = names("prom-x"), names("prom-q1"), names("prom-q2")
    before = summed(broker.metrics())
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.exchange_declare(exchange, "fanout")
        for queue in (first, second):
            channel.queue_declare(queue)
            channel.queue_bind(queue, exchange)
        channel.confirm_delivery()
        for _ in range(7):
            channel.basic_publish(exchange, "", b"x" * 1000)
        while_open = summed(broker.metrics())
    finally:
        connection.close()
    # The closed connection's traffic stays counted: the counters never go back.
    assert wait_for(lambda: summed(broker.metrics()).get("lepus_connections", 1) == 0)
    after = summed(broker.metrics())
    received = after["lepus_network_received_bytes_total"] - before.get("lepus_network_received_bytes_total", 0)
    # Seven bodies of 1,000 bytes, their frames, the handshake and the declarations: at most 2 KiB more.
    assert 7000 < received < 7000 + 2048, received
    assert after["lepus_network_received_bytes_total"] >= while_open["lepus_network_received_bytes_total"]
    assert after["lepus_network_sent_bytes_total"] > before.get("lepus_network_sent_bytes_total", 0)
    assert after["lepus_network_received_packets_total"] > before.get("lepus_network_received_packets_total", 0)
    assert after["lepus_network_sent_packets_total"] > before.get("lepus_network_sent_packets_total", 0)
    samples = broker.metrics()
    published = {(name, dict(labels).get("exchange")): value for (name, labels), value in samples.items()
                 if name.startswith("lepus_exchange_messages_published")}
    assert published[("lepus_exchange_messages_published_in_total", exchange)] == 7
    assert published[("lepus_exchange_messages_published_out_total", exchange)] == 14


def publish_to_quorum_queue(broker, queue, count):
    """Declares quorum queue `queue` and publishes `count` persistent messages to it, each confirmed."""
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        for index in range(count):
            channel.basic_publish("", queue, b"r%d" % index, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def raft_samples_of(samples, queue, prefix="rabbitmq_raft_"):
    """{family: value} of the per-object samples labelled vhost "/" and `queue`."""
    return {name: value for (name, labels), value in samples.items()
            if name.startswith(prefix) and dict(labels).get("queue") == queue and dict(labels).get("vhost") == "/"}


def test_every_quorum_queues_raft_dashboard_metric_answers_with_data(fresh_lepus, names):
    broker = fresh_lepus
    if broker.metrics_port is None:
        pytest.skip("the broker's metrics endpoint is unknown (set METRICS_URL)")
    queue = names("prom-raft")
    publish_to_quorum_queue(broker, queue, 20)

    def counted():
        found = raft_samples_of(broker.metrics("/per-object"), queue)
        return found if all(found.get(name, 0) > 0 for name in RAFT_NONZERO) else None

    # RabbitMQ refreshes ra_metrics on each Raft server's tick (every 5 s for quorum queues).
    per_object = wait_for(counted, timeout=30)
    assert per_object, ("per-object Raft samples of the queue", raft_samples_of(broker.metrics("/per-object"), queue))
    assert sorted(per_object) == sorted(RAFT_DASHBOARD_METRICS), per_object
    assert per_object["rabbitmq_raft_log_last_written_index"] >= per_object["rabbitmq_raft_log_commit_index"] \
        >= per_object["rabbitmq_raft_log_last_applied_index"], per_object
    if broker.is_lepus:
        assert per_object["rabbitmq_raft_entry_commit_latency_seconds"] > 0, per_object
    # Aggregated on /metrics: one unlabelled sample per family.
    aggregated = summed(broker.metrics())
    missing = [name for name in RAFT_DASHBOARD_METRICS if name not in aggregated]
    assert not missing, missing
    empty = [name for name in RAFT_NONZERO if aggregated[name] <= 0]
    assert not empty, (empty, {name: aggregated[name] for name in RAFT_DASHBOARD_METRICS})
    # The figures move with the load: more publishes, a higher commit index.
    publish_to_quorum_queue(broker, queue, 10)
    moved = wait_for(lambda: raft_samples_of(broker.metrics("/per-object"), queue).get("rabbitmq_raft_log_commit_index", 0)
                     > per_object["rabbitmq_raft_log_commit_index"], timeout=30)
    assert moved, (per_object, raft_samples_of(broker.metrics("/per-object"), queue))
    # /metrics/detailed?family=ra_metrics: exactly the six families, with the queue's labels.
    detailed = broker.metrics("/detailed", params=[("family", "ra_metrics")])
    families = {name for (name, _) in detailed if name.startswith("rabbitmq_detailed_")}
    assert families == {name.replace("rabbitmq_", "rabbitmq_detailed_", 1) for name in RAFT_DASHBOARD_METRICS}, families
    assert len(raft_samples_of(detailed, queue, "rabbitmq_detailed_raft_")) == len(RAFT_DASHBOARD_METRICS), detailed
    with broker.connect() as connection:
        connection.channel().queue_delete(queue)


# The RabbitMQ-Stream dashboard's names, each queried with protocol="stream". The refusal counters
# are RabbitMQ 3.10.8's (rabbitmq_stream's rabbit_stream_metrics.hrl), one per response code from
# 0x02 to 0x12.
STREAM_ERRORS = [
    "stream_does_not_exist", "subscription_id_already_exists", "subscription_id_does_not_exist",
    "stream_already_exists", "stream_not_available", "sasl_mechanism_not_supported", "authentication_failure",
    "sasl_error", "sasl_challenge", "sasl_authentication_failure_loopback", "vhost_access_failure",
    "unknown_frame", "frame_too_large", "internal_error", "access_refused", "precondition_failed",
    "publisher_does_not_exist",
]
STREAM_DASHBOARD_METRICS = [
    "rabbitmq_global_publishers",
    "rabbitmq_global_consumers",
    "rabbitmq_global_messages_received_total",
    "rabbitmq_global_messages_confirmed_total",
    "rabbitmq_global_messages_delivered_total",
] + ["rabbitmq_global_stream_error_%s_total" % name for name in STREAM_ERRORS]

# Published one at a time, each confirmed before the next.
STREAM_MESSAGES = 12
# What `stream_load` moves and by how much: its publishes, their confirms and their deliveries, and
# the refusals it provokes (two commands on a stream that does not exist, a create of one that does,
# an unsubscribe and a publisher deletion of ids never used). The other refusal counters stay where
# they were: RabbitMQ keeps them, and this load gives it no cause to count one.
STREAM_MOVED = {
    "rabbitmq_global_messages_received_total": STREAM_MESSAGES,
    "rabbitmq_global_messages_confirmed_total": STREAM_MESSAGES,
    "rabbitmq_global_messages_delivered_total": STREAM_MESSAGES,
    "rabbitmq_global_stream_error_stream_does_not_exist_total": 2,
    "rabbitmq_global_stream_error_stream_already_exists_total": 1,
    "rabbitmq_global_stream_error_subscription_id_does_not_exist_total": 1,
    "rabbitmq_global_stream_error_publisher_does_not_exist_total": 1,
}
STREAM_CREDENTIALS = {"username": "guest", "password": "guest"}


@pytest.fixture
def stream_broker(tmp_path_factory, shared_running_broker):
    """A fresh broker and its RabbitMQ Stream port: a Lepus started with one (the suite's other
    brokers run without, as scripts/test.sh sets LEPUS_STREAM_PORT=0), or the reference node's
    rabbitmq_stream listener (STREAM_PORT, exported by scripts/rabbitmq-reference.sh)."""
    if shared_running_broker is not None:
        if not os.environ.get("STREAM_PORT"):
            pytest.skip("the broker's stream port is unknown (set STREAM_PORT)")
        shared_running_broker.reset()
        yield shared_running_broker, int(os.environ["STREAM_PORT"])
        return
    port = free_port()
    broker = Lepus(lepus_binary(), tmp_path_factory.mktemp("lepus-stream") / "data",
                   ["--stream-port", str(port), "--stream-advertised-host", "127.0.0.1"])
    yield broker, port
    broker.stop()


def stream_samples(broker):
    """{name: value} of the /metrics samples labelled protocol="stream", summed over other labels."""
    values = {}
    for (name, labels), value in broker.metrics().items():
        if ("protocol", "stream") in labels:
            values[name] = values.get(name, 0) + value
    return values


async def stream_load(host, port, stream, while_open):
    """Creates `stream`, publishes STREAM_MESSAGES to it (each confirmed), reads them back through a
    subscription from the first offset, provokes the refusals STREAM_MOVED counts on a connection of
    its own, declares a second publisher and subscription (from the next offset: nothing delivered)
    on a third connection that closes without deleting them, and returns what `while_open()`
    returns, called while the two publishers and subscriptions are open. Everything is closed and
    the stream deleted before it returns."""
    received = []
    producer = Producer(host, port, **STREAM_CREDENTIALS)
    consumer = Consumer(host, port, **STREAM_CREDENTIALS)
    pool = ClientPool(host, port, vhost="/", frame_max=1024 * 1024, heartbeat=60, load_balancer_mode=False,
                      max_retries=1, **STREAM_CREDENTIALS)
    refusals = await pool.new(connection_name="metrics-refusals", addr=Addr(host, port))
    holder = await pool.new(connection_name="metrics-holder", addr=Addr(host, port))
    try:
        await producer.start()
        await producer.create_stream(stream)
        for index in range(STREAM_MESSAGES):
            await producer.send_wait(stream, b"stream message %d" % index)
        await consumer.start()
        await consumer.subscribe(stream, lambda message, context: received.append(message))
        deadline = time.monotonic() + WAIT_S
        while len(received) < STREAM_MESSAGES and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(received) == STREAM_MESSAGES, received
        missing = stream + "-missing"
        with pytest.raises(stream_errors.StreamDoesNotExist):
            await refusals.subscribe(missing, subscription_id=1)
        with pytest.raises(stream_errors.StreamDoesNotExist):
            await refusals.declare_publisher(missing, None, publisher_id=1)
        with pytest.raises(stream_errors.StreamAlreadyExists):
            await refusals.create_stream(stream)
        with pytest.raises(stream_errors.SubscriptionIDDoesNotExist):
            await refusals.unsubscribe(7)
        with pytest.raises(stream_errors.PublisherDoesNotExist):
            await refusals.delete_publisher(7)
        await holder.declare_publisher(stream, None, publisher_id=1)
        await holder.subscribe(stream, subscription_id=1, offset_spec=OffsetSpec(OffsetType.NEXT))
        # The scrape blocks the event loop for a moment, which the client's heartbeats tolerate.
        return while_open()
    finally:
        # Its publisher and subscription leave the gauges with the connection.
        await holder.close()
        await consumer.close()
        await producer.close()
        # Deleted from a connection without publishers or subscriptions: nobody is told the
        # stream is gone, so no stream_not_available is counted.
        await refusals.delete_stream(stream)
        await refusals.close()


def test_every_stream_dashboard_metric_answers_with_data(stream_broker, names):
    """The RabbitMQ-Stream dashboard: every family answers with protocol="stream" under load through
    the stream protocol; publishes, confirms, deliveries and the refusals the client provoked move
    it (exactly on a Lepus no other client uses), and the publisher and subscription gauges count
    what is open, back where they were once the connections closed, whether or not the client
    deleted its publisher and subscription first."""
    broker, port = stream_broker
    if broker.metrics_port is None:
        pytest.skip("the broker's metrics endpoint is unknown (set METRICS_URL)")
    before = stream_samples(broker)
    missing = [name for name in STREAM_DASHBOARD_METRICS if name not in before]
    assert not missing, ("families without a protocol=\"stream\" sample", missing)
    while_open = asyncio.run(stream_load(broker.host, port, names("prom-stream"), lambda: stream_samples(broker)))
    for gauge in ("rabbitmq_global_publishers", "rabbitmq_global_consumers"):
        assert while_open[gauge] - before[gauge] >= 2, (gauge, before[gauge], while_open[gauge])

    def moved():
        after = stream_samples(broker)
        return {name: after.get(name, 0) - before.get(name, 0) for name in STREAM_DASHBOARD_METRICS}

    def counted():
        changes = moved()
        return changes if all(changes[name] >= value for name, value in STREAM_MOVED.items()) else None

    # A closed connection's publishers and subscriptions leave the gauges once its task has gone.
    assert wait_for(counted), moved()
    if broker.is_lepus:
        expected = {name: STREAM_MOVED.get(name, 0) for name in STREAM_DASHBOARD_METRICS}
        assert (while_open["rabbitmq_global_publishers"], while_open["rabbitmq_global_consumers"]) == (2, 2), while_open
        assert wait_for(lambda: moved() == expected), (moved(), expected)
