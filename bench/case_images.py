"""Case ``images``: camera frames stored as JPEG/PNG bytes, at Pillow's decode limit (issue 44).

Three tables of one binary column of encoded images (the ``video`` case's camera-like
frames, ``video_windows.content``), under ``bench/data/images/``:

- ``jpg_a``, ``jpg_b``: 224x224 JPEGs, quality 90 (Pillow's encoder);
- ``png``: 640x480 PNGs, read with ``td.Video(..., size=(224, 224))`` so the batch stacks
  (Pillow's bilinear resize, the same in the limit).

A recipe mixes them at weights 0.3 / 0.5 / 0.2, batch 64, as single frames
(``td.Video([0])``) and as 4-frame windows (``td.Video(range(4))``). Per window kind, in
interleaved rounds:

- ``limit``: Pillow's decode of exactly the images the timed steps need
  (``Image.open(BytesIO(b)).convert("RGB")``, resized for the PNG table, copied into one
  reused array), their bytes in memory beforehand, on one core (this process, one thread);
- treadle ``TrainLoader`` at workers 0 with 1 and 2 decode threads, and workers 2 (one decode
  thread each).

``report.py``-style ratios are printed by :func:`ratios`: threads=1 against the limit, 2
threads and 2 workers against the limit x 2 (the goals: >= 0.95 and >= 0.9). One peer, for
single frames: WebDataset (shards of the same bytes, ``RandomMix`` at the same weights, PIL
decode and the same resize in a ``map``, a ``DataLoader`` of batch 64, workers 0 and 2).
HF ``Image()`` with ``interleave_datasets`` and MDS ``jpeg`` are not measured here yet.

    python bench/suite.py --cases images [--runs 3]
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchlib import Result, Run, batch_len, measure, timed

HERE = Path(__file__).resolve().parent
BATCH = 64
WEIGHTS = {"jpg_a": 0.3, "jpg_b": 0.5, "png": 0.2}
SIZE = (224, 224)
WINDOWS = {"single": 1, "window4": 4}
WARM = 3  # batches after the first, not timed (decode threads and buffers warm)


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


def write_shards(root: Path, client: Any) -> Path:
    """The tables' images as WebDataset shards, one folder per table (once)."""
    import webdataset as wds

    out = root / "wds"
    if (out / "done").exists():
        return out
    branch = client.project("bench").branch()
    for name in WEIGHTS:
        (out / name).mkdir(parents=True, exist_ok=True)
        ext = "png" if name == "png" else "jpg"
        values = branch.table(name).pin().to_arrow(["cam"]).column("cam").to_pylist()
        with wds.TarWriter(str(out / name / "000000.tar")) as w:
            for i, v in enumerate(values):
                w.write({"__key__": f"{i:06d}", ext: v})
    (out / "done").write_text("ok\n")
    return out


def _pil_sample(sample: dict) -> np.ndarray:
    from PIL import Image

    data = sample.get("jpg") or sample["png"]
    img = Image.open(io.BytesIO(data)).convert("RGB")
    if "png" in sample:
        img = img.resize((SIZE[1], SIZE[0]), Image.BILINEAR)
    return np.asarray(img)


def wds_iter(shards: Path, workers: int) -> Any:
    import torch
    import webdataset as wds

    sets = [wds.WebDataset(str(shards / n / "000000.tar"), shardshuffle=False, empty_check=False)
            .repeat().map(_pil_sample) for n in WEIGHTS]  # fmt: skip
    mix = wds.RandomMix(sets, probs=list(WEIGHTS.values()))
    dl = torch.utils.data.DataLoader(mix, batch_size=BATCH, num_workers=workers,
                                     multiprocessing_context="spawn" if workers else None)  # fmt: skip
    return iter(dl)


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


def run(tiny: bool, runs: int, log: Callable[[str], None] = print) -> list[Result]:
    import treadle as td

    root = generate(tiny, log)
    client = td.Client(str(root / "treadle"))
    timed_batches = 4 if tiny else 40
    rs: list[tuple[Result, Callable[[], Run]]] = []
    for kind, window in WINDOWS.items():
        plan = recipe(client, window).plan()
        first = 1 + WARM  # measure() skips the first batch and WARM more
        steps = range(first, first + timed_batches)
        images = needed_images(plan, steps, window)
        base = {"window": kind, "batch": BATCH}
        lim = Result("images", "limit", {**base, "cores": 1}, "frames/s")
        lim.config["label"] = (
            "limit: Pillow decode of the needed images into a reused array, 1 core"
        )
        rs.append((lim, lambda images=images: timed(lambda: decode_limit(images))))
        for workers, threads in ((0, 1), (0, 2), (2, 1)):
            r = Result("images", "treadle", {**base, "workers": workers, "threads": threads},
                       "frames/s")  # fmt: skip
            r.config["label"] = f"treadle TrainLoader workers={workers} threads={threads}"

            def tr(plan=plan, workers=workers, threads=threads, window=window) -> Run:
                n = timed_batches * BATCH
                run = measure(lambda: iter(td.TrainLoader(
                    plan, steps=1 + WARM + timed_batches + 1, workers=workers,
                    video_threads=threads)), n, batch_len, WARM)  # fmt: skip
                run.samples *= window
                return run

            rs.append((r, tr))
    rs += _peers(root, client, timed_batches)
    for rnd in range(runs):
        for r, fn in rs:
            if r.status == "ok":
                try:
                    r.runs.append(fn())
                except Exception as e:  # reported, the others go on
                    r.status = f"failed: {type(e).__name__}: {str(e)[:160]}"
        log(f"  images: round {rnd + 1}/{runs} done")
    out = [r for r, _ in rs]
    for line in ratios(out):
        log("  " + line)
    return out


def _peers(root: Path, client: Any, timed_batches: int) -> list[tuple[Result, Callable[[], Run]]]:
    try:
        import webdataset  # noqa: F401
    except ImportError:
        return []
    shards = write_shards(root, client)
    out = []
    for workers in (0, 2):
        r = Result("images", "wds", {"window": "single", "batch": BATCH, "workers": workers,
                                     "threads": 1}, "frames/s")  # fmt: skip
        r.config["label"] = f"WebDataset RandomMix + PIL, DataLoader workers={workers}"
        out.append(
            (
                r,
                lambda w=workers: measure(
                    lambda: wds_iter(shards, w), timed_batches * BATCH, batch_len, WARM
                ),
            )
        )
    return out


def ratios(results: list[Result]) -> list[str]:
    """treadle against the limit (x cores used), per window kind."""
    lines = []
    for kind in WINDOWS:
        lim = next((r.rate for r in results if r.name == "limit" and r.config["window"] == kind),
                   None)  # fmt: skip
        for r in results:
            if r.name == "limit" or r.config["window"] != kind or not lim or not r.rate:
                continue
            cores = max(r.config["workers"], r.config["threads"])
            lines.append(f"images {r.name} {kind} workers={r.config['workers']} threads="
                         f"{r.config['threads']}: {r.rate:,.0f} frames/s = "
                         f"{r.rate / (lim * cores):.3f} x limit x {cores} ({lim:,.0f}/core)")  # fmt: skip
    return lines
