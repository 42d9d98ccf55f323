"""Case ``memory``: peak RSS per process is flat in the number of episodes (issue 33, goal 1).

Tables (written once under ``bench/data/memory/``, a few large appends each):

- ``rows_<n>``: ``n`` episodes x 20 moments of a float32[4] action, n = 10k, 100k, 1M;
- ``video_<n>``: ``n`` episodes x 4 frames of 32x32 H.264 (one encoded stream whose bytes
  are stored once and named by every episode's index, so writing 100k episodes takes
  seconds) and the action, n = 10k, 100k.

Each measurement is a fresh process: ``td.TrainLoader(recipe, workers=w, steps=2000)``
over one table (rows: batch 64 of 4-row windows; video: batch 8 of 2-frame windows and
2 action rows), read to the end. Reported: the peak RSS (``VmHWM``) of the training
process and of each worker (read just before its last batch, while it is alive), and the
training process's RSS after its imports. ``report.py`` judges the growth from the
fewest episodes to the most per process: <= 64 MiB.

    python bench/case_memory.py [--sizes 10000 100000 1000000] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROWS_SIZES = (10_000, 100_000, 1_000_000)
VIDEO_SIZES = (10_000, 100_000)
MOMENTS = 20  # rows per episode of the rows tables
FRAMES = 4  # frames per episode of the video tables
CHUNK = 100_000  # episodes per append


def kinds(sizes: tuple[int, ...]) -> dict[str, list[int]]:
    """The sizes each kind of table is measured at: rows at all, video up to 100k."""
    return {"rows": sorted(sizes), "video": sorted(n for n in sizes if n <= max(VIDEO_SIZES))}


def data_dir() -> Path:
    return Path(os.environ.get("TREADLE_BENCH_DATA") or HERE / "data") / "memory"


def peak_mib(pid: int | str = "self") -> float:
    """Peak resident memory (``VmHWM``) of a process, MiB."""
    return _status(pid, "VmHWM:")


def rss_mib(pid: int | str = "self") -> float:
    return _status(pid, "VmRSS:")


def _status(pid: int | str, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


def _ids(first: int, count: int, per: int) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    names = pa.array([f"ep-{i:07d}" for i in range(first, first + count)], pa.string())
    return {
        "episode": pc.take(names, pa.array(np.repeat(np.arange(count), per))),
        "frame": pa.array(np.tile(np.arange(per, dtype=np.int32), count)),
    }


def write_rows(branch: Any, name: str, episodes: int, moments: int = MOMENTS) -> None:
    """``episodes`` x ``moments`` rows of a float32[4] action, in appends of 100k episodes."""
    import numpy as np

    rng = np.random.default_rng(0)
    with branch.transaction(f"write {name}") as tx:
        for first in range(0, episodes, CHUNK):
            count = min(CHUNK, episodes - first)
            cols = _ids(first, count, moments)
            cols["action"] = rng.random((count * moments, 4), dtype=np.float32)
            tx.table(name).append(cols)


def write_video(branch: Any, name: str, episodes: int, frames: int = FRAMES) -> None:
    """``episodes`` x ``frames`` frames naming one 32x32 stream stored once, and the action."""
    import numpy as np
    import pyarrow as pa

    import treadle as td
    from treadle.table.tensors import KIND_KEY, column_from_values
    from treadle.video import encode_value, index_to_arrow
    from treadle.video.column_layout import video_struct_type

    rng = np.random.default_rng(0)
    stream = encode_value(
        td.VideoFrames(rng.integers(0, 255, (frames, 32, 32, 3), np.uint8), fps=15)
    )
    project = branch.project
    key = stream.media_key(name)
    project.client.store.put(f"{project.prefix}/{key}", stream.data)
    one = index_to_arrow(key, stream)
    schema = None
    with branch.transaction(f"write {name}") as tx:
        for first in range(0, episodes, CHUNK):
            count = min(CHUNK, episodes - first)
            cols = _ids(first, count, frames)
            f, a = column_from_values("action", rng.random((count * frames, 4), dtype=np.float32))
            schema = schema or pa.schema([
                pa.field("episode", pa.string()), pa.field("frame", pa.int32()),
                pa.field("cam", video_struct_type(), metadata={KIND_KEY: b"video"}), f,
            ])  # fmt: skip
            cam = pa.concat_arrays([one] * count)
            tx.table(name).append(
                pa.Table.from_arrays([cols["episode"], cols["frame"], cam, a], schema=schema)
            )


def generate(sizes: tuple[int, ...] = ROWS_SIZES, log: Callable[[str], None] = print) -> Path:
    """The tables of every size (each once: a ``.done`` marker per table)."""
    import treadle as td

    root = data_dir()
    root.mkdir(parents=True, exist_ok=True)
    branch = td.Client(str(root / "treadle"), create=True).project("memory").branch()
    for kind, write in (("rows", write_rows), ("video", write_video)):
        for n in kinds(sizes)[kind]:
            if (root / f"{kind}_{n}.done").exists():
                continue
            t0 = time.perf_counter()
            write(branch, f"{kind}_{n}", n)
            (root / f"{kind}_{n}.done").write_text(f"{time.perf_counter() - t0:.1f} s\n")
            log(f"  wrote {kind}_{n} in {time.perf_counter() - t0:.1f} s")
    return root


def recipe(table: Any, kind: str) -> Any:
    import treadle as td

    if kind == "rows":
        win = td.Windows({"action": td.Rows(range(4))})
        return td.Recipe(seed=1, batch_size=64, components=[td.Component(table, win)])
    win = td.Windows({"cam": td.Video(range(2)), "action": td.Rows(range(2))})
    return td.Recipe(seed=1, batch_size=8, components=[td.Component(table, win)])


def child(root: Path, kind: str, episodes: int, workers: int, steps: int) -> dict[str, Any]:
    """One fresh process: read ``steps`` batches; peaks of this process and its workers."""
    import multiprocessing

    import torch  # noqa: F401  (a training process has it)

    import treadle as td

    out: dict[str, Any] = {"rss_after_imports_mib": rss_mib()}
    table = td.Client(str(root / "treadle")).project("memory").branch().table(f"{kind}_{episodes}")
    t0 = time.perf_counter()
    loader = td.TrainLoader(recipe(table, kind), workers=workers, steps=steps)
    workers_peak: dict[str, float] = {}
    for i, _ in enumerate(loader):
        if workers and i in (steps // 2, steps - 4 * workers - 4):  # workers still alive
            for p in multiprocessing.active_children():
                if p.name.startswith("treadle-worker-"):
                    workers_peak[p.name] = max(workers_peak.get(p.name, 0.0), peak_mib(p.pid))
    out["seconds"] = time.perf_counter() - t0
    out["main_peak_mib"] = peak_mib()
    out["workers_peak_mib"] = [workers_peak[k] for k in sorted(workers_peak)]
    return out


def measure(sizes: tuple[int, ...] = ROWS_SIZES, steps: int = 2000,
            log: Callable[[str], None] = print) -> list[dict[str, Any]]:  # fmt: skip
    """Every (data, workers, episodes) in a fresh process."""
    generate(sizes, log)
    out = []
    for kind, kind_sizes in kinds(sizes).items():
        for workers in (0, 2):
            for n in kind_sizes:
                cmd = [sys.executable, __file__, "--child", kind, str(n), str(workers),
                       "--steps", str(steps)]  # fmt: skip
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode:
                    raise RuntimeError(f"memory child {kind} {n} w={workers}:\n{p.stderr[-3000:]}")
                got = json.loads(p.stdout.strip().splitlines()[-1])
                got.update(data=kind, episodes=n, workers=workers)
                log(f"  {kind} {n:>9,} episodes, workers={workers}: main peak "
                    f"{got['main_peak_mib']:.0f} MiB, workers' peaks "
                    f"{[round(x) for x in got['workers_peak_mib']]} MiB ({got['seconds']:.0f} s)")  # fmt: skip
                out.append(got)
    return out


def results(tiny: bool, runs: int) -> list[Any]:
    """The suite's rows (``treadle bench --cases memory``): per (data, workers, process) the
    peak RSS at each size in ``extra["peak_mib"]`` (tiny: 1k and 10k episodes, 200 steps)."""
    from benchlib import Result

    sizes = (1_000, 10_000) if tiny else ROWS_SIZES
    got = measure(sizes, 200 if tiny else 2000, log=lambda m: print(m, flush=True))
    out: dict[tuple[str, int, str], Any] = {}
    for g in got:
        procs = [("training process", g["main_peak_mib"])]
        procs += [(f"worker {k}", x) for k, x in enumerate(g["workers_peak_mib"])]
        for proc, mib in procs:
            key = (g["data"], g["workers"], proc)
            if key not in out:
                label = f"{g['data']}, workers={g['workers']}, {proc}"
                out[key] = Result("memory", "treadle", {"data": g["data"], "workers": g["workers"],
                                  "process": proc, "label": label}, "MiB")  # fmt: skip
                out[key].extra["peak_mib"] = {}
            out[key].extra["peak_mib"][str(g["episodes"])] = mib
    return list(out.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=list(ROWS_SIZES))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", default=None, help="write OUT.json")
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, n, w = args.child
        print(json.dumps(child(data_dir(), kind, int(n), int(w), args.steps)))
        return
    got = measure(tuple(args.sizes), args.steps)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(got, indent=1) + "\n")


if __name__ == "__main__":
    main()
