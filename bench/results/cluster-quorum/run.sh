#!/bin/bash
# run 1p1c quorum; prints throughput and per-node CPU
BIN=${BIN:-/work/main/target/release/lepus}
D=${D:-/tmp/q3/data}
Q=${Q:-cq-$RANDOM}
pids="$(cat $D/n1.pid) $(cat $D/n2.pid) $(cat $D/n3.pid)"
cpu() { for p in $pids; do awk '{print $14+$15}' /proc/$p/stat; done | paste -sd' '; }
before=$(cpu); uptime
${PERF_BIN:-/tmp/q3/lepus-base} perf client --queue-type quorum --persistent --warmup ${W:-3} --duration ${T:-15} --json /tmp/q3/out.json --url amqp://guest:guest@127.0.0.1:26704/%2F --url amqp://guest:guest@127.0.0.1:26705/%2F --url amqp://guest:guest@127.0.0.1:26706/%2F --message-size ${SIZE:-16} --producers 1 --consumers 1 "$@" queue://$Q 2>&1 | tail -4
after=$(cpu); echo "cpu ticks before: $before after: $after"
python3 -c "
import json;s=json.load(open('/tmp/q3/out.json'))['summary'];print('recv/s',s['received_per_sec'],'p50',s['send_ack_latency_us']['p50_us'],'p99',s['send_ack_latency_us']['p99_us'])
b=[int(x) for x in '$before'.split()];a=[int(x) for x in '$after'.split()]
tot=s['received']*($W+$T)/s['measured_s'] if False else None
d=[(y-x)/100 for x,y in zip(b,a)];n=s['received_per_sec']*($W+$T);print('node cpu s',d,'sum',round(sum(d),2),'us/msg',[round(x/n*1e6,2) for x in d],round(sum(d)/n*1e6,2))"
