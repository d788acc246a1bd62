#!/usr/bin/env bash
# Stream queues on three nodes, Lepus vs RabbitMQ 3.10.8, alternating rounds (bench/cluster-stream.py
# says what it runs). Writes bench/results/cluster-stream/.
# Usage: bench/cluster-stream.sh   (ROUNDS=3 DURATION_S=15 WARMUP_S=5; LEPUS_BIN)
set -euo pipefail
cd "$(dirname "$0")/.."
lepus=${LEPUS_BIN:-target/release/lepus}
[ -x "$lepus" ] || cargo build --release -p lepus
interop/cluster/run.sh --version >/dev/null
exec interop/cluster/.venv/bin/python bench/cluster-stream.py "$(realpath "$lepus")" "$(pwd)/bench/results/cluster-stream"
