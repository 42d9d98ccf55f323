"""Worker processes (and the forkserver they fork from) import treadle's read path, never
torch: batches are numpy arrays written into shared-memory slots, so the server's start
(the cold start of a ``workers=N`` loader) does not pay for ``import torch`` (nor for
``importlib.metadata``, which only ``treadle.__version__`` needs, nor for the importers)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from multiprocessing import forkserver

import numpy as np
import pytest

import treadle as td
from script_helpers import run_script
from treadle.workers import processes
from treadle.workers.nopandas import SERVER_ENV

_CHECK = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import treadle
heavy = ("torch", "transformers", "datasets", "matplotlib", "importlib.metadata",
         "treadle.importers")
heavy = sorted(m for m in heavy if m in sys.modules)
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


_PANDAS = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print("pandas" in sys.modules)
import pandas as pd
import pyarrow as pa
print(pa.array(pd.Series(pd.Categorical(["a", "b"]))).type)
"""


def test_the_worker_server_imports_no_pandas_and_pyarrow_still_knows_pandas_later():
    # pyarrow.dataset imported pandas (0.15-0.4 s of the server's start); a worker whose
    # transform imports pandas must still have pyarrow see pandas objects (a categorical
    # Series became a plain string array when pyarrow was not told)
    preload = [m for m in processes._PRELOAD if m != "__main__"]
    env = {**os.environ, SERVER_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", _PANDAS, *preload],
                         capture_output=True, text=True, check=True, env=env)  # fmt: skip
    assert out.stdout.split("\n", 1) == ["False", "dictionary<values=large_string, indices=int8,"
                                         " ordered=0>\n"], out.stdout  # fmt: skip
    env.pop(SERVER_ENV)  # any other process imports pyarrow as it always did
    out = subprocess.run([sys.executable, "-c", _PANDAS, *preload],
                         capture_output=True, text=True, check=True, env=env)  # fmt: skip
    assert out.stdout.split("\n", 1)[0] == "True", out.stdout


def test_preload_workers_starts_the_server_once():
    server = forkserver._forkserver
    td.preload_workers(wait=True)
    pid = server._forkserver_pid
    assert pid is not None and os.path.exists(f"/proc/{pid}")
    assert SERVER_ENV not in os.environ  # set only while the server starts
    td.preload_workers()
    assert server._forkserver_pid == pid
    assert "pandas/_libs" not in open(f"/proc/{pid}/maps").read()


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


_MAIN = """
import os
import sys

with open(os.environ["TREADLE_TEST_RUNS"], "a") as f:  # who ran this module, as what
    f.write(f"{__name__} {os.getpid()}\\n")

import numpy as np

import treadle as td


def plus_one(batch, seeds):
    batch["x"] = batch["x"] + 1
    return batch


def mark(line):
    with open(os.environ["TREADLE_TEST_RUNS"], "a") as f:
        f.write(line + "\\n")


if __name__ == "__main__":
    branch = td.Client(sys.argv[1], create=True).project("p").branch()
    branch.table("t").append({"x": np.arange(40, dtype=np.float32).reshape(20, 2)})
    recipe = td.Recipe(seed=1, batch_size=4, components=[td.Component(branch.table("t"), None)])
    want = [b["x"] for b in td.TrainLoader(recipe, steps=4)]
    got = [b["x"] for b in td.TrainLoader(recipe, steps=4, workers=2)]
    print("plain", all((g == w).all() for g, w in zip(got, want)))
    mark("-- a transform defined here")
    got = [b["x"] for b in td.TrainLoader(recipe, steps=4, workers=2, transform=plus_one)]
    print("transform", all((g == w + 1).all() for g, w in zip(got, want)))
"""


@pytest.mark.slow  # worker processes
def test_workers_run_the_main_module_only_for_what_their_job_defines_there(tmp_path):
    # A training script is often `import torch` and more: a worker that re-ran it (as
    # multiprocessing does) paid about a second at every loader start, for nothing
    # unless the transform is defined in it.
    runs = tmp_path / "runs.txt"
    env = {**os.environ, "TREADLE_TEST_RUNS": str(runs)}
    out = run_script(tmp_path, _MAIN, tmp_path / "store", name="train.py", env=env, timeout=300)
    assert out.stdout.split() == ["plain", "True", "transform", "True"], out.stdout
    before, after = runs.read_text().split("-- a transform defined here\n")
    (name, main_pid), *workers = (line.split() for line in before.splitlines())
    assert name == "__main__"
    assert workers == [], f"workers without a transform re-ran the main module: {workers}"
    again = [line.split() for line in after.splitlines()]
    assert [n for n, _ in again] == ["__mp_main__"] * 2, again
    assert len({p for _, p in again} | {main_pid}) == 3, again


_GUARDED = """
import sys

import numpy as np

import treadle as td

if __name__ == "__main__":

    def plus_one(batch, seeds):  # defined in the guard: the workers' main module lacks it
        batch["x"] = batch["x"] + 1
        return batch

    branch = td.Client(sys.argv[1], create=True).project("p").branch()
    branch.table("t").append({"x": np.arange(40, dtype=np.float32).reshape(20, 2)})
    recipe = td.Recipe(seed=1, batch_size=4, components=[td.Component(branch.table("t"), None)])
    try:
        list(td.TrainLoader(recipe, steps=4, workers=1, transform=plus_one))
    except Exception as e:
        print("ERROR", e)
"""


@pytest.mark.slow  # worker processes
def test_a_transform_the_workers_cannot_load_is_named_in_the_training_process(tmp_path):
    """A transform defined under the script's ``if __name__ == "__main__":`` pickles here
    but not in a worker, whose main module runs without the guard: the worker exited
    (code 1), its reason on stderr only; the error now says which transform and why."""
    out = run_script(tmp_path, _GUARDED, tmp_path / "store", name="train.py", timeout=300)
    said = out.stdout
    assert said.startswith("ERROR treadle worker process 0 cannot load the loader's transform")
    assert "plus_one" in said and 'if __name__ == "__main__":' in said, said


_UNGUARDED = """
import sys

import numpy as np

import treadle as td


def plus_one(batch, seeds):
    batch["x"] = batch["x"] + 1
    return batch


client = td.Client(sys.argv[1], create=True)
branch = client.project("p").branch()
if "p" not in client.projects():  # the workers run this script again: write once
    branch.table("t").append({"x": np.arange(40, dtype=np.float32).reshape(20, 2)})
recipe = td.Recipe(seed=1, batch_size=4, components=[td.Component(branch.table("t"), None)])
list(td.TrainLoader(recipe, steps=4, workers=1, transform=plus_one))  # no __main__ guard
"""


@pytest.mark.slow  # worker processes
def test_a_script_without_the_main_guard_is_told_to_add_it(tmp_path):
    # before: "cannot load the loader's transform (RuntimeError: An attempt has been made to
    # start a new process before ...): ... define it at the top level of a module, not ...
    # under `if __name__ == "__main__":`", the opposite of the fix (the transform was at the
    # top level; the loop was not under the guard)
    script = tmp_path / "train.py"
    script.write_text(_UNGUARDED)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()
    said = next(line for line in last if line.startswith("treadle.errors.TreadleError"))
    assert "ran the script's own loader again" in said, said
    assert "put the code that builds and iterates the loader under `if __name__ ==" in said
    assert "not inside a function nor under" not in said
