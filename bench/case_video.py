"""Case 2: video windows from H.264 episodes (90x224x224 and 16x640x480).

One treadle table per size (episodes of camera-like frames from ``video_windows.content``,
GOP 30, CRF 23), read by ``td.TrainLoader`` with ``td.Video(range(T))`` windows:

- treadle: workers 0 with 1 and 2 reader threads, and 2 spawned workers;
- torchcodec, SPDL and LeRobotDataset (``case_video_peers.py``; a peer that is not installed
  gets the status "not installed");
- the limits, always PyAV in this process tree (never the ``ffmpeg`` CLI, so an installed
  binary does not change what is measured): single-thread sequential decode of the same
  streams on 1 process and on 2 processes (2 cores), and on 1 process decode + a reused
  ``VideoReformatter`` to rgb24 (1 thread). Scaled by useful/needed frames (``suite.py``),
  they are what a reader that decoded exactly the frames a window needs would deliver.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np

import video_windows as vw

HERE = Path(__file__).resolve().parent
BATCH = 8


PREFETCH = 2
"""``prefetch`` of every treadle loader the bench times (:func:`treadle_iter`)."""


def warmup(tiny: bool, workers: int = 0) -> int:
    """Batches every video reader (treadle's, the peers', on S3 too) reads after its first
    and before its timing starts: the steady-state rate of a training run, not the first
    batches' buffer allocations, decoder set-up and first-frame checks (measured, medians
    of 3 interleaved rounds: treadle's 90x224x224 rate over the 6 batches after its first
    was 0.97x the decode+convert limit, over the 24 after its first 1.26x). Start-up (time
    to the first batch) is reported on its own.

    A treadle loader with ``workers`` > 0 reads that many batches more: each worker fills
    its ``PREFETCH + 1`` slots while the loader reads the first step itself, so up to
    ``workers * (PREFETCH + 1)`` batches were ready before timing began (a cloud run's local
    ``workers=2`` row at 90x224x224 gave 16,595 frames/s on 2 cores, 1.6x its ``workers=0``
    row: 6 timed batches, about 2 of them decoded before the clock started)."""
    return (1 if tiny else 4) + workers * (PREFETCH + 1)


def sizes(tiny: bool) -> list[dict[str, Any]]:
    """The window shapes: name, frame size, window length, episodes, frames per episode."""
    if tiny:
        return [
            dict(name="v_a", h=64, w=64, window=12, episodes=2, frames=48, windows=8),
            dict(name="v_b", h=96, w=128, window=4, episodes=2, frames=48, windows=8),
        ]
    return [
        dict(name="v224", h=224, w=224, window=90, episodes=6, frames=300, windows=48),
        dict(name="v480", h=480, w=640, window=16, episodes=4, frames=240, windows=96),
    ]


def label(sz: dict[str, Any]) -> str:
    return f"{sz['window']}x{sz['w']}x{sz['h']}"


def data_dir(tiny: bool) -> Path:
    return Path(os.environ.get("TREADLE_BENCH_DATA") or HERE / "data") / (
        "video-tiny" if tiny else "video"
    )


def generate(tiny: bool, log: Callable[[str], None] = print) -> Path:
    import treadle as td

    root = data_dir(tiny)
    if (root / "treadle.done").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    branch = td.Client(str(root / "treadle"), create=True).project("bench").branch()
    for sz in sizes(tiny):
        log(f"  generating {sz['episodes']} H.264 episodes of {sz['frames']} {sz['w']}x{sz['h']}")
        for e in range(sz["episodes"]):
            frames = frames_of(sz)(e)
            branch.table(sz["name"]).append_episode(
                {"cam": td.VideoFrames(frames, fps=30), "action": np.zeros((len(frames), 7))},
                episode=f"ep{e}",
            )
    (root / "treadle.done").write_text("ok\n")
    return root


def recipe(client: Any, sz: dict[str, Any]) -> Any:
    import treadle as td

    branch = client.project("bench").branch()
    w = td.Windows({"cam": td.Video(range(sz["window"]))})
    return td.Recipe(
        seed=7, batch_size=BATCH, components=[td.Component(branch.table(sz["name"]), w)]
    )


def treadle_iter(
    client: Any, sz: dict[str, Any], workers: int, threads: int, steps: int
) -> Iterator[Any]:
    import treadle as td

    return iter(
        td.TrainLoader(
            recipe(client, sz),
            steps=steps,
            workers=workers,
            prefetch=PREFETCH,
            video_threads=threads,
        )
    )


def stream_paths(root: Path, sz: dict[str, Any]) -> list[str]:
    media = root / "treadle" / "projects" / "bench" / "media" / sz["name"]
    return sorted(str(p) for p in media.glob("*.h264"))


def _decode(paths: list[str], rgb: bool = False) -> int:
    """Decode every frame of ``paths`` in this process, 1 thread; ``rgb``: and convert each
    to rgb24 with one reused ``VideoReformatter`` (1 scaling thread).

    PyAV's sequential decode, which matches the ``ffmpeg`` CLI's rate (FACTS.md); the CLI
    itself is never used here (``video_windows.limit_fn`` picks it when installed): its
    process start costs about as much as decoding a 300-frame stream, and its CPU time
    belongs to a child that has exited before it can be read.
    """
    from av.video.reformatter import VideoReformatter

    conv = VideoReformatter()
    for p in paths:
        with av.open(p, format="h264") as c:
            s = c.streams.video[0]
            s.thread_count = 1
            s.thread_type = "SLICE"
            for f in c.decode(s):
                if rgb:
                    conv.reformat(f, format="rgb24", threads=1)
    return 0


def limit_runs(paths: list[str], frames: int, procs: int, rgb: bool = False) -> tuple[float, float]:
    """(wall s, CPU s) of PyAV decoding every frame of ``paths`` (``rgb``: and converting
    it); ``procs`` processes."""
    from benchlib import timed

    if procs == 1:
        r = timed(lambda: (_decode(paths, rgb), frames)[1])
        return r.wall_s, r.cpu_s
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        pool.map(_decode, [[] for _ in range(procs)])  # start the processes first
        parts = [(paths[i::procs], rgb) for i in range(procs)]
        t0 = time.perf_counter()
        c0 = _pool_cpu(pool)
        pool.starmap(_decode, parts, chunksize=1)
        wall = time.perf_counter() - t0
        cpu = _pool_cpu(pool) - c0
    return wall, cpu


def _pool_cpu(pool: Any) -> float:
    from benchlib import tree_cpu

    return sum(tree_cpu(p.pid) for p in pool._pool)  # noqa: SLF001


def frames_of(sz: dict[str, Any]) -> Callable[[int], np.ndarray]:
    """The frames of episode ``e`` of a size, as :func:`generate` encoded them."""
    return lambda e: vw.content(sz["frames"], sz["h"], sz["w"], seed=e)


def window_ranges(plan: Any, steps: range) -> list[tuple[str, int, int, int]]:
    """(media key, start, end, packets) of every window of ``steps`` (treadle's plan): the
    bytes it needs and how many frames must be decoded for it (from the keyframe on)."""
    from treadle.read.stream_index import StreamIndexes
    from treadle.video import plan_window

    streams = StreamIndexes()
    table = plan.table(0)
    eps = table.episodes()
    offsets = np.asarray(plan.windows(0)["cam"].offsets)
    out = []
    for s in steps:
        b = plan.batch(s)
        for m in b.moment:
            e = int(np.searchsorted(eps.starts, m, side="right") - 1)
            key, index = streams.lookup(table, "cam", e)
            wp = plan_window(index, int(m - eps.starts[e]) + offsets)
            out.append((key, wp.start, wp.end, wp.num_packets))
    return out
