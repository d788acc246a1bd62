"""Durable definitions kept change by change (storage format 4: a snapshot and a change log).

Lepus only (they start their own brokers on data directories of their own, and kill them with
SIGKILL, so nothing is compacted at a graceful stop): after a crash, the broker comes back with the
topology its clients were last told about, including what a change removed as a side effect:
- bindings that went with a deleted queue or exchange, and an auto-delete exchange that lost its
  last binding when a queue was deleted;
- a vhost deleted and created again under the same name has none of the old vhost's queues.
"""

import os
import signal

import pika
import pytest

from conftest import safe_close
from test_format_upgrade import ManagedBroker, api, quoted


def names(listing):
    return sorted(item["name"] for item in listing)


def bindings_from(broker, sources):
    status, listing = api(broker.api_url, "GET", "/bindings/%2F")
    assert status == 200, listing
    return sorted((item["source"], item["destination"], item["routing_key"]) for item in listing if item["source"] in sources)


def exchange_names(broker):
    status, listing = api(broker.api_url, "GET", "/exchanges/%2F")
    assert status == 200, listing
    return {item["name"] for item in listing}


@pytest.mark.lepus_only
def test_a_crash_keeps_each_change_and_what_it_removed_with_it(tmp_path):
    broker = ManagedBroker(os.environ["LEPUS_BIN"], tmp_path / "data", tmp_path)
    broker.start()
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.exchange_declare("dl-x", "direct", durable=True)
        channel.exchange_declare("dl-src", "fanout", durable=True)
        channel.exchange_declare("dl-auto", "fanout", durable=True, auto_delete=True)
        for queue in ["dl-q1", "dl-q2", "dl-q3"]:
            channel.queue_declare(queue, durable=True)
        channel.queue_bind("dl-q1", "dl-x", "k1")
        channel.queue_bind("dl-q2", "dl-x", "k2")
        channel.queue_bind("dl-q3", "dl-auto", "")
        channel.exchange_bind(destination="dl-x", source="dl-src", routing_key="e")
        channel.queue_unbind("dl-q2", "dl-x", "k2")
        # dl-auto loses its only binding with dl-q3 and goes too.
        channel.queue_delete("dl-q3")
        # Its bindings to dl-q1 and from dl-src go with dl-x; the new dl-x has none of them.
        channel.exchange_delete("dl-x")
        channel.exchange_declare("dl-x", "direct", durable=True)
        channel.queue_declare("dl-q4", durable=True)
        channel.queue_bind("dl-q4", "dl-x", "k4")
        safe_close(connection)
        expected_exchanges = {"dl-x", "dl-src"}
        assert exchange_names(broker) & {"dl-x", "dl-src", "dl-auto"} == expected_exchanges
        expected_bindings = [("dl-x", "dl-q4", "k4")]
        assert bindings_from(broker, {"dl-x", "dl-src", "dl-auto"}) == expected_bindings

        broker.stop(signal.SIGKILL)
        broker.start()
        assert exchange_names(broker) & {"dl-x", "dl-src", "dl-auto"} == expected_exchanges
        status, queues = api(broker.api_url, "GET", "/queues/%2F")
        assert status == 200
        assert [name for name in names(queues) if name.startswith("dl-")] == ["dl-q1", "dl-q2", "dl-q4"]
        assert bindings_from(broker, {"dl-x", "dl-src", "dl-auto"}) == expected_bindings
    finally:
        broker.stop(signal.SIGKILL)


@pytest.mark.lepus_only
def test_a_vhost_deleted_and_created_again_does_not_bring_back_its_old_queues_after_a_crash(tmp_path):
    broker = ManagedBroker(os.environ["LEPUS_BIN"], tmp_path / "data", tmp_path)
    broker.start()
    vhost = "dl-vhost"
    try:
        assert api(broker.api_url, "PUT", "/vhosts/" + vhost, {})[0] == 201
        url = "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, quoted(vhost))
        connection = pika.BlockingConnection(pika.URLParameters(url))
        connection.channel().queue_declare("old-q", durable=True)
        safe_close(connection)
        assert api(broker.api_url, "DELETE", "/vhosts/" + vhost)[0] == 204
        assert api(broker.api_url, "PUT", "/vhosts/" + vhost, {})[0] == 201
        connection = pika.BlockingConnection(pika.URLParameters(url))
        connection.channel().queue_declare("new-q", durable=True)
        safe_close(connection)

        broker.stop(signal.SIGKILL)
        broker.start()
        status, queues = api(broker.api_url, "GET", "/queues/" + quoted(vhost))
        assert status == 200, queues
        assert names(queues) == ["new-q"]
    finally:
        broker.stop(signal.SIGKILL)
