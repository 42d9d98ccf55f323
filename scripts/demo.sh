#!/usr/bin/env bash
# Sets up .venv with the runtime set only and runs `treadle demo` (default store:
# $TREADLE_ROOT, else ~/.treadle). Arguments go to `treadle demo`, e.g. --root DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh runtime
. .venv/bin/activate
exec treadle demo "$@"
