#!/usr/bin/env bash
# Stream queues on three nodes, Lepus vs RabbitMQ 3.10.8: runs alternate between the brokers, each
# on a fresh three-node cluster on this machine; 1 producer and 1 consumer, confirms on; msg/s,
# confirm (send-ack) p50/p99, the three nodes' CPU seconds per million messages, the load average
# before and after each run. bench/cluster-stream.py says what it runs.
#
# Usage:
#   bench/cluster-stream.sh                   AMQP 0-9-1 (`lepus perf --queue-type stream`), 16 B;
#                                             writes bench/results/cluster-stream/
#   PROTOCOL=stream bench/cluster-stream.sh   the RabbitMQ Stream protocol (`lepus perf --protocol
#                                             stream`, each node's stream listener on), 16 B and
#                                             1 KiB; writes bench/results/cluster-stream-protocol/
# Environment: ROUNDS (3), DURATION_S (15), WARMUP_S (5), SIZES (bytes, e.g. "16 1024"),
#   CONSUMER_NODE (stream protocol: `leader`, the node the producer uses and the stream is created
#   through, or `follower`, another member), OUT_DIR (where the per-run reports and rows.json go),
#   INTEROP_PORTS=FIRST-LAST (the brokers' ports: interop/free_ports.py), RABBITMQ_STREAM_REPLICATION_PORTS=FIRST-LAST
#   (RabbitMQ's osiris listeners, one per follower per stream; RabbitMQ's 6000-6500 when unset),
#   LEPUS_BIN (target/release/lepus).
# A short trial on a shared machine, ports kept to one range:
#   INTEROP_PORTS=23000-23899 RABBITMQ_STREAM_REPLICATION_PORTS=23900-23999 PROTOCOL=stream ROUNDS=1 \
#     DURATION_S=5 WARMUP_S=1 OUT_DIR=/tmp/cluster-stream-trial bench/cluster-stream.sh
# The last lines printed are the medians per workload and broker, and Lepus/RabbitMQ ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
lepus=${LEPUS_BIN:-target/release/lepus}
[ -x "$lepus" ] || cargo build --release -p lepus
interop/cluster/run.sh --version >/dev/null
if [ "${PROTOCOL:-amqp}" = stream ]; then default_out=cluster-stream-protocol; else default_out=cluster-stream; fi
exec interop/cluster/.venv/bin/python bench/cluster-stream.py "$(realpath "$lepus")" "${OUT_DIR:-$(pwd)/bench/results/$default_out}"
