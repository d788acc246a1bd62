"""A power cut under a real broker: SIGKILL plus the loss of every write that was not fsynced.

The broker runs with its data directory on `lepus-powercut` (crates/powercut), a FUSE file system
that passes writes through to a backing directory but remembers only what fsync (file data) and
fsyncdir (names) made durable; on `cut` it rebuilds the backing directory from exactly that (see
docs/storage.md, "The power-cut file system"). Publishers publish persistent messages with
confirms into a durable queue, the broker is killed, the power is cut, the file system is mounted
again on what survived and the broker restarts on it, three times; then a ledger checks what
the queue holds:
- `--sync always`: every confirmed message is there (also when the last unsynced write is torn);
- `--sync interval`: what is lost was confirmed in the last interval before the cut, and is, per
  publisher, a suffix of what it published (no gap in the middle);
- `--sync never`: confirmed messages are lost, which shows the cut really drops unsynced writes;
- in every mode, nothing comes back that was never published.

Lepus only. Needs /dev/fuse, Debian's `fusermount3` (package fuse3, installed with apt-get when
missing and running as root) and the `lepus-powercut` binary (built with the workspace, found
beside LEPUS_BIN or at LEPUS_POWERCUT_BIN); without them the tests skip, which under CI=true is a
failure unless LEPUS_ALLOW_SKIP=1.
"""

import os
import random
import shutil
import signal
import subprocess
import threading
import time

import pika
import pytest

from conftest import make_params, safe_close
from durability_support import drain_bodies, skip_loudly, start_broker

SEGMENT_BYTES_MAX = 65536
BODY_BYTES = 512
SYNC_INTERVAL_MS = 200
# How late after the kill a lost `--sync interval` confirm may be: one interval, the batch in
# flight, and the time a periodic fdatasync takes through FUSE on a loaded test machine.
INTERVAL_LOSS_WINDOW_SECONDS = SYNC_INTERVAL_MS / 1000 + 1.0
CONFIRMED_MIN = 400
# Long enough that most of the run lies outside INTERVAL_LOSS_WINDOW_SECONDS, with 64 KiB
# segments rolling many times in it.
PUBLISH_SECONDS_MIN = 4.0
# Power cuts per test, each on what the previous one left: recovery, then new segments (whose
# directory entries must be synced too) under load again.
CUTS = 3
QUEUE = "power-cut"

pytestmark = pytest.mark.skipif(not os.environ.get("LEPUS_BIN"), reason="Lepus only: cuts the power under the broker's own data directory")


def fusermount():
    path = shutil.which("fusermount3")
    if path is None and os.getuid() == 0 and shutil.which("apt-get"):
        environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=environment, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "fuse3"],
                       capture_output=True, env=environment, timeout=300)
        path = shutil.which("fusermount3")
    if path is None:
        skip_loudly("fusermount3 is not installed and could not be installed with apt-get (running as uid %d)" % os.getuid())
    if not os.path.exists("/dev/fuse"):
        skip_loudly("/dev/fuse is missing: this machine (or container) has no FUSE")
    return path


def powercut_binary():
    path = os.environ.get("LEPUS_POWERCUT_BIN") or os.path.join(os.path.dirname(os.environ["LEPUS_BIN"]), "lepus-powercut")
    if not os.access(path, os.X_OK):
        skip_loudly("no lepus-powercut at %s (cargo build -p lepus-powercut, or set LEPUS_POWERCUT_BIN)" % path)
    return path


