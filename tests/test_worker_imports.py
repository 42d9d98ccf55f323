"""Worker processes (and the forkserver they fork from) import treadle's read path, never
torch: batches are numpy arrays written into shared-memory slots, so the server's start
(the cold start of a ``workers=N`` loader) does not pay for ``import torch``."""

from __future__ import annotations

import multiprocessing
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


def _torch_libs(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if "libtorch" in line}


@pytest.mark.slow  # worker processes
def test_workers_and_their_server_have_no_torch_loaded(tmp_path):
    branch = td.Client(str(tmp_path / "store"), create=True).project("p").branch()
    rng = np.random.default_rng(0)
    branch.table("t").append({"x": rng.standard_normal((40, 3), dtype=np.float32)})
    recipe = td.Recipe(seed=1, batch_size=8, components=[td.Component(branch.table("t"), None)])
    want = list(td.TrainLoader(recipe, steps=4))
    it = iter(td.TrainLoader(recipe, workers=2))  # no steps: the workers stay up, waiting
    got = [next(it) for _ in range(4)]
    assert all((g["x"] == w["x"]).all() for g, w in zip(got, want))
    workers = [p for p in multiprocessing.active_children() if p.name.startswith("treadle-worker")]
    assert len(workers) == 2
    server = forkserver._forkserver._forkserver_pid
    loaded = {pid: _torch_libs(pid) for pid in [server, *(p.pid for p in workers)]}
    it.close()
    assert not any(loaded.values()), f"torch loaded in the forkserver or a worker: {loaded}"
