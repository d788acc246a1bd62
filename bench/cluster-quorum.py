#!/usr/bin/env python3
"""Quorum queues on three nodes, Lepus and RabbitMQ 3.10.8 side by side (called by
bench/cluster-quorum.sh, which says how to run it).

Each broker: three nodes on this machine (private names, free ports, fresh data directories),
clustered (Lepus from its seeds; RabbitMQ with `rabbitmqctl join_cluster`); each workload is one
`lepus perf client --queue-type quorum --persistent` run (confirms, manual acks) with --url naming
the three nodes (producers and consumers spread round robin); the brokers' CPU time is read from
/proc before and after (every node's process), so CPU seconds per million messages is the three
nodes' CPU over the messages received. Then Lepus's failover: FAILOVERS times, kill -9 the node
leading a quorum queue's shard and time until a confirmed publish through a survivor succeeds;
the node is restarted and caught up before the next kill.

usage: cluster-quorum.py LEPUS_BIN OUT_DIR
environment: DURATION_S (20), WARMUP_S (5), FAILOVERS (20), RABBITMQ (1; 0: Lepus only)
"""
import json
import os
import shutil
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import base64
import glob

# interop/free_ports.py: ports below the ephemeral range, or from INTEROP_PORTS=FIRST-LAST on a
# machine shared with other runs.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
from free_ports import free_port  # noqa: E402

LEPUS_BIN, OUT = sys.argv[1], sys.argv[2]
DURATION_S = int(os.environ.get("DURATION_S", "20"))
WARMUP_S = int(os.environ.get("WARMUP_S", "5"))
FAILOVERS = int(os.environ.get("FAILOVERS", "20"))
WITH_RABBITMQ = os.environ.get("RABBITMQ", "1") != "0"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
WORKLOADS = [
    # name, perf arguments
    ("1p1c-16B", ["--message-size", "16", "--producers", "1", "--consumers", "1"]),
    ("1p1c-1KiB", ["--message-size", "1024", "--producers", "1", "--consumers", "1"]),
    ("10q-10p10c-16B", ["--message-size", "16", "--producers", "1", "--consumers", "1", "--num-destinations", "10"]),
]


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def cpu_s(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / CLOCK_TICKS


def load_average():
    with open("/proc/loadavg") as handle:
        return float(handle.read().split()[0])


def api(port, path, method="GET"):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api{path}", method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read() or b"null")


def stream_url(port):
    return f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/%2f"


def wait_listening(ports, what, timeout=180):
    deadline = time.time() + timeout
    for port in ports:
        while not port_open(port):
            if time.time() > deadline:
                raise RuntimeError(f"{what} did not listen on {port}")
            time.sleep(0.5)


class LepusCluster:
    """Three Lepus nodes; with `stream`, each also serves the stream protocol (advertising
    127.0.0.1, so stream clients are sent to an address they can reach)."""

    def __init__(self, directory, stream=False):
        self.directory = directory
        self.cluster_ports = [free_port() for _ in range(3)]
        self.amqp_ports = [free_port() for _ in range(3)]
        self.http_ports = [free_port() for _ in range(3)]
        self.stream_ports = [free_port() for _ in range(3)] if stream else None
        self.seeds = ",".join(f"127.0.0.1:{port}" for port in self.cluster_ports)
        self.processes = [None] * 3

    def start_node(self, index):
        arguments = [LEPUS_BIN, "server", "--node-name", self.node_name(index), "--data-dir", f"{self.directory}/n{index + 1}",
                     "--bind", "127.0.0.1", "--amqp-port", str(self.amqp_ports[index]), "--http-port", str(self.http_ports[index]),
                     "--metrics-port", "0", "--cluster-port", str(self.cluster_ports[index]), "--cluster-seeds", self.seeds]
        if self.stream_ports:
            arguments += ["--stream-port", str(self.stream_ports[index]), "--stream-advertised-host", "127.0.0.1"]
        else:
            arguments += ["--stream-port", "0"]
        log = open(f"{self.directory}/n{index + 1}.log", "ab")
        self.processes[index] = subprocess.Popen(arguments, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "LEPUS_LOG": "warn"})

    def start(self):
        for index in range(3):
            self.start_node(index)
        self.wait_formed()
        if self.stream_ports:
            wait_listening(self.stream_ports, "a Lepus node's stream listener")

    def wait_formed(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                statuses = [api(port, "/lepus/cluster") for port in self.http_ports]
                if all(status["metadata"]["leader"] and sum(member["running"] for member in status["members"]) == 3 for status in statuses):
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        raise SystemExit(f"the Lepus cluster did not form: see {self.directory}/n*.log")

    def urls(self):
        return [f"amqp://guest:guest@127.0.0.1:{port}/%2F" for port in self.amqp_ports]

    def stream_urls(self):
        return [stream_url(port) for port in self.stream_ports]

    def node_name(self, index):
        return f"n{index + 1}@localhost"

    def stream_leader(self, stream):
        """The stream's leader as the first node's management API names it."""
        return api(self.http_ports[0], f"/queues/%2F/{urllib.parse.quote(stream, safe='')}").get("leader")

    def pids(self):
        return [process.pid for process in self.processes if process and process.poll() is None]

    def stop(self):
        for process in self.processes:
            if process and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)


