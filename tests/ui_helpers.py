"""The viewer tests' project: the demo's two tables (src/treadle/demo.py), one checkpoint
row of the demo's run, and a second run saved as a plain ``run_id``/``record`` row."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

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
    return UiProject(client, branch, plan, saved)


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
