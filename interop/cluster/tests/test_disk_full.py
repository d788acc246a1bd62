"""A node whose disk fills up: its data directory is a small tmpfs that the test fills with a
file of its own (another program eating the disk). The node raises its disk alarm; the other two
keep committing; nothing committed is lost; once space is back the node catches up."""

import os
import signal
import subprocess

import pytest

from cluster_harness import Cluster, eventually

SMALL_DISK_BYTES = 96 << 20


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the test command runs as root)")
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_BYTES}", "tmpfs", str(mount_point)], check=True)
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory):
    """Writes a file until the disk says ENOSPC; returns its path."""
    path = os.path.join(directory, "filler")
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as file:
        try:
            while True:
                file.write(chunk)
                file.flush()
        except OSError:
            pass
        try:
            os.fsync(file.fileno())
        except OSError:
            pass
    return path


def test_a_node_whose_disk_fills_loses_nothing_committed_and_catches_up(tmp_path, small_disk):
    cluster = Cluster(str(tmp_path))
    first, second, third = cluster.nodes
    third.data_dir = str(small_disk / "n3")
    third.extra += ["--disk-free-limit-bytes", str(4 << 20)]
    cluster.start()
    try:
        assert first.put("/vhosts/before-full").status_code == 201
        eventually(lambda: third.get("/vhosts/before-full").ok, what="the change on the small-disk node")
        filler = fill(str(small_disk))
        eventually(lambda: third.get("/overview").json()["disk_free_alarm"], timeout=20, what="the full node's disk alarm")
        # The others commit without it (two of three); the full node cannot append, so it does
        # not acknowledge what it could not write.
        changes = [f"while-full-{index}" for index in range(5)]
        for name in changes:
            assert first.put(f"/vhosts/{name}").status_code == 201
        # Committed means on a majority; the second node applies it once it learns the commit index
        # (a run on a loaded machine read it there at once and got a 404).
        eventually(lambda: second.get(f"/vhosts/{changes[-1]}").ok, what="the last change on the other node that has room")
        os.remove(filler)
        if not third.running():
            # It stopped rather than serve definitions it could not record: restart it.
            third.start()
            third.wait_listening()
        for name in ["before-full"] + changes:
            eventually(lambda name=name: third.get(f"/vhosts/{name}").ok, timeout=30, what=f"{name} on the node that was full")
        eventually(lambda: not third.get("/overview").json()["disk_free_alarm"], timeout=20, what="the alarm cleared")
        assert third.put("/vhosts/after-full").status_code == 201
        assert first.get("/vhosts/after-full").ok
    finally:
        cluster.stop()
        third.kill(signal.SIGKILL)
