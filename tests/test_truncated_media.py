"""A stored stream cut short is CorruptData naming the object, whichever windows read it.

Before: two windows of one batch past the cut made obstore coalesce ranges that start past
the object's end, and its Rust code panicked (``StorageError ... RustPanic: rust future
panicked``); one window past it was ``StorageError ... Requested range was invalid``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import treadle as td
from treadle.errors import CorruptData
from treadle.storage import RangeRequest, Store


@pytest.fixture
def cut_branch(tmp_path):
    root = tmp_path / "root"
    branch = td.Client(str(root), create=True).project("p").branch()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (24, 32, 32, 3), dtype=np.uint8)
    with branch.transaction("one episode") as tx:
        tx.table("cams").append_episode(
            {"cam": td.VideoFrames(frames, fps=30, gop=4)}, episode="e0"
        )
    (media,) = [p for p in root.rglob("*.h264")]
    os.truncate(media, media.stat().st_size // 2)
    return branch, media


def test_windows_past_the_cut_are_corrupt_data_naming_the_stream(cut_branch):
    branch, media = cut_branch
    windows = td.Windows({"cam": td.Video(range(4))})
    recipe = td.Recipe(
        seed=0, batch_size=21, components=[td.Component(branch.table("cams"), windows)]
    )
    named = (
        rf"table 'cams' episode 'e0' column 'cam'.* frame \d+: stream is truncated: "
        rf"object .*{media.name} is \d+ bytes, but a read asked"
    )
    with pytest.raises(CorruptData, match=named):
        next(iter(td.TrainLoader(recipe, steps=1)))


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_range_read_past_the_end_is_corrupt_data(kind, tmp_path, request):
    if kind == "s3":
        store = Store.open(*request.getfixturevalue("s3_root"))
    else:
        store = Store.open(str(tmp_path))
    store.put("a.bin", b"x" * 100)
    assert store.get_ranges([RangeRequest("a.bin", 10, 40), RangeRequest("a.bin", 60, 100)]) == [
        b"x" * 30,
        b"x" * 40,
    ]
    for ranges in ([(0, 10), (120, 150)], [(120, 150)], [(50, 150)], [(0, 10), (60, 130)]):
        with pytest.raises(
            CorruptData, match=r"a\.bin is 100 bytes, but a read asked for bytes up to"
        ):
            store.get_ranges([RangeRequest("a.bin", s, e) for s, e in ranges])
    assert store.size("a.bin") == 100
