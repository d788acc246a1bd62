#!/usr/bin/env bash
# Lepus management suite: the HTTP API (/api, RabbitMQ-compatible), Prometheus metrics, rabbitmqadmin
# and `lepus ctl` against brokers the suite starts itself. Installs into .venv, then runs pytest.
# Usage: LEPUS_BIN=target/release/lepus ./run.sh [pytest args...]   (skips without LEPUS_BIN)
# rabbitmqadmin: $RABBITMQADMIN, else on PATH, else from an installed rabbitmq_management plugin;
# the tests that need it skip when none is found.
set -euo pipefail
if [ -n "${LEPUS_BIN:-}" ]; then
    # Resolve a relative path against the caller's directory, before changing it.
    LEPUS_BIN="$(cd "$(dirname "$LEPUS_BIN")" && pwd)/$(basename "$LEPUS_BIN")"
    export LEPUS_BIN
fi
cd "$(dirname "$0")"

# rabbitmqadmin comes with Debian's rabbitmq-server package; install it on a fresh machine so the
# compatibility tests run rather than skip (only the package is needed, no RabbitMQ is started).
if [ -z "${RABBITMQADMIN:-}" ] && ! command -v rabbitmqadmin >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "run.sh: installing rabbitmq-server for rabbitmqadmin"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server) >/dev/null
fi

# The TLS tests make their CA and certificates with the openssl command line.
if ! command -v openssl >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "run.sh: installing openssl for the TLS tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl) >/dev/null
fi

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

exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --timeout=60 "$@"
