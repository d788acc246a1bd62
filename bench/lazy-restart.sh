#!/usr/bin/env bash
# Restart of a data directory with many durable classic queues, or a backlog (issue 17 items 3
# and 6): seconds from the start until the AMQP handshake succeeds, until every queue's log is
# recovered (the "recovered every restored classic queue's log" log line of a lazily recovering
# build; a build that recovers before accepting has it at the handshake), and until every queue
# answers a passive declare with its messages; bytes read by the broker at each point
# (/proc/PID/io read_bytes from the disk, rchar by the process). The broker starts on DATA_DIR
# as it is and is stopped gracefully at the end (so runs of two builds can alternate on one data
# directory); with MODE=cold the page cache is dropped first (root).
#
# Usage: bench/lazy-restart.sh BIN LABEL warm|cold DATA_DIR QUEUES MESSAGES_PER_QUEUE (- for any)
# Prints one JSON line. Environment: PORT (28200), WORK (/tmp/lazy-restart, for the server's log),
# DESCRIPTORS (1024), PREFIX (declare-, as declare_pipelined.py names queues), PYTHON, CHECK_QUEUE
# (a queue whose message count is printed last, by a passive declare: a backlog's).
set -euo pipefail
BIN=$1 LABEL=$2 MODE=$3 DATA_DIR=$4 QUEUES=$5 MESSAGES=$6
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-$BENCH_DIR/../interop/python/.venv/bin/python}
PORT=${PORT:-28200} WORK=${WORK:-/tmp/lazy-restart} DESCRIPTORS=${DESCRIPTORS:-1024} PREFIX=${PREFIX:-declare-}
mkdir -p "$WORK"
expect=()
if [[ $MESSAGES != - ]]; then expect=(--expect-messages "$MESSAGES"); fi
sync
if [[ $MODE == cold ]]; then echo 3 >/proc/sys/vm/drop_caches; fi
load=$(cut -d' ' -f1-3 /proc/loadavg)
now() { date +%s.%N; }
since=$(now)
(ulimit -n "$DESCRIPTORS"; exec env LEPUS_LOG=info "$BIN" server --data-dir "$DATA_DIR" --amqp-port "$PORT" --bind 127.0.0.1 \
  --http-port 0 --metrics-port 0 --stream-port 0) >"$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill -9 $SERVER 2>/dev/null || true' EXIT
io() { awk '/^rchar|^read_bytes/ {printf "%s=%.1f ", $1, $2/1048576}' "/proc/$SERVER/io" | sed 's/: *=/=/g'; }
handshake=$("$PYTHON" "$BENCH_DIR/declare_pipelined.py" passive "amqp://guest:guest@127.0.0.1:$PORT/" 0 --since "$since" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["handshake_s"])')
io_handshake=$(io)
until grep -q "recovered every restored classic queue's log\|recovered durable state" "$WORK/server.log" && \
      { ! grep -q "restored; their logs are recovered" "$WORK/server.log" || grep -q "recovered every restored classic queue's log" "$WORK/server.log"; }; do
  sleep 0.05
done
recovered=$(printf "%.3f" "$(echo "$(now) - $since" | bc)")
io_recovered=$(io)
back=$("$PYTHON" "$BENCH_DIR/declare_pipelined.py" passive "amqp://guest:guest@127.0.0.1:$PORT/" "$QUEUES" --prefix "$PREFIX" ${expect[@]+"${expect[@]}"} | tail -1)
queue_count=null
if [[ -n ${CHECK_QUEUE:-} ]]; then
  queue_count=$("$PYTHON" -c 'import pika, sys; c = pika.BlockingConnection(pika.URLParameters(sys.argv[1])); print(c.channel().queue_declare(sys.argv[2], durable=True, passive=True).method.message_count)' \
    "amqp://guest:guest@127.0.0.1:$PORT/" "$CHECK_QUEUE")
fi
stopping=$(now)
kill -TERM $SERVER; wait $SERVER || true
stop_s=$(printf "%.3f" "$(echo "$(now) - $stopping" | bc)")
trap - EXIT
echo "{\"label\": \"$LABEL\", \"mode\": \"$MODE\", \"load\": \"$load\", \"handshake_s\": $handshake, \"io_at_handshake_mib\": \"$io_handshake\", \"all_recovered_s\": $recovered, \"io_at_recovered_mib\": \"$io_recovered\", \"passive_after\": $back, \"stop_s\": $stop_s, \"check_queue_messages\": $queue_count}"
