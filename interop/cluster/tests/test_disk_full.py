"""A node whose disk fills up while the cluster's definitions change: every node's data directory
is a small tmpfs of its own (as root), and the test fills one with a file of its own (another
program eating the disk).

What is checked, on real processes:
  - the node raises its disk alarm; definition changes made through another node commit on the
    two nodes with room;
  - the full node's metadata log cannot take them: it does not stop (the same process throughout)
    and keeps serving its existing queues (a consumer gets messages published before);
  - a change made through the full node meanwhile is refused with 541, as when no majority can
    commit, and made nowhere;
  - once space is back the full node shows every change made meanwhile within a few seconds,
    without a restart, and takes changes again.
"""

import contextlib
import os
import signal
import subprocess
import time

import pika
import pytest

from cluster_harness import Cluster, eventually

DISK_BYTES = 96 << 20
DISK_FREE_LIMIT_BYTES = 4 << 20
# Once space is back the node that was full shows what it missed within this (it probes its disk
# every second, then catches up from the leader's log or snapshot).
CATCH_UP_S_MAX = 8
MESSAGES_BEFORE = 20
# Vhosts made while the disk is full: more than the log file's last page holds (a write into a
# page the file already has needs no new space, so the first few changes may still be written).
VHOSTS_WHILE_FULL = 60


