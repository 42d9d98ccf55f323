"""The viewer's step page at training size (issue 49 §3): a 256-sample step of two 16-frame
224x224 cameras, served by a real ``treadle ui`` process. Prints the seconds and bytes of
the first screen (the page, and the samples with their inline anchor frames that its
script loads) against the bound (<= 2 s, <= 20 MB), and of one sample's "all frames".

    python bench/ui_first_screen.py --dir /tmp/ui-bench [--episodes 48] [--rounds 3]

The data is generated once under DIR (kept for later runs). Timings are wall time on this
machine: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

import treadle as td

BATCH, FRAMES, SIDE = 256, 16, 224


def build(root: Path, episodes: int) -> str:
    """A project with two cameras per episode and a run of batch 256 saved as a checkpoint;
    returns the run id."""
    client = td.Client(str(root), create=True)
    branch = client.project("robotics").branch()
    cams = branch.table("cams")
    if not (root / "built").exists():
        rng = np.random.default_rng(0)
        y, x = np.mgrid[0:SIDE, 0:SIDE]
        for e in range(episodes):
            t = np.arange(60)[:, None, None]
            base = (x[None] + 3 * t + 7 * e) % 256, (y[None] + 2 * t) % 256
            frames = [np.stack([base[0], base[1], (base[0] ^ base[1])], -1).astype(np.uint8)]
            frames.append(np.clip(frames[0] + rng.integers(0, 16, frames[0].shape), 0, 255))
            cams.append_episode({"cam0": td.VideoFrames(frames[0], fps=30),
                                 "cam1": td.VideoFrames(frames[1].astype(np.uint8), fps=30)},
                                episode=f"ep{e:03d}")  # fmt: skip
        (root / "built").write_text("ok")
    windows = td.Windows({"cam0": td.Video(range(FRAMES)), "cam1": td.Video(range(FRAMES))})
    recipe = td.Recipe(seed=3, batch_size=BATCH, components=[td.Component(cams, windows)])
    plan = recipe.plan()
    td.Checkpoints(branch, table="checkpoints").save(0, {"model": {}}, td.TrainLoader(plan))
    return plan.run_id


def serve(root: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "treadle.cli", "ui", "--root", str(root), "--no-open",
           "--port", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:\d+", line)
    if m is None:
        raise SystemExit(f"treadle ui printed {line!r}")
    return proc, m.group(0)


def timed(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(args.dir) / "store"
    run = build(root, args.episodes)
    proc, base = serve(root)
    try:
        step = f"{base}/p/robotics/runs/{run}/steps/0"
        for r in range(args.rounds):
            s, n = timed(step)  # the page, then what its script loads: the anchors' screen
            s2, n2 = timed(f"{step}/samples?rank=0&world_size=1")
            s, n = s + s2, n + n2
            one_s, one_n = timed(f"{step}/samples/0")
            print(f"round {r}: first screen {s:.2f} s, {n / 1e6:.2f} MB (bound 2 s, 20 MB); "
                  f"one sample's frames {one_s:.2f} s, {one_n / 1e6:.2f} MB")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
