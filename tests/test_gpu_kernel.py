"""The fused Triton kernel, run by Triton's interpreter on CPU, against the torch reference.

Expected: float outputs bit-identical; uint8 outputs within 1 level, and equal in all
but a handful of pixels (the kernel sums taps in 2-D, the reference separably, so a
value within float rounding of .5 may round the other way).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

# Triton decides interpret-or-compile when triton.language is first imported, so this
# runs before anything imports triton. With a GPU the kernel is compiled and run on it.
ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 could be set: run this module "
            "in its own process (or set TRITON_INTERPRET=1)",
            allow_module_level=True,
        )
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

pytest.importorskip("triton")

from treadle.gpu.yuv_colour import AVCHROMA_LOC_CENTER, AVCHROMA_LOC_LEFT, Colour  # noqa: E402
from treadle.gpu.yuv_to_tensor import (  # noqa: E402
    convert,
    nv12_convert,
    reference_convert,
)
from treadle.video.frame_spec import FrameSpec  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def smooth_planes(t: int, h: int, w: int, seed: int = 0, pitch: int = 0):
    """Random-ish but smooth YUV planes; with ``pitch`` > w, padded like an NVDEC surface."""
    g = torch.Generator().manual_seed(seed)
    hc, wc = (h + 1) // 2, (w + 1) // 2
    stride = max(pitch, w)
    y = torch.randint(0, 256, (t, h, stride), dtype=torch.uint8, generator=g)
    uv = torch.randint(0, 256, (t, hc, max(pitch // 2, wc), 2), dtype=torch.uint8, generator=g)
    return y[:, :, :w], uv[:, :, :wc]


def on_device(*ts):
    """Copies on DEVICE with the same strides (keeps the NVDEC-like pitch)."""
    out = []
    for t in ts:
        base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
        dev = base.to(DEVICE)
        out.append(dev.as_strided(t.shape, t.stride(), t.storage_offset()))
    return out


def run_both(y, uv, spec, colour, chroma="full"):
    t, h, w = y.shape
    shape = spec.shape(t, h, w)
    ref = torch.empty(shape, dtype=spec.torch_dtype)
    ker = torch.full(shape, 3, dtype=spec.torch_dtype, device=DEVICE)
    reference_convert(y, uv[..., 0], uv[..., 1], ref, spec, colour, chroma)
    yd, uvd = on_device(y, uv)
    nv12_convert(yd, uvd, ker, spec, colour, chroma=chroma, impl="triton")
    return ref, ker.cpu()


def assert_close(ref, ker, dtype):
    ker = ker.cpu()
    if dtype == "uint8":
        d = (ref.int() - ker.int()).abs()
        assert int(d.max()) <= 1
        assert int((d > 0).sum()) <= max(2, d.numel() // 2000)
    elif not ON_GPU:
        assert torch.equal(ref, ker)  # the interpreter does the same float ops in order
    else:
        # the GPU compiler may fuse q * scale + shift into one FMA: 1 ulp
        ulp = {torch.float32: 2**-23, torch.float16: 2**-10, torch.bfloat16: 2**-7}[ref.dtype]
        torch.testing.assert_close(ker.float(), ref.float(), rtol=ulp, atol=ulp)


CASES = [
    # (source h, w, output size, layout, dtype, norm, colour)
    (48, 64, None, "THWC", "uint8", False, Colour(6, False, AVCHROMA_LOC_LEFT)),
    (48, 64, (24, 32), "TCHW", "uint8", False, Colour(1, False, AVCHROMA_LOC_LEFT)),
    (48, 64, (96, 128), "THWC", "float32", True, Colour(1, True, AVCHROMA_LOC_LEFT)),
    (35, 51, (30, 40), "TCHW", "float16", True, Colour(6, True, AVCHROMA_LOC_CENTER)),
    (36, 50, None, "THWC", "bfloat16", False, Colour(9, False, AVCHROMA_LOC_LEFT)),
    (120, 160, (56, 56), "TCHW", "bfloat16", True, Colour(1, False, AVCHROMA_LOC_LEFT)),
    (17, 23, (10, 12), "THWC", "float32", False, Colour(7, False, AVCHROMA_LOC_CENTER)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}-{c[3]}-{c[4]}")
def test_kernel_matches_reference(case):
    h, w, size, layout, dtype, norm, colour = case
    y, uv = smooth_planes(2, h, w, seed=h + w, pitch=w + 13)  # pitched, like NVDEC
    assert not y.is_contiguous()
    spec = FrameSpec(size, layout, dtype, MEAN if norm else None, STD if norm else None)
    ref, ker = run_both(y, uv, spec, colour)
    assert_close(ref, ker, dtype)


@pytest.mark.parametrize("size", [None, (24, 32)], ids=str)
def test_kernel_matches_reference_in_sws_default_mode(size):
    y, uv = smooth_planes(1, 48, 64, seed=5)
    spec = FrameSpec(size)
    ref, ker = run_both(y, uv, spec, Colour(), chroma="sws_default")
    if size is None:  # integer arithmetic (swscale's unscaled converter): exact
        assert torch.equal(ref, ker)
    else:
        assert_close(ref, ker, "uint8")


@pytest.mark.parametrize("norm", [False, True])
def test_kernel_float_is_its_uint8_over_255_exactly(norm):
    """Float32 output is ``q / 255`` of the kernel's own uint8 (LeRobot's ``x / 255``, not
    ``q * float32(1/255)``), then torchvision's Normalize with mean/std, on any device."""
    y, uv = smooth_planes(2, 64, 64, seed=3)
    yd, uvd = on_device(y, uv)
    q = torch.empty(2, 64, 64, 3, dtype=torch.uint8, device=DEVICE)
    f = torch.empty(2, 64, 64, 3, dtype=torch.float32, device=DEVICE)
    colour = Colour(1, True, AVCHROMA_LOC_LEFT)
    nv12_convert(yd, uvd, q, FrameSpec(), colour, impl="triton")
    spec = FrameSpec(None, "THWC", "float32", MEAN if norm else None, STD if norm else None)
    nv12_convert(yd, uvd, f, spec, colour, impl="triton")
    want = torch.tensor(q.cpu().numpy(), dtype=torch.float32) / 255
    if norm:
        want = (want - torch.tensor(MEAN)) / torch.tensor(STD)
    assert len(torch.unique(q)) > 200
    assert torch.equal(f.cpu(), want)