@contextlib.contextmanager
def small_disks(tmp_path, size, count=3):
    """`count` tmpfs of `size` bytes each under `tmp_path` (mounting needs root); unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the test command runs as root)")
    mounts = []
    try:
        for index in range(count):
            mount_point = tmp_path / f"disk-{index + 1}"
            mount_point.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
            mounts.append(mount_point)
        yield mounts
    finally:
        for mount_point in mounts:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def small_disk_cluster(tmp_path):
    """Three nodes, each on a small tmpfs of its own."""
    with small_disks(tmp_path, DISK_BYTES) as mounts:
        cluster = Cluster(str(tmp_path))
        for node, disk in zip(cluster.nodes, mounts):
            node.data_dir = str(disk / "data")
            node.extra += ["--disk-free-limit-bytes", str(DISK_FREE_LIMIT_BYTES)]
        cluster.disks = mounts
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
            for node in cluster.nodes:
                node.kill(signal.SIGKILL)


def fill(directory, to_the_last_byte=True):
    """Writes a file until the disk says ENOSPC; returns its path. `to_the_last_byte`: then in
    pages and bytes, so no room is left even for a small record (a metadata change is a few hundred
    bytes); else by the MiB through a buffered file, as the quorum tests always have."""
    path = os.path.join(directory, "filler")
    if not to_the_last_byte:
        with open(path, "wb") as file:
            try:
                while True:
                    file.write(b"\0" * (1 << 20))
                    file.flush()
            except OSError:
                pass
            try:
                os.fsync(file.fileno())
            except OSError:
                pass
        return path
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (b"\0" * (1 << 20), b"\0" * 4096, b"\0"):
            try:
                while os.write(descriptor, chunk) > 0:
                    pass
            except OSError:
                pass
        try:
            os.fsync(descriptor)
        except OSError:
            pass
    finally:
        os.close(descriptor)
    return path


def amqp_channel(node):
    return pika.BlockingConnection(pika.URLParameters(node.url())).channel()


def exists(node, path):
    return node.get(path).ok


def has_binding(node, exchange, queue):
    response = node.get(f"/exchanges/%2F/{exchange}/bindings/source")
    return response.ok and any(binding["destination"] == queue for binding in response.json())


def definitions_made_while_full(node):
    """What `make_definitions_while_full` made, as `node` sees it (all must hold)."""
    return (all(exists(node, f"/vhosts/while-full-{index}") for index in range(VHOSTS_WHILE_FULL))
            and exists(node, "/exchanges/%2F/disk.while-full")
            and exists(node, "/queues/%2F/disk.while-full")
            and has_binding(node, "disk.while-full", "disk.while-full")
            and exists(node, "/users/while-full")
            and not exists(node, "/exchanges/%2F/disk.before-full"))


def make_definitions_while_full(node):
    """Declares, binds and deletes through `node` (one with room): each commits on the majority."""
    for index in range(VHOSTS_WHILE_FULL):
        assert node.put(f"/vhosts/while-full-{index}").status_code == 201
    assert node.put("/users/while-full", {"password": "secret", "tags": ""}).status_code == 201
    channel = amqp_channel(node)
    channel.exchange_declare("disk.while-full", "direct", durable=True)
    channel.queue_declare("disk.while-full", durable=True)
    channel.queue_bind("disk.while-full", "disk.while-full", routing_key="key")
    channel.exchange_delete("disk.before-full")
    channel.connection.close()


def run_full_disk(cluster, full):
    others = [node for node in cluster.nodes if node is not full]
    disk = cluster.disks[cluster.nodes.index(full)]
    pid = full.process.pid
    # Before the disk fills: an exchange deleted while it is full, and a queue the full node holds
    # (transient, so serving it needs no disk) with messages for a consumer while it is full.
    channel = amqp_channel(full)
    channel.exchange_declare("disk.before-full", "fanout", durable=True)
    channel.queue_declare("disk.served", durable=False)
    for index in range(MESSAGES_BEFORE):
        channel.basic_publish("", "disk.served", f"m{index}".encode())
    channel.connection.close()
    eventually(lambda: exists(others[0], "/exchanges/%2F/disk.before-full"), what="the exchange on another node")

    filler = fill(str(disk))
    eventually(lambda: full.get("/overview").json()["disk_free_alarm"], timeout=20, what="the full node's disk alarm")
    make_definitions_while_full(others[0])
    eventually(lambda: definitions_made_while_full(others[1]), what="the changes on the other node with room")
    # The full node could not write them: it stays up, the same process, and serves its queue.
    time.sleep(2)
    assert full.running() and full.process.pid == pid, f"{full.name} stopped; log: {full.log_path}"
    assert not exists(full, "/exchanges/%2F/disk.while-full"), "the full node shows a change it could not write"
    assert full.status()["metadata"]["write_held"], "the full node does not say its metadata log is held"
    assert 'lepus_metadata_write_held{group="metadata"} 1' in full.metrics()
    channel = amqp_channel(full)
    bodies = []
    for _ in range(MESSAGES_BEFORE // 2):
        method, _properties, body = channel.basic_get("disk.served", auto_ack=True)
        assert method is not None, "the full node's queue gave no message"
        bodies.append(body)
    assert bodies == [f"m{index}".encode() for index in range(MESSAGES_BEFORE // 2)]
    # A change through the full node is refused as when no majority can commit, and made nowhere.
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
        channel.exchange_declare("disk.through-full", "direct", durable=True)
    assert error.value.reply_code == 541 and "majority" in error.value.reply_text, error.value
    assert full.running() and full.process.pid == pid, f"{full.name} stopped; log: {full.log_path}"

    os.remove(filler)
    freed_at = time.time()
    eventually(lambda: definitions_made_while_full(full), timeout=CATCH_UP_S_MAX, what="the changes on the node that was full")
    caught_up_s = time.time() - freed_at
    assert full.running() and full.process.pid == pid, f"{full.name} restarted; log: {full.log_path}"
    assert not any(exists(node, "/exchanges/%2F/disk.through-full") for node in cluster.nodes), "the refused change was made"
    channel = amqp_channel(full)
    for index in range(MESSAGES_BEFORE // 2, MESSAGES_BEFORE):
        method, _properties, body = channel.basic_get("disk.served", auto_ack=True)
        assert method is not None and body == f"m{index}".encode()
    # It takes part in changes again: one made through it commits everywhere.
    channel.exchange_declare("disk.after-full", "direct", durable=True)
    channel.connection.close()
    for node in cluster.nodes:
        eventually(lambda node=node: exists(node, "/exchanges/%2F/disk.after-full"), what=f"the change after on {node.name}")
    eventually(lambda: not full.get("/overview").json()["disk_free_alarm"], timeout=20, what="the alarm cleared")
    assert not full.status()["metadata"]["write_held"]
    log = full.log()
    assert "panicked" not in log, f"{full.name} panicked; log: {full.log_path}"
    failures = [line for line in log.splitlines() if "ERROR" in line and "metadata group's log" in line]
    assert any("No space left on device" in line for line in failures), f"{full.name} did not log its failed write; log: {full.log_path}"
    # Logged once, then a summary now and then: not a line a second.
    assert len(failures) <= 3, f"{full.name} logged {len(failures)} metadata write failures; log: {full.log_path}"
    return caught_up_s


def test_a_follower_whose_disk_fills_keeps_serving_and_catches_up_on_definitions(small_disk_cluster):
    leader = small_disk_cluster.leader()
    full = next(node for node in small_disk_cluster.nodes if node is not leader)
    caught_up_s = run_full_disk(small_disk_cluster, full)
    print(f"the follower that was full showed the changes {caught_up_s:.1f} s after its disk had room")


def test_the_metadata_leaders_disk_fills_and_it_catches_up_on_definitions(small_disk_cluster):
    full = small_disk_cluster.leader()
    caught_up_s = run_full_disk(small_disk_cluster, full)
    print(f"the leader that was full showed the changes {caught_up_s:.1f} s after its disk had room")
