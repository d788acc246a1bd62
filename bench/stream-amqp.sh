#!/bin/bash
# Used for bench/results/stream-amqp.md: stream queues over AMQP 0-9-1, Lepus beside a running
# RabbitMQ node (RPID: the pid of its beam.smp, whose CPU time is read over each of its runs),
# alternating, in one sitting:
#   1. publish with confirms, 1 producer and 1 consumer (from `next`), 16 B and 1 KiB messages:
#      lepus perf client --queue-type stream --persistent --max-pending 1000 --message-size SIZE
#   2. a reader replaying a large stream from `first` (REPLAY_MB of 1 KiB messages published
#      beforehand): lepus perf consumer --queue-type stream --stream-offset first --message-count N
# Each Lepus run starts its own broker on a fresh data directory (its CPU is over its whole life);
# RabbitMQ's CPU is over the client's run. Prints msg/s, ns of broker CPU per message and, for the
# replay, MB/s and broker CPU seconds per GB, with the load average.
# Usage: RPID=PID bench/stream-amqp.sh LEPUS_BIN RMQ_PORT OUTDIR [DURATION_S] [RUNS] [REPLAY_MB]
set -u
BIN=$1 RPORT=$2 OUT=$3 DURATION=${4:-10} RUNS=${5:-3} REPLAY_MB=${6:-1024}
mkdir -p "$OUT"
rpid=${RPID:?set RPID to the RabbitMQ node\'s beam.smp pid}
hz=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' /proc/$1/stat; }
load() { cut -d' ' -f1 /proc/loadavg; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
completed() { sed -n 's/^sent .*| completed \([0-9]*\) (\([0-9]*\) msg.*/\1 \2/p' "$1"; }
received() { sed -n 's/^.*| received \([0-9]*\) (\([0-9]*\) msg.*/\1 \2/p' "$1" | tail -1; }

start_lepus() {
  port=$(free_port)
  data=$(mktemp -d /tmp/lepus-stream-bench-XXXXXX)
  LEPUS_LOG=warn $BIN server --data-dir "$data" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 >/dev/null 2>&1 &
  srv=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
}
stop_lepus() { kill "$srv"; wait "$srv" 2>/dev/null; rm -rf "$data"; }

publish_run() { # LABEL URL QUEUE SIZE FILE
  $BIN perf client --url "$2" --queue-type stream --persistent --max-pending 1000 --message-size "$4" \
    --duration "$DURATION" "queue://$3" >"$5" 2>&1
}

for size in 16 1024; do
  for run in $(seq 1 "$RUNS"); do
    start_lepus
    publish_run lepus "amqp://guest:guest@127.0.0.1:$port/" s "$size" "$OUT/publish-$size-lepus-$run.out"
    t=$(ticks "$srv"); stop_lepus
    set -- $(completed "$OUT/publish-$size-lepus-$run.out")
    echo "publish $size B run $run lepus: ${2:-0} msg/s, $(( t * 1000000000 / hz / ${1:-1} )) ns CPU/msg (load $(load))"
    t0=$(ticks "$rpid")
    publish_run rabbitmq "amqp://guest:guest@127.0.0.1:$RPORT/" "s-$size-$run" "$size" "$OUT/publish-$size-rabbitmq-$run.out"
    t1=$(ticks "$rpid")
    set -- $(completed "$OUT/publish-$size-rabbitmq-$run.out")
    echo "publish $size B run $run rabbitmq: ${2:-0} msg/s, $(( (t1 - t0) * 1000000000 / hz / ${1:-1} )) ns CPU/msg (load $(load))"
  done
done

# Replay: fill a stream, then read it all from `first`.
count=$(( REPLAY_MB * 1024 ))
replay() { # LABEL URL QUEUE PID
  $BIN perf producer --url "$2" --queue-type stream --persistent --max-pending 1000 --message-size 1024 \
    --message-count "$count" "queue://$3" >"$OUT/replay-fill-$1.out" 2>&1
  local before started elapsed after
  before=$(ticks "$4"); started=$(date +%s.%N)
  $BIN perf consumer --url "$2" --queue-type stream --stream-offset first --prefetch 2000 --ack-every 500 \
    --message-count "$count" "queue://$3" >"$OUT/replay-$1.out" 2>&1
  elapsed=$(echo "$(date +%s.%N) - $started" | bc); after=$(ticks "$4")
  python3 - "$1" "$count" "$elapsed" "$(( after - before ))" "$hz" "$(load)" <<'EOF'
import sys
label, count, elapsed, cpu_ticks, hz, load = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
gb = count * 1024 / 1e9
cpu_s = cpu_ticks / hz
print("replay %s: %d messages of 1 KiB (%.2f GB) in %.1f s: %.0f msg/s, %.0f MB/s, %.1f s broker CPU per GB (load %s)"
      % (label, count, gb, elapsed, count / elapsed, gb * 1000 / elapsed, cpu_s / gb, load))
EOF
}
start_lepus
replay lepus "amqp://guest:guest@127.0.0.1:$port/" replay "$srv"
stop_lepus
replay rabbitmq "amqp://guest:guest@127.0.0.1:$RPORT/" "replay-$$" "$rpid"
