"""Ways to read 64 random rows of fixed-width columns from a local Lance table, timed.

Issue 17 goal 2: an image+action mix reads its rows with a Lance ``take`` (a few ms per 64
random rows) while a numpy gather of the same bytes from the page cache takes a fraction
of a ms. This script times, side by side, Lance's own ways to read rows and the direct
paths of :mod:`treadle.read.fixed`, against the numpy gather (the limit):

- tables: ``fails`` and ``nominal`` (project ``bench``, as ``bench/case_mix.py``), ``n`` rows
  each of a ``uint8[64,64,3]`` image, a ``float32[7]`` action and an ``int64`` column, written
  by treadle (Lance file version 2.2); ``nominal`` again with Lance's own writer in file
  versions 2.0 and 2.1, and with the image as ``binary``; the same values in ``.npy`` files;
- each variant reads image + action (+ int) of 64 random rows into numpy arrays; rounds
  interleave the variants in a new order each round; a variant's time is the median over
  rounds of its median batch in the round;
- the seam: ``SampleReader`` row takes and ``TrainLoader`` (workers 0) of the 30/70 mix, by
  Lance take (``fixed_columns=False``) and through :class:`~treadle.read.fixed.FixedReader`
  (the default for fixed-width columns).

``python bench/take_paths.py [--rows 20000] [--rounds 7] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import case_mix  # noqa: E402  (bench/ sibling: the mix case's tables and its limit)

BATCH = 64
COLS = ["image", "action", "i"]


# -- data -----------------------------------------------------------------------------------
def _columns(table: str, n: int) -> dict[str, np.ndarray]:
    images, actions = case_mix._samples(table, n)
    return {"image": images, "action": actions, "i": np.arange(n, dtype=np.int64) * 3}


def generate(root: Path, n: int) -> None:
    """The tables (once; a ``.done`` marker)."""
    if (root / ".done").exists():
        return
    import lance

    import treadle as td

    shutil.rmtree(root, ignore_errors=True)
    (root / "numpy").mkdir(parents=True)
    branch = td.Client(str(root / "treadle"), create=True).project("bench").branch()
    for t in case_mix.TABLES:
        cols = _columns(t, n)
        branch.table(t).append(cols, message=f"bench {t}")
        for c in ("image", "action"):
            np.save(root / "numpy" / f"{t}_{c}.npy", cols[c])
    cols = _columns("nominal", n)
    image = pa.FixedSizeListArray.from_arrays(pa.array(cols["image"].reshape(-1)), 64 * 64 * 3)
    action = pa.FixedSizeListArray.from_arrays(pa.array(cols["action"].reshape(-1)), 7)
    plain = pa.table({"image": image, "action": action, "i": cols["i"]})
    for v in ("2.0", "2.1"):
        lance.write_dataset(plain, str(root / f"lance-{v}"), data_storage_version=v)
    blobs = pa.array([r.tobytes() for r in cols["image"]], pa.binary())
    binary = pa.table({"image": blobs, "action": action, "i": cols["i"]})
    lance.write_dataset(binary, str(root / "lance-binary"))
    (root / ".done").write_text("ok\n")


# -- the variants: idx (int64 [64], random, duplicates possible) -> numpy arrays ------------
def _np(table: pa.Table, binary: bool = False) -> dict[str, np.ndarray]:
    out = {}
    for c in table.column_names:
        col = table.column(c).combine_chunks()
        if c == "image" and binary:
            buf = np.frombuffer(col.buffers()[2], np.uint8)
            out[c] = buf[: len(col) * 12288].reshape(len(col), 64, 64, 3)
        elif c == "image":
            out[c] = col.values.to_numpy().reshape(len(col), 64, 64, 3)
        elif c == "action":
            out[c] = col.values.to_numpy().reshape(len(col), 7)
        else:
            out[c] = col.to_numpy()
    return out


def _sorted(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, inverse = np.unique(idx, return_inverse=True)
    return uniq, inverse


def _expand(arrays: dict[str, np.ndarray], inverse: np.ndarray) -> dict[str, np.ndarray]:
    return {c: v[inverse] for c, v in arrays.items()}


def variants(root: Path) -> dict[str, Callable[[np.ndarray], dict[str, np.ndarray]]]:
    import lance
    from lance.file import LanceFileReader

    import treadle as td
    from treadle.read.fixed import FixedReader

    table = td.Client(str(root / "treadle")).project("bench").branch().table("nominal").pin()
    ds = table.dataset
    frag = ds.get_fragments()[0]
    assert len(ds.get_fragments()) == 1, "the variants below assume one fragment"
    path = os.path.join(ds.uri, "data", frag.metadata.files[0].path)
    freader = LanceFileReader(path, columns=COLS)
    v20 = lance.dataset(str(root / "lance-2.0"))
    v21 = lance.dataset(str(root / "lance-2.1"))
    vbin = lance.dataset(str(root / "lance-binary"))
    npy = {c: np.load(root / "numpy" / f"nominal_{c}.npy", mmap_mode="r") for c in COLS[:2]}
    fixed = FixedReader()

    def sortedtake(d: Any, binary: bool = False) -> Callable:
        def f(idx: np.ndarray) -> dict[str, np.ndarray]:
            u, inv = _sorted(idx)
            return _expand(_np(d.take(u, columns=COLS), binary), inv)

        return f

    def filetake(readahead: int) -> Callable:
        def f(idx: np.ndarray) -> dict[str, np.ndarray]:
            u, inv = _sorted(idx)
            got = freader.take_rows(u.tolist(), batch_readahead=readahead).to_table()
            return _expand(_np(got), inv)

        return f

    def scan_rowid(io_buffer: int | None) -> Callable:
        def f(idx: np.ndarray) -> dict[str, np.ndarray]:
            u, inv = _sorted(idx)
            sc = ds.scanner(
                columns=COLS,
                filter=f"_rowid IN ({','.join(map(str, u.tolist()))})",
                with_row_id=True,
                io_buffer_size=io_buffer,
                batch_readahead=1,
            )
            got = sc.to_table().sort_by("_rowid").drop_columns(["_rowid"])
            return _expand(_np(got), inv)

        return f

    def one(col: str) -> Callable:
        return lambda idx: _expand(_np(ds.take(_sorted(idx)[0], columns=[col])), _sorted(idx)[1])

    def limit(idx: np.ndarray) -> dict[str, np.ndarray]:
        s = np.sort(idx)
        return {"image": npy["image"][s], "action": npy["action"][s], "i": s * 3}

    def treadle_take(idx: np.ndarray) -> dict[str, np.ndarray]:
        from treadle.read.fixed import _take  # the reader's Lance take path

        return _take(table, idx, COLS)

    return {
        "limit: numpy gather, mmap of .npy": limit,
        "lance ds.take, unsorted rows": lambda idx: _np(ds.take(idx, columns=COLS)),
        "lance ds.take, sorted unique rows": sortedtake(ds),
        "lance ds._take_rows (row ids), sorted": lambda idx: _expand(
            _np(ds._take_rows(_sorted(idx)[0].tolist(), columns=COLS)), _sorted(idx)[1]
        ),
        "lance fragment.take, sorted": sortedtake(frag),
        "lance file take_rows, readahead 16": filetake(16),
        "lance file take_rows, readahead 1": filetake(1),
        "lance scanner _rowid IN, with_row_id": scan_rowid(None),
        "lance scanner _rowid IN, io_buffer 1 MiB": scan_rowid(1 << 20),
        "lance ds.take file v2.0, sorted": sortedtake(v20),
        "lance ds.take file v2.1, sorted": sortedtake(v21),
        "lance ds.take image as binary, sorted": sortedtake(vbin, binary=True),
        "lance ds.take image only, sorted": one("image"),
        "lance ds.take action only, sorted": one("action"),
        "lance ds.take int only, sorted": one("i"),
        "treadle Table.take + to_numpy (today)": treadle_take,
        "treadle FixedReader (mapped+resident)": lambda idx: fixed.read(table, idx, COLS),
    }


def check(vs: dict[str, Callable], n: int) -> None:
    """Every variant gives the limit's values (image, action, int) for the same rows."""
    rng = np.random.default_rng(7)
    idx = rng.integers(0, n, BATCH)
    order = np.argsort(idx, kind="stable")
    want = next(iter(vs.values()))(idx)  # the limit returns rows sorted
    for name, f in vs.items():
        got = f(idx)
        for c in set(got) & {"image", "action"}:
            g = np.asarray(got[c])
            g = g if name.startswith("limit") else g[order]
            if not np.array_equal(g, want[c]):
                raise AssertionError(f"{name}: column {c} differs from the numpy gather")


Timing = tuple[float, float]  # (wall ms, CPU ms of this process) per batch


def time_variants(vs: dict[str, Callable], n: int, rounds: int, per: int) -> dict[str, Timing]:
    """Median over rounds of the median ms per batch (wall and CPU); variants in a new
    order each round."""
    rng = np.random.default_rng(2048)
    times: dict[str, list[Timing]] = {k: [] for k in vs}
    order = list(vs)
    for r in range(rounds):
        random.Random(r).shuffle(order)
        for name in order:
            f = vs[name]
            f(rng.integers(0, n, BATCH))  # warm
            ts, cs = [], []
            for _ in range(per):
                idx = rng.integers(0, n, BATCH)
                t0, c0 = time.perf_counter(), time.process_time()
                f(idx)
                ts.append(time.perf_counter() - t0)
                cs.append(time.process_time() - c0)
            times[name].append((statistics.median(ts) * 1e3, statistics.median(cs) * 1e3))
    return _medians(times)


def _medians(times: dict[str, list[Timing]]) -> dict[str, Timing]:
    return {
        k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
        for k, v in times.items()
    }


# -- the seam: the reader and TrainLoader with and without read.fixed ------------------------
def _reader_iter(root: Path, steps: int, fixed: bool) -> Iterator[Any]:
    import treadle as td
    from treadle.read.columns import output_columns
    from treadle.read.sample_reader import SampleReader

    branch = case_mix.treadle_client(root).project("bench").branch()
    recipe = td.Recipe(
        seed=2048,
        batch_size=BATCH,
        components=[
            td.Component(branch.table(t), None, weight=w)
            for t, w in zip(case_mix.TABLES, case_mix.WEIGHTS)
        ],
    )
    plan = recipe.plan()
    tables = [plan.table(c) for c in range(plan.num_components)]
    reader = SampleReader(tables, output_columns(plan), fixed_columns=fixed)
    try:
        for _, out in reader.read_many(plan.batch(s) for s in range(steps)):
            yield out
    finally:
        reader.close()


