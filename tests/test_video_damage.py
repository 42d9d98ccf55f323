"""Video files damaged on purpose (made with PyAV, then bytes changed or cut in a container
that stays consistent, so the demuxer flags nothing): what FFmpeg's decoders can tell is
refused when written, never stored as if it were the recording. What no decoder flags is
listed in docs/storage.md ("What is checked when video is written")."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

import treadle as td
from treadle.errors import VideoError
from treadle.video._testing import make_mp4, synthetic_frames

X264 = {"x264-params": "keyint=10:scenecut=0:bframes=2"}
X265 = {"x265-params": "keyint=10:scenecut=0:log-level=none"}


def _rewritten(data: bytes, change) -> bytes:
    """``data``'s video packets remuxed into an MKV, packet ``i`` (decode order) replaced
    by ``change(i, bytes)`` (None: left out): the container's sizes and times agree with
    what it holds."""
    buf = io.BytesIO()
    with av.open(io.BytesIO(data)) as c, av.open(buf, "w", format="matroska") as out:
        src = c.streams.video[0]
        dst = out.add_stream_from_template(src)
        for i, p in enumerate(q for q in c.demux(src) if q.size):
            b = change(i, bytes(p))
            if b is None:
                continue
            q = av.Packet(b)
            q.pts, q.dts, q.time_base, q.is_keyframe = p.pts, p.dts, p.time_base, p.is_keyframe
            q.stream = dst
            out.mux(q)
    return buf.getvalue()


def _keys(data: bytes) -> list[bool]:
    with av.open(io.BytesIO(data)) as c:
        return [bool(p.is_keyframe) for p in c.demux(video=0) if p.size]


def _damaged(data: bytes, how: str, at: int) -> bytes:
    """``data`` with packet ``at``'s second half random bytes or zeros, or without it."""
    rng = np.random.default_rng(at)

    def change(i: int, b: bytes) -> bytes | None:
        if i != at:
            return b
        if how == "dropped":
            return None
        half = len(b) // 2
        tail = rng.integers(0, 256, len(b) - half, np.uint8).tobytes()
        return b[:half] + (tail if how == "garbage" else bytes(len(b) - half))

    return _rewritten(data, change)


def _silently_short(data: bytes) -> bool:
    """Whether PyAV decodes ``data`` to fewer pictures than packets, flagging none."""
    with av.open(io.BytesIO(data)) as c:
        packets = frames = 0
        for p in c.demux(video=0):
            packets += bool(p.size)
            for f in p.decode():
                if f.is_corrupt:
                    return False
                frames += 1
    return frames < packets


def _write(tmp_path, data: bytes) -> td.TableRef:
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    branch.table("cams").append_episode({"cam": td.VideoFile(data)}, episode="e")
    return branch.table("cams")


@pytest.mark.parametrize("fmt", ["mp4", "matroska"])
@pytest.mark.parametrize("how", ["garbage", "zeros"])
def test_a_remuxed_h264_picture_damaged_mid_stream_is_refused(tmp_path, fmt, how):
    # before: a remux decoded only its first GOP and its last, so FFmpeg's flag on the
    # damaged picture mid-stream (or its decode error) went unseen, and the stream was
    # stored: concealed, smeared frames delivered as the recording
    data = make_mp4(synthetic_frames(30, 64, 96, seed=3), fmt=fmt, options=X264)
    _write(tmp_path / "ok", data)  # the undamaged file is stored
    at = next(i for i, key in enumerate(_keys(data)) if i >= 15 and not key)
    with pytest.raises(VideoError, match="is damaged|does not decode") as e:
        _write(tmp_path / "bad", _damaged(data, how, at))
    assert "episode 'e'" in str(e.value)


@pytest.mark.parametrize("how", ["garbage", "zeros", "dropped"])
def test_an_hevc_picture_damaged_mid_stream_is_refused(tmp_path, how):
    # before: FFmpeg's HEVC decoder skipped the damaged picture and those referencing it
    # without a flag; the re-encode stored 26 of 30 frames, the rest shifted in time
    data = make_mp4(synthetic_frames(30, 64, 96, seed=3), codec="libx265", fmt="matroska",
                    options=X265)  # fmt: skip
    keys = _keys(data)
    # the first inter picture past the middle whose damage FFmpeg skips without a flag
    # (what the test is about: some damage raises, some is flagged)
    damaged = next(
        d
        for at in range(len(keys) // 2, len(keys))
        if not keys[at] and _silently_short(d := _damaged(data, how, at))
    )
    with pytest.raises(VideoError, match="cannot decode hevc"):
        _write(tmp_path, damaged)


def test_an_hevc_file_cut_at_an_open_gops_cra_is_still_stored(tmp_path):
    # its leading pictures reference what was cut away: the decoder skips them by design,
    # which err_detect=explode must not take for damage
    params = "keyint=10:min-keyint=10:scenecut=0:bframes=3:open-gop=1:log-level=none"
    data = make_mp4(synthetic_frames(30, 64, 96, seed=3), codec="libx265", fmt="matroska",
                    options={"x265-params": params})  # fmt: skip
    keys = 0
    buf = io.BytesIO()
    with av.open(io.BytesIO(data)) as c, av.open(buf, "w", format="matroska") as out:
        src = c.streams.video[0]
        dst = out.add_stream_from_template(src)
        for p in c.demux(src):
            keys += bool(p.size and p.is_keyframe)
            if p.size and keys >= 2:
                p.stream = dst
                out.mux(p)
    with av.open(io.BytesIO(buf.getvalue())) as c:
        shown = [f for p in c.demux(video=0) for f in p.decode()]
    t = _write(tmp_path, buf.getvalue()).pin()
    assert t.num_moments == len(shown) == 20
