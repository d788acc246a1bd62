#!/usr/bin/env bash
# Lepus interop suite: Python / pika.  Installs into .venv, then runs pytest.
# Usage: AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ ./run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.requirements.installed"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || ! cmp -s requirements.txt "$STAMP"; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
    cp requirements.txt "$STAMP"
fi

export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --timeout=60 "$@"
