#!/usr/bin/env bash
# Fan-out (issue 17, target 4): one publisher to a topic exchange with QUEUES bound durable queues
# (one subscriber each: `lepus perf client topic://NAME --consumers QUEUES`), persistent messages
# with confirms, manual acks; Lepus and RabbitMQ 3.10.8 alternating, RUNS runs each. For each run:
# messages published and deliveries per second, the broker's CPU time per delivery (utime + stime
# of its process over the run, divided by the deliveries) and the bytes it wrote to disk per
# published message (/proc/PID/io write_bytes: how many times a message is stored).
#
# Usage: bench/fanout.sh LEPUS_BIN [lepus|rabbitmq|both]
# Environment: QUEUES (1000), SIZE (16), DURATION_S (30), RUNS (3), MAX_PENDING (10: unconfirmed publishes;
#              each is QUEUES deliveries, so a larger window only queues up work), RESULTS (bench/results/fanout).
set -euo pipefail
LEPUS=$1 WHICH=${2:-both}
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/fanout}
QUEUES=${QUEUES:-1000} SIZE=${SIZE:-16} DURATION_S=${DURATION_S:-30} RUNS=${RUNS:-3} MAX_PENDING=${MAX_PENDING:-10}
mkdir -p "$RESULTS"
# shellcheck source=bench/rabbitmq-node.sh
source "$BENCH_DIR/rabbitmq-node.sh"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
written_bytes() { awk '$1 == "write_bytes:" { print $2 }' "/proc/$1/io"; }
hz=$(getconf CLK_TCK)
lepus_pid="" rabbitmq_base=""
trap 'if [[ -n $lepus_pid ]]; then kill "$lepus_pid" 2>/dev/null || true; fi; if [[ -n $rabbitmq_base ]]; then rabbitmq_stop || true; rm -rf "$rabbitmq_base"; fi' EXIT

run() { # run NAME URL PID
  local name=$1 url=$2 pid=$3 ticks bytes
  ticks=$(cpu_ticks "$pid") bytes=$(written_bytes "$pid")
  "$LEPUS" perf client --url "$url" --persistent --durable --message-size "$SIZE" --consumers "$QUEUES" --max-pending "$MAX_PENDING" \
    --duration "$DURATION_S" --cleanup "topic://fanout-$name" >"$RESULTS/$name.txt" 2>&1 || true
  ticks=$(( $(cpu_ticks "$pid") - ticks )) bytes=$(( $(written_bytes "$pid") - bytes ))
  python3 - "$RESULTS/$name.txt" "$name" "$ticks" "$hz" "$bytes" <<'PY'
import re, sys
path, name, ticks, hz, written = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
summary = [line for line in open(path) if line.startswith("sent ")]
if not summary:
    print(f"{name}: no summary (see {path})"); sys.exit()
sent = re.search(r"completed (\d+) \((\d+) msg/s\)", summary[-1])
received = re.search(r"received (\d+) \((\d+) msg/s\)", summary[-1])
published, deliveries = int(sent.group(1)), int(received.group(1))
cpu_ns = ticks * 1e9 / hz
print(f"{name}: published {sent.group(2)} msg/s, {received.group(2)} deliveries/s; broker CPU {cpu_ns / max(deliveries, 1):,.0f} ns per delivery "
      f"(whole run, drain included); disk written {written / max(published, 1):,.0f} B per published message")
PY
}

{
  echo "fan-out to $QUEUES queues, $SIZE B persistent, $MAX_PENDING unconfirmed at most, ${DURATION_S} s runs, load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [[ $WHICH != lepus ]]; then
    rabbitmq_base=$(mktemp -d /tmp/lepus-fanout-rabbitmq.XXXXXX)
    RABBITMQ_DESCRIPTORS=${RABBITMQ_DESCRIPTORS:-$(ulimit -n)} rabbitmq_start "$rabbitmq_base"
  fi
  for index in $(seq 1 "$RUNS"); do
    if [[ $WHICH != rabbitmq ]]; then
      port=$(free_port) data_dir=$(mktemp -d /tmp/lepus-fanout-data.XXXXXX)
      LEPUS_LOG=warn "$LEPUS" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 --stream-port 0 \
        >"$RESULTS/lepus-server.log" 2>&1 &
      lepus_pid=$!
      for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
      run "lepus-$index" "amqp://guest:guest@127.0.0.1:$port/" "$lepus_pid"
      kill "$lepus_pid"; wait "$lepus_pid" 2>/dev/null || true; lepus_pid=""; rm -rf "$data_dir"
    fi
    if [[ $WHICH != lepus ]]; then
      run "rabbitmq-$index" "$RABBITMQ_AMQP_URL" "$RABBITMQ_BEAM_PID"
    fi
    echo "  (load $(cut -d' ' -f1-3 /proc/loadavg))"
  done
} 2>&1 | tee "$RESULTS/run.txt"
