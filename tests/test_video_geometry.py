"""Write-time frame-size checks: the SPS crop as FFmpeg decodes it, size changes refused."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import av
import numpy as np
import pytest

import treadle as td
import treadle.video as tv
from treadle.errors import VideoError
from treadle.plan.windows import Video
from treadle.video._testing import (
    annexb_to_mp4,
    h264_filter,
    reference_decode,
    reference_frames,
    synthetic_frames,
)
from treadle.video.geometry import check_geometry, decoded_size
from treadle.video.nal import first_sps

FAST = {"preset": "ultrafast"}


def _annexb(t: int, h: int, w: int, seed: int = 0, gop: int = 8) -> bytes:
    return tv.encode_frames(synthetic_frames(t, h, w, seed), gop=gop, preset="ultrafast").data


def _annexb_fmt(t: int, h: int, w: int, pix_fmt: str) -> bytes:
    """x264 in ``pix_fmt`` (4:4:4, 4:2:2, 10-bit, gray), SPS/PPS before every IDR."""
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = w, h, pix_fmt
    ctx.time_base = Fraction(1, 30)
    ctx.options = {"preset": "ultrafast", "x264-params": "keyint=1:repeat-headers=1:annexb=1"}
    out = []
    for i, rgb in enumerate(synthetic_frames(t, h, w)):
        f = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=pix_fmt)
        f.pts = i
        out += [bytes(p) for p in ctx.encode(f)]
    out += [bytes(p) for p in ctx.encode(None)]
    return b"".join(out)


#: pixel format: (chroma_format_idc, bit depth)
FORMATS = {
    "yuv420p": (1, 8),
    "yuv422p": (2, 8),
    "yuv444p": (3, 8),
    "yuv420p10le": (1, 10),
    "yuv444p10le": (3, 10),
    "gray": (0, 8),
}


@pytest.fixture(scope="module")
def bases() -> dict[str, bytes]:
    return {f: _annexb_fmt(2, 64, 256, f) for f in FORMATS}


def _pyav_size(annexb: bytes) -> tuple[int, int]:
    (f, *_) = reference_frames(annexb, "h264")
    return f.width, f.height


@pytest.mark.parametrize("pix_fmt", FORMATS)
@pytest.mark.parametrize(
    "left,right,top,bottom",
    [(0, 2, 0, 2), (2, 0, 0, 0), (4, 2, 2, 0), (16, 0, 0, 0), (30, 0, 6, 0), (32, 0, 0, 0), (62, 0, 0, 0),
     (48, 0, 0, 0), (64, 0, 0, 0), (66, 2, 4, 0), (96, 0, 0, 0), (128, 0, 0, 0), (130, 0, 2, 2),
     (192, 0, 0, 0)],
)  # fmt: skip
def test_decoded_size_is_what_pyav_decodes(bases, pix_fmt, left, right, top, bottom):
    crop = f"crop_left={left}:crop_right={right}:crop_top={top}:crop_bottom={bottom}"
    stream = h264_filter(bases[pix_fmt], f"h264_metadata={crop}")
    sps = first_sps(stream)
    assert sps is not None and sps.crop == (left, right, top, bottom)
    assert (sps.chroma_format_idc, sps.bit_depth) == FORMATS[pix_fmt]
    assert (sps.coded_width, sps.coded_height) == (256, 64)
    assert (sps.width, sps.height) == (256 - left - right, 64 - top - bottom)  # the standard's
    if pix_fmt == "yuv444p10le" and left:  # FFmpeg cannot crop it: both say so
        with pytest.raises(av.error.BugError):
            _pyav_size(stream)
        with pytest.raises(ValueError, match=r"fails on a left crop \(\d+\) of 10-bit 4:4:4"):
            decoded_size(sps)
        return
    assert decoded_size(sps) == _pyav_size(stream)  # what FFmpeg outputs by default


def test_a_crop_that_leaves_no_picture_is_named():
    sps = dataclasses.replace(first_sps(_annexb(1, 48, 64)), crop=(40, 24, 0, 0))
    with pytest.raises(ValueError, match="leaves no picture of the coded 48x64"):
        decoded_size(sps)


@pytest.fixture(scope="module")
def left_crop_mp4() -> bytes:
    """The issue's file: coded 64x48, SPS crops 2 left, 4 right, 2 bottom (58x46), which
    FFmpeg decodes to 60x46 (it keeps a left crop that would break alignment)."""
    raw = h264_filter(_annexb(16, 48, 64), "h264_metadata=crop_left=2:crop_right=4:crop_bottom=2")
    return annexb_to_mp4(raw)


@pytest.fixture(scope="module")
def size_change_h264() -> bytes:
    """A raw .h264 whose SPS changes the size at frame 12 (two encodes back to back)."""
    return _annexb(12, 48, 64) + _annexb(12, 48, 32, seed=1)


def _episode_frames(branch, table: str, column: str) -> np.ndarray:
    t = branch.table(table).pin()
    key, idx = tv.index_from_arrow(t.to_arrow([column]).column(column))
    with tv.VideoReader(t.project.client.store, prefix=t.project.prefix) as reader:
        (frames,) = reader.read([tv.WindowRequest(key, idx, np.arange(len(idx)), Video(range(1)))])
    return frames


def test_left_crop_mp4_reads_back_every_frame_as_pyav_decodes_it(tmp_path, left_crop_mp4):
    ref = reference_decode(left_crop_mp4)
    assert ref.shape == (16, 46, 60, 3)  # FFmpeg's output, not the container's 58x46
    branch = td.Client(str(tmp_path)).project("p").branch()
    with branch.transaction("write") as tx:
        tx.table("t").append_episode({"cam": td.VideoFile(left_crop_mp4)}, episode="ep-0")
    frames = _episode_frames(branch, "t", "cam")
    assert np.array_equal(frames, ref)  # every frame, bit-identical to a PyAV decode


def test_size_change_mid_episode_is_refused_naming_frame_and_sizes(tmp_path, size_change_h264):
    sizes = [(f.height, f.width) for f in reference_frames(size_change_h264, "h264")]
    assert sizes == [(48, 64)] * 12 + [(48, 32)] * 12
    branch = td.Client(str(tmp_path)).project("p").branch()
    match = (
        r"table 't', episode 'ep-0', column 'cam': frame 12 decodes to 48x32 \(HxW; its SPS: "
        r"coded 48x32, .*the episode's index says 48x64; .*split the video .*at frame 12"
    )
    with pytest.raises(VideoError, match=match):
        with branch.transaction("write") as tx:
            tx.table("t").append_episode(
                {"cam": td.VideoFile(size_change_h264, fps=10)}, episode="ep-0"
            )
    assert "t" not in branch.tables()


def test_an_encoded_stream_whose_index_lies_is_refused(tmp_path):
    s = tv.encode_frames(synthetic_frames(4, 48, 64), gop=2, preset="ultrafast")
    check_geometry(s, "ok")  # what treadle encodes passes
    bad = dataclasses.replace(s, index=dataclasses.replace(s.index, width=66))
    branch = td.Client(str(tmp_path)).project("p").branch()
    with pytest.raises(VideoError, match=r"column 'cam': frame 0 decodes to 48x64 .* says 48x66"):
        with branch.transaction("write") as tx:
            tx.table("t").append_episode({"cam": bad}, episode="ep-0")


def test_edit_list_left_crop_is_reencoded_at_the_size_pyav_decodes():
    """An MP4 whose edit list hides frames is re-encoded from FFmpeg's decode: its frames
    keep the size FFmpeg decodes them to (60 wide), never scaled to the container's 58."""
    raw = h264_filter(_annexb(12, 48, 64), "h264_metadata=crop_left=2:crop_right=4")
    mp4 = annexb_to_mp4(raw, first_pts=-2)
    ref = reference_decode(mp4)
    assert ref.shape == (10, 48, 60, 3)  # the edit list hides 2 frames
    s = tv.from_container(mp4, crf=0, preset="ultrafast")
    assert (s.num_frames, s.index.height, s.index.width) == (10, 48, 60)
    check_geometry(s, "re-encoded")
    diff = np.abs(reference_decode(s.data, "h264").astype(int) - ref)
    assert diff.mean() < 3  # the same pictures (lossless encode, RGB round trip)


