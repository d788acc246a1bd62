"""Helpers for the Lepus-only durability tests: a broker whose metrics can be read, its memory,
its data directory's files, and small real filesystems (tmpfs) to run it on.

Not a test module: the tests of test_crash.py, test_paging.py, test_disk_alarm.py,
test_journal_replay.py, test_disk_full.py and test_redelivered.py import it.
"""

import errno
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

import pika
import pytest

from conftest import make_params, safe_close
from test_lifecycle import LepusBroker

# A segment starts with a header record: length u32 | crc32c u32 | kind u8 | term u64 |
# position u64 | format_version u8 | nonce u64 (docs/storage.md), so `length` is 26.
SEGMENT_HEADER_LENGTH_FIELD = 1 + 8 + 8 + 1 + 8
SEGMENT_HEADER_BYTES = 4 + 4 + SEGMENT_HEADER_LENGTH_FIELD
METRICS_TIMEOUT_SECONDS = 5


class ObservedBroker(LepusBroker):
    """A LepusBroker that remembers its metrics port, so a test can read `/metrics`."""

    def extra_port_args(self):
        args = super().extra_port_args()
        assert "--metrics-port" in args, "this lepus has no --metrics-port: the durability tests read its metrics"
        self.metrics_port = int(args[args.index("--metrics-port") + 1])
        return args

    def metrics_text(self):
        url = "http://127.0.0.1:%d/metrics" % self.metrics_port
        deadline = time.monotonic() + METRICS_TIMEOUT_SECONDS
        while True:
            try:
                with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_SECONDS) as response:
                    return response.read().decode()
            except OSError:
                # The metrics listener may come up a moment after the AMQP one.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def metric(self, name, **labels):
        """The value of one sample of `/metrics` (a counter's `_total` or a gauge); 0 when absent."""
        wanted = {key: str(value) for key, value in labels.items()}
        for line in self.metrics_text().splitlines():
            match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
            if not match or match.group(1) != name:
                continue
            found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(3) or ""))
            if all(found.get(key) == value for key, value in wanted.items()):
                return float(match.group(4))
        return 0.0

    def fsync_count(self):
        return self.metric("lepus_storage_fsync_seconds_count")

    def status_kib(self, field):
        """A `/proc/PID/status` field in KiB, e.g. VmRSS or VmHWM (the peak resident set)."""
        with open("/proc/%d/status" % self.proc.pid) as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise AssertionError("no %s in /proc/%d/status" % (field, self.proc.pid))


def start_broker(tmp_path, data_dir=None):
    data_dir = data_dir or tmp_path / "data"
    data_dir.mkdir(exist_ok=True)
    broker = ObservedBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    return broker


def journal_files(data_dir):
    """The node journal's files in use (`*.wal`), oldest first, as (sequence, path)."""
    directory = os.path.join(str(data_dir), "journal")
    if not os.path.isdir(directory):
        return []
    names = sorted(name for name in os.listdir(directory) if name.endswith(".wal"))
    return [(int(name[:-4]), os.path.join(directory, name)) for name in names]


def journal_bytes(data_dir):
    return sum(os.path.getsize(path) for _, path in journal_files(data_dir))


def queue_directories(data_dir):
    queues = os.path.join(str(data_dir), "queues")
    return {queue_directory_name(name): os.path.join(queues, name) for name in os.listdir(queues)
            if not name.endswith(".deleted") and "." not in name}


def queue_directory_name(directory):
    """The queue name a log directory holds: its name is the hex of `vhost NUL name`."""
    _vhost, _, name = bytes.fromhex(directory).partition(b"\0")
    return name.decode()


def segments(queue_directory):
    """A queue's segment files, oldest first, as (first position, path)."""
    names = sorted(name for name in os.listdir(queue_directory) if name.endswith(".seg"))
    return [(int(name[:-4]), os.path.join(queue_directory, name)) for name in names]


def check_segment_header(path):
    """Asserts that the file starts with a header record of the documented size."""
    with open(path, "rb") as segment:
        head = segment.read(SEGMENT_HEADER_BYTES)
    assert len(head) == SEGMENT_HEADER_BYTES, "%s is shorter than a segment header" % path
    length = int.from_bytes(head[:4], "big")
    assert length == SEGMENT_HEADER_LENGTH_FIELD, "%s: header record length %d, docs/storage.md says %d" % (
        path, length, SEGMENT_HEADER_LENGTH_FIELD)