def rabbitmq_tool(tool, *arguments):
    """The command line of a RabbitMQ CLI tool. Debian links rabbitmqctl and a few others into
    /usr/sbin through a wrapper that runs them as the rabbitmq user (whose Erlang cookie the
    nodes share), but not rabbitmq-streams: that one is run the way the wrapper would."""
    if shutil.which(tool):
        return [tool, *arguments]
    return ["su", "rabbitmq", "-s", "/bin/sh", "-c", shlex.join([f"/usr/lib/rabbitmq/bin/{tool}", *arguments])]


class RabbitCluster:
    """Three RabbitMQ nodes; with `stream`, each runs the rabbitmq_stream plugin, listening on its
    own port and advertising 127.0.0.1. Osiris, which copies a stream between nodes, listens on
    a port of `replication_ports` (FIRST-LAST) per follower; RabbitMQ's default is 6000-6500."""

    def __init__(self, directory, stream=False, replication_ports=None):
        self.directory = directory
        self.names = [f"lepus-cq{index}-{os.getpid()}@localhost" for index in range(3)]
        self.amqp_ports = [free_port() for _ in range(3)]
        self.dist_ports = [free_port() for _ in range(3)]
        self.stream_ports = [free_port() for _ in range(3)] if stream else None
        self.replication_ports = replication_ports

    def ctl(self, index, *arguments, check=True):
        return subprocess.run(["rabbitmqctl", "-n", self.names[index], *arguments], capture_output=True, text=True, timeout=120, check=check)

    def start(self):
        for index in range(3):
            base = f"{self.directory}/r{index}"
            os.makedirs(f"{base}/mnesia", exist_ok=True)
            os.makedirs(f"{base}/log", exist_ok=True)
            environment = {**os.environ, "RABBITMQ_NODENAME": self.names[index], "RABBITMQ_DIST_PORT": str(self.dist_ports[index]),
                           "RABBITMQ_CONFIG_FILE": f"{base}/rabbitmq.conf", "RABBITMQ_MNESIA_BASE": f"{base}/mnesia",
                           "RABBITMQ_LOG_BASE": f"{base}/log", "RABBITMQ_ENABLED_PLUGINS_FILE": f"{base}/enabled_plugins",
                           "RABBITMQ_ADVANCED_CONFIG_FILE": f"{base}/advanced.config"}
            self.write_configuration(index, base)
            subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", self.directory], check=False)
            subprocess.Popen(["rabbitmq-server"], env=environment, stdout=open(f"{base}/server.out", "ab"), stderr=subprocess.STDOUT)
        for index in range(3):
            deadline = time.time() + 180
            while not port_open(self.amqp_ports[index]):
                if time.time() > deadline:
                    raise RuntimeError(f"RabbitMQ node {self.names[index]} did not start: see {self.directory}/r{index}")
                time.sleep(0.5)
        for index in (1, 2):
            self.ctl(index, "stop_app")
            self.ctl(index, "join_cluster", self.names[0])
            self.ctl(index, "start_app")
        running = self.ctl(0, "cluster_status").stdout
        if any(name not in running for name in self.names):
            raise RuntimeError(f"RabbitMQ nodes did not cluster: {running}")
        if self.stream_ports:
            # start_app after join_cluster starts the stream listener again.
            wait_listening(self.stream_ports, "a RabbitMQ node's stream listener")

    def write_configuration(self, index, base):
        lines = [f"listeners.tcp.default = {self.amqp_ports[index]}", "loopback_users = none"]
        plugins = "[]"
        advanced = "[]"
        if self.stream_ports:
            plugins = "[rabbitmq_stream]"
            lines += [f"stream.listeners.tcp.1 = {self.stream_ports[index]}", "stream.advertised_host = 127.0.0.1"]
            if self.replication_ports:
                # 3.10.8's rabbitmq.conf has no key for osiris's range: advanced.config sets it.
                first, last = self.replication_ports
                advanced = f"[{{osiris, [{{port_range, {{{first}, {last}}}}}]}}]"
        with open(f"{base}/enabled_plugins", "w") as out:
            out.write(plugins + ".\n")
        with open(f"{base}/rabbitmq.conf", "w") as out:
            out.write("\n".join(lines) + "\n")
        with open(f"{base}/advanced.config", "w") as out:
            out.write(advanced + ".\n")

    def urls(self):
        return [f"amqp://guest:guest@127.0.0.1:{port}/%2F" for port in self.amqp_ports]

    def stream_urls(self):
        return [stream_url(port) for port in self.stream_ports]

    def node_name(self, index):
        return self.names[index]

    def stream_leader(self, stream):
        """The member whose role is `writer` in `rabbitmq-streams stream_status`."""
        answer = subprocess.run(rabbitmq_tool("rabbitmq-streams", "-n", self.names[0], "stream_status", stream, "--formatter", "json"),
                                capture_output=True, text=True, timeout=120, check=True)
        members = json.loads(answer.stdout)
        return next((member.get("node") for member in members if member.get("role") == "writer"), None)

    def pids(self):
        pids = []
        for index in range(3):
            answer = self.ctl(index, "eval", "os:getpid().", check=False).stdout.strip().strip('"')
            if answer.isdigit():
                pids.append(int(answer))
        return pids

    def stop(self):
        for index in range(3):
            self.ctl(index, "stop", check=False)