def test_a_size_change_in_a_reencoded_file_is_refused(tmp_path, size_change_h264):
    """Re-encoding (here: an edit list) refuses a new size mid-stream rather than scale it."""
    mp4 = annexb_to_mp4(size_change_h264, first_pts=-2)
    branch = td.Client(str(tmp_path)).project("p").branch()
    match = r"column 'cam': .*frame 10 decodes to 48x32 \(HxW\), frame 0 to 48x64"
    with pytest.raises(VideoError, match=match):
        with branch.transaction("write") as tx:
            tx.table("t").append_episode({"cam": td.VideoFile(mp4)}, episode="ep-0")


def test_sps_scan_finds_every_sps_the_nal_parser_finds(size_change_h264):
    from treadle.video.nal import NAL_SPS, iter_nal_spans, iter_sps_spans

    # a zero-ref-idc SPS header (0x07) and trailing zeros before a 4-byte start code
    data = size_change_h264 + b"\x00\x00\x01\x07" + size_change_h264[4:40] + b"\x00\x00\x00\x01"
    want = [(s, e) for t, s, e in iter_nal_spans(data) if t == NAL_SPS]
    assert list(iter_sps_spans(data)) == want and len(want) == 2 + 2 + 1  # 2 GOPs per half + 1
    assert data[want[-1][1] - 1] != 0


def test_a_non_square_rotated_stream_arrives_at_its_stored_size(tmp_path):
    """A documented choice: a stream's sample aspect ratio (here 2:1, shown 128x48) and its
    display rotation (90 degrees) are not applied; frames are the stored 64x48 pixels, as
    PyAV's ``to_ndarray`` gives them."""
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for _ in range(4)]
    path = str(tmp_path / "sar.mp4")
    with av.open(path, "w") as mp4:
        s = mp4.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        s.codec_context.sample_aspect_ratio = Fraction(2, 1)
        s.set_display_rotation(90)
        for f in frames:
            mp4.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        mp4.mux(s.encode())
    with av.open(path) as c:
        assert c.streams.video[0].codec_context.sample_aspect_ratio == Fraction(2, 1)
        decoded = list(c.decode(video=0))
        assert {f.rotation for f in decoded} == {90}
        ref = [f.to_ndarray(format="rgb24") for f in decoded]
    branch = td.Client(str(tmp_path / "r"), create=True).project("p").branch("main")
    branch.table("v").append_episode({"cam": td.VideoFile(path)}, episode="a")
    comp = td.Component(branch.table("v"), td.Windows({"cam": td.Video([0])}))
    got = list(td.EvalLoader(comp, 4))[0]["cam"].numpy()[:, 0]
    np.testing.assert_array_equal(got, np.stack(ref))
