"""Video window reads through treadle's VideoReader vs FFmpeg's own decode rate.

Generates H.264 episodes (GOP 30) at 224x224 and 640x480, stores them in a local
Store, and reports, median of 3 runs:

- the limit: FFmpeg single-thread decode of the same streams (``ffmpeg -threads 1 -i
  x.h264 -f null -`` when an ``ffmpeg`` binary exists, else PyAV sequential decode with
  ``thread_count=1``, labelled as such);
- useful frames/s of random 90-frame windows (uint8 THWC RGB, decoded into a reused
  batch buffer) through ``VideoReader`` with 1 and 2 decode threads, wall and CPU
  time, bytes read and frames decoded per window;
- the ratio reader / limit.

Usage: ``python bench/video_windows.py`` (``--tiny`` for a smoke run).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import av
import numpy as np

import treadle.video as tv
from treadle.plan.windows import Video
from treadle.storage import Store


def content(t: int, h: int, w: int, seed: int) -> np.ndarray:
    """Camera-like frames: smooth moving gradients, a moving box, mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.empty((t, h, w, 3), np.uint8)
    for i in range(t):
        r = 128 + 100 * np.sin((x + 2 * i) / 37.0)
        g = 128 + 100 * np.cos((y + 3 * i) / 29.0)
        b = 128 + 60 * np.sin((x + y + i) / 53.0)
        f = np.stack([r, g, b], -1)
        by, bx = (i * 3) % (h - h // 4), (i * 5) % (w - w // 4)
        f[by : by + h // 4, bx : bx + w // 4] = (230, 40, 40)
        f += rng.normal(0, 2.0, f.shape).astype(np.float32)
        out[i] = np.clip(f, 0, 255).astype(np.uint8)
    return out


def median_of(runs: int, fn) -> tuple[float, float]:
    """(median wall s, median CPU s) of ``fn()``."""
    walls, cpus = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def ffmpeg_limit(paths: list[str], runs: int) -> tuple[str, float, float]:
    """Frames/s of FFmpeg's own single-thread decode of ``paths`` (wall, CPU)."""
    exe = shutil.which("ffmpeg")
    frames = 0
    if exe:
        label = "ffmpeg -threads 1 -f null"

        def run() -> None:
            for p in paths:
                subprocess.run(
                    [exe, "-v", "error", "-threads", "1", "-i", p, "-f", "null", "-"], check=True
                )

        wall, _ = median_of(runs, run)
        cpu = wall  # child CPU is not in process_time; single-threaded, so ~wall
    else:
        label = "PyAV sequential decode, thread_count=1 (no ffmpeg binary)"

        def run() -> None:
            for p in paths:
                with av.open(p, format="h264") as c:
                    s = c.streams.video[0]
                    s.thread_count = 1
                    s.thread_type = "SLICE"
                    for _ in c.decode(s):
                        pass

        wall, cpu = median_of(runs, run)
    for p in paths:
        with av.open(p, format="h264") as c:
            frames += sum(1 for _ in c.demux(video=0) if _.size)
    return label, frames / wall, frames / cpu


def bench_size(
    h: int, w: int, *, episodes: int, t: int, window: int, windows: int, batch: int, runs: int
) -> dict:
    tmp = tempfile.mkdtemp(prefix="treadle-bench-")
    store = Store.open(tmp, create=True)
    paths, eps = [], []
    t0 = time.perf_counter()
    for e in range(episodes):
        s = tv.encode_frames(content(t, h, w, seed=e), fps=30, gop=30, crf=23, preset="fast")
        key = s.media_key("bench")
        store.put(key, s.data)
        path = os.path.join(tmp, key)
        paths.append(path)
        eps.append((key, tv.index_from_arrow(tv.index_to_arrow(key, s))[1], len(s.data)))
    enc_s = time.perf_counter() - t0
    label, lim_fps, lim_cpu_fps = ffmpeg_limit(paths, runs)

    rng = np.random.default_rng(0)
    reqs = []
    for i in range(windows):
        key, idx, _ = eps[i % episodes]
        start = int(rng.integers(0, t - window + 1))
        reqs.append(
            tv.WindowRequest(key, idx, np.arange(start, start + window), Video(range(window)))
        )
    res = {
        "size": f"{window}x{h}x{w}",
        "stream_kb_per_frame": sum(n for *_, n in eps) / (episodes * t) / 1024,
        "encode_s": enc_s,
        "limit_label": label,
        "limit_fps": lim_fps,
        "limit_cpu_fps": lim_cpu_fps,
    }
    for threads in (1, 2):
        stats_box: list = []
        # decode straight into one reused batch buffer, as the loader does
        buf = np.zeros((batch, window, h, w, 3), np.uint8)
        batches = [
            [dataclasses.replace(r, out=buf[i]) for i, r in enumerate(reqs[b : b + batch])]
            for b in range(0, len(reqs), batch)
        ]
        with tv.VideoReader(store, threads=threads) as reader:

            def run(reader=reader, batches=batches, box=stats_box) -> None:
                box.clear()
                for bt in batches:
                    box.append(reader.read_with_stats(bt)[1])

            wall, cpu = median_of(runs, run)
        useful = windows * window
        res[f"t{threads}_fps"] = useful / wall
        res[f"t{threads}_cpu_fps"] = useful / cpu
        res[f"t{threads}_cpu_per_wall"] = cpu / wall
        res["kb_per_window"] = sum(s.bytes_read for s in stats_box) / windows / 1024
        res["decoded_per_window"] = sum(s.packets_decoded for s in stats_box) / windows
    shutil.rmtree(tmp, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="smoke run: small and fast")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.tiny:
        sizes = [(64, 64, dict(episodes=2, t=60, window=20, windows=4, batch=2))]
        runs = 1
    else:
        sizes = [
            (224, 224, dict(episodes=4, t=300, window=90, windows=32, batch=8)),
            (480, 640, dict(episodes=4, t=300, window=90, windows=16, batch=8)),
        ]
        runs = args.runs
    print(f"av {av.__version__}, {os.cpu_count()} CPUs, median of {runs}")
    for h, w, kw in sizes:
        r = bench_size(h, w, runs=runs, **kw)
        print(f"\n== windows {r['size']} (GOP 30, {r['stream_kb_per_frame']:.1f} KiB/frame)")
        print(f"limit  [{r['limit_label']}]: {r['limit_fps']:,.0f} frames/s wall")
        print(
            f"reader: {r['kb_per_window']:.0f} KiB read and {r['decoded_per_window']:.1f} "
            f"frames decoded per {r['size'].split('x')[0]}-frame window"
        )
        for th in (1, 2):
            print(
                f"reader threads={th}: {r[f't{th}_fps']:,.0f} useful frames/s wall, "
                f"{r[f't{th}_cpu_fps']:,.0f} per CPU-s (CPU/wall {r[f't{th}_cpu_per_wall']:.2f}), "
                f"ratio to limit {r[f't{th}_fps'] / r['limit_fps']:.2f}"
            )
    print()


if __name__ == "__main__":
    main()
