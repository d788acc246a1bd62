#!/usr/bin/env bash
# Runs the interop suites and the perf tool's broker test against a real RabbitMQ (Debian's
# rabbitmq-server, a private node on free ports), to prove that what the suites expect of Lepus
# is what RabbitMQ does. Called by scripts/test.sh; REFERENCE=none there skips it.
#
# Usage: scripts/rabbitmq-reference.sh SUITE...   (python go java)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if ! command -v rabbitmq-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "rabbitmq-reference: installing Debian's rabbitmq-server"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server) >/dev/null
  else
    echo "rabbitmq-reference: rabbitmq-server is not installed and cannot be (not root): reference runs skipped" >&2
    exit 0
  fi
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
dist_port=$(free_port)
base=$(mktemp -d /tmp/lepus-rabbitmq-reference-XXXXXX)
node="lepus-reference-$$@localhost"
log="$base/server.out"
mkdir -p "$base/mnesia" "$base/log"
echo "[]." >"$base/enabled_plugins"
# Debian's rabbitmq-server drops to the rabbitmq user: the node's directories must be its.
if id rabbitmq >/dev/null 2>&1; then chown -R rabbitmq:rabbitmq "$base"; fi
echo "rabbitmq-reference: starting RabbitMQ node $node on port $port"
RABBITMQ_NODENAME=$node RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist_port \
  RABBITMQ_MNESIA_BASE=$base/mnesia RABBITMQ_LOG_BASE=$base/log RABBITMQ_ENABLED_PLUGINS_FILE=$base/enabled_plugins \
  rabbitmq-server >"$log" 2>&1 &
server_pid=$!
stop() {
  RABBITMQ_NODENAME=$node timeout 30 rabbitmqctl -n "$node" stop >/dev/null 2>&1 || kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  rm -rf "$base"
}
trap stop EXIT
for _ in $(seq 1 240); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
  sleep 0.25
done
if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "rabbitmq-reference: RabbitMQ did not start; its output:" >&2
  tail -30 "$log" >&2
  exit 1
fi
# Give the node a moment to finish booting its default vhost and user after the port opens.
sleep 2
url="amqp://guest:guest@127.0.0.1:$port/"
failed=0
for suite in "$@"; do
  echo "== interop/$suite against RabbitMQ $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || true)"
  # LEPUS_BIN is not passed: the Lepus-only tests skip.
  if ! env -u LEPUS_BIN AMQP_URL="$url" "interop/$suite/run.sh"; then failed=$((failed + 1)); echo "interop/$suite against RabbitMQ FAILED"; fi
done
echo "== lepus perf against RabbitMQ"
if ! LEPUS_BIN="$root/target/release/lepus" LEPUS_PERF_RABBITMQ_URL="$url" cargo test --locked -p lepus-perf --test perf_broker -- --nocapture 2>&1 | grep -E "test result|rabbitmq|RabbitMQ|FAILED|panicked"; then
  failed=$((failed + 1))
fi
[ "$failed" -eq 0 ]
