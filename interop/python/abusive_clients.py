"""Abusive AMQP clients, a well-behaved client measured beside them, and a sampler of the broker's
process (issue 15 item 6, "protocol abuse under load").

Each abuser is started (`start()`), abuses the broker while the load runs, and is then checked
(`finish()`), which raises AssertionError unless the broker answered it as RabbitMQ 3.10.8 does.
`run_abuse()` runs them all at once while `WellBehavedClient` measures round trips in its own
process, so that the abusers' Python threads never hold its interpreter lock.

Used by tests/test_protocol_abuse.py (short form: 1,000 idle connections) and, through
`python3 abusive_clients.py`, by scripts/protocol-abuse.sh (full form: 10,000).
"""

import argparse
import json
import multiprocessing
import os
import random
import select
import socket
import statistics
import struct
import threading
import time

import pika

import rawamqp as r

# RabbitMQ's handshake_timeout (10 s), and Lepus's HANDSHAKE_TIMEOUT_S.
HANDSHAKE_TIMEOUT_S = 10
# How much later than its deadline a broker on a loaded 2-core machine may act before a check
# fails: a bound on how long a check waits, not a measure of the broker.
LATE_MARGIN_S = 20
# What a raw abuser waits for any one frame it expects.
FRAME_WAIT_S = 30
# RabbitMQ 3.10.8 closes a connection whose socket writes made no progress for 15 s (its log says
# `{writer,send_failed,{error,timeout}}`), without connection.close: its answer to a client that
# stops reading for longer than that. Lepus does the same (connection/writer.rs).
RABBITMQ_SEND_TIMEOUT_S = 15


def body_of(prefix, index, size):
    """A body of exactly `size` bytes that names its publisher and index."""
    head = b"%s-%010d-" % (prefix, index)
    return head + b"." * (size - len(head))


def publish_frames(queue, body):
    """basic.publish to the default exchange on channel 1, with its header and body frames."""
    args = r.short(0) + r.shortstr("") + r.shortstr(queue) + r.bits(False, False)
    return r.method_frame(1, r.BASIC_PUBLISH, args) + r.content_header_frame(1, 60, len(body)) + r.body_frame(1, body)


def raw_client(url, heartbeat=0, channel=True):
    """A RawClient past the handshake (and with channel 1 open), with patient reads."""
    client = r.RawClient(url, timeout=FRAME_WAIT_S)
    client.handshake(heartbeat=heartbeat)
    if channel:
        client.open_channel(1)
    return client


def close_quietly(clients):
    for client in clients:
        client.close()


class Abuser:
    """One kind of abuse: `start()` returns at once (threads do the rest); `finish()` checks."""

    name = "abuser"
    # Set when the broker closed this client's socket while it was not reading (see
    # RABBITMQ_SEND_TIMEOUT_S); finish() then has nothing more to check.
    closed_by_broker = False

    def start(self):
        raise NotImplementedError

    def finish(self):
        raise NotImplementedError

    def counts(self):
        """What this abuser did, for the report."""
        return {}


class BackgroundAbuser(Abuser):
    """An abuser whose work runs in threads; an exception in one fails `finish()`."""

    def __init__(self):
        self.threads = []
        self.errors = []

    def spawn(self, target, *args):
        def guarded():
            try:
                target(*args)
            except Exception as error:  # reported by finish()
                self.errors.append("%s: %r" % (self.name, error))

        thread = threading.Thread(target=guarded, name=self.name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), "%s: a thread did not finish within %d s" % (self.name, timeout_s)
        assert not self.errors, self.errors


class IdleConnections(BackgroundAbuser):
    """`count` connections that complete the handshake (heartbeats off) and then say nothing.
    RabbitMQ keeps such a connection open and sends it nothing."""

    name = "idle connections"

    def __init__(self, url, count, openers=8):
        super().__init__()
        self.url = url
        self.count = count
        self.openers = openers
        self.clients = []
        self.open_seconds = None

    def open_some(self, count):
        for _ in range(count):
            client = raw_client(self.url, channel=False)
            self.clients.append(client)

    def start(self):
        self.started = time.monotonic()
        share, rest = divmod(self.count, self.openers)
        for opener in range(self.openers):
            self.spawn(self.open_some, share + (1 if opener < rest else 0))

    def all_open(self, timeout_s):
        self.join(timeout_s)
        if self.open_seconds is None:
            self.open_seconds = time.monotonic() - self.started

    def finish(self):
        try:
            self.all_open(FRAME_WAIT_S + 600)
            assert len(self.clients) == self.count, (len(self.clients), self.count)
            # Nothing to read on any of them: neither a frame nor an end of file.
            poller = select.poll()
            for client in self.clients:
                poller.register(client.sock, select.POLLIN)
            readable = poller.poll(0)
            assert readable == [], "%d idle connections were written to or closed by the broker" % len(readable)
        finally:
            close_quietly(self.clients)

    def counts(self):
        return {"idle_connections": len(self.clients), "idle_open_s": self.open_seconds}


