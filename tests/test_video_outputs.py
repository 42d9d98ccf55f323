"""WindowOutputs: the pts -> output matching every decode loop shares, and the two CPU
loops (native and PyAV's) agreeing on windows that use each of its rules."""

from __future__ import annotations

import numpy as np
import pytest

import treadle.video as tv
from treadle import fastpaths
from treadle.errors import CorruptData
from treadle.plan.windows import Video
from treadle.storage.store import Store
from treadle.video import ffmpeg, native
from treadle.video._testing import make_mp4, reference_decode, synthetic_frames
from treadle.video.outputs import WindowOutputs

WHERE = "table 'grasps', episode 'ep-0', column 'wrist'"


@pytest.fixture(scope="module")
def stream() -> tv.EncodedStream:
    frames = synthetic_frames(30, 48, 64, seed=11)
    options = {"preset": "ultrafast",
               "x264-params": "bframes=2:keyint=10:min-keyint=10:scenecut=0:open-gop=1"}  # fmt: skip
    return tv.from_container(make_mp4(frames, options=options))


def test_each_wanted_pts_fills_its_positions_once_and_warm_up_is_dropped(stream):
    wanted = [14, 12, 14, 17]  # 14 twice, out of order; 10..13 decode first (warm-up)
    plan = tv.plan_window(stream.index, wanted)
    outputs = WindowOutputs(plan, WHERE, source=(48, 64))
    pts = stream.index.pts
    assert outputs.take(int(pts[14])) == [0, 2]
    assert outputs.take(int(pts[14])) is None  # given once
    assert outputs.take(int(pts[11])) is None  # warm-up
    assert outputs.take(int(pts[12])) == [1]
    with pytest.raises(CorruptData, match=r"frame\(s\) \[17\]"):
        outputs.check_complete()
    assert outputs.take(int(pts[17])) == [3]
    outputs.check_complete()


def test_size_check_names_the_frame_and_both_sizes(stream):
    outputs = WindowOutputs(tv.plan_window(stream.index, [5, 6]), WHERE, source=(48, 64))
    assert outputs.size_ok(64, 48) and not outputs.size_ok(48, 64)
    outputs.check_size([1], 64, 48)
    with pytest.raises(CorruptData, match=r"ep-0.* frame 6: decodes to 96x48, .* says 64x48"):
        outputs.check_size([1], 96, 48)
    assert WindowOutputs(tv.plan_window(stream.index, [5]), WHERE).size_ok(1, 1)


def test_copy_repeats_fills_every_later_position_from_the_first():
    out = np.zeros((4, 2), np.uint8)
    out[1] = 7
    WindowOutputs.copy_repeats(out, [1, 3, 0])
    assert out.tolist() == [[7, 7], [7, 7], [0, 0], [7, 7]]


def test_native_and_pyav_loops_agree_on_repeats_and_warm_up(tmp_path, stream, monkeypatch):
    store = Store.open(str(tmp_path / "root"), create=True)
    key = stream.media_key("grasps")
    store.put(f"projects/p/{key}", stream.data)
    key, idx = tv.index_from_arrow(tv.index_to_arrow(key, stream))
    ref = reference_decode(stream.data, "h264")
    wins = [np.array([14, 12, 14, 17]), np.array([9, 9, 9]), np.array([29, 0, 10, 20, 29])]
    runs = {"done": 0, "fallback": 0}
    real = native.NativeLoop.run

    def counted(self, *a, **k):
        try:
            real(self, *a, **k)
        except native.Fallback:
            runs["fallback"] += 1
            raise
        runs["done"] += 1

    monkeypatch.setattr(native.NativeLoop, "run", counted)

    def read(reader: tv.VideoReader) -> list[np.ndarray]:
        where = ("grasps", "ep-0", "wrist")
        reqs = [tv.WindowRequest(key, idx, w, Video(range(len(w))), where) for w in wins]
        return reader.read(reqs)

    # a window whose output address (mod 64) is not yet checked goes to PyAV, which checks
    # it; on one reader (one decoder, its checks kept) the four 16-byte alignments are all
    # checked within a few windows, and the windows then run natively
    with tv.VideoReader(store, prefix="projects/p") as reader:
        native_runs = [read(reader) for _ in range(4)]
    assert runs["done"] >= 1 and runs["done"] + runs["fallback"] == 4 * len(wins), runs
    # PyAV's loop only
    monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked.fixed("native decode", None))
    with tv.VideoReader(store, prefix="projects/p") as reader:
        pyav = read(reader)
    for got in [*native_runs, pyav]:
        for w, out in zip(wins, got):
            np.testing.assert_array_equal(out, ref[w])
