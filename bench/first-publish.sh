#!/usr/bin/env bash
# First publish to each of N fresh durable queues, then a second one, for two builds alternating
# (two rounds). Usage: [N=20000] bench/first-publish.sh BUILD_A BUILD_B
set -euo pipefail
N=${N:-20000}
PY=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/interop/python/.venv/bin/python}
BENCH=$(cd "$(dirname "$0")" && pwd)
for round in 1 2; do for bin in "$@"; do
  d=$(mktemp -d /tmp/first-publish-XXXX)
  ( ulimit -n 1024; exec env LEPUS_LOG=warn "$bin" server --data-dir $d/data --amqp-port 5830 --bind 127.0.0.1 --http-port 0 --metrics-port 0 --stream-port 0 ) >$d/log 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/5830) 2>/dev/null && break; sleep 0.1; done
  U=amqp://guest:guest@127.0.0.1:5830/
  $PY $BENCH/declare_pipelined.py declare $U $N >/dev/null
  first=$($PY $BENCH/declare_pipelined.py publish $U $N --messages 1 | tail -1)
  second=$($PY $BENCH/declare_pipelined.py publish $U $N --messages 1 | tail -1)
  echo "$(basename $bin) first: $first second: $second load $(cut -d' ' -f1 /proc/loadavg)"
  kill $pid; wait $pid 2>/dev/null || true; rm -rf $d
done; done
