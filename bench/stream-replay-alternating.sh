#!/usr/bin/env bash
# Alternating replays of one stream by two builds on the same data directory: fills it with the
# second build (COUNT messages of 1 KiB), then three rounds of: start a build, drop the page cache
# (root), replay cold, replay warm, stop. Usage: [COUNT=3000000] bench/stream-replay-alternating.sh BEFORE AFTER
set -euo pipefail
count=${COUNT:-3000000}; size=1024; d=/tmp/sr; rm -rf $d; mkdir -p $d
before=${1:?the before build}; after=${2:?the after build}; L=$after
start() { "$1" server --data-dir $d/data --amqp-port 5810 --http-port 0 --metrics-port 0 --bind 127.0.0.1 --stream-port 5811 --stream-advertised-host 127.0.0.1 >>$d/log 2>&1 & pid=$!; for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/5811) 2>/dev/null && break; sleep 0.1; done; sleep 0.5; }
stop() { kill $pid; wait $pid || true; }
U=rabbitmq-stream://guest:guest@127.0.0.1:5811/%2f
start $L; $L perf producer --protocol stream --url $U --message-size $size --message-count $count --max-pending 10000 --quiet stream://r >/dev/null; stop
replay() { local label=$1 b r t0 t1; b=$(awk '{print $14+$15}' /proc/$pid/stat); t0=$(date +%s.%N)
  $L perf consumer --protocol stream --url $U --stream-offset first --stream-credit 32 --message-count $count --message-size $size --quiet stream://r >/dev/null
  t1=$(date +%s.%N); a=$(awk '{print $14+$15}' /proc/$pid/stat); gb=$(echo "$count*$size/1000000000" | bc -l)
  printf '%-8s %-5s %.2f GB/s  broker CPU %.3f s/GB  load %s\n' "$2" "$label" "$(echo "$gb/($t1-$t0)" | bc -l)" "$(echo "($a-$b)/100/$gb" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"; }
for round in 1 2 3; do for bin in "$before" "$after"; do
  name=$( [ "$bin" = "$after" ] && echo after || echo before )
  start $bin; sync; echo 3 > /proc/sys/vm/drop_caches; replay cold $name; replay warm $name; stop
done; done
rm -rf $d