def run_workload(broker, cluster, name, arguments, queue_type="quorum"):
    step = f"{name}--{broker}"
    pids = cluster.pids()
    load_before = load_average()
    before = cpu_s(pids)
    command = [LEPUS_BIN, "perf", "client", "--queue-type", queue_type, "--persistent", "--warmup", str(WARMUP_S), "--duration", str(DURATION_S),
               "--json", f"{OUT}/{step}.json"]
    for url in cluster.urls():
        command += ["--url", url]
    command += arguments + [f"queue://cq-{name}-{os.getpid()}"]
    started = time.time()
    finished = subprocess.run(command, check=False, stdout=open(f"{OUT}/{step}.log", "w"), stderr=subprocess.STDOUT)
    if finished.returncode != 0:
        # Reported, not hidden: the table says the run failed and its log says why.
        print(f"{step}: lepus perf failed (exit {finished.returncode}); see {OUT}/{step}.log", file=sys.stderr, flush=True)
        return {"broker": broker, "workload": name, "failed": True, "log": f"{step}.log", "command": " ".join(command)}
    broker_cpu_s = cpu_s(pids) - before
    with open(f"{OUT}/{step}.json") as report:
        summary = json.load(report)["summary"]
    # The broker's CPU covers warm-up and measured time: per message over everything received.
    received_total = summary["received"] * (WARMUP_S + DURATION_S) / max(summary["measured_s"], 1e-9)
    row = {"broker": broker, "workload": name, "received_per_sec": summary["received_per_sec"],
           "confirm_p50_ms": summary["send_ack_latency_us"]["p50_us"] / 1000, "confirm_p99_ms": summary["send_ack_latency_us"]["p99_us"] / 1000,
           "broker_cpu_s": broker_cpu_s, "broker_cpu_s_per_million": broker_cpu_s / max(received_total, 1) * 1e6,
           "nacked": summary["nacked"], "wall_s": time.time() - started, "load_before": load_before, "load_after": load_average(),
           "command": " ".join(command)}
    print(json.dumps(row), flush=True)
    return row


def publish_confirmed(url, queue, timeout_s):
    """Until one persistent publish through `url` is confirmed; the seconds it took."""
    import pika

    started = time.time()
    while time.time() - started < timeout_s:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", queue, b"failover", pika.BasicProperties(delivery_mode=2))
            connection.close()
            return time.time() - started
        except Exception:  # noqa: BLE001 - any failure is retried until the timeout
            time.sleep(0.02)
    raise RuntimeError(f"no confirm through {url} within {timeout_s} s")


def lepus_failovers(cluster):
    import pika

    queue = "cq-failover"
    connection = pika.BlockingConnection(pika.URLParameters(cluster.urls()[0]))
    connection.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    connection.close()
    times = []
    for _ in range(FAILOVERS):
        deadline = time.time() + 30
        leader = None
        while leader is None and time.time() < deadline:
            try:
                leaders = {api(port, f"/queues/%2F/{queue}").get("leader") for port in cluster.http_ports}
                if len(leaders) == 1:
                    leader = next((index for index in range(3) if f"n{index + 1}@localhost" in leaders), None)
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        if leader is None:
            raise RuntimeError("no agreed leader before a kill")
        survivor = (leader + 1) % 3
        killed_at = time.time()
        cluster.processes[leader].send_signal(signal.SIGKILL)
        cluster.processes[leader].wait()
        publish_confirmed(cluster.urls()[survivor], queue, 60)
        times.append(time.time() - killed_at)
        cluster.start_node(leader)
        cluster.wait_formed()
    return times


