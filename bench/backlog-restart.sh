#!/usr/bin/env bash
# Restart with a large backlog (issue 17 item 6): builds a backlog of persistent 1 KiB messages in
# one durable queue (BACKLOG_MESSAGES, 10.45 million: about 10 GB, as bench/backlog-paging.sh),
# stops the broker gracefully, then restarts it RESTARTS times on the same data directory, each
# time with a cold page cache (`echo 3 > /proc/sys/vm/drop_caches`, root only), alternating the
# binaries given, and measures from the start of the process:
#   - handshake_s: until an AMQP handshake completes (the port is bound before recovery, so a TCP
#     connect alone says nothing);
#   - declare_s: until a passive queue.declare answers, with the message count (checked);
#   - first_message_s: until basic.get returns the oldest message;
#   - disk_read_mib: bytes the broker read from the disk until then (/proc/PID/io read_bytes),
#     and rchar (bytes read through system calls, from the page cache or not);
#   - the broker's RSS and CPU time then.
# Then, with the first binary, drains the queue and checks that every message comes back.
# Writes RESULTS/LABEL.jsonl.
#
# Usage: bench/backlog-restart.sh LABEL LEPUS_BIN [OTHER_LEPUS_BIN]
# Environment: BACKLOG_MESSAGES (10450000), MESSAGE_BYTES (1024), RESTARTS (4), DRAIN (1: drain
#              and count at the end; 0: skip), COLD (1: drop the page cache before each restart;
#              0: keep it, for a short check on a machine others are measuring on),
#              RESULTS (bench/results/backlog-restart),
#              PYTHON (a python with pika: interop/python/.venv/bin/python).
set -euo pipefail
LABEL=$1 FIRST=$2 SECOND=${3:-$2}
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results/backlog-restart}
BACKLOG_MESSAGES=${BACKLOG_MESSAGES:-10450000} MESSAGE_BYTES=${MESSAGE_BYTES:-1024} RESTARTS=${RESTARTS:-4} DRAIN=${DRAIN:-1} COLD=${COLD:-1}
PYTHON=${PYTHON:-$BENCH_DIR/../interop/python/.venv/bin/python}
"$PYTHON" -c 'import pika' 2>/dev/null || { echo "PYTHON=$PYTHON has no pika (interop/python/run.sh makes that venv)" >&2; exit 1; }
mkdir -p "$RESULTS"
OUT=$RESULTS/$LABEL.jsonl
: >"$OUT"
WORK=$(mktemp -d /tmp/lepus-backlog-restart.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL="amqp://guest:guest@127.0.0.1:$PORT/"
SERVER=
trap 'if [[ -n $SERVER ]]; then kill -9 $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; fi; rm -rf "$WORK"' EXIT
note() { echo "$1" | tee -a "$OUT"; }

start() { # BIN
  LEPUS_LOG=warn "$1" server --data-dir "$WORK/data" --amqp-port "$PORT" --bind 127.0.0.1 --http-port 0 --metrics-port 0 \
    >>"$WORK/server.log" 2>&1 &
  SERVER=$!
}
stop() {
  kill -TERM "$SERVER"
  wait "$SERVER" || true
  SERVER=
}

note "{\"label\": \"$LABEL\", \"binaries\": [\"$FIRST\", \"$SECOND\"], \"backlog_messages\": $BACKLOG_MESSAGES, \"message_bytes\": $MESSAGE_BYTES, \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"cpus\": $(nproc)}"
start "$FIRST"
until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do sleep 0.05; done
started=$(date +%s.%N)
"$FIRST" perf producer --url "$URL" --durable --persistent --message-size "$MESSAGE_BYTES" --max-pending 1000 --warmup 0 \
  --message-count "$BACKLOG_MESSAGES" --keep -q --json "$WORK/build.json" queue://backlog >"$WORK/build.txt" 2>&1
sent=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['sent'])" "$WORK/build.json")
note "{\"event\": \"built\", \"sent\": $sent, \"build_s\": $(echo "$(date +%s.%N) - $started" | bc), \"data_dir_mib\": $(du -sm "$WORK/data" | cut -f1), \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
stop

for round in $(seq 1 "$RESTARTS"); do
  if (( round % 2 == 1 )); then bin=$FIRST; else bin=$SECOND; fi
  sync
  cold=false
  if [[ $COLD == 1 ]] && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then cold=true; fi
  since=$(date +%s.%N)
  start "$bin"
  "$PYTHON" - "$PORT" "$since" "$SERVER" "$sent" "$bin" "$cold" <<'PY' | tee -a "$OUT"
import json, sys, time, pika
port, since, pid, expected, binary, cold = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
def io():
    fields = dict(line.split(": ") for line in open("/proc/%d/io" % pid).read().splitlines())
    return int(fields["read_bytes"]), int(fields["rchar"])
def status(name):
    return int(next(line.split()[1] for line in open("/proc/%d/status" % pid) if line.startswith(name + ":")))
def cpu_s():
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0
parameters = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
                                       socket_timeout=600, blocked_connection_timeout=600, stack_timeout=600)
deadline = time.time() + 600
while True:
    try:
        connection = pika.BlockingConnection(parameters)
        break
    except pika.exceptions.AMQPConnectionError:
        if time.time() > deadline:
            raise
        time.sleep(0.01)
handshake_s = time.time() - since
channel = connection.channel()
count = channel.queue_declare("backlog", durable=True, passive=True).method.message_count
declare_s = time.time() - since
read_bytes, rchar = io()
method, _, body = channel.basic_get("backlog", auto_ack=False)
first_s = time.time() - since
channel.basic_nack(method.delivery_tag, requeue=True)
read_after_get, _ = io()
print(json.dumps({"event": "restart", "binary": binary, "cold_page_cache": cold == "true", "handshake_s": round(handshake_s, 3),
                  "declare_s": round(declare_s, 3), "first_message_s": round(first_s, 3), "messages": count, "expected": expected,
                  "disk_read_mib": round(read_bytes / 2**20, 1), "rchar_mib": round(rchar / 2**20, 1),
                  "disk_read_after_get_mib": round(read_after_get / 2**20, 1), "rss_mib": round(status("VmRSS") / 1024, 1),
                  "cpu_s": cpu_s()}), flush=True)
connection.close()
if count != expected:
    sys.exit("the restarted queue counts %d messages, %d were confirmed" % (count, expected))
PY
  stop
done

if [[ $DRAIN == 1 ]]; then
  start "$FIRST"
  until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do sleep 0.05; done
  started=$(date +%s.%N)
  "$FIRST" perf consumer --url "$URL" --durable --prefetch 1000 --warmup 0 --duration 1200 --message-count "$sent" -q \
    --json "$WORK/drain.json" queue://backlog >"$WORK/drain.txt" 2>&1 || true
  received=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['received'])" "$WORK/drain.json")
  note "{\"event\": \"drained\", \"received\": $received, \"expected\": $sent, \"drain_s\": $(echo "$(date +%s.%N) - $started" | bc), \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
  stop
  [[ $received -eq $sent ]] || { echo "drained $received of $sent" >&2; exit 1; }
fi
