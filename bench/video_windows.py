"""Video window reads through treadle's VideoReader vs FFmpeg's own decode rate.

Generates H.264 episodes (300 frames, GOP 30, CRF 23) at 224x224 and 640x480, stores
them in a local Store, and reports for 90-frame windows, median of 3 rounds (each round
runs every configuration once, so a noisy shared machine hits all of them alike):

- the limit: FFmpeg single-thread decode of the same streams (``ffmpeg -threads 1 -i
  x.h264 -f null -`` when an ``ffmpeg`` binary exists, else PyAV sequential decode with
  ``thread_count=1``, labelled as such);
- useful frames/s of random windows (uint8 THWC RGB, decoded into a reused batch buffer)
  through ``VideoReader``: 1 and 2 reader threads, and 1 thread with FFmpeg frame
  threading; wall and CPU time; bytes read and frames decoded per window;
- the ratio reader / limit, by wall time and by CPU time;
- GIL probes: the same PyAV decode work in 1 vs 2 Python threads, and how fast a
  pure-Python thread runs while another thread decodes.

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
import threading
import time
from collections.abc import Callable

import av
import numpy as np

import treadle.video as tv
from treadle.plan.windows import Video
from treadle.storage import Store

CONFIGS = ((1, 1), (2, 1), (1, 2))  # (reader threads, FFmpeg threads per decoder)


def content(t: int, h: int, w: int, seed: int) -> np.ndarray:
    """Camera-like frames: moving gradients, a panning texture, a moving box, sensor noise.

    Tuned so 640x480 at CRF 23 is ~4-5 KiB/frame, like the clips behind FACTS.md's numbers.
    """
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    tex = rng.normal(0, 5.0, (h + 2 * t, w + 2 * t, 3)).astype(np.float32)
    tex = (tex + np.roll(tex, 1, 0) + np.roll(tex, 1, 1) + np.roll(tex, (1, 1), (0, 1))) / 2
    out = np.empty((t, h, w, 3), np.uint8)
    for i in range(t):
        r = 128 + 80 * np.sin((x + 2 * i) / 37.0)
        g = 128 + 80 * np.cos((y + 3 * i) / 29.0)
        b = 128 + 50 * np.sin((x + y + i) / 53.0)
        f = np.stack([r, g, b], -1) + tex[i : i + h, 2 * i : 2 * i + w]
        by, bx = (i * 3) % (h - h // 4), (i * 5) % (w - w // 4)
        f[by : by + h // 4, bx : bx + w // 4] = (230, 40, 40)
        f += rng.normal(0, 1.5, f.shape).astype(np.float32)
        out[i] = np.clip(f, 0, 255).astype(np.uint8)
    return out


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall s, CPU s of this process, all threads) of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def limit_fn(paths: list[str]) -> tuple[str, Callable[[], None], bool]:
    """FFmpeg's own single-thread decode of ``paths``: (label, run, cpu_is_child)."""
    exe = shutil.which("ffmpeg")
    if exe:

        def run_cli() -> None:
            for p in paths:
                cmd = [exe, "-v", "error", "-threads", "1", "-i", p, "-f", "null", "-"]
                subprocess.run(cmd, check=True)

        return "ffmpeg -threads 1 -f null", run_cli, True

    def run_pyav() -> None:
        for p in paths:
            with av.open(p, format="h264") as c:
                s = c.streams.video[0]
                s.thread_count = 1
                s.thread_type = "SLICE"
                for _ in c.decode(s):
                    pass

    return "PyAV sequential decode, thread_count=1 (no ffmpeg binary)", run_pyav, False


