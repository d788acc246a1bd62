"""Chart samples: RabbitMQ's range parameters (`lengths_age`/`lengths_incr`, `msg_rates_age`/
`msg_rates_incr`, `data_rates_age`/`data_rates_incr`) add `samples` ([{"sample", "timestamp"}],
newest first), `avg` and `avg_rate` to each `*_details` object of the overview, queues,
exchanges and connections. The shapes, the bounds and the values are checked against RabbitMQ
3.10.8 (the reference node) and Lepus alike; the web console draws its charts from them."""

import time
import urllib.parse

import pika

from conftest import wait_for

# The console's range: 60 s in steps of 5 s, 13 points.
RANGE = {"lengths_age": 60, "lengths_incr": 5, "msg_rates_age": 60, "msg_rates_incr": 5,
         "data_rates_age": 60, "data_rates_incr": 5}
POINTS = 13
# A history point is taken every 5 s; the newest point showing a change can take two steps.
SAMPLE_WAIT_S = 25


def q(text):
    return urllib.parse.quote(text, safe="")


def point_counts(broker):
    """How many points a 60 s range in steps of 5 s has: 13 on Lepus; RabbitMQ 3.10.8 leaves out the
    oldest point while the newest is being collected, and at times the oldest of its churn rates."""
    return (POINTS,) if broker.is_lepus else (POINTS - 1, POINTS)


def assert_sampled(details, points=(POINTS,), incr_ms=5000):
    """A details object with samples as RabbitMQ answers it."""
    assert sorted(details) == ["avg", "avg_rate", "rate", "samples"], details
    samples = details["samples"]
    assert len(samples) in points, samples
    stamps = [sample["timestamp"] for sample in samples]
    assert all(stamp % incr_ms == 0 for stamp in stamps), stamps
    assert stamps == sorted(stamps, reverse=True) and all(a - b == incr_ms for a, b in zip(stamps, stamps[1:])), stamps
    now_ms = time.time() * 1000
    assert now_ms - 2 * incr_ms <= stamps[0] <= now_ms + incr_ms + 1000, (stamps[0], now_ms)
    values = [sample["sample"] for sample in samples]
    assert all(isinstance(value, int) for value in values), values
    assert abs(details["avg"] - sum(values) / len(values)) < 1e-6, details
    assert abs(details["avg_rate"] - (values[0] - values[-1]) * 1000 / (stamps[0] - stamps[-1])) < 1e-6, details
    assert abs(details["rate"] - (values[0] - values[1]) * 1000 / incr_ms) < 1e-6, details
    return values


def complete(answer, paths, points=(POINTS,)):
    """`answer` when every dotted path in `paths` leads to details with samples. RabbitMQ emits a
    new object's details only after its first statistics interval: the tests wait for them."""
    for path in paths:
        value = answer
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, dict) or len(value.get("samples") or []) not in points:
            return None
    return answer


