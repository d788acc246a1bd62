#!/usr/bin/env bash
# Protocol abuse under load, full form (issue 15 item 6): IDLE idle connections (10,000) plus every
# other abuser of interop/python/abusive_clients.py (clients silent before the handshake, half
# frames then a hang or a disconnect, a slow consumer without prefetch, a publisher flooding with
# confirms it never reads, random bytes instead of and after the handshake), while a well-behaved
# client's round trip (publish with confirm -> delivery, one in flight) is measured alone for
# QUIET_S and then under the abuse (until the idle connections are open, then HOLD_S more).
# Against a fresh Lepus broker each run and, when given, a RabbitMQ node, alternating, RUNS times.
# Prints each run's report (one JSON line) and then the medians per broker: quiet and abused
# p50/p99, the broker's peak RSS and CPU seconds over the run. A run whose abusers did not get
# RabbitMQ's answer, or whose broker stopped answering, counts a failure; the script then exits 1.
#
# Usage: scripts/protocol-abuse.sh
# Environment:
#   LEPUS_BIN      the broker (default target/release/lepus), started with --memory-high-watermark-bytes
#                  LEPUS_WATERMARK_BYTES (1 GiB) and --connection-max IDLE + 500 (its default is half
#                  the descriptor limit less 128: 9,872 under 20,000)
#   RABBITMQ_URL   a RabbitMQ node to run against as well (its process, for RSS and CPU, is the one
#                  listening on the URL's port); or RABBITMQ=start for a private node of Debian's
#                  rabbitmq-server (bench/rabbitmq-node.sh, descriptor limit 20,000)
#   RUNS (3), IDLE (10000), QUIET_S (15), HOLD_S (15), RESULTS (a file for the JSON lines; default a
#   temporary one)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LEPUS_BIN=${LEPUS_BIN:-$root/target/release/lepus}
RUNS=${RUNS:-3} IDLE=${IDLE:-10000} QUIET_S=${QUIET_S:-15} HOLD_S=${HOLD_S:-15}
LEPUS_WATERMARK_BYTES=${LEPUS_WATERMARK_BYTES:-1073741824}
RESULTS=${RESULTS:-$(mktemp /tmp/lepus-protocol-abuse-XXXXXX.jsonl)}
python_dir=$root/interop/python
# The suite's venv (pika), made by its run.sh when missing.
[[ -x $python_dir/.venv/bin/python ]] || "$python_dir/run.sh" --version >/dev/null
python=$python_dir/.venv/bin/python
# Every idle connection is a descriptor of this shell's client too.
ulimit -n "$(ulimit -Hn)"

lepus_pid="" lepus_dir=""
cleanup() {
  if [[ -n $lepus_pid ]]; then kill "$lepus_pid" 2>/dev/null || true; wait "$lepus_pid" 2>/dev/null || true; fi
  [[ -z $lepus_dir ]] || rm -rf "$lepus_dir"
  if [[ -n ${RABBITMQ_NODE:-} ]]; then rabbitmq_stop || true; rm -rf "$rabbitmq_base"; fi
}
trap cleanup EXIT
if [[ ${RABBITMQ:-} == start ]]; then
  # shellcheck source=bench/rabbitmq-node.sh
  source "$root/bench/rabbitmq-node.sh"
  rabbitmq_base=$(mktemp -d /tmp/lepus-abuse-rabbitmq-XXXXXX)
  RABBITMQ_DESCRIPTORS=20000 rabbitmq_start "$rabbitmq_base"
  RABBITMQ_URL=$RABBITMQ_AMQP_URL
  echo "RabbitMQ $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null) node $RABBITMQ_NODE at $RABBITMQ_URL"
fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
listener_pid() { # listener_pid PORT: the process listening on it
  ss -Hltnp "sport = :$1" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
}

run_lepus() {
  local port
  port=$(free_port)
  lepus_dir=$(mktemp -d /tmp/lepus-abuse-XXXXXX)
  "$LEPUS_BIN" server --data-dir "$lepus_dir/data" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 \
    --stream-port 0 --memory-high-watermark-bytes "$LEPUS_WATERMARK_BYTES" --connection-max $((IDLE + 500)) \
    >"$lepus_dir/lepus.log" 2>&1 &
  lepus_pid=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  "$python" "$python_dir/abusive_clients.py" run --broker lepus --url "amqp://guest:guest@127.0.0.1:$port/" \
    --pid "$lepus_pid" --idle "$IDLE" --quiet-s "$QUIET_S" --hold-s "$HOLD_S" | tee -a "$RESULTS" || failed=1
  grep -i "panic\|resource alarm" "$lepus_dir/lepus.log" && failed=1
  kill "$lepus_pid"
  wait "$lepus_pid" || true
  lepus_pid=""
  rm -rf "$lepus_dir"
  lepus_dir=""
}

run_rabbitmq() {
  local port pid
  port=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.urlparse(sys.argv[1]).port or 5672)' "$RABBITMQ_URL")
  pid=$(listener_pid "$port")
  "$python" "$python_dir/abusive_clients.py" run --broker rabbitmq --url "$RABBITMQ_URL" ${pid:+--pid "$pid"} \
    --idle "$IDLE" --quiet-s "$QUIET_S" --hold-s "$HOLD_S" | tee -a "$RESULTS" || failed=1
  # The node closes the run's connections in the background; let it finish before the next run.
  sleep 10
}

failed=0
echo "protocol abuse: $RUNS runs, $IDLE idle connections, quiet ${QUIET_S} s, hold ${HOLD_S} s; $(uptime)"
for run in $(seq 1 "$RUNS"); do
  echo "== run $run: Lepus ($LEPUS_BIN)"
  run_lepus
  if [[ -n ${RABBITMQ_URL:-} ]]; then
    echo "== run $run: RabbitMQ ($RABBITMQ_URL)"
    run_rabbitmq
  fi
done
echo "after the runs: $(uptime); reports in $RESULTS"
"$python" "$python_dir/abusive_clients.py" summarize "$RESULTS"
exit "$failed"
