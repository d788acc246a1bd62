"""Stream queues on three nodes: three Lepus nodes vs three RabbitMQ 3.10.8 nodes on this machine,
alternating (a fresh cluster of each broker per run), 1 producer and 1 consumer, confirms on. The
clusters are those of bench/cluster-quorum.py (imported).

PROTOCOL=amqp (the default): `lepus perf client --queue-type stream --persistent` through AMQP
  0-9-1 (consumers with a prefetch and manual acks, reading from `next`), producers and consumers
  spread over the three nodes: received msg/s, confirm p50/p99.
PROTOCOL=stream: the RabbitMQ Stream protocol, every node with its stream listener on (Lepus
  `--stream-port`, RabbitMQ's rabbitmq_stream plugin), `lepus perf client --protocol stream
  --max-pending 10000`. The producer connects to the first node, which creates the stream and so
  leads it on both brokers (the stream is kept and its leader read back after the run: Lepus's
  management API, `rabbitmq-streams stream_status`); the consumer connects to that node
  (CONSUMER_NODE=leader) or to the second (CONSUMER_NODE=follower, reading a follower's copy).
  Confirmed msg/s, send-ack p50/p99, and whether everything sent was confirmed and received.
Either way: the CPU seconds (utime + stime) of the three broker processes over the whole perf run,
per million messages (received with AMQP, confirmed with the stream protocol, warm-up included),
and the load average before and after each run.

usage: cluster-stream.py LEPUS_BIN OUT_DIR      (bench/cluster-stream.sh runs it)
environment: ROUNDS (3), DURATION_S (15), WARMUP_S (5), PROTOCOL (amqp), SIZES (message sizes in
  bytes: "16"; with PROTOCOL=stream "16 1024"), CONSUMER_NODE (leader), RABBITMQ_STREAM_REPLICATION_PORTS
  (FIRST-LAST for RabbitMQ's osiris listeners; RabbitMQ's own 6000-6500 when unset)
"""
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("cluster_quorum", os.path.join(HERE, "cluster-quorum.py"))
quorum = importlib.util.module_from_spec(spec)
spec.loader.exec_module(quorum)

LEPUS_BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PROTOCOL = os.environ.get("PROTOCOL", "amqp")
SIZES = [int(size) for size in os.environ.get("SIZES", "16 1024" if PROTOCOL == "stream" else "16").split()]
CONSUMER_NODE = os.environ.get("CONSUMER_NODE", "leader")
# The node the stream is created through: the first leader on both brokers.
LEADER_INDEX = 0
CONSUMER_INDEX = {"leader": LEADER_INDEX, "follower": (LEADER_INDEX + 1) % 3}
# Most unconfirmed publishes per producer: deep enough that the round trip to the followers does
# not cap the stream protocol's rate (the figure bench/stream-protocol.sh uses on one node).
STREAM_MAX_PENDING = 10000
# The medians printed at the end: (label, row key) per protocol.
FIGURES = {
    "amqp": [("received msg/s", "received_per_sec"), ("confirm p99 ms", "confirm_p99_ms"),
             ("broker CPU s per million", "broker_cpu_s_per_million")],
    "stream": [("confirmed msg/s", "confirmed_per_sec"), ("send-ack p50 ms", "send_ack_p50_ms"),
               ("send-ack p99 ms", "send_ack_p99_ms"), ("broker CPU s per million", "broker_cpu_s_per_million")],
}


def replication_ports():
    text = os.environ.get("RABBITMQ_STREAM_REPLICATION_PORTS", "")
    first, _, last = text.partition("-")
    if not text:
        return None
    if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
        raise SystemExit(f"RABBITMQ_STREAM_REPLICATION_PORTS={text!r}: expected FIRST-LAST")
    return int(first), int(last)


def workload_name(size):
    label = f"{size // 1024}KiB" if size >= 1024 and size % 1024 == 0 else f"{size}B"
    if PROTOCOL == "amqp":
        return f"1p1c-{label}-stream"
    return f"1p1c-{label}-stream-protocol-{CONSUMER_NODE}"


def amqp_run(broker, cluster, name, size):
    arguments = ["--message-size", str(size), "--producers", "1", "--consumers", "1"]
    return quorum.run_workload(broker, cluster, name, arguments, queue_type="stream")


def whole_run_totals(report):
    """Messages over every interval (warm-up, measured and drain): what the broker CPU covers."""
    totals = {"sent": 0.0, "confirmed": 0.0, "nacked": 0.0, "received": 0.0}
    for interval in report.get("intervals") or []:
        seconds = interval["interval_s"]
        totals["sent"] += interval["sent_per_sec"] * seconds
        totals["confirmed"] += interval["completed_per_sec"] * seconds
        totals["nacked"] += interval["nacked_per_sec"] * seconds
        totals["received"] += interval["received_per_sec"] * seconds
    return {key: round(value) for key, value in totals.items()}