class SilentClients(Abuser):
    """Clients that connect and send nothing, or only the protocol header: the broker closes them
    when its handshake timeout (10 s) runs out, writing nothing more than connection.start."""

    name = "silent before the handshake"

    def __init__(self, url, count):
        self.url = url
        self.count = count
        self.clients = []

    def start(self):
        self.started = time.monotonic()
        for index in range(self.count):
            client = r.RawClient(self.url, timeout=FRAME_WAIT_S)
            self.clients.append(client)
            if index % 2:
                client.send(r.PROTOCOL_HEADER)
                client.expect_method(r.CONNECTION_START)

    def finish(self):
        try:
            deadline = self.started + HANDSHAKE_TIMEOUT_S + LATE_MARGIN_S
            for client in self.clients:
                data = client.read_all_until_eof(max(0.1, deadline - time.monotonic()))
                assert data == b"", "%s: %r written after connection.start" % (self.name, data[:64])
        finally:
            close_quietly(self.clients)

    def counts(self):
        return {"silent_clients": len(self.clients)}


class HalfFrameClients(BackgroundAbuser):
    """Clients that send basic.publish, its header and half of its body frame into `queue`, then
    either hang (heartbeats on: the broker drops them after two missed intervals, writing nothing
    but heartbeats, as RabbitMQ does) or disconnect. No half-sent message is ever enqueued."""

    def __init__(self, url, queue, count, hang, heartbeat_s=1):
        super().__init__()
        self.url = url
        self.queue = queue
        self.count = count
        self.hang = hang
        self.heartbeat_s = heartbeat_s
        self.name = "half a frame, then %s" % ("hang" if hang else "disconnect")
        self.hanging = []

    def half_publish(self, client, index):
        frames = publish_frames(self.queue, body_of(b"half", index, 1024))
        client.send(frames[: len(frames) - 512])

    def disconnect_each(self):
        for index in range(self.count):
            client = raw_client(self.url)
            try:
                self.half_publish(client, index)
            finally:
                client.close()

    def start(self):
        if not self.hang:
            self.spawn(self.disconnect_each)
            return
        self.started = time.monotonic()
        for index in range(self.count):
            client = raw_client(self.url, heartbeat=self.heartbeat_s)
            self.hanging.append(client)
            self.half_publish(client, index)

    def finish(self):
        try:
            self.join(FRAME_WAIT_S + 300)
            deadline = time.monotonic() + 2 * self.heartbeat_s + LATE_MARGIN_S
            for client in self.hanging:
                while True:
                    try:
                        frame = client.read_frame(max(0.1, deadline - time.monotonic()), skip_heartbeats=False)
                    except r.ConnectionClosedByPeer:
                        break
                    assert frame.type == r.FRAME_HEARTBEAT, "%s: %r instead of heartbeats" % (self.name, frame)
        finally:
            close_quietly(self.hanging)

    def counts(self):
        return {self.name: self.count}


