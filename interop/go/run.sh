#!/usr/bin/env bash
# Go interop suite: github.com/rabbitmq/amqp091-go against the broker at
# $AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).
# Usage: ./run.sh [extra go test flags, e.g. -v -run TestTutorial]
set -euo pipefail
cd "$(dirname "$0")"

# A Go toolchain: the one on PATH, the usual /usr/local/go, or Debian's.
if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  else
    echo "run.sh: no Go toolchain found, installing Debian's golang-go" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
  fi
fi

export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
echo "run.sh: $(go version); AMQP_URL=$(printf %s "$AMQP_URL" | sed -E 's#//[^@/]*@#//***@#')"

# Modules from the Go module proxy (a no-op when already in the module cache).
go mod download

go test -count=1 -timeout 300s ./... "$@"
