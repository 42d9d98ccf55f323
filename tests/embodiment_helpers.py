"""Three robots of 4, 7 and 14 dimensions (the 14-D one without a camera) in one project,
for the cross-embodiment batch tests and the plan statistics tests."""

from __future__ import annotations

import numpy as np

import treadle as td

DIMS = {"arm4": 4, "arm7": 7, "bi14": 14}
LENGTHS = {"arm4": [9, 6, 11], "arm7": [8, 12], "bi14": [7, 10, 5, 9]}


def values(table: str, e: int, length: int, dims: int, salt: float) -> np.ndarray:
    """Distinct, reproducible values (float32-exact) per table, episode, frame and dim."""
    t = np.arange(length, dtype=np.float64)[:, None]
    d = np.arange(dims, dtype=np.float64)[None, :]
    base = {"arm4": 1.0, "arm7": -3.0, "bi14": 7.0}[table]
    return (base + salt + 0.5 * e + 0.25 * t * (d + 1) - 0.125 * d**2).astype(np.float32)


def make_robots(root: str, *, video: bool = True) -> td.Branch:
    branch = td.Client(root).project("robots").branch()
    rng = np.random.default_rng(7)
    with branch.transaction("three robots") as tx:
        for name, dims in DIMS.items():
            for e, n in enumerate(LENGTHS[name]):
                cols: dict = {
                    "state": values(name, e, n, dims, 0.0),
                    "action": values(name, e, n, dims, 100.0),
                    "speed": np.full(n, e + dims, np.float32),
                }
                if video and name != "bi14":
                    cols["cam"] = td.VideoFrames(
                        rng.integers(0, 255, (n, 16, 16, 3), dtype=np.uint8), fps=10
                    )
                tx.table(name).append_episode(cols, episode=f"{name}-{e}")
    return branch
