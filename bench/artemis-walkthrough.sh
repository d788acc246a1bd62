#!/usr/bin/env bash
# Scenario 1, the ActiveMQ Artemis perf-tools walkthrough, on Lepus and RabbitMQ side by side:
#   max-rate  1 producer / 1 consumer on a queue, all-out, --max-pending 100
#   rate-30   the same at 30% of the maximum the broker just reached (open loop, --rate)
#   topics    10 durable topics, 3 producers and 2 durable subscribers each
# Persistent messages throughout. Writes bench/results/artemis/ (JSON, HDR logs, charts) and
# bench/results/artemis.md. WARMUP_S and DURATION_S shorten or lengthen each run.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
WARMUP_S=${WARMUP_S:-5}
DURATION_S=${DURATION_S:-20}
out=$RESULTS/artemis
mkdir -p "$out"
rm -f "$out"/*--*.json "$out"/*--*.hdr "$out"/*--*.log
start_lepus
find_rabbitmq
brokers=(lepus "$LEPUS_URL")
[[ -n $RABBIT_URL ]] && brokers+=(rabbitmq "$RABBIT_URL")

run() { # STEP BROKER URL ARGS...
  local step=$1 broker=$2 url=$3; shift 3
  log "$step on $broker"
  measured "$out/$step--$broker" "$LEPUS_BIN" perf client --url "$url" --warmup "$WARMUP_S" --duration "$DURATION_S" \
    --persistent --show-latency --json "$out/$step--$broker.json" --hdr "$out/$step--$broker.hdr" "$@" >/dev/null
}

for ((i = 0; i < ${#brokers[@]}; i += 2)); do
  broker=${brokers[i]} url=${brokers[i + 1]}
  run max-rate "$broker" "$url" --max-pending 100 "queue://lepus-bench-artemis-$$"
  max=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['completed_per_sec'])" "$out/max-rate--$broker.json")
  rate=$(python3 -c "import sys; print(max(1, round(float(sys.argv[1]) * 0.3)))" "$max")
  run rate-30 "$broker" "$url" --max-pending 100 --rate "$rate" "queue://lepus-bench-artemis-$$"
  run topics "$broker" "$url" --max-pending 100 --producers 3 --consumers 2 --num-destinations 10 --durable \
    "topic://lepus-bench-artemis-topic-$$-"
done
python3 "$BENCH_DIR/summarize.py" "Artemis perf walkthrough: Lepus vs RabbitMQ" "$out" "$RESULTS/artemis.md"
for step in max-rate rate-30 topics; do
  "$LEPUS_BIN" bench report --output "$out/report-$step" --title "Artemis perf walkthrough: $step, Lepus vs RabbitMQ" \
    "$out/$step--lepus.json" $(ls "$out/$step--rabbitmq.json" 2>/dev/null) >/dev/null
done
