#!/usr/bin/env bash
# Safe-mode throughput (persistent messages, durable queue, publisher confirms, `--sync always`)
# of two Lepus builds, alternating runs, for results/fd-cache.md: the bounded file cache must not
# slow the hot path. Each run starts its own broker on a free port with a fresh data directory and
# runs `lepus perf client` (of the first build, so the client is the same) for DURATION_S seconds.
#
# Usage: bench/fd-cache.sh BEFORE_BIN AFTER_BIN
# Environment: DURATION_S (10), RUNS (3), SIZES ("16 1024"), RESULTS (bench/results/fd-cache).
set -euo pipefail
BEFORE=$1 AFTER=$2
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/fd-cache}
DURATION_S=${DURATION_S:-10}
RUNS=${RUNS:-3}
SIZES=${SIZES:-16 1024}
mkdir -p "$RESULTS"

run_one() {
  local bin=$1 label=$2 size=$3
  local port data_dir server
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  data_dir=$(mktemp -d /tmp/lepus-fd-cache-bench.XXXXXX)
  LEPUS_LOG=warn "$bin" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 \
    >"$RESULTS/$label.server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  echo "load before $label: $(cut -d' ' -f1-3 /proc/loadavg)" >"$RESULTS/$label.out"
  "$BEFORE" perf client --url "amqp://guest:guest@127.0.0.1:$port/" --persistent --durable --max-pending 1000 \
    --message-size "$size" --duration "$DURATION_S" queue://q >>"$RESULTS/$label.out" 2>&1 || true
  kill "$server"
  wait "$server" 2>/dev/null || true
  rm -rf "$data_dir"
  echo "$label: $(grep -m1 -E '^(sent|received)' "$RESULTS/$label.out" || tail -1 "$RESULTS/$label.out")"
}

for size in $SIZES; do
  for run in $(seq 1 "$RUNS"); do
    run_one "$BEFORE" "before-${size}B-$run" "$size"
    run_one "$AFTER" "after-${size}B-$run" "$size"
  done
done