class ConfirmingPublisher(BackgroundAbuser):
    """Publishes with confirms as fast as the socket takes them and reads nothing until
    `finish()`: either `count` messages (bodies `prefix-index`, to be checked by a consumer) or,
    with count None, until `finish()` (a flood). The broker stops reading it while its confirms
    wait unread (TCP pushes back); once it reads, every publish is acked, none nacked, in order.
    Unless it stayed stuck past RABBITMQ_SEND_TIMEOUT_S: then RabbitMQ closes the socket."""

    def __init__(self, url, queue, count=None, prefix=b"flood", body_bytes=256, batch=256):
        super().__init__()
        self.url = url
        self.queue = queue
        self.count = count
        self.prefix = prefix
        self.body_bytes = body_bytes
        self.batch = batch
        self.name = "publisher flooding with confirms it never reads" if count is None else "filler of %d messages never reading its confirms" % count
        self.stop = threading.Event()
        self.published = 0
        self.publish_bytes = len(publish_frames(queue, body_of(prefix, 0, body_bytes)))

    def start(self):
        self.client = raw_client(self.url)
        self.client.send(r.method_frame(1, r.CONFIRM_SELECT, r.bits(False)))
        self.client.expect_method(r.CONFIRM_SELECT_OK)
        self.spawn(self.publish_all)

    def batches(self):
        index = 0
        while self.count is None or index < self.count:
            size = self.batch if self.count is None else min(self.batch, self.count - index)
            # A flood repeats one body: building frames must not be what limits it.
            if self.count is None and index:
                yield flood_batch
            else:
                flood_batch = b"".join(publish_frames(self.queue, body_of(self.prefix, index + offset, self.body_bytes))
                                       for offset in range(size))
                yield flood_batch
            index += size

    def publish_all(self):
        sock = self.client.sock
        sent_bytes = 0
        for data in self.batches():
            view = memoryview(data)
            while view:
                # A flood stops at a publish boundary once told to; a bounded publisher sends all.
                if self.stop.is_set() and self.count is None and sent_bytes % self.publish_bytes == 0:
                    return
                _, writable, _ = select.select([], [sock], [], 0.05)
                if not writable:
                    continue
                sent = sock.send(view[: 1 << 16])
                view = view[sent:]
                sent_bytes += sent
                self.published = sent_bytes // self.publish_bytes

    def finish(self):
        # Read the confirms while the sender completes its last publish (the broker may need
        # this side to read before it reads again).
        self.stop.set()
        client = self.client
        try:
            self.read_confirms(client)
        except r.ConnectionClosedByPeer:
            # RabbitMQ's answer once this socket's writes were stuck for its send timeout.
            self.closed_by_broker = True
        finally:
            client.close()

    def read_confirms(self, client):
        confirmed_through = 0
        deadline = time.monotonic() + FRAME_WAIT_S + 120
        while True:
            if not any(thread.is_alive() for thread in self.threads) and confirmed_through == self.published:
                break
            assert time.monotonic() < deadline, "%s: %d of %d confirmed" % (self.name, confirmed_through, self.published)
            try:
                frame = client.read_frame(1.0)
            except socket.timeout:
                continue
            assert frame.method == r.BASIC_ACK, "%s: %r after %d confirms" % (self.name, frame, confirmed_through)
            tag, multiple = struct.unpack(">QB", frame.payload[4:13])
            if multiple:
                assert tag > confirmed_through, (tag, confirmed_through)
            else:
                assert tag == confirmed_through + 1, "%s: ack %d after %d" % (self.name, tag, confirmed_through)
            confirmed_through = tag
        self.join(5)
        assert self.count is None or self.published == self.count, (self.published, self.count)
        # And the connection still serves: a declare is answered.
        client.queue_declare(1, "", exclusive=True)

    def counts(self):
        key = "flood_publishes" if self.count is None else "filler_publishes"
        return {key: self.published, key + "_closed_by_broker": self.closed_by_broker}


