#!/usr/bin/env bash
# One million delayed messages pending in an x-delayed-message exchange: the broker's resident
# memory with all of them pending (against its idle memory), the delay store's size on disk, and
# how accurately they are routed: the broker's own timer lateness (routing time minus due time,
# lepus_delayed_lateness_seconds, 1 ms buckets) and the client's (arrival minus the due time it
# asked for, which adds the publish's trip to the broker and the delivery). The load is
# bench/delayed-million/main.go (amqp091-go): persistent messages, confirms with 1,000 outstanding,
# due times spread over SPREAD_S seconds starting LEAD_S seconds after the start.
#
# Usage: bench/delayed-million.sh LEPUS_BIN
# Environment: COUNT (1000000), LEAD_S (240), SPREAD_S (60), RESULTS (bench/results/delayed-million),
# BROKER_LOAD_RATE (unset: none): with it, once everything is published, `lepus perf client` runs a
# safe-mode load on the same broker (16 B persistent messages to a durable queue, confirms, acks) at
# that many msg/s until the last message is due, so the timers fire under the broker's own load.
set -euo pipefail
LEPUS=$1
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/delayed-million}
COUNT=${COUNT:-1000000} LEAD_S=${LEAD_S:-240} SPREAD_S=${SPREAD_S:-60}
mkdir -p "$RESULTS"
export PATH="/usr/local/go/bin:$PATH"
LOAD=$(mktemp /tmp/lepus-delayed-million.XXXXXX)
(cd "$BENCH_DIR/delayed-million" && go build -o "$LOAD" .)

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port) metrics_port=$(free_port)
data_dir=$(mktemp -d /tmp/lepus-delayed-million-data.XXXXXX)
LEPUS_LOG=warn "$LEPUS" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port "$metrics_port" --stream-port 0 \
  >"$RESULTS/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$data_dir" "$LOAD"' EXIT
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
status_kib() { awk -v field="$1:" '$1 == field { print $2 }' "/proc/$server/status"; }
metric() { curl -s "http://127.0.0.1:$metrics_port/metrics" | awk -v name="$1" '$1 == name { print $2 }'; }
idle_kib=$(status_kib VmRSS)

coproc LOADER { "$LOAD" -url "amqp://guest:guest@127.0.0.1:$port/" -count "$COUNT" -lead "${LEAD_S}s" -spread "${SPREAD_S}s"; }
loader_pid=$LOADER_PID
while read -r line <&"${LOADER[0]}"; do
  echo "$line"
  if [ "$line" = "barrier: all published" ] && [ -n "${BROKER_LOAD_RATE:-}" ]; then
    "$LEPUS" perf client --url "amqp://guest:guest@127.0.0.1:$port/" --persistent --durable --max-pending 1000 \
      --message-size 16 --rate "$BROKER_LOAD_RATE" --duration "$((LEAD_S + SPREAD_S))" queue://delayed-bench-load \
      >"$RESULTS/broker-load.txt" 2>&1 &
  fi
  if [ "$line" = "barrier: all published" ]; then
    pending=$(metric lepus_delayed_messages)
    rss_kib=$(status_kib VmRSS) hwm_kib=$(status_kib VmHWM)
    store_kib=$(du -sk "$data_dir/queues/delayed-messages" | cut -f1)
    echo "pending $pending; broker RSS $rss_kib KiB (idle $idle_kib KiB, so $(( (rss_kib - idle_kib) * 1024 / ${pending%.*} )) bytes per pending message), peak $hwm_kib KiB; delay store $store_kib KiB on disk"
    echo >&"${LOADER[1]}"
  fi
done > >(tee "$RESULTS/run.txt")
wait "$loader_pid" || true
# The broker's timer lateness, from its 1 ms buckets: the first bucket whose count reaches the rank.
curl -s "http://127.0.0.1:$metrics_port/metrics" | grep '^lepus_delayed_lateness' >"$RESULTS/lateness.txt"
python3 - "$RESULTS/lateness.txt" <<'PY' | tee -a "$RESULTS/run.txt"
import re, sys
buckets, total, maximum = [], 0, 0.0
for line in open(sys.argv[1]):
    match = re.match(r'lepus_delayed_lateness_seconds_bucket\{le="([^"]+)"\} (\d+)', line)
    if match:
        buckets.append((float("inf") if match.group(1) == "+Inf" else float(match.group(1)) * 1000, int(match.group(2))))
    elif line.startswith("lepus_delayed_lateness_max_seconds "):
        maximum = float(line.split()[1]) * 1000
    elif line.startswith("lepus_delayed_lateness_seconds_count "):
        total = int(line.split()[1])
def percentile(fraction):
    rank = fraction * total
    return next(bound for bound, count in buckets if count >= rank)
print("broker timer lateness ms over %d messages: p50 %g, p99 %g, p99.9 %g, max %g" % (total, percentile(0.5), percentile(0.99), percentile(0.999), maximum))
PY
echo "load $(cut -d' ' -f1-3 /proc/loadavg) at the end" | tee -a "$RESULTS/run.txt"
