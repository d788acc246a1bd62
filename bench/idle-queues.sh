#!/usr/bin/env bash
# CPU time an idle broker spends with many idle durable queues (results/idle-queues.md). Starts a
# private Lepus with a fresh data directory, declares QUEUES durable queues through pika on one
# connection, closes it, lets the declarations' writes settle for SETTLE_S seconds, then reads the
# process's utime+stime (and the lepus-syncer thread's) from /proc before and after IDLE_S seconds
# of idleness. Also reports the broker's open file descriptors.
#
# Usage: bench/idle-queues.sh LEPUS_BIN LABEL [extra `lepus server` arguments, e.g. --sync interval]
# Environment: QUEUES (10000), IDLE_S (60), SETTLE_S (10), PYTHON (a python with pika; python3),
#              MANAGEMENT (1: serve the management API on a free port, so its chart sampler runs),
#              RESULTS (bench/results/idle-queues),
#              SAVE_DATA_DIR (copy the data directory there once the queues are declared),
#              SEED_DATA_DIR (start from a copy of that data directory instead of declaring: the
#              broker recovers the queues, which then sit idle the same way; declaring 10,000
#              queues one by one takes minutes because every declaration rewrites definitions.json).
set -euo pipefail
BIN=$1 LABEL=$2
shift 2
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/idle-queues}
QUEUES=${QUEUES:-10000} IDLE_S=${IDLE_S:-60} SETTLE_S=${SETTLE_S:-10} PYTHON=${PYTHON:-python3}
mkdir -p "$RESULTS"
"$PYTHON" -c 'import pika' 2>/dev/null || { echo "PYTHON=$PYTHON has no pika (pip install pika)" >&2; exit 1; }
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DATA_DIR=$(mktemp -d /tmp/lepus-idle-bench.XXXXXX)
if [[ -n ${SEED_DATA_DIR:-} ]]; then cp -a "$SEED_DATA_DIR/." "$DATA_DIR/"; fi
# Every durable queue's log holds its active segment and its directory open (3 descriptors a queue
# were measured): raise the limit (root may raise the hard one too).
ulimit -Hn "${DESCRIPTORS_MAX:-65536}" 2>/dev/null || true
ulimit -n "$(ulimit -Hn)"
# MANAGEMENT=1 serves the management API (and so runs its chart sampler) on a free port.
HTTP_PORT=0
if [[ ${MANAGEMENT:-0} == 1 ]]; then HTTP_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); fi
LEPUS_LOG=warn "$BIN" server --data-dir "$DATA_DIR" --amqp-port "$PORT" --bind 127.0.0.1 --http-port "$HTTP_PORT" --metrics-port 0 "$@" \
  >"$RESULTS/$LABEL.server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; rm -rf "$DATA_DIR"' EXIT
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done

started=$(date +%s.%N)
# Declares the queues, or (seeded) waits until the broker recovered the last one.
"$PYTHON" - "$PORT" "$QUEUES" "${SEED_DATA_DIR:-}" <<'EOF'
import sys, time, pika
port, count, seeded = int(sys.argv[1]), int(sys.argv[2]), bool(sys.argv[3])
parameters = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"))
deadline = time.monotonic() + 600
while True:
    try:
        connection = pika.BlockingConnection(parameters)
        channel = connection.channel()
        channel.queue_declare(f"idle-{count - 1:05}", durable=True, passive=seeded)
        break
    except Exception:  # not up yet: refused, handshake timeout, queue not recovered yet
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
for number in range(0 if seeded else count):
    channel.queue_declare(f"idle-{number:05}", durable=True)
connection.close()
EOF
declared=$(date +%s.%N)
sleep "$SETTLE_S"
if [[ -n ${SAVE_DATA_DIR:-} ]]; then rm -rf "$SAVE_DATA_DIR"; cp -a "$DATA_DIR" "$SAVE_DATA_DIR"; fi

ticks_per_second=$(getconf CLK_TCK)
# utime + stime (fields 14 and 15 of /proc/PID/stat; the command name, field 2, has no spaces here).
cpu_ticks() { awk '{ print $14 + $15 }' "$1"; }
syncer_stat() { grep -l '^lepus-syncer$' /proc/$SERVER/task/*/comm | head -1 | sed 's/comm$/stat/'; }
SYNCER_STAT=$(syncer_stat)
process_before=$(cpu_ticks /proc/$SERVER/stat) syncer_before=$(cpu_ticks "$SYNCER_STAT")
sleep "$IDLE_S"
process_after=$(cpu_ticks /proc/$SERVER/stat) syncer_after=$(cpu_ticks "$SYNCER_STAT")
descriptors=$(ls /proc/$SERVER/fd | wc -l)
threads=$(ls /proc/$SERVER/task | wc -l)

python3 - "$LABEL" "$QUEUES" "$IDLE_S" "$ticks_per_second" "$process_before" "$process_after" "$syncer_before" "$syncer_after" \
  "$descriptors" "$threads" "$started" "$declared" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF' | tee "$RESULTS/$LABEL.txt"
import os, sys
label, queues, idle_s, hz, p0, p1, s0, s1, fds, threads, started, declared, load = sys.argv[1:]
hz, idle_s = int(hz), float(idle_s)
process_s, syncer_s = (int(p1) - int(p0)) / hz, (int(s1) - int(s0)) / hz
how = "recovered from a copied data directory" if os.environ.get("SEED_DATA_DIR") else f"declared through pika in {float(declared) - float(started):.1f} s"
print(f"{label}: {queues} idle durable queues ({how}), over {idle_s:.0f} s: "
      f"process CPU {process_s:.2f} s ({100 * process_s / idle_s:.2f}% of one core), lepus-syncer thread {syncer_s:.2f} s; "
      f"{fds} open descriptors, {threads} threads; load average {load}")
EOF
