#!/usr/bin/env bash
# Sets up .venv and runs `treadle demo` on the embedded default store.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec treadle demo "$@"
