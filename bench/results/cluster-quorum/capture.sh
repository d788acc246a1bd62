#!/bin/bash
# capture.sh DIR Q: state of the running cluster
O=$1; Q=$2; D=${WORK:-/tmp/stallwork}/data
for i in 1 2 3; do
  curl -s -u guest:guest http://127.0.0.1:2671$i/api/lepus/cluster > $O/cluster$i.json
  curl -s -u guest:guest http://127.0.0.1:2671$i/api/queues/%2F/$Q > $O/queue$i.json
done
curl -s -u guest:guest http://127.0.0.1:26711/api/connections > $O/connections1.json
curl -s -u guest:guest http://127.0.0.1:26711/api/channels > $O/channels1.json
ss -tnpi 'sport >= :26701 and sport <= :26716' > $O/ss1.txt
sleep 0.5
ss -tnpi 'sport >= :26701 and sport <= :26716' > $O/ss2.txt
for i in 1 2 3; do timeout 20 gdb -p $(cat $D/n$i.pid) -batch -ex 'thread apply all bt 8' > $O/gdb$i.txt 2>&1 & done; wait
