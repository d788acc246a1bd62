#!/usr/bin/env bash
# Lepus interop suite: RabbitMQ Java client + RabbitMQ JMS client.
# Installs what it needs (JDK 17 and Maven from Debian when missing; the libraries from Maven Central)
# and runs the tests against $AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).
set -euo pipefail
cd "$(dirname "$0")"

need_apt=()
if ! command -v javac >/dev/null 2>&1 || ! javac -version 2>&1 | grep -Eq 'javac (1[7-9]|[2-9][0-9])'; then
  need_apt+=(openjdk-17-jdk-headless)
fi
if ! command -v mvn >/dev/null 2>&1; then
  need_apt+=(maven)
fi
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "installing ${need_apt[*]} (apt)" >&2
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
echo "interop/java: testing against $(printf '%s' "$AMQP_URL" | sed -E 's#//([^:/@]*):[^@]*@#//\1:***@#')" >&2

# scripts/test.sh runs the reference run against RabbitMQ beside the Lepus suites: two runs of this
# suite would share target/, so the second waits for the first (the lock goes when mvn exits).
exec 9>.run.lock
flock 9
# Surefire prints "Tests run: N, Failures: F, Errors: E, Skipped: S"; mvn exits non-zero on any failure.
exec mvn -B --no-transfer-progress -Dstyle.color=never test "$@"
