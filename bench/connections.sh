#!/usr/bin/env bash
# Many idle connections (issue 17, target 7): COUNT connections with a channel each and heartbeats
# (bench/connections/main.go, amqp091-go), held for HOLD_S seconds, against Lepus and RabbitMQ
# 3.10.8 one after the other in one sitting. For each broker: its resident memory before and with
# them open (the difference per connection), its CPU time over the hold (heartbeats only), how many
# connections it closed while held, and a well-behaved client's end-to-end p99 (`lepus perf client`,
# 16 B persistent messages at PROBE_RATE msg/s with confirms and acks for PROBE_S seconds) with no
# other connection and again with them all open.
#
# Lepus's default connection_max is half the descriptor limit less 128 (the other half is its
# segment file cache's): 9,872 under 20,000. The bench starts it with --connection-max COUNT + 16,
# as an operator who wants COUNT connections under that limit would.
#
# Usage: bench/connections.sh LEPUS_BIN [lepus|rabbitmq|both]
# Environment: COUNT (19000), HOLD_S (60), HEARTBEAT_S (10), PROBE_RATE (1000), PROBE_S (20),
#              RESULTS (bench/results/connections).
set -euo pipefail
LEPUS=$1 WHICH=${2:-both}
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/connections}
COUNT=${COUNT:-19000} HOLD_S=${HOLD_S:-60} HEARTBEAT_S=${HEARTBEAT_S:-10} PROBE_RATE=${PROBE_RATE:-1000} PROBE_S=${PROBE_S:-20}
mkdir -p "$RESULTS"
export PATH="/usr/local/go/bin:$PATH"
HOLDER=$(mktemp /tmp/lepus-connections.XXXXXX)
(cd "$BENCH_DIR/connections" && go build -o "$HOLDER" .)
# shellcheck source=bench/rabbitmq-node.sh
source "$BENCH_DIR/rabbitmq-node.sh"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rss_kib() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$1/status"; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
cleanup_dirs=()
lepus_pid=""
trap 'if [[ -n $lepus_pid ]]; then kill "$lepus_pid" 2>/dev/null || true; fi; if [[ -n ${RABBITMQ_NODE:-} ]]; then rabbitmq_stop || true; fi; rm -rf "${cleanup_dirs[@]}" "$HOLDER"' EXIT

probe() { # probe NAME URL: the well-behaved client's summary lines
  "$LEPUS" perf client --url "$2" --persistent --durable --message-size 16 --rate "$PROBE_RATE" --duration "$PROBE_S" \
    --cleanup "queue://probe-$1" >"$RESULTS/$1.probe.txt" 2>&1 || true
  grep -E '^(sent|transfer)' "$RESULTS/$1.probe.txt" | sed "s/^/  $1: /" || echo "  $1: no summary: $(tail -1 "$RESULTS/$1.probe.txt")"
}

measure() { # measure BROKER URL PID
  local broker=$1 url=$2 pid=$3
  echo "== $broker (load $(cut -d' ' -f1-3 /proc/loadavg))"
  probe "$broker-alone" "$url"
  local idle_kib; idle_kib=$(rss_kib "$pid")
  coproc HELD { "$HOLDER" -url "$url" -count "$COUNT" -heartbeat "${HEARTBEAT_S}s" -hold "${HOLD_S}s"; }
  local held_pid=$HELD_PID line
  while read -r line <&"${HELD[0]}"; do
    echo "  $line"
    if [[ $line == "barrier: all open" ]]; then
      local open_kib; open_kib=$(rss_kib "$pid")
      echo "  RSS idle $idle_kib KiB, with $COUNT connections $open_kib KiB: $(( (open_kib - idle_kib) * 1024 / COUNT )) bytes per connection"
      probe "$broker-with-$COUNT" "$url"
      local ticks_before; ticks_before=$(cpu_ticks "$pid")
      echo >&"${HELD[1]}"
    elif [[ $line == held* ]]; then
      echo "  broker CPU over the ${HOLD_S} s hold: $(( ($(cpu_ticks "$pid") - ticks_before) * 1000 / hz )) ms; descriptors open: $(ls "/proc/$pid/fd" | wc -l); RSS $(rss_kib "$pid") KiB"
    fi
  done
  wait "$held_pid" || true
}

{
  if [[ $WHICH != rabbitmq ]]; then
    port=$(free_port) data_dir=$(mktemp -d /tmp/lepus-connections-data.XXXXXX); cleanup_dirs+=("$data_dir")
    LEPUS_LOG=warn "$LEPUS" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 --stream-port 0 \
      --connection-max $((COUNT + 16)) >"$RESULTS/lepus-server.log" 2>&1 &
    lepus_pid=$!
    for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
    measure lepus "amqp://guest:guest@127.0.0.1:$port/" "$lepus_pid"
    kill "$lepus_pid"; wait "$lepus_pid" 2>/dev/null || true; lepus_pid=""
  fi
  if [[ $WHICH != lepus ]]; then
    base=$(mktemp -d /tmp/lepus-connections-rabbitmq.XXXXXX); cleanup_dirs+=("$base")
    RABBITMQ_DESCRIPTORS=${RABBITMQ_DESCRIPTORS:-$(ulimit -n)} rabbitmq_start "$base"
    measure rabbitmq "$RABBITMQ_AMQP_URL" "$RABBITMQ_BEAM_PID"
    rabbitmq_stop; RABBITMQ_NODE=""
  fi
} 2>&1 | tee "$RESULTS/run.txt"