def gil_fns(path: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """Same PyAV decode work (the stream twice) in 1 thread, and split over 2 threads."""
    with av.open(path, format="h264") as c:
        packets = [bytes(p) for p in c.demux(video=0) if p.size]

    def decode_all() -> None:
        ctx = av.CodecContext.create("h264", "r")
        ctx.thread_count = 1
        for b in packets:
            ctx.decode(av.Packet(b))
        ctx.decode(None)

    def one() -> None:
        decode_all()
        decode_all()

    def two() -> None:
        ts = [threading.Thread(target=decode_all) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return one, two


def gil_release(path: str) -> float:
    """Share of its free-running speed a pure-Python thread keeps while another thread decodes.

    ~1.0: PyAV releases the GIL in decode (the two can run on two cores); ~0.5 or less: the
    GIL serialises them. Less sensitive to a busy shared machine than a 1-vs-2 thread speedup.
    """
    with av.open(path, format="h264") as c:
        packets = [bytes(p) for p in c.demux(video=0) if p.size]

    def spin_rate(work: Callable[[], None]) -> float:
        stop, ticks = threading.Event(), [0]

        def spin() -> None:
            while not stop.is_set():
                ticks[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.02)
        before, t0 = ticks[0], time.perf_counter()
        work()
        rate = (ticks[0] - before) / (time.perf_counter() - t0)
        stop.set()
        t.join()
        return rate

    def decode() -> None:
        ctx = av.CodecContext.create("h264", "r")
        ctx.thread_count = 1
        for b in packets:
            ctx.decode(av.Packet(b))
        ctx.decode(None)

    alone = spin_rate(lambda: time.sleep(0.3))
    return spin_rate(decode) / alone


def bench_size(
    h: int, w: int, *, episodes: int, t: int, window: int, windows: int, batch: int, runs: int
) -> dict:
    tmp = tempfile.mkdtemp(prefix="treadle-bench-")
    try:
        return _bench_size(tmp, h, w, episodes, t, window, windows, batch, runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bench_size(tmp, h, w, episodes, t, window, windows, batch, runs) -> dict:  # noqa: ANN001
    store = Store.open(tmp, create=True)
    paths, eps, nbytes = [], [], 0
    t0 = time.perf_counter()
    for e in range(episodes):
        s = tv.encode_frames(content(t, h, w, seed=e), fps=30, gop=30, crf=23, preset="fast")
        key = s.media_key("bench")
        store.put(key, s.data)
        paths.append(os.path.join(tmp, key))
        eps.append((key, tv.index_from_arrow(tv.index_to_arrow(key, s))[1]))
        nbytes += len(s.data)
    encode_s = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    reqs = []
    for i in range(windows):
        key, idx = eps[i % episodes]
        start = int(rng.integers(0, t - window + 1))
        reqs.append(
            tv.WindowRequest(key, idx, np.arange(start, start + window), Video(range(window)))
        )
    buf = np.zeros((batch, window, h, w, 3), np.uint8)  # one reused batch buffer, as the loader
    batches = [
        [dataclasses.replace(r, out=buf[i]) for i, r in enumerate(reqs[b : b + batch])]
        for b in range(0, len(reqs), batch)
    ]
    readers = {c: tv.VideoReader(store, threads=c[0], decoder_threads=c[1]) for c in CONFIGS}
    last_stats: list[tv.ReadStats] = []

    def reader_fn(reader: tv.VideoReader) -> Callable[[], None]:
        def run() -> None:
            last_stats.clear()
            for bt in batches:
                last_stats.append(reader.read_with_stats(bt)[1])

        return run

    label, limit_run, cpu_is_child = limit_fn(paths)
    gil_one, gil_two = gil_fns(paths[0])
    jobs: dict[str, Callable[[], None]] = {"limit": limit_run, "gil1": gil_one, "gil2": gil_two}
    jobs.update({f"t{c[0]}d{c[1]}": reader_fn(r) for c, r in readers.items()})
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in jobs}
    for _ in range(runs):
        for name, fn in jobs.items():
            samples[name].append(timed(fn))
    for r in readers.values():
        r.close()
    gil_share = statistics.median(gil_release(paths[0]) for _ in range(runs))
    wall = {k: statistics.median(s[0] for s in v) for k, v in samples.items()}
    cpu = {k: statistics.median(s[1] for s in v) for k, v in samples.items()}
    if cpu_is_child:
        cpu["limit"] = wall["limit"]  # child process CPU; single-threaded so ~= wall
    frames = episodes * t
    useful = windows * window
    return {
        "size": f"{window}x{h}x{w}",
        "kib_per_frame": nbytes / frames / 1024,
        "encode_s": encode_s,
        "label": label,
        "limit_fps": frames / wall["limit"],
        "limit_cpu_fps": frames / cpu["limit"],
        "kib_per_window": sum(s.bytes_read for s in last_stats) / windows / 1024,
        "decoded_per_window": sum(s.packets_decoded for s in last_stats) / windows,
        "readers": {
            k: (useful / wall[k], useful / cpu[k], cpu[k] / wall[k])
            for k in jobs
            if k.startswith("t")
        },
        "gil_speedup": wall["gil1"] / wall["gil2"],
        "gil_cpu_per_wall": cpu["gil2"] / wall["gil2"],
        "gil_share": gil_share,
    }


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
    print(f"av {av.__version__}, {os.cpu_count()} CPUs, median of {runs} interleaved rounds")
    for h, w, kw in sizes:
        r = bench_size(h, w, runs=runs, **kw)
        print(f"\n== {r['size']} windows (GOP 30, CRF 23, {r['kib_per_frame']:.1f} KiB/frame)")
        print(
            f"limit [{r['label']}]: {r['limit_fps']:,.0f} frames/s wall, "
            f"{r['limit_cpu_fps']:,.0f} per CPU-s"
        )
        print(
            f"reader reads {r['kib_per_window']:.0f} KiB and decodes "
            f"{r['decoded_per_window']:.1f} frames per window"
        )
        for name, (fps, cpu_fps, cpw) in r["readers"].items():
            th, dth = name[1:].split("d")
            print(
                f"reader threads={th} decoder_threads={dth}: {fps:,.0f} useful frames/s wall "
                f"(ratio {fps / r['limit_fps']:.2f}), {cpu_fps:,.0f} per CPU-s "
                f"(ratio {cpu_fps / r['limit_cpu_fps']:.2f}), CPU/wall {cpw:.2f}"
            )
        print(
            f"GIL probe, PyAV decode in 2 Python threads vs 1: {r['gil_speedup']:.2f}x wall, "
            f"CPU/wall {r['gil_cpu_per_wall']:.2f}; a Python thread keeps "
            f"{r['gil_share']:.0%} of its speed while PyAV decodes"
        )


if __name__ == "__main__":
    main()
