#!/bin/bash
# Used for bench/results/issue-10-vs-rabbitmq.md. RPID is the pid of the RabbitMQ node's beam.smp, whose CPU
# time is read over each of its runs; each Lepus run starts its own broker with a fresh data directory.
# Usage: RPID=PID bench/lepus-vs-rabbitmq-safe.sh LEPUS_BIN RMQ_PORT RMQ_NODE OUTDIR (RMQ_NODE only names the run): alternating safe-mode 16 B runs, Lepus vs a running RabbitMQ node
set -u
BIN=$1 RPORT=$2 NODE=$3 OUT=$4; mkdir -p $OUT
ticks() { awk '{ print $14 + $15 }' /proc/$1/stat; }
hz=$(getconf CLK_TCK)
rpid=${RPID:?}
for run in 1 2 3; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  d=$(mktemp -d)
  LEPUS_LOG=warn $BIN server --data-dir $d --amqp-port $port --bind 127.0.0.1 --http-port 0 --metrics-port 0 >/dev/null 2>&1 &
  srv=$!; sleep 0.5
  $BIN perf client --url amqp://guest:guest@127.0.0.1:$port/ --persistent --durable --max-pending 1000 --message-size 16 --duration 10 queue://q > $OUT/lepus-$run.out 2>&1
  t=$(ticks $srv); kill $srv; wait $srv 2>/dev/null; rm -rf $d
  c=$(sed -n 's/^sent .*| completed \([0-9]*\) (\([0-9]*\) msg.*/\1 \2/p' $OUT/lepus-$run.out)
  set -- $c; echo "run $run lepus: $2 msg/s, $(( t * 1000000000 / hz / $1 )) ns CPU/msg (load $(cut -d' ' -f1 /proc/loadavg))"
  t0=$(ticks $rpid)
  $BIN perf client --url amqp://guest:guest@127.0.0.1:$RPORT/ --persistent --durable --max-pending 1000 --message-size 16 --duration 10 queue://q-$run > $OUT/rabbitmq-$run.out 2>&1
  t1=$(ticks $rpid)
  c=$(sed -n 's/^sent .*| completed \([0-9]*\) (\([0-9]*\) msg.*/\1 \2/p' $OUT/rabbitmq-$run.out)
  set -- $c; echo "run $run rabbitmq: $2 msg/s, $(( (t1 - t0) * 1000000000 / hz / ${1:-1} )) ns CPU/msg (load $(cut -d' ' -f1 /proc/loadavg))"
done
