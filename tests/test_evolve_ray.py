"""add_column(fn=..., executor=td.RayExecutor()): a column computed in Ray tasks equals the
one computed in this process (issue 47)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from ray_helpers import local_ray

pytestmark = pytest.mark.filterwarnings("ignore:lance is not fork-safe")


def brightness(batch):
    cam = batch["cam"]
    return cam.reshape(len(cam), -1).mean(axis=1).astype(np.float32)


def divide_by_zero(batch):
    return 1 / 0


@pytest.mark.slow
def test_computed_column_on_ray_equals_one_process(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    here = str(Path(__file__).parent)  # the workers import this module's fn
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    )
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    rng = np.random.default_rng(0)
    for e in range(3):
        frames = rng.integers(0, 255, (10, 16, 16, 3), dtype=np.uint8)
        t.append_episode({"cam": td.VideoFrames(frames, fps=10)}, episode=f"e{e}")
    t.add_column("here", fn=brightness, columns=["cam"], batch_rows=4, progress=False)
    with local_ray():
        t.add_column("ray", fn=brightness, columns=["cam"], batch_rows=4, progress=False,
                     executor=td.RayExecutor())  # fmt: skip
        with pytest.raises(Exception, match=r"table 't'.*column 'bad'.*ZeroDivisionError.*rows"):
            t.add_column("bad", fn=divide_by_zero, columns=["cam"], batch_rows=4, progress=False,
                         executor=td.RayExecutor())  # fmt: skip
    got = t.to_arrow(["here", "ray"])
    assert got.column("ray").to_pylist() == got.column("here").to_pylist()
    assert len(set(got.column("ray").to_pylist())) > 3
