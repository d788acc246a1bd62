#!/usr/bin/env bash
# Runs every Lepus test on a fresh machine: the Rust unit and property tests, then the interop
# suites that drive a real Lepus broker through real client libraries (Python pika, Go amqp091-go,
# Java amqp-client and the RabbitMQ JMS client), and the management API suite (requests, pika,
# rabbitmqadmin, lepus ctl) and the web console suite (Playwright in Debian's Chromium). Each
# suite's run.sh installs what it needs
# (a Python venv from PyPI, Go modules, Maven artifacts; Debian packages when a toolchain is missing).
#
# Then the Python, Go and Java suites and the perf tool's broker test run once more against a real
# RabbitMQ (Debian's rabbitmq-server), which is how their expectations were set.
#
# Usage: scripts/test.sh            (everything)
#        SUITES="python go" REFERENCE=none scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
suites=${SUITES:-"python go java management console"}

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (rustup) first" >&2
  exit 1
fi

echo "== cargo fmt and clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo build (release) and Rust tests"
cargo build --release --locked
lepus="$root/target/release/lepus"
# The perf tool's tests start real brokers from this binary.
LEPUS_BIN="$lepus" cargo test --workspace --locked

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
data_dir=$(mktemp -d /tmp/lepus-test-XXXXXX)
log="$data_dir.log"
# No HTTP servers: no suite uses this broker's, and a taken default port would stop its start.
"$lepus" server --data-dir "$data_dir" --amqp-port "$port" --bind 127.0.0.1 --http-port 0 --metrics-port 0 >"$log" 2>&1 &
broker_pid=$!
cleanup() { kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; rm -rf "$data_dir"; }
trap cleanup EXIT
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  sleep 0.1
done
export AMQP_URL="amqp://guest:guest@127.0.0.1:$port/"
export LEPUS_BIN="$lepus"
echo "== broker on port $port (log: $log)"

failed=0
passed=0
for suite in $suites; do
  echo "== interop/$suite"
  if "interop/$suite/run.sh"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "interop/$suite FAILED"; fi
done
# The same suites against a real RabbitMQ: what they expect of Lepus is what RabbitMQ does.
if [ "${REFERENCE:-rabbitmq}" = rabbitmq ]; then
  echo "== reference: RabbitMQ"
  if scripts/rabbitmq-reference.sh python go java; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "reference runs against RabbitMQ FAILED"; fi
fi
if ! kill -0 "$broker_pid" 2>/dev/null; then
  echo "the broker died during the interop suites; its log:" >&2
  tail -50 "$log" >&2
  failed=$((failed + 1))
fi
echo "interop suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
