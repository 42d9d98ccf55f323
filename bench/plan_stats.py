"""``plan.stats`` of a 10-offset window against ``table.stats`` over the same columns
(issue 27's budget: at most 2x the time, in bounded memory).

One rows table of ``--moments`` moments (episodes of ``--frames``; ``action`` and
``state``, float32[7] each), then, each computed afresh (nothing kept from before):
``table.stats(["action", "state"])`` and ``plan.stats(["action", "state"])`` of one
component whose windows take ``Rows(range(10))`` of both. Reported: seconds of each, their
ratio (wall, and CPU of all the process's threads: steadier on a loaded machine), and each
one's peak memory, every measurement in a fresh process: its resident set above the one
before the call, anonymous and file-backed apart (sampled every 10 ms; Lance's Rust buffers
and read-ahead count, and grow with the scan's length up to Lance's own limits) and, in a
separate run, its peak of traced Python allocations (tracemalloc: numpy buffers count,
Lance's do not: what treadle holds), against the table's bytes. ``ratio`` is of the best
wall times; ``cpu_ratio`` of the best CPU times. ``--root`` keeps the table for the next
run (made once).

    python bench/plan_stats.py [--moments 10000000] [--frames 500] [--root DIR]
        [--repeat 2] [--no-traced] [--out bench/results/plan_stats.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

import treadle as td


def make(root: str, moments: int, frames: int) -> td.TableRef:
    """The bench table at ``root`` (made once: a root that holds it is reused)."""
    branch = td.Client(root).project("bench").branch()
    try:
        ref = branch.table("rows")
        if ref.num_moments == moments:
            return ref
        raise SystemExit(f"{root} holds {ref.num_moments} moments, not {moments}")
    except td.NotFound:
        pass
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


def _rss() -> tuple[int, int]:
    """The resident set's anonymous and file-backed bytes (Lance may map the table's
    files: those pages are the OS's file cache, not memory the scan holds)."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                got[line.split(":")[0]] = int(line.split()[1]) * 1024
    return got["RssAnon"], got["RssFile"]


def timed(fn: Any, traced: bool) -> dict[str, float]:
    """Wall and CPU seconds (every thread of the process) of ``fn()`` and its peak memory
    above the one at the start: the resident set's anonymous and file-backed bytes (sampled
    every 10 ms) or, ``traced``,
    tracemalloc's peak (which slows numpy-heavy code a little)."""
    if traced:
        tracemalloc.start()
    base, peak, done = _rss(), [0, 0], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            now = _rss()
            peak[:] = [max(p, n - b) for p, n, b in zip(peak, now, base)]

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    done.set()
    watcher.join()
    got = {"s": round(dt, 3), "cpu_s": round(cpu, 3), "rss": peak[0], "rss_file": peak[1]}
    if traced:
        got["traced"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return got


def forget(root: str) -> None:
    """Drop every kept statistic under ``root``, so that each call computes afresh."""
    for d in list(Path(root).rglob("*")):
        if d.is_dir() and d.name in ("stats", "runstats"):
            shutil.rmtree(d)


def one(root: str, kind: str, traced: bool) -> None:
    """One measurement (this process): ``table`` or ``plan`` stats, a JSON line out."""
    forget(root)
    table = td.Client(root).project("bench").branch().table("rows").pin()
    cols = ["action", "state"]
    w = td.Windows({c: td.Rows(range(10)) for c in cols})
    plan = td.Recipe(0, 64, [td.Component(table, w)]).plan()
    fn = (lambda: table.stats(cols)) if kind == "table" else (lambda: plan.stats(cols))
    print(json.dumps(timed(fn, traced)))


def measure(args: Any, root: str, kind: str, traced: bool) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--root", root, "--one", kind]
    done = subprocess.run(cmd + ["--traced"] * traced, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{kind} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moments", type=int, default=10_000_000)
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--root", help="where the table is made, or reused when already there")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs of each")
    ap.add_argument("--no-traced", action="store_true", help="skip the tracemalloc runs")
    ap.add_argument("--one", choices=("table", "plan"), help=argparse.SUPPRESS)
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench/results/plan_stats.json")
    args = ap.parse_args()
    if args.one:
        return one(args.root, args.one, args.traced)
    root = args.root or tempfile.mkdtemp(prefix="treadle-plan-stats-")
    Path(root).mkdir(parents=True, exist_ok=True)
    make(root, args.moments, args.frames)
    kinds = ("table", "plan")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for _ in range(args.repeat):  # alternating: load on the machine hits both alike
        for k in kinds:
            runs[k].append(measure(args, root, k, traced=False))
    traced = {k: None if args.no_traced else measure(args, root, k, True)["traced"] for k in kinds}
    if args.root is None:  # a folder of this run: not left behind
        shutil.rmtree(root, ignore_errors=True)
    best = {k: min(r["s"] for r in runs[k]) for k in kinds}
    cpu = {k: min(r["cpu_s"] for r in runs[k]) for k in kinds}
    rss = {k: max(r["rss"] for r in runs[k]) for k in kinds}
    rss_file = {k: max(r["rss_file"] for r in runs[k]) for k in kinds}
    out = {
        "moments": args.moments,
        "table_bytes": args.moments * 2 * 7 * 4,
        "table_stats_s": [r["s"] for r in runs["table"]],
        "plan_stats_10_offsets_s": [r["s"] for r in runs["plan"]],
        "ratio": round(best["plan"] / best["table"], 3),
        "ratios": [round(p["s"] / t["s"], 3) for p, t in zip(runs["plan"], runs["table"])],
        "table_stats_cpu_s": [r["cpu_s"] for r in runs["table"]],
        "plan_stats_cpu_s": [r["cpu_s"] for r in runs["plan"]],
        "cpu_ratio": round(cpu["plan"] / cpu["table"], 3),
        "table_stats_peak_rss_bytes": rss["table"],
        "plan_stats_peak_rss_bytes": rss["plan"],
        "table_stats_peak_rss_file_bytes": rss_file["table"],
        "plan_stats_peak_rss_file_bytes": rss_file["plan"],
        "table_stats_peak_traced_bytes": traced["table"],
        "plan_stats_peak_traced_bytes": traced["plan"],
    }
    print(json.dumps(out, indent=2))
    mb = lambda b: "-" if b is None else f"{b / 2**20:.0f} MB"  # noqa: E731
    print(f"{args.moments} moments: table.stats {best['table']:.2f} s, plan.stats "
          f"{best['plan']:.2f} s, ratio {out['ratio']:.2f}x (goal <= 2x; CPU {cpu['table']:.2f} "
          f"s / {cpu['plan']:.2f} s = {out['cpu_ratio']:.2f}x); peak anonymous RSS above start: "
          f"table {mb(rss['table'])}, plan {mb(rss['plan'])} (file-backed: table "
          f"{mb(rss_file['table'])}, plan {mb(rss_file['plan'])}); peak traced: table "
          f"{mb(traced['table'])}, plan {mb(traced['plan'])}")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