def in_ci_without_opt_out():
    return os.environ.get("CI") == "true" and os.environ.get("LEPUS_ALLOW_SKIP") != "1"


def skip_loudly(reason):
    """Skips with the reason; under CI=true that is a failure unless LEPUS_ALLOW_SKIP=1."""
    if in_ci_without_opt_out():
        pytest.fail("%s (CI=true: set LEPUS_ALLOW_SKIP=1 to allow this skip)" % reason)
    pytest.skip(reason)


def mount_tmpfs(mount_point, size_bytes):
    """Mounts a tmpfs of `size_bytes` at `mount_point` (needs root); skips loudly otherwise."""
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size_bytes, "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        skip_loudly("cannot mount a tmpfs at %s (needs root; running as uid %d): %s"
                    % (mount_point, os.getuid(), result.stderr.strip()))


def unmount(mount_point):
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def small_tmpfs(tmp_path, size_bytes):
    """The body of a test's `small_disk` fixture: a tmpfs of `size_bytes` under `tmp_path/disk`,
    yielded, then unmounted (skips loudly where it cannot be mounted, see `mount_tmpfs`)."""
    mount_point = tmp_path / "disk"
    mount_tmpfs(mount_point, size_bytes)
    try:
        yield mount_point
    finally:
        unmount(mount_point)


def fill_filesystem(path, chunk_bytes=64 * 1024):
    """Writes `path` until its filesystem is full (ENOSPC); returns the bytes written."""
    written = 0
    chunk = b"\xa5" * chunk_bytes
    with open(path, "wb", buffering=0) as ballast:
        while True:
            try:
                written += ballast.write(chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                if chunk_bytes == 1:
                    return written
                # Fill the last partial block too, so no page is left for small writes.
                chunk_bytes //= 2
                chunk = chunk[:chunk_bytes]


class Ledger:
    """What publishers attempted and what the broker confirmed, by message id (the body)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempted = set()
        self.confirmed = set()

    def confirmed_count(self):
        with self.lock:
            return len(self.confirmed)


def confirmed_publisher(url, queue, prefix, ledger, stop, body_bytes=0):
    """Publishes persistent messages with confirms until `stop` is set or the broker goes away.

    Each body starts with its id, `prefix-sequence`, padded with '.' to `body_bytes`."""
    conn = None
    try:
        conn = pika.BlockingConnection(make_params(url))
        channel = conn.channel()
        channel.confirm_delivery()
        sequence = 0
        while not stop.is_set() and sequence < 1_000_000:
            message_id = "%s-%d" % (prefix, sequence)
            with ledger.lock:
                ledger.attempted.add(message_id)
            # Returns once the broker sent basic.ack: the message is confirmed.
            channel.basic_publish("", queue, message_id.encode().ljust(body_bytes, b"."),
                                  pika.BasicProperties(delivery_mode=2))
            with ledger.lock:
                ledger.confirmed.add(message_id)
            sequence += 1
    except Exception:
        pass  # The broker was killed: whatever was confirmed is in the ledger.
    finally:
        safe_close(conn)


def kill_during_confirmed_publishing(broker, queue, publishers, confirmed_min, rng, body_bytes=0):
    """Runs `publishers` confirming publishers on `queue`, SIGKILLs the broker at a random moment
    after at least `confirmed_min` confirms, and returns the ledger."""
    ledger = Ledger()
    stop = threading.Event()
    threads = [threading.Thread(target=confirmed_publisher, args=(broker.url, queue, "p%d" % index, ledger, stop, body_bytes))
               for index in range(publishers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while ledger.confirmed_count() < confirmed_min:
        assert time.monotonic() < deadline, "only %d publishes confirmed in 30 s:\n%s" % (
            ledger.confirmed_count(), broker.log_tail())
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.5))
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(10)
    stop.set()
    for thread in threads:
        thread.join(15)
        assert not thread.is_alive(), "a publisher thread hung after the broker died"
    return ledger


def drain_bodies(broker, queue, timeout_seconds=60):
    """Every ready message of `queue` (basic.get, no-ack), in queue order."""
    conn = broker.connect()
    try:
        channel = conn.channel()
        bodies = []
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(body)
        pytest.fail("draining %s did not finish in %.0f s" % (queue, timeout_seconds))
    finally:
        safe_close(conn)
