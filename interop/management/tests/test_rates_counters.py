"""Exchange message rates and connection traffic in the management API, as RabbitMQ 3.10.8 shows
them: an exchange's `message_stats` (`publish_in`, and `publish_out` counted once per queue a
message reached) appear once something was published to it, and a connection carries `recv_oct`,
`recv_cnt`, `send_oct`, `send_cnt` with the byte rates (and their samples with
`data_rates_age`/`data_rates_incr`). Checked against Lepus and the reference RabbitMQ node."""

import urllib.parse

from conftest import wait_for

SAMPLE_WAIT_S = 25


def q(text):
    return urllib.parse.quote(text, safe="")


def test_exchange_message_stats_count_in_and_out(fresh_lepus, names):
    broker = fresh_lepus
    fanout, second, lonely, untouched = names("fx"), names("fx2"), names("dx"), names("ux")
    queues = [names("fq") for _ in range(3)]
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.exchange_declare(fanout, "fanout")
        channel.exchange_declare(second, "fanout")
        channel.exchange_declare(lonely, "direct")
        channel.exchange_declare(untouched, "direct")
        for queue in queues:
            channel.queue_declare(queue)
        channel.queue_bind(queues[0], fanout)
        channel.queue_bind(queues[1], fanout)
        # An exchange-to-exchange binding: its queue counts toward the exchange published to.
        channel.exchange_bind(second, fanout)
        channel.queue_bind(queues[2], second)
        channel.confirm_delivery()
        for _ in range(10):
            channel.basic_publish(fanout, "", b"x")
        for _ in range(7):
            channel.basic_publish(lonely, "nowhere", b"x")

        def stats(name):
            return broker.get("/exchanges/%2F/" + q(name)).json().get("message_stats")

        # Counted while the publisher's connection is still open.
        counted = wait_for(lambda: (stats(fanout) or {}).get("publish_out") == 30 and (stats(lonely) or {}).get("publish_in") == 7)
        assert counted, (stats(fanout), stats(lonely))
    finally:
        connection.close()
    assert stats(fanout)["publish_in"] == 10 and "rate" in stats(fanout)["publish_in_details"]
    # Routed nowhere: publish_in alone; never published to: no message_stats at all.
    assert sorted(stats(lonely)) == ["publish_in", "publish_in_details"]
    assert stats(untouched) is None and stats(second) is None
    listed = {item["name"]: item for item in broker.get("/exchanges/%2F").json()}
    assert listed[fanout]["message_stats"]["publish_out"] == 30
    # With the message-rate range, the details carry samples.
    ranged = {"msg_rates_age": 60, "msg_rates_incr": 5}
    sampled = wait_for(lambda: broker.get("/exchanges/%2F/" + q(fanout), params=ranged).json()["message_stats"]
                       ["publish_in_details"].get("samples", [{}])[0].get("sample") == 10, SAMPLE_WAIT_S)
    assert sampled, broker.get("/exchanges/%2F/" + q(fanout), params=ranged).json()
    details = broker.get("/exchanges/%2F/" + q(fanout), params=ranged).json()["message_stats"]["publish_out_details"]
    assert sorted(details) == ["avg", "avg_rate", "rate", "samples"] and details["samples"][0]["sample"] == 30


def test_connection_traffic_counts_bytes_and_packets(lepus, names):
    queue = names("traffic")
    connection = lepus.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(queue, auto_delete=True)
        channel.confirm_delivery()
        for _ in range(5):
            channel.basic_publish("", queue, b"y" * 2000)
        port = connection._impl._transport._sock.getsockname()[1]

        def ours():
            for item in lepus.get("/connections").json():
                if item.get("peer_port") == port and item.get("recv_oct", 0) > 10_000:
                    return item
            return None

        item = wait_for(ours)
        assert item, lepus.get("/connections").json()
        assert item["recv_cnt"] >= 1 and item["send_oct"] > 0 and item["send_cnt"] >= 1
        assert list(item["recv_oct_details"]) == ["rate"] and list(item["send_oct_details"]) == ["rate"]
        ranged = {"data_rates_age": 60, "data_rates_incr": 5}

        def sampled():
            answer = lepus.get("/connections/" + q(item["name"]), params=ranged).json()
            samples = answer.get("recv_oct_details", {}).get("samples") or [{}]
            return answer if samples[0].get("sample", 0) > 10_000 else None

        answer = wait_for(sampled, SAMPLE_WAIT_S)
        assert answer, lepus.get("/connections/" + q(item["name"]), params=ranged).json()
        details = answer["recv_oct_details"]
        assert sorted(details) == ["avg", "avg_rate", "rate", "samples"]
        assert len(details["samples"]) in (12, 13)
        assert sorted(answer["send_oct_details"]) == ["avg", "avg_rate", "rate", "samples"]
    finally:
        connection.close()
