"""The direct libswscale path (:mod:`treadle.video.sws`) gives the bytes PyAV's
``reformat`` gives, on frames of H.264 files PyAV/FFmpeg encoded with colour tags
(BT.709, BT.601, untagged; limited and full range), at sizes it covers and at odd
sizes and resizes it must leave to ``reformat``; and :func:`decode_window` gives the
same batch either way."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest
from av.video.reformatter import VideoReformatter

from treadle.video import decode
from treadle.video._testing import synthetic_frames
from treadle.video.sws import DirectScaler, _lib

# (colorspace, color_range) tagged on the encode
TAGS = [(1, 1), (1, 2), (6, 1), (6, 2), (2, 0)]


def _encode(w: int, h: int, tags: tuple[int, int], pix_fmt: str = "yuv420p") -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("libx264", rate=Fraction(10))
        s.width, s.height, s.pix_fmt = w, h, pix_fmt
        s.codec_context.colorspace, s.codec_context.color_range = tags
        for f in synthetic_frames(5, h, w, seed=w + h):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format=pix_fmt)
            vf.colorspace, vf.color_range = tags
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return buf.getvalue()


def _frames(data: bytes) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data)) as c:
        return list(c.decode(video=0))


@pytest.mark.parametrize("tags", TAGS)
@pytest.mark.parametrize(
    ("w", "h", "size", "covered"),
    [
        (224, 224, None, True),
        (96, 64, None, True),
        (98, 66, None, False),  # width not a multiple of 16
        (642, 482, None, False),
        (224, 224, (112, 160), False),  # resize
    ],
)
def test_direct_matches_reformat(w, h, size, covered, tags):
    assert _lib() is not None, "libswscale bundled with PyAV not found"
    frames = _frames(_encode(w, h, tags))
    assert {f.format.name for f in frames} == {"yuvj420p" if tags[1] == 2 else "yuv420p"}
    scaler = decode._scaler(size or (h, w), tags)
    rf, direct = VideoReformatter(), DirectScaler()
    batch = np.zeros((len(frames), *(size or (h, w)), 3), np.uint8)
    for j, f in enumerate(frames):
        used = direct.convert(f, batch[j], scaler, rf)
        assert used == covered
        if not used:
            assert not batch[j].any()  # left untouched
            continue
        np.testing.assert_array_equal(batch[j], rf.reformat(f, **scaler).to_ndarray())


def test_direct_refuses_strided_destination():
    frames = _frames(_encode(224, 224, (6, 1)))
    scaler = decode._scaler((224, 224), (6, 1))
    out = np.zeros((224, 224, 4), np.uint8)[..., :3]
    assert not DirectScaler().convert(frames[0], out, scaler, VideoReformatter())
    assert not out.any()


@pytest.mark.parametrize("tags", [(1, 1), (6, 2)])
def test_yuv444p_stays_on_reformat(tags):
    frames = _frames(_encode(224, 224, tags, "yuv444p"))
    scaler = decode._scaler((224, 224), tags)
    out = np.zeros((224, 224, 3), np.uint8)
    assert not DirectScaler().convert(frames[0], out, scaler, VideoReformatter())