class SlowConsumer(BackgroundAbuser):
    """A consumer without a prefetch limit (basic.qos 0) on a queue that a confirming publisher
    fills with `count` messages; it does not read its socket until `finish()`. RabbitMQ holds
    what it cannot write in the queue; once read, every message arrives, in order, once (unless
    it stayed stuck past RABBITMQ_SEND_TIMEOUT_S: then RabbitMQ closes the socket)."""

    name = "slow consumer"

    def __init__(self, url, count, body_bytes=1024):
        super().__init__()
        self.url = url
        self.count = count
        self.body_bytes = body_bytes

    def start(self):
        self.client = client = raw_client(self.url)
        # A small receive buffer, so that the broker's writer meets a full socket early.
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.queue = client.declared_queue_name(1, exclusive=True)
        client.send(r.method_frame(1, r.BASIC_QOS, r.long_(0) + r.short(0) + r.bits(False)))
        client.expect_method(r.BASIC_QOS_OK)
        client.send(r.method_frame(1, r.BASIC_CONSUME, r.short(0) + r.shortstr(self.queue) + r.shortstr("slow")
                                   + r.bits(False, False, False, False) + r.table({})))
        client.expect_method(r.BASIC_CONSUME_OK)
        self.filler = ConfirmingPublisher(self.url, self.queue, count=self.count, prefix=b"slow", body_bytes=self.body_bytes)
        self.filler.start()

    def finish(self):
        client = self.client
        try:
            self.filler.finish()
            if self.filler.closed_by_broker:
                return
            self.read_all(client)
        except r.ConnectionClosedByPeer:
            # RabbitMQ's answer once this socket's writes were stuck for its send timeout.
            self.closed_by_broker = True
        finally:
            client.close()

    def read_all(self, client):
        for index in range(self.count):
            deliver = client.read_frame()
            assert deliver.method == r.BASIC_DELIVER, "%s: %r as delivery %d" % (self.name, deliver, index + 1)
            args = deliver.payload[4:]
            tag_at = 1 + args[0]
            delivery_tag, redelivered = struct.unpack(">QB", args[tag_at:tag_at + 9])
            assert (delivery_tag, redelivered) == (index + 1, 0), (delivery_tag, redelivered, index)
            header = client.read_frame()
            assert header.type == r.FRAME_HEADER, header
            body = client.read_frame()
            assert body.type == r.FRAME_BODY, body
            assert body.payload == body_of(b"slow", index, self.body_bytes), (index, body.payload[:32])

    def counts(self):
        return {"slow_consumer_messages": self.count, "slow_consumer_closed_by_broker": self.closed_by_broker,
                "slow_consumer_filler_closed_by_broker": self.filler.closed_by_broker}


class RandomBytesClients(BackgroundAbuser):
    """Clients that send random bytes (seeded) instead of the protocol header, or after a correct
    handshake. RabbitMQ answers the first with its own header, AMQP 0-9-1, and closes; the second
    with connection.close 501 FRAME_ERROR (a random frame header declares a payload larger than
    frame_max), and closes once it has the close-ok."""

    def __init__(self, url, count, after_handshake, seed=15):
        super().__init__()
        self.url = url
        self.count = count
        self.after_handshake = after_handshake
        self.seed = seed
        self.name = "random bytes %s the handshake" % ("after" if after_handshake else "instead of")

    def one(self, rng):
        if self.after_handshake:
            client = raw_client(self.url)
            try:
                client.send(rng.randbytes(256))
                r.assert_connection_close(client, 501, "FRAME_ERROR")
            finally:
                client.close()
            return
        client = r.RawClient(self.url, timeout=FRAME_WAIT_S)
        try:
            garbage = rng.randbytes(rng.randrange(8, 33))
            assert not garbage.startswith(b"AMQP"), garbage
            client.send(garbage)
            assert client.read_all_until_eof() == r.PROTOCOL_HEADER
        finally:
            client.close()

    def each(self, seed, count):
        rng = random.Random(seed)
        for _ in range(count):
            self.one(rng)

    def start(self):
        # In parallel: a broker answers a frame error after a 3 s wait for the close-ok
        # (RabbitMQ's and Lepus's), which one client after another would add up.
        threads = min(self.count, 50)
        share, rest = divmod(self.count, threads)
        for thread in range(threads):
            self.spawn(self.each, self.seed * 1000 + thread, share + (1 if thread < rest else 0))

    def finish(self):
        self.join(FRAME_WAIT_S + 300)

    def counts(self):
        return {self.name: self.count}


# --------------------------------------------------------------------------------------------
# the well-behaved client and the broker's process
# --------------------------------------------------------------------------------------------

def well_behaved_client_main(url, abused, held, stop, results):
    """In a process of its own: publish one message at a time with confirms and wait for its
    delivery to a manual-ack consumer on the same connection; the round trip (publish until both
    the confirm and the delivery arrived) is recorded under the phase it started in: quiet, under
    abuse while the idle connections are being opened, or under abuse once they are all open
    (held)."""
    outcome = {"quiet_ms": [], "abused_ms": [], "held_ms": [], "published": 0, "errors": []}
    try:
        params = pika.URLParameters(url)
        params.socket_timeout = 30
        params.blocked_connection_timeout = 60
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_qos(prefetch_count=1)
        delivered = []
        channel.basic_consume(queue, lambda ch, method, _props, body: (delivered.append((body, method.redelivered)),
                                                                       ch.basic_ack(method.delivery_tag)))
        index = 0
        while not stop.is_set():
            phase = "held_ms" if held.is_set() else "abused_ms" if abused.is_set() else "quiet_ms"
            body = b"good-%d" % index
            started = time.perf_counter()
            channel.basic_publish("", queue, body, mandatory=True)  # raises on a nack or a return
            while len(delivered) <= index:
                connection.process_data_events(time_limit=None)
            outcome[phase].append((time.perf_counter() - started) * 1000.0)
            if delivered[index] != (body, False):
                outcome["errors"].append("delivery %d was %r" % (index, delivered[index]))
                break
            index += 1
            outcome["published"] = index
        connection.close()
    except Exception as error:
        outcome["errors"].append(repr(error))
    results.send(outcome)


