#!/usr/bin/env bash
# Behaviour at overload (issue 17 item 2), Lepus and RabbitMQ side by side: offered rates from 50 %
# to 200 % of each broker's sustainable rate, one producer and one consumer (`lepus perf client`,
# persistent, durable queue, publisher confirms), runs alternating between the brokers so load on
# a shared machine hits both alike; medians per step.
#
# Per step and broker it reports: the offered rate, what the producer sent and what the consumer
# received while measuring (msg/s), the transfer p99 timed from each message's intended send time
# (open loop: the producer's own lag counts) and from its actual send (`--latency-from-sent`: what
# the broker adds), the producer's send-delay p99 (how far the broker slowed it), and the broker's
# CPU per message published (utime + stime of `lepus` / `beam.smp` from /proc over the run, divided
# by the messages sent). The two transfer figures come from two runs (the message carries one time).
#
# The sustainable rate is each broker's received rate of an all-out run with a confirm window of
# SUSTAIN_WINDOW (the median of RUNS runs), unless given as arguments.
#
# Usage: bench/overload.sh [LEPUS_RATE RABBITMQ_RATE]
# Environment: LEPUS_BIN (target/release/lepus; its `perf` drives both brokers), RUNS (3),
#   DURATION_S (8), WARMUP_S (2), WINDOW (the fixed confirm window of the curve, 100000),
#   SUSTAIN_WINDOW (1000), PREFETCH (the consumer's basic.qos, 1000), PERCENTS ("50 75 100 125 150 200"), SIZE (16), BROKERS ("lepus rabbitmq"),
#   RESULTS (bench/results/overload), LEPUS_PORT (25690), RABBITMQ_PORT (25692; its distribution port
#   is the next one).
# RabbitMQ is a private node (bench/rabbitmq-node.sh), started once and stopped at the end.
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
LEPUS_BIN=${LEPUS_BIN:-$REPO_DIR/target/release/lepus}
RESULTS=${RESULTS:-$BENCH_DIR/results/overload}
RUNS=${RUNS:-3} DURATION_S=${DURATION_S:-8} WARMUP_S=${WARMUP_S:-2} WINDOW=${WINDOW:-100000}
SUSTAIN_WINDOW=${SUSTAIN_WINDOW:-1000} PREFETCH=${PREFETCH:-1000} PERCENTS=${PERCENTS:-50 75 100 125 150 200} SIZE=${SIZE:-16}
BROKERS=${BROKERS:-lepus rabbitmq} LEPUS_PORT=${LEPUS_PORT:-25690} RABBITMQ_PORT=${RABBITMQ_PORT:-25692}
mkdir -p "$RESULTS"
[[ -x $LEPUS_BIN ]] || { echo "LEPUS_BIN=$LEPUS_BIN is not executable" >&2; exit 1; }

LEPUS_PID="" RABBITMQ_STARTED=""
cleanup() {
  if [[ -n $LEPUS_PID ]]; then kill "$LEPUS_PID" 2>/dev/null || true; wait "$LEPUS_PID" 2>/dev/null || true; fi
  if [[ -n $RABBITMQ_STARTED ]]; then rabbitmq_stop; fi
}
trap cleanup EXIT

if [[ " $BROKERS " == *" rabbitmq "* ]]; then
  # shellcheck source=bench/rabbitmq-node.sh
  source "$BENCH_DIR/rabbitmq-node.sh"
  rm -rf /tmp/lepus-overload-rabbitmq
  mkdir -p /tmp/lepus-overload-rabbitmq
  # Fixed ports, below the ephemeral range the perf clients' sockets use.
  echo "$RABBITMQ_PORT $((RABBITMQ_PORT + 1)) lepus-overload-$$@localhost" >/tmp/lepus-overload-rabbitmq/ports
  echo "[]." >/tmp/lepus-overload-rabbitmq/enabled_plugins
  rabbitmq_start /tmp/lepus-overload-rabbitmq
  RABBITMQ_STARTED=yes
fi

# start_lepus: a fresh broker and data directory for each run (sets LEPUS_PID, LEPUS_DATA).
start_lepus() {
  LEPUS_DATA=$(mktemp -d /tmp/lepus-overload.XXXXXX)
  LEPUS_LOG=warn "$LEPUS_BIN" server --data-dir "$LEPUS_DATA" --amqp-port "$LEPUS_PORT" --bind 127.0.0.1 \
    --http-port 0 --metrics-port 0 --stream-port 0 >>"$RESULTS/lepus-server.log" 2>&1 &
  LEPUS_PID=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$LEPUS_PORT") 2>/dev/null && return 0; sleep 0.1; done
  echo "lepus did not listen on $LEPUS_PORT" >&2; exit 1
}
stop_lepus() { kill "$LEPUS_PID"; wait "$LEPUS_PID" 2>/dev/null || true; LEPUS_PID=""; rm -rf "$LEPUS_DATA"; }

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# run_once BROKER LABEL PERF_OPTIONS...: one perf run; writes LABEL.json, LABEL.out and LABEL.cpu
# (broker CPU ticks over the run).
run_once() {
  local broker=$1 label=$2 url pid before
  shift 2
  if [[ $broker == lepus ]]; then
    start_lepus; url="amqp://guest:guest@127.0.0.1:$LEPUS_PORT/"; pid=$LEPUS_PID
  else
    url=$RABBITMQ_AMQP_URL; pid=$RABBITMQ_BEAM_PID
  fi
  before=$(cpu_ticks "$pid")
  "$LEPUS_BIN" perf client --url "$url" --persistent --durable --message-size "$SIZE" --warmup "$WARMUP_S" \
    --duration "$DURATION_S" --prefetch "$PREFETCH" --json "$RESULTS/$label.json" "$@" queue://overload >"$RESULTS/$label.out" 2>&1 || true
  echo "$(( $(cpu_ticks "$pid") - before )) $(getconf CLK_TCK) $(cut -d' ' -f1 /proc/loadavg)" >"$RESULTS/$label.cpu"
  if [[ $broker == lepus ]]; then stop_lepus; fi
}