class PowerCutMount:
    """One lepus-powercut process: mounts `backing` at `mount_point` until `cut` or `unmount`."""

    def __init__(self, tmp_path, torn_last_write=False, slow_fsync=None):
        self.fusermount = fusermount()
        self.binary = powercut_binary()
        self.backing = tmp_path / "backing"
        self.mount_point = tmp_path / "mnt"
        self.state_dir = tmp_path / "powercut-state"
        self.torn_last_write = torn_last_write
        self.slow_fsync = slow_fsync
        self.proc = None
        for directory in (self.backing, self.mount_point, self.state_dir):
            directory.mkdir(exist_ok=True)

    def mount(self):
        command = [self.binary, str(self.backing), str(self.mount_point), str(self.state_dir)]
        if self.torn_last_write:
            command.append("--torn-last-write")
        if self.slow_fsync:
            command += ["--slow-fsync", self.slow_fsync]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first_line = self.proc.stdout.readline()
        if not first_line.startswith("mounted"):
            self.proc.wait(10)
            skip_loudly("lepus-powercut could not mount a FUSE file system at %s: %s%s"
                        % (self.mount_point, first_line, self.proc.stdout.read()))

    def command(self, line):
        """Sends `cut` or `unmount`; returns what the process printed until it exited."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.close()
        output = self.proc.stdout.read()
        assert self.proc.wait(30) == 0, "lepus-powercut %s failed: %s" % (line, output)
        return output

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        subprocess.run([self.fusermount, "-u", "-z", str(self.mount_point)], capture_output=True)


class TimedLedger:
    """What each publisher attempted and when the broker confirmed it, by message id (the body)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempted = set()
        self.confirmed_at = {}
        self.order = {}
        self.killed_at = {}

    def confirmed_count(self):
        with self.lock:
            return len(self.confirmed_at)


def publish(url, prefix, ledger, stop):
    conn = None
    try:
        conn = pika.BlockingConnection(make_params(url))
        channel = conn.channel()
        channel.confirm_delivery()
        sequence = 0
        while not stop.is_set():
            message_id = "%s-%d" % (prefix, sequence)
            with ledger.lock:
                ledger.attempted.add(message_id)
                ledger.order[message_id] = (prefix, sequence)
            channel.basic_publish("", QUEUE, message_id.encode().ljust(BODY_BYTES, b"."), pika.BasicProperties(delivery_mode=2))
            with ledger.lock:
                ledger.confirmed_at[message_id] = time.monotonic()
            sequence += 1
    except Exception:
        pass  # The broker was killed: what was confirmed is in the ledger.
    finally:
        safe_close(conn)


def publish_then_kill(broker, rng, ledger, cut, publishers=2):
    """Publishes for PUBLISH_SECONDS_MIN and until CONFIRMED_MIN more confirms, then a random
    moment more, and SIGKILLs the broker; the ledger learns each publisher's moment of the kill."""
    confirmed_before = ledger.confirmed_count()
    prefixes = ["c%d-p%d" % (cut, index) for index in range(publishers)]
    stop = threading.Event()
    threads = [threading.Thread(target=publish, args=(broker.url, prefix, ledger, stop)) for prefix in prefixes]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    deadline = started + 60
    while ledger.confirmed_count() < confirmed_before + CONFIRMED_MIN or time.monotonic() < started + PUBLISH_SECONDS_MIN:
        assert time.monotonic() < deadline, "only %d confirms in 60 s:\n%s" % (ledger.confirmed_count(), broker.log_tail())
        time.sleep(0.01)
    time.sleep(rng.uniform(0.2, 0.8))
    for prefix in prefixes:
        ledger.killed_at[prefix] = time.monotonic()
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(10)
    stop.set()
    for thread in threads:
        thread.join(15)
        assert not thread.is_alive(), "a publisher thread hung after the broker died"


def cut_and_recover(tmp_path, monkeypatch, sync, torn_last_write=False):
    """CUTS power cuts under `--sync SYNC`, each after a restart on what the last one left:
    returns the ledger, the recovered message ids and lepus-powercut's reports."""
    monkeypatch.setenv("LEPUS_SYNC", sync)
    monkeypatch.setenv("LEPUS_SYNC_INTERVAL_MS", str(SYNC_INTERVAL_MS))
    monkeypatch.setenv("LEPUS_SEGMENT_BYTES_MAX", str(SEGMENT_BYTES_MAX))
    filesystem = PowerCutMount(tmp_path, torn_last_write)
    # Made before the mount, so the data directory's own name is durable from the start.
    (filesystem.backing / "data").mkdir()
    data_dir = filesystem.mount_point / "data"
    broker = None
    try:
        filesystem.mount()
        broker = start_broker(tmp_path, data_dir)
        conn = broker.connect()
        conn.channel().queue_declare(QUEUE, durable=True)
        safe_close(conn)
        ledger, reports, rng = TimedLedger(), [], random.Random(sync)
        for cut in range(CUTS):
            if cut > 0:
                broker.start()
            publish_then_kill(broker, rng, ledger, cut)
            reports.append(filesystem.command("cut").strip())
            filesystem.mount()
        broker.start()
        recovered = [body.rstrip(b".").decode() for body in drain_bodies(broker, QUEUE)]
        broker.stop(signal.SIGTERM)
        filesystem.command("unmount")
        report = " / ".join(reports)
        print("--sync %s, %d cuts: %d confirmed, %d recovered, %d confirmed lost; %s" % (
            sync, CUTS, len(ledger.confirmed_at), len(recovered), len(set(ledger.confirmed_at) - set(recovered)), report))
        return ledger, recovered, report
    finally:
        if broker is not None:
            broker.kill()
        filesystem.close()


