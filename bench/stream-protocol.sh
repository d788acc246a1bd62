#!/usr/bin/env bash
# The stream protocol side by side: `lepus perf --protocol stream` (and the Go stream client's
# perfTest when PERF_TEST names its binary) against Lepus and against RabbitMQ's stream plugin,
# 1 producer and 1 consumer, confirms on, 16 B and 1 KiB, runs alternating between the brokers.
# Prints one line per run: broker, size, msg/s, send-ack p50/p99, the broker's CPU seconds over
# the run and its CPU microseconds per message (from /proc/PID/stat of the broker process).
#
# Usage: LEPUS=target/release/lepus RABBITMQ_STREAM_URL=rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f \
#          RABBITMQ_PID=1234 [PERF_TEST=/path/to/perfTest] [DURATION=20] [ROUNDS=2] [SIZES="16 1024"] [TOOLS="lepus perftest"] bench/stream-protocol.sh
# RABBITMQ_PID is the beam.smp of that node (its CPU is measured the same way).
set -euo pipefail
cd "$(dirname "$0")/.."
lepus=${LEPUS:-target/release/lepus}
duration=${DURATION:-20}
rounds=${ROUNDS:-2}
sizes=${SIZES:-16 1024}
# The load generators: lepus perf, and perfTest when PERF_TEST names it (each run on a stream of
# its own: perfTest's consumer reads from `first`, so a reused stream would be replayed whole).
tools=${TOOLS:-lepus${PERF_TEST:+ perftest}}
: "${RABBITMQ_STREAM_URL:?the RabbitMQ node's stream URL}" "${RABBITMQ_PID:?the RabbitMQ node's beam.smp pid}"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
data_dir=$(mktemp -d /tmp/lepus-stream-bench-XXXXXX)
stream_port=$(free_port)
"$lepus" server --data-dir "$data_dir" --amqp-port "$(free_port)" --http-port 0 --metrics-port 0 --bind 127.0.0.1 \
  --stream-port "$stream_port" --stream-advertised-host 127.0.0.1 >"$data_dir.log" 2>&1 &
lepus_pid=$!
trap 'kill $lepus_pid 2>/dev/null; wait $lepus_pid 2>/dev/null; rm -rf "$data_dir" "$data_dir.log"' EXIT
sleep 2
lepus_url="rabbitmq-stream://guest:guest@127.0.0.1:$stream_port/%2f"
cpu_s() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; duration ${duration} s per run"
run() {
  local broker=$1 url=$2 pid=$3 size=$4 tool=$5 json
  json=$(mktemp /tmp/lepus-stream-bench-XXXXXX.json)
  local before after
  before=$(cpu_s "$pid")
  if [ "$tool" = lepus ]; then
    "$lepus" perf client --protocol stream --url "$url" --message-size "$size" --max-pending 10000 \
      --duration "$duration" --quiet --json "$json" "stream://bench-$size" >/dev/null
    after=$(cpu_s "$pid")
    python3 - "$json" "$broker" "$size" "$before" "$after" <<'PY'
import json, sys
path, broker, size, before, after = sys.argv[1:]
s = json.load(open(path))["summary"]
rate = s["completed_per_sec"]
cpu = float(after) - float(before)
ack = s.get("send_ack_latency_us") or {}
print(f"lepus-perf {broker:8} {size:>5} B  {rate:>10.0f} msg/s confirmed, {s['received_per_sec']:>10.0f} received  "
      f"send-ack p50 {ack.get('p50_us', 0):>8.0f} us p99 {ack.get('p99_us', 0):>8.0f} us  "
      f"broker CPU {cpu:6.2f} s = {cpu * 1e6 / max(s['completed'], 1):.2f} us/msg{'  ERROR ' + s['error'] if s.get('error') else ''}")
PY
  else
    timeout $((duration + 30)) "$PERF_TEST" silent --uris "$url" --publishers 1 --consumers 1 --fixed-body "$size" --no-color \
      --streams "perftest-$size-$(date +%s%N)" --time "$duration" 2>&1 | tail -3
    after=$(cpu_s "$pid")
    echo "perfTest   $broker $size B broker CPU $(echo "$after - $before" | bc) s"
  fi
  rm -f "$json"
}
for round in $(seq 1 "$rounds"); do
  for size in $sizes; do
    for tool in $tools; do
      run lepus "$lepus_url" "$lepus_pid" "$size" "$tool"
      run rabbitmq "$RABBITMQ_STREAM_URL" "$RABBITMQ_PID" "$size" "$tool"
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
