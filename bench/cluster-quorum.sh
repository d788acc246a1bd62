#!/usr/bin/env bash
# Quorum queues on three nodes: three Lepus nodes vs three RabbitMQ 3.10.8 nodes (Debian's
# rabbitmq-server, private node names and ports, `rabbitmqctl join_cluster`) on this machine;
# `lepus perf client --queue-type quorum --persistent` (confirms, manual acks) against both:
# 1 producer 1 consumer at 16 B and 1 KiB, 10 queues with 10 producers and 10 consumers; msg/s,
# confirm p50/p99, the three nodes' CPU seconds per million messages; then Lepus's failover time
# over FAILOVERS kill -9 of the leader's node. Writes bench/results/cluster-quorum.md and
# bench/results/cluster-quorum/.
# Usage: bench/cluster-quorum.sh   (DURATION_S=20 WARMUP_S=5 FAILOVERS=20 RABBITMQ=1; LEPUS_BIN)
set -euo pipefail
cd "$(dirname "$0")/.."
lepus=${LEPUS_BIN:-target/release/lepus}
[ -x "$lepus" ] || cargo build --release -p lepus
# The interop cluster suite's venv has pika.
interop/cluster/run.sh --version >/dev/null
exec interop/cluster/.venv/bin/python bench/cluster-quorum.py "$(realpath "$lepus")" "$(pwd)/bench/results/cluster-quorum"
