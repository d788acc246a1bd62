#!/usr/bin/env bash
# Declares QUEUES (100,000) durable queues one after another on one pika channel against a private
# Lepus with a fresh data directory, then restarts it (graceful stop, start: seconds until the AMQP
# port answers and until the last queue is back, RSS, descriptors), restarts it again after a
# kill -9 (the change log is replayed), and deletes the queues (results/declare-100k.md).
#
# Usage: bench/declare-100k.sh LEPUS_BIN LABEL
# Environment: QUEUES (100000), TIME_LIMIT_S (declaring stops after this many seconds: the build
#              that rewrites its whole definitions file on every declare would take hours),
#              DESCRIPTORS (the broker's `ulimit -n`, 1024), PYTHON (a python with pika:
#              interop/python/.venv/bin/python), RESULTS (bench/results/declare-100k).
set -euo pipefail
BIN=$1 LABEL=$2
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/declare-100k}
QUEUES=${QUEUES:-100000} TIME_LIMIT_S=${TIME_LIMIT_S:-inf} DESCRIPTORS=${DESCRIPTORS:-1024}
PYTHON=${PYTHON:-$BENCH_DIR/../interop/python/.venv/bin/python}
mkdir -p "$RESULTS"
"$PYTHON" -c 'import pika' 2>/dev/null || { echo "PYTHON=$PYTHON has no pika (interop/python/run.sh makes that venv)" >&2; exit 1; }
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DATA_DIR=$(mktemp -d /tmp/lepus-declare-bench.XXXXXX)
OUT=$RESULTS/$LABEL.jsonl
: >"$OUT"
SERVER=
trap 'if [[ -n $SERVER ]]; then kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; fi; rm -rf "$DATA_DIR"' EXIT

note() { echo "$1" | tee -a "$OUT"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }
broker_figures() {
  local rss_kib descriptors
  rss_kib=$(awk '/^VmRSS/ {print $2}' "/proc/$SERVER/status")
  descriptors=$(ls "/proc/$SERVER/fd" | wc -l)
  note "{\"event\": \"$1\", \"rss_kib\": $rss_kib, \"descriptors\": $descriptors, \"data_dir_kib\": $(du -sk "$DATA_DIR" | cut -f1), \"definitions_bytes\": $(cat "$DATA_DIR"/definitions.* 2>/dev/null | wc -c)}"
}

# Starts the broker; records the seconds until the port answers and until queue N-1 is declared
# passively (the broker listens before it has read its data directory).
start_broker() {
  local started last=$1
  started=$(date +%s.%N)
  (ulimit -n "$DESCRIPTORS"; exec env LEPUS_LOG=warn "$BIN" server --data-dir "$DATA_DIR" --amqp-port "$PORT" --bind 127.0.0.1 \
    --http-port 0 --metrics-port 0) >>"$RESULTS/$LABEL.server.log" 2>&1 &
  SERVER=$!
  until port_open; do sleep 0.01; kill -0 $SERVER; done
  local port_s
  port_s=$(echo "$(date +%s.%N) - $started" | bc)
  if [[ $last -ge 0 ]]; then
    "$PYTHON" - "$PORT" "$last" <<'PY'
import sys, time, pika
port, last = int(sys.argv[1]), int(sys.argv[2])
parameters = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"))
deadline = time.monotonic() + 600
while True:
    try:
        connection = pika.BlockingConnection(parameters)
        connection.channel().queue_declare("declare-%06d" % last, passive=True)
        connection.close()
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
PY
  fi
  note "{\"event\": \"$2\", \"port_answers_s\": $port_s, \"queues_back_s\": $(echo "$(date +%s.%N) - $started" | bc)}"
}

stop_broker() {
  local started
  started=$(date +%s.%N)
  kill "-$1" $SERVER
  wait $SERVER || true
  note "{\"event\": \"stopped with SIG$1\", \"stop_s\": $(echo "$(date +%s.%N) - $started" | bc)}"
  SERVER=
}

note "{\"binary\": \"$BIN\", \"label\": \"$LABEL\", \"queues\": $QUEUES, \"descriptors_limit\": $DESCRIPTORS, \"time_limit_s\": \"$TIME_LIMIT_S\", \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
start_broker -1 "started empty"
broker_figures "empty"
"$PYTHON" "$BENCH_DIR/declare_queues.py" "$PORT" declare "$QUEUES" "$TIME_LIMIT_S" | tee -a "$OUT"
DECLARED=$(tail -n 1 "$OUT" | "$PYTHON" -c 'import json, sys; line = json.loads(sys.stdin.read()); print(line.get("stopped_at", line.get("queues")))')
broker_figures "declared $DECLARED"
stop_broker TERM
start_broker $((DECLARED - 1)) "restarted after a graceful stop"
broker_figures "restarted"
stop_broker KILL
start_broker $((DECLARED - 1)) "restarted after kill -9"
broker_figures "restarted after kill -9"
"$PYTHON" "$BENCH_DIR/declare_queues.py" "$PORT" delete "$DECLARED" "$TIME_LIMIT_S" | tee -a "$OUT"
broker_figures "deleted"
stop_broker TERM
