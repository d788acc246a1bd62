#!/usr/bin/env bash
# Lepus interop suite: Python / pika.  Installs into .venv, then runs pytest.
# Usage: AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ ./run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.requirements.installed"

# scripts/test.sh runs this suite against Lepus and RabbitMQ at once: one makes the venv, the other
# waits for it.
exec 8>.install.lock
flock 8
# A fresh Debian has python3 without its venv module (package python3-venv): install it as root.
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "run.sh: installing python3-venv from Debian"
            (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv) >/dev/null
        else
            echo "run.sh: FAILED: $PYTHON cannot make a venv (install python3-venv, or run as root with apt-get)" >&2
            exit 1
        fi
    fi
    "$PYTHON" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || ! cmp -s requirements.txt "$STAMP"; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
    cp requirements.txt "$STAMP"
fi
exec 8>&-

export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --timeout=60 "$@"
