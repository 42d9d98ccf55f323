#!/usr/bin/env bash
# Sets up .venv with everything the tests need and runs lint, format check and the whole
# test suite. The tests start (and stop) their own SeaweedFS S3 server on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
# a C compiler for treadle's one extension (the compiled window loop, setup.py): the tests
# check it is built; without one the package would install and run the slower Python loop
if ! command -v cc >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq gcc >/dev/null
fi
bash scripts/setup.sh full
# the browser of the viewer tests (tests/test_ui_browser.py): Debian's chromium, driven by
# Playwright through executable_path (Playwright's own browser download is not reachable)
if [ ! -x /usr/bin/chromium ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
bash tests/azurite/install.sh  # the Azure Blob emulator of the az:// tests (node, npm ci)
. .venv/bin/activate
ruff check src tests bench
ruff format --check src tests bench
# two processes, each test file on one of them (its module fixtures made once); each starts
# its own servers. TREADLE_TEST_PROCESSES=0 runs the suite in this process.
python -m pytest -q -n "${TREADLE_TEST_PROCESSES:-2}" --dist loadfile "$@"
