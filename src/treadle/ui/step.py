"""One step of a run: the exact samples of ``plan.batch(step, rank, world_size)``, read as
the loader reads them (``treadle.read``: the same reader, the same decode).

The page is bounded whatever the batch: its first screen shows, per sample and camera
(a video column, or a ``td.Video`` over an image column), one anchor frame (the moment's
own frame, at the window's size, as a JPEG of at most :data:`THUMB` px; 16-bit depth
stretched to its min..max), each numeric window as an inline SVG, and a button that
loads that sample's whole windows (lossless PNG strips: the loader's pixels, 16-bit PNG
for depth) on demand. A
256-sample batch of two 16-frame 224x224 cameras is ~2 MB, not ~1 GB of PNG. ``plan.batch``
is O(1): step 10^12 costs what step 0 costs. ``treadle show --out`` writes the same first
screen with no links (a file has no server behind it).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.errors import NotFound
from treadle.plan.plan import Plan
from treadle.plan.windows import Video
from treadle.read.columns import ColumnSpec, output_columns
from treadle.read.sample_reader import SampleReader
from treadle.ui.html import crumbs, episode_url, esc, link, page, table, url
from treadle.ui.image_frames import stretched
from treadle.ui.media import png
from treadle.video.frame_spec import RAW16

_IDS = ("_component", "_moment", "_episode", "_frame")
THUMB = 128
"""The longest side, in pixels, of an anchor frame on a step page's first screen."""
PAGE = 256
"""Samples per page of a step in the viewer (a batch of 8192 is 32 pages, each read and
decoded on its own; ``treadle show`` writes every sample)."""


@dataclass(frozen=True)
class StepView:
    """Samples of one step for one rank and the arrays the reader gave for them.
    ``anchors``: cameras hold the anchor frame only (the first screen)."""

    plan: Plan
    step: int
    rank: int
    world_size: int
    samples: list[dict[str, Any]]
    arrays: dict[str, np.ndarray]
    anchors: bool = False
    cameras: frozenset[str] = frozenset()  # batch columns of decoded frames (video, images)
    total: int = 0  # samples of the step on this rank (``samples`` may be one page of them)


def _anchor(cs: ColumnSpec) -> ColumnSpec:
    """``cs`` reading the moment's own frame of a video window (at the window's size; an
    image column's channels kept, and its 16-bit values)."""
    if not cs.video or cs.absent or not isinstance(cs.spec, Video):
        return cs
    spec = Video([0], size=cs.spec.size, channels=cs.spec.channels)
    image = cs.image
    if image is not None:
        frame = spec.frame
        if image.first.depth16:
            frame = dataclasses.replace(frame, dtype=RAW16)
        image = dataclasses.replace(image, frame=frame)
    return dataclasses.replace(cs, spec=spec, image=image)


def _reader(plan: Plan, anchors: bool) -> tuple[SampleReader, frozenset[str]]:
    """The loader's reader of the plan's columns, and the names of its cameras."""
    columns = output_columns(plan)
    if anchors:
        columns = [[_anchor(cs) for cs in specs] for specs in columns]
    tables = [plan.table(c) for c in range(plan.num_components)]
    threads = min(4, os.cpu_count() or 1)  # one batch, waited for: decode it in parallel
    cameras = frozenset(cs.name for specs in columns for cs in specs if cs.video)
    return SampleReader(tables, columns, video_threads=threads, copy_objects=False), cameras


def read_step(plan: Plan, step: int, rank: int = 0, world_size: int = 1, *,
              anchors: bool = False, sample: int | None = None, first: int = 0,
              count: int | None = None) -> StepView:  # fmt: skip
    """Plan the batch (pure), then read it with the loader's reader: every sample (or
    ``count`` from index ``first``), or the one at index ``sample``; ``anchors``: one
    frame per video window (first screen)."""
    batch = plan.batch(step, rank, world_size)
    end = len(batch) if count is None else min(len(batch), max(0, first) + max(0, count))
    ks = np.arange(max(0, first), end) if sample is None else np.array([sample])
    if sample is None and first and not len(ks):
        raise NotFound(f"step {batch.step} has samples 0..{len(batch) - 1} on rank {rank}, "
                       f"none from {first}")  # fmt: skip
    if sample is not None and not 0 <= sample < len(batch):
        raise NotFound(f"step {batch.step} has samples 0..{len(batch) - 1} on rank "
                             f"{rank}, not sample {sample}")  # fmt: skip
    reader, cameras = _reader(plan, anchors)
    try:
        got = reader.read(batch.component[ks], batch.moment[ks])
        arrays = {k: np.asarray(v) for k, v in got.items()}
    finally:
        reader.close()
    pads = sorted(k for k in arrays if k.endswith("_is_pad"))
    samples = []
    for i, k in enumerate(ks.tolist()):
        c = int(batch.component[k])
        tab = plan.table(c)
        e = int(arrays["_episode"][i])
        samples.append({
            "slot": batch.rank + k * batch.world_size, "index": k,
            "position": int(batch.position[k]), "component": c, "table": tab.name,
            "version": int(tab.version), "episode": tab.episodes().names[e], "episode_index": e,
            "frame": int(arrays["_frame"][i]), "moment": int(batch.moment[k]),
            "pad": {p[: -len("_is_pad")]: arrays[p][i].astype(bool).tolist() for p in pads},
        })  # fmt: skip
    return StepView(plan, batch.step, rank, world_size, samples, arrays, anchors, cameras,
                    len(batch))  # fmt: skip


