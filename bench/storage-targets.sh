#!/usr/bin/env bash
# Issue 3's targets, Lepus and RabbitMQ side by side, safe mode throughout: durable queue,
# persistent messages, publisher confirms (after fdatasync on Lepus), manual consumer acks,
# 1 producer and 1 consumer.
#   max-16b / max-1kb    all-out with up to MAX_PENDING unconfirmed messages (default 1000)
#   half-16b / half-1kb  open loop at half the maximum the same broker just reached: p99 of
#                        end-to-end (transfer) and confirm (send-ack) latency
# Writes bench/results/storage-targets/ (JSON, HDR logs, CPU time) and bench/results/storage-targets.md.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
WARMUP_S=${WARMUP_S:-5}
DURATION_S=${DURATION_S:-20}
MAX_PENDING=${MAX_PENDING:-1000}
out=$RESULTS/storage-targets
mkdir -p "$out"
rm -f "$out"/*--*.json "$out"/*--*.hdr "$out"/*--*.log "$out"/*--*.cpu.json
start_lepus
find_rabbitmq
brokers=(lepus "$LEPUS_URL")
[[ -n $RABBIT_URL ]] && brokers+=(rabbitmq "$RABBIT_URL")

run() { # STEP BROKER URL ARGS...
  local step=$1 broker=$2 url=$3; shift 3
  log "$step on $broker"
  measured "$out/$step--$broker" "$LEPUS_BIN" perf client --url "$url" --warmup "$WARMUP_S" --duration "$DURATION_S" \
    --persistent --durable --show-latency --max-pending "$MAX_PENDING" \
    --json "$out/$step--$broker.json" --hdr "$out/$step--$broker.hdr" "$@" >/dev/null
}

for ((i = 0; i < ${#brokers[@]}; i += 2)); do
  broker=${brokers[i]} url=${brokers[i + 1]}
  for size in 16 1024; do
    label=$([[ $size == 16 ]] && echo 16b || echo 1kb)
    queue="queue://lepus-bench-targets-$label-$$"
    run "max-$label" "$broker" "$url" --message-size "$size" "$queue"
    max=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['completed_per_sec'])" "$out/max-$label--$broker.json")
    half=$(python3 -c "import sys; print(max(1, round(float(sys.argv[1]) / 2)))" "$max")
    run "half-$label" "$broker" "$url" --message-size "$size" --rate "$half" "$queue"
  done
done
python3 "$BENCH_DIR/summarize.py" "Storage targets (issue 3): Lepus vs RabbitMQ, safe mode, 1 producer / 1 consumer" "$out" "$RESULTS/storage-targets.md"
python3 - "$RESULTS/storage-targets.md" "$(uname -r)" "$(nproc)" <<'PY'
import sys, datetime
path, kernel, cores = sys.argv[1:4]
text = open(path).read()
title, rest = text.split("\n", 1)
header = (f"\nCommand: `bench/storage-targets.sh` ({datetime.date.today()}). Machine: {cores} vCPUs, Linux {kernel}; the load "
          "generator and one broker at a time on the same machine (RabbitMQ: a private 3.10.8 node from Debian's package). "
          "Durable queue, persistent messages, publisher confirms (Lepus: `--sync always`, after the node journal's "
          "fdatasync), manual acks, 1 producer and 1 consumer, `--max-pending 1000`; 5 s warm-up, 20 s measured per run. "
          "A single run per row on a shared, noisy machine: compare within a row pair, not across runs.\n")
open(path, "w").write(title + "\n" + header + rest)
PY
