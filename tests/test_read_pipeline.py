"""The reader starts a video batch's decode before it hands out the batch before it (issue 33,
goal 3: decode threads go on from one batch to the next), with the same batches, and a
window that does not decode still fails at its own batch."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
import treadle.video.cpu_reader as video_reader
from treadle.errors import CorruptData
from treadle.read.steps import host_reader
from treadle.video._testing import synthetic_frames


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    branch = td.Client(str(tmp_path_factory.mktemp("p")), create=True).project("p").branch()
    with branch.transaction("episodes") as tx:
        for e in range(2):
            cam = td.VideoFrames(synthetic_frames(30, 32, 32, seed=e), fps=10)
            tx.table("v").append_episode({"cam": cam}, episode=f"ep-{e}")
    windows = td.Windows({"cam": td.Video(range(4))})
    return td.Recipe(
        seed=2, batch_size=3, components=[td.Component(branch.table("v"), windows)]
    ).plan()


@pytest.mark.parametrize("threads", [1, 2])
def test_next_decode_is_submitted_before_a_batch_is_handed_out(plan, threads, monkeypatch):
    submitted: list[int] = []
    orig = video_reader.VideoReader.submit

    def submit(self, windows):
        if self is reader._video:
            submitted.append(len(windows))
        return orig(self, windows)

    monkeypatch.setattr(video_reader.VideoReader, "submit", submit)
    steps = 6
    reader = host_reader(plan, threads)
    seen = []
    try:
        for k, (_, out) in enumerate(reader.read_many(plan.batch(s) for s in range(steps))):
            seen.append(len(submitted))
            fresh = host_reader(plan, 1)
            b = plan.batch(k)
            want = fresh.read(b.component, b.moment)
            fresh.close()
            np.testing.assert_array_equal(out["cam"], want["cam"])
    finally:
        reader.close()
    # batch k is handed out once batch k + 1's decode was started (the last: its own)
    assert seen == [min(k + 2, steps) for k in range(steps)]


def test_a_window_that_fails_is_raised_at_its_batch(plan, monkeypatch):
    orig = video_reader.decode_fetched
    calls = [0]

    def decode(dec, window, out):
        calls[0] += 1
        if window.request.where == bad and window.request.frames[0] == bad_start:
            raise CorruptData(f"{window.where}: injected")
        return orig(dec, window, out)

    b = plan.batch(2)
    eps = plan.table(0).episodes()
    m = int(b.moment[0])
    e = int(np.searchsorted(eps.starts, m, side="right") - 1)
    bad_start = m - int(eps.starts[e])
    bad = ("v", eps.names[e], "cam")
    firsts = [(plan.batch(s).moment) for s in (0, 1)]
    assert m not in np.concatenate(firsts)  # no earlier batch has that window
    monkeypatch.setattr(video_reader, "decode_fetched", decode)
    reader = host_reader(plan, 2)
    got = []
    try:
        with pytest.raises(CorruptData, match="injected"):
            for s, _ in reader.read_many(plan.batch(s) for s in range(5)):
                got.append(s.step)
    finally:
        reader.close()
    assert got[:2] == [0, 1] and 2 not in got