def step_json(view: StepView) -> dict[str, Any]:
    """The sample list (``treadle show --json``)."""
    samples = [{k: v for k, v in s.items() if k != "index"} for s in view.samples]
    return {"run_id": view.plan.run_id, "step": view.step, "rank": view.rank,
            "world_size": view.world_size, "samples": samples}  # fmt: skip


def _frames(arr: np.ndarray) -> np.ndarray | None:
    """``[T, H, W, C]`` frames of one sample's camera window: uint8 RGB (C 3) or grey
    (C 1), or an image column's 16-bit values (one frame with no time axis, ``[H, W, C]``
    or ``[C, H, W]``, as ``T`` 1); None for float frames."""
    if arr.dtype in (np.uint8, np.uint16) and arr.ndim == 3:
        arr = arr[None]  # a camera read without a window: the moment's frame
    if arr.dtype not in (np.uint8, np.uint16) or arr.ndim != 4:
        return None
    if arr.shape[-1] in (1, 3):
        return arr
    if arr.shape[1] in (1, 3):  # TCHW
        return np.ascontiguousarray(arr.transpose(0, 2, 3, 1))
    return None


def _strip(frames: np.ndarray, pad: list[bool], column: str, slot: int) -> str:
    imgs = []
    for t, f in enumerate(frames):
        data = base64.b64encode(png(np.ascontiguousarray(f))).decode()
        cls = ' class="pad"' if t < len(pad) and pad[t] else ""
        imgs.append(f'<img{cls} data-slot="{slot}" data-column="{esc(column)}" data-t="{t}" '
                    f'alt="{esc(column)} {t}" src="data:image/png;base64,{data}">')  # fmt: skip
    return '<div class="strip">' + "".join(imgs) + "</div>"


def thumbnail(frame: np.ndarray) -> bytes:
    """A JPEG of ``frame`` ``[H, W, 3]`` or ``[H, W, 1]`` (grey; 16-bit values stretched
    to their min..max), its longest side at most :data:`THUMB`."""
    from PIL import Image

    frame = stretched(frame)
    img = Image.fromarray(np.ascontiguousarray(frame if frame.shape[-1] == 3 else frame[..., 0]))
    factor = -(-max(img.size) // THUMB)  # a whole factor: a box filter, ~10x a resize's speed
    if factor > 1:
        img = img.reduce(factor)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=80)
    return out.getvalue()


def _anchor_img(frame: np.ndarray, column: str, slot: int) -> str:
    data = base64.b64encode(thumbnail(frame)).decode()
    return (f'<img class="anchor" data-slot="{slot}" data-column="{esc(column)}" '
            f'alt="{esc(column)} anchor" src="data:image/jpeg;base64,{data}">')  # fmt: skip


