"""The YUV 4:2:0 -> tensor maths (torch reference) against FFmpeg's own conversion.

Tolerances (max abs difference in uint8 levels, measured here):

* with ``SWS_PARITY_FLAGS`` (BILINEAR | FULL_CHR_H_INT | ACCURATE_RND): <= 1 at native
  size and for every resize, both matrices, both ranges, left and centre chroma siting,
  odd source sizes;
* with PyAV's default ``BILINEAR`` (the CPU path's current flags) in ``sws_default``
  mode: 0 (bit-identical) at native size, where swscale's fixed-point unscaled
  converter is reproduced exactly; <= 7 and mean <= 3.5 resized (swscale's truncating
  fixed-point scaler and table lookups, not the sampling, account for it).
"""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from treadle.gpu.yuv_colour import (
    AVCHROMA_LOC_CENTER,
    AVCHROMA_LOC_LEFT,
    Colour,
    colour_from_annexb,
    parse_sps,
    sps_from_annexb,
)
from treadle.gpu.yuv_to_tensor import (
    SWS_PARITY_FLAGS,
    chroma_mode_for,
    filter_taps,
    nv12_convert,
    reference_convert,
)
from treadle.plan.windows import Video
from treadle.video.frame_spec import FrameSpec

SIZES = [None, (24, 32), (96, 128), (30, 40), (64, 48)]
TAGS = [(None, None), (1, 1), (1, 2), (6, 2)]  # (colorspace, color_range): untagged = 601 tv


