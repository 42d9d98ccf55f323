"""Case ``scale``: a DROID-shaped project and what one commit costs as history grows
(issue 13).

**Commits.** One long-lived writer makes ``n`` single-episode commits of ``rows`` tiny
rows (an int action and a float state, no video) to one table. Reported at checkpoints
along the way: the table's metadata bytes (Lance manifests, transaction files and refs)
and stored episode index bytes per commit, the largest fragment id, the fragment count, the writer's RSS and the mean
seconds per commit over the last stretch; then the seconds one ``gc`` takes (grace 0).

**Readers**: table ``droid`` holds 76k episodes x 240 frames of
action/state rows; table ``droid_cam`` a video column on as many episodes as asked,
every episode's index naming one small encoded stream (its bytes stored once). Reported:
the time and memory (RSS growth, tracemalloc peak) of planning ``droid`` in a fresh
client, the episode index read (stored) against the whole-column scan it replaces, the
first batch's latency from a loader's start, and a reader's resident bytes per frame of
video index against the whole column the reader used to hold.

    python bench/case_scale.py [--commits 10 10000] [--episodes 76000] [--frames 240]
        [--video-episodes 20000] [--root DIR] [--out bench/results/scale]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

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
    episodes_dir = Path(root) / "projects/scale/episodes/t"  # the stored episode index
    every = every or max(1, n // 10)
    points: list[dict[str, Any]] = []
    commits: list[str] = []
    start, last_t, last_k = rss_mib(), time.perf_counter(), 0
    last_cpu = time.process_time()  # the machine is shared: CPU time is the steadier one
    for i in range(n):
        commits.append(table.append_episode(episode(i, rows), episode=f"e{i}").id)
        if (i + 1) % every == 0 or i + 1 == n:
            now, cpu = time.perf_counter(), time.process_time()
            ds = table.pin().dataset
            ids = [f.fragment_id for f in ds.get_fragments()]
            meta = metadata_bytes(table_dir)
            stored = sum(f.stat().st_size for f in episodes_dir.glob("*.json"))
            points.append(
                {
                    "commits": i + 1,
                    "metadata_bytes": meta,
                    "metadata_bytes_per_commit": meta / (i + 1),
                    "episode_index_bytes_per_commit": stored / (i + 1),
                    "max_fragment_id": max(ids),
                    "fragments": len(ids),
                    "rss_mib": round(rss_mib(), 1),
                    "s_per_commit": (now - last_t) / (i + 1 - last_k),
                    "cpu_s_per_commit": (cpu - last_cpu) / (i + 1 - last_k),
                }
            )
            last_t, last_k, last_cpu = now, i + 1, cpu
    return {"n": n, "rows": rows, "rss_start_mib": round(start, 1), "points": points,
            "commits": commits}  # fmt: skip


# -- readers: a DROID-shaped project -------------------------------------------------------
CHUNK = 2_000  # episodes per append


def _ids(first: int, count: int, frames: int) -> dict[str, Any]:
    names = np.array([f"droid-{i:06d}" for i in range(first, first + count)], dtype=object)
    return {
        "episode": pa.array(np.repeat(names, frames), pa.string()),
        "frame": pa.array(np.tile(np.arange(frames, dtype=np.int32), count)),
    }


def build_droid(root: str, episodes: int, frames: int, video_episodes: int) -> dict[str, Any]:
    """Tables ``droid`` (action float32[7], state float32[8]) and ``droid_cam`` (a video
    column whose every episode names one 64x64 stream, stored once, and the action)."""
    from treadle.table.tensors import KIND_KEY, column_from_values
    from treadle.video import encode_value, index_to_arrow
    from treadle.video.column_layout import video_struct_type

    project = td.Client(root, create=True).project("droid")
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    with project.branch().transaction("droid") as tx:
        for first in range(0, episodes, CHUNK):
            count = min(CHUNK, episodes - first)
            cols = _ids(first, count, frames)
            cols["action"] = rng.random((count * frames, 7), dtype=np.float32)
            cols["state"] = rng.random((count * frames, 8), dtype=np.float32)
            tx.table("droid").append(cols)
    built = time.perf_counter() - t0
    video = rng.integers(0, 255, (frames, 64, 64, 3), dtype=np.uint8)
    stream = encode_value(td.VideoFrames(video, fps=15))
    key = stream.media_key("droid_cam")
    project.client.store.put(f"{project.prefix}/{key}", stream.data)
    one = index_to_arrow(key, stream)
    with project.branch().transaction("droid_cam") as tx:
        for first in range(0, video_episodes, CHUNK):
            count = min(CHUNK, video_episodes - first)
            cols = _ids(first, count, frames)
            action = rng.random((count * frames, 7), dtype=np.float32)
            f, a = column_from_values("action", action)
            fields = [pa.field("episode", pa.string()), pa.field("frame", pa.int32())]
            table = pa.Table.from_arrays(
                [cols["episode"], cols["frame"], pa.concat_arrays([one] * count), a],
                schema=pa.schema(
                    [
                        *fields,
                        pa.field("cam", video_struct_type(), metadata={KIND_KEY: b"video"}),
                        f,
                    ]
                ),
            )
            tx.table("droid_cam").append(table)
    return {"build_droid_s": built, "build_cam_s": time.perf_counter() - t0 - built}


def _recipe(table: Any, video: bool) -> td.Recipe:
    windows = {"cam": td.Video(range(4))} if video else {}
    windows["action"] = td.Rows(range(16))
    return td.Recipe(seed=1, batch_size=256, components=[td.Component(table, td.Windows(windows))])


def _fresh(root: str, name: str) -> Any:
    return td.Client(root).project("droid").branch().table(name)


def measure_readers(root: str) -> dict[str, Any]:
    """In a fresh process (clean RSS): plan, episode index, first batch, reader bytes."""
    from treadle.errors import CorruptData
    from treadle.read.columns import output_columns
    from treadle.read.rows import episode_bounds
    from treadle.read.sample_reader import SampleReader
    from treadle.read.stream_index import StreamIndexes
    from treadle.table.episodes import episode_runs

    out: dict[str, Any] = {"rss_start_mib": rss_mib()}
    t0 = time.perf_counter()
    plan = _recipe(_fresh(root, "droid"), False).plan()
    out["plan_s"] = time.perf_counter() - t0
    out["plan_rss_growth_mib"] = rss_mib() - out["rss_start_mib"]
    out["plan_moments"] = int(plan.table(0).num_moments)
    tracemalloc.start()
    _recipe(_fresh(root, "droid"), False).plan()
    out["plan_tracemalloc_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    pinned = _fresh(root, "droid").pin()
    t0 = time.perf_counter()
    out["episodes"] = len(pinned.episodes())
    out["episode_index_read_s"] = time.perf_counter() - t0
    for name, video in (("droid", False), ("droid_cam", True)):
        t0 = time.perf_counter()
        loader = td.TrainLoader(_recipe(_fresh(root, name), video), steps=1)
        next(iter(loader))
        out[f"first_batch_s_{name}"] = time.perf_counter() - t0
    cam_plan = _recipe(_fresh(root, "droid_cam"), True).plan()
    batch = cam_plan.batch(0, 0, 1)
    t0 = time.perf_counter()
    StreamIndexes().load(
        cam_plan.table(0), "cam", episode_bounds(cam_plan.table(0), batch.moment)[0]
    )
    out["first_batch_index_load_s"] = time.perf_counter() - t0  # the rest is decoding
    plan = _recipe(_fresh(root, "droid_cam"), True).plan()
    reader = SampleReader([plan.table(0)], output_columns(plan))
    for step in range(8):
        reader.read(plan.batch(step, 0, 1).component, plan.batch(step, 0, 1).moment)
    held = reader._streams  # the reader's stream index cache
    out["reader_index_frames"] = held.resident_frames()
    out["reader_index_bytes_per_frame"] = held.resident_bytes() / max(1, held.resident_frames())
    reader.close()
    cam = _fresh(root, "droid_cam").pin()
    head = cam.dataset.to_table(columns=["cam"], limit=100_000).column("cam")
    out["whole_column_bytes_per_frame"] = head.nbytes / len(head)  # what readers held before
    out["rss_end_mib"] = rss_mib()
    t0 = time.perf_counter()
    cols = pinned.to_arrow(["episode", "frame"])  # the whole columns
    scanned = episode_runs(cols["episode"], cols["frame"], "scan", CorruptData)
    out["episode_index_scan_s"] = time.perf_counter() - t0  # how it was rebuilt before
    assert scanned.names == pinned.episodes().names
    return out


def droid_readers(root: str, episodes: int, frames: int, video_episodes: int) -> dict[str, Any]:
    """Build the project here, measure it in a fresh process; a summary with the targets."""
    built = build_droid(root, episodes, frames, video_episodes)
    child = subprocess.run(
        [sys.executable, __file__, "--measure", root], capture_output=True, text=True, check=True
    )
    m = json.loads(child.stdout.strip().splitlines()[-1])
    return {"episodes": episodes, "frames": frames, "moments": episodes * frames,
            "video_episodes": video_episodes, "video_frames": video_episodes * frames,
            **built, "measured": m}  # fmt: skip


def summary_rows(m: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(measure, value, target) rows of :func:`measure_readers`'s numbers."""
    return [
        ("plan s (fresh client)", f"{m['plan_s']:.2f}", "<= 2"),
        ("plan RSS growth MiB", f"{m['plan_rss_growth_mib']:.0f}", "<= 300"),
        ("plan tracemalloc peak MiB", f"{m['plan_tracemalloc_peak_mib']:.1f}", "<= 300"),
        ("episode index read s (stored)", f"{m['episode_index_read_s']:.3f}", ""),
        ("episode index rebuilt by a scan s (before)", f"{m['episode_index_scan_s']:.2f}", ""),
        ("first batch s, droid (rows)", f"{m['first_batch_s_droid']:.2f}", "<= 2"),
        ("first batch s, droid_cam (video)", f"{m['first_batch_s_droid_cam']:.2f}", "<= 2"),
        ("  of which stream index load s", f"{m['first_batch_index_load_s']:.2f}", ""),
        ("reader video index bytes/frame", f"{m['reader_index_bytes_per_frame']:.1f}", "<= 32"),
        ("reader video index frames held", f"{m['reader_index_frames']:,}", "bounded"),
        ("whole video column bytes/frame (before)", f"{m['whole_column_bytes_per_frame']:.0f}", ""),
    ]


