#!/usr/bin/env bash
# Runs the interop suites and the perf tool's broker test against a real RabbitMQ (Debian's
# rabbitmq-server 3.10.8, a private node on free ports with the rabbitmq_management plugin), to prove
# that what the suites expect of Lepus is what RabbitMQ does. Called by scripts/test.sh.
#
# A reference run that cannot run is a failure: when rabbitmq-server is missing and cannot be
# installed (apt-get as root), or the node does not start, this exits 1. The one way to skip the
# reference runs is to say so: REFERENCE=none scripts/test.sh (which then never calls this script).
#
# The suites get, besides AMQP_URL (LEPUS_BIN is unset, so they know they do not own the broker):
#   MANAGEMENT_URL, LEPUS_MANAGEMENT_URL  the management API, http://guest:guest@127.0.0.1:PORT/api
#   RABBITMQCTL                           a command prefix that reaches the node ("rabbitmqctl -n NODE")
#   METRICS_URL                           rabbitmq_prometheus's /metrics, http://127.0.0.1:PORT/metrics
#   STREAM_PORT, STREAM_URL               the rabbitmq_stream plugin's listener (the stream protocol),
#                                         rabbitmq-stream://guest:guest@127.0.0.1:PORT/%2f
#
# Usage: scripts/rabbitmq-reference.sh SUITE...   (python go java management)
#        REFERENCE_SUITE_ARGS="tests/test_queue.py -k ttl" scripts/rabbitmq-reference.sh python
#        (words handed to each suite's run.sh, for running part of a suite while developing)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if ! command -v rabbitmq-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "rabbitmq-reference: installing Debian's rabbitmq-server"
    if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server) >/dev/null; then
      echo "rabbitmq-reference: FAILED: apt-get could not install rabbitmq-server (REFERENCE=none skips the reference runs)" >&2
      exit 1
    fi
  else
    echo "rabbitmq-reference: FAILED: rabbitmq-server is not installed and cannot be (needs root and apt-get);" \
      "install it, or run REFERENCE=none scripts/test.sh to skip the reference runs deliberately" >&2
    exit 1
  fi
fi

# Five distinct ports free now, from 5000-9999: below the kernel's ephemeral range (which any
# outgoing connection on the machine may take: the management suite's restart, stop_app then
# start_app, once found its HTTP port so taken, eaddrinuse) and below the 10000 and up that the
# suites hand their own brokers.
free_ports() {
  python3 -c 'import random, socket
chosen = []
for _ in range(1000):
    port = random.randrange(5000, 10000)
    if port in chosen:
        continue
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            continue
    chosen.append(port)
    if len(chosen) == 5:
        break
print(" ".join(map(str, chosen)))'
}
read -r port dist_port http_port metrics_port stream_port < <(free_ports)
if [ -z "$stream_port" ]; then
  echo "rabbitmq-reference: FAILED: no five free ports in 5000-9999" >&2
  exit 1
