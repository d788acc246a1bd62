#!/usr/bin/env bash
# Instructions per message of the broker on the safe-mode path, counted by valgrind's callgrind:
# repeatable while other work loads the machine, where wall-clock rates are not.
#
# The broker runs under callgrind with instrumentation off; once it listens, it is switched on
# (callgrind_control -i on), `lepus perf client` (natively, outside valgrind) publishes and consumes
# MESSAGES messages (1 producer, 1 consumer, persistent, durable queue, confirms, manual acks), the
# profile is dumped and the broker stopped. Instructions per message = the dumped total / MESSAGES:
# connection setup and teardown of the perf client are included (a fixed cost, under 0.5 % at
# 100,000 messages). Under valgrind the broker runs ~50x slower than natively, so it is always the
# bottleneck: every socket read is full and batches are as large as `--max-pending` lets them be,
# which is the saturated regime the throughput runs measure too.
#
# Usage: bench/callgrind-per-message.sh LEPUS_BIN [OUT_DIR]
# Environment: MESSAGES (100000), SIZE (16), MAX_PENDING (1000), PERF_BIN (LEPUS_BIN),
#              QUEUE_ARGS (the queue's arguments, as `lepus perf --queue-args` takes them).
# Prints: `<size> B: <instructions> Ir over <messages> messages = <Ir per message> Ir/msg`, and
# leaves callgrind.out (for callgrind_annotate) and the perf client's output in OUT_DIR.
set -euo pipefail
BIN=$(realpath "$1")
OUT_DIR=${2:-$(mktemp -d /tmp/lepus-callgrind.XXXXXX)}
MESSAGES=${MESSAGES:-100000} SIZE=${SIZE:-16} MAX_PENDING=${MAX_PENDING:-1000} PERF_BIN=${PERF_BIN:-$BIN}
mkdir -p "$OUT_DIR"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
data_dir=$(mktemp -d /tmp/lepus-callgrind-data.XXXXXX)
LEPUS_LOG=warn valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT_DIR/callgrind.out" \
  "$BIN" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 \
  >"$OUT_DIR/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$data_dir"' EXIT
for _ in $(seq 1 600); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
callgrind_control -i on "$server" >/dev/null
"$PERF_BIN" perf client --url "amqp://guest:guest@127.0.0.1:$port/" --persistent --durable --max-pending "$MAX_PENDING" \
  --message-size "$SIZE" --message-count "$MESSAGES" --drain-timeout 120 --quiet ${QUEUE_ARGS:+--queue-args "$QUEUE_ARGS"} queue://q \
  >"$OUT_DIR/perf.out" 2>&1
callgrind_control -d "$server" >/dev/null
callgrind_control -i off "$server" >/dev/null
kill "$server"; wait "$server" 2>/dev/null || true
trap 'rm -rf "$data_dir"' EXIT
received=$(sed -n 's/.*| received \([0-9]*\) (.*/\1/p' "$OUT_DIR/perf.out")
# The dump taken by callgrind_control is the file with a part number; sum its totals.
instructions=$(cat "$OUT_DIR"/callgrind.out.* 2>/dev/null | sed -n 's/^summary: \([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
echo "$SIZE B: $instructions Ir over ${received:-0} messages received = $(( instructions / ${received:-1} )) Ir/msg (out: $OUT_DIR)"
