#!/usr/bin/env bash
# GPU check for issue 8, for a machine with an NVIDIA GPU, from a fresh checkout (< 8 min).
#
#   1. checks the GPU and driver (nvidia-smi);
#   2. finds a Python with a CUDA torch, or builds .venv-gpu from wheels: torch 2.13.0
#      (PyPI's Linux wheel is the CUDA build; TORCH_INDEX_URL picks another index, e.g.
#      https://download.pytorch.org/whl/cu128), triton 3.9.0, requirements/dev.txt, and
#      treadle itself (editable). TREADLE_GPU_PYTHON=/path/to/python skips this step;
#   3. runs the GPU tests (tests/test_gpu_*.py: on a GPU the kernel is compiled and run
#      on CUDA, NVDEC output is checked bit for bit against software decode, GPU batches
#      against the CPU path);
#   4. runs bench/gpu_check.py: decoded frames/s and batch latency for 90x224x224 and
#      16x640x480 windows, GPU vs CPU path, raw NVDEC rate as the limit, parity.
#
# Results: $OUT (or bench/results)/gpu_check.json and gpu_tests.xml. Exit status 0 only
# when the tests pass and the GPU batches match the CPU batches within tolerance.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
RESULTS=${OUT:-bench/results}
mkdir -p "$RESULTS"
step() { printf '\n== [%3ss] %s\n' "$((SECONDS - START))" "$*"; }
die() { echo "gpu_check: $1" >&2; exit "${2:-1}"; }

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  || die "no NVIDIA GPU or driver (nvidia-smi failed)" 2

step "Python with CUDA torch"
has_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
PY=${TREADLE_GPU_PYTHON:-}
if [ -z "$PY" ] && [ -x .venv/bin/python ] && has_cuda .venv/bin/python; then
  PY=.venv/bin/python
fi
if [ -z "$PY" ]; then
  VENV=.venv-gpu
  BASE=$(command -v python3.11 || command -v python3) || die "no python3 found" 3
  [ -x "$VENV/bin/python" ] || "$BASE" -m venv "$VENV" || die "could not create $VENV" 3
  PY=$VENV/bin/python
  if ! has_cuda "$PY"; then
    "$PY" -m pip install -q --upgrade pip
    # torch first and alone, so that nothing else picks its build.
    "$PY" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
      "torch==2.13.0" || die "pip could not install torch==2.13.0" 3
    "$PY" -m pip install -q "triton==3.9.0" -r requirements/dev.txt \
      || die "pip could not install requirements/dev.txt" 3
    "$PY" -m pip install -q --no-deps -e . || die "pip could not install treadle" 3
  fi
fi
"$PY" - <<'EOF' || die "torch in $PY has no CUDA: set TORCH_INDEX_URL (a CUDA wheel index) or TREADLE_GPU_PYTHON" 3
import av, torch
print(f"python {torch.__version__=} cuda={torch.version.cuda} av={av.__version__}")
assert torch.cuda.is_available()
print("device:", torch.cuda.get_device_name(0))
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton: not installed (the transform will run as torch ops)")
EOF

step "GPU tests"
"$PY" -m pytest -q -p no:cacheprovider --junitxml="$RESULTS/gpu_tests.xml" tests/test_gpu_*.py
TESTS_RC=$?

step "Benchmark (CPU path vs GPU path vs raw NVDEC)"
timeout 300 "$PY" bench/gpu_check.py --out "$RESULTS/gpu_check.json" "$@"
BENCH_RC=$?

step "Summary"
"$PY" - "$RESULTS/gpu_check.json" <<'EOF' || true
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r.get("status"), "| parity ok:", r.get("parity_ok"),
      "| >= 0.9x raw NVDEC:", r.get("goal_0.9x_raw_nvdec"))
for name, e in r.get("configs", {}).items():
    line = (f"{name:>24}: CPU {e['cpu']['output_frames_per_s']:8.0f} fr/s "
            f"{e['cpu']['batch_latency_ms_median']:7.1f} ms | GPU {e['gpu']['output_frames_per_s']:8.0f} fr/s "
            f"{e['gpu']['batch_latency_ms_median']:7.1f} ms")
    if "raw_nvdec" in e:
        line += (f" | decoded {e['gpu']['decoded_frames_per_s']:.0f}/s vs raw NVDEC "
                 f"{e['raw_nvdec']['decoded_frames_per_s']:.0f}/s = {e['gpu_vs_raw_nvdec']:.2f}x")
    line += f" | max diff {e['parity']['max_abs_diff_levels']:.0f} levels"
    print(line)
EOF
echo "tests rc=$TESTS_RC bench rc=$BENCH_RC, $((SECONDS - START)) s, results in $RESULTS/"
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
