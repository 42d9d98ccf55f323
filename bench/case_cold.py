"""Case ``cold``: the first batch of the first ``workers=2`` loader in a fresh process
(issue 33, goal 2: <= 1 s, median of 5 fresh processes).

Also reported: the second batch (the first a worker sends: without a transform the loader
reads the first step itself while its workers start) and the CPU seconds of the worker
processes' server (its imports and forks), steadier than the wall time on a shared machine.

Each measurement is a new Python process that imports torch and treadle (not timed: a
training script pays that anyway), then times ``td.TrainLoader(recipe, workers=2)`` from
its construction to its first batch (the plan, and the loader reading its first step while
the worker processes' server starts and imports treadle's read path) and to its second (two
workers forked from that server, rebuilding the plan and reading). Recipes: ``mix`` (two
tables of 64x64x3 images and float32[7] actions, 30/70, batch 64) and ``video`` (4-frame
64x64 H.264 windows, batch 8). With ``--preload`` the process calls
``td.preload_workers()`` after its imports and sleeps ``--model-s`` (a model loading)
before it makes the loader.

    python bench/case_cold.py [--runs 5] [--preload] [--model-s 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECIPES = ("mix", "video")


def data_dir() -> Path:
    return Path(os.environ.get("TREADLE_BENCH_DATA") or HERE / "data") / "cold"


def generate(log: Callable[[str], None] = print) -> Path:
    """Two image/action tables and one video table (once; a ``.done`` marker)."""
    import numpy as np

    import treadle as td

    root = data_dir()
    if (root / "treadle.done").exists():
        return root
    log("  generating the cold-start tables")
    branch = td.Client(str(root / "treadle"), create=True).project("cold").branch()
    rng = np.random.default_rng(0)
    for t, n in (("fails", 2000), ("nominal", 4000)):
        images = rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8)
        actions = rng.standard_normal((n, 7), dtype=np.float32)
        branch.table(t).append({"image": images, "action": actions})
    for e in range(8):
        frames = rng.integers(0, 256, (48, 64, 64, 3), dtype=np.uint8)
        branch.table("cam").append_episode(
            {
                "cam": td.VideoFrames(frames, fps=15),
                "action": rng.random((48, 7), dtype=np.float32),
            },
            episode=f"e{e}",
        )
    (root / "treadle.done").write_text("ok\n")
    return root


def recipe(root: Path, which: str) -> Any:
    import treadle as td

    branch = td.Client(str(root / "treadle")).project("cold").branch()
    if which == "mix":
        comps = [
            td.Component(
                branch.table(t),
                td.Windows({"image": td.Rows([0]), "action": td.Rows([0])}),
                weight=w,
            )
            for t, w in (("fails", 0.3), ("nominal", 0.7))
        ]
        return td.Recipe(seed=1, batch_size=64, components=comps)
    win = td.Windows({"cam": td.Video(range(4)), "action": td.Rows(range(4))})
    return td.Recipe(seed=1, batch_size=8, components=[td.Component(branch.table("cam"), win)])


def _server_cpu() -> float | None:
    """CPU seconds the worker processes' server has used (its imports, then forks)."""
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(root: Path, which: str, preload: bool, model_s: float) -> dict[str, Any]:
    """One fresh process's numbers (run as ``--child``)."""
    t0 = time.perf_counter()
    import torch  # noqa: F401

    import treadle as td

    out: dict[str, Any] = {"import_s": time.perf_counter() - t0}
    if preload:
        t1 = time.perf_counter()
        td.preload_workers()
        out["preload_call_s"] = time.perf_counter() - t1
        time.sleep(model_s)
    r = recipe(root, which)
    t1 = time.perf_counter()
    loader = td.TrainLoader(r, workers=2, steps=4)
    it = iter(loader)
    next(it)
    out["first_batch_s"] = time.perf_counter() - t1
    next(it)  # without a transform the loader reads the first step itself: the second
    out["second_batch_s"] = time.perf_counter() - t1  # is the first a worker sends
    out["server_cpu_s"] = _server_cpu()  # imported and forked by now
    for _ in it:
        pass
    out["last_batch_s"] = time.perf_counter() - t1
    return out


def measure(runs: int, preload: bool = False, model_s: float = 1.0,
            log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """``runs`` fresh processes per recipe, interleaved; medians and every run."""
    root = generate(log)
    got: dict[str, list[dict[str, Any]]] = {w: [] for w in RECIPES}
    for _ in range(runs):
        for which in RECIPES:
            cmd = [sys.executable, __file__, "--child", which, "--model-s", str(model_s)]
            cmd += ["--preload"] if preload else []
            p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                               "TREADLE_BENCH_DATA": str(root.parent)})  # fmt: skip
            if p.returncode:
                raise RuntimeError(f"cold-start child {which} failed:\n{p.stderr[-3000:]}")
            got[which].append(json.loads(p.stdout.strip().splitlines()[-1]))
    return {
        which: {
            "median_first_batch_s": statistics.median(x["first_batch_s"] for x in xs),
            "median_import_s": statistics.median(x["import_s"] for x in xs),
            "median_second_batch_s": statistics.median(x["second_batch_s"] for x in xs),
            "preload": preload,
            "runs": xs,
        }
        for which, xs in got.items()
    }


def results(tiny: bool, runs: int) -> list[Any]:
    """The suite's rows (``treadle bench --cases cold``): one Result per recipe, a Run per
    fresh process (wall: its first batch; CPU: the worker server's). 5 processes (the goal's
    median of 5) whatever ``runs`` says; 2 when tiny."""
    from benchlib import Result, Run

    got = measure(2 if tiny else 5, log=lambda m: print(m, flush=True))
    out = []
    for which, r in got.items():
        res = Result("cold", "treadle", {"recipe": which, "label": f"{which}: first batch, "
                     "first workers=2 loader, fresh process"}, "batch")  # fmt: skip
        res.runs = [Run(x["first_batch_s"], x.get("server_cpu_s") or 0.0, 1, x["first_batch_s"])
                    for x in r["runs"]]  # fmt: skip
        res.extra["median_second_batch_s"] = r["median_second_batch_s"]
        out.append(res)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--preload", action="store_true")
    ap.add_argument("--model-s", type=float, default=1.0)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(data_dir(), args.child, args.preload, args.model_s)))
        return
    res = measure(args.runs, args.preload, args.model_s)
    for which, r in res.items():
        firsts = ", ".join(f"{x['first_batch_s']:.2f}" for x in r["runs"])
        seconds = ", ".join(f"{x['second_batch_s']:.2f}" for x in r["runs"])
        print(f"{which}: median first batch {r['median_first_batch_s']:.3f} s ({firsts}); "
              f"second {r['median_second_batch_s']:.3f} s ({seconds}); "
              f"median import {r['median_import_s']:.2f} s; median server CPU "
              f"{statistics.median(x['server_cpu_s'] or 0 for x in r['runs']):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