def publish(broker, queue, count):
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        for index in range(count):
            ch.basic_publish("", queue, b"m%d" % index, pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()


def test_queue_samples_show_the_history_newest_first(fresh_lepus, names):
    queue = names("samples")
    publish(fresh_lepus, queue, 4)
    path = "/queues/%2F/" + q(queue)

    sampled = ["messages_details", "messages_ready_details", "messages_unacknowledged_details", "message_stats.publish_details"]

    def newest(count):
        info = complete(fresh_lepus.get(path, params=RANGE).json(), sampled, point_counts(fresh_lepus))
        if info is None:
            return None
        ready = info["messages_ready_details"]["samples"][0]["sample"]
        published = info["message_stats"]["publish_details"]["samples"][0]["sample"]
        return info if ready == count and published == count else None

    info = wait_for(lambda: newest(4), SAMPLE_WAIT_S)
    assert info, fresh_lepus.get(path, params=RANGE).json()
    for key in ("messages_details", "messages_ready_details", "messages_unacknowledged_details"):
        assert_sampled(info[key], point_counts(fresh_lepus))
    assert_sampled(info["message_stats"]["publish_details"], point_counts(fresh_lepus))
    publish(fresh_lepus, queue, 3)
    info = wait_for(lambda: newest(7), SAMPLE_WAIT_S)
    assert info, fresh_lepus.get(path, params=RANGE).json()
    ready = assert_sampled(info["messages_ready_details"], point_counts(fresh_lepus))
    published = assert_sampled(info["message_stats"]["publish_details"], point_counts(fresh_lepus))
    # The history keeps the earlier figure behind the newest, and nothing from before the queue.
    assert 4 in ready and 4 in published, (ready, published)
    assert ready == sorted(ready, reverse=True) and published == sorted(published, reverse=True)
    assert ready[-1] == 0 and published[-1] == 0, (ready, published)
    # Without the range parameters: the rate alone.
    plain = fresh_lepus.get(path).json()
    assert list(plain["messages_details"]) == ["rate"] and list(plain["message_stats"]["publish_details"]) == ["rate"]
    listed = wait_for(lambda: [item for item in fresh_lepus.get("/queues", params=RANGE).json()
                               if item["name"] == queue and complete(item, ["messages_details"], point_counts(fresh_lepus))])
    assert len(listed) == 1
    assert_sampled(listed[0]["messages_details"], point_counts(fresh_lepus))


def test_overview_samples(lepus, names):
    publish(lepus, names("overview-samples"), 2)
    sampled = ["queue_totals.messages_details", "queue_totals.messages_ready_details", "queue_totals.messages_unacknowledged_details",
               "message_stats.publish_details", "message_stats.deliver_get_details", "message_stats.ack_details",
               "churn_rates.connection_created_details", "churn_rates.queue_declared_details"]
    points = point_counts(lepus)
    overview = wait_for(lambda: complete(lepus.get("/overview", params=RANGE).json(), sampled, points))
    assert overview, lepus.get("/overview", params=RANGE).json()
    for key in ("messages", "messages_ready", "messages_unacknowledged"):
        assert_sampled(overview["queue_totals"][key + "_details"], points)
    for key in ("publish", "deliver_get", "ack"):
        assert_sampled(overview["message_stats"][key + "_details"], points)
    for key in ("connection_created", "queue_declared"):
        assert_sampled(overview["churn_rates"][key + "_details"], points)
    assert set(overview["sample_retention_policies"]) == {"global", "basic", "detailed"}
    assert 600 in overview["sample_retention_policies"]["basic"]


def test_ranges_out_of_bounds_are_refused_as_rabbitmq_refuses_them(lepus, names):
    queue = names("range-bounds")
    publish(lepus, queue, 1)
    path = "/queues/%2F/" + q(queue)
    # RabbitMQ shows a queue's details once its statistics were first collected.
    assert wait_for(lambda: "messages_details" in lepus.get(path).json())
    for age, incr in [(501, 1), (60, 0), (-5, 1)]:
        response = lepus.get(path, params={"lengths_age": age, "lengths_incr": incr})
        assert response.status_code == 400, (age, incr, response.text)
        assert response.json() == {"error": "bad_request", "reason": "Invalid range parameters: age %d, incr %d" % (age, incr)}
    # 500 increments is the most a range may ask for.
    info = lepus.get(path, params={"lengths_age": 500, "lengths_incr": 1}).json()
    assert len(info["messages_details"]["samples"]) == 501
    # A value that is not an integer asks for no samples.
    info = lepus.get(path, params={"lengths_age": "abc", "lengths_incr": 5}).json()
    assert list(info["messages_details"]) == ["rate"]
    # One point: no averages.
    info = lepus.get(path, params={"lengths_age": 1, "lengths_incr": 5}).json()
    assert sorted(info["messages_details"]) == ["rate", "samples"] and len(info["messages_details"]["samples"]) == 1
    # Steps that do not divide the age: age // incr + 1 points.
    info = lepus.get(path, params={"lengths_age": 60, "lengths_incr": 7}).json()
    assert len(info["messages_details"]["samples"]) == 9