class WellBehavedClient:
    """Runs `well_behaved_client_main` in its own process (spawned, so it shares no lock or thread
    with the abusers)."""

    def __init__(self, url):
        context = multiprocessing.get_context("spawn")
        self.abused = context.Event()
        self.held = context.Event()
        self.stop = context.Event()
        self.receiver, sender = context.Pipe(duplex=False)
        self.process = context.Process(target=well_behaved_client_main, args=(url, self.abused, self.held, self.stop, sender), daemon=True)

    def start(self):
        self.process.start()

    def finish(self, timeout_s=120):
        self.stop.set()
        assert self.receiver.poll(timeout_s), "the well-behaved client did not report within %d s" % timeout_s
        outcome = self.receiver.recv()
        self.process.join(10)
        return outcome


def percentile_ms(samples, fraction):
    if not samples:
        return None
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 3)


class ProcessSampler:
    """Samples a process's resident memory (/proc/PID/status VmRSS) and CPU time."""

    def __init__(self, pid, interval_s=0.05):
        self.pid = pid
        self.interval_s = interval_s
        self.rss_kib_peak = 0
        self.samples = 0
        self.alive = True
        self.stop = threading.Event()

    def rss_kib(self):
        with open("/proc/%d/status" % self.pid) as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def cpu_s(self):
        with open("/proc/%d/stat" % self.pid) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run(self):
        while not self.stop.is_set():
            try:
                self.rss_kib_peak = max(self.rss_kib_peak, self.rss_kib())
                self.samples += 1
            except OSError:
                self.alive = False
                return
            self.stop.wait(self.interval_s)

    def start(self):
        self.cpu_s_at_start = self.cpu_s()
        self.thread = threading.Thread(target=self.run, name="rss sampler", daemon=True)
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join(5)
        return {"rss_kib_peak": self.rss_kib_peak, "rss_samples": self.samples,
                "cpu_s": round(self.cpu_s() - self.cpu_s_at_start, 2) if self.alive else None}


