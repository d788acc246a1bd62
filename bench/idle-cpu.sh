#!/usr/bin/env bash
# CPU time of an idle broker holding many durable queues with a message TTL and a dead-letter
# exchange, each with a few messages (results/idle-cpu.md; issue 17, target 3 "no CPU when they
# are idle"). Starts a private Lepus on a fresh data directory, seeds it through
# bench/idle_cpu_seed.py (pipelined declares, confirmed persistent publishes), lets the writes
# settle for SETTLE_S, then reads the process's utime+stime from /proc before and after IDLE_S
# seconds with nothing connected. The TTL (an hour) never passes during the run.
#
# Usage: bench/idle-cpu.sh LEPUS_BIN LABEL [extra `lepus server` arguments]
# Environment: QUEUES (10000), MESSAGES (10 per queue), IDLE_S (60), SETTLE_S (10), HTTP_PORT (0: no
#              management API, whose chart sampler reads every queue every 5 s), QUEUE_TYPE (classic;
#              quorum),
#              RESULTS (bench/results/idle-cpu)
set -euo pipefail
BIN=$1 LABEL=$2
shift 2
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/idle-cpu}
QUEUES=${QUEUES:-10000} MESSAGES=${MESSAGES:-10} IDLE_S=${IDLE_S:-60} SETTLE_S=${SETTLE_S:-10}
mkdir -p "$RESULTS"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DATA_DIR=$(mktemp -d /tmp/lepus-idle-cpu.XXXXXX)
LEPUS_LOG=warn "$BIN" server --data-dir "$DATA_DIR" --amqp-port "$PORT" --bind 127.0.0.1 --http-port "${HTTP_PORT:-0}" --metrics-port 0 --stream-port 0 "$@" \
  >"$RESULTS/$LABEL.server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; rm -rf "$DATA_DIR"' EXIT
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done

python3 "$BENCH_DIR/idle_cpu_seed.py" "amqp://guest:guest@127.0.0.1:$PORT/" "$QUEUES" --messages "$MESSAGES" \
  --queue-type "${QUEUE_TYPE:-classic}" >"$RESULTS/$LABEL.seed.log"
sleep "$SETTLE_S"

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$SERVER/stat"; }
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
before=$(cpu_ticks)
sleep "$IDLE_S"
after=$(cpu_ticks)
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$LABEL" "$QUEUES" "$MESSAGES" "$IDLE_S" "$(getconf CLK_TCK)" "$before" "$after" "$load_before" "$load_after" <<'PY' | tee "$RESULTS/$LABEL.txt"
import os, sys
label, queues, messages, idle_s, hz, before, after, load_before, load_after = sys.argv[1:]
cpu_s = (int(after) - int(before)) / int(hz)
kind = os.environ.get("QUEUE_TYPE", "classic")
print(f"{label}: {queues} idle {kind} durable queues (x-message-ttl 1 h, dead-letter exchange, {messages} messages each), "
      f"over {float(idle_s):.0f} s: broker utime+stime {cpu_s:.2f} s ({100 * cpu_s / float(idle_s):.2f}% of one core); "
      f"load average {load_before} -> {load_after}")
PY
