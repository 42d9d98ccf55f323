"""Issue 48's case with today's loader: the mix on S3 behind a 30 ms proxy, the object cache
bounded to 1/8 of the tables, the full permutation against ``td.BlockShuffle``.

Two image tables (64x64x3 uint8 and a 7-float action, ``--rows`` rows each: ``case_mix``'s
data) on SeaweedFS behind ``delay_proxy``; ``TREADLE_CACHE_BYTES`` = 1/8 of their data files.
Each configuration runs ``--steps`` batches of 64 from a cold object cache; reported: samples/s,
requests and kB per sample the proxy counted; with ``--lookahead L`` also each order with
``TrainLoader(lookahead=L)`` (the chunk cache driven by the plan, bounded like the object
cache: ``TREADLE_CHUNK_CACHE_BYTES`` = 1/8 of the data files) and its hit rate.

    python bench/beyond_cache.py [--rows 12000] [--steps 60] [--rounds 2] [--lookahead 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import case_mix as cm  # noqa: E402
import case_s3 as c3  # noqa: E402
from benchlib import cold_object_cache  # noqa: E402
from case_cloud import LATENCY_S, Proxied  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402


def run(root: Path, s3: Proxied, steps: int, shuffle: object,
        lookahead: int | None = None) -> tuple[float, int]:  # fmt: skip
    """(seconds for ``steps`` batches after the first, samples)."""
    import treadle as td

    branch = cm.treadle_client(root, s3, "mix").project("bench").branch()
    comps = [td.Component(branch.table(t), None, weight=w) for t, w in zip(cm.TABLES, cm.WEIGHTS)]
    recipe = td.Recipe(seed=2048, batch_size=cm.BATCH, components=comps, shuffle=shuffle)
    it = iter(td.TrainLoader(recipe, steps=steps + 1, prefetch=4, lookahead=lookahead))
    next(it)
    t0 = time.perf_counter()
    n = sum(len(b["_moment"]) for b in it)
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=12_000)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--block-rows", type=int, default=512)
    ap.add_argument("--lookahead", type=int, default=None)
    a = ap.parse_args()
    import treadle as td
    from treadle.testing import SeaweedS3

    root = cm.generate(a.rows)
    data = sum(p.stat().st_size for p in (root / "treadle").rglob("*.lance") if p.is_file())
    os.environ["TREADLE_CACHE_BYTES"] = str(max(data // 8, 1))
    os.environ["TREADLE_CHUNK_CACHE_BYTES"] = str(max(data // 8, 1))
    print(f"{data / 1e6:,.0f} MB of data files; cache bound {data // 8 / 1e6:,.0f} MB")
    configs = {"full": (None, None),
               f"block {a.block_rows}": (td.BlockShuffle(block_rows=a.block_rows), None)}  # fmt: skip
    if a.lookahead is not None:
        configs.update({f"{k} +L{a.lookahead}": (v[0], a.lookahead) for k, v in configs.items()})
    with SeaweedS3(bucket="bench") as s3, DelayProxy(s3.endpoint, LATENCY_S) as proxy:
        c3.upload(s3, root / "treadle", "mix")
        s3p = Proxied(s3, proxy)
        for r in range(a.rounds):
            for name, (shuffle, look) in configs.items():
                with cold_object_cache():
                    c0 = proxy.counts()
                    wall, n = run(root, s3p, a.steps, shuffle, look)
                    got = proxy.counts() - c0
                total = n + cm.BATCH
                from treadle import reaper
                from treadle.read.lookahead import LAST

                reaper.drain(30)  # the stage's report is made on the reaper thread

                extra = f"  lookahead {dict(LAST)}" if look is not None else ""
                print(f"round {r} {name:<16} {n / wall:8,.0f} samples/s  "
                      f"{got.requests / total:.3f} requests and "
                      f"{got.bytes_out / total / 1e3:,.1f} kB per sample{extra}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