def main():
    os.makedirs(OUT, exist_ok=True)
    for stale in glob.glob(f"{OUT}/*--*"):
        os.remove(stale)
    rows = []
    directory = tempfile.mkdtemp(prefix="lepus-cluster-quorum-")
    lepus = LepusCluster(directory)
    lepus.start()
    try:
        for name, arguments in WORKLOADS:
            rows.append(run_workload("lepus", lepus, name, arguments))
        # Confirm latency at half of Lepus's 1p1c 16 B throughput (the target: p99 under 5 ms).
        half_rate = str(int(rows[0].get("received_per_sec", 20000) / 2))
        half = ["--message-size", "16", "--producers", "1", "--consumers", "1", "--rate", half_rate]
        rows.append(run_workload("lepus", lepus, f"1p1c-16B-at-{half_rate}-per-s", half))
        failovers = lepus_failovers(lepus) if FAILOVERS else []
    finally:
        lepus.stop()
    if WITH_RABBITMQ and shutil.which("rabbitmq-server"):
        rabbit = RabbitCluster(tempfile.mkdtemp(prefix="rabbitmq-cluster-quorum-"))
        try:
            rabbit.start()
            for name, arguments in WORKLOADS:
                rows.append(run_workload("rabbitmq", rabbit, name, arguments))
        except (RuntimeError, subprocess.CalledProcessError) as error:
            print(f"RabbitMQ: {error}", file=sys.stderr)
        finally:
            rabbit.stop()
            shutil.rmtree(rabbit.directory, ignore_errors=True)
    with open(f"{OUT}/rows.json", "w") as out:
        json.dump({"rows": rows, "failover_s": failovers}, out, indent=1)
    print(json.dumps({"failover_s": failovers}))
    if failovers:
        print(f"failover over {len(failovers)} kills: median {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s")
    write_markdown(rows, failovers)
    shutil.rmtree(directory, ignore_errors=True)


def write_markdown(rows, failovers):
    lines = [f"# Quorum queues on three nodes: Lepus vs RabbitMQ 3.10.8 (bench/cluster-quorum.sh)", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {DURATION_S} s measured after {WARMUP_S} s of warm-up; "
             f"persistent, confirms (1000 in flight per producer), manual acks; three nodes of each broker on this one "
             f"{os.cpu_count()}-core machine, shared with other builds (load averages below).", "",
             "| workload | broker | msg/s received | confirm p50 ms | confirm p99 ms | broker CPU s per million msgs | nacked | load before/after |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        if row.get("failed"):
            lines.append(f"| {row['workload']} | {row['broker']} | FAILED (cluster-quorum/{row['log']}) | | | | | |")
            continue
        lines.append(f"| {row['workload']} | {row['broker']} | {row['received_per_sec']:,.0f} | {row['confirm_p50_ms']:.2f} | "
                     f"{row['confirm_p99_ms']:.2f} | {row['broker_cpu_s_per_million']:.1f} | {row['nacked']} | "
                     f"{row['load_before']:.1f}/{row['load_after']:.1f} |")
    for workload in dict.fromkeys(row["workload"] for row in rows):
        pair = {row["broker"]: row for row in rows if row["workload"] == workload}
        if "lepus" in pair and "rabbitmq" in pair and not any(row.get("failed") for row in pair.values()) and pair["rabbitmq"]["received_per_sec"]:
            lines.append("")
            lines.append(f"{workload}: Lepus/RabbitMQ throughput {pair['lepus']['received_per_sec'] / pair['rabbitmq']['received_per_sec']:.2f}x, "
                         f"CPU per message {pair['lepus']['broker_cpu_s_per_million'] / max(pair['rabbitmq']['broker_cpu_s_per_million'], 1e-9):.2f}x")
    if failovers:
        lines += ["", f"Lepus failover (kill -9 of the node leading the queue's shard, to the first confirmed publish through a survivor), "
                      f"{len(failovers)} kills: median {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s."]
    lines += ["", "Commands: see each row's `command` in cluster-quorum/rows.json; per-run reports are cluster-quorum/*.json."]
    with open(f"{OUT}.md", "w") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
