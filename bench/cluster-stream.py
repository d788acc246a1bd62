"""Stream queues on three nodes: three Lepus nodes vs three RabbitMQ 3.10.8 nodes on this machine,
alternating (a fresh cluster of each broker per round), `lepus perf client --queue-type stream
--persistent` (publisher confirms; consumers with a prefetch and manual acks, reading from `next`)
through AMQP 0-9-1, 1 producer and 1 consumer, 16 B: msg/s, confirm p50/p99 and the three nodes'
CPU seconds per million messages. The clusters are those of bench/cluster-quorum.py (imported).

usage: cluster-stream.py LEPUS_BIN OUT_DIR      (bench/cluster-stream.sh runs it)
environment: ROUNDS (3), DURATION_S (15), WARMUP_S (5)
"""
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("cluster_quorum", os.path.join(HERE, "cluster-quorum.py"))
quorum = importlib.util.module_from_spec(spec)
spec.loader.exec_module(quorum)

LEPUS_BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WORKLOAD = ("1p1c-16B-stream", ["--message-size", "16", "--producers", "1", "--consumers", "1"])


def run(broker, cluster, round_number):
    name = f"{WORKLOAD[0]}-r{round_number}"
    # cluster-quorum.py's run, with the stream queue type in place of quorum.
    original = quorum.subprocess.run

    def as_stream(command, *arguments, **keywords):
        if isinstance(command, list) and "--queue-type" in command:
            command = list(command)
            command[command.index("--queue-type") + 1] = "stream"
        return original(command, *arguments, **keywords)

    quorum.subprocess.run = as_stream
    try:
        return quorum.run_workload(broker, cluster, name, WORKLOAD[1])
    finally:
        quorum.subprocess.run = original


def main():
    os.makedirs(OUT, exist_ok=True)
    rows = []
    for round_number in range(1, ROUNDS + 1):
        lepus = quorum.LepusCluster(tempfile.mkdtemp(prefix="lepus-cluster-stream-"))
        lepus.start()
        try:
            rows.append(run("lepus", lepus, round_number))
        finally:
            lepus.stop()
            shutil.rmtree(lepus.directory, ignore_errors=True)
        rabbit = quorum.RabbitCluster(tempfile.mkdtemp(prefix="rabbitmq-cluster-stream-"))
        try:
            rabbit.start()
            rows.append(run("rabbitmq", rabbit, round_number))
        finally:
            rabbit.stop()
            shutil.rmtree(rabbit.directory, ignore_errors=True)
    with open(f"{OUT}/rows.json", "w") as out:
        json.dump(rows, out, indent=1)
    for broker in ("lepus", "rabbitmq"):
        done = [row for row in rows if row["broker"] == broker and not row.get("failed")]
        if done:
            print(broker, "median msg/s", statistics.median(row["received_per_sec"] for row in done),
                  "median CPU s per million", round(statistics.median(row["broker_cpu_s_per_million"] for row in done), 2),
                  "median confirm p99 ms", statistics.median(row["confirm_p99_ms"] for row in done))


if __name__ == "__main__":
    main()
