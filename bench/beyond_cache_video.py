"""Issue 48's "video beyond the cache" rows: windows of two cameras on S3 at 30 ms, the chunk
cache at 1/8 of the media, ``td.BlockShuffle`` against the full permutation, each against its
limit measured in the same rounds, interleaved with it.

One table of ``--episodes`` episodes of ``--frames`` frames, two cameras (``cam0``, ``cam1``:
``video_windows.content`` at ``--size``, H.264 GOP 30, CRF 23) and a 7-float action, read with
``td.Windows({"cam0": td.Video(range(T)), "cam1": td.Video(range(T)), "action": td.Rows([0])})``.
The S3 copy is on SeaweedFS behind ``delay_proxy`` (30 ms a request);
``TREADLE_CHUNK_CACHE_BYTES`` and ``TREADLE_CACHE_BYTES`` are 1/8 of the streams' bytes. Each
configuration reads its timed batches after its first (``workers`` rows: after
``1 + 2 * (prefetch + 1)``), from a cold cache. Parts (``--parts``, all by default):

- ``two``: 2-frame windows in batches of ``--batch``, ``--steps`` timed batches: the same
  loader on local disk, on S3, on S3 with ``lookahead``;
- ``limit``: the full shuffle's limit (issue 48): random single-range GETs of exactly the
  byte ranges the full shuffle's windows need (keyframe to last packet, from the pinned
  stream index: ``plan_window`` of the reader's ``window_requests``, the ranges the loader
  requests), one GET per window, 64 in flight, through the same proxy, in the plan's order;
  measured after the full shuffle's local row, printed as samples/s (2 windows a sample);
- ``long``: ``--long-frames``-frame windows (90) in batches of ``--long-batch``,
  ``--long-steps`` timed batches: local, S3, S3 with ``lookahead``;
- ``workers``: 2-frame windows with ``workers=--workers``: local, and S3 with ``lookahead``
  (the loader's process fetches the windows' stream chunks, the workers read them).

Rows: samples/s and per CPU second (this process, plus the workers for ``workers`` rows: the
loader's work, steadier than wall time on a loaded machine; the S3 server's and the proxy's
CPU is not counted; with its ratio to the local row's), the ratio of samples/s to the local
row of the same order and part in the same round (and for the full shuffle to its GET limit), requests and kB per sample the proxy counted
(start-up included), with ``lookahead`` the stage's report, and whether every batch equals
the local row's (a digest of every frame and action). The load average is printed before
each round (2 cores shared with the S3 server, the proxy and other work).

    python bench/beyond_cache_video.py [--episodes 48] [--frames 300] [--steps 40]
        [--rounds 2] [--lookahead 4] [--block-rows 300] [--window-blocks 1]
        [--parts two,limit,long,workers] [--long-frames 90] [--long-batch 4]
        [--long-steps 20] [--workers 2]

With 48 episodes the cache holds 6 episodes' streams; ``BlockShuffle(block_rows=300,
window_blocks=1)`` keeps at most 2 blocks (4 episodes) open, and the stage's window (the
reader's 8 batches read ahead on S3, plus one) about one block.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import case_s3 as c3  # noqa: E402
import video_windows as vw  # noqa: E402
from benchlib import cold_object_cache  # noqa: E402
from case_cloud import LATENCY_S, Proxied  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402
from workers_s3 import workers_cpu  # noqa: E402

HERE = Path(__file__).resolve().parent
CAMERAS = ("cam0", "cam1")
PARTS = ("two", "limit", "long", "workers")
PREFIX = "v2"  # the bucket prefix of the S3 copy


def generate(episodes: int, frames: int, size: int) -> Path:
    """The table on local disk (kept under ``bench/data`` between runs)."""
    import treadle as td

    base = Path(os.environ.get("TREADLE_BENCH_DATA") or HERE / "data")
    root = base / f"video2cam-{episodes}x{frames}x{size}"
    if (root / "treadle.done").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    branch = td.Client(str(root / "treadle"), create=True).project("bench").branch()
    for e in range(episodes):
        cams = {f"cam{k}": td.VideoFrames(vw.content(frames, size, size, 2 * e + k), fps=30)
                for k in range(2)}  # fmt: skip
        action = np.full((frames, 7), e, np.float32)
        branch.table("v").append_episode({**cams, "action": action}, episode=f"ep{e:04d}")
    (root / "treadle.done").write_text("ok\n")
    return root


@dataclass(frozen=True)
class Case:
    """One part's loader settings: window frames, batch, timed steps, worker processes."""

    frames: int
    batch: int
    steps: int
    workers: int = 0

    @property
    def warm(self) -> int:
        """Batches read before timing (a worker row's start-up is not timed)."""
        return 1 if self.workers == 0 else 1 + 2 * (4 + 1)


