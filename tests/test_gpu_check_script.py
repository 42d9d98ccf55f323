"""bench/gpu_check.sh and bench/gpu_check.py: what can be checked without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_shell_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "bench/gpu_check.sh")], check=True)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine")
def test_shell_script_stops_clearly_without_a_gpu(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    p = subprocess.run(
        ["bash", str(ROOT / "bench/gpu_check.sh")], capture_output=True, text=True, env=env
    )
    assert p.returncode == 2
    assert "no NVIDIA GPU" in p.stderr


def test_dry_run_runs_the_cpu_half(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench/gpu_check.py"), "--dry-run", "--out", str(out)],
        check=True,
        cwd=ROOT,
        timeout=300,
    )
    r = json.loads(out.read_text())
    assert r["cpu_only"] and r["status"] == "ok" and r["parity_ok"]
    (entry,) = r["configs"].values()
    assert entry["cpu"]["output_frames_per_s"] > 0 and entry["gpu"]["output_frames_per_s"] > 0
    assert entry["parity"]["max_abs_diff"] == 0  # native size: bit-identical to the CPU path
    rows = r["tolerance_vs_swscale"]
    assert len(rows) == 32
    assert all(row["max_abs_diff"] <= 1 for row in rows if row["flags"] == "parity")
    native_default = [row for row in rows if row["flags"] != "parity" and "native" in row["size"]]
    assert native_default and all(row["max_abs_diff"] == 0 for row in native_default)
