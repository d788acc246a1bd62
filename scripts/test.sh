#!/usr/bin/env bash
# Runs every Lepus test on a fresh machine: the Rust unit and property tests, then the interop
# suites that drive a real Lepus broker through real client libraries (Python pika, Go amqp091-go,
# Java amqp-client and the RabbitMQ JMS client), and the management API suite (requests, pika,
# rabbitmqadmin, lepus ctl) and the web console suite (Playwright in Debian's Chromium). Each
# suite's run.sh installs what it needs
# (a Python venv from PyPI, Go modules, Maven artifacts; Debian packages when a toolchain is missing).
#
# Beside them, the Python, Go, Java and management suites and the perf tool's broker test run once more
# against a real RabbitMQ (Debian's rabbitmq-server with its management plugin), which is how their
# expectations were set. A reference run that cannot run (no rabbitmq-server and no way to install
# it) fails the command; REFERENCE=none is the one way to skip the reference runs.
#
# Usage: scripts/test.sh            (everything)
#        SUITES="python go" REFERENCE=none scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# The stream-protocol suites (RabbitMQ's stream clients), against Lepus's stream port and then
# RabbitMQ's.
stream_suites=${STREAM_SUITES:-"go-stream java-stream"}
# Brokers that tests start on their own serve no stream port unless they ask for one: the
# default, 5552, would make two of them (or another broker on this machine) collide.
export LEPUS_STREAM_PORT=0
suites=${SUITES:-"python go java management console cluster"}
case "${REFERENCE:-rabbitmq}" in
  rabbitmq) ;;
  none) echo "== REFERENCE=none: the reference runs against RabbitMQ are skipped" ;;
  *) echo "REFERENCE must be rabbitmq (the default) or none, not ${REFERENCE}" >&2; exit 1 ;;
esac

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (rustup) first" >&2
  exit 1
fi

echo "== cargo fmt and clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo build (release) and Rust tests (${SECONDS} s so far)"
cargo build --release --locked
lepus="$root/target/release/lepus"
# The perf tool's broker tests start real brokers from this binary, and fail without one. Their
# RabbitMQ test runs in the reference run below (LEPUS_PERF_RABBITMQ_URL=none: not here, on purpose).
LEPUS_BIN="$lepus" LEPUS_PERF_RABBITMQ_URL=none cargo test --workspace --locked

echo "== (${SECONDS} s so far) fuzz targets, ${FUZZ_SECONDS:-10} s each (skipped with a line saying so without a nightly toolchain)"
scripts/fuzz-short.sh

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
http_port=$(free_port)
stream_port=$(free_port)
data_dir=$(mktemp -d /tmp/lepus-test-XXXXXX)
log="$data_dir.log"
# The HTTP API on a free port (the permission tests use it); no metrics: no suite reads them.
"$lepus" server --data-dir "$data_dir" --amqp-port "$port" --http-port "$http_port" --metrics-port 0 --bind 127.0.0.1 \
  --stream-port "$stream_port" --stream-advertised-host 127.0.0.1 >"$log" 2>&1 &
broker_pid=$!
reference_pid=""
cleanup() {
  if [ -n "$reference_pid" ]; then kill "$reference_pid" 2>/dev/null || true; wait "$reference_pid" 2>/dev/null || true; fi
  kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; rm -rf "$data_dir"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$http_port") 2>/dev/null; then break; fi
  sleep 0.1
done
export AMQP_URL="amqp://guest:guest@127.0.0.1:$port/"
export STREAM_PORT="$stream_port" STREAM_URL="rabbitmq-stream://guest:guest@127.0.0.1:$stream_port/%2f"
export LEPUS_BIN="$lepus"
# The broker's management API, for suites that read it (rabbitmq-reference.sh exports RabbitMQ's).
export LEPUS_MANAGEMENT_URL="http://guest:guest@127.0.0.1:$http_port/api" MANAGEMENT_URL="http://guest:guest@127.0.0.1:$http_port/api"
echo "== broker on port $port (log: $log)"

failed=0
passed=0
# The same suites against a real RabbitMQ: what they expect of Lepus is what RabbitMQ does. They
# run beside the Lepus suites (their own RabbitMQ node, ports and temp directories; the suites
# mostly wait on brokers, so this saves about ten minutes), in the reverse order, so that the two
# runs are rarely in one suite at once (a Maven suite waits for the other run's to end: their
# run.sh take a lock); their output follows the Lepus suites'.
reference_pid=""
if [ "${REFERENCE:-rabbitmq}" = rabbitmq ]; then
  reference_suites=""
  for suite in $suites $stream_suites; do
    case "$suite" in python | go | java | management | go-stream | java-stream) reference_suites="$suite $reference_suites" ;; esac
  done
  reference_log="$data_dir.reference.log"
  echo "== reference: RabbitMQ, started beside the Lepus suites (${SECONDS} s so far; output: $reference_log, shown below)"
  # shellcheck disable=SC2086 # one word per suite
  scripts/rabbitmq-reference.sh $reference_suites >"$reference_log" 2>&1 &
  reference_pid=$!
fi
for suite in $suites $stream_suites; do
  echo "== interop/$suite (${SECONDS} s so far)"
  if "interop/$suite/run.sh"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "interop/$suite FAILED"; fi
done
if [ -n "$reference_pid" ]; then
  echo "== reference: RabbitMQ, waiting for it (${SECONDS} s so far)"
  reference_status=0
  wait "$reference_pid" || reference_status=$?
  reference_pid=""
  cat "$reference_log"
  if [ "$reference_status" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "reference runs against RabbitMQ FAILED"; fi
fi
if ! kill -0 "$broker_pid" 2>/dev/null; then
  echo "the broker died during the interop suites; its log:" >&2
  tail -50 "$log" >&2
  failed=$((failed + 1))
fi
echo "interop suites: $passed passed, $failed failed (${SECONDS} s in all)"
[ "$failed" -eq 0 ]