def test_kernel_writes_only_its_slice_of_the_batch():
    y, uv = smooth_planes(3, 32, 48, seed=9)
    spec = FrameSpec((16, 24), "TCHW", "float16", MEAN, STD)
    batch = torch.full((4, 3, 3, 16, 24), -7.0, dtype=torch.float16, device=DEVICE)
    yd, uvd = on_device(y, uv)
    convert(yd, uvd[..., 0], uvd[..., 1], batch[2], spec, Colour(), impl="triton")
    assert (batch[[0, 1, 3]] == -7).all()
    ref = torch.empty(3, 3, 16, 24, dtype=torch.float16)
    reference_convert(y, uv[..., 0], uv[..., 1], ref, spec, Colour())
    assert_close(ref, batch[2], "float16")


def test_kernel_single_frame_and_channels_last_view():
    """A 2-D frame and an output that is a permuted (non-contiguous) view."""
    y, uv = smooth_planes(1, 40, 40, seed=2)
    spec = FrameSpec((20, 20), "TCHW", "uint8")
    store = torch.zeros(1, 20, 20, 3, dtype=torch.uint8, device=DEVICE)
    out = store.permute(0, 3, 1, 2)  # TCHW view over THWC memory
    yd, uvd = on_device(y, uv)
    convert(yd[0], uvd[0, ..., 0], uvd[0, ..., 1], out, spec, Colour(), impl="triton")
    ref = torch.empty(1, 3, 20, 20, dtype=torch.uint8)
    reference_convert(y, uv[..., 0], uv[..., 1], ref, spec, Colour())
    assert_close(ref, out, "uint8")
    assert int(store.sum()) > 0


def test_kernel_on_real_decoded_frames_matches_ffmpeg():
    """End to end on CPU: H.264 -> PyAV planes -> kernel vs swscale (parity flags)."""
    import numpy as np

    import treadle.video as tv
    from treadle.gpu.yuv_to_tensor import SWS_PARITY_FLAGS
    from treadle.video._testing import synthetic_frames

    s = tv.encode_frames(synthetic_frames(3, 48, 64), gop=3)
    import av

    cc = av.CodecContext.create("h264", "r")
    frames = []
    for i in s.index.display_of_decode.tolist():  # packets in decode order
        o, n = int(s.index.offset[i]), int(s.index.size[i])
        frames += cc.decode(av.Packet(s.data[o : o + n]))
    frames += cc.decode(None)
    assert len(frames) == 3
    for f in frames:
        ys, us, vs = (
            torch.from_numpy(
                np.frombuffer(bytes(p), np.uint8)
                .reshape(p.height, p.line_size)[:, : p.width]
                .copy()
            )
            for p in f.planes
        )
        out = torch.empty(1, 3, 24, 32, dtype=torch.uint8, device=DEVICE)
        spec = FrameSpec((24, 32), "TCHW")
        ys, us, vs = (p.to(DEVICE) for p in (ys, us, vs))
        convert(ys, us, vs, out, spec, Colour(6, False, AVCHROMA_LOC_LEFT), impl="triton")
        out = out.cpu()
        want = f.to_ndarray(format="rgb24", width=32, height=24, interpolation=SWS_PARITY_FLAGS)
        d = (out[0].permute(1, 2, 0).int() - torch.from_numpy(want.copy()).int()).abs()
        assert int(d.max()) <= 1


@pytest.mark.skipif(ON_GPU, reason="checks the CPU-only behaviour")
def test_triton_impl_refuses_cpu_tensors_without_interpreter(monkeypatch):
    from treadle.gpu import yuv_to_tensor as transform

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    y, uv = smooth_planes(1, 8, 8)
    out = torch.empty(1, 8, 8, 3, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="CUDA"):
        transform.convert(y, uv[..., 0], uv[..., 1], out, FrameSpec(), Colour(), impl="triton")
    # auto picks the torch reference for CPU tensors
    transform.convert(y, uv[..., 0], uv[..., 1], out, FrameSpec(), Colour(), impl="auto")
