#!/usr/bin/env bash
# The test command's short fuzz run: each target of fuzz/ (the AMQP frame and field-table
# decoders, the stream-protocol frame decoders, the segment scanner, the journal reader, the definitions change log reader) for
# FUZZ_SECONDS (default 10: the test command must stay under 45 minutes; longer runs by hand, bench/results/fuzz.md) from its committed seed corpus in fuzz/corpus/<target>. New inputs
# go to a scratch directory, so the committed corpus only changes by hand.
#
# libFuzzer's coverage instrumentation needs a nightly toolchain (cargo-fuzz is not needed: the
# flags below are the ones it passes). Without one this says so and skips.
#
# Usage: scripts/fuzz-short.sh            FUZZ_SECONDS=600 FUZZ_TARGETS="segment_scan" scripts/fuzz-short.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"
seconds=${FUZZ_SECONDS:-10}
targets=${FUZZ_TARGETS:-"frame_decode field_table_decode stream_frame_decode segment_scan journal_scan definitions_log"}
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "== fuzzing SKIPPED: no nightly Rust toolchain (rustup toolchain install nightly); the storage readers' properties still ran in cargo test (storage::fuzz_checks)"
  exit 0
fi
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
# An explicit target keeps the instrumentation off build scripts and proc macros, as cargo-fuzz does.
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
cargo +nightly build --release --locked --bins --target "$host"
scratch=$(mktemp -d /tmp/lepus-fuzz-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
failed=0
for target in $targets; do
  mkdir -p "corpus/$target" "$scratch/$target"
  echo "== fuzz $target for ${seconds} s"
  status=0
  "target/$host/release/$target" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$scratch/" \
    "$scratch/$target" "corpus/$target" >"$scratch/$target.log" 2>&1 || status=$?
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$scratch/$target.log" || true
  if [ "$status" -ne 0 ]; then
    tail -40 "$scratch/$target.log"
    echo "fuzz target $target FAILED (exit $status); the input is in $scratch (kept)" >&2
    trap - EXIT
    failed=1
  fi
done
exit "$failed"