def broker_answers(url):
    """The broker still accepts a connection and answers on it."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_declare("", exclusive=True)
    finally:
        connection.close()


def abusers(url, idle_count, half_frame_queue, flood_queue, short_form):
    """Every kind of abuse, sized for the short (test) or the full (script) form."""
    scale = 1 if short_form else 5
    return [
        SilentClients(url, 10 * scale),
        HalfFrameClients(url, half_frame_queue, 10 * scale, hang=True),
        HalfFrameClients(url, half_frame_queue, 100 * scale, hang=False),
        SlowConsumer(url, 20_000 * scale),
        ConfirmingPublisher(url, flood_queue),
        RandomBytesClients(url, 50 * scale, after_handshake=False),
        RandomBytesClients(url, 50 * scale, after_handshake=True),
    ]


def run_abuse(url, idle_count, quiet_s, abused_hold_s, pid=None, short_form=True, log=print):
    """Measures the well-behaved client alone for `quiet_s`, then with every abuser running until
    the idle connections are all open and `abused_hold_s` more; then checks every abuser's answer,
    that the broker still answers, and (with `pid`) samples its memory and CPU throughout.
    Returns the report; its "failures" lists the checks that failed."""
    report = {"url": url, "failures": []}
    sampler = ProcessSampler(pid) if pid else None
    if sampler:
        sampler.start()
    setup = pika.BlockingConnection(pika.URLParameters(url))
    channel = setup.channel()
    half_frame_queue = channel.queue_declare("", exclusive=True).method.queue
    flood_queue = channel.queue_declare("", exclusive=True, arguments={"x-max-length": 1000}).method.queue
    prober = WellBehavedClient(url)
    prober.start()
    time.sleep(quiet_s)
    prober.abused.set()
    started = time.monotonic()
    idle = IdleConnections(url, idle_count)
    running = []
    for abuser in [idle] + abusers(url, idle_count, half_frame_queue, flood_queue, short_form):
        try:
            abuser.start()
            running.append(abuser)
        except Exception as error:
            report["failures"].append("%s: start: %r" % (abuser.name, error))
    try:
        idle.all_open(FRAME_WAIT_S + 600)
    except Exception as error:
        report["failures"].append("idle connections: %r" % error)
    log("abuse: %d idle connections open after %.1f s; holding %d s" % (len(idle.clients), time.monotonic() - started, abused_hold_s))
    prober.held.set()
    time.sleep(abused_hold_s)
    outcome = prober.finish()
    report["abused_s"] = round(time.monotonic() - started, 1)
    for abuser in running:
        try:
            abuser.finish()
        except Exception as error:
            report["failures"].append("%s: %r" % (abuser.name, error))
        report.update(abuser.counts())
    try:
        assert channel.queue_declare(half_frame_queue, passive=True).method.message_count == 0, "a half-sent publish was enqueued"
        setup.close()
        broker_answers(url)
    except Exception as error:
        report["failures"].append("after the abuse: %r" % error)
    if sampler:
        report.update(sampler.finish())
        if not sampler.alive:
            report["failures"].append("the broker's process %d is gone" % pid)
    report["failures"] += ["well-behaved client: %s" % error for error in outcome["errors"]]
    outcome["abused_ms"] += outcome["held_ms"]
    for phase in ("quiet_ms", "abused_ms", "held_ms"):
        samples = outcome[phase]
        report[phase] = {"round_trips": len(samples), "p50": percentile_ms(samples, 0.50), "p99": percentile_ms(samples, 0.99)}
    report["well_behaved_round_trips"] = outcome["published"]
    return report


def median(values):
    values = [value for value in values if value is not None]
    return round(statistics.median(values), 3) if values else None


def summarize(paths):
    """Medians per broker over the reports (one JSON object a line, with a "broker" label)."""
    runs = {}
    for path in paths:
        with open(path) as lines:
            for line in lines:
                if line.startswith("{"):
                    report = json.loads(line)
                    runs.setdefault(report["broker"], []).append(report)
    print("| broker | runs | quiet p50 / p99 ms | abused p50 / p99 ms | p99 abused / quiet | held p50 / p99 ms "
          "| p99 held / quiet | peak RSS MiB | CPU s | failures |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for broker, reports in runs.items():
        def med(phase, key):
            return median([report[phase][key] for report in reports])

        def ratio(phase):
            return median([report[phase]["p99"] / report["quiet_ms"]["p99"] for report in reports
                           if report[phase]["p99"] and report["quiet_ms"]["p99"]])

        rss = median([report.get("rss_kib_peak", 0) / 1024 for report in reports])
        print("| %s | %d | %s / %s | %s / %s | %s | %s / %s | %s | %s | %s | %d |" % (
            broker, len(reports), med("quiet_ms", "p50"), med("quiet_ms", "p99"), med("abused_ms", "p50"),
            med("abused_ms", "p99"), ratio("abused_ms"), med("held_ms", "p50"), med("held_ms", "p99"), ratio("held_ms"),
            rss, median([report.get("cpu_s") for report in reports]), sum(len(report["failures"]) for report in reports)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one run; prints its report as one JSON line")
    run.add_argument("--url", required=True)
    run.add_argument("--broker", default="broker", help="a label for the report")
    run.add_argument("--pid", type=int, help="the broker's process, for its RSS and CPU")
    run.add_argument("--idle", type=int, default=10_000, help="idle connections")
    run.add_argument("--quiet-s", type=float, default=15)
    run.add_argument("--hold-s", type=float, default=15, help="abuse held this long after the idle connections are open")
    summary = commands.add_parser("summarize", help="medians per broker of the reports in FILE...")
    summary.add_argument("files", nargs="+")
    args = parser.parse_args()
    if args.command == "summarize":
        summarize(args.files)
        return
    report = run_abuse(args.url, args.idle, args.quiet_s, args.hold_s, pid=args.pid, short_form=False,
                       log=lambda line: print(line, flush=True))
    report["broker"] = args.broker
    print(json.dumps(report), flush=True)
    raise SystemExit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
