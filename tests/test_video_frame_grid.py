"""Windows in seconds over videos whose frames are not shown on the table's fps grid.

A video's display frame ``k`` is row ``k`` of its episode, and a window in seconds becomes
frame offsets with the table's fps. A variable-frame-rate file shows frame ``k`` at its own
timestamp, so a time would pick a frame shown at another time: such columns are recorded
at write and ``Video(seconds=...)`` over them is refused; frame offsets keep working.
"""

from __future__ import annotations

import bisect
import io
from fractions import Fraction

import av
import numpy as np
import pytest

import treadle as td
from treadle.errors import PlanError
from treadle.table.off_grid import recorded_off_grid
from treadle.video.encode import from_container
from treadle.video.frame_grid import grid_deviation

MS = Fraction(1, 1000)
VFR_MS = [0, 33, 67, 150, 183, 217, 250, 400, 433, 467, 500, 533]  # a 100 ms stall, a 150 ms one
CFR_MS = [round(i * 1000 / 30) for i in range(12)]  # 30 fps in an MKV's milliseconds


def _file(
    times: list[int], codec: str = "libx264", fmt: str = "matroska", base: Fraction = MS
) -> bytes:
    """Solid frames of grey ``10 * i + 5`` shown at ``times`` (in ``base``), muxed by PyAV."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        st = c.add_stream(codec, rate=30)
        st.width, st.height, st.pix_fmt = 32, 32, "yuv420p"
        st.codec_context.time_base = base
        if codec == "libx264":
            st.options = {"x264-params": "bframes=0:keyint=4"}
        for i, t in enumerate(times):
            f = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 10 * i + 5, np.uint8), "rgb24")
            f.pts, f.time_base = t, base
            for p in st.encode(f):
                c.mux(p)
        for p in st.encode(None):
            c.mux(p)
    return buf.getvalue()


def _reference(data: bytes) -> tuple[list[float], np.ndarray]:
    """PyAV's decode: each frame's display time (s) and its grey level."""
    with av.open(io.BytesIO(data)) as c:
        frames = list(c.decode(c.streams.video[0]))
    grey = np.array([f.to_ndarray(format="rgb24").mean() for f in frames])
    return [float(f.time) for f in frames], grey


def _table(root: str, videos: dict[str, bytes]) -> td.TableRef:
    branch = td.Client(root).project("p").branch()
    for name, data in videos.items():
        branch.table("cams").append_episode({"cam": td.VideoFile(data)}, episode=name)
    return branch.table("cams")


def _plan(table, spec):
    comp = td.Component(table, td.Windows({"cam": spec}))
    return td.Recipe(seed=0, batch_size=4, components=[comp]).plan()


def _delivered(plan, steps=3):
    """(anchor frame, [grey level per window frame]) of every sample delivered."""
    for batch in td.TrainLoader(plan, steps=steps):
        for m, clip in zip(batch["_moment"].numpy(), batch["cam"].numpy()):
            yield int(m), clip.reshape(len(clip), -1).mean(1)


def test_seconds_over_a_variable_frame_rate_file_are_refused_naming_it(tmp_path):
    # before: planned, and anchor frame 0 + 0.1 s delivered frame 3 (shown at 0.15 s)
    # where the frame shown at 0.1 s is frame 2 (0.067 s)
    table = _table(str(tmp_path), {"steady": _file(CFR_MS), "phone": _file(VFR_MS)})
    with pytest.raises(PlanError) as e:
        _plan(table, td.Video(seconds=[0.0, 0.1]))
    msg = str(e.value)
    assert "table 'cams'" in msg and "column 'cam'" in msg and "episode 'phone'" in msg
    assert "0.1665 s" in msg and "frame offsets" in msg  # 0.4 s shown where 7/30 s is


def test_a_re_encoded_variable_frame_rate_file_is_refused_too(tmp_path):
    # MPEG-4 part 2 is re-encoded to H.264 at 0..N-1: the source's times, not the new ones
    table = _table(str(tmp_path), {"mpeg4": _file(VFR_MS, codec="mpeg4")})
    assert recorded_off_grid(table.schema)["cam"]["episode"] == "mpeg4"
    with pytest.raises(PlanError, match="episode 'mpeg4'"):
        _plan(table, td.Video(seconds=[0.0, 1 / 30]))


def test_frame_offsets_over_a_variable_frame_rate_file_read_frame_k_as_row_k(tmp_path):
    data = _file(VFR_MS)
    _, grey = _reference(data)
    plan = _plan(_table(str(tmp_path), {"phone": data}), td.Video([0, 1, 3]))
    seen = 0
    for m, got in _delivered(plan):
        np.testing.assert_allclose(got, grey[[m, m + 1, m + 3]], atol=3)
        seen += 1
    assert seen == 12


def test_a_wide_tolerance_takes_the_grid_as_it_is(tmp_path):
    table = _table(str(tmp_path), {"phone": _file(VFR_MS)})
    plan = _plan(table, td.Video(seconds=[0.0, 0.1], tolerance_s=0.2))  # the user's call
    assert plan.record.components[0].windows["cam"].offsets == (0, 3)


@pytest.mark.parametrize(
    ("fmt", "times", "base"),
    [("matroska", CFR_MS, MS), ("mp4", list(range(12)), Fraction(1, 30))],
)
def test_seconds_over_a_constant_rate_file_give_the_frame_shown_then(tmp_path, fmt, times, base):
    # an MKV's millisecond timestamps (up to 0.33 ms off 30 fps) are its time base's
    # rounding, not a variable rate: nothing is recorded and the frames are the right ones
    data = _file(times, fmt=fmt, base=base)
    times, grey = _reference(data)
    table = _table(str(tmp_path), {"steady": data})
    assert recorded_off_grid(table.schema) == {} and table.fps == pytest.approx(30, rel=1e-3)
    secs = [0.0, 0.1, 2 / 30]
    seen = 0
    for m, got in _delivered(_plan(table, td.Video(seconds=secs))):
        for t, g in zip(secs, got):
            shown = bisect.bisect_right(times, times[m] + t + 1e-3) - 1  # displayed at t
            assert abs(g - grey[shown]) <= 3
        seen += 1
    assert seen == 12


def test_the_record_keeps_the_largest_deviation_and_its_episode(tmp_path):
    wide = [0, 33, 67, 500, 533, 567, 600, 633, 667, 700, 733, 767]
    table = _table(str(tmp_path), {"a": _file(VFR_MS), "b": _file(wide), "c": _file(VFR_MS)})
    rec = recorded_off_grid(table.schema)["cam"]
    assert rec["episode"] == "b" and rec["deviation_s"] == pytest.approx(0.4, abs=1e-3)


def test_grid_deviation_measures_display_times_against_k_over_fps():
    assert grid_deviation(np.arange(0, 3000, 100), Fraction(1, 3000), 30.0) == 0.0
    ms = np.array(CFR_MS)
    assert grid_deviation(ms, MS, 30.0) == 0.0  # within half a millisecond tick
    assert grid_deviation(np.array(VFR_MS), MS, 30.0) == pytest.approx(
        0.467 - 9 / 30 - 5e-4
    )  # frame 9
    # a rate the writer gives (VideoFile(fps=)) re-times an evenly spaced file
    assert grid_deviation(np.arange(0, 400, 40), MS, 30.0, own_rate=True) == 0.0
    assert grid_deviation(np.arange(0, 400, 40), MS, 30.0) == pytest.approx(0.06 - 5e-4)  # 25 fps
    assert from_container(_file(VFR_MS), fps=30).meta.grid_deviation_s > 0.04  # still uneven


def test_episodes_staged_apart_keep_the_record(tmp_path):
    """A distributed import's tasks stage episodes apart: the commit keeps the off-grid
    column one of them recorded (and takes the other's schema as the same)."""
    from treadle.table.handoff import add_staged, take_staged

    branch = td.Client(str(tmp_path), create=True).project("p").branch("main")
    staged = []
    for name, times in (("steady", CFR_MS), ("phone", VFR_MS)):
        other = branch.transaction("never committed").table("cams")
        other.append_episode({"cam": td.VideoFile(_file(times))}, episode=name)
        staged.append(take_staged(other))
        other.tx.close()
    with branch.transaction("import") as tx:
        for s in staged:
            add_staged(tx.table("cams"), s)
    assert recorded_off_grid(branch.table("cams").pin().schema)["cam"]["episode"] == "phone"
    with pytest.raises(PlanError, match="episode 'phone'"):
        _plan(branch.table("cams"), td.Video(seconds=[0.0]))
