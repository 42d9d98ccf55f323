#!/usr/bin/env bash
# Creates .venv (once) and installs treadle into it.
#
#   bash scripts/setup.sh runtime   the runtime set only: what `import treadle` and
#                                   `treadle demo` need (scripts/demo.sh)
#   bash scripts/setup.sh [full]    everything the tests need: requirements/dev.txt, the
#                                   peers of requirements/peers.txt (scripts/test.sh, CI)
#
# A stamp (.venv/.treadle-installed: a hash of pyproject.toml, setup.py, the C window loop and
# requirements/*.txt, and
# the set) skips the install when nothing changed; a full install also satisfies runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-full}
case "$mode" in
  runtime|full) ;;
  *) echo "setup.sh: unknown set '$mode' (runtime or full)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.treadle-installed
want=$(cat pyproject.toml setup.py src/treadle/video/_window_loop.c requirements/*.txt | sha256sum | cut -c1-16)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" = "$want full" ] || [ "$have" = "$want $mode" ]; then
  exit 0
fi
cons=requirements/constraints.txt
# pip runs quietly (its per-package lines would bury the demo): say what the wait is
if [ "$mode" = runtime ]; then
  echo "setup.sh: installing the runtime set into .venv (torch CPU, pylance, PyAV, ...;" \
    "about 1.4 GB, a minute or so; skipped next time)" >&2
else
  echo "setup.sh: installing the test set and the peers into .venv (about 3 GB, a few" \
    "minutes; skipped next time)" >&2
fi
if [ "$mode" = runtime ]; then
  # --no-compile: Python compiles only the modules it imports, on first import (~170 MB
  # of .pyc for every module of torch otherwise)
  python -m pip install -q --no-compile -e . -c "$cons"
else
  python -m pip install -q --upgrade pip
  python -m pip install -q -r requirements/dev.txt -c "$cons"
  if [ -f requirements/peers.txt ]; then
    bash scripts/install-peers.sh
  fi
  python -m pip install -q --no-deps -e .
fi
echo "$want $mode" > "$stamp"
