"""The mix case on S3 +30 ms against local disk, apart from the suite: samples/s, start-up,
requests and kB per batch, and the batches' hash (issue 33, goal 4).

Each S3 run starts with an empty object cache (``benchlib.cold_object_cache``) unless
``--warm``; rounds interleave local and S3; ``--steps`` timed batches per run.

    python bench/cloud_mix_profile.py [--workers 0,2] [--rounds 3] [--steps 2000] [--warm]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import case_mix as cm  # noqa: E402
import case_s3 as c3  # noqa: E402
from benchlib import batch_len, cold_object_cache, measure  # noqa: E402
from case_cloud import LATENCY_S, Proxied  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402


def digest(it: Any, k: int = 8) -> str:
    """sha256 of the first ``k`` batches, key by key (first 16 hex digits)."""
    h = hashlib.sha256()
    for _, b in zip(range(k), it):
        for key in sorted(b):
            v = b[key]
            h.update(key.encode())
            h.update(np.ascontiguousarray(v.numpy() if hasattr(v, "numpy") else v).tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warm", action="store_true", help="keep one object cache for every run")
    a = ap.parse_args()
    from treadle.testing import SeaweedS3

    root, steps = cm.generate(20_000), a.steps + 2
    with SeaweedS3(bucket="bench") as s3, DelayProxy(s3.endpoint, LATENCY_S) as proxy:
        c3.upload(s3, root / "treadle", "mix")
        s3p = Proxied(s3, proxy)
        with cold_object_cache():
            print("hash local", digest(cm.treadle_iter(root, 0, 8)))
            print("hash s3   ", digest(cm.treadle_iter(root, 0, 8, s3=s3p, prefix="mix")))
        warm = cold_object_cache() if a.warm else contextlib.nullcontext()
        with warm:
            for r in range(a.rounds):
                for w in (int(x) for x in a.workers.split(",")):
                    for where in ("local", "s3"):
                        s = s3p if where == "s3" else None
                        cache = contextlib.nullcontext() if a.warm or not s else cold_object_cache()
                        c0 = proxy.counts()
                        with cache:
                            make = lambda: cm.treadle_iter(root, w, steps, s3=s, prefix="mix")  # noqa: B023, E731
                            run = measure(make, a.steps * cm.BATCH, batch_len, 0)
                        got = proxy.counts() - c0
                        print(f"round {r} workers={w} {where:5s} "
                              f"{run.samples / run.wall_s:9,.0f} samples/s, "
                              f"start {run.startup_s:.2f} s, {got.requests / steps:.2f} requests "
                              f"and {got.bytes_out / steps / 1e3:,.0f} kB per batch", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
