"""Hashes of the first batches the bench recipes deliver: a refactor must leave them equal.

For the ``mix`` case (two tables, 30/70, ``n`` samples each), the tiny ``video`` windows
(12x64x64 and 4x128x96) and the ``augment`` recipe (tiny 12x64x64 with its transform), at
video threads 1 and 2: sha256 over each batch's keys, dtypes, shapes and bytes, first 16
hex digits. Run it on the tree before and after a change (same data folder):

    PYTHONPATH=src TREADLE_BENCH_DATA=/tmp/hashdata python bench/batch_hashes.py [--batches 6]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def digest(batches: Iterable[dict[str, Any]], n: int) -> str:
    """The hash of the first ``n`` batches (tensors by dtype, shape and bytes; others by repr)."""
    import torch

    d = hashlib.sha256()
    for i, batch in enumerate(batches):
        if i == n:
            break
        for k in sorted(batch):
            v = batch[k]
            d.update(k.encode())
            if isinstance(v, torch.Tensor):
                d.update(f"{v.dtype}{tuple(v.shape)}".encode())
                d.update(v.contiguous().numpy().tobytes())
            else:
                d.update(repr(v).encode())
    return d.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--mix-samples", type=int, default=200)
    args = ap.parse_args()
    n = args.batches

    import case_augment as ca
    import case_mix as cm
    import case_video as cv
    import treadle as td

    quiet = lambda s: None  # noqa: E731
    mix = cm.generate(args.mix_samples, quiet)
    print("mix", digest(cm.treadle_iter(mix, 0, n), n))
    print("mix workers 2", digest(cm.treadle_iter(mix, 2, n), n))
    client = td.Client(str(cv.generate(True, quiet) / "treadle"))
    for sz in cv.sizes(True):
        for t in (1, 2):
            print(
                "video", cv.label(sz), "threads", t, digest(cv.treadle_iter(client, sz, 0, t, n), n)
            )
        print("video", cv.label(sz), "workers 2", digest(cv.treadle_iter(client, sz, 2, 1, n), n))
    sz = cv.sizes(True)[0]
    for t in (1, 2):
        plan = cv.recipe(client, sz).plan()
        loader = td.TrainLoader(plan, steps=n, video_threads=t, transform=ca.augment(sz))
        print("augment", cv.label(sz), "threads", t, digest(loader, n))


if __name__ == "__main__":
    main()
