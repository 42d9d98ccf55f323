"""Adding columns to a recorded table (issue 47): seconds and bytes written, media untouched.

Builds a time-indexed table of ``--moments`` moments (``--episodes`` episodes) with an
H.264 video column and a float32[7] action (one encoded stream, stored once and named by
every episode: the table's video index is as large as 1M distinct episodes' would be),
then adds a per-episode bool (``{episode: value}``) and a per-moment float32 (an array),
each one commit. Reports per column: seconds, bytes of the new files under the table's
``data/`` (what the commit wrote), the column's Arrow size, their ratio (goal: <= 2x the
column plus a constant), the table's data bytes for scale, and the media objects' bytes
written (goal: zero; the media listing is compared before and after).

    python bench/case_evolve.py [--moments 1000000] [--episodes 1000] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def _sizes(root: Path, under: str) -> dict[str, int]:
    base = root / under
    return {str(p.relative_to(root)): p.stat().st_size for p in base.rglob("*") if p.is_file()}


def build(root: Path, moments: int, episodes: int):
    import treadle as td
    from treadle.video.encode import encode_value

    per = moments // episodes
    frames = np.random.default_rng(0).integers(0, 255, (per, 32, 32, 3), dtype=np.uint8)
    stream = encode_value(td.VideoFrames(frames, fps=30, gop=30))
    branch = td.Client(str(root)).project("bench").branch()
    action = np.zeros((per, 7), np.float32)
    with branch.transaction("recorded") as tx:
        for e in range(episodes):
            tx.table("grasps").append_episode({"camera": stream, "action": action},
                                              episode=f"ep-{e:06d}")  # fmt: skip
    return branch.table("grasps")


def measure(root: Path, table, name: str, values) -> dict:
    import pyarrow as pa

    data = "projects/bench/tables/grasps.lance/data"
    before, media = _sizes(root, data), _sizes(root, "projects/bench/media")
    t0 = time.perf_counter()
    table.add_column(name, values)
    seconds = time.perf_counter() - t0
    after = _sizes(root, data)
    written = sum(n for k, n in after.items() if k not in before)
    media_after = _sizes(root, "projects/bench/media")
    col = table.to_arrow([name]).column(0)
    column_bytes = int(pa.chunked_array(col).nbytes)
    return {
        "column": name,
        "seconds": round(seconds, 3),
        "bytes_written": written,
        "column_bytes": column_bytes,
        "written_over_column": round(written / max(column_bytes, 1), 3),
        "table_data_bytes": sum(before.values()),
        "media_bytes_written": sum(n for k, n in media_after.items() if media.get(k) != n),
        "media_listing_same": media_after == media,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moments", type=int, default=1_000_000)
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--dir", default=None, help="where the store goes (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="treadle-evolve-"))
    try:
        t0 = time.perf_counter()
        table = build(root, args.moments, args.episodes)
        built = time.perf_counter() - t0
        n = table.num_moments
        labels = {name: i % 3 == 0 for i, name in enumerate(table.pin().episodes().names)}
        rows = [
            measure(root, table, "success", labels),
            measure(root, table, "progress", np.linspace(0, 1, n, dtype=np.float32)),
        ]
        out = {"moments": n, "episodes": args.episodes, "build_seconds": round(built, 1),
               "rows": rows}  # fmt: skip
        if args.json:
            print(json.dumps(out, indent=1))
        else:
            print(f"{n:,} moments, {args.episodes} episodes (built in {built:.0f} s)")
            for r in rows:
                print(f"  add_column {r['column']}: {r['seconds']} s, {r['bytes_written']:,} bytes "
                      f"written ({r['written_over_column']}x the column's {r['column_bytes']:,}; "
                      f"table data {r['table_data_bytes']:,}), media bytes written "
                      f"{r['media_bytes_written']}, media listing same: {r['media_listing_same']}")  # fmt: skip
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
