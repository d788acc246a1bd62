#!/usr/bin/env bash
# A consumer replaying a large stream from `first` (issue 13): fills a stream with COUNT messages
# of SIZE bytes over the stream protocol (`lepus perf producer --protocol stream`, confirms on),
# then replays it whole from `first` with `lepus perf consumer --protocol stream`, once with the
# page cache dropped (cold: disk speed) and once right after (warm: page-cache speed). Prints per
# replay the wall time, GB/s of stream read, the broker's CPU time (utime + stime from
# /proc/PID/stat) per GB and the bytes it read from the disk (/proc/PID/io read_bytes).
#
# Usage: [COUNT=10485760] [SIZE=1024] [LEPUS=target/release/lepus] bench/stream-replay.sh lepus
#        RABBITMQ_STREAM_URL=rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f RABBITMQ_PID=<beam.smp> \
#          bench/stream-replay.sh rabbitmq
# Dropping the page cache needs root (/proc/sys/vm/drop_caches); without it the cold run is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
broker=${1:?lepus or rabbitmq}
lepus=${LEPUS:-target/release/lepus}
count=${COUNT:-10485760}
size=${SIZE:-1024}
stream=replay-$size-$count-$$
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
if [[ $broker == lepus ]]; then
  data_dir=$(mktemp -d "${DATA_PARENT:-/tmp}/lepus-replay-XXXXXX")
  stream_port=$(free_port)
  "$lepus" server --data-dir "$data_dir" --amqp-port "$(free_port)" --http-port 0 --metrics-port 0 --bind 127.0.0.1 \
    --stream-port "$stream_port" --stream-advertised-host 127.0.0.1 >"$data_dir.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data_dir" "$data_dir.log"' EXIT
  url="rabbitmq-stream://guest:guest@127.0.0.1:$stream_port/%2f"
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$stream_port") 2>/dev/null && break; sleep 0.1; done
else
  url=${RABBITMQ_STREAM_URL:?the RabbitMQ node\'s stream URL}
  pid=${RABBITMQ_PID:?the RabbitMQ node\'s beam.smp pid}
fi
cpu_s() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$pid/stat"; }
read_bytes() { awk '/^read_bytes/ { print $2 }' "/proc/$pid/io"; }
echo "# $broker, $count messages of $size B; load $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $(date -u +%FT%TZ)"
start=$(date +%s.%N)
"$lepus" perf producer --protocol stream --url "$url" --message-size "$size" --message-count "$count" \
  --max-pending 10000 --quiet "stream://$stream" >/dev/null
echo "fill: $count messages in $(echo "$(date +%s.%N) - $start" | bc) s"
replay() {
  local label=$1 cpu_before read_before start elapsed cpu gb
  cpu_before=$(cpu_s); read_before=$(read_bytes); start=$(date +%s.%N)
  "$lepus" perf consumer --protocol stream --url "$url" --stream-offset first --stream-credit 32 \
    --message-count "$count" --message-size "$size" --quiet "stream://$stream" >/dev/null
  elapsed=$(echo "$(date +%s.%N) - $start" | bc)
  cpu=$(echo "$(cpu_s) - $cpu_before" | bc)
  gb=$(echo "$count * $size / 1000000000" | bc -l)
  printf '%-5s replay: %.2f GB of bodies in %.2f s = %.2f GB/s; broker CPU %.2f s = %.3f s per GB; read from disk %.2f GB; load %s\n' \
    "$label" "$gb" "$elapsed" "$(echo "$gb / $elapsed" | bc -l)" "$cpu" "$(echo "$cpu / $gb" | bc -l)" \
    "$(echo "($(read_bytes) - $read_before) / 1000000000" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
}
if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then replay cold; else echo "cold replay skipped: cannot drop the page cache"; fi
replay warm
