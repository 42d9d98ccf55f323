"""The viewer tests' project: the demo's two tables (src/treadle/demo.py), one checkpoint
row of the demo's run, and a second run saved as a plain ``run_id``/``record`` row."""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import pyarrow as pa

import treadle as td
from treadle import demo


@dataclass
class UiProject:
    client: td.Client
    branch: td.Branch
    plan: td.Plan
    saved: td.Plan


def make_project(root: str, storage_options: dict[str, Any] | None = None) -> UiProject:
    client = td.Client(root, storage_options, create=True)
    branch = demo.ensure_project(client, quiet=True)
    plan = demo.build_recipe(branch).plan()
    loader = td.TrainLoader(plan, steps=1)
    td.Checkpoints(branch).save(7, {"w": 1}, loader)
    recipe = td.Recipe(
        seed=5, batch_size=8,
        components=[td.Component(branch.table("nominal_grasps"), demo.WINDOWS, weight=1.0)],
    )  # fmt: skip
    saved = recipe.plan()
    row = pa.table({"run_id": [saved.run_id], "record": [saved.record.to_json()]})
    branch.table("saved_runs").append(row, message="save a run record")
    branch.table("bframes").append_episode({"cam": td.VideoFile(bframe_mp4())}, episode="b0")
    branch.project.tag("first-look", branch.commit_id)
    return UiProject(client, branch, plan, saved)


BFRAMES = 24


def bframe_mp4() -> bytes:
    """An H.264 MP4 with B-frames (decode order != display order), each frame distinct."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        s = out.add_stream("libx264", rate=24)
        s.width = s.height = 64
        s.pix_fmt = "yuv420p"
        s.options = {"bf": "3", "g": "12"}
        for i in range(BFRAMES):
            f = np.zeros((64, 64, 3), np.uint8)
            f[:, :, 0] = i * 10
            f[i : i + 8, 2 * i : 2 * i + 8] = 255
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    """``[H, W, 3]`` uint8 of an 8-bit RGB PNG with filter 0 rows (what treadle.ui writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
            assert body[8:10] == b"\x08\x02", "8-bit RGB"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h = size
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all(), "unfiltered rows"
    return raw[:, 1:].reshape(h, w, 3).copy()


ODD_NAMES = ["pick up 01", "2026-12-01T10:00:00", "café", "run/7", "plain"]
"""Episode names the write API accepts that no path segment check would."""


@dataclass
class HostileStore:
    client: td.Client
    plan: td.Plan
    nan_episode: str


def make_hostile_store(root: str) -> HostileStore:
    """Project ``odd``: table ``cams`` (a video column and a float column, one episode
    with NaN and inf) whose episodes have :data:`ODD_NAMES`, written so that a Lance
    version no commit names exists (one ``append_episode`` goes v1 -> v3); a run of it
    saved as a record row; a table that only looks like run records (a text ``step``).
    Project ``big``: a table of a deeply nested ``record``."""
    client = td.Client(root, create=True)
    branch = client.project("odd").branch()
    frames = np.zeros((8, 32, 32, 3), np.uint8)
    for i, name in enumerate(ODD_NAMES):
        frames[:] = 40 * i
        frames[:, 8:16, 8:16] = 250
        x = np.arange(8, dtype=np.float32) + 10 * i
        if name == "plain":
            x[2], x[5] = np.nan, np.inf
        branch.table("cams").append_episode(
            {"cam": td.VideoFrames(frames.copy(), fps=10), "x": x}, episode=name
        )
    windows = td.Windows({"cam": td.Video(range(0, 4)), "x": td.Rows(range(3), pad=True)})
    recipe = td.Recipe(seed=3, batch_size=8,
                       components=[td.Component(branch.table("cams"), windows)])  # fmt: skip
    plan = recipe.plan()
    row = pa.table({"run_id": [plan.run_id], "record": [plan.record.to_json()]})
    branch.table("saved_runs").append(row, message="save a run record")
    fake = pa.table({"run_id": [plan.run_id], "record": [plan.record.to_json()],
                     "step": ["three"]})  # fmt: skip
    branch.table("looks_like_runs").append(fake, message="not checkpoint rows")
    deep = pa.table({"run_id": ["00000000000000aa"], "record": ["[" * 100_000 + "]" * 100_000]})
    client.project("big").branch().table("deep").append(deep, message="a deep record")
    return HostileStore(client, plan, "plain")
