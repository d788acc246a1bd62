"""A publisher confirm leaves the broker only after the message's record is in the node journal and
the journal is fdatasynced (issue 16; README, docs/storage.md "What a confirm promises").

Nothing a client can observe tells a confirm sent after the fdatasync from one sent before it, or
without it: the page cache serves every read and a process crash loses nothing either way. So the
broker runs under strace, which records, in the order they happen, every write and sync it makes
and every frame it sends: for each of the publisher's confirms (a `basic.ack` frame written to the
client's socket) the trace must show the pwrite of that message's record to the journal file
(`DATA_DIR/journal/*.wal`), then an fdatasync of that journal file which returned, and only then
the ack. The same check run on `--sync interval` (confirm once written, sync later) must find acks
with no sync in between, which shows the check can tell the two apart.

Why the order of lines in the trace is the order of events: with `strace -f` every thread stops at
each traced system call's entry and exit until strace has written its line. The syncer's fdatasync
exit is reported before that thread can go on to hand the confirm to the connection's writer, so a
write of the ack that depends on it starts on a later line.

Lepus only: it traces the broker's process and reads its data directory. Needs strace (Debian
package `strace`, installed with apt-get when missing and running as root) and ptrace permission;
a machine without them skips, which under CI=true is a failure unless LEPUS_ALLOW_SKIP=1.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import uuid
from collections import namedtuple

import pika
import pytest

from conftest import make_params, safe_close
from durability_support import skip_loudly
from test_lifecycle import STOP_TIMEOUT, LepusBroker

pytestmark = pytest.mark.lepus_only

MESSAGES = 20
TRACED_SYSCALLS = "fdatasync,fsync,write,writev,sendto,sendmsg,pwrite64,pwritev,pwritev2"
# Large enough that no write this test looks at (a frame, a journal batch of one small message) is
# cut short in the trace.
TRACE_STRING_BYTES_MAX = 65536
# Longer than the test runs, so `--sync interval` makes no fdatasync of a segment while it does.
SYNC_INTERVAL_MS = 600_000
SOCKET_WRITES = ("write", "writev", "sendto", "sendmsg")
FILE_WRITES = ("write", "writev", "pwrite64", "pwritev", "pwritev2")
SYNCS = ("fdatasync", "fsync")
FRAME_METHOD = 1
FRAME_END = 0xCE
BASIC_CLASS = 60
BASIC_ACK_METHOD = 80

# One system call: where it starts and ends in the trace (line numbers; equal unless another
# thread's call came in between), the path strace shows for its file descriptor, the bytes it
# wrote (cut to what the call returned), and its result.
TraceCall = namedtuple("TraceCall", "syscall path data result start_line end_line")
# One basic.ack frame the broker wrote to the client, and the call that wrote its first byte.
Ack = namedtuple("Ack", "delivery_tag multiple call")
# Why a confirm's order is wrong: `kind` is one of no-ack, no-record, record-after-ack, no-sync.
Problem = namedtuple("Problem", "kind detail")


def escaped_bytes(text):
    """The bytes of a string strace printed with -xx (`\\x41\\x42`); other characters stand for themselves."""
    out = bytearray()
    index = 0
    while index < len(text):
        if text.startswith("\\x", index) and index + 4 <= len(text):
            out.append(int(text[index + 2:index + 4], 16))
            index += 4
        else:
            out.extend(text[index].encode())
            index += 1
    return bytes(out)


CALL_PATTERN = re.compile(r"^(\w+)\((\d+)<(.*?)>(?:, |\)|$)")
STRING_PATTERN = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')
RESULT_PATTERN = re.compile(r"\) += (-?\d+)(?: [A-Z]+ \(.*\))?$")
RESUMED_PATTERN = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
UNFINISHED_SUFFIX = " <unfinished ...>"


def parse_trace(text):
    """The traced calls on file descriptors (`strace -f -tt -yy -xx` output), in the order they started.

    A call another thread interrupted is printed twice, `<unfinished ...>` then `<... resumed>`;
    the two halves are joined into one call spanning both lines."""
    calls = []
    unfinished = {}
    for line_number, line in enumerate(text.splitlines()):
        fields = line.split(None, 2)
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        thread, rest = fields[0], fields[2]
        resumed = RESUMED_PATTERN.match(rest)
        if resumed:
            if thread not in unfinished:
                continue  # Its start came before strace attached: not a call this test needs.
            start_line, head = unfinished.pop(thread)
            calls.append(decode_call(head + resumed.group(2), start_line, line_number))
        elif rest.endswith(UNFINISHED_SUFFIX):
            unfinished[thread] = (line_number, rest[:-len(UNFINISHED_SUFFIX)])
        else:
            calls.append(decode_call(rest, line_number, line_number))
    calls = [call for call in calls if call is not None]
    calls.sort(key=lambda call: call.start_line)
    return calls


def decode_call(text, start_line, end_line):
    call = CALL_PATTERN.match(text)
    result = RESULT_PATTERN.search(text)
    if not call or not result:
        return None
    data = b"".join(escaped_bytes(string) for string in STRING_PATTERN.findall(text[call.end():]))
    result_value = int(result.group(1))
    if call.group(1) in SOCKET_WRITES + FILE_WRITES:
        data = data[:max(result_value, 0)]
    path = escaped_bytes(call.group(3)).decode("utf-8", "replace")
    return TraceCall(call.group(1), path, data, result_value, start_line, end_line)


def basic_acks(calls, amqp_port):
    """Every basic.ack frame the broker wrote on a connection to `amqp_port`, in the order written."""
    acks = []
    streams = {}
    for call in calls:
        if call.syscall in SOCKET_WRITES and call.result > 0 and call.path.startswith("TCP:[127.0.0.1:%d->" % amqp_port):
            streams.setdefault(call.path, []).append(call)
    for path, writes in streams.items():
        for write in writes:
            assert len(write.data) == write.result, "trace line %d shows %d of the %d bytes written to %s: raise " \
                "TRACE_STRING_BYTES_MAX" % (write.start_line + 1, len(write.data), write.result, path)
        stream = b"".join(write.data for write in writes)
        # The call that wrote each byte: a frame can span writes, and one write can hold frames.
        writer_of_byte = [write for write in writes for _ in range(len(write.data))]
        offset = 0
        while offset + 7 <= len(stream):
            frame_type = stream[offset]
            size = int.from_bytes(stream[offset + 3:offset + 7], "big")
            end = offset + 7 + size
            assert end < len(stream), "%s: the last frame the broker sent is cut short in the trace" % path
            assert stream[end] == FRAME_END, "%s: no frame-end octet at byte %d of what the broker sent" % (path, end)
            payload = stream[offset + 7:end]
            if frame_type == FRAME_METHOD and payload[:4] == bytes([0, BASIC_CLASS, 0, BASIC_ACK_METHOD]):
                tag = int.from_bytes(payload[4:12], "big")
                acks.append(Ack(tag, bool(payload[12] & 1), writer_of_byte[offset]))
            offset = end + 1
    acks.sort(key=lambda ack: ack.call.start_line)
    return acks


def confirm_order_problems(calls, data_dir, amqp_port, bodies, record_suffix):
    """For each message (delivery tag = its index + 1): None when its basic.ack was written after a
    write of its record to a data file ending in `record_suffix` and after an fdatasync of that
    file which started after the write and returned 0 before the ack; else the Problem."""
    data_dir = os.path.realpath(str(data_dir)) + os.sep
    acks = basic_acks(calls, amqp_port)
    problems = []
    for index, body in enumerate(bodies):
        tag = index + 1
        ack = next((ack for ack in acks if ack.delivery_tag == tag or (ack.multiple and ack.delivery_tag > tag)), None)
        if ack is None:
            problems.append(Problem("no-ack", "no basic.ack for delivery tag %d in the trace" % tag))
            continue
        record = next((call for call in calls
                       if call.syscall in FILE_WRITES and call.path.startswith(data_dir)
                       and call.path.endswith(record_suffix) and body in call.data), None)
        if record is None:
            problems.append(Problem("no-record", "tag %d: no write of its record to a %s file" % (tag, record_suffix)))
            continue
        if record.end_line >= ack.call.start_line:
            problems.append(Problem("record-after-ack", "tag %d: the record's write to %s (trace line %d) ends after "
                                    "the ack's write starts (line %d)" % (tag, record.path, record.end_line + 1,
                                                                        ack.call.start_line + 1)))
            continue
        sync = next((call for call in calls
                     if call.syscall in SYNCS and call.path == record.path and call.result == 0
                     and record.end_line < call.start_line and call.end_line < ack.call.start_line), None)
        if sync is None:
            problems.append(Problem("no-sync", "tag %d: no fdatasync of %s between the record's write (trace line "
                                    "%d) and the ack (line %d)" % (tag, record.path, record.end_line + 1,
                                                                   ack.call.start_line + 1)))
            continue
        problems.append(None)
    return problems


def strace_command():
    """strace's path, installed from Debian when missing, after checking it may trace here."""
    path = shutil.which("strace")
    if path is None and os.getuid() == 0 and shutil.which("apt-get"):
        environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=environment, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "strace"],
                       capture_output=True, env=environment, timeout=300)
        path = shutil.which("strace")
    if path is None:
        skip_loudly("strace is not installed and could not be installed with apt-get (running as uid %d): "
                    "the confirm-order test traces the broker with it" % os.getuid())
    probe = subprocess.run([path, "-f", "-o", os.devnull, "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        skip_loudly("strace cannot trace a process on this machine (ptrace not permitted?): %s" % probe.stderr.strip())
    return path


class TracedBroker(LepusBroker):
    """A LepusBroker started under `strace -f`, through a wrapper script that execs strace; the
    broker is strace's child in the same new session, so it is signalled through the group."""

    def __init__(self, binary, strace, data_dir, log_dir, server_args):
        self.trace_path = os.path.join(str(log_dir), "broker.strace")
        wrapper = os.path.join(str(log_dir), "lepus-under-strace")
        strace_args = [strace, "-f", "-tt", "-yy", "-xx", "-s", str(TRACE_STRING_BYTES_MAX),
                       "-e", "trace=" + TRACED_SYSCALLS, "-e", "signal=none", "-o", self.trace_path, "--", binary]
        with open(wrapper, "w") as script:
            script.write("#!/bin/sh\nexec %s \"$@\"\n" % " ".join(shlex.quote(arg) for arg in strace_args))
        os.chmod(wrapper, 0o755)
        super().__init__(wrapper, data_dir, log_dir)
        self.server_args = server_args

    def extra_port_args(self):
        return super().extra_port_args() + self.server_args

    def stop_and_read_trace(self):
        """SIGTERM to the broker (strace, started with -o and a command, blocks it for itself and
        exits when the broker does), then the whole trace."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("lepus under strace did not exit within %.0fs of SIGTERM:\n%s" % (STOP_TIMEOUT, self.log_tail()))
        with open(self.trace_path, encoding="ascii", errors="replace") as trace:
            return trace.read()

    def kill(self):
        # SIGKILL to strace alone would detach it and leave the broker running: kill the group.
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT)


@pytest.fixture
def traced_run(tmp_path):
    """traced_run(server_args) -> (calls, data_dir, amqp_port, bodies): publishes MESSAGES persistent
    messages, each waiting for its confirm, to a durable queue of a broker under strace, stops it,
    and parses the trace."""
    strace = strace_command()
    brokers = []

    def run(server_args):
        run_directory = tmp_path / ("run-%d" % len(brokers))
        data_dir = run_directory / "data"
        data_dir.mkdir(parents=True)
        broker = TracedBroker(os.environ["LEPUS_BIN"], strace, data_dir, run_directory, server_args)
        brokers.append(broker)
        broker.start()
        bodies = publish_one_at_a_time(broker.url)
        trace = broker.stop_and_read_trace()
        return parse_trace(trace), data_dir, broker.port, bodies

    yield run
    for broker in brokers:
        broker.kill()


def publish_one_at_a_time(url):
    """Publishes MESSAGES persistent messages with confirms, each after the previous one's ack;
    returns their bodies (unique, so the trace shows which write carried which message)."""
    run_id = uuid.uuid4().hex
    bodies = [("confirm-order-%s-%04d" % (run_id, index)).encode() for index in range(MESSAGES)]
    connection = pika.BlockingConnection(make_params(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        queue = "confirm-order-" + run_id
        channel.queue_declare(queue, durable=True)
        for body in bodies:
            # Returns once the broker's basic.ack arrived; raises on a nack.
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    finally:
        safe_close(connection)
    return bodies


def describe(problems):
    return "\n".join("  " + problem.detail for problem in problems if problem is not None)


def test_every_confirm_follows_its_journal_write_and_fdatasync(traced_run):
    calls, data_dir, amqp_port, bodies = traced_run(["--sync", "always"])
    assert len(basic_acks(calls, amqp_port)) == MESSAGES, "expected one basic.ack per publish in the trace"
    problems = confirm_order_problems(calls, data_dir, amqp_port, bodies, ".wal")
    wrong = [problem for problem in problems if problem is not None]
    if wrong:
        pytest.fail("%d of %d confirms were not preceded by their journal write and an fdatasync of it:\n%s"
                    % (len(wrong), MESSAGES, describe(problems)))


def test_interval_mode_confirms_without_waiting_for_an_fdatasync(traced_run):
    """The control: the same check on `--sync interval` (no journal; records go straight to their
    segment, fdatasynced every interval) must find every confirm sent after its record's write
    with no sync in between."""
    calls, data_dir, amqp_port, bodies = traced_run(["--sync", "interval", "--sync-interval-ms", str(SYNC_INTERVAL_MS)])
    assert len(basic_acks(calls, amqp_port)) == MESSAGES, "expected one basic.ack per publish in the trace"
    journaled = [call for call in calls if call.syscall in FILE_WRITES and call.path.endswith(".wal")
                 and any(body in call.data for body in bodies)]
    if journaled:
        pytest.fail("--sync interval has no journal, yet %d journal writes carry the messages (first at trace line %d): "
                    "is the mode ignored?" % (len(journaled), journaled[0].start_line + 1))
    problems = confirm_order_problems(calls, data_dir, amqp_port, bodies, ".seg")
    kinds = [problem.kind if problem is not None else "ordered" for problem in problems]
    assert kinds == ["no-sync"] * MESSAGES, (
        "with --sync interval every confirm should follow its segment write with no fdatasync in between; got %s:\n%s"
        % (kinds, describe(problems)))
