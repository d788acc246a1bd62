#!/bin/bash
# start 3 lepus nodes; BIN env
BIN=${BIN:-/work/main/target/release/lepus}
D=${D:-/tmp/q3/data}
rm -rf $D; mkdir -p $D
SEEDS=127.0.0.1:26701,127.0.0.1:26702,127.0.0.1:26703
for i in 1 2 3; do
  LEPUS_LOG=warn setsid $BIN server --node-name n$i@localhost --data-dir $D/n$i --bind 127.0.0.1 --amqp-port 2670$((i+3)) --http-port 2671$i --metrics-port 0 --stream-port 0 --cluster-port 2670$i --cluster-seeds $SEEDS > $D/n$i.log 2>&1 &
  echo $! > $D/n$i.pid
done
for t in $(seq 100); do
  ok=0
  for i in 1 2 3; do curl -s -u guest:guest http://127.0.0.1:2671$i/api/lepus/cluster | grep -q '"leader":"' && ok=$((ok+1)); done
  [ $ok = 3 ] && break; sleep 0.3
done
echo formed ok=$ok