def check_nothing_invented(ledger, recovered, report):
    invented = set(recovered) - ledger.attempted
    assert not invented, "%d recovered messages were never published, e.g. %s (%s)" % (len(invented), sorted(invented)[:5], report)
    assert len(recovered) == len(set(recovered)), "a message was recovered twice (%s)" % report


def lost_confirmed(ledger, recovered):
    return set(ledger.confirmed_at) - set(recovered)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("torn_last_write", [False, True], ids=["whole", "torn-last-write"])
def test_sync_always_loses_nothing_confirmed(tmp_path, monkeypatch, torn_last_write):
    ledger, recovered, report = cut_and_recover(tmp_path, monkeypatch, "always", torn_last_write)
    check_nothing_invented(ledger, recovered, report)
    lost = lost_confirmed(ledger, recovered)
    assert not lost, "--sync always lost %d of %d confirmed messages, e.g. %s (%s)" % (
        len(lost), len(ledger.confirmed_at), sorted(lost)[:5], report)


@pytest.mark.timeout(240)
def test_sync_interval_loses_only_the_last_interval(tmp_path, monkeypatch):
    ledger, recovered, report = cut_and_recover(tmp_path, monkeypatch, "interval")
    check_nothing_invented(ledger, recovered, report)
    lost = lost_confirmed(ledger, recovered)
    too_old = sorted(message for message in lost
                     if ledger.confirmed_at[message] < ledger.killed_at[ledger.order[message][0]] - INTERVAL_LOSS_WINDOW_SECONDS)
    assert not too_old, "--sync interval lost %d messages confirmed more than %.1f s before the cut, e.g. %s (%s)" % (
        len(too_old), INTERVAL_LOSS_WINDOW_SECONDS, too_old[:5], report)
    recovered_set = set(recovered)
    for message in lost:
        prefix, sequence = ledger.order[message]
        later = "%s-%d" % (prefix, sequence + 1)
        assert later not in recovered_set, "--sync interval lost %s but kept %s, published after it (%s)" % (message, later, report)


@pytest.mark.timeout(240)
def test_sync_never_loses_confirmed_messages(tmp_path, monkeypatch):
    """The harness can fail: with nothing fsynced, a power cut must lose confirmed messages."""
    ledger, recovered, report = cut_and_recover(tmp_path, monkeypatch, "never")
    check_nothing_invented(ledger, recovered, report)
    lost = lost_confirmed(ledger, recovered)
    assert lost, "--sync never lost none of %d confirmed messages: the cut dropped no unsynced write (%s)" % (
        len(ledger.confirmed_at), report)


# How long lepus-powercut holds each fsync of the definitions (the change log, or a new snapshot
# when the store compacts): the window in which a queue is declared (in the topology, its
# definition submitted) but its definition not on disk.
DEFINITIONS_FSYNC_DELAY_MS = 2000
# Rounds of declare, publish, kill and cut, each on what the last one left. Without the confirm
# waiting for the definition, the rounds after the first lose their message about half the time;
# in the other rounds (and always in the first) the queue's declare waited out one held fsync
# before the queue could be routed to, and its own definition was durable by then (cause not
# found): three rounds catch it in about 3 runs of 4.
DECLARE_ROUNDS = 3


