#!/bin/bash
# alternate binaries: alt.sh binA binB ... ; ROUNDS
cd /tmp/q3
for r in $(seq ${ROUNDS:-2}); do for b in "$@"; do
  BIN=$b ./start.sh >/dev/null; sleep 1
  out=$(BIN=$b W=3 T=${T:-12} ./run.sh)
  echo "$b round $r: $(echo "$out" | grep -E 'load average' | sed 's/.*load/load/') | $(echo "$out" | grep recv/s) | $(echo "$out" | grep 'node cpu')"
  ./stop.sh
done; done
