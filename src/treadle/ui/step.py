"""One step of a run: the exact samples of ``plan.batch(step, rank, world_size)``, read as
the loader reads them (``treadle.read.steps.host_reader``: the same reader, the same
decode), with each window's frames as a strip of lossless PNGs (inlined as data URIs, so
the same HTML serves the viewer and ``treadle show --out``) and each numeric window plotted
as an inline SVG. ``plan.batch`` is O(1): step 10^12 costs what step 0 costs.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.plan.plan import Plan
from treadle.read.steps import host_reader
from treadle.ui.html import crumbs, esc, link, page, table, url
from treadle.ui.media import png

_IDS = ("_component", "_moment", "_episode", "_frame")


@dataclass(frozen=True)
class StepView:
    """The samples of one step for one rank and the arrays the reader gave for them."""

    plan: Plan
    step: int
    rank: int
    world_size: int
    samples: list[dict[str, Any]]
    arrays: dict[str, np.ndarray]


def read_step(plan: Plan, step: int, rank: int = 0, world_size: int = 1) -> StepView:
    """Plan the batch (pure), then read it with the loader's reader (one batch)."""
    batch = plan.batch(step, rank, world_size)
    reader = host_reader(plan, copy_objects=False)  # one batch: no copy of whole files
    try:
        arrays = {k: np.asarray(v) for k, v in reader.read(batch.component, batch.moment).items()}
    finally:
        reader.close()
    pads = sorted(k for k in arrays if k.endswith("_is_pad"))
    samples = []
    for k in range(len(batch)):
        c = int(batch.component[k])
        tab = plan.table(c)
        e = int(arrays["_episode"][k])
        samples.append({
            "slot": batch.rank + k * batch.world_size, "position": int(batch.position[k]),
            "component": c, "table": tab.name, "version": int(tab.version),
            "episode": tab.episodes().names[e], "episode_index": e,
            "frame": int(arrays["_frame"][k]), "moment": int(batch.moment[k]),
            "pad": {p[: -len("_is_pad")]: arrays[p][k].astype(bool).tolist() for p in pads},
        })  # fmt: skip
    return StepView(plan, batch.step, rank, world_size, samples, arrays)


def step_json(view: StepView) -> dict[str, Any]:
    """The sample list (``treadle show --json``)."""
    return {"run_id": view.plan.run_id, "step": view.step, "rank": view.rank,
            "world_size": view.world_size, "samples": view.samples}  # fmt: skip


def _frames(arr: np.ndarray) -> np.ndarray | None:
    """``[T, H, W, 3]`` uint8 frames of one sample's video window, None if not uint8 RGB."""
    if arr.dtype != np.uint8 or arr.ndim != 4:
        return None
    if arr.shape[-1] == 3:
        return arr
    if arr.shape[1] == 3:  # TCHW
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


def _windows(view: StepView, k: int) -> str:
    s = view.samples[k]
    video = set()
    for c in range(view.plan.num_components):
        video |= set(view.plan.table(c).video_columns)
    parts = []
    for col in sorted(c for c in view.arrays if c not in _IDS and not c.endswith("_is_pad")):
        a = view.arrays[col][k]
        frames = _frames(a) if col in video else None
        if frames is not None:
            strip = _strip(frames, s["pad"].get(col, []), col, k)
            parts.append(f'<div class="win"><b>{esc(col)}</b>{strip}</div>')
        elif np.issubdtype(a.dtype, np.number) and a.size:
            parts.append(f'<div class="win"><b>{esc(col)}</b> <small>{esc(list(a.shape))}</small>'
                         f"{_svg(a if a.ndim else a.reshape(1))}</div>")  # fmt: skip
    return "".join(parts)


def samples_table(view: StepView) -> str:
    """The samples of the step with their windows, as one HTML table."""
    r = view.plan.record
    rows = []
    for k, s in enumerate(view.samples):
        ep = url("p", r.project, "t", s["table"], "v", s["version"], "e", s["episode"],
                 frame=s["frame"])  # fmt: skip
        pads = "; ".join(f"{c}: {sum(v)}/{len(v)}" for c, v in s["pad"].items()) or "-"
        rows.append([s["slot"], s["component"], esc(s["table"]), link(ep, s["episode"]),
                     s["frame"], s["moment"], esc(pads), _windows(view, k)])  # fmt: skip
    head = ["slot", "component", "table", "episode", "frame", "moment", "padded", "windows"]
    return table(head, rows, raw=True, id_="samples")


def _frame(plan: Plan, step: int, rank: int, world_size: int, body: str, inline: bool) -> str:
    """The page around ``body``: facts, links to the steps before and after, breadcrumbs."""
    r = plan.record
    nav_steps = " · ".join(
        link(url("p", r.project, "runs", r.run_id, "steps", n, rank=rank,
                 world_size=world_size), label)
        for n, label in ((step - 1, "← previous step"), (step + 1, "next step →"))
        if n >= 0
    )  # fmt: skip
    facts = (
        f'<p id="facts">run <code>{esc(r.run_id)}</code> · step {step:,} · rank {rank} of '
        f"{world_size} · {plan.batch_size // world_size} samples · {nav_steps}</p>"
    )
    nav = crumbs(
        (url("p", r.project), r.project),
        (url("p", r.project, "runs"), "runs"),
        (url("p", r.project, "runs", r.run_id), r.run_id),
        f"step {step}",
    )
    scripts = [] if inline else ["viewer.js"]
    return page(f"run {r.run_id} step {step}", facts + body, nav=nav, inline=inline,
                scripts=scripts)  # fmt: skip


def step_html(view: StepView, *, inline: bool = False) -> str:
    """The whole step page, samples read (``inline``: CSS inlined, for a file that opens
    with no server: ``treadle show --out``)."""
    body = samples_table(view)
    return _frame(view.plan, view.step, view.rank, view.world_size, body, inline)


def step_shell(plan: Plan, step: int, rank: int = 0, world_size: int = 1) -> str:
    """The step page before its samples are read: ``viewer.js`` loads the samples table
    (``.../steps/N/samples``), so a slow store shows "loading…", never a blank page."""
    plan.batch(step, rank, world_size)  # a bad step, rank or world size fails here, not later
    r = plan.record
    src = url("p", r.project, "runs", r.run_id, "steps", step, "samples", rank=rank,
              world_size=world_size)  # fmt: skip
    body = f'<div id="step" data-src="{esc(src)}"><p class="muted">loading…</p></div>'
    return _frame(plan, step, rank, world_size, body, inline=False)
