"""Case ``images``: camera frames stored as JPEG/PNG bytes, at Pillow's decode limit (issue 44).

Three tables of one binary column of encoded images (the ``video`` case's camera-like
frames, ``video_windows.content``), under ``bench/data/images/``:

- ``jpg_a``, ``jpg_b``: 224x224 JPEGs, quality 90 (Pillow's encoder);
- ``png``: 640x480 PNGs, read with ``td.Video(..., size=(224, 224))`` so the batch stacks
  (Pillow's bilinear resize, the same in the limit).

A recipe mixes them at weights 0.3 / 0.5 / 0.2, batch 64, as single frames
(``td.Video([0])``) and as 4-frame windows (``td.Video(range(4))``), :data:`TIMED_FRAMES`
frames timed per row. Per window kind, in interleaved rounds:

- ``limit``: Pillow's decode of exactly the images the timed steps need
  (``Image.open(BytesIO(b)).convert("RGB")``, resized for the PNG table, copied into one
  reused array), their bytes in memory beforehand, on one core (this process, one thread);
- treadle ``TrainLoader`` at workers 0 with 1 and 2 decode threads, and workers 2 (one decode
  thread each), on local disk (``where: local``) and, right after each, the same
  configuration on the same tables copied into SeaweedFS behind ``delay_proxy`` (30 ms per
  request; ``where: s3``; each run from a cold object cache, with the requests and kB per
  batch the proxy counted in its label);
- the peers of :mod:`images_peers` (single frames): WebDataset, HF ``datasets`` ``Image()``
  with ``interleave_datasets``, MosaicML Streaming ``jpeg``/``png``, DataLoader workers 0
  and 2, the same bytes, :data:`PEER_BATCHES` timed batches.

:func:`ratios` prints each row against the limit x the cores it used (wall; and frames per
CPU-second against the limit's, which a loaded machine disturbs less) and each S3 row
against its local twin. The goals: treadle >= 0.95 (1 thread), >= 0.9 (2 threads or 2
workers), S3 >= 0.9 of local.

    python bench/suite.py --cases images [--runs 3]
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchlib import Result, Run, cold_object_cache, timed

HERE = Path(__file__).resolve().parent
BATCH = 64
WEIGHTS = {"jpg_a": 0.3, "jpg_b": 0.5, "png": 0.2}
SIZE = (224, 224)
WINDOWS = {"single": 1, "window4": 4}
WARM = 3  # batches after the first, not timed (decode threads and buffers warm)
TIMED_FRAMES = 2560
"""Frames timed per treadle row (40 batches of single frames, 10 of 4-frame windows)."""
PEER_BATCHES = 10
"""Timed batches per peer row (their rates are 4-10x lower: a few seconds each)."""


def data_dir(tiny: bool) -> Path:
    base = Path(os.environ.get("TREADLE_BENCH_DATA") or HERE / "data")
    return base / ("images-tiny" if tiny else "images")


def _encode(frame: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    b = io.BytesIO()
    kw = {"quality": 90} if fmt == "JPEG" else {}
    Image.fromarray(frame).save(b, format=fmt, **kw)
    return b.getvalue()


def generate(tiny: bool, log: Callable[[str], None] = print) -> Path:
    """The three tables (once: a ``.done`` marker)."""
    import treadle as td
    import video_windows as vw

    root = data_dir(tiny)
    if (root / "treadle.done").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    branch = td.Client(str(root / "treadle"), create=True).project("bench").branch()
    episodes, t = (2, 20) if tiny else (12, 100)
    for name in WEIGHTS:
        h, w, fmt = (480, 640, "PNG") if name == "png" else (224, 224, "JPEG")
        n = max(2, episodes // 3) if name == "png" else episodes
        log(f"  generating {n} episodes of {t} {w}x{h} {fmt}s: {name}")
        for e in range(n):
            frames = vw.content(t, h, w, seed=100 * len(name) + e)
            branch.table(name).append_episode(
                {"cam": [_encode(f, fmt) for f in frames]}, episode=f"ep{e}", fps=30
            )
    (root / "treadle.done").write_text("ok\n")
    return root


def recipe(client: Any, window: int) -> Any:
    import treadle as td

    branch = client.project("bench").branch()
    comps = []
    for name, weight in WEIGHTS.items():
        size = SIZE if name == "png" else None
        spec = td.Video(range(window), size=size)
        comps.append(td.Component(branch.table(name), td.Windows({"cam": spec}), weight=weight,
                                  name=name))  # fmt: skip
    return td.Recipe(seed=44, batch_size=BATCH, components=comps)


def needed_images(plan: Any, steps: range, window: int) -> list[tuple[bytes, bool]]:
    """The encoded images the timed steps decode (bytes, resized?), in batch order."""
    out = []
    for step in steps:
        b = plan.batch(step)
        for c in np.unique(b.component):
            table = plan.table(int(c))
            moments = np.asarray(b.moment)[np.asarray(b.component) == c]
            rows = (moments[:, None] + np.arange(window)[None, :]).reshape(-1)
            values = table.take(rows, ["cam"]).column("cam").to_pylist()
            resize = table.name == "png"
            out += [(v, resize) for v in values]
    return out


def decode_limit(images: list[tuple[bytes, bool]]) -> int:
    """Pillow decode (+ the PNG table's bilinear resize) of every image into one reused
    array, on this thread; returns the frames decoded."""
    from PIL import Image

    buf = np.empty((*SIZE, 3), np.uint8)
    for data, resize in images:
        img = Image.open(io.BytesIO(data)).convert("RGB")
        if resize:
            img = img.resize((SIZE[1], SIZE[0]), Image.BILINEAR)
        buf[...] = np.asarray(img)
    return len(images)


def _treadle_rows(plans: dict[str, Any], where: str, proxy: Any, batches: dict[str, int]
                  ) -> list[tuple[Result, Callable[[], Run]]]:  # fmt: skip
    """treadle at workers 0 (threads 1, 2) and workers 2, per window kind, on one copy of
    the tables (``where``: local, or s3 through ``proxy``, each run from a cold object cache)."""
    import treadle as td
    from case_cloud import timed_run

    rs = []
    for kind, window in WINDOWS.items():
        for workers, threads in ((0, 1), (0, 2), (2, 1)):
            cfg = {"window": kind, "batch": BATCH, "workers": workers, "threads": threads,
                   "where": where}  # fmt: skip
            r = Result("images", "treadle", cfg, "frames/s")
            r.config["base_label"] = r.config["label"] = (
                f"treadle TrainLoader {'on S3 +30 ms' if proxy else 'local'} "
                f"workers={workers} threads={threads}"
            )

            def fn(plan=plans[kind], workers=workers, threads=threads, window=window, r=r,
                   n=batches[kind]) -> Run:  # fmt: skip
                steps = 1 + WARM + n + 1
                make = lambda: iter(td.TrainLoader(plan, steps=steps, workers=workers,  # noqa: E731
                                                   video_threads=threads))  # fmt: skip
                with cold_object_cache() if proxy else contextlib.nullcontext():
                    run = timed_run(make, n * BATCH, steps, WARM, proxy, r)
                run.samples *= window
                return run

            rs.append((r, fn))
    return rs


def _limit_rows(plans: dict[str, Any], batches: dict[str, int]
                ) -> list[tuple[Result, Callable[[], Run]]]:  # fmt: skip
    rs = []
    for kind, window in WINDOWS.items():
        first = 1 + WARM  # measure() skips the first batch and WARM more
        images = needed_images(plans[kind], range(first, first + batches[kind]), window)
        lim = Result("images", "limit", {"window": kind, "batch": BATCH, "cores": 1}, "frames/s")
        lim.config["label"] = (
            "limit: Pillow decode of the needed images into a reused array, 1 core"
        )
        rs.append((lim, lambda images=images: timed(lambda: decode_limit(images))))
    return rs


def _s3(stack: contextlib.ExitStack, root: Path, log: Callable[[str], None]) -> tuple[Any, Any]:
    """The tables on SeaweedFS behind the 30 ms proxy: (client, proxy)."""
    import case_s3 as c3
    import treadle as td
    from case_cloud import LATENCY_S, Proxied
    from delay_proxy import DelayProxy
    from treadle.testing import SeaweedS3

    s3 = stack.enter_context(SeaweedS3(bucket="bench"))
    proxy = stack.enter_context(DelayProxy(s3.endpoint, LATENCY_S))
    t0 = time.perf_counter()
    nbytes = c3.upload(s3, root / "treadle", "images")
    log(f"  uploaded {nbytes / 1e6:,.0f} MB to SeaweedFS in {time.perf_counter() - t0:.1f} s")
    s3p = Proxied(s3, proxy)
    return td.Client(s3p.url("images"), storage_options=s3p.storage_options()), proxy


def run(tiny: bool, runs: int, log: Callable[[str], None] = print) -> list[Result]:
    """Every row, ``runs`` interleaved rounds (each S3 row right after its local twin)."""
    import images_peers
    import treadle as td

    root = generate(tiny, log)
    client = td.Client(str(root / "treadle"))
    batches = {k: (4 if tiny else TIMED_FRAMES // (BATCH * w)) for k, w in WINDOWS.items()}
    with contextlib.ExitStack() as stack:
        plans = {k: recipe(client, w).plan() for k, w in WINDOWS.items()}
        rs = _limit_rows(plans, batches)
        local = _treadle_rows(plans, "local", None, batches)
        try:
            remote, proxy = _s3(stack, root, log)
            s3_plans = {k: recipe(remote, w).plan() for k, w in WINDOWS.items()}
            s3_rows = _treadle_rows(s3_plans, "s3", proxy, batches)
        except Exception as e:  # no S3 server here: the local rows still run
            s3_rows = []
            log(f"  images: no S3 rows: {type(e).__name__}: {str(e)[:160]}")
        for i, row in enumerate(local):
            rs += [row] + s3_rows[i : i + 1]
        rs += images_peers.rows(root, client, 4 if tiny else PEER_BATCHES, WARM, log)
        for rnd in range(runs):
            t = time.perf_counter()
            for r, fn in rs:
                if r.status == "ok":
                    try:
                        r.runs.append(fn())
                    except Exception as e:  # reported, the others go on
                        r.status = f"failed: {type(e).__name__}: {str(e)[:160]}"
                        log(f"    {r.config['label']}: {r.status}")
            log(f"  images: round {rnd + 1}/{runs} took {time.perf_counter() - t:.0f} s, "
                f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    out = [r for r, _ in rs]
    for line in ratios(out):
        log("  " + line)
    return out


def _ratio(num: Result, den: Result | None, scale: int = 1) -> str:
    if not den or not num.rate or not den.rate:
        return "-"
    wall = num.rate / (den.rate * scale)
    cpu = (num.cpu_rate or 0) / (den.cpu_rate or 1)
    return f"{wall:.3f} (CPU {cpu:.3f})"


def ratios(results: list[Result]) -> list[str]:
    """Per window kind: each reader against the limit x the cores it used (wall rate; in
    brackets frames per CPU-second against the limit's), and treadle on S3 against the same
    configuration on local disk. Also kept in each row's ``extra["ratio"]``."""
    lines = []
    for kind in WINDOWS:
        rows = [r for r in results if r.config.get("window") == kind and r.runs]
        lim = next((r for r in rows if r.name == "limit"), None)
        for r in rows:
            if r.name == "limit":
                continue
            c = r.config
            cores = max(c["workers"], c["threads"])
            text = f"{_ratio(r, lim, cores)} x limit x {cores}"
            if c.get("where") == "s3":
                twin = next((x for x in rows if x.name == r.name and x.config.get("where")
                             == "local" and x.config["workers"] == c["workers"]
                             and x.config["threads"] == c["threads"]), None)  # fmt: skip
                text += f"; {_ratio(r, twin)} x local"
            r.extra["ratio"] = text
            lines.append(f"images {r.name} {kind} {c.get('where', 'local')} workers="
                         f"{c['workers']} threads={c['threads']}: {r.rate:,.0f} frames/s = "
                         f"{text} ({lim.rate if lim else 0:,.0f}/core)")  # fmt: skip
    return lines
