"""Memory is flat in the number of episodes (issue 33, goal 1): the peak resident memory of
the training process and of each worker grows by a few bytes per episode, not more.

The tables and the measuring process are the bench's (``bench/case_memory.py``): 5k
episodes of 800 rows and 200k of 20 (the same 4M rows), 10k episodes of 40 video frames and
100k of 4; a fresh process reads 300 steps with ``workers=2`` and reports the peak RSS
(``VmHWM``) of itself and of each worker. A memory bound, not a timing: the growth is at
most 28 MiB per process. Measured (2 cores): rows +16 MiB in the training process and
+15-19 MiB per worker now, +45 and +42 before issue 33 (episode names as Python strings,
a set of them to check they were unique, three copies of the plan's run index); video
+11 and +6-8 now.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SIZES = {"rows": (5_000, 200_000), "video": (10_000, 100_000)}
BOUND_MIB = 28.0


def _run(args: list[str], data: Path) -> str:
    env = {**os.environ, "TREADLE_BENCH_DATA": str(data), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, *args], cwd=BENCH, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


_WRITE = """
import case_memory as cm, treadle as td
branch = td.Client(str(cm.data_dir() / "treadle"), create=True).project("memory").branch()
cm.write_rows(branch, "rows_5000", 5_000, moments=800)
cm.write_rows(branch, "rows_200000", 200_000, moments=20)
cm.write_video(branch, "video_10000", 10_000, frames=40)
cm.write_video(branch, "video_100000", 100_000)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Both rows tables hold 4M rows (5k x 800, 200k x 20), both video tables 400k frames
    (10k x 40, 100k x 4): the fixed-width columns a
    reader keeps resident (``read/fixed.py``, up to 256 MiB per reader by design) are the
    same size, and only what is held per episode differs."""
    root = tmp_path_factory.mktemp("memory")
    _run(["-c", _WRITE], root)
    return root


def _peaks(data: Path, kind: str, episodes: int) -> dict:
    args = ["case_memory.py", "--child", kind, str(episodes), "2", "--steps", "300"]
    return json.loads(_run(args, data).strip().splitlines()[-1])


@pytest.mark.slow  # four fresh processes with two workers each
@pytest.mark.parametrize("kind", ["rows", "video"])
def test_peak_memory_per_process_is_flat_in_episodes(data, kind):
    sizes = SIZES[kind]
    small, large = (_peaks(data, kind, n) for n in sizes)
    assert len(small["workers_peak_mib"]) == len(large["workers_peak_mib"]) == 2, (small, large)
    growth = {"training process": large["main_peak_mib"] - small["main_peak_mib"]}
    for k, (a, b) in enumerate(zip(small["workers_peak_mib"], large["workers_peak_mib"])):
        growth[f"worker {k}"] = b - a
    over = {p: round(g, 1) for p, g in growth.items() if g > BOUND_MIB}
    assert not over, (
        f"{kind}: peak RSS grew by more than {BOUND_MIB} MiB from {sizes[0]:,} to "
        f"{sizes[1]:,} episodes: {over} (all: {growth}; {small} -> {large})"
    )