def _svg(values: np.ndarray, width: int = 220, height: int = 70) -> str:
    """An inline SVG of ``values`` ``[T]`` or ``[T, D]`` (one polyline per dimension)."""
    v = values.reshape(values.shape[0], -1).astype(np.float64)
    lo, hi = float(np.nanmin(v)), float(np.nanmax(v))
    span = hi - lo or 1.0
    xs = np.linspace(2, width - 2, v.shape[0]) if v.shape[0] > 1 else np.array([width / 2])
    lines = []
    for d in range(min(v.shape[1], 16)):
        ys = height - 2 - (v[:, d] - lo) / span * (height - 4)
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
        lines.append(f'<polyline fill="none" stroke="hsl({d * 47 % 360},60%,45%)" points="{pts}"/>')
    return (f'<svg class="chunk" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            f"{''.join(lines)}</svg>")  # fmt: skip


def _windows(view: StepView, i: int) -> str:
    """The windows of sample ``i`` of the view: an anchor frame (first screen) or a PNG
    strip (the whole window) per camera, an SVG per numeric window."""
    s = view.samples[i]
    parts = []
    for col in sorted(c for c in view.arrays if c not in _IDS and not c.endswith("_is_pad")):
        a = view.arrays[col][i]
        frames = _frames(a) if col in view.cameras else None
        if frames is not None and view.anchors:
            parts.append(f'<div class="win"><b>{esc(col)}</b>'
                         f"{_anchor_img(frames[0], col, s['slot'])}</div>")  # fmt: skip
        elif frames is not None:
            strip = _strip(frames, s["pad"].get(col, []), col, s["slot"])
            parts.append(f'<div class="win"><b>{esc(col)}</b>{strip}</div>')
        elif np.issubdtype(a.dtype, np.number) and a.size:
            parts.append(f'<div class="win"><b>{esc(col)}</b> <small>{esc(list(a.shape))}</small>'
                         f"{_svg(a if a.ndim else a.reshape(1))}</div>")  # fmt: skip
    return "".join(parts)


def _sample_src(view: StepView, k: int) -> str:
    r = view.plan.record
    return url("p", r.project, "runs", r.run_id, "steps", view.step, "samples", k,
               rank=view.rank, world_size=view.world_size)  # fmt: skip


def samples_table(view: StepView, *, links: bool = True) -> str:
    """The samples of the step with their windows, as one HTML table (``links``: episode
    links and the buttons that load a sample's whole windows; none in a file)."""
    r = view.plan.record
    rows = []
    for i, s in enumerate(view.samples):
        ep = esc(s["episode"])
        if links:
            ep = link(episode_url(r.project, s["table"], s["version"], s["episode"],
                                  frame=s["frame"]), s["episode"])  # fmt: skip
        pads = "; ".join(f"{c}: {sum(v)}/{len(v)}" for c, v in s["pad"].items()) or "-"
        windows = _windows(view, i)
        if links and view.anchors:
            windows += (f'<button type="button" class="more" data-src="'
                        f'{esc(_sample_src(view, s["index"]))}">all frames</button>')  # fmt: skip
        rows.append([s["slot"], s["component"], esc(s["table"]), ep, s["frame"], s["moment"],
                     esc(pads), windows])  # fmt: skip
    head = ["slot", "component", "table", "episode", "frame", "moment", "padded", "windows"]
    return _pager(view, links) + table(head, rows, raw=True, id_="samples")


def _pager(view: StepView, links: bool) -> str:
    """ "samples 257-512 of 8192" with links to the pages before and after, when the view
    holds one page of the step's samples."""
    if not view.samples or len(view.samples) == view.total:
        return ""
    a, b = view.samples[0]["index"], view.samples[-1]["index"] + 1
    r = view.plan.record
    pages = [
        link(url("p", r.project, "runs", r.run_id, "steps", view.step, rank=view.rank,
                 world_size=view.world_size, offset=o or None), label)
        for o, label, show in ((max(0, a - PAGE), "← previous samples", a > 0),
                               (b, "next samples →", b < view.total)) if show and links
    ]  # fmt: skip
    return (f'<p class="pager" id="samples-pager">samples {a + 1:,}–{b:,} of {view.total:,}'
            f"{' · ' + ' · '.join(pages) if pages else ''}</p>")  # fmt: skip


def sample_html(view: StepView) -> str:
    """One sample's whole windows (the loader's pixels, lossless): what "all frames" loads."""
    return f'<div class="sample" data-slot="{view.samples[0]["slot"]}">{_windows(view, 0)}</div>'


def _frame(plan: Plan, step: int, rank: int, world_size: int, body: str, inline: bool) -> str:
    """The page around ``body``: facts, links to the steps before and after, breadcrumbs
    (``inline``: a file with no server: no links, CSS embedded)."""
    r = plan.record
    nav_steps = " · ".join(
        link(url("p", r.project, "runs", r.run_id, "steps", n, rank=rank,
                 world_size=world_size), label)
        for n, label in ((step - 1, "← previous step"), (step + 1, "next step →"))
        if n >= 0 and not inline
    )  # fmt: skip
    facts = (
        f'<p id="facts">run <code>{esc(r.run_id)}</code> · project {esc(r.project)} · '
        f"step {step:,} · rank {rank} of {world_size} · {plan.batch_size // world_size} "
        f"samples{' · ' + nav_steps if nav_steps else ''}</p>"
    )
    nav = "" if inline else crumbs(
        (url("p", r.project), r.project),
        (url("p", r.project, "runs"), "runs"),
        (url("p", r.project, "runs", r.run_id), r.run_id),
        f"step {step}",
    )  # fmt: skip
    scripts = [] if inline else ["viewer.js"]
    return page(f"run {r.run_id} step {step}", facts + body, nav=nav, inline=inline,
                scripts=scripts)  # fmt: skip


def step_html(view: StepView, *, inline: bool = False) -> str:
    """The whole step page, samples read (``inline``: CSS inlined and no links, for a
    file that opens with no server: ``treadle show --out``)."""
    body = samples_table(view, links=not inline)
    return _frame(view.plan, view.step, view.rank, view.world_size, body, inline)


def step_shell(plan: Plan, step: int, rank: int = 0, world_size: int = 1,
               offset: int = 0) -> str:  # fmt: skip
    """The step page before its samples are read: ``viewer.js`` loads the samples table
    (``.../steps/N/samples``: :data:`PAGE` samples from ``offset``), so a slow store shows
    "loading…", never a blank page."""
    plan.batch(step, rank, world_size)  # a bad step, rank or world size fails here, not later
    r = plan.record
    src = url("p", r.project, "runs", r.run_id, "steps", step, "samples", rank=rank,
              world_size=world_size, offset=offset or None)  # fmt: skip
    body = f'<div id="step" data-src="{esc(src)}"><p class="muted">loading…</p></div>'
    return _frame(plan, step, rank, world_size, body, inline=False)
