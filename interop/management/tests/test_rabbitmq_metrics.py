"""RabbitMQ's Prometheus names on Lepus's /metrics: the aggregated `rabbitmq_*` families that
RabbitMQ's RabbitMQ-Overview Grafana dashboard and common alert rules query, answered with data
by a broker under a little load. (Per-object and /metrics/detailed endpoints are not there yet.)"""

import pytest

from conftest import wait_for

# Names the RabbitMQ-Overview dashboard queries that Lepus has an exact figure for.
DASHBOARD_METRICS = [
    "rabbitmq_identity_info",
    "rabbitmq_build_info",
    "rabbitmq_connections",
    "rabbitmq_channels",
    "rabbitmq_queues",
    "rabbitmq_consumers",
    "rabbitmq_queue_messages_ready",
    "rabbitmq_queue_messages_unacked",
    "rabbitmq_queue_messages",
    "rabbitmq_queue_messages_published_total",
    "rabbitmq_global_messages_delivered_total",
    "rabbitmq_global_messages_acknowledged_total",
    "rabbitmq_process_resident_memory_bytes",
    "rabbitmq_resident_memory_limit_bytes",
    "rabbitmq_process_open_fds",
    "rabbitmq_process_max_fds",
    "rabbitmq_disk_space_available_bytes",
    "rabbitmq_disk_space_available_limit_bytes",
    "rabbitmq_alarms_memory_used_watermark",
    "rabbitmq_alarms_free_disk_space_watermark",
]
# These must be above zero under the load below.
NONZERO = ["rabbitmq_connections", "rabbitmq_channels", "rabbitmq_queues", "rabbitmq_consumers",
           "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
           "rabbitmq_queue_messages_published_total", "rabbitmq_global_messages_delivered_total",
           "rabbitmq_global_messages_acknowledged_total", "rabbitmq_process_resident_memory_bytes",
           "rabbitmq_disk_space_available_bytes", "rabbitmq_identity_info"]


@pytest.mark.lepus_only("the RabbitMQ reference node runs without its rabbitmq_prometheus plugin, so it has no /metrics")
def test_rabbitmq_metric_names_answer_with_data(fresh_lepus, names):
    broker = fresh_lepus
    queue, held = names("prom-q"), names("prom-held")
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.queue_declare(held)
        channel.confirm_delivery()
        for index in range(10):
            channel.basic_publish("", queue, b"m%d" % index)
            channel.basic_publish("", held, b"h%d" % index)
        channel.basic_qos(prefetch_count=3)
        received = []
        channel.basic_consume(queue, lambda ch, method, properties, body: received.append(method.delivery_tag))
        connection.process_data_events(time_limit=1)
        wait_for(lambda: connection.process_data_events(time_limit=0.05) or len(received) >= 3)
        channel.basic_ack(received[0])
        # Three unacked of `queue` now, 9 - 3 ready there, 10 ready in `held`.

        last_scrape = {}

        def scraped():
            samples = broker.metrics()
            values = {}
            for (name, labels), value in samples.items():
                values[name] = values.get(name, 0) + value
            last_scrape.clear()
            last_scrape.update(values)
            return values if all(values.get(name, 0) > 0 for name in NONZERO) else None

        # On a timeout the last scrape is checked, so the failure names what is missing or zero.
        values = wait_for(scraped) or last_scrape
        missing = [name for name in DASHBOARD_METRICS if name not in values]
        assert not missing, missing
        empty = [name for name in NONZERO if values.get(name, 0) <= 0]
        assert not empty, (empty, values)
        assert values["rabbitmq_queue_messages"] == values["rabbitmq_queue_messages_ready"] + values["rabbitmq_queue_messages_unacked"]
        identity = [labels for (name, labels) in broker.metrics() if name == "rabbitmq_identity_info"]
        assert {key for key, _ in identity[0]} == {"rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"}
    finally:
        connection.close()
