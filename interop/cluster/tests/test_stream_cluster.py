"""Stream queues on three real `lepus server` processes: a stream declared on one node is copied
to every member (its chunks byte for byte, at the same offsets) and read from any of them; a
publish is confirmed once a majority holds it; kill -9 of the leader's node elects the member
with the most up-to-date copy, and nothing confirmed is lost, on any node, the restarted one
included."""

import signal
import threading
import time

import pika
import pytest

from cluster_harness import eventually

STREAM = {"x-queue-type": "stream"}


def declare_stream(node, name, arguments=None):
    connection = pika.BlockingConnection(pika.URLParameters(node.url()))
    connection.channel().queue_declare(name, durable=True, arguments={**STREAM, **(arguments or {})})
    connection.close()


def declare_everywhere(cluster, node, name, arguments=None):
    """Declares stream `name` through `node` (with `arguments` beside the type); returns once every
    node lists it."""
    declare_stream(node, name, arguments)
    for each in cluster.nodes:
        eventually(lambda each=each: each.get(f"/queues/%2F/{name}").ok, what=f"the stream on {each.name}")


def publish_confirmed(node, queue, bodies):
    """Publishes `bodies` through `node`, each confirmed before the next; a nack raises."""
    connection = pika.BlockingConnection(pika.URLParameters(node.url()))
    channel = connection.channel()
    channel.confirm_delivery()
    try:
        for body in bodies:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        if connection.is_open:
            connection.close()


def read_stream(node, queue, count, timeout=30):
    """(offset, body) of the first `count` messages of the stream, read through `node` from `first`."""
    connection = pika.BlockingConnection(pika.URLParameters(node.url()))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=200)
    records = []
    deadline = time.time() + timeout
    for method, properties, body in channel.consume(queue, arguments={"x-stream-offset": "first"}, inactivity_timeout=0.5):
        if method is not None:
            records.append((properties.headers["x-stream-offset"], body.decode()))
            channel.basic_ack(method.delivery_tag)
        # Stopped only once nothing more comes: pika nacks what it buffered when it cancels, which
        # a stream refuses (540); and a copy holding more than it should must show it.
        elif len(records) >= count or time.time() > deadline:
            break
    connection.close()
    return records


def test_a_stream_declared_on_one_node_is_copied_to_every_member_and_read_from_each(cluster):
    first, second, third = cluster.nodes
    declare_everywhere(cluster, first, "events")
    bodies = [f"event-{number}" for number in range(400)]
    publish_confirmed(first, "events", bodies)
    reads = {node.name: read_stream(node, "events", len(bodies)) for node in cluster.nodes}
    for name, records in reads.items():
        assert [body for _, body in records] == bodies, f"{name} read {len(records)} of {len(bodies)}, or out of order"
    offsets = {name: [offset for offset, _ in records] for name, records in reads.items()}
    assert offsets[second.name] == offsets[first.name] == offsets[third.name], "each message at the same offset everywhere"
    # A member that does not lead the stream forwards its clients' publishes to the leader.
    forwarded = [f"forwarded-{number}" for number in range(50)]
    publish_confirmed(second, "events", forwarded[:25])
    publish_confirmed(third, "events", forwarded[25:])
    for node in cluster.nodes:
        records = read_stream(node, "events", len(bodies) + len(forwarded))
        assert [body for _, body in records] == bodies + forwarded, f"{node.name}: {len(records)} read"
    names = sorted(node.name for node in cluster.nodes)
    for node in cluster.nodes:
        info = node.get("/queues/%2F/events").json()
        assert info["type"] == "stream" and info["leader"] == first.name and info["node"] == first.name, info
        assert sorted(info["members"]) == names and sorted(info["online"]) == names, info
    # Deleted through a member that does not lead it: gone everywhere.
    connection = pika.BlockingConnection(pika.URLParameters(third.url()))
    connection.channel().queue_delete("events")
    connection.close()
    for node in cluster.nodes:
        eventually(lambda node=node: node.get("/queues/%2F/events").status_code == 404, what=f"the stream gone on {node.name}")