# The sustainable rates: given, or the median received rate of all-out runs.
declare -A SUSTAINABLE
if [[ $# -ge 2 ]]; then
  SUSTAINABLE[lepus]=$1 SUSTAINABLE[rabbitmq]=$2
else
  for run in $(seq 1 "$RUNS"); do
    for broker in $BROKERS; do run_once "$broker" "$broker-allout-$run" --max-pending "$SUSTAIN_WINDOW"; done
  done
  for broker in $BROKERS; do
    SUSTAINABLE[$broker]=$(python3 - "$RESULTS" "$broker" "$RUNS" <<'PY'
import json, statistics, sys
results, broker, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
rates = []
for run in range(1, runs + 1):
    summary = json.load(open(f"{results}/{broker}-allout-{run}.json"))["summary"]
    rates.append(summary["sustained"]["received_while_measuring"] / summary["measured_s"])
print(int(statistics.median(rates)))
PY
)
  done
fi
for broker in $BROKERS; do echo "sustainable $broker: ${SUSTAINABLE[$broker]} msg/s" | tee -a "$RESULTS/sustainable.txt"; done

# The curve: each step, each run, both latency modes, brokers alternating.
for percent in $PERCENTS; do
  for run in $(seq 1 "$RUNS"); do
    for mode in intended sent; do
      for broker in $BROKERS; do
        rate=$(( SUSTAINABLE[$broker] * percent / 100 ))
        extra=()
        [[ $mode == sent ]] && extra=(--latency-from-sent)
        run_once "$broker" "$broker-$percent-$mode-$run" --rate "$rate" --max-pending "$WINDOW" "${extra[@]}"
        echo "[$(date +%H:%M:%S)] $broker $percent % ($rate msg/s) $mode run $run done (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
      done
    done
  done
done

python3 - "$RESULTS" "$RUNS" "$PERCENTS" "$BROKERS" <<'PY' | tee "$RESULTS/overload.txt"
import json, statistics, sys
results, runs, percents, brokers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()

def run(broker, percent, mode, number):
    label = f"{results}/{broker}-{percent}-{mode}-{number}"
    report = json.load(open(label + ".json"))
    summary = report["summary"]
    ticks, hz, load = open(label + ".cpu").read().split()
    sent_total = sum(i["sent_per_sec"] * i["interval_s"] for i in report["intervals"])
    p99 = lambda name: (summary.get(name) or {}).get("p99_us", float("nan")) / 1000
    return {
        "offered": report["config"].get("rate_per_sec"),
        "sent": summary["sent_per_sec"],
        "delivered": summary["sustained"]["received_while_measuring"] / summary["measured_s"],
        "transfer_p99_ms": p99("transfer_latency_us"),
        "send_delay_p99_ms": p99("send_delay_us"),
        "cpu_us_per_msg": int(ticks) / int(hz) * 1e6 / max(sent_total, 1),
        "load": float(load),
    }

def median(rows, key):
    return statistics.median(row[key] for row in rows)

print(f"| broker | offered % | offered msg/s | sent msg/s | delivered msg/s | delivered/sent | transfer p99 from intended send (ms) | transfer p99 from actual send (ms) | send-delay p99 (ms) | broker CPU us/msg | load (1 min) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for broker in brokers:
    for percent in percents:
        intended = [run(broker, percent, "intended", n) for n in range(1, runs + 1)]
        sent = [run(broker, percent, "sent", n) for n in range(1, runs + 1)]
        both = intended + sent
        loads = sorted(row["load"] for row in both)
        print(f"| {broker} | {percent} | {intended[0]['offered']:,.0f} | {median(both, 'sent'):,.0f} | {median(both, 'delivered'):,.0f} "
              f"| {median(both, 'delivered') / max(median(both, 'sent'), 1) * 100:.0f} % | {median(intended, 'transfer_p99_ms'):,.1f} "
              f"| {median(sent, 'transfer_p99_ms'):,.1f} | {median(sent, 'send_delay_p99_ms'):,.1f} | {median(both, 'cpu_us_per_msg'):.2f} "
              f"| {loads[0]:.1f}-{loads[-1]:.1f} |")
PY
