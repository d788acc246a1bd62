"""Definitions declared through the survivors at the moment the metadata leader's node stops.

A follower forwards a proposal to the leader it knows; when that leader has just stopped, the
forwarded proposal is lost with it. The proposer must propose it again once it learns of the new
leader, so the declare completes about one election later (1-2 s), not at the commit timeout
(10 s) with 541, and each definition exists once (RabbitMQ 3.10.8 keeps serving declares on the
surviving nodes)."""

import signal
import threading
import time

import pika
import pytest

from cluster_harness import eventually

# Generous against one election (1-2 s here) and well below metadata_commit_timeout_ms (10 s).
DECLARE_SECONDS_MAX = 6.0


def declare_through(node, prefix, results):
    """Opens a channel on `node`, waits for the go, then declares a queue, an exchange and a
    binding, each timed; records (what, seconds, error) in `results`."""
    connection = pika.BlockingConnection(pika.URLParameters(node.url()))
    channel = connection.channel()

    def run(go):
        go.wait()
        for what, declare in [
            ("queue", lambda: channel.queue_declare(f"{prefix}.q", durable=True)),
            ("exchange", lambda: channel.exchange_declare(f"{prefix}.x", "direct", durable=True)),
            ("binding", lambda: channel.queue_bind(f"{prefix}.q", f"{prefix}.x", routing_key="k")),
        ]:
            started = time.time()
            try:
                declare()
                results.append((f"{prefix}.{what}", time.time() - started, None))
            except Exception as error:  # noqa: BLE001 - reported by the test
                results.append((f"{prefix}.{what}", time.time() - started, repr(error)))
                return
        connection.close()

    return run


def count_named(node, path, name):
    return sum(1 for entry in node.get(path).json() if entry["name"] == name)


def assert_defined_once(node, prefixes):
    for prefix in prefixes:
        assert count_named(node, "/queues/%2F", f"{prefix}.q") == 1, (node.name, prefix)
        assert count_named(node, "/exchanges/%2F", f"{prefix}.x") == 1, (node.name, prefix)
        bindings = [binding for binding in node.get(f"/exchanges/%2F/{prefix}.x/bindings/source").json()
                    if binding["destination"] == f"{prefix}.q"]
        assert len(bindings) == 1, (node.name, bindings)


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "graceful"])
def test_declares_through_the_survivors_complete_when_the_metadata_leader_stops(cluster, stop):
    leader = cluster.leader()
    survivors = [node for node in cluster.nodes if node is not leader]
    results = []
    go = threading.Event()
    prefixes = [f"failover.{node.name.split('@')[0]}" for node in survivors]
    threads = [threading.Thread(target=declare_through(node, prefix, results), args=(go,))
               for node, prefix in zip(survivors, prefixes)]
    for thread in threads:
        thread.start()
    # The channels are open: the declares leave the moment the leader's node is told to stop.
    leader.process.send_signal(stop)
    go.set()
    for thread in threads:
        thread.join(timeout=30)
    leader.process.wait(timeout=30)
    print(f"declares during the failover ({stop.name}): "
          + ", ".join(f"{what} {seconds:.2f} s" for what, seconds, _ in sorted(results)))
    failed = [result for result in results if result[2] is not None or result[1] > DECLARE_SECONDS_MAX]
    assert not failed, f"declares that failed or took over {DECLARE_SECONDS_MAX} s: {failed}; logs in {cluster.directory}"
    assert len(results) == 3 * len(survivors), results
    for node in survivors:
        eventually(lambda node=node: all(node.get(f"/queues/%2F/{prefix}.q").ok for prefix in prefixes),
                   what=f"the queues on {node.name}")
        assert_defined_once(node, prefixes)
    leader.start()
    leader.wait_listening()
    cluster.wait_formed()
    eventually(lambda: all(leader.get(f"/queues/%2F/{prefix}.q").ok and leader.get(f"/exchanges/%2F/{prefix}.x").ok
                           for prefix in prefixes), what="the restarted node's catch-up")
    assert_defined_once(leader, prefixes)
