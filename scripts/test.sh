#!/usr/bin/env bash
# Sets up .venv with everything the tests need and runs lint, format check and the whole
# test suite. The tests start (and stop) their own SeaweedFS S3 server on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh full
bash tests/azurite/install.sh  # the Azure Blob emulator of the az:// tests (node, npm ci)
. .venv/bin/activate
ruff check src tests bench
ruff format --check src tests bench
python -m pytest -q "$@"
