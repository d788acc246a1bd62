#!/usr/bin/env bash
# Many durable queues on one node (issue 17 item 3): declares (pika one at a time, then pipelined
# over one connection), memory per idle queue, CPU while they sit idle, MESSAGES persistent
# messages published to each, a graceful restart and a restart after kill -9 (seconds until the
# AMQP handshake succeeds and until every queue answers a passive declare with its messages), and
# the open descriptors throughout, under `ulimit -n DESCRIPTORS`. Lepus or a private RabbitMQ node,
# the same way. Writes RESULTS/LABEL.jsonl (one JSON object per step; the first names the load).
#
# Usage: bench/many-queues.sh lepus LEPUS_BIN LABEL
#        bench/many-queues.sh rabbitmq - LABEL
# Environment: QUEUES (100000), PIKA_QUEUES (the first this many declared with pika, one at a time;
#              10000), MESSAGES (10 per queue), MESSAGE_BYTES (16), IDLE_S (60), DESCRIPTORS (1024),
#              PYTHON (a python with pika: interop/python/.venv/bin/python), RESULTS
#              (bench/results/many-queues).
set -euo pipefail
BROKER=$1 BIN=$2 LABEL=$3
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/many-queues}
QUEUES=${QUEUES:-100000} PIKA_QUEUES=${PIKA_QUEUES:-10000} MESSAGES=${MESSAGES:-10} MESSAGE_BYTES=${MESSAGE_BYTES:-16}
IDLE_S=${IDLE_S:-60} DESCRIPTORS=${DESCRIPTORS:-1024}
PYTHON=${PYTHON:-$BENCH_DIR/../interop/python/.venv/bin/python}
"$PYTHON" -c 'import pika' 2>/dev/null || { echo "PYTHON=$PYTHON has no pika (interop/python/run.sh makes that venv)" >&2; exit 1; }
mkdir -p "$RESULTS"
OUT=$RESULTS/$LABEL.jsonl
: >"$OUT"
WORK=$(mktemp -d /tmp/lepus-many-queues.XXXXXX)
# RabbitMQ runs as the rabbitmq user: it must reach its directory below this one.
chmod 755 "$WORK"
SERVER= PID=
# shellcheck source=bench/rabbitmq-node.sh
source "$BENCH_DIR/rabbitmq-node.sh"
cleanup() {
  if [[ $BROKER == rabbitmq && -n $PID ]]; then rabbitmq_kill; fi
  if [[ -n $SERVER ]]; then kill -9 "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

note() { echo "$1" | tee -a "$OUT"; }
now() { date +%s.%N; }
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$PID/stat"; }
figures() { # EVENT: RSS, descriptors, threads, CPU so far, data on disk
  note "{\"event\": \"$1\", \"rss_kib\": $(awk '/^VmRSS/ {print $2}' "/proc/$PID/status"), \"descriptors\": $(ls "/proc/$PID/fd" | wc -l), \"threads\": $(ls "/proc/$PID/task" | wc -l), \"cpu_s\": $(cpu_s), \"disk_kib\": $(du -sk "$WORK" | cut -f1), \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
}

start_broker() {
  if [[ $BROKER == lepus ]]; then
    PORT=${PORT:-$(rabbitmq_free_port)}
    (ulimit -n "$DESCRIPTORS"; exec env LEPUS_LOG=warn "$BIN" server --data-dir "$WORK/data" --amqp-port "$PORT" --bind 127.0.0.1 \
      --http-port 0 --metrics-port 0) >>"$WORK/server.log" 2>&1 &
    SERVER=$! PID=$SERVER
    URL="amqp://guest:guest@127.0.0.1:$PORT/"
  else
    RABBITMQ_DESCRIPTORS=$DESCRIPTORS rabbitmq_start "$WORK/rabbitmq"
    PID=$RABBITMQ_BEAM_PID PORT=$RABBITMQ_AMQP_PORT URL=$RABBITMQ_AMQP_URL
  fi
}
stop_broker() { # TERM|KILL
  local started
  started=$(now)
  if [[ $BROKER == lepus ]]; then
    kill "-$1" "$SERVER"; wait "$SERVER" || true; SERVER=
  elif [[ $1 == TERM ]]; then rabbitmq_stop; else rabbitmq_kill; fi
  note "{\"event\": \"stopped with SIG$1\", \"stop_s\": $(echo "$(now) - $started" | bc)}"
  PID=
}
# Starts the broker and waits until every queue answers a passive declare with MESSAGES messages.
restart() { # EVENT
  local since
  since=$(now)
  start_broker
  "$PYTHON" "$BENCH_DIR/declare_pipelined.py" passive "$URL" "$QUEUES" --since "$since" --expect-messages "$MESSAGES" \
    | sed "s/^{/{\"event\": \"$1\", /" | tee -a "$OUT"
}
idle() { # EVENT: CPU time over IDLE_S of idleness (after 10 s to settle)
  sleep 10
  local before after
  before=$(cpu_s)
  sleep "$IDLE_S"
  after=$(cpu_s)
  note "{\"event\": \"$1\", \"idle_s\": $IDLE_S, \"cpu_s\": $(echo "$after - $before" | bc), \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
}

note "{\"broker\": \"$BROKER\", \"binary\": \"$BIN\", \"label\": \"$LABEL\", \"queues\": $QUEUES, \"pika_queues\": $PIKA_QUEUES, \"messages_per_queue\": $MESSAGES, \"descriptors_limit\": $DESCRIPTORS, \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"cpus\": $(nproc)}"
start_broker
"$PYTHON" "$BENCH_DIR/declare_pipelined.py" passive "$URL" 0 >/dev/null
figures "empty"
if [[ $PIKA_QUEUES -gt 0 ]]; then
  "$PYTHON" "$BENCH_DIR/declare_queues.py" "$PORT" declare "$PIKA_QUEUES" | sed 's/^{/{"client": "pika", /' | tee -a "$OUT"
fi
"$PYTHON" "$BENCH_DIR/declare_pipelined.py" declare "$URL" "$QUEUES" --first "$PIKA_QUEUES" | tee -a "$OUT"
figures "declared"
idle "idle with the queues empty"
figures "after idling"
"$PYTHON" "$BENCH_DIR/declare_pipelined.py" publish "$URL" "$QUEUES" --messages "$MESSAGES" --size "$MESSAGE_BYTES" | tee -a "$OUT"
sleep 5
figures "published"
stop_broker TERM
restart "restarted after a graceful stop"
figures "restarted"
idle "idle after the restart"
stop_broker KILL
restart "restarted after kill -9"
figures "restarted after kill -9"
stop_broker TERM
