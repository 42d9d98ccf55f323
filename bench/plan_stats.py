"""``plan.stats`` of a 10-offset window against ``table.stats`` over the same columns
(issue 27's budget: at most 2x the time, in bounded memory).

One rows table of ``--moments`` moments (episodes of ``--frames``; ``action`` and
``state``, float32[7] each), then, each computed afresh (nothing kept from before):
``table.stats(["action", "state"])`` and ``plan.stats(["action", "state"])`` of one
component whose windows take ``Rows(range(10))`` of both. Reported: seconds of each, their
ratio, and each one's peak of traced Python allocations (tracemalloc: numpy buffers count,
Lance's own Rust buffers do not) against the table's bytes.

    python bench/plan_stats.py [--moments 10000000] [--frames 500] [--root DIR]
        [--out bench/results/plan_stats.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

import treadle as td


def make(root: str, moments: int, frames: int) -> td.TableRef:
    branch = td.Client(root).project("bench").branch()
    rng = np.random.default_rng(0)
    per_commit = max(frames, (1 << 21) // frames * frames)
    done = 0
    while done < moments:
        n = min(per_commit, moments - done)
        ep = np.arange(done, done + n) // frames
        data = {
            "episode": [f"e{e}" for e in ep],
            "frame": ((np.arange(done, done + n)) % frames).astype(np.int32),
            "action": rng.standard_normal((n, 7)).astype(np.float32),
            "state": rng.standard_normal((n, 7)).astype(np.float32),
        }
        branch.table("rows").append(data, message=f"rows {done}..{done + n}")
        done += n
    return branch.table("rows")


def timed(fn: Any) -> tuple[float, int]:
    tracemalloc.start()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return dt, peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moments", type=int, default=10_000_000)
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--root")
    ap.add_argument("--out", default="bench/results/plan_stats.json")
    args = ap.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="treadle-plan-stats-")
    ref = make(root, args.moments, args.frames)
    table = ref.pin()
    cols = ["action", "state"]
    t_table, m_table = timed(lambda: table.stats(cols))
    w = td.Windows({c: td.Rows(range(10)) for c in cols})
    plan = td.Recipe(0, 64, [td.Component(table, w)]).plan()
    t_plan, m_plan = timed(lambda: plan.stats(cols))
    out = {
        "moments": args.moments,
        "table_bytes": args.moments * 2 * 7 * 4,
        "table_stats_s": round(t_table, 3),
        "plan_stats_10_offsets_s": round(t_plan, 3),
        "ratio": round(t_plan / t_table, 3),
        "table_stats_peak_traced_bytes": m_table,
        "plan_stats_peak_traced_bytes": m_plan,
    }
    print(json.dumps(out, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