fi
base=$(mktemp -d /tmp/lepus-rabbitmq-reference-XXXXXX)
node="lepus-reference-$$@localhost"
log="$base/server.out"
mkdir -p "$base/mnesia" "$base/log"
# The Prometheus plugin answers the metrics tests (RabbitMQ's names are what Lepus's must match);
# the consistent-hash exchange ships in Debian's package, so its tests run against RabbitMQ too.
# rabbitmq_stream serves the stream protocol the stream suites and `lepus perf --protocol stream`
# test; it advertises 127.0.0.1 (not the host name) so that clients reconnecting to a stream's
# leader come back over loopback, as they do to Lepus.
echo "[rabbitmq_management,rabbitmq_prometheus,rabbitmq_consistent_hash_exchange,rabbitmq_stream]." >"$base/enabled_plugins"
# Statistics every 500 ms rather than 5 s, so the management suite's waits for them stay short.
cat >"$base/rabbitmq.conf" <<EOF
listeners.tcp.default = $port
management.tcp.port = $http_port
management.tcp.ip = 127.0.0.1
prometheus.tcp.port = $metrics_port
prometheus.tcp.ip = 127.0.0.1
collect_statistics_interval = 500
stream.listeners.tcp.default = $stream_port
stream.advertised_host = 127.0.0.1
EOF
# Debian's rabbitmq-server drops to the rabbitmq user: the node's directories must be its.
if id rabbitmq >/dev/null 2>&1; then chown -R rabbitmq:rabbitmq "$base"; fi
echo "rabbitmq-reference: starting RabbitMQ node $node on port $port (management API on $http_port)"
RABBITMQ_NODENAME=$node RABBITMQ_DIST_PORT=$dist_port RABBITMQ_CONFIG_FILE=$base/rabbitmq.conf \
  RABBITMQ_MNESIA_BASE=$base/mnesia RABBITMQ_LOG_BASE=$base/log RABBITMQ_ENABLED_PLUGINS_FILE=$base/enabled_plugins \
  rabbitmq-server >"$log" 2>&1 &
server_pid=$!
stop() {
  timeout 30 rabbitmqctl -n "$node" stop >/dev/null 2>&1 || kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  rm -rf "$base"
}
trap stop EXIT
management_url="http://guest:guest@127.0.0.1:$http_port/api"
# The management API answers once the node has booted its default vhost and user.
for _ in $(seq 1 240); do
  if python3 -c 'import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1],
    headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}), timeout=1)' "http://127.0.0.1:$http_port/api/overview" 2>/dev/null; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
  sleep 0.25
done
# "Z3Vlc3Q6Z3Vlc3Q=" is guest:guest in base64. The AMQP, HTTP and stream listeners must be up.
if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || ! (exec 3<>"/dev/tcp/127.0.0.1/$http_port") 2>/dev/null \
  || ! (exec 3<>"/dev/tcp/127.0.0.1/$stream_port") 2>/dev/null; then
  echo "rabbitmq-reference: FAILED: RabbitMQ did not start; its output:" >&2
  tail -30 "$log" >&2
  exit 1
fi
url="amqp://guest:guest@127.0.0.1:$port/"
export RABBITMQCTL="rabbitmqctl -n $node"
export MANAGEMENT_URL="$management_url" LEPUS_MANAGEMENT_URL="$management_url"
export METRICS_URL="http://127.0.0.1:$metrics_port/metrics"
export STREAM_PORT="$stream_port" STREAM_URL="rabbitmq-stream://guest:guest@127.0.0.1:$stream_port/%2f"
failed=0
for suite in "$@"; do
  echo "== interop/$suite against RabbitMQ $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || true) (${SECONDS} s so far)"
  # LEPUS_BIN is not passed: the suites test the broker at AMQP_URL and skip what only Lepus has.
  # shellcheck disable=SC2086 # REFERENCE_SUITE_ARGS is split into words on purpose
  if ! env -u LEPUS_BIN AMQP_URL="$url" "interop/$suite/run.sh" ${REFERENCE_SUITE_ARGS:-}; then failed=$((failed + 1)); echo "interop/$suite against RabbitMQ FAILED"; fi
done
# Part of a suite (REFERENCE_SUITE_ARGS) is a developer's run: the perf test is not part of it.
if [ -n "${REFERENCE_SUITE_ARGS:-}" ]; then [ "$failed" -eq 0 ]; exit; fi
echo "== lepus perf against RabbitMQ (${SECONDS} s so far)"
if ! LEPUS_PERF_RABBITMQ_URL="$url" cargo test --locked -p lepus-perf --test perf_broker -- rabbitmq --nocapture 2>&1 \
  | grep -E "test result|rabbitmq|RabbitMQ|FAILED|panicked"; then
  failed=$((failed + 1))
  echo "lepus perf against RabbitMQ FAILED"
fi
echo "rabbitmq-reference: done in ${SECONDS} s"
[ "$failed" -eq 0 ]
