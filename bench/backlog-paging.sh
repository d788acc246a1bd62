#!/usr/bin/env bash
# Lepus's paging and recovery with a backlog far larger than its memory window (issue 3):
#   1. a producer publishes persistent 1 KiB messages at a fixed rate into a durable queue with no
#      consumer until ~10 GB accumulate, while the broker's RSS is sampled every second;
#   2. the broker is stopped (SIGTERM), the page cache dropped, and the time to accept
#      connections again with the backlog measured;
#   3. a consumer drains the whole backlog, RSS sampled again.
# Writes bench/results/backlog-paging/ (perf JSON, logs, RSS samples) and bench/results/backlog-paging.md.
# RATE, DURATION_S and MESSAGE_BYTES change the size (defaults: 110,000 msg/s for 95 s of 1 KiB).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
RATE=${RATE:-110000}
DURATION_S=${DURATION_S:-95}
MESSAGE_BYTES=${MESSAGE_BYTES:-1024}
out=$root/bench/results/backlog-paging
mkdir -p "$out"
cargo build --release --quiet
lepus=$root/target/release/lepus
data=$(mktemp -d /tmp/lepus-backlog-XXXXXX)
port=5694
url="amqp://guest:guest@127.0.0.1:$port/"
broker_pid=""
cleanup() { [[ -n $broker_pid ]] && kill "$broker_pid" 2>/dev/null; rm -rf "$data"; }
trap cleanup EXIT

# "Accepting" is the answer to the protocol header (the port is bound before recovery).
source "$(dirname "${BASH_SOURCE[0]}")/amqp-accepting.sh"
start_broker() { # LOG
  "$lepus" server --data-dir "$data/data" --amqp-port $port --bind 127.0.0.1 --http-port 0 --metrics-port 0 --stream-port 0 >"$1" 2>&1 &
  broker_pid=$!
  wait_for_connection_start "$port"
}
sample_rss() { # FILE: "seconds rss_kib data_mib" every second while the broker runs
  while kill -0 "$broker_pid" 2>/dev/null; do
    echo "$(date +%s) $(awk '/VmRSS/{print $2}' /proc/$broker_pid/status 2>/dev/null) $(du -sm "$data/data" 2>/dev/null | cut -f1)"
    sleep 1
  done >"$1"
}
stop_broker() { kill -TERM "$broker_pid"; wait "$broker_pid" || true; broker_pid=""; }

start_broker "$out/build-broker.log"
sample_rss "$out/build-rss.txt" &
"$lepus" perf producer --url "$url" --durable --persistent --message-size "$MESSAGE_BYTES" --rate "$RATE" --max-pending 1000 \
  --warmup 0 --duration "$DURATION_S" --keep --json "$out/build.json" queue://backlog >"$out/build.txt" 2>&1
sleep 2
stop_broker
backlog_mib=$(du -sm "$data/data" | cut -f1)

sync
echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped: not root)"
restart_start=$(date +%s.%N)
start_broker "$out/restart-broker.log"
restart_s=$(python3 -c "import time,sys; print(round(time.time() - float(sys.argv[1]), 2))" "$restart_start")
rss_after_recovery=$(awk '/VmRSS/{print $2}' /proc/$broker_pid/status)
sample_rss "$out/drain-rss.txt" &
published=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['sent'])" "$out/build.json")
"$lepus" perf consumer --url "$url" --durable --prefetch 1000 --warmup 0 --duration 600 --message-count "$published" \
  --json "$out/drain.json" queue://backlog >"$out/drain.txt" 2>&1
stop_broker

python3 - "$out" "$RATE" "$MESSAGE_BYTES" "$backlog_mib" "$restart_s" "$rss_after_recovery" <<'PY'
import json, sys, os
out, rate, size, backlog_mib, restart_s, rss_recovered = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
build = json.load(open(os.path.join(out, "build.json")))
drain = json.load(open(os.path.join(out, "drain.json")))
def peak(name):
    values = [int(line.split()[1]) for line in open(os.path.join(out, name)) if len(line.split()) >= 2 and line.split()[1].isdigit()]
    return max(values) if values else 0
def series(report, key):
    return [point.get(key, 0) for point in report.get("intervals", [])]
sent = series(build, "sent_per_sec")
received = [r for r in series(drain, "received_per_sec") if r > 0]
low = int(min(sent[1:-1])) if len(sent) > 2 else 0
lines = [
    "# Backlog beyond memory: paging and recovery (Lepus)",
    "",
    "`bench/backlog-paging.sh` on this 2-core machine; producer and consumer (`lepus perf`) on the same machine.",
    "Persistent %d B messages into one durable queue, `--sync always` (fdatasync before every confirm)." % size,
    "",
    "| measure | value |",
    "|---|---:|",
    "| target publish rate | %s msg/s |" % f"{rate:,}",
    "| published (confirmed) | %s messages in %.0f s |" % (f"{build['summary']['sent']:,}", build['summary'].get('measured_s', 0)),
    "| publish rate while the backlog built, mean | %s msg/s |" % f"{int(build['summary']['sent_per_sec']):,}",
    "| publish rate while the backlog built, lowest second | %s msg/s (%.1f%% of target) |" % (f"{low:,}", 100.0 * low / rate if rate else 0),
    "| backlog on disk | %s MiB |" % f"{backlog_mib:,}",
    "| broker RSS, peak while building | %s MiB |" % f"{peak('build-rss.txt') // 1024:,}",
    "| restart with the backlog, cold page cache, until accepting | %s s |" % restart_s,
    "| broker RSS right after recovery | %s MiB |" % f"{rss_recovered // 1024:,}",
    "| drained | %s messages |" % f"{drain['summary']['received']:,}",
    "| drain rate, mean over seconds with deliveries | %s msg/s (%.1fx the publish rate) |" % (f"{int(sum(received) / len(received)) if received else 0:,}", (sum(received) / len(received)) / rate if received and rate else 0),
    "| broker RSS, peak while draining | %s MiB |" % f"{peak('drain-rss.txt') // 1024:,}",
    "",
    "send-ack latency while building (us): p50 %.0f, p99 %.0f, p99.9 %.0f, max %.0f." % tuple((build["summary"].get("send_ack_latency_us") or {}).get(k, 0) for k in ("p50_us", "p99_us", "p99_9_us", "max_us")),
]
open(os.path.join(os.path.dirname(out), "backlog-paging.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
