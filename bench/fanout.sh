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
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }  # of the whole process, all its threads
written_bytes() { awk '$1 == "write_bytes:" { print $2 }' "/proc/$1/io"; }
hz=$(getconf CLK_TCK)
lepus_pid="" rabbitmq_base=""
trap 'if [[ -n $lepus_pid ]]; then kill "$lepus_pid" 2>/dev/null || true; fi; if [[ -n $rabbitmq_base ]]; then rabbitmq_stop || true; rm -rf "$rabbitmq_base"; fi' EXIT

run() { # run NAME URL PID
  local name=$1 url=$2 pid=$3 line first_ticks="" last_ticks="" first_bytes="" last_bytes="" seconds=0 published=0 deliveries=0
  # The broker's CPU time and disk writes are read at the first progress line (queues declared,
  # bound and consumed from) and at the first drain line: the steady state only, without the
  # declares, binds and deletes of 1,000 queues. Each progress line is one second's rates.
  while IFS= read -r line; do
    echo "$line" >>"$RESULTS/$name.txt"
    if [[ $line =~ ^\[\ *[0-9.]+\ s\]\ sent\ +([0-9]+)/s.*completed\ +([0-9]+)/s.*received\ +([0-9]+)/s ]]; then
      if [[ -z $first_ticks ]]; then
        first_ticks=$(cpu_ticks "$pid") first_bytes=$(written_bytes "$pid")
        continue
      fi
      seconds=$((seconds + 1)) published=$((published + BASH_REMATCH[2])) deliveries=$((deliveries + BASH_REMATCH[3]))
    elif [[ $line == *drain* && -n $first_ticks && -z $last_ticks ]]; then
      last_ticks=$(cpu_ticks "$pid") last_bytes=$(written_bytes "$pid")
    fi
  done < <("$LEPUS" perf client --url "$url" --persistent --durable --message-size "$SIZE" --consumers "$QUEUES" --max-pending "$MAX_PENDING" \
    --duration "$DURATION_S" --cleanup "topic://fanout-$name" 2>&1)
  if [[ -z $last_ticks || $seconds == 0 ]]; then echo "$name: no steady state measured (see $RESULTS/$name.txt)"; return; fi
  echo "$name: over ${seconds} s: $((published / seconds)) msg/s published (confirmed), $((deliveries / seconds)) deliveries/s;" \
    "broker CPU $(( (last_ticks - first_ticks) * 1000000000 / hz / (deliveries > 0 ? deliveries : 1) )) ns per delivery;" \
    "disk written $(( (last_bytes - first_bytes) / (published > 0 ? published : 1) )) B per published message"
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