def publish_through_any(cluster, queue, body, timeout=20, nodes=None):
    """Publishes `body` through the running nodes in turn until one confirms it (each forwards to
    the leader, once there is one); that node."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for node in nodes or cluster.running():
            try:
                publish_confirmed(node, queue, [body])
                return node
            except (pika.exceptions.NackError, pika.exceptions.AMQPError):
                pass
        time.sleep(0.2)
    raise AssertionError(f"no node took a publish to {queue} in {timeout} s")


def test_kill_9_of_the_leaders_node_elects_another_member_and_nothing_confirmed_is_lost(cluster):
    first, second, third = cluster.nodes
    declare_everywhere(cluster, first, "orders")
    confirmed = [f"order-{number}" for number in range(300)]
    publish_confirmed(first, "orders", confirmed)
    first.kill()
    started = time.time()
    leader = publish_through_any(cluster, "orders", "order-after-failover")
    failover_s = time.time() - started
    confirmed.append("order-after-failover")
    assert leader in (second, third)
    assert failover_s < 15, f"a new leader took {failover_s:.1f} s"
    later = [f"order-{number}" for number in range(300, 500)]
    publish_confirmed(leader, "orders", later[:100])
    first.start()
    first.wait_listening()
    cluster.wait_formed(timeout=60)
    # Published through the restarted node: forwarded to the new leader.
    eventually(lambda: first.get("/queues/%2F/orders").ok, what="the stream on the restarted node")
    publish_confirmed(first, "orders", later[100:])
    confirmed += later
    info = first.get("/queues/%2F/orders").json()
    assert info["leader"] in (second.name, third.name), info
    reads = {node.name: read_stream(node, "orders", len(confirmed), timeout=60) for node in cluster.nodes}
    for name, records in reads.items():
        bodies = [body for _, body in records]
        assert bodies == confirmed, f"{name}: {len(bodies)} read, first difference at " + str(
            next((index for index, (a, b) in enumerate(zip(bodies, confirmed)) if a != b), min(len(bodies), len(confirmed))))
    offsets = [[offset for offset, _ in records] for records in reads.values()]
    assert offsets[0] == offsets[1] == offsets[2]
    assert "electing a stream leader" in second.log() + third.log()


def assert_confirm_held_until_resumed(publisher, queue, stopped, resumed):
    """Publishes one message through `publisher` with every node of `stopped` SIGSTOPped: no
    confirm for 3 s, then one once `resumed` (one of them) continues."""
    connection = pika.BlockingConnection(pika.URLParameters(publisher.url()))
    channel = connection.channel()
    channel.confirm_delivery()
    for node in stopped:
        node.kill(signal.SIGSTOP)
    try:
        outcome = {}

        def publish():
            try:
                channel.basic_publish("", queue, b"while alone", pika.BasicProperties(delivery_mode=2))
                outcome["confirmed_at"] = time.time()
            except pika.exceptions.AMQPError as error:
                outcome["error"] = error

        # pika's blocking channel is not thread-safe: its own connection waits for the confirm,
        # and the test only reads the clock around it.
        stopped_at = time.time()
        thread = threading.Thread(target=publish)
        thread.start()
        thread.join(timeout=3)
        assert thread.is_alive() and not outcome, f"confirmed without a majority: {outcome}"
        resumed.kill(signal.SIGCONT)
        resumed_at = time.time()
        thread.join(timeout=20)
        assert outcome.get("confirmed_at", 0) >= resumed_at, f"not confirmed once a majority was back: {outcome}"
        assert outcome["confirmed_at"] - stopped_at >= 3
    finally:
        for node in stopped:
            node.kill(signal.SIGCONT)
    connection.close()


def test_a_confirm_waits_for_a_majority_of_the_members(cluster):
    first, second, third = cluster.nodes
    declare_everywhere(cluster, first, "audit")
    publish_confirmed(first, "audit", ["before"])
    assert_confirm_held_until_resumed(first, "audit", [second, third], second)
    assert [body for _, body in read_stream(second, "audit", 2)] == ["before", "while alone"]


def test_x_initial_cluster_size_names_the_members_and_other_nodes_copy_without_counting(cluster):
    """Two members of three (RabbitMQ's `x-initial-cluster-size`): management names two, the
    commit needs both, and the third node, which keeps a copy as a learner, serves its readers
    but does not count: with the other member stopped, nothing is confirmed."""
    first, second, third = cluster.nodes
    declare_everywhere(cluster, first, "sized", {"x-initial-cluster-size": 2})
    info = first.get("/queues/%2F/sized").json()
    assert info["leader"] == first.name and len(info["members"]) == 2 and first.name in info["members"], info
    member = next(node for node in (second, third) if node.name in info["members"])
    learner = third if member is second else second
    publish_confirmed(first, "sized", ["one"])
    assert_confirm_held_until_resumed(first, "sized", [member], member)
    for node in cluster.nodes:
        assert [body for _, body in read_stream(node, "sized", 2)] == ["one", "while alone"], node.name
    # The learner forwards its publishes to the leader too.
    publish_confirmed(learner, "sized", ["from the learner"])
    assert [body for _, body in read_stream(learner, "sized", 3)] == ["one", "while alone", "from the learner"]


def test_a_partitioned_leaders_chunks_no_majority_held_are_cut_once_it_follows_the_new_leader(proxied_cluster):
    cluster = proxied_cluster
    first, second, third = cluster.nodes
    declare_everywhere(cluster, first, "ledger")
    confirmed = [f"entry-{number}" for number in range(100)]
    publish_confirmed(first, "ledger", confirmed)
    cluster.proxy.partition([first.name], [second.name, third.name])
    try:
        # Taken by the leader cut off from its followers: written and synced there, never committed.
        connection = pika.BlockingConnection(pika.URLParameters(first.url()))
        channel = connection.channel()
        for number in range(50):
            channel.basic_publish("", "ledger", f"unconfirmed-{number}", pika.BasicProperties(delivery_mode=2))
        connection.process_data_events(time_limit=1.0)
        connection.close()
        leader = publish_through_any(cluster, "ledger", "after-failover", nodes=[second, third])
        confirmed.append("after-failover")
        later = [f"entry-{number}" for number in range(100, 150)]
        publish_confirmed(leader, "ledger", later)
        confirmed += later
        assert cluster.proxy.held_connections > 0, "the proxy held nothing: the partition was not exercised"
    finally:
        cluster.proxy.heal()
    # Healed, the old leader learns of the new epoch, steps down, cuts its own tail and copies.
    reads = {}
    for node in cluster.nodes:
        reads[node.name] = eventually(lambda node=node: (lambda records: records if len(records) >= len(confirmed) else None)(
            read_stream(node, "ledger", len(confirmed), timeout=5)), timeout=60, what=f"the whole stream on {node.name}")
    for name, records in reads.items():
        assert [body for _, body in records] == confirmed, f"{name}: {[body for _, body in records][95:110]}"
    assert len({tuple(records) for records in reads.values()}) == 1, "the same messages at the same offsets everywhere"
    assert "cut chunks of an older epoch" in first.log(), "the old leader's uncommitted chunks were not cut"
    assert "no longer leading the stream" in first.log()


class StreamTail(threading.Thread):
    """A consumer of `queue` on `node` from `next`, on its own thread (pika's blocking connection
    is not thread-safe): every (offset, body) it is delivered, until `stop` is set."""

    def __init__(self, node, queue):
        super().__init__(daemon=True)
        self.node, self.queue = node, queue
        self.records = []
        self.ready = threading.Event()
        self.stop = threading.Event()

    def run(self):
        connection = pika.BlockingConnection(pika.URLParameters(self.node.url()))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=200)
        for method, properties, body in channel.consume(self.queue, arguments={"x-stream-offset": "next"}, inactivity_timeout=0.5):
            self.ready.set()
            if method is not None:
                self.records.append((properties.headers["x-stream-offset"], body.decode()))
                channel.basic_ack(method.delivery_tag)
            elif self.stop.is_set():
                break
        connection.close()


def offsets_and_bodies(node, queue):
    """Everything `node` serves of `queue` from `first`, read from its own copy."""
    return read_stream(node, queue, 1, timeout=10)


@pytest.mark.parametrize("away", ["stopped", "killed"])
def test_a_follower_behind_the_leaders_retention_starts_again_at_its_first_offset(cluster, away):
    """The third node is away (SIGSTOP, or kill -9 and a restart) while the leader's retention
    deletes what it lacks."""
    first, second, third = cluster.nodes
    # Segments of a few messages, and a stream that keeps about ten of them.
    declare_everywhere(cluster, first, "retained", {"x-max-length-bytes": 40_000, "x-stream-max-segment-size-bytes": 4_000})
    bodies = [f"message-{number:05d}-" + "x" * 500 for number in range(400)]
    publish_confirmed(first, "retained", bodies[:20])
    eventually(lambda: len(offsets_and_bodies(third, "retained")) == 20, what="the first messages on the third node")
    tail = StreamTail(third, "retained") if away == "stopped" else None
    if tail:
        tail.start()
        assert tail.ready.wait(10), "the consumer on the third node did not start"
    third_end = max(offset for offset, _ in offsets_and_bodies(third, "retained")) + 1
    third.kill(signal.SIGSTOP if away == "stopped" else signal.SIGKILL)
    try:
        # Committed by the leader and the second node; the leader's retention deletes what the
        # third node lacks.
        publish_confirmed(first, "retained", bodies[20:])
        leader_first = offsets_and_bodies(first, "retained")[0][0]
        assert leader_first > third_end, f"retention kept offset {third_end}: the test needs it gone (first {leader_first})"
    finally:
        if away == "stopped":
            third.kill(signal.SIGCONT)
        else:
            third.start()
            third.wait_listening()
            cluster.wait_formed(timeout=60)

    def agree():
        reads = {node.name: offsets_and_bodies(node, "retained") for node in cluster.nodes}
        spans = {name: (records[0][0], records[-1][0], len(records)) for name, records in reads.items() if records}
        return reads if len(spans) == 3 and len(set(spans.values())) == 1 and reads[third.name][-1][1] == bodies[-1] else None

    reads = eventually(agree, timeout=60, what="the same first..last offsets on every node")
    assert len({tuple(records) for records in reads.values()}) == 1, "the same messages at the same offsets everywhere"
    assert [body for _, body in reads[third.name]] == bodies[-len(reads[third.name]):]
    assert "starting again there" in third.log(), "the third node did not reset its copy"
    if tail:
        # Its consumer was at offsets retention deleted: it goes on from the new first offset.
        eventually(lambda: tail.records and tail.records[-1][1] == bodies[-1], timeout=30, what="the last message at the consumer")
        tail.stop.set()
        tail.join(timeout=10)
        delivered = [offset for offset, _ in tail.records]
        assert delivered[0] > third_end and delivered == sorted(set(delivered)), delivered[:5]
        assert delivered[-1] == reads[third.name][-1][0]
    # A restart finds the new copy as it was left.
    third.kill()
    third.start()
    third.wait_listening()
    cluster.wait_formed(timeout=60)
    again = eventually(lambda: (lambda records: records if records == offsets_and_bodies(first, "retained") else None)(
        offsets_and_bodies(third, "retained")), timeout=60, what="the same copy on the restarted third node")
    assert again[-1] == reads[first.name][-1]
