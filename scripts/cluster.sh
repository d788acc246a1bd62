#!/usr/bin/env bash
# A three-node Lepus cluster on this machine, for trying it out, with embedded defaults:
#   scripts/cluster.sh start    builds the release binary if missing, starts n1..n3 on loopback
#   scripts/cluster.sh status   lepus ctl cluster_status through n1
#   scripts/cluster.sh stop     stops the three nodes (their data stays under $CLUSTER_DIR)
# Ports: AMQP 5672/5673/5674, management 15672/15673/15674, metrics 15692/15693/15694,
# stream protocol 5552/5553/5554, cluster links 25672/25673/25674 (PORT_OFFSET=N shifts them all by N). CLUSTER_DIR (default
# /tmp/lepus-cluster) holds data and logs.
set -euo pipefail
cd "$(dirname "$0")/.."
lepus=${LEPUS_BIN:-target/release/lepus}
directory=${CLUSTER_DIR:-/tmp/lepus-cluster}
offset=${PORT_OFFSET:-0}
seeds=127.0.0.1:$((25672 + offset)),127.0.0.1:$((25673 + offset)),127.0.0.1:$((25674 + offset))
management=http://127.0.0.1:$((15672 + offset))

start() {
  [ -x "$lepus" ] || cargo build --release -p lepus
  mkdir -p "$directory"
  for index in 0 1 2; do
    name="n$((index + 1))"
    if [ -f "$directory/$name.pid" ] && kill -0 "$(cat "$directory/$name.pid")" 2>/dev/null; then
      echo "$name is running already (pid $(cat "$directory/$name.pid"))"
      continue
    fi
    "$lepus" server --node-name "$name@localhost" --data-dir "$directory/$name" --bind 127.0.0.1 \
      --amqp-port $((5672 + offset + index)) --http-port $((15672 + offset + index)) --metrics-port $((15692 + offset + index)) \
      --stream-port $((5552 + offset + index)) --stream-advertised-host 127.0.0.1 --cluster-port $((25672 + offset + index)) --cluster-seeds "$seeds" >>"$directory/$name.log" 2>&1 &
    echo $! >"$directory/$name.pid"
    echo "$name: amqp://guest:guest@127.0.0.1:$((5672 + offset + index))/  http://127.0.0.1:$((15672 + offset + index))/  log $directory/$name.log"
  done
  for _ in $(seq 1 100); do
    if "$lepus" ctl --url "$management" -q cluster_status 2>/dev/null | grep -q "^Leader: n"; then
      "$lepus" ctl --url "$management" -q cluster_status
      return 0
    fi
    sleep 0.2
  done
  echo "the cluster did not form in 20 s: see $directory/n*.log" >&2
  return 1
}

stop() {
  for name in n1 n2 n3; do
    if [ -f "$directory/$name.pid" ]; then
      kill "$(cat "$directory/$name.pid")" 2>/dev/null || true
      rm -f "$directory/$name.pid"
    fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) "$lepus" ctl --url "$management" cluster_status ;;
  *) echo "usage: scripts/cluster.sh start|status|stop" >&2; exit 64 ;;
esac
