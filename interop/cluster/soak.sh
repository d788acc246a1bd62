#!/usr/bin/env bash
# The long form of the cluster's fault scenarios: runs the kill -9 scenario (and any other test
# matching PATTERN) once per seed, each on a fresh three-node cluster, and stops at the first
# failure with its seed (the history and the nodes' logs stay under pytest's temp directory).
# Usage: LEPUS_BIN=target/release/lepus interop/cluster/soak.sh [FIRST_SEED] [COUNT] [PATTERN]
set -euo pipefail
cd "$(dirname "$0")"
first=${1:-1}
count=${2:-20}
pattern=${3:-kill_9}
for seed in $(seq "$first" $((first + count - 1))); do
  echo "== seed $seed"
  CLUSTER_SEED=$seed ./run.sh -k "$pattern" -s -q | grep -E "seed|passed|failed" || { echo "seed $seed FAILED"; exit 1; }
done
echo "$count seeds passed"
