# Shared by the bench/ scenario scripts: finds or builds lepus, starts a private Lepus broker,
# finds (or starts) a RabbitMQ, and runs measured commands. Source it; do not run it.
#
# Environment:
#   LEPUS_BIN      lepus binary (default: build target-perf/release/lepus)
#   LEPUS_PORT     port for the private Lepus broker (default 5690)
#   RABBITMQ_URL   a running RabbitMQ (default amqp://guest:guest@127.0.0.1:5672/); when nothing
#                  answers there and rabbitmq-server is installed, a private node is started on
#                  RABBITMQ_PORT (default 5674) and stopped at exit. Empty string: Lepus only.
#   RESULTS        output folder (default bench/results)

set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results}
LEPUS_PORT=${LEPUS_PORT:-5690}
RABBITMQ_URL=${RABBITMQ_URL-amqp://guest:guest@127.0.0.1:5672/}
RABBITMQ_PORT=${RABBITMQ_PORT:-5674}
mkdir -p "$RESULTS"
CLEANUP_PIDS=()
RABBITMQ_NODE=""

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

cleanup() {
  for pid in "${CLEANUP_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${CLEANUP_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ -n $RABBITMQ_NODE ]]; then rabbitmqctl -n "$RABBITMQ_NODE" stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

ensure_lepus_bin() {
  if [[ -z ${LEPUS_BIN:-} ]]; then
    LEPUS_BIN=$REPO_DIR/target-perf/release/lepus
    log "building $LEPUS_BIN"
    (cd "$REPO_DIR" && CARGO_TARGET_DIR=$REPO_DIR/target-perf cargo build --release -p lepus >&2)
  fi
  [[ -x $LEPUS_BIN ]] || { echo "LEPUS_BIN=$LEPUS_BIN is not executable" >&2; exit 1; }
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

url_port() { local rest=${1#*://}; rest=${rest#*@}; rest=${rest%%/*}; echo "${rest##*:}"; }

# Starts a private Lepus on LEPUS_PORT with a fresh data directory; sets LEPUS_URL.
start_lepus() {
  ensure_lepus_bin
  local data_dir=${LEPUS_DATA_DIR:-/tmp/lepus-bench-data-$LEPUS_PORT}
  rm -rf "$data_dir"
  if port_open "$LEPUS_PORT"; then echo "port $LEPUS_PORT is taken: set LEPUS_PORT" >&2; exit 1; fi
  # No management or metrics listeners: their default ports may belong to a RabbitMQ.
  LEPUS_LOG=warn LEPUS_HTTP_PORT=0 LEPUS_METRICS_PORT=0 LEPUS_STREAM_PORT=0 "$LEPUS_BIN" server --data-dir "$data_dir" --amqp-port "$LEPUS_PORT" --bind 127.0.0.1 \
    >"/tmp/lepus-bench-server-$LEPUS_PORT.log" 2>&1 &
  CLEANUP_PIDS+=($!)
  for _ in $(seq 1 100); do port_open "$LEPUS_PORT" && break; sleep 0.1; done
  port_open "$LEPUS_PORT" || { echo "lepus did not start" >&2; exit 1; }
  LEPUS_URL=amqp://guest:guest@127.0.0.1:$LEPUS_PORT/
  log "Lepus at $LEPUS_URL"
}

# Sets RABBIT_URL to a reachable RabbitMQ, starting a private node if needed and possible.
find_rabbitmq() {
  RABBIT_URL=""
  [[ -n $RABBITMQ_URL ]] || { log "RABBITMQ_URL empty: Lepus only"; return 0; }
  if port_open "$(url_port "$RABBITMQ_URL")"; then RABBIT_URL=$RABBITMQ_URL; log "RabbitMQ at $RABBIT_URL"; return 0; fi
  if command -v rabbitmq-server >/dev/null; then
    RABBITMQ_NODE=lepus-bench@localhost
    log "starting a private RabbitMQ node $RABBITMQ_NODE on port $RABBITMQ_PORT"
    RABBITMQ_NODENAME=$RABBITMQ_NODE RABBITMQ_NODE_PORT=$RABBITMQ_PORT RABBITMQ_DIST_PORT=$((RABBITMQ_PORT + 20000)) \
      RABBITMQ_MNESIA_BASE=/tmp/lepus-bench-rabbitmq/mnesia RABBITMQ_LOG_BASE=/tmp/lepus-bench-rabbitmq/log \
      rabbitmq-server -detached
    for _ in $(seq 1 120); do port_open "$RABBITMQ_PORT" && break; sleep 0.5; done
    port_open "$RABBITMQ_PORT" && RABBIT_URL=amqp://guest:guest@127.0.0.1:$RABBITMQ_PORT/
  fi
  [[ -n $RABBIT_URL ]] || log "no RabbitMQ: Lepus only"
}

# measured NAME CMD...: runs CMD, keeps its output in NAME.log and its CPU time in NAME.cpu.json.
measured() {
  local name=$1; shift
  python3 "$BENCH_DIR/measure.py" "$name.cpu.json" "$@" | tee "$name.log"
}
