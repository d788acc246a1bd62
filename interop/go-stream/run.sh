#!/usr/bin/env bash
# Go stream-protocol interop suite: RabbitMQ's Go stream client
# (github.com/rabbitmq/rabbitmq-stream-go-client) against the broker at $STREAM_URL
# (default rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f).
# Usage: ./run.sh [extra go test flags, e.g. -v -run TestDeduplication]
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

export STREAM_URL="${STREAM_URL:-rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f}"
echo "run.sh: $(go version); STREAM_URL=$(printf %s "$STREAM_URL" | sed -E 's#//[^@/]*@#//***@#')"

# Modules from the Go module proxy (a no-op when already in the module cache).
go mod download

go test -count=1 -timeout 300s ./... "$@"
