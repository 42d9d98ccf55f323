#!/usr/bin/env bash
# Installs Azurite (the Azure Storage emulator the az:// tests start) from this folder's
# package-lock.json into tests/azurite/node_modules, and Node.js from apt-get if it is
# missing. Idempotent: a stamp (the lock file's hash) skips `npm ci` when nothing changed.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq nodejs npm >/dev/null
fi
stamp=node_modules/.treadle-installed
want=$(sha256sum package-lock.json | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi
