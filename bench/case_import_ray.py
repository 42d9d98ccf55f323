"""Case ``import_ray``: import throughput, one process vs Ray with 2 local workers.

The same WebDataset shards (written by ``webdataset.ShardWriter``: a PNG image, a class,
a float32[7] action per sample) are imported with ``images="decoded"`` (PNG decoding is
the work) into a fresh table each time:

- one process: ``importers.webdataset(...)`` (its own decode thread pool);
- Ray: ``executor=td.RayExecutor()`` on a local cluster started once with ``num_cpus=2``
  (one task per shard, 1 CPU each); a warm-up import first, so worker start-up is excluded.

Both are timed end to end (first byte read to the commit) and the ratio Ray / one process
is printed. On one small machine the two use the same cores, so a ratio near (or under) 1
is expected: Ray's gain is more machines, this case measures its overhead on one.

    python bench/case_import_ray.py [--tiny] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from benchlib import Result, timed  # noqa: E402

WORKERS = 2


def sizes(tiny: bool) -> dict[str, int]:
    return (
        {"samples": 160, "shards": 4, "side": 32}
        if tiny
        else {
            "samples": 6000,
            "shards": 12,
            "side": 96,
        }
    )


def generate(tiny: bool, log: Callable[[str], None] = print) -> str:
    """Shards under ``bench/data/import-ray-<n>/`` (``$TREADLE_BENCH_DATA`` if set, as the
    other cases) once; returns their brace pattern."""
    import io

    import webdataset as wds
    from PIL import Image

    sz = sizes(tiny)
    base = Path(os.environ.get("TREADLE_BENCH_DATA") or HERE / "data")
    folder = base / f"import-ray-{sz['samples']}"
    per = -(-sz["samples"] // sz["shards"])
    pattern = str(folder / f"shard-{{000000..{sz['shards'] - 1:06d}}}.tar")
    if (folder / ".done").exists():
        return pattern
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log(f"  generating {sz['samples']:,} samples in {sz['shards']} WebDataset shards")
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=per, verbose=0) as w:
        for i in range(sz["samples"]):
            img = rng.integers(0, 255, (sz["side"], sz["side"], 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="PNG")
            w.write(
                {
                    "__key__": f"s{i:07d}",
                    "png": buf.getvalue(),
                    "cls": i % 10,
                    "npy": rng.random(7).astype(np.float32),
                }
            )
    (folder / ".done").write_text("ok\n")
    return pattern


def run(tiny: bool, runs: int, log: Callable[[str], None] = print) -> list[Result]:
    """Results ``one process`` and ``ray x2``, in samples/s, ``runs`` interleaved rounds."""
    import ray

    import treadle as td

    pattern = generate(tiny, log)
    n = sizes(tiny)["samples"]
    data = f"WebDataset, {n:,} PNGs decoded"
    one = Result(
        "import_ray", "one process", {"label": "import, one process", "data": data}, "samples/s"
    )
    on_ray = Result(
        "import_ray",
        "ray",
        {"label": f"import, Ray {WORKERS} local workers", "data": data},
        "samples/s",
    )
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="treadle-bench-import-"))
    try:
        client = td.Client(str(tmp), create=True)
        executor = td.RayExecutor()
        k = 0

        def once(executor: td.RayExecutor | None) -> int:
            nonlocal k
            k += 1  # a fresh project each time: an import id already committed is skipped
            res = td.importers.webdataset(
                pattern,
                client.project(f"p{k}"),
                "t",
                images="decoded",
                executor=executor,
                progress=False,
            )
            assert res.rows == n and not res.skipped
            return res.rows

        once(executor)  # warm-up: Ray's workers start and import treadle
        for rnd in range(runs):
            log(f"  import_ray round {rnd + 1}/{runs}: {n:,} samples")
            one.runs.append(timed(lambda: once(None)))
            on_ray.runs.append(timed(lambda: once(executor)))
    finally:
        if started:
            ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return [one, on_ray]


def ratio(results: list[Result]) -> float | None:
    """Ray's median samples/s over one process's."""
    by = {r.name: r.rate for r in results}
    return by["ray"] / by["one process"] if by.get("ray") and by.get("one process") else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    args = ap.parse_args(argv)
    results = run(args.tiny, args.runs or (1 if args.tiny else 3))
    for r in results:
        wall = [x.wall_s for x in r.runs]
        print(f"{r.config['label']:<34} {r.rate:>10,.0f} samples/s  (wall {wall})")
    print(f"ratio Ray x{WORKERS} / one process: {ratio(results):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