def harsh_frames(t: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    """Gradients, a saturated block with sharp edges, and noise: hard on chroma sampling."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for i in range(t):
        img = np.stack(
            [
                128 + 100 * np.sin(xx / 7.0 + i * 0.3),
                128 + 100 * np.cos(yy / 5.0 - i * 0.2),
                (xx * 3 + yy * 2 + i * 5) % 256,
            ],
            -1,
        )
        img[h // 4 : h // 2, w // 4 : w // 2] = [250, 10, 30]
        img = img + rng.normal(0, 8, img.shape)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return np.stack(out)


def encode(frames: np.ndarray, colorspace=None, color_range=None) -> list[bytes]:
    """H.264 Annex-B packets (SPS/PPS in band) of ``frames``, with optional VUI colour tags."""
    _, h, w, _ = frames.shape
    cc = av.CodecContext.create("libx264", "w")
    cc.width, cc.height, cc.pix_fmt = w, h, "yuv420p"
    cc.time_base = Fraction(1, 30)
    cc.options = {"crf": "18", "x264-params": "bframes=0:annexb=1:repeat-headers=1"}
    if colorspace is not None:
        cc.colorspace = colorspace
    if color_range is not None:
        cc.color_range = color_range
    packets = []
    for i, f in enumerate(frames):
        vf = av.VideoFrame.from_ndarray(f, format="rgb24")
        vf = vf.reformat(format="yuv420p", dst_colorspace=colorspace, dst_color_range=color_range)
        vf.pts = i
        packets += [bytes(p) for p in cc.encode(vf)]
    return packets + [bytes(p) for p in cc.encode(None)]


def decode(packets: list[bytes]) -> list[av.VideoFrame]:
    cc = av.CodecContext.create("h264", "r")
    out = []
    for b in packets:
        out += cc.decode(av.Packet(b))
    return out + cc.decode(None)


def planes(frame: av.VideoFrame) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[1, H, W] / [1, ceil(H/2), ceil(W/2)] uint8 copies of a yuv420p frame's planes."""
    out = []
    for p in frame.planes:
        a = np.frombuffer(bytes(p), np.uint8).reshape(p.height, p.line_size)[:, : p.width]
        out.append(torch.from_numpy(a.copy())[None])
    return tuple(out)


def ffmpeg_rgb(frame: av.VideoFrame, size, flags) -> torch.Tensor:
    h, w = size if size else (frame.height, frame.width)
    return torch.from_numpy(
        frame.to_ndarray(format="rgb24", width=w, height=h, interpolation=flags).copy()
    )


def ours(frame, size, colour, chroma, dtype="uint8", layout="THWC") -> torch.Tensor:
    spec = FrameSpec(size, layout, dtype)
    y, u, v = planes(frame)
    out = torch.empty(spec.shape(1, frame.height, frame.width), dtype=spec.torch_dtype)
    reference_convert(y, u, v, out, spec, colour, chroma)
    return out[0]


def diff(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float]:
    d = (a.int() - b.int()).abs()
    return int(d.max()), float(d.float().mean())


@pytest.fixture(scope="module")
def streams():
    """Decoded frames + the stream's first packet, per colour tagging."""
    frames = harsh_frames(2, 48, 64)
    out = {}
    for cs, cr in TAGS:
        packets = encode(frames, cs, cr)
        out[(cs, cr)] = (decode(packets), packets[0])
    return out


# --- sampling ---------------------------------------------------------------------------


@pytest.mark.parametrize("n_src,n_dst", [(64, 64), (64, 32), (32, 96), (480, 224), (17, 10)])
def test_taps_are_normalised_and_in_range(n_src, n_dst):
    idx, w = filter_taps(n_src, n_dst)
    assert idx.shape == w.shape and idx.shape[0] == n_dst
    assert int(idx.min()) >= 0 and int(idx.max()) < n_src
    assert torch.allclose(w.sum(1), torch.ones(n_dst), atol=1e-6)
    assert float(w.min()) >= 0


def test_taps_identity_at_native_size():
    idx, w = filter_taps(40, 40)
    dense = torch.zeros(40, 40).index_put_(
        (torch.arange(40)[:, None].expand_as(idx), idx.long()), w, accumulate=True
    )
    assert torch.equal(dense, torch.eye(40))


def test_taps_downscale_is_antialiased():
    # swscale's bilinear widens the tent when downscaling: more than 2 taps at 1/4.
    idx, w = filter_taps(64, 16)
    assert int((w > 0).sum(1).max()) > 2


def test_chroma_mode_for_flags():
    assert chroma_mode_for("BILINEAR") == "sws_default"
    assert chroma_mode_for(None) == "sws_default"
    assert chroma_mode_for(SWS_PARITY_FLAGS) == "full"
    assert chroma_mode_for("BILINEAR|FULL_CHR_H_INT|ACCURATE_RND") == "full"


# --- against FFmpeg ---------------------------------------------------------------------


@pytest.mark.parametrize("tags", TAGS, ids=lambda t: f"cs{t[0]}-cr{t[1]}")
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_parity_flags_within_one_level(streams, tags, size):
    frames, first_packet = streams[tags]
    colour = colour_from_annexb(first_packet)
    assert colour.chroma_loc == AVCHROMA_LOC_LEFT  # H.264 without chroma_loc_info
    for frame in frames:
        mx, mean = diff(
            ours(frame, size, colour, "full"), ffmpeg_rgb(frame, size, SWS_PARITY_FLAGS)
        )
        assert mx <= 1, (tags, size, mx, mean)
        assert mean < 0.05


@pytest.mark.parametrize("tags", TAGS, ids=lambda t: f"cs{t[0]}-cr{t[1]}")
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_default_flags_within_stated_bound(streams, tags, size):
    frames, first_packet = streams[tags]
    colour = colour_from_annexb(first_packet)
    for frame in frames:
        mx, mean = diff(
            ours(frame, size, colour, "sws_default"), ffmpeg_rgb(frame, size, "BILINEAR")
        )
        if size is None:  # swscale's unscaled fixed-point converter, reproduced exactly
            assert mx == 0, (tags, mx, mean)
        else:
            assert mx <= 7 and mean <= 3.5, (tags, size, mx, mean)


def test_wrong_siting_or_matrix_is_caught(streams):
    """The tolerance is tight enough to tell the conventions apart."""
    frame = streams[(1, 1)][0][0]
    ref = ffmpeg_rgb(frame, (96, 128), SWS_PARITY_FLAGS)
    right = Colour(1, False, AVCHROMA_LOC_LEFT)
    assert diff(ours(frame, (96, 128), right, "full"), ref)[0] <= 1
    assert diff(ours(frame, (96, 128), Colour(1, False, AVCHROMA_LOC_CENTER), "full"), ref)[0] > 1
    assert diff(ours(frame, (96, 128), Colour(6, False, AVCHROMA_LOC_LEFT), "full"), ref)[0] > 1
    assert diff(ours(frame, (96, 128), Colour(1, True, AVCHROMA_LOC_LEFT), "full"), ref)[0] > 1


def yuv_frame(h: int, w: int, seed: int, colorspace: int, color_range: int) -> av.VideoFrame:
    """A synthetic yuv420p frame (no chroma location tag: swscale assumes centre)."""
    rng = np.random.default_rng(seed)
    f = av.VideoFrame(w, h, "yuv420p")
    yy, xx = np.mgrid[0:h, 0:w]
    luma = np.clip(
        100 + 60 * np.sin(xx / 4.0) + 40 * np.cos(yy / 3.0) + rng.normal(0, 6, (h, w)), 16, 235
    )
    hc, wc = (h + 1) // 2, (w + 1) // 2
    cy, cx = np.mgrid[0:hc, 0:wc]
    cb = np.clip(128 + 80 * np.sin(cx / 3.0 + cy / 5.0), 16, 240)
    cr = np.clip(128 + 80 * np.cos(cy / 2.0) * (cx > wc // 2), 16, 240)
    for plane, data in zip(f.planes, (luma, cb, cr)):
        buf = np.zeros((plane.height, plane.line_size), np.uint8)
        buf[: data.shape[0], : data.shape[1]] = data.astype(np.uint8)
        plane.update(buf)
    f.colorspace = colorspace
    f.color_range = color_range
    return f


@pytest.mark.parametrize("src", [(35, 51), (36, 50), (17, 23)], ids=str)
@pytest.mark.parametrize("size", [None, (24, 32), (70, 100)], ids=str)
@pytest.mark.parametrize("tags", [(1, 1), (5, 2)], ids=str)
def test_odd_sizes_and_centre_siting(src, size, tags):
    h, w = src
    frame = yuv_frame(h, w, seed=h * w, colorspace=tags[0], color_range=tags[1])
    colour = Colour(tags[0], tags[1] == 2, AVCHROMA_LOC_CENTER)
    mx, mean = diff(ours(frame, size, colour, "full"), ffmpeg_rgb(frame, size, SWS_PARITY_FLAGS))
    assert mx <= 1, (src, size, tags, mx, mean)


# --- dtypes, layouts, output slices -------------------------------------------------------


def test_float_outputs_are_the_cpu_formula_of_uint8(streams):
    frame = streams[(None, None)][0][0]
    colour = colour_from_annexb(streams[(None, None)][1])
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    q = ours(frame, (32, 48), colour, "full").float()
    want = (q / 255 - torch.tensor(mean)) / torch.tensor(std)  # torchvision's Normalize
    for dtype in ("float32", "float16", "bfloat16"):
        spec = FrameSpec((32, 48), "THWC", dtype, mean, std)
        y, u, v = planes(frame)
        out = torch.empty(1, 32, 48, 3, dtype=spec.torch_dtype)
        reference_convert(y, u, v, out, spec, colour, "full")
        assert torch.equal(out[0], want.to(spec.torch_dtype)), dtype
    plain = FrameSpec((32, 48), "THWC", "float32")
    out = torch.empty(1, 32, 48, 3)
    reference_convert(*planes(frame), out, plain, colour, "full")
    assert torch.equal(out[0], q / 255)  # LeRobot's x / 255, not q * float32(1/255)
    assert len(torch.unique(q)) > 100  # many of the 126 levels where q * (1/255) is 1 ulp off


def test_tchw_is_thwc_permuted(streams):
    frame = streams[(1, 2)][0][0]
    colour = colour_from_annexb(streams[(1, 2)][1])
    a = ours(frame, (30, 40), colour, "full", "float16", "THWC")
    b = ours(frame, (30, 40), colour, "full", "float16", "TCHW")
    assert b.shape == (3, 30, 40)
    assert torch.equal(a.permute(2, 0, 1), b)


def test_writes_into_a_slice_of_the_batch_and_nowhere_else(streams):
    frames, first = streams[(None, None)]
    colour = colour_from_annexb(first)
    spec = Video(range(2), size=(24, 32), layout="TCHW").frame
    batch = torch.full((3, 2, 3, 24, 32), 7, dtype=torch.uint8)
    ys, us, vs = zip(*(planes(f) for f in frames))
    reference_convert(torch.cat(ys), torch.cat(us), torch.cat(vs), batch[1], spec, colour)
    assert (batch[0] == 7).all() and (batch[2] == 7).all()
    for t, f in enumerate(frames):
        assert torch.equal(batch[1, t], ours(f, (24, 32), colour, "full", layout="TCHW"))


def test_nv12_interleaved_matches_planar(streams):
    frame = streams[(1, 1)][0][1]
    colour = colour_from_annexb(streams[(1, 1)][1])
    y, u, v = planes(frame)
    uv = torch.stack((u, v), dim=-1)  # [1, H/2, W/2, 2] like NVDEC's chroma plane
    spec = FrameSpec((30, 40))
    a = torch.empty(1, 30, 40, 3, dtype=torch.uint8)
    nv12_convert(y, uv, a, spec, colour)
    assert torch.equal(a[0], ours(frame, (30, 40), colour, "full"))


def test_bad_shapes_are_refused(streams):
    frame = streams[(1, 1)][0][0]
    y, u, v = planes(frame)
    spec = FrameSpec((24, 32))
    with pytest.raises(ValueError, match=r"out is \(1, 32, 24, 3\).*window needs \(1, 24, 32, 3\)"):
        reference_convert(y, u, v, torch.empty(1, 32, 24, 3, dtype=torch.uint8), spec, Colour())
    with pytest.raises(ValueError, match="out is .*float32.*window needs .* uint8"):
        reference_convert(y, u, v, torch.empty(1, 24, 32, 3), spec, Colour())
    with pytest.raises(ValueError, match="u plane"):
        reference_convert(
            y, u[:, :-1], v, torch.empty(1, 24, 32, 3, dtype=torch.uint8), spec, Colour()
        )
    with pytest.raises(ValueError, match="mean needs a float dtype"):
        FrameSpec(None, "THWC", "uint8", (0.0, 0.0, 0.0), None)


# --- colour tags from the stream -----------------------------------------------------------


@pytest.mark.parametrize("tags", TAGS, ids=lambda t: f"cs{t[0]}-cr{t[1]}")
def test_sps_tags_match_what_ffmpeg_decodes(streams, tags):
    frames, first = streams[tags]
    sps = sps_from_annexb(first)
    assert (sps.width, sps.height) == (64, 48)
    assert sps.colour.matrix == int(frames[0].colorspace)
    assert sps.colour.full_range == (int(frames[0].color_range) == 2)


def test_sps_chroma_location_and_cropping():
    frames = harsh_frames(1, 38, 54)  # needs cropping: 48x64 macroblocks
    cc = av.CodecContext.create("libx264", "w")
    cc.width, cc.height, cc.pix_fmt = 54, 38, "yuv420p"
    cc.time_base = Fraction(1, 30)
    cc.colorspace, cc.color_range = 1, 2
    cc.options = {"x264-params": "annexb=1:chromaloc=1"}
    vf = av.VideoFrame.from_ndarray(frames[0], format="rgb24").reformat(format="yuv420p")
    vf.pts = 0
    data = b"".join(bytes(p) for p in cc.encode(vf)) + b"".join(bytes(p) for p in cc.encode(None))
    sps = sps_from_annexb(data)
    assert (sps.width, sps.height) == (54, 38)
    assert sps.colour == Colour(1, True, AVCHROMA_LOC_CENTER)
    decoded = decode([data])[0]
    assert (int(decoded.colorspace), int(decoded.color_range)) == (1, 2)
    with pytest.raises(ValueError):
        parse_sps(b"\x68\x00")  # a PPS
    assert sps_from_annexb(b"\x00\x00\x01\x68\xce") is None
