#!/usr/bin/env bash
# The per-message budget of the broker on the safe-mode path, natively (no valgrind): for a fixed
# number of messages (1 producer, 1 consumer, persistent, durable queue, confirms after fdatasync,
# manual acks), the broker's CPU time, its syscalls by kind (perf's syscall tracepoints, counted
# in the kernel: no strace slowdown), context switches, and a flat `perf record` profile.
# Everything is divided by the messages received. Needs root (or perf_event_paranoid <= -1) for the
# tracepoints; hardware counters are not needed (the sampling uses the cpu-clock event).
#
# Usage: bench/hotpath-profile.sh LEPUS_BIN [OUT_DIR]
# Environment: MESSAGES (500000), SIZE (16), MAX_PENDING (1000), PERF_BIN (LEPUS_BIN),
#              PROFILE (1: also perf record; 0: counts only).
set -euo pipefail
BIN=$(realpath "$1")
OUT_DIR=${2:-$(mktemp -d /tmp/lepus-profile.XXXXXX)}
MESSAGES=${MESSAGES:-500000} SIZE=${SIZE:-16} MAX_PENDING=${MAX_PENDING:-1000} PERF_BIN=${PERF_BIN:-$BIN} PROFILE=${PROFILE:-1}
mkdir -p "$OUT_DIR"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
data_dir=$(mktemp -d /tmp/lepus-profile-data.XXXXXX)
LEPUS_LOG=warn "$BIN" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 \
  >"$OUT_DIR/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$data_dir"' EXIT
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
syscalls=read,write,readv,writev,recvfrom,sendto,pwrite64,fdatasync,futex,epoll_wait,sched_yield
events=$(echo "$syscalls" | tr ',' '\n' | sed 's/^/syscalls:sys_enter_/' | paste -sd,)
perf stat -e "$events,context-switches,task-clock" -p "$server" -o "$OUT_DIR/stat.txt" &
stat=$!
if [[ $PROFILE == 1 ]]; then
  perf record -F 1999 -p "$server" -o "$OUT_DIR/perf.data" >/dev/null 2>&1 &
  record=$!
fi
ticks_before=$(awk '{ print $14 + $15 }' "/proc/$server/stat")
"$PERF_BIN" perf client --url "amqp://guest:guest@127.0.0.1:$port/" --persistent --durable --max-pending "$MAX_PENDING" \
  --message-size "$SIZE" --message-count "$MESSAGES" --quiet queue://q >"$OUT_DIR/perf.out" 2>&1
ticks_after=$(awk '{ print $14 + $15 }' "/proc/$server/stat")
kill -INT "$stat"; wait "$stat" 2>/dev/null || true
if [[ $PROFILE == 1 ]]; then
  kill -INT "$record"; wait "$record" 2>/dev/null || true
  perf report -i "$OUT_DIR/perf.data" --no-children --sort symbol --stdio 2>/dev/null | grep -v '^#' | grep '%' | head -60 >"$OUT_DIR/profile.txt" || true
fi
received=$(sed -n 's/.*| received \([0-9]*\) (.*/\1/p' "$OUT_DIR/perf.out")
received=${received:-0}
{
  echo "messages received: $received ($(sed -n 's/.*| received [0-9]* (\([0-9]*\) msg\/s).*/\1/p' "$OUT_DIR/perf.out") msg/s), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "broker CPU: $(( (ticks_after - ticks_before) * 1000000000 / $(getconf CLK_TCK) / (received > 0 ? received : 1) )) ns/msg (utime + stime over the run)"
  awk -v n="$received" '/syscalls:sys_enter_|context-switches/ { gsub(",", "", $1); name = $2; sub("syscalls:sys_enter_", "", name);
    printf "%-18s %10d  %.4f per message\n", name, $1, (n > 0 ? $1 / n : 0) }' "$OUT_DIR/stat.txt"
} | tee "$OUT_DIR/budget.txt"
