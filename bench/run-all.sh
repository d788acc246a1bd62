#!/usr/bin/env bash
# Every scenario in turn (about 10 minutes with the default durations).
set -euo pipefail
dir=$(dirname "${BASH_SOURCE[0]}")
"$dir/generator-ceiling.sh"
"$dir/artemis-walkthrough.sh"
"$dir/replicated-queue-comparison.sh"
"$dir/backlog.sh"