def recipe(client: Any, case: Case, shuffle: object) -> Any:
    import treadle as td

    video = td.Video(list(range(case.frames)))
    windows = td.Windows({**dict.fromkeys(CAMERAS, video), "action": td.Rows([0])})
    comp = td.Component(client.project("bench").branch().table("v"), windows)
    return td.Recipe(seed=2048, batch_size=case.batch, components=[comp], shuffle=shuffle)


def digest(batch: dict[str, Any]) -> tuple[float, ...]:
    """Sums of the batch's frames and actions (equal batches, equal sums)."""
    return tuple(int(batch[k].numpy().astype(np.int64).sum()) for k in CAMERAS) + (
        float(batch["action"].double().sum()),
    )


def run(client: Any, case: Case, shuffle: object,
        lookahead: int | None) -> tuple[float, float, int, list[tuple[float, ...]]]:  # fmt: skip
    """(seconds and CPU seconds, this process's and its workers', for ``case.steps`` batches
    after ``case.warm``, samples, every batch's digest)."""
    import treadle as td

    loader = td.TrainLoader(recipe(client, case, shuffle), steps=case.steps + case.warm,
                            prefetch=4, lookahead=lookahead, video_threads=2,
                            workers=case.workers)  # fmt: skip
    it = iter(loader)
    sums = [digest(next(it)) for _ in range(case.warm)]
    t0, c0, w0 = time.perf_counter(), time.process_time(), workers_cpu() if case.workers else 0
    n = 0
    for b in it:
        n += len(b["_moment"])
        sums.append(digest(b))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if case.workers:
        cpu += workers_cpu() - w0
    return wall, cpu, n, sums


def window_ranges(local: Any, case: Case, shuffle: object) -> list[tuple[str, int, int]]:
    """(bucket key, start, end) of every window the loader reads in ``case``'s steps, in
    the plan's order: the byte range ``plan_window`` gives for the reader's own
    ``window_requests`` (the pinned stream index of the local copy, byte for byte the S3
    copy's)."""
    from treadle.read.steps import host_reader
    from treadle.read.video_requests import window_requests
    from treadle.video import plan_window

    plan = recipe(local, case, shuffle).plan()
    reader = host_reader(plan)
    out = []
    try:
        for step in range(case.steps + case.warm):
            batch = plan.batch(step)
            table, columns = reader.tables[0], reader.columns[0]
            for cs in columns:
                if not cs.video:
                    continue
                reqs, _ = window_requests(table, cs, np.asarray(batch.moment), reader.streams)
                for r in reqs:
                    p = plan_window(r.index, r.frames)
                    out.append((f"{PREFIX}/projects/bench/{r.key}", p.start, p.end))
    finally:
        reader.close()
    return out


def random_limit(raw: Any, ranges: list[tuple[str, int, int]]) -> tuple[float, float]:
    """(samples/s, kB per sample) of single-range GETs of ``ranges``, 64 in flight."""
    wall, got = c3.raw_get(raw, [[r] for r in ranges], in_flight=64)
    samples = len(ranges) / len(CAMERAS)
    return samples / wall, got / samples / 1e3


@dataclass
class Round:
    """What one round's rows print against: its number, proxy, and per order the local row
    (samples/s, digests) and the full shuffle's limit."""

    r: int
    proxy: DelayProxy
    base: float = 0.0
    base_cpu: float = 0.0
    sums: list[tuple[float, ...]] | None = None
    limit: float | None = None


def local_row(rd: Round, label: str, client: Any, case: Case, shuffle: object) -> None:
    with cold_object_cache():
        wall, cpu, n, rd.sums = run(client, case, shuffle, None)
    rd.base, rd.base_cpu = n / wall, n / cpu
    print(f"round {rd.r} {label:<16} local        {rd.base:8,.1f} samples/s "
          f"({n / cpu:,.0f} per CPU s)", flush=True)  # fmt: skip


