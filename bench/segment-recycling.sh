#!/usr/bin/env bash
# Publisher-confirm latency of persistent messages against a private Lepus broker with a fresh data
# directory (results/segment-recycling.md). Each run starts its own broker on a free port, runs
# `lepus perf client` for DURATION_S seconds and keeps the client's output.
#
# Usage: bench/segment-recycling.sh LEPUS_BIN LABEL [extra `lepus perf client` arguments]
#   e.g. bench/segment-recycling.sh target/release/lepus after-rate --rate 38000
#        bench/segment-recycling.sh target/release/lepus after-max
# Environment: DURATION_S (30), RESULTS (bench/results/segment-recycling).
set -euo pipefail
BIN=$1 LABEL=$2
shift 2
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/segment-recycling}
DURATION_S=${DURATION_S:-30}
mkdir -p "$RESULTS"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DATA_DIR=$(mktemp -d /tmp/lepus-segment-bench.XXXXXX)
LEPUS_LOG=warn "$BIN" server --data-dir "$DATA_DIR" --amqp-port "$PORT" --bind 127.0.0.1 --http-port 0 --metrics-port 0 \
  >"$RESULTS/$LABEL.server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; rm -rf "$DATA_DIR"' EXIT
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
"$BIN" perf client --url "amqp://guest:guest@127.0.0.1:$PORT/" --max-pending 100 --persistent --durable --show-latency \
  --duration "$DURATION_S" "$@" >"$RESULTS/$LABEL.out" 2>&1
grep -A1 '^sent' "$RESULTS/$LABEL.out" | sed "s/^/$LABEL: /"
