#!/usr/bin/env bash
# Creates .venv (once) and installs treadle with its pinned dev/test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.treadle-installed
want=$(cat pyproject.toml requirements/*.txt | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q -r requirements/dev.txt -c requirements/constraints.txt
  if [ -f requirements/peers.txt ]; then
    bash scripts/install-peers.sh
  fi
  python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
