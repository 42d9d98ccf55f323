"""A lean install: the runtime set, from this repository's own files, into a fresh virtualenv.

Builds ``pip install --no-compile . -c requirements/constraints.txt`` (what
``scripts/demo.sh`` installs, less the editable link) from a copy of the package files,
checks the virtualenv's size against the figure the README states (within 20%), that no
test-only or GPU-only library came with it, and that ``treadle --root DIR demo`` runs in it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_RUNTIME = ("triton", "transformers", "datasets", "streaming", "webdataset", "pytest")


def readme_size_mib() -> int:
    """The runtime virtualenv size the README states ("... 1,330 MiB ...")."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"runtime virtualenv\s+is\s+([\d,]+)\s+MiB", text)
    assert m, "README.md states no runtime virtualenv size in MiB"
    return int(m.group(1).replace(",", ""))


def tree_mib(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = Path(dirpath, f)
            if not p.is_symlink():
                total += p.stat().st_blocks * 512  # what du counts
    return total / 2**20


@pytest.mark.slow
def test_runtime_install_is_lean_and_runs_the_demo(tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "requirements", src / "requirements")
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    cons = "requirements/constraints.txt"
    pip = [str(py), "-m", "pip", "install", "-q", "--no-compile", ".", "-c", cons]
    proc = subprocess.run(pip, cwd=src, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]

    listed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout.lower()
    names = {line.split("==")[0] for line in listed.split()}
    assert not names & {n.replace("streaming", "mosaicml-streaming") for n in NOT_RUNTIME}

    size, stated = tree_mib(venv), readme_size_mib()
    assert 0.8 * stated <= size <= 1.2 * stated, f"venv is {size:.0f} MiB, README says {stated}"

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    probe = "import sys, treadle; print(treadle.__version__, 'triton' in sys.modules)"
    out = subprocess.run([str(py), "-c", probe], env=env, capture_output=True, text=True)
    assert out.stdout.split() == [treadle_version(), "False"], out.stderr[-2000:]

    store = tmp_path / "store"
    demo = [str(venv / "bin" / "treadle"), "--root", str(store), "demo"]
    demo += ["--steps", "6", "--checkpoint-every", "2", "--check", "2"]
    run = subprocess.run(demo, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "every batch matches" in run.stdout and "\r" not in run.stdout + run.stderr


def treadle_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_import_treadle_loads_no_gpu_module():
    """`import treadle` leaves Triton and the GPU package alone (they load on device="cuda")."""
    probe = (
        "import sys, treadle; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton' "
        "or m.startswith('treadle.gpu')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