def time_seam(root: Path, rounds: int, steps: int) -> dict[str, Timing]:
    """ms per batch of the mix: the limit, the reader and TrainLoader, by take and by
    read.fixed (``TrainLoader`` by take: ``reader.FixedReader`` patched out, bench only)."""
    import treadle.read.sample_reader as reader_module

    orig = reader_module.FixedReader
    runs: dict[str, tuple[Callable[[], Iterator[Any]], bool]] = {
        "limit: numpy gather mix (case_mix)": (lambda: case_mix.limit_iter(root, 0, steps), True),
        "SampleReader, Lance take": (lambda: _reader_iter(root, steps, False), True),
        "SampleReader, read.fixed": (lambda: _reader_iter(root, steps, True), True),
        "TrainLoader workers=0, Lance take": (lambda: case_mix.treadle_iter(root, 0, steps), False),
        "TrainLoader workers=0, read.fixed": (lambda: case_mix.treadle_iter(root, 0, steps), True),
    }
    times: dict[str, list[Timing]] = {k: [] for k in runs}
    order = list(runs)
    for r in range(rounds):
        random.Random(100 + r).shuffle(order)
        for name in order:
            make, fixed = runs[name]
            reader_module.FixedReader = orig if fixed else (lambda: None)
            try:
                it = make()
                for _ in range(3):  # start-up, plan, the resident columns' first read
                    next(it)
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(steps - 3):
                    next(it)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                times[name].append((wall / (steps - 3) * 1e3, cpu / (steps - 3) * 1e3))
                close = getattr(it, "close", None)
                if close is not None:
                    close()
            finally:
                reader_module.FixedReader = orig
    return _medians(times)


def table_md(title: str, ms: dict[str, Timing], limit: str) -> str:
    lines = [
        f"| {title} | ms / 64 rows | CPU ms / 64 rows | samples/s | x limit | x limit, CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lw, lc = ms[limit]
    for name, (w, c) in ms.items():
        lines.append(
            f"| {name} | {w:.3f} | {c:.3f} | {BATCH / w * 1e3:,.0f} | {lw / w:.3f} | "
            f"{lc / c if c else float('nan'):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--per", type=int, default=25, help="batches per variant per round")
    ap.add_argument("--steps", type=int, default=60, help="batches per seam run")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-seam", action="store_true")
    args = ap.parse_args(argv)
    root = Path(os.environ.get("TREADLE_BENCH_DATA") or HERE / "data") / f"take-{args.rows}"
    generate(root, args.rows)
    load0 = os.getloadavg()
    vs = variants(root)
    check(vs, args.rows)
    ms = time_variants(vs, args.rows, args.rounds, args.per)
    seam = {} if args.skip_seam else time_seam(root, args.rounds, args.steps)
    load1 = os.getloadavg()
    print(f"# take paths: {args.rows:,} rows, batch {BATCH}, {args.rounds} rounds")
    print(f"cpus {os.cpu_count()}, load average before {load0[0]:.1f}, after {load1[0]:.1f}\n")
    print(table_md("variant (image + action + int)", ms, "limit: numpy gather, mmap of .npy"))
    if seam:
        print()
        print(table_md("the mix through the reader", seam, "limit: numpy gather mix (case_mix)"))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"rows": args.rows, "load": [load0, load1], "variants": ms, "seam": seam},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
