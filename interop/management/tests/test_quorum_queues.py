"""Quorum queues in the management API, as RabbitMQ 3.10.8 shows them (measured on the reference
node): `type: quorum`, the leader's node as `node` and `leader`, `members` and `online` (one node:
itself), `single_active_consumer_ctag` instead of a classic queue's `single_active_consumer_tag`,
no `exclusive_consumer_tag` or `messages_paged_out`, and the counts every queue shows. Lepus's
Prometheus metrics add each shard's Raft term, commit and applied index (Lepus only).
"""

import urllib.parse

import pika

from conftest import wait_for


def q(text):
    return urllib.parse.quote(text, safe="")


def test_a_quorum_queue_shows_its_leader_members_and_counts(lepus, names):
    queue = names("quorum")
    conn = lepus.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        for index in range(3):
            ch.basic_publish("", queue, b"m%d" % index, pika.BasicProperties(delivery_mode=2))
        ch.basic_consume(queue, lambda *args: None, auto_ack=False)
        conn.process_data_events(time_limit=0.5)

        def settled():
            info = lepus.get("/queues/%2F/" + q(queue)).json()
            return info if info.get("consumers") == 1 and info.get("messages_unacknowledged") == 3 else None

        info = wait_for(settled)
        assert info, lepus.get("/queues/%2F/" + q(queue)).json()
        node = info["node"]
        assert info["type"] == "quorum"
        assert (info["leader"], info["members"], info["online"]) == (node, [node], [node])
        assert (info["messages"], info["messages_ready"], info["durable"], info["exclusive"]) == (3, 0, True, False)
        assert info["arguments"] == {"x-queue-type": "quorum"}
        assert info["message_stats"]["publish"] == 3 and info["message_stats"]["deliver_get"] == 3
        assert "single_active_consumer_ctag" in info and "single_active_consumer_tag" not in info
        assert "exclusive_consumer_tag" not in info and "messages_paged_out" not in info
        listed = [item for item in lepus.get("/queues").json() if item["name"] == queue]
        assert len(listed) == 1 and (listed[0]["type"], listed[0]["leader"], listed[0]["members"]) == ("quorum", node, [node])
        if lepus.is_lepus:
            assert_raft_metrics(lepus)
        ch.queue_delete(queue)
    finally:
        conn.close()


def assert_raft_metrics(lepus):
    """Every shard of a node alone leads itself, and has committed and applied what it logged."""
    metrics = lepus.metrics()
    shards = [dict(labels)["shard"] for (name, labels) in metrics if name == "lepus_raft_term"]
    assert len(shards) >= 1, sorted(name for name, _ in metrics)[:20]
    for shard in shards:
        labels = frozenset({("shard", shard)})
        assert metrics[("lepus_raft_term", labels)] >= 1
        assert metrics[("lepus_raft_leader", labels)] == 1
        assert metrics[("lepus_raft_commit_index", labels)] >= 1
        assert metrics[("lepus_raft_applied_index", labels)] == metrics[("lepus_raft_commit_index", labels)]


def test_held_dead_letters_show_as_messages_dlx(lepus, names):
    """At-least-once dead letters that route nowhere stay in their quorum queue: RabbitMQ 3.10.8
    counts them as `messages_dlx`, their bodies' bytes as `message_bytes_dlx`, and in `messages`
    and `message_bytes`, but not among the ready or unacknowledged messages (measured)."""
    queue, exchange = names("quorum-dlx"), names("dlx-nowhere")
    conn = lepus.connect()
    try:
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout", durable=True)
        ch.queue_declare(queue, durable=True, arguments={
            "x-queue-type": "quorum", "x-dead-letter-exchange": exchange,
            "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
        ch.confirm_delivery()
        for body in (b"abc", b"defgh", b"kept"):
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        for _ in range(2):
            method, _, _ = ch.basic_get(queue)
            ch.basic_reject(method.delivery_tag, requeue=False)

        def held():
            info = lepus.get("/queues/%2F/" + q(queue)).json()
            return info if info.get("messages_dlx") == 2 and info.get("messages") == 3 else None

        info = wait_for(held, timeout=20)
        last = lepus.get("/queues/%2F/" + q(queue)).json()
        assert info, " ".join("%s=%s" % (key, value) for key, value in sorted(last.items()) if "messages" in key or "bytes" in key)
        assert (info["messages_ready"], info["messages_unacknowledged"], info["message_bytes_dlx"]) == (1, 0, 8), info
        assert (info["message_bytes"], info["message_bytes_ready"], info["message_bytes_unacknowledged"]) == (12, 4, 0), info
        ch.queue_delete(queue)
        ch.exchange_delete(exchange)
    finally:
        conn.close()