def commit_costs(n: int, rows: int, tmp: str) -> dict[str, Any]:
    """``n`` commits, then one gc (grace 0): the points of :func:`commit_many` and the gc."""
    os.makedirs(f"{tmp}/store")
    out = commit_many(f"{tmp}/store", n, rows)
    out.pop("commits")
    t0 = time.perf_counter()
    report = td.Client(f"{tmp}/store").project("scale").gc(timedelta(0))
    out["gc_s"] = time.perf_counter() - t0
    out["gc_kept_versions"] = sum(len(v) for v in report.kept_versions.values())
    out["gc_removed_versions"] = report.removed_versions
    return out


def markdown(result: dict[str, Any]) -> str:
    """The results as a Markdown report."""
    lines = [f"# treadle bench: scale ({result['when']})", "", result["machine"], ""]
    r = result.get("readers")
    if r:
        lines += [
            f"## Readers: {r['episodes']:,} episodes x {r['frames']} frames "
            f"({r['moments']:,} moments); video on {r['video_episodes']:,} episodes "
            f"({r['video_frames']:,} frames)",
            "",
            "| measure | value | required |",
            "|---|---:|---:|",
        ]
        lines += [f"| {k} | {v} | {req} |" for k, v, req in summary_rows(r["measured"])]
        lines.append("")
    lines += [
        "## Commits",
        "",
        "| commits | metadata bytes/commit | episode index bytes/commit | max fragment id "
        "| fragments | writer RSS MiB | s/commit (last stretch) | CPU s/commit | gc s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in result.get("commits", []):
        last = c["points"][-1]
        lines.append(
            f"| {last['commits']:,} | {last['metadata_bytes_per_commit']:,.0f} | "
            f"{last.get('episode_index_bytes_per_commit', float('nan')):,.0f} | "
            f"{last['max_fragment_id']:,} | {last['fragments']} | {last['rss_mib']:,.1f} | "
            f"{last['s_per_commit']:.4f} | {last.get('cpu_s_per_commit', float('nan')):.4f} | "
            f"{c['gc_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, nargs="*", default=[10, 10_000])
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--episodes", type=int, default=76_000, help="0: no reader case")
    ap.add_argument("--frames", type=int, default=240)
    ap.add_argument("--video-episodes", type=int, default=20_000)
    ap.add_argument("--root", default=None, help="a folder for the stores (default: a temp dir)")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    ap.add_argument("--note", default="", help="a line about the machine (e.g. its load)")
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the child
    ap.add_argument("--markdown", default=None, help="re-render OUT.md from this JSON")
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure_readers(args.measure)))
        return
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())), end="")
        return
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, load average at start {os.getloadavg()}. {args.note}",
    }
    if args.episodes:
        with tempfile.TemporaryDirectory(dir=args.root) as tmp:
            result["readers"] = droid_readers(
                f"{tmp}/store", args.episodes, args.frames, args.video_episodes
            )
            print(json.dumps(result["readers"]), flush=True)
    result["commits"] = []
    for n in args.commits:
        with tempfile.TemporaryDirectory(dir=args.root) as tmp:
            result["commits"].append(commit_costs(n, args.rows, tmp))
            print(json.dumps(result["commits"][-1]), flush=True)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
        Path(f"{args.out}.md").write_text(markdown(result))


if __name__ == "__main__":
    main()
