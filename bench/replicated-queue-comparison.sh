#!/usr/bin/env bash
# Scenario 2, the replicated-queue comparison methodology: sender threads publish synchronously in
# batches of 1-10 messages with publisher confirms (each batch waits for all its confirms);
# receivers consume and ack in batches of 1-10 (multiple=true); 1, 5 and 25 threads each side on
# one durable queue, persistent messages. Reports throughput and the 95th percentile of send
# latency (publish to confirm) and processing latency (publish to delivery).
# Writes bench/results/replicated/ and bench/results/replicated.md.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
WARMUP_S=${WARMUP_S:-5}
DURATION_S=${DURATION_S:-20}
out=$RESULTS/replicated
mkdir -p "$out"
rm -f "$out"/*--*.json "$out"/*--*.hdr "$out"/*--*.log
start_lepus
find_rabbitmq
brokers=(lepus "$LEPUS_URL")
[[ -n $RABBIT_URL ]] && brokers+=(rabbitmq "$RABBIT_URL")
for threads in 1 5 25; do
  for ((i = 0; i < ${#brokers[@]}; i += 2)); do
    broker=${brokers[i]} url=${brokers[i + 1]}
    step=threads-$(printf %02d "$threads")
    log "$step on $broker"
    measured "$out/$step--$broker" "$LEPUS_BIN" perf client --url "$url" --warmup "$WARMUP_S" --duration "$DURATION_S" \
      --persistent --producers "$threads" --consumers "$threads" --batch-size 1-10 --ack-every 1-10 --prefetch 100 \
      --json "$out/$step--$broker.json" --hdr "$out/$step--$broker.hdr" "queue://lepus-bench-replicated-$$" >/dev/null
  done
done
python3 "$BENCH_DIR/summarize.py" "Replicated-queue methodology (sync batches 1-10, confirms): Lepus vs RabbitMQ" "$out" "$RESULTS/replicated.md"
for threads in 01 05 25; do
  "$LEPUS_BIN" bench report --output "$out/report-threads-$threads" --title "Sync batches 1-10 with confirms, $threads threads: Lepus vs RabbitMQ" \
    "$out/threads-$threads--lepus.json" $(ls "$out/threads-$threads--rabbitmq.json" 2>/dev/null) >/dev/null
done
