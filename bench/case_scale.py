"""Case ``scale``: what one commit costs as the history grows (issue 13).

One long-lived writer makes ``n`` single-episode commits of ``rows`` tiny rows (an int
action and a float state, no video) to one table. Reported at checkpoints along the
way: the table's metadata bytes (Lance manifests, transaction files and refs) per
commit, the largest fragment id, the fragment count, the writer's RSS and the mean
seconds per commit over the last stretch; then the seconds one ``gc`` takes (grace 0).

    python bench/case_scale.py [--commits 10000] [--rows 20] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

import treadle as td


def rss_mib() -> float:
    """This process's resident memory (Linux ``/proc``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metadata_bytes(table_dir: Path) -> int:
    """Bytes of a Lance table that are not row data: manifests, transactions, refs."""
    return sum(
        p.stat().st_size
        for sub in ("_versions", "_transactions", "_refs")
        for p in (table_dir / sub).rglob("*")
        if p.is_file()
    )


def episode(i: int, rows: int) -> dict[str, Any]:
    return {
        "action": np.full((rows, 2), i, dtype=np.int32),
        "state": np.full((rows,), float(i), dtype=np.float32),
    }


def commit_many(root: str, n: int, rows: int = 20, every: int | None = None) -> dict[str, Any]:
    """Make ``n`` commits under ``root``; stats at every ``every`` commits and at the end."""
    project = td.Client(root, create=True).project("scale")
    table = project.branch().table("t")
    table_dir = Path(root) / "projects/scale/tables/t.lance"
    every = every or max(1, n // 10)
    points: list[dict[str, Any]] = []
    commits: list[str] = []
    start, last_t, last_k = rss_mib(), time.perf_counter(), 0
    for i in range(n):
        commits.append(table.append_episode(episode(i, rows), episode=f"e{i}").id)
        if (i + 1) % every == 0 or i + 1 == n:
            now = time.perf_counter()
            ds = table.pin().dataset
            ids = [f.fragment_id for f in ds.get_fragments()]
            meta = metadata_bytes(table_dir)
            points.append(
                {
                    "commits": i + 1,
                    "metadata_bytes": meta,
                    "metadata_bytes_per_commit": meta / (i + 1),
                    "max_fragment_id": max(ids),
                    "fragments": len(ids),
                    "rss_mib": round(rss_mib(), 1),
                    "s_per_commit": (now - last_t) / (i + 1 - last_k),
                }
            )
            last_t, last_k = now, i + 1
    return {"n": n, "rows": rows, "rss_start_mib": round(start, 1), "points": points,
            "commits": commits}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, nargs="+", default=[10, 10_000])
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--root", default=None, help="a folder for the stores (default: a temp dir)")
    args = ap.parse_args()
    for n in args.commits:
        with tempfile.TemporaryDirectory(dir=args.root) as tmp:
            os.makedirs(f"{tmp}/store")
            out = commit_many(f"{tmp}/store", n, args.rows)
            out.pop("commits")
            t0 = time.perf_counter()
            report = td.Client(f"{tmp}/store").project("scale").gc(timedelta(0))
            out["gc_s"] = time.perf_counter() - t0
            out["gc_kept_versions"] = sum(len(v) for v in report.kept_versions.values())
            out["gc_removed_versions"] = report.removed_versions
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
