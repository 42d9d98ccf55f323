"""Worker processes (and the forkserver they fork from) import treadle's read path, never
torch: batches are numpy arrays written into shared-memory slots, so the server's start
(the cold start of a ``workers=N`` loader) does not pay for ``import torch``."""

from __future__ import annotations

import subprocess
import sys
from multiprocessing import forkserver

import numpy as np
import pytest

import treadle as td
from treadle.torch import processes

_CHECK = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import treadle
heavy = sorted(m for m in ("torch", "transformers", "datasets", "matplotlib") if m in sys.modules)
print(",".join(heavy))
"""


def test_what_the_forkserver_preloads_imports_no_torch():
    preload = [m for m in processes._PRELOAD if m != "__main__"]
    assert preload, processes._PRELOAD
    out = subprocess.run(
        [sys.executable, "-c", _CHECK, *preload],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "", f"{preload} imported {out.stdout.strip()}"


def test_import_treadle_keeps_the_torch_names_lazily():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, treadle as td; a = 'torch' in sys.modules; "
         "print(a, td.TrainLoader.__name__, td.EvalLoader.__name__, 'torch' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["False", "TrainLoader", "EvalLoader", "True"]


@pytest.mark.slow  # worker processes
def test_the_server_workers_fork_from_has_no_torch_loaded(tmp_path):
    branch = td.Client(str(tmp_path / "store"), create=True).project("p").branch()
    rng = np.random.default_rng(0)
    branch.table("t").append({"x": rng.standard_normal((40, 3), dtype=np.float32)})
    recipe = td.Recipe(seed=1, batch_size=8, components=[td.Component(branch.table("t"), None)])
    got = list(td.TrainLoader(recipe, steps=4, workers=2))
    want = list(td.TrainLoader(recipe, steps=4))
    assert all((g["x"] == w["x"]).all() for g, w in zip(got, want)) and len(got) == 4
    pid = forkserver._forkserver._forkserver_pid
    assert pid is not None
    with open(f"/proc/{pid}/maps") as f:
        torch_libs = {line.split()[-1] for line in f if "libtorch" in line}
    assert not torch_libs, f"the forkserver (pid {pid}) loaded {sorted(torch_libs)}"
