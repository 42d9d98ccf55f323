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
from treadle.errors import VideoError
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


def _cut_in_last_packet(data: bytes) -> bytes:
    """``data`` cut off halfway through its last video packet (a recording interrupted)."""
    with av.open(io.BytesIO(data)) as c:
        last = [p for p in c.demux(video=0) if p.size][-1]
        assert last.pos is not None and last.pos > 0
        return data[: last.pos + last.size // 2]


def _flagged(data: bytes) -> int:
    """How many packets the demuxer, and frames the decoder, flag corrupt (1: it raises)."""
    with av.open(io.BytesIO(data)) as c:
        bad = 0
        try:
            for packet in c.demux(video=0):
                bad += packet.is_corrupt
                bad += sum(f.is_corrupt for f in packet.decode())
        except av.FFmpegError:
            return 1
    return bad


@pytest.mark.parametrize(
    ("codec", "fmt"),
    [("libx264", "h264"), ("libx264", "mpegts"), ("mpeg4", "avi"), ("libvpx-vp9", "ivf")],
)
def test_a_recording_cut_off_mid_picture_is_refused_when_written(tmp_path, codec, fmt):
    # before: stored, and its last frame delivered concealed (grey or smeared: up to 130
    # levels from PyAV's own, equally damaged, decode) without a word
    # noise: every picture spans many transport packets, so half of one is cut
    frames = np.random.default_rng(7).integers(0, 256, (30, 64, 96, 3), np.uint8)
    options = {"x264-params": "keyint=10:bframes=0"} if codec == "libx264" else {}
    cut = _cut_in_last_packet(make_mp4(frames, codec=codec, fmt=fmt, options=options))
    assert _flagged(cut)  # FFmpeg itself says so (and conceals it)
    branch = td.Client(str(tmp_path)).project("p").branch()
    with pytest.raises(VideoError, match="is damaged") as e:
        branch.table("cams").append_episode({"cam": td.VideoFile(cut)}, episode="cut")
    assert "episode 'cut'" in str(e.value) and "cams" not in branch.tables()


def test_a_lost_transport_packet_is_refused_when_written(tmp_path):
    # an MPEG-TS recording missing one 188-byte packet mid-stream: the demuxer flags the
    # picture's packet corrupt, the decoder conceals it without a flag (before: stored and
    # delivered smeared)
    ts = make_mp4(synthetic_frames(30, 64, 96, seed=7), fmt="mpegts")
    n = len(ts) // 188
    holed = next(
        (h for k in range(n // 3, n) if _flagged(h := ts[: 188 * k] + ts[188 * (k + 1) :])),
        None,
    )
    assert holed is not None
    branch = td.Client(str(tmp_path)).project("p").branch()
    with pytest.raises(VideoError, match="is damaged"):
        branch.table("cams").append_episode({"cam": td.VideoFile(holed)}, episode="holed")
