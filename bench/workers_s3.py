"""Issue 48's worker goal: ``workers=2`` against ``workers=0`` on S3, wide and narrow columns.

Rows (each from a cold object cache, rounds interleaved, timed after ``--warm`` batches, by
default ``1 + 2 * (prefetch + 1)`` for both worker counts, as the suite times a workers=N
loader: its workers started and their slots filled):

- **wide**: one table of ``--wide-rows`` rows of a 256 KiB uint8 tensor (256x256x4), batches
  of 16; the table fits the object cache (its data files are copied once and mapped);
- **narrow**: ``case_mix``'s two tables (64x64x3 uint8 image and 7 floats), batches of 64;
- **beyond**: the narrow tables past the cache (``bench/beyond_cache.py``'s case): the
  object cache and the chunk cache bounded to 1/8 of their data files,
  ``td.BlockShuffle(block_rows=--block-rows)`` and ``TrainLoader(lookahead=--lookahead)``
  (the chunk cache driven by the plan; with workers the loader's process fetches and the
  workers read rows from the chunks).

The tables are on SeaweedFS on 127.0.0.1 (no added latency), which shares the cores with the
loader. Printed per row: MiB/s and samples/s, and per round ``workers=2 / workers=0``; the
load average before and after each round (a shared machine: compare within a round).

    python bench/workers_s3.py [--wide-rows 1024] [--wide-steps 300] [--narrow-rows 12000]
        [--narrow-steps 300] [--rounds 3] [--lookahead 16] [--only wide,narrow,beyond]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import case_mix as cm  # noqa: E402
import case_s3 as c3  # noqa: E402
from benchlib import cold_object_cache, tree_cpu  # noqa: E402

WIDE_SHAPE = (256, 256, 4)  # 256 KiB a sample
WIDE_BATCH = 16


def write_wide(root: Path, rows: int) -> None:
    """One table of ``rows`` wide samples (and a 7-float action), in 256-row appends."""
    import treadle as td

    branch = td.Client(str(root), create=True).project("bench").branch()
    rng = np.random.default_rng(0)
    for at in range(0, rows, 256):
        n = min(256, rows - at)
        branch.table("wide").append({
            "image": rng.integers(0, 256, (n, *WIDE_SHAPE), dtype=np.uint8),
            "action": rng.standard_normal((n, 7), dtype=np.float32)})  # fmt: skip


def write_narrow(root: Path, rows: int) -> None:
    cm._write_treadle(root, rows)


def recipe(client, case: str, block_rows: int):  # noqa: ANN001, ANN201
    import treadle as td

    branch = client.project("bench").branch()
    if case == "narrow":
        comps = [td.Component(branch.table(t), None, weight=w)
                 for t, w in zip(cm.TABLES, cm.WEIGHTS)]  # fmt: skip
        return td.Recipe(seed=48, batch_size=cm.BATCH, components=comps)
    if case == "beyond":
        comps = [td.Component(branch.table(t), None, weight=w)
                 for t, w in zip(cm.TABLES, cm.WEIGHTS)]  # fmt: skip
        return td.Recipe(seed=48, batch_size=cm.BATCH, components=comps,
                         shuffle=td.BlockShuffle(block_rows=block_rows))  # fmt: skip
    comps = [td.Component(branch.table("wide"), None)]
    return td.Recipe(seed=48, batch_size=WIDE_BATCH, components=comps)


def workers_cpu() -> float:
    """CPU seconds of the worker processes so far (the process server's descendants)."""
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid
    return tree_cpu(pid) if pid else 0.0


def run(client, case: str, workers: int, steps: int, a: argparse.Namespace
        ) -> tuple[float, int, int, float, float]:  # noqa: ANN001  # fmt: skip
    """(seconds for ``steps`` batches after ``a.warm``, samples, bytes of the batches, CPU
    seconds of this process and of the workers meanwhile)."""
    import treadle as td

    look = a.lookahead if case == "beyond" else None
    loader = td.TrainLoader(recipe(client, case, a.block_rows), steps=steps + a.warm,
                            prefetch=a.prefetch, workers=workers, lookahead=look)  # fmt: skip
    it = iter(loader)
    for _ in range(a.warm):
        next(it)
    t0, c0, w0 = time.perf_counter(), time.process_time(), workers_cpu()
    n = nbytes = 0
    for b in it:
        n += len(b["_moment"])
        nbytes += sum(v.numel() * v.element_size() for v in b.values())
    wall, cpu, wcpu = time.perf_counter() - t0, time.process_time() - c0, workers_cpu() - w0
    return wall, n, nbytes, cpu, wcpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wide-rows", type=int, default=1024)
    ap.add_argument("--wide-steps", type=int, default=300)
    ap.add_argument("--narrow-rows", type=int, default=12_000)
    ap.add_argument("--narrow-steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=int, default=None,
                    help="batches before the clock starts (default 1 + 2 * (prefetch + 1): "
                    "the workers' start and their slots filled, for both rows)")  # fmt: skip
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--lookahead", type=int, default=16)
    ap.add_argument("--block-rows", type=int, default=512)
    ap.add_argument("--only", default="wide,narrow,beyond")
    a = ap.parse_args()
    if a.warm is None:
        a.warm = 1 + 2 * (a.prefetch + 1)
    from treadle.testing import SeaweedS3

    cases = a.only.split(",")
    with tempfile.TemporaryDirectory(prefix="treadle-workers-s3-") as tmp:
        data = Path(tmp)
        write_wide(data / "wide", a.wide_rows)
        write_narrow(data / "narrow", a.narrow_rows)
        narrow_bytes = sum(p.stat().st_size for p in (data / "narrow").rglob("*.lance"))
        print(f"wide table {a.wide_rows / 4:,.0f} MiB, narrow tables {narrow_bytes / 2**20:,.0f} "
              f"MiB; cores {os.cpu_count()}", flush=True)  # fmt: skip
        with SeaweedS3(bucket="bench") as s3:
            import treadle as td

            for name in ("wide", "narrow"):
                c3.upload(s3, data / name, name)
            clients = {c: td.Client(s3.url("wide" if c == "wide" else "narrow"),
                                    storage_options=s3.storage_options()) for c in cases}  # fmt: skip
            for r in range(a.rounds):
                print(f"round {r}: load average {os.getloadavg()[0]:.2f}", flush=True)
                for case in cases:
                    rates = {}
                    for workers in (0, 2):
                        rates[workers] = one_row(clients[case], case, workers, a, narrow_bytes)
                        mib, per_s, cpu_ms, wcpu_ms = rates[workers]
                        print(f"  {case:<7} workers={workers}  {mib:8,.0f} MiB/s  {per_s:8,.0f} "
                              f"samples/s  CPU per batch: {cpu_ms:.2f} ms here, {wcpu_ms:.2f} ms in "
                              "workers", flush=True)  # fmt: skip
                    print(f"  {case:<7} workers=2 / workers=0 = {rates[2][0] / rates[0][0]:.2f}x  "
                          f"(load average {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip


def one_row(client, case: str, workers: int, a: argparse.Namespace, narrow_bytes: int
            ) -> tuple[float, float, float, float]:  # noqa: ANN001  # fmt: skip
    """(MiB/s, samples/s, CPU ms per batch here and in the workers) of one run from a cold
    object cache."""
    steps = a.wide_steps if case == "wide" else a.narrow_steps
    saved = {k: os.environ.get(k) for k in ("TREADLE_CACHE_BYTES", "TREADLE_CHUNK_CACHE_BYTES")}
    if case == "beyond":
        os.environ["TREADLE_CACHE_BYTES"] = os.environ["TREADLE_CHUNK_CACHE_BYTES"] = str(
            narrow_bytes // 8
        )
    try:
        with cold_object_cache():
            wall, n, nbytes, cpu, wcpu = run(client, case, workers, steps, a)
            from treadle import reaper

            reaper.drain(30)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if case == "beyond":
        from treadle.read.lookahead import LAST

        print(f"    lookahead {dict(LAST)}", flush=True)
    return nbytes / wall / 2**20, n / wall, cpu / steps * 1e3, wcpu / steps * 1e3


if __name__ == "__main__":
    main()
