#!/usr/bin/env bash
# The load generator's own ceiling: `lepus perf producer` against `lepus perf sink` (a stand-in
# broker that confirms at once and stores nothing), so no broker limits the rate. Records the rate
# and CPU time per message; writes bench/results/generator-ceiling.md.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION_S=${DURATION_S:-10}
SINK_PORT=${SINK_PORT:-5699}
out=$RESULTS/generator
mkdir -p "$out"
ensure_lepus_bin
"$LEPUS_BIN" perf sink --port "$SINK_PORT" --lifetime 600 >"$out/sink.log" 2>&1 &
CLEANUP_PIDS+=($!)
for _ in $(seq 1 50); do port_open "$SINK_PORT" && break; sleep 0.1; done
rows=()
for size in 16 1024 16384; do
  for threads in 1 2; do
    name=$out/size-$size-threads-$threads
    log "producer, $size B, $threads thread(s)"
    measured "$name" "$LEPUS_BIN" perf producer --url "amqp://guest:guest@127.0.0.1:$SINK_PORT/" --duration "$DURATION_S" \
      --message-size "$size" --threads "$threads" --quiet --json "$name.json" queue://sink >/dev/null
    rows+=("$(python3 - "$name" "$size" "$threads" <<'PY'
import json, sys
name, size, threads = sys.argv[1:4]
summary = json.load(open(name + ".json"))["summary"]
cpu = json.load(open(name + ".cpu.json"))
print(f"| {size} | {threads} | {summary['sent_per_sec']:,.0f} | {summary['sent_bytes_per_sec'] / 1048576:,.0f} | "
      f"{cpu['cpu_s'] / cpu['wall_s']:.2f} | {cpu['cpu_s'] * 1e9 / max(1, summary['sent']):,.0f} |")
PY
)")
  done
done
{
  echo "# Load generator ceiling"
  echo
  echo "\`lepus perf producer\` (1 producer, confirms, --max-pending 1000) against \`lepus perf sink\`, which"
  echo "confirms every publish at once, on $(nproc) cores: the rate the generator reaches when nothing"
  echo "else limits it, and its CPU time (user + system, all threads) per published message."
  echo
  echo "| message B | runtime threads | msg/s | MiB/s | CPUs busy | CPU ns/msg |"
  echo "|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
} >"$RESULTS/generator-ceiling.md"
cat "$RESULTS/generator-ceiling.md"