def declare_in_thread(url, queue, outcome):
    conn = None
    try:
        conn = pika.BlockingConnection(make_params(url))
        started = time.monotonic()
        conn.channel().queue_declare(queue, durable=True)
        outcome.append("declare-ok after %.3f s" % (time.monotonic() - started))
    except Exception as error:
        outcome.append("no declare-ok: %r" % error)  # The broker was killed first.
    finally:
        safe_close(conn)


def publish_until_routed(url, queue, deadline, declarer):
    """Opens a channel with confirms, starts `declarer`, and publishes persistent, mandatory
    messages to `queue` until one is routed and confirmed (the ones before the queue exists are
    returned); returns its body and how long after the declare's start its confirm came."""
    conn = pika.BlockingConnection(make_params(url))
    channel = conn.channel()
    channel.confirm_delivery()
    declarer.start()
    started = time.monotonic()
    sequence = 0
    while time.monotonic() < deadline:
        body = b"routed-%d" % sequence
        sequence += 1
        try:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
        except pika.exceptions.UnroutableError:
            continue
        return body, time.monotonic() - started
    pytest.fail("no publish was routed into %s before the deadline" % queue)


def recovered_bodies(broker, queue):
    """The bodies `queue` holds, or a text saying it is gone."""
    conn = broker.connect()
    try:
        conn.channel().queue_declare(queue, passive=True)
        return drain_bodies(broker, queue)
    except pika.exceptions.ChannelClosedByBroker as error:
        return "no queue (%s)" % error
    finally:
        safe_close(conn)


@pytest.mark.timeout(180)
def test_a_confirm_into_a_queue_being_declared_survives_a_power_cut(tmp_path, monkeypatch):
    """One connection declares a durable queue while another publishes to its name with confirms
    (mandatory: returned until the queue exists). lepus-powercut holds the definitions' fsyncs
    for DEFINITIONS_FSYNC_DELAY_MS, so the queue is in the topology with its definition
    not on disk. The first publish routed into it is confirmed, the broker killed at once and
    the power cut: the confirmed message must come back, so its confirm must have waited for the
    queue's definition (before, it came with the log's fdatasync; the cut took the definition,
    the start removed the log as an orphan, and the message was gone)."""
    monkeypatch.setenv("LEPUS_SYNC", "always")
    filesystem = PowerCutMount(tmp_path, slow_fsync="definitions:%d" % DEFINITIONS_FSYNC_DELAY_MS)
    (filesystem.backing / "data").mkdir()
    data_dir = filesystem.mount_point / "data"
    broker = None
    try:
        filesystem.mount()
        broker = start_broker(tmp_path, data_dir)
        rounds, lost = [], []
        for round_index in range(DECLARE_ROUNDS):
            queue = "declared-under-load-%d" % round_index
            # A durable exchange's declare returns once the definitions the start writes are on
            # disk: the queue's declare then holds the next definitions fsync alone.
            settled = broker.connect()
            settled.channel().exchange_declare("settled-%d" % round_index, durable=True)
            safe_close(settled)
            outcome = []
            declarer = threading.Thread(target=declare_in_thread, args=(broker.url, queue, outcome))
            deadline = time.monotonic() + DEFINITIONS_FSYNC_DELAY_MS / 1000 + 30
            confirmed, after_seconds = publish_until_routed(broker.url, queue, deadline, declarer)
            # The power goes at once: a killed process waits for the answer to the fsync it is in
            # (FUSE), which would make the definition durable before it dies.
            broker.proc.send_signal(signal.SIGKILL)
            report = filesystem.command("cut").strip()
            broker.proc.wait(10)
            declarer.join(30)
            filesystem.mount()
            broker.start()
            recovered = recovered_bodies(broker, queue)
            rounds.append("%s: confirmed %r %.3f s after the declare started; the declare: %s; recovered %r; %s"
                          % (queue, confirmed, after_seconds, outcome, recovered, report))
            if not isinstance(recovered, list) or confirmed not in recovered:
                lost.append(rounds[-1])
        broker.stop(signal.SIGTERM)
        filesystem.command("unmount")
        print("\n".join(rounds))
        assert not lost, "confirmed messages lost in a power cut with their queue's declare:\n%s" % "\n".join(lost)
    finally:
        if broker is not None:
            broker.kill()
        filesystem.close()
