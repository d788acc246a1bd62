#!/usr/bin/env bash
# Safe mode, one producer and one consumer (persistent 16 B messages, durable queue, confirms with
# 1,000 outstanding, manual acks, `--sync always`), on a plain queue and on queues with TTL and
# dead-lettering, 10 priorities, and a single active consumer: issue 12 asks each to stay within
# 20 % of the plain queue. The load is bench/queue-features/main.go (amqp091-go), since `lepus
# perf` declares queues without arguments. Variants alternate run by run, each run on a broker of
# its own with a fresh data directory, so load on a shared machine hits them alike. Prints every
# run and the median per variant: msg/s and the broker's CPU time per completed message (utime +
# stime from /proc over the messages consumed), the figure that holds on a noisy machine.
#
# Usage: bench/queue-features.sh LEPUS_BIN
# Environment: RUNS (3), DURATION_S (10), SIZE (16), RESULTS (bench/results/queue-features).
set -euo pipefail
LEPUS=$1
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/queue-features}
RUNS=${RUNS:-3} DURATION_S=${DURATION_S:-10} SIZE=${SIZE:-16}
mkdir -p "$RESULTS"
export PATH="/usr/local/go/bin:$PATH"
LOAD=$(mktemp /tmp/lepus-queue-features-load.XXXXXX)
(cd "$BENCH_DIR/queue-features" && go build -o "$LOAD" .)

declare -A ARGS=(
  [plain]='{}'
  [ttl-dlx]='{"x-message-ttl": 60000, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "features-dead"}'
  [priority-10]='{"x-max-priority": 9}'
  [sac]='{"x-single-active-consumer": true}'
)
VARIANTS=(plain ttl-dlx priority-10 sac)

broker_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# run_once VARIANT LABEL: prints msg/s and broker CPU ns per message.
run_once() {
  local variant=$1 label=$2 port data_dir server cpu_ticks completed priorities=0
  [ "$variant" = priority-10 ] && priorities=10
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  data_dir=$(mktemp -d /tmp/lepus-queue-features.XXXXXX)
  LEPUS_LOG=warn "$LEPUS" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 \
    >"$RESULTS/$label.server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  "$LOAD" -url "amqp://guest:guest@127.0.0.1:$port/" -args "${ARGS[$variant]}" -priorities "$priorities" \
    -duration "${DURATION_S}s" -size "$SIZE" >"$RESULTS/$label.out" 2>&1 || true
  cpu_ticks=$(broker_cpu_ticks "$server")
  kill "$server"; wait "$server" 2>/dev/null || true
  rm -rf "$data_dir"
  completed=$(sed -n 's/^completed \([0-9]*\) .*/\1/p' "$RESULTS/$label.out")
  echo "$(sed -n 's/.*(\([0-9]*\) msg\/s).*/\1/p' "$RESULTS/$label.out") $(( cpu_ticks * 1000000000 / $(getconf CLK_TCK) / ${completed:-1} ))"
}

median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
for run in $(seq 1 "$RUNS"); do
  for variant in "${VARIANTS[@]}"; do
    read -r rate cpu_ns < <(run_once "$variant" "$variant-$run")
    echo "run $run $variant: ${rate:-0} msg/s, ${cpu_ns:-0} ns broker CPU/msg (load $(cut -d' ' -f1-3 /proc/loadavg))"
  done
done | tee "$RESULTS/runs.txt"
for variant in "${VARIANTS[@]}"; do
  rates=$(grep " $variant: " "$RESULTS/runs.txt" | sed -n 's/.*: \([0-9]*\) msg\/s.*/\1/p')
  cpu=$(grep " $variant: " "$RESULTS/runs.txt" | sed -n 's/.*msg\/s, \([0-9]*\) ns.*/\1/p')
  # shellcheck disable=SC2086
  echo "$variant median of $RUNS: $(median $rates) msg/s, $(median $cpu) ns broker CPU/msg"
done | tee "$RESULTS/medians.txt"
rm -f "$LOAD"
