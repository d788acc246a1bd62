#!/usr/bin/env bash
# Safe-mode throughput (persistent messages, durable queue, publisher confirms, `--sync always`) of
# two Lepus binaries, alternating runs so load on a shared machine hits both alike; each run starts
# its own broker with a fresh data directory. Prints every run and the median per binary and size,
# with the broker's CPU time per completed message (utime + stime of the broker process, from
# /proc, divided by the messages the run completed: the figure that holds across machines).
# (results/idle-queues.md uses it to show the syncer change does not slow the hot path.)
#
# Usage: bench/safe-mode-throughput.sh BEFORE_BIN AFTER_BIN
# Environment: RUNS (3), DURATION_S (10), SIZES ("16 1024"), RESULTS (bench/results/idle-queues).
set -euo pipefail
BEFORE=$1 AFTER=$2
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/idle-queues}
RUNS=${RUNS:-3} DURATION_S=${DURATION_S:-10} SIZES=${SIZES:-16 1024}
mkdir -p "$RESULTS"

# broker_cpu_ticks PID: utime + stime of a process, in clock ticks.
broker_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# run_once BIN LABEL SIZE: prints the run's completed msg/s and the broker's CPU ns per message.
run_once() {
  local bin=$1 label=$2 size=$3 port data_dir server cpu_ticks completed
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  data_dir=$(mktemp -d /tmp/lepus-throughput-bench.XXXXXX)
  LEPUS_LOG=warn "$bin" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 \
    >"$RESULTS/$label.server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  "$AFTER" perf client --url "amqp://guest:guest@127.0.0.1:$port/" --persistent --durable --max-pending 1000 \
    --message-size "$size" --duration "$DURATION_S" queue://q >"$RESULTS/$label.out" 2>&1 || true
  cpu_ticks=$(broker_cpu_ticks "$server")
  kill "$server"; wait "$server" 2>/dev/null || true
  rm -rf "$data_dir"
  completed=$(sed -n 's/^sent .*| completed \([0-9]*\) (.*/\1/p' "$RESULTS/$label.out")
  echo "$(sed -n 's/^sent .*| completed [0-9]* (\([0-9]*\) msg\/s).*/\1/p' "$RESULTS/$label.out") \
    $(( cpu_ticks * 1000000000 / $(getconf CLK_TCK) / ${completed:-1} ))"
}

for size in $SIZES; do
  before_rates=() after_rates=() before_cpu=() after_cpu=()
  for run in $(seq 1 "$RUNS"); do
    read -r rate cpu_ns < <(run_once "$BEFORE" "throughput-before-$size-$run" "$size")
    before_rates+=("${rate:-0}") before_cpu+=("${cpu_ns:-0}")
    read -r rate cpu_ns < <(run_once "$AFTER" "throughput-after-$size-$run" "$size")
    after_rates+=("${rate:-0}") after_cpu+=("${cpu_ns:-0}")
    echo "size $size run $run: before ${before_rates[-1]} msg/s ${before_cpu[-1]} ns CPU/msg," \
      "after ${after_rates[-1]} msg/s ${after_cpu[-1]} ns CPU/msg (load $(cut -d' ' -f1-3 /proc/loadavg))"
  done
  median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
  echo "size $size median of $RUNS: before $(median "${before_rates[@]}") msg/s $(median "${before_cpu[@]}") ns CPU/msg," \
    "after $(median "${after_rates[@]}") msg/s $(median "${after_cpu[@]}") ns CPU/msg"
done | tee "$RESULTS/throughput.txt"
