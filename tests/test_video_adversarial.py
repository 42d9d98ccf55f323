"""Files other tools write whose frames treadle once delivered wrong, or without a word:
each video is written with PyAV, stored through ``td.VideoFile``, and every frame read back
through the loader is compared with PyAV's own decode of the file (``to_ndarray("rgb24")``),
or the file is refused with a :class:`~treadle.errors.VideoError` naming it."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

import treadle as td
from treadle.video import remux
from treadle.video._testing import make_mp4, reference_decode, synthetic_frames
from treadle.video.encode import from_container

BFRAMES = "keyint=8:min-keyint=8:scenecut=0:bframes=3:b-pyramid=normal"


def _table(root, videos: dict[str, bytes]) -> td.TableRef:
    branch = td.Client(str(root)).project("p").branch()
    for name, data in videos.items():
        branch.table("cams").append_episode({"cam": td.VideoFile(data)}, episode=name)
    return branch.table("cams")


def _every_frame(table: td.TableRef) -> dict[int, np.ndarray]:
    """Each episode's frames as the loader delivers them (one window per anchor frame)."""
    comp = td.Component(table, td.Windows({"cam": td.Video([0])}))
    got: dict[int, dict[int, np.ndarray]] = {}
    for batch in td.EvalLoader(comp, batch_size=4):
        for e, f, clip, ok in zip(
            batch["_episode"].tolist(),
            batch["_frame"].tolist(),
            batch["cam"].numpy(),
            batch["_valid"].tolist(),
        ):
            if ok:
                got.setdefault(e, {})[f] = clip[0]
    return {e: np.stack([d[f] for f in range(len(d))]) for e, d in got.items()}


@pytest.mark.parametrize("params", [BFRAMES, BFRAMES + ":open-gop=1"])
def test_avi_with_b_frames_reads_each_frame_as_pyav_decodes_it(tmp_path, params):
    # AVI stores no presentation times: FFmpeg stamps its packets in decode order, so a
    # stream with B-frames looked like one without reordering. Before: frame k was the
    # k-th packet in decode order (18 of 25 frames wrong, up to 27 levels), and with an
    # open GOP a window failed at read time ("decoder produced no picture").
    frames = synthetic_frames(25, 32, 48, seed=3)
    avi = make_mp4(frames, fmt="avi", options={"x264-params": params})
    with av.open(io.BytesIO(avi)) as c:  # the file is what the test says: stamps in decode order
        pts = [p.pts for p in c.demux(video=0) if p.size]
    assert pts == sorted(pts)
    got = _every_frame(_table(tmp_path, {"avi": avi}))[0]
    np.testing.assert_array_equal(got, reference_decode(avi))


def test_in_order_stamps_without_b_frames_are_kept(monkeypatch):
    # a stream with no B slices has nothing to reorder: its own times stay (no decode pass)
    frames = synthetic_frames(12, 32, 48, seed=4)
    avi = make_mp4(frames, fmt="avi", options={"x264-params": "keyint=4:bframes=0"})
    monkeypatch.setattr(remux, "_display_ranks", None)  # never called
    s = from_container(avi)
    assert s.index.pts.tolist() == list(range(1, 13)) and s.index.decode.tolist() == list(range(12))
