"""Issue 48's "video beyond the cache" row: 2-frame windows of two cameras on S3 at 30 ms,
the chunk cache at 1/8 of the media, ``td.BlockShuffle`` against the full permutation, and
the same loader on local disk in the same rounds.

One table of ``--episodes`` episodes of ``--frames`` frames, two cameras (``cam0``, ``cam1``:
``video_windows.content`` at ``--size``, H.264 GOP 30, CRF 23) and a 7-float action, read with
``td.Windows({"cam0": td.Video([0, 1]), "cam1": td.Video([0, 1]), "action": td.Rows([0])})``
in batches of ``--batch``. The S3 copy is on SeaweedFS behind ``delay_proxy`` (30 ms a
request); ``TREADLE_CHUNK_CACHE_BYTES`` and ``TREADLE_CACHE_BYTES`` are 1/8 of the streams'
bytes. Each configuration reads ``--steps`` timed batches after its first, from a cold cache.
Rows: samples/s (and per CPU second of this process: the loader's work, steadier than wall
time on a loaded machine; the S3 server's CPU is not counted), the ratio to the local row
of the same order in the same round, requests and kB per sample the proxy counted (start-up
included), and with ``lookahead`` the stage's report (media hit rate, windows read from
chunks, media requests per sample). The load
average is printed before each round (2 cores shared with the S3 server and other work).

    python bench/beyond_cache_video.py [--episodes 48] [--frames 300] [--steps 40]
        [--rounds 2] [--lookahead 4] [--block-rows 300] [--window-blocks 1]

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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import case_s3 as c3  # noqa: E402
import video_windows as vw  # noqa: E402
from benchlib import cold_object_cache  # noqa: E402
from case_cloud import LATENCY_S, Proxied  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402

HERE = Path(__file__).resolve().parent


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


def run(client: object, steps: int, batch: int, shuffle: object,
        lookahead: int | None) -> tuple[float, float, int]:  # fmt: skip
    """(seconds and this process's CPU seconds for ``steps`` batches after the first,
    samples)."""
    import treadle as td

    windows = td.Windows({"cam0": td.Video([0, 1]), "cam1": td.Video([0, 1]),
                          "action": td.Rows([0])})  # fmt: skip
    comp = td.Component(client.project("bench").branch().table("v"), windows)  # type: ignore[attr-defined]
    recipe = td.Recipe(seed=2048, batch_size=batch, components=[comp], shuffle=shuffle)
    it = iter(td.TrainLoader(recipe, steps=steps + 1, prefetch=4, lookahead=lookahead,
                             video_threads=2))  # fmt: skip
    next(it)
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(b["_moment"]) for b in it)
    return time.perf_counter() - t0, time.process_time() - c0, n


def main() -> None:
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
    a = ap.parse_args()
    import treadle as td
    from treadle import reaper
    from treadle.read.lookahead import LAST
    from treadle.testing import SeaweedS3

    root = generate(a.episodes, a.frames, a.size)
    media = sum(p.stat().st_size for p in (root / "treadle").rglob("*.h264"))
    lance = sum(p.stat().st_size for p in (root / "treadle").rglob("*.lance") if p.is_file())
    os.environ["TREADLE_CACHE_BYTES"] = os.environ["TREADLE_CHUNK_CACHE_BYTES"] = str(media // 8)
    print(f"{a.episodes * 2} streams, {media / 1e6:,.1f} MB of media, {lance / 1e6:,.1f} MB of "
          f"Lance files; caches bound to {media // 8 / 1e6:,.1f} MB (1/8 of the media)")  # fmt: skip
    block = td.BlockShuffle(block_rows=a.block_rows, window_blocks=a.window_blocks)
    orders = {"full": None, f"block {a.block_rows}": block}
    local = td.Client(str(root / "treadle"))
    with SeaweedS3(bucket="bench") as s3, DelayProxy(s3.endpoint, LATENCY_S) as proxy:
        c3.upload(s3, root / "treadle", "v2")
        s3p = Proxied(s3, proxy)
        remote = td.Client(s3p.url("v2"), storage_options=s3p.storage_options())
        for r in range(a.rounds):
            print(f"round {r}: load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}",
                  flush=True)  # fmt: skip
            for name, shuffle in orders.items():
                with cold_object_cache():
                    wall, cpu, n = run(local, a.steps, a.batch, shuffle, None)
                base = n / wall
                print(f"round {r} {name:<10} local        {base:8,.0f} samples/s "
                      f"({n / cpu:,.0f} per CPU s)", flush=True)  # fmt: skip
                for look in (None, a.lookahead):
                    with cold_object_cache():
                        c0 = proxy.counts()
                        wall, cpu, n = run(remote, a.steps, a.batch, shuffle, look)
                        got = proxy.counts() - c0
                    reaper.drain(30)  # the stage's report is made on the reaper thread
                    total = n + a.batch
                    tag = "S3" if look is None else f"S3 +L{look}"
                    extra = f"  {dict(LAST)}" if look is not None else ""
                    print(f"round {r} {name:<10} {tag:<12} {n / wall:8,.0f} samples/s "
                          f"({n / cpu:,.0f} per CPU s) {n / wall / base:5.2f}x local  "
                          f"{got.requests / total:.4f} requests "
                          f"and {got.bytes_out / total / 1e3:,.1f} kB per sample{extra}",
                          flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
