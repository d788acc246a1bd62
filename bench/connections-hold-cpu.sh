#!/usr/bin/env bash
# Broker CPU over MEASURE_S with COUNT idle amqp091-go connections (bench/connections/main.go) holding
# heartbeats, no probe: the quick form of bench/connections.sh used for before/after alternation
# (bench/results/connections.md). Usage: bench/connections-hold-cpu.sh BIN COUNT MEASURE_S [stat|perf]
# Environment: HEARTBEAT_S (10), HTTP_PORT (0: no management API). "stat" counts syscalls with perf stat.
set -euo pipefail
BIN=$1 COUNT=$2 MEASURE_S=$3 PERF=${4:-}
export PATH="/usr/local/go/bin:$PATH"
HOLDER=${HOLDER:-$(mktemp -u /tmp/lepus-holder.XXXXXX)}
(cd "$(dirname "${BASH_SOURCE[0]}")/connections" && go build -o "$HOLDER" .)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
data=$(mktemp -d /tmp/lepus-hold-data.XXXXXX)
LEPUS_LOG=warn "$BIN" server --data-dir "$data" --amqp-port "$port" --bind 127.0.0.1 --http-port ${HTTP_PORT:-0} --metrics-port 0 --stream-port 0 --connection-max $((COUNT+16)) >"$data.server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; kill $hpid 2>/dev/null; wait; rm -rf "$data" "$data.server.log" "$HOLDER"' EXIT
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
coproc H { $HOLDER -url amqp://guest:guest@127.0.0.1:$port/ -count $COUNT -heartbeat ${HEARTBEAT_S:-10}s -hold $((MEASURE_S+20))s; }
hpid=$H_PID
while read -r line <&"${H[0]}"; do
  echo "  $line"
  if [[ $line == "barrier: all open" ]]; then break; fi
done
echo >&"${H[1]}"
sleep 12
hz=$(getconf CLK_TCK)
t0=$(awk '{ print $14 + $15 }' /proc/$pid/stat)
if [[ $PERF == stat ]]; then perf stat -e syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,context-switches,task-clock -p $pid -o "${STAT_OUT:-/tmp/lepus-hold-stat.txt}" -- sleep $MEASURE_S; elif [[ -n $PERF ]]; then perf record -F 999 -g -p $pid -o "${PERF_OUT:-/tmp/lepus-hold-perf.data}" -- sleep $MEASURE_S 2>/dev/null; else sleep $MEASURE_S; fi
t1=$(awk '{ print $14 + $15 }' /proc/$pid/stat)
echo "$(basename $BIN) count=$COUNT: broker CPU $(( (t1-t0)*1000/hz )) ms over ${MEASURE_S}s = $(( (t1-t0)*1000*60/hz/MEASURE_S )) ms/min; rss $(awk '/VmRSS/{print $2}' /proc/$pid/status) KiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
