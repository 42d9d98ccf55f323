"""Case ``augment``: samples/s of a 90-frame video recipe with and without augmentations.

The ``video`` case's 90x224x224 table (``case_video.generate``; ``--tiny``: its 12x64x64
one), read by ``td.TrainLoader`` (workers 0, 2 decode threads, batch 8):

- plain: the decoded windows;
- augmented: ``transform=treadle.transforms.Augment("cam", [RandomResizedCrop((H', W')),
  HorizontalFlip(), BrightnessContrast()])`` on the reader side (output ``H' = 7/8 H``).

Both in samples/s (windows/s) over the same steps, interleaved rounds; the ratio is the cost
of augmenting. Nothing is asserted about speed.

    python bench/case_augment.py [--tiny] [--runs 3]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from benchlib import Result, batch_len, measure  # noqa: E402


def augment(sz: dict[str, Any]) -> Any:
    from treadle import transforms as tf

    out = (sz["h"] * 7 // 8, sz["w"] * 7 // 8)
    return tf.Augment("cam", [tf.RandomResizedCrop(out), tf.HorizontalFlip(),
                              tf.BrightnessContrast()])  # fmt: skip


def run(tiny: bool, runs: int, log: Callable[[str], None] = print) -> list[Result]:
    """Results ``plain`` and ``augmented`` (samples/s) on the 90-frame window recipe."""
    import case_video as cv
    import treadle as td

    root = cv.generate(tiny, log)
    client = td.Client(str(root / "treadle"))
    sz = cv.sizes(tiny)[0]
    n = sz["windows"]
    steps = n // cv.BATCH + 2
    lab = cv.label(sz)
    results = []
    for name, transform in (("plain", None), ("augmented", augment(sz))):
        r = Result("augment", name, {"size": lab, "label": f"TrainLoader {name}"}, "samples/s")

        def make(transform: Any = transform) -> Any:
            plan = cv.recipe(client, sz).plan()
            return iter(td.TrainLoader(plan, steps=steps, video_threads=2, transform=transform))

        results.append((r, make))
    for rnd in range(runs):
        log(f"  augment {lab} round {rnd + 1}/{runs}: {n} windows per reader")
        for r, make in results:
            try:
                r.runs.append(measure(make, n, batch_len))
            except Exception as e:  # reported, the suite goes on
                r.status = f"failed: {type(e).__name__}: {e}"
    out = [r for r, _ in results]
    if all(r.rate for r in out):
        out[1].extra["augmented_over_plain"] = out[1].rate / out[0].rate
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    for r in run(args.tiny, args.runs):
        print(f"{r.name:>10} {r.config['size']}: {r.rate or 0:,.1f} {r.unit} {r.status}")


if __name__ == "__main__":
    main()
