"""Stream-protocol clients on three real `lepus server` processes, through rstream (RabbitMQ's Python
stream client), as RabbitMQ's stream plugin serves them on a cluster:
- `metadata` through any node names the stream's leader and its replicas, each at its own stream
  port, so clients connect producers to the leader and consumers to replicas; a node that is down
  is left out;
- a publish through a member that does not lead is forwarded to the leader (RabbitMQ routes it
  there), deduplicated by the publisher's reference against the leader's tracking, and confirmed
  once committed; every member then holds the same messages at the same offsets;
- a consumer offset stored through a replica is written by the leader and read through every node."""

import asyncio
import signal
import time

import pytest
from rstream import Consumer, schema
from rstream.client import Addr, ClientPool
from rstream.constants import OffsetType
from rstream.consumer import ConsumerOffsetSpecification

from cluster_harness import Cluster

CREDENTIALS = {"username": "guest", "password": "guest"}
WAIT_S = 20


@pytest.fixture
def stream_cluster(tmp_path):
    nodes = Cluster(str(tmp_path), streams=True).start()
    yield nodes
    nodes.stop()


async def connect(node, name):
    """A stream-protocol connection to `node` itself (not to the node its metadata names)."""
    pool = ClientPool("127.0.0.1", node.stream_port, vhost="/", frame_max=1024 * 1024, heartbeat=60,
                      load_balancer_mode=False, max_retries=1, **CREDENTIALS)
    return await pool.new(connection_name=name, addr=Addr("127.0.0.1", node.stream_port))


async def create_everywhere(cluster, node, stream):
    """Creates `stream` through `node` (which then leads it); returns once every node lists it."""
    client = await connect(node, "creator")
    await client.create_stream(stream)
    await client.close()
    for each in cluster.nodes:
        await wait_until(lambda each=each: each.get(f"/queues/%2F/{stream}").ok, f"the stream on {each.name}")


async def wait_until(check, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def topology(node, stream):
    """(leader port, sorted replica ports) as `metadata` through `node` names them."""
    client = await connect(node, "metadata")
    try:
        leader, replicas = await client.query_leader_and_replicas(stream)
        assert leader.host == "127.0.0.1" and all(replica.host == "127.0.0.1" for replica in replicas)
        return leader.port, sorted(replica.port for replica in replicas)
    finally:
        await client.close()


async def publish_through(node, stream, reference, ids):
    """Publishes one message per id (body `m<id>`) through `node` as publisher `reference`, all in
    one frame; returns (confirmed ids, errors) once every id is answered."""
    client = await connect(node, f"publisher-{reference}")
    confirmed, errors = set(), []

    async def on_confirm(frame):
        confirmed.update(frame.publishing_ids)

    async def on_error(frame):
        errors.extend((error.publishing_id, error.response_code) for error in frame.errors)

    client.add_handler(schema.PublishConfirm, on_confirm, name="confirms")
    client.add_handler(schema.PublishError, on_error, name="errors")
    try:
        await client.declare_publisher(stream, reference, publisher_id=1)
        messages = [schema.Message(publishing_id=id, filter_value=None, data=b"m%d" % id) for id in ids]
        await client.publish(messages, publisher_id=1)
        await wait_until(lambda: len(confirmed) + len(errors) >= len(set(ids)), f"answers to {len(ids)} publishes")
        return confirmed, errors
    finally:
        await client.close()


async def read_all(node, stream, count):
    """(offset, body) of the stream's first `count` messages, read by a consumer that starts
    through `node` (rstream connects it to a member that `metadata` names)."""
    received = []
    consumer = Consumer("127.0.0.1", node.stream_port, **CREDENTIALS)
    await consumer.start()
    try:
        await consumer.subscribe(stream, lambda body, context: received.append((context.offset, body)),
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await wait_until(lambda: len(received) >= count, f"{count} messages read through {node.name}")
        await asyncio.sleep(0.5)  # a copy holding more than it should must show it
        return received
    finally:
        await consumer.close()


def test_metadata_names_the_leader_and_the_replicas_at_their_own_ports(stream_cluster):
    n1, n2, n3 = stream_cluster.nodes

    async def scenario():
        await create_everywhere(stream_cluster, n1, "located")
        expected = (n1.stream_port, sorted([n2.stream_port, n3.stream_port]))
        for node in stream_cluster.nodes:
            assert await topology(node, "located") == expected, node.name
        n3.kill(signal.SIGKILL)
        without_n3 = (n1.stream_port, [n2.stream_port])
        deadline = time.monotonic() + WAIT_S
        while await topology(n2, "located") != without_n3 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await topology(n2, "located") == without_n3

    asyncio.run(scenario())


def test_a_publish_through_a_replica_is_forwarded_deduplicated_and_confirmed(stream_cluster):
    """Fails if a member that does not lead refuses the publish (STREAM_NOT_AVAILABLE), confirms it
    without the leader, or deduplicates against anything but the leader's tracking."""
    n1, n2, n3 = stream_cluster.nodes

    async def scenario():
        await create_everywhere(stream_cluster, n1, "forwarded")
        confirmed, errors = await publish_through(n2, "forwarded", "producer-a", list(range(1, 101)))
        assert (sorted(confirmed), errors) == (list(range(1, 101)), [])
        # 50..100 again (duplicates, dropped by the leader and confirmed) and 101..120, through
        # the other replica.
        confirmed, errors = await publish_through(n3, "forwarded", "producer-a", list(range(50, 121)))
        assert (sorted(confirmed), errors) == (list(range(50, 121)), [])
        leader = await connect(n1, "sequence")
        try:
            assert await leader.query_publisher_sequence("forwarded", "producer-a") == 120
        finally:
            await leader.close()
        expected = [b"m%d" % id for id in range(1, 121)]
        for node in stream_cluster.nodes:
            records = await read_all(node, "forwarded", 120)
            assert [body for _, body in records] == expected, node.name
            assert [offset for offset, _ in records] == list(range(120)), node.name

    asyncio.run(scenario())


def test_an_offset_stored_through_a_replica_is_read_through_every_node(stream_cluster):
    n1, n2, n3 = stream_cluster.nodes

    async def scenario():
        await create_everywhere(stream_cluster, n1, "tracked")
        confirmed, _ = await publish_through(n1, "tracked", "producer-b", list(range(1, 11)))
        assert len(confirmed) == 10
        replica = await connect(n3, "tracker")
        await replica.store_offset("tracked", "reader-1", 7)
        await replica.close()
        for node in stream_cluster.nodes:
            client = await connect(node, "query")
            try:
                deadline = time.monotonic() + WAIT_S
                offset = None
                while time.monotonic() < deadline:
                    try:
                        offset = await client.query_offset("tracked", "reader-1")
                    except Exception:  # no offset stored yet here (NO_OFFSET)
                        offset = None
                    if offset == 7:
                        break
                    await asyncio.sleep(0.1)
                assert offset == 7, node.name
            finally:
                await client.close()

    asyncio.run(scenario())
