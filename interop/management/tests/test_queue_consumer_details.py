"""GET /api/queues/{vhost}/{name} lists the queue's consumers in `consumer_details`, as RabbitMQ's
management API does (the console's queue page shows them): one entry per consumer of that queue,
shaped like /api/consumers, and none of another queue's; GET /api/channels/{name} lists the
channel's consumers the same way (the console's channel page)."""

import urllib.parse

from conftest import wait_for


def q(text):
    return urllib.parse.quote(text, safe="")


def test_queue_answer_lists_its_consumers(lepus, names):
    queue, other = names("details"), names("details-other")
    conn = lepus.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.queue_declare(other)
        ch.basic_qos(prefetch_count=5)
        ch.basic_consume(queue, lambda *args: None, auto_ack=False, consumer_tag="manual")
        second = conn.channel()
        second.basic_consume(queue, lambda *args: None, auto_ack=True, exclusive=False, consumer_tag="automatic")
        second.basic_consume(other, lambda *args: None, auto_ack=True, exclusive=True, consumer_tag="elsewhere")
        conn.process_data_events(time_limit=0.2)

        def listed():
            # RabbitMQ fills in channel_details once it has collected the channel's statistics.
            details = lepus.get("/queues/%%2F/%s" % q(queue)).json().get("consumer_details", [])
            return details if len(details) == 2 and all(c["channel_details"] for c in details) else None

        details = wait_for(listed)
        assert details, lepus.get("/queues/%%2F/%s" % q(queue)).json()
        by_tag = {consumer["consumer_tag"]: consumer for consumer in details}
        assert set(by_tag) == {"manual", "automatic"}
        manual, automatic = by_tag["manual"], by_tag["automatic"]
        assert manual["queue"] == {"name": queue, "vhost": "/"}
        assert manual["ack_required"] is True and manual["prefetch_count"] == 5 and manual["exclusive"] is False
        assert automatic["ack_required"] is False and automatic["prefetch_count"] == 0
        assert manual["channel_details"]["number"] == ch.channel_number
        assert automatic["channel_details"]["number"] == second.channel_number
        assert manual["channel_details"]["name"].endswith("(%d)" % ch.channel_number)
        assert manual["arguments"] == {}
        # The fields RabbitMQ 3.10.8 answers, no more and no fewer.
        assert sorted(manual) == ["ack_required", "active", "activity_status", "arguments", "channel_details",
                                  "consumer_tag", "exclusive", "prefetch_count", "queue"]
        assert sorted(manual["channel_details"]) == ["connection_name", "name", "node", "number", "peer_host",
                                                     "peer_port", "user"]
        assert manual["channel_details"]["node"] == lepus.get("/overview").json()["node"]
        # The channel's own answer lists its consumers the same way.
        channel_path = "/channels/%s" % q(manual["channel_details"]["name"])
        on_channel = wait_for(lambda: lepus.get(channel_path).json().get("consumer_details"))
        assert on_channel == [manual]
        exclusive = wait_for(lambda: lepus.get("/queues/%%2F/%s" % q(other)).json().get("consumer_details"))
        assert [(c["consumer_tag"], c["exclusive"]) for c in exclusive] == [("elsewhere", True)]
        # A queue without consumers answers an empty list.
        ch.basic_cancel("manual")
        second.basic_cancel("automatic")
        assert wait_for(lambda: lepus.get("/queues/%%2F/%s" % q(queue)).json()["consumer_details"] == [])
    finally:
        conn.close()
