#!/usr/bin/env bash
# Scenario 3, the backlog test, as OMB runs it: a fixed producer rate; consumers paused until the
# backlog holds consumerBacklogSizeGB; then drained (backlogDrainRatio) while producers go on.
# Runs bench/workloads/backlog-1gb.yaml through `lepus bench` on Lepus and RabbitMQ and writes OMB
# result files, charts and bench/results/backlog.md.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
WARMUP_S=${WARMUP_S:-10}
DURATION_S=${DURATION_S:-20}
WORKLOAD=${WORKLOAD:-$BENCH_DIR/workloads/backlog-1gb.yaml}
out=$RESULTS/backlog
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.log
start_lepus
find_rabbitmq
brokers=(lepus "$LEPUS_URL")
[[ -n $RABBIT_URL ]] && brokers+=(rabbitmq "$RABBIT_URL")
for ((i = 0; i < ${#brokers[@]}; i += 2)); do
  broker=${brokers[i]} url=${brokers[i + 1]}
  log "backlog on $broker"
  measured "$out/backlog--$broker" "$LEPUS_BIN" bench --url "$url" --persistent --period-s 5 \
    --warmup-s "$WARMUP_S" --duration-s "$DURATION_S" --output-dir "$out" "$WORKLOAD" >/dev/null
done
python3 "$BENCH_DIR/summarize_omb.py" "Backlog build and drain (OMB workload $(basename "$WORKLOAD"))" "$out" 5 "$RESULTS/backlog.md"
"$LEPUS_BIN" bench report --period-s 5 --output "$out/report" --title "Backlog build and drain" $(ls "$out"/*.json | grep -v '\.cpu\.json$') >/dev/null
