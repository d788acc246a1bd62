#!/bin/bash
# Used for the consumer-stall diagnosis of cluster-quorum-2026-11-28.md: fresh clusters, 1p1c quorum;
# a round whose queue holds over 20,000 ready messages 5 s in is captured (APIs, sockets, gdb).
# Per round it counts, in the nodes' logs, confirms out of order and snapshots installed (start.sh
# must log lepus::quorum at info, LEPUS_LOG=warn,lepus::quorum=info, for the "snapshot sent" lines).
# hunt.sh: fresh clusters, 1p1c quorum; while running, sample the queue; when the consumer lags,
# capture state into stallN/. Env: BIN, ROUNDS, T
cd "${WORK:-/tmp/stallwork}"  # holding copies of start.sh, run.sh, stop.sh, capture.sh
BIN=${BIN:?the lepus binary}
D=${WORK:-/tmp/stallwork}/data
for r in $(seq ${ROUNDS:-10}); do
  BIN=$BIN ./start.sh >/dev/null; sleep 1
  Q=cq-$RANDOM
  ( BIN=$BIN PERF_BIN=$BIN W=2 T=${T:-6} Q=$Q ./run.sh > run.out 2>&1 ) &
  rp=$!
  sleep 5
  s1=$(curl -s -u guest:guest http://127.0.0.1:26711/api/queues/%2F/$Q | python3 -c 'import json,sys;q=json.load(sys.stdin);print(q.get("messages_ready",0), q.get("message_stats",{}).get("deliver_get",0) if isinstance(q.get("message_stats"),dict) else 0)' 2>/dev/null)
  sleep 1
  s2=$(curl -s -u guest:guest http://127.0.0.1:26711/api/queues/%2F/$Q | python3 -c 'import json,sys;q=json.load(sys.stdin);print(q.get("messages_ready",0), q.get("message_stats",{}).get("deliver_get",0) if isinstance(q.get("message_stats"),dict) else 0)' 2>/dev/null)
  ready=$(echo $s2 | cut -d' ' -f1)
  lead=$(curl -s -u guest:guest http://127.0.0.1:26711/api/queues/%2F/$Q | python3 -c 'import json,sys;q=json.load(sys.stdin);print(q.get("leader"), q.get("node"))' 2>/dev/null)
  shards=$(curl -s -u guest:guest http://127.0.0.1:26711/api/lepus/cluster | python3 -c 'import json,sys;c=json.load(sys.stdin);print([ (s["shard"],s["leader"][:2] if s["leader"] else None) for s in c["quorum_shards"]])' 2>/dev/null)
  tag=""
  if [ "${ready:-0}" -gt 20000 ]; then
    tag=" CAPTURED"
    n=1; while [ -d stall$n ]; do n=$((n+1)); done; mkdir stall$n
    echo "$s1 / $s2" > stall$n/samples.txt
    ./capture.sh stall$n $Q
  fi
  wait $rp
  line=$(grep 'kept up' run.out)
  echo "$(date -u +%T) round $r: ready=$s1/$s2 lead=$lead $shards $line$tag"
  [ -n "$tag" ] && { cp run.out stall$n/; cp $D/n*.log stall$n/; }
  echo "   logs: $(for i in 1 2 3; do echo -n "n$i ooo=$(grep -c 'out of order' $D/n$i.log) snap=$(grep -c 'installed a snapshot' $D/n$i.log) performed=$(grep -o 'performed=[0-9]*' $D/n$i.log | cut -d= -f2 | paste -sd+); "; done)"
  ./stop.sh
done