def s3_row(rd: Round, label: str, client: Any, case: Case, shuffle: object,
           look: int | None) -> None:  # fmt: skip
    """One timed run through the proxy, printed with its ratios, counts and check."""
    from treadle import reaper
    from treadle.read.lookahead import LAST

    LAST.clear()
    with cold_object_cache():
        c0 = rd.proxy.counts()
        wall, cpu, n, sums = run(client, case, shuffle, look)
        got = rd.proxy.counts() - c0
    reaper.drain(30)  # the stage's report is made on the reaper thread
    total = n + case.batch * case.warm
    tag = "S3" if look is None else f"S3 +L{look}"
    limit = "" if rd.limit is None else f" {n / wall / rd.limit:5.2f}x GET limit"
    same = "same batches" if sums == rd.sums else "BATCHES DIFFER FROM LOCAL"
    extra = f"  {dict(LAST)}" if look is not None else ""
    print(f"round {rd.r} {label:<16} {tag:<12} {n / wall:8,.1f} samples/s "
          f"({n / cpu:,.0f} per CPU s: {n / cpu / rd.base_cpu:.2f}x) {n / wall / rd.base:5.2f}x "
          f"local{limit}  "
          f"{got.requests / total:.4f} requests and {got.body_out / total / 1e3:,.1f} kB "
          f"per sample; {same}{extra}", flush=True)  # fmt: skip


def order_rows(rd: Round, name: str, shuffle: object, a: argparse.Namespace,
               local: Any, remote: Any, raw: Any) -> None:  # fmt: skip
    """One order's rows of every part asked for, each part against its local row."""
    looks = (None, a.lookahead)
    if "two" in a.parts:
        two = Case(2, a.batch, a.steps)
        local_row(rd, name, local, two, shuffle)
        if shuffle is None and "limit" in a.parts:
            rd.limit, kb = random_limit(raw, window_ranges(local, two, shuffle))
            print(f"round {rd.r} {name:<16} limit: random single-range GETs x64 "
                  f"{rd.limit:8,.1f} samples/s ({kb:,.1f} kB per sample)", flush=True)  # fmt: skip
        for look in looks:
            s3_row(rd, name, remote, two, shuffle, look)
        rd.limit = None
    if "long" in a.parts:
        long = Case(a.long_frames, a.long_batch, a.long_steps)
        label = f"{name} {a.long_frames}f"
        local_row(rd, label, local, long, shuffle)
        for look in looks:
            s3_row(rd, label, remote, long, shuffle, look)
    if "workers" in a.parts:
        work = Case(2, a.batch, a.steps, a.workers)
        label = f"{name} w{a.workers}"
        local_row(rd, label, local, work, shuffle)
        s3_row(rd, label, remote, work, shuffle, a.lookahead)


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--block-rows", type=int, default=300)
    ap.add_argument("--window-blocks", type=int, default=1)
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"of {', '.join(PARTS)}")
    ap.add_argument("--orders", default="full,block", help="of full, block")
    ap.add_argument("--long-frames", type=int, default=90)
    ap.add_argument("--long-batch", type=int, default=4)
    ap.add_argument("--long-steps", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    a.parts, a.orders = set(a.parts.split(",")), a.orders.split(",")
    if not a.parts <= set(PARTS) or not set(a.orders) <= {"full", "block"}:
        ap.error(f"--parts takes {', '.join(PARTS)}; --orders takes full, block")
    return a


def main() -> None:
    a = arguments()
    import treadle as td
    from treadle.testing import SeaweedS3

    root = generate(a.episodes, a.frames, a.size)
    media = sum(p.stat().st_size for p in (root / "treadle").rglob("*.h264"))
    lance = sum(p.stat().st_size for p in (root / "treadle").rglob("*.lance") if p.is_file())
    os.environ["TREADLE_CACHE_BYTES"] = os.environ["TREADLE_CHUNK_CACHE_BYTES"] = str(media // 8)
    print(f"{a.episodes * 2} streams, {media / 1e6:,.1f} MB of media, {lance / 1e6:,.1f} MB of "
          f"Lance files; caches bound to {media // 8 / 1e6:,.1f} MB (1/8 of the media); "
          f"parts {sorted(a.parts)}", flush=True)  # fmt: skip
    block = td.BlockShuffle(block_rows=a.block_rows, window_blocks=a.window_blocks)
    shuffles = {"full": ("full", None), "block": (f"block {a.block_rows}", block)}
    local = td.Client(str(root / "treadle"))
    with SeaweedS3(bucket="bench") as s3, DelayProxy(s3.endpoint, LATENCY_S) as proxy:
        c3.upload(s3, root / "treadle", PREFIX)
        s3p = Proxied(s3, proxy)
        remote = td.Client(s3p.url(PREFIX), storage_options=s3p.storage_options())
        raw = c3.raw_store(s3p)
        for r in range(a.rounds):
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"round {r}: load average {load}", flush=True)
            for order in a.orders:
                name, shuffle = shuffles[order]
                order_rows(Round(r, proxy), name, shuffle, a, local, remote, raw)


if __name__ == "__main__":
    main()