def stream_run(broker, cluster, name, size):
    step = f"{name}--{broker}"
    stream = f"bench-{name}-{os.getpid()}"
    urls = cluster.stream_urls()
    # --keep: the stream outlives the run so that its leader can be read back (the cluster is
    # thrown away after the run anyway).
    command = [LEPUS_BIN, "perf", "client", "--protocol", "stream", "--url", urls[LEADER_INDEX],
               "--consumer-url", urls[CONSUMER_INDEX[CONSUMER_NODE]], "--message-size", str(size),
               "--max-pending", str(STREAM_MAX_PENDING), "--warmup", str(quorum.WARMUP_S), "--duration", str(quorum.DURATION_S),
               "--keep", "--json", f"{OUT}/{step}.json", f"stream://{stream}"]
    pids = cluster.pids()
    load_before = quorum.load_average()
    cpu_before = quorum.cpu_s(pids)
    with open(f"{OUT}/{step}.log", "w") as log:
        finished = subprocess.run(command, check=False, stdout=log, stderr=subprocess.STDOUT)
    broker_cpu_s = quorum.cpu_s(pids) - cpu_before
    load_after = quorum.load_average()
    if finished.returncode != 0:
        # Reported, not hidden: the table says the run failed and its log says why.
        print(f"{step}: lepus perf failed (exit {finished.returncode}); see {OUT}/{step}.log", file=sys.stderr, flush=True)
        return {"broker": broker, "workload": name, "failed": True, "log": f"{step}.log", "command": " ".join(command)}
    with open(f"{OUT}/{step}.json") as handle:
        report = json.load(handle)
    summary = report["summary"]
    totals = whole_run_totals(report)
    try:
        leader = cluster.stream_leader(stream)
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        leader = f"unknown ({error})"
    row = {"broker": broker, "workload": name, "message_size": size, "consumer_node": CONSUMER_NODE,
           "confirmed_per_sec": summary["completed_per_sec"], "received_per_sec": summary["received_per_sec"],
           "send_ack_p50_ms": summary["send_ack_latency_us"]["p50_us"] / 1000,
           "send_ack_p99_ms": summary["send_ack_latency_us"]["p99_us"] / 1000,
           **{f"{key}_total": value for key, value in totals.items()},
           "broker_cpu_s": broker_cpu_s, "broker_cpu_s_per_million": broker_cpu_s / max(totals["confirmed"], 1) * 1e6,
           "load_before": load_before, "load_after": load_after, "leader": leader,
           "expected_leader": cluster.node_name(LEADER_INDEX), "error": summary.get("error"), "command": " ".join(command)}
    print(json.dumps(row), flush=True)
    for warning in stream_row_warnings(row):
        print(f"{step}: WARNING: {warning}", file=sys.stderr, flush=True)
    return row


def stream_row_warnings(row):
    """What makes a run's figures suspect: said at once, and kept in rows.json."""
    warnings = []
    if row["leader"] != row["expected_leader"]:
        warnings.append(f"the stream's leader is {row['leader']}, not {row['expected_leader']} that the producer connected to")
    if row["nacked_total"]:
        warnings.append(f"{row['nacked_total']} publishes nacked")
    if row["received_total"] != row["sent_total"] or row["confirmed_total"] != row["sent_total"]:
        warnings.append(f"sent {row['sent_total']}, confirmed {row['confirmed_total']}, received {row['received_total']}")
    if row["error"]:
        warnings.append(f"perf: {row['error']}")
    row["warnings"] = warnings
    return warnings


RUNS = {"amqp": amqp_run, "stream": stream_run}


def run_on_fresh_cluster(broker, name, size):
    with_stream_listeners = PROTOCOL == "stream"
    directory = tempfile.mkdtemp(prefix=f"{broker}-cluster-stream-")
    if broker == "lepus":
        cluster = quorum.LepusCluster(directory, stream=with_stream_listeners)
    else:
        cluster = quorum.RabbitCluster(directory, stream=with_stream_listeners, replication_ports=replication_ports())
    try:
        cluster.start()
        return RUNS[PROTOCOL](broker, cluster, name, size)
    except (RuntimeError, subprocess.SubprocessError) as error:
        print(f"{name}--{broker}: {error}", file=sys.stderr, flush=True)
        return {"broker": broker, "workload": name, "failed": True, "error": str(error)}
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


def print_medians(rows):
    for workload in dict.fromkeys(row["workload"] for row in rows):
        medians = {}
        for broker in ("lepus", "rabbitmq"):
            done = [row for row in rows if row["workload"] == workload and row["broker"] == broker and not row.get("failed")]
            if done:
                medians[broker] = {key: statistics.median(row[key] for row in done) for _, key in FIGURES[PROTOCOL]}
                print(workload, broker, f"({len(done)} runs) medians:",
                      ", ".join(f"{label} {medians[broker][key]:,.2f}" for label, key in FIGURES[PROTOCOL]), flush=True)
        if len(medians) == 2:
            print(workload, "Lepus/RabbitMQ:", ", ".join(
                f"{label} {medians['lepus'][key] / medians['rabbitmq'][key]:.2f}x"
                for label, key in FIGURES[PROTOCOL] if medians["rabbitmq"][key]), flush=True)


def main():
    if PROTOCOL not in RUNS:
        raise SystemExit(f"PROTOCOL={PROTOCOL!r}: expected amqp or stream")
    if CONSUMER_NODE not in CONSUMER_INDEX:
        raise SystemExit(f"CONSUMER_NODE={CONSUMER_NODE!r}: expected leader or follower")
    os.makedirs(OUT, exist_ok=True)
    rows = []
    print(f"# load before: {quorum.load_average():.2f}; {os.cpu_count()} cores; protocol {PROTOCOL}; sizes {SIZES}; "
          f"{quorum.WARMUP_S} s warm-up + {quorum.DURATION_S} s per run", flush=True)
    for round_number in range(1, ROUNDS + 1):
        for size in SIZES:
            name = f"{workload_name(size)}-r{round_number}"
            for broker in ("lepus", "rabbitmq"):
                rows.append(run_on_fresh_cluster(broker, name, size))
    print(f"# load after: {quorum.load_average():.2f}", flush=True)
    with open(f"{OUT}/rows.json", "w") as out:
        json.dump(rows, out, indent=1)
    # Medians per workload over the rounds: the workload's name without its round.
    print_medians([{**row, "workload": row["workload"].rsplit("-r", 1)[0]} for row in rows])


if __name__ == "__main__":
    main()
