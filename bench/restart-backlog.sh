#!/usr/bin/env bash
# Restart with a backlog (issue 17 target 6): how long a broker takes from exec until it accepts
# connections, and how many bytes it reads from disk meanwhile, with a cold page cache.
#   1. (unless DATA_DIR holds one already) a producer fills one durable queue with persistent
#      1 KiB messages at RATE for DURATION_S seconds, then the broker stops (SIGTERM);
#   2. RUNS times: page cache dropped (root only), broker started, time until the AMQP port
#      accepts, /proc/PID/io read_bytes (disk) and rchar (all reads) at that moment, then stopped.
# Prints one line per run; KEEP=1 keeps the data directory (reuse it with DATA_DIR=... to compare
# two builds on the same backlog: LEPUS=path/to/other/lepus).
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-110000}
DURATION_S=${DURATION_S:-15}
MESSAGE_BYTES=${MESSAGE_BYTES:-1024}
RUNS=${RUNS:-3}
LEPUS=${LEPUS:-$(pwd)/target/release/lepus}
port=${PORT:-5697}
url="amqp://guest:guest@127.0.0.1:$port/"
data=${DATA_DIR:-}
made_here=0
if [[ -z $data ]]; then
  data=$(mktemp -d /tmp/lepus-restart-XXXXXX)
  made_here=1
fi
broker_pid=""
cleanup() {
  [[ -n $broker_pid ]] && kill "$broker_pid" 2>/dev/null
  if [[ $made_here == 1 && ${KEEP:-0} != 1 ]]; then rm -rf "$data"; fi
}
trap cleanup EXIT

# "Accepting" is the answer to the protocol header (the port is bound before recovery).
source "$(dirname "${BASH_SOURCE[0]}")/amqp-accepting.sh"
start_broker() { # LOG
  "$LEPUS" server --data-dir "$data/data" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 --stream-port 0 >"$1" 2>&1 &
  broker_pid=$!
  wait_for_connection_start "$port"
}
stop_broker() { kill -TERM "$broker_pid"; wait "$broker_pid" || true; broker_pid=""; }

if [[ ! -d $data/data ]]; then
  start_broker "$data/build-broker.log"
  "$LEPUS" perf producer --url "$url" --durable --persistent --message-size "$MESSAGE_BYTES" --rate "$RATE" --max-pending 1000 \
    --warmup 0 --duration "$DURATION_S" --keep queue://backlog >"$data/build.txt" 2>&1
  stop_broker
fi
echo "backlog: $(du -sm "$data/data" | cut -f1) MiB in $(find "$data/data" -name '*.seg' | wc -l) segments; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for run in $(seq 1 "$RUNS"); do
  sync
  echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped: not root)"
  started=$(date +%s.%N)
  start_broker "$data/restart-$run.log"
  accepted=$(date +%s.%N)
  read_bytes=$(awk '/^read_bytes/{print $2}' /proc/$broker_pid/io)
  rchar=$(awk '/^rchar/{print $2}' /proc/$broker_pid/io)
  cpu_ticks=$(awk '{print $14 + $15}' /proc/$broker_pid/stat)
  python3 -c "import sys; s, a, rb, rc, t = sys.argv[1:]; print('run %s: accepting after %.3f s, read_bytes %.1f MiB, rchar %.1f MiB, cpu %.2f s' % ('$run', float(a) - float(s), int(rb) / 2**20, int(rc) / 2**20, int(t) / 100))" \
    "$started" "$accepted" "$read_bytes" "$rchar" "$cpu_ticks"
  stop_broker
done
