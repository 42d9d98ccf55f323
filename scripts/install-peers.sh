#!/usr/bin/env bash
# Installs the test-only peer libraries of requirements/peers.txt into the active venv.
#
# - Every install runs with -c requirements/constraints.txt so torch stays the pinned
#   CPU build (2.13.0); nothing here may pull a CUDA torch.
# - Lines tagged "# no-deps" are installed with --no-deps (MosaicML Streaming 0.13.0
#   would otherwise downgrade numpy and pull every cloud SDK; torchvision would pull
#   another torch). Their runtime needs are listed as ordinary lines.
# - Idempotent: pip skips what is already satisfied; a stamp skips the whole run when
#   peers.txt and constraints.txt are unchanged.
# - Reaches only PyPI (through pip's configured indexes) and, for FFmpeg's shared libraries,
#   the system's apt sources.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x .venv/bin/python ]; then
  . .venv/bin/activate
fi
PY=${PYTHON_BIN:-python}
peers=requirements/peers.txt
cons=requirements/constraints.txt
stamp="$("$PY" -c 'import sys; print(sys.prefix)')/.treadle-peers"
want=$(cat "$peers" "$cons" | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ "${FORCE:-0}" != 1 ]; then
  echo "peers up to date"
  exit 0
fi

# torchcodec and SPDL (bench video rows) load FFmpeg's shared libraries from the system:
# install the runtime packages (not the ffmpeg binary) when they are missing and apt is ours.
ffmpeg_libs() {
  for d in libavcodec libavformat libavutil libswscale libswresample libavfilter libavdevice; do
    apt-cache depends "$d-dev" 2>/dev/null | awk '/Depends: lib(av|sw)[a-z]+[0-9]+$/ {print $2; exit}'
  done
}
if ! ldconfig -p 2>/dev/null | grep -q 'libavcodec\.so\.'; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    libs=$(ffmpeg_libs)
    if [ -n "$libs" ]; then
      # shellcheck disable=SC2086
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $libs >/dev/null
    fi
  fi
  ldconfig -p 2>/dev/null | grep -q 'libavcodec\.so\.' ||
    echo "install-peers: no FFmpeg shared libraries: the bench marks torchcodec and SPDL not installed" >&2
fi

torch_before=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)

nodeps=()
deps=()
while IFS= read -r line; do
  spec=${line%%#*}
  spec=$(echo "$spec" | xargs)
  [ -z "$spec" ] && continue
  if [[ "$line" == *"# no-deps"* ]]; then
    nodeps+=("$spec")
  else
    deps+=("$spec")
  fi
done < "$peers"

if [ ${#deps[@]} -gt 0 ]; then
  "$PY" -m pip install -q --prefer-binary "${deps[@]}" -c "$cons"
fi
if [ ${#nodeps[@]} -gt 0 ]; then
  "$PY" -m pip install -q --prefer-binary --no-deps "${nodeps[@]}" -c "$cons"
fi

torch_after=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
if [ "$torch_before" != "none" ] && [ "$torch_before" != "$torch_after" ]; then
  echo "install-peers: torch changed from $torch_before to $torch_after" >&2
  exit 1
fi
# PyPI's torchvision is a CUDA build: beside the CPU torch its compiled ops do not load, and
# `import torchvision` fails with "operator torchvision::nms does not exist". The bench, the
# tests and the examples define the two schemas they need; anything else that imports
# torchvision (torchmetrics, so Lightning) needs torchvision's CPU build.
if ! "$PY" -c 'import torchvision' >/dev/null 2>&1; then
  tv=$("$PY" -c 'from importlib.metadata import version; print(version("torchvision"))' 2>/dev/null || echo none)
  echo "install-peers: torchvision $tv does not import beside torch $torch_after (a build for" \
    "another torch: its compiled ops do not load). For a +cpu torch install torchvision's CPU" \
    "build of the same version, with --no-deps, from https://download.pytorch.org/whl/cpu" >&2
fi
echo "$want" > "$stamp"
echo "peers installed (torch $torch_after)"
