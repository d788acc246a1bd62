#!/usr/bin/env bash
# Runs the deterministic simulator (crates/simulator) over many seeds, or replays one.
#
#   scripts/simulate.sh --seeds N [--first S]   # seeds S..S+N (default 0), N default 1000
#   scripts/simulate.sh --seed S                # replays one seed exactly
#   scripts/simulate.sh ... --steps K --sabotage NAME   # longer worlds; a deliberate bug
#
# A failing seed prints itself and its replay command; the exit status is 1 if any failed.
# Built in release mode (the simulator is about 10x faster than in debug).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ "$#" -eq 0 ]; then
  set -- --seeds 1000
fi
cargo build --release --locked -p simulator --bin lepus-simulator >&2
exec "$root/target/release/lepus-simulator" "$@"
