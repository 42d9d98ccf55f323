"""YUV 4:2:0 (NV12 or I420) -> the window spec's tensor: RGB, resize, layout, dtype, norm.

One definition of the maths, two implementations:

- :func:`reference_convert`: vectorised torch, any device. It is the oracle in tests
  and the fallback when Triton is not installed.
- the fused Triton kernel (:mod:`treadle.gpu.kernel`): one pass from the decoder's NV12
  surface into a slice of the batch tensor.

The maths is the one FFmpeg's scaler (swscale) uses with
``interpolation=BILINEAR | FULL_CHR_H_INT | ACCURATE_RND`` (:data:`SWS_PARITY_FLAGS`):

* Luma and each chroma plane are resampled separately to the output size with
  swscale's "bilinear" filter: a triangle whose radius is one *source* pixel when
  upscaling and ``src/dst`` source pixels when downscaling (an antialiased tent, not
  a 2-tap lerp), centred at ``(i + 0.5) * src/dst - 0.5``; taps past the edge repeat
  the edge pixel; weights are normalised to sum to 1.
* Chroma sample ``(i, j)`` sits at luma position ``(2i + dx, 2j + dy)`` given by the
  stream's chroma location (H.264 default: left, ``dx = 0, dy = 0.5``), and the chroma
  filter centre is shifted accordingly (FFmpeg >= 8 honours the frame's location).
* YUV -> RGB with the stream's matrix (BT.601/709/...) and range (limited/full), in
  float32, then ``floor(x + 0.5)`` clamped to 0..255: this is the uint8 output.
* Float outputs are that uint8 value looked up in
  :meth:`treadle.video.frame_spec.FrameSpec.levels` (``q / 255``, then ``(x - mean) / std``,
  in float32 on the CPU), so a float batch equals the CPU path's whenever the uint8
  values agree, bit for bit, on any device.

Measured against PyAV/swscale (tests/test_gpu_transform.py, bench/gpu_check.py):

* ``chroma="full"`` vs ``interpolation=SWS_PARITY_FLAGS``: max abs diff 1 (uint8) at
  native size and when resizing, for BT.601/709, limited/full range, left/centre siting,
  odd sizes.
* ``chroma="sws_default"`` vs PyAV's *default* flags (``BILINEAR``, what the CPU path
  uses): at native size swscale runs its unscaled fixed-point converter (chroma
  replicated 2x2, 16-bit multiplies); :func:`sws_fixed_point` reproduces it bit for bit
  (difference 0). Resized, swscale shares one chroma value between two output pixels
  (emulated) and truncates in its fixed-point scaler and lookup tables (not emulated):
  max abs diff <= 7, mean <= 3.5 levels, FFmpeg's output being the darker.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

from treadle.gpu.yuv_colour import Colour
from treadle.video.frame_spec import FrameSpec

#: PyAV ``interpolation`` flags whose output this module reproduces within 1 level:
#: ``Interpolation.BILINEAR | Interpolation.FULL_CHR_H_INT | Interpolation.ACCURATE_RND``.
SWS_PARITY_FLAGS = 2 | 8192 | 262144

CHROMA_MODES = ("full", "sws_default")


def chroma_mode_for(interpolation: int | str | None) -> str:
    """The chroma mode that reproduces swscale run with PyAV ``interpolation`` flags.

    ``"full"`` when ``FULL_CHR_H_INT`` is set (within 1 level when ``ACCURATE_RND`` is
    set too), else ``"sws_default"``. Accepts an int / ``Interpolation`` flag, a name
    such as ``"BILINEAR"``, names joined by ``|``, or None (PyAV's default, BILINEAR).
    """
    if interpolation is None:
        return "sws_default"
    if isinstance(interpolation, str):
        from av.video.reformatter import Interpolation

        flags = 0
        for name in interpolation.split("|"):
            flags |= int(Interpolation[name.strip().upper()])
    else:
        flags = int(interpolation)
    return "full" if flags & 8192 else "sws_default"


# --- resampling taps --------------------------------------------------------------------


def filter_taps(n_src: int, n_dst: int, shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """swscale-style bilinear taps from ``n_src`` samples to ``n_dst``.

    Output ``i`` is centred at source coordinate ``(i + 0.5) * n_src / n_dst - 0.5 +
    shift``; the tent's radius is ``max(1, n_src / n_dst)``. Returns ``(idx, w)``, both
    ``[n_dst, K]`` (int32 indices already clamped to the edges, float32 weights summing
    to 1 per row; unused taps have weight 0).
    """
    if n_src <= 0 or n_dst <= 0:
        raise ValueError(f"sizes must be positive, got {n_src} -> {n_dst}")
    scale = n_src / n_dst
    radius = max(1.0, scale)
    centre = (torch.arange(n_dst, dtype=torch.float64) + 0.5) * scale - 0.5 + shift
    k = int(math.ceil(2 * radius)) + 1
    first = torch.floor(centre - radius).to(torch.int64) + 1
    j = first[:, None] + torch.arange(k, dtype=torch.int64)[None, :]
    w = (1.0 - (j.to(torch.float64) - centre[:, None]).abs() / radius).clamp_min(0.0)
    w = w / w.sum(1, keepdim=True)
    idx = j.clamp(0, n_src - 1)
    # Drop all-zero trailing columns so K stays small.
    used = (w > 0).any(0).nonzero()
    k_used = int(used.max()) + 1 if used.numel() else 1
    return idx[:, :k_used].to(torch.int32).contiguous(), w[:, :k_used].to(
        torch.float32
    ).contiguous()


def _nearest_taps(n_src: int, n_dst: int, factor: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = (torch.arange(n_dst) // factor).clamp(max=n_src - 1).to(torch.int32)[:, None]
    return idx.contiguous(), torch.ones(n_dst, 1, dtype=torch.float32)


@dataclass(frozen=True)
class Taps:
    """Per-axis tap tables for one (source size, output size, siting, mode)."""

    luma_y: tuple[torch.Tensor, torch.Tensor]
    luma_x: tuple[torch.Tensor, torch.Tensor]
    chroma_y: tuple[torch.Tensor, torch.Tensor]
    chroma_x: tuple[torch.Tensor, torch.Tensor]

    def to(self, device: torch.device | str) -> Taps:
        return Taps(*(tuple(t.to(device) for t in pair) for pair in self._pairs()))

    def _pairs(self):
        return (self.luma_y, self.luma_x, self.chroma_y, self.chroma_x)


@functools.lru_cache(maxsize=256)
def _taps_cpu(
    height: int,
    width: int,
    h: int,
    w: int,
    siting: tuple[float, float],
    chroma: str,
    device: str,
) -> Taps:
    hc, wc = (height + 1) // 2, (width + 1) // 2
    dx, dy = siting
    luma_y, luma_x = filter_taps(height, h), filter_taps(width, w)
    # Chroma sample j sits at luma 2j + d; swscale centres chroma tap 0 at
    # (0.5 * wc/w - 0.5) + (0.5 - d) / 2 in chroma units.
    chroma_y = filter_taps(hc, h, (0.5 - dy) / 2)
    if chroma == "full":
        chroma_x = filter_taps(wc, w, (0.5 - dx) / 2)
    elif chroma == "sws_default":
        native = (h, w) == (height, width)
        if native and h % 2 == 0:
            # swscale's unscaled yuv2rgb converter: chroma replicated 2x2.
            chroma_y, chroma_x = _nearest_taps(hc, h, 2), _nearest_taps(wc, w, 2)
        elif w % 2:
            chroma_x = filter_taps(wc, w, (0.5 - dx) / 2)  # swscale forces full chroma
        else:
            # One chroma value per output pixel pair, resampled to w/2 positions.
            idx, wt = filter_taps(wc, w // 2, (0.5 - dx) / 2)
            pair = torch.arange(w) // 2
            chroma_x = (idx[pair].contiguous(), wt[pair].contiguous())
    else:
        raise ValueError(f"chroma mode must be one of {CHROMA_MODES}, got {chroma!r}")
    taps = Taps(luma_y, luma_x, chroma_y, chroma_x)
    return taps if device == "cpu" else taps.to(device)


def taps_for(
    height: int,
    width: int,
    spec: FrameSpec,
    colour: Colour,
    chroma: str = "full",
    device: torch.device | str = "cpu",
) -> Taps:
    """Cached tap tables for a ``height x width`` source under ``spec`` on ``device``."""
    h, w = spec.size_for(height, width)
    return _taps_cpu(height, width, h, w, colour.siting, chroma, str(torch.device(device)))


# --- reference implementation ----------------------------------------------------------


def _resample(plane: torch.Tensor, ty, tx) -> torch.Tensor:
    """plane [T, H, W] float32 -> [T, h, w] through separable taps."""
    iy, wy = ty
    ix, wx = tx
    rows = None
    for k in range(iy.shape[1]):
        term = plane[:, iy[:, k].long(), :] * wy[None, :, k, None]
        rows = term if rows is None else rows + term
    out = None
    for k in range(ix.shape[1]):
        term = rows[:, :, ix[:, k].long()] * wx[None, None, :, k]
        out = term if out is None else out + term
    return out


def sws_fixed_point(height: int, width: int, spec: FrameSpec, chroma: str) -> bool:
    """True when swscale would use its unscaled fixed-point converter (reproduced exactly).

    That is PyAV's default flags (``chroma="sws_default"``), output at the native size,
    even height.
    """
    return (
        chroma == "sws_default"
        and spec.size_for(height, width) == (height, width)
        and height % 2 == 0
    )


def _fixed_point_rgb(y, u, v, taps: Taps, colour: Colour) -> torch.Tensor:
    """[T, 3, H, W] float32 integer values: swscale's unscaled converter, bit for bit."""
    cy, oy, vr, ub, ug, vg = colour.sws_fixed_coefficients()
    iy, ix = taps.chroma_y[0][:, 0].long(), taps.chroma_x[0][:, 0].long()  # nearest (2x2)
    lum = (y.to(torch.int32) * 8 - oy) * cy >> 16
    up = u.to(torch.int32)[:, iy][:, :, ix] * 8 - 1024
    vp = v.to(torch.int32)[:, iy][:, :, ix] * 8 - 1024
    r = lum + (vp * vr >> 16)
    g = lum + ((up * ug >> 16) + (vp * vg >> 16))
    b = lum + (up * ub >> 16)
    return torch.stack((r, g, b), dim=1).clamp(0, 255).to(torch.float32)


def _check_planes(y: torch.Tensor, u: torch.Tensor, v: torch.Tensor):
    if y.dim() == 2:
        y, u, v = y[None], u[None], v[None]
    if y.dim() != 3 or u.dim() != 3 or v.dim() != 3:
        raise ValueError(f"planes must be [T, H, W], got {tuple(y.shape)}, {tuple(u.shape)}")
    t, height, width = y.shape
    hc, wc = (height + 1) // 2, (width + 1) // 2
    for name, p in (("u", u), ("v", v)):
        if tuple(p.shape) != (t, hc, wc):
            raise ValueError(f"{name} plane must be {(t, hc, wc)} for Y {tuple(y.shape)}")
        if p.dtype != torch.uint8 or y.dtype != torch.uint8:
            raise ValueError("planes must be uint8")
    return y, u, v


def _check_out(out: torch.Tensor, spec: FrameSpec, t: int, height: int, width: int):
    out4 = out[None] if out.dim() == 3 else out
    spec.check(out4, t, height, width, "convert", out.device)
    return out4


def reference_convert(
    y: torch.Tensor,
    u: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    spec: FrameSpec,
    colour: Colour,
    chroma: str = "full",
) -> torch.Tensor:
    """Pure-torch conversion of ``T`` frames (any device) into ``out`` (written in place).

    ``y`` is ``[T, H, W]`` uint8, ``u``/``v`` are ``[T, ceil(H/2), ceil(W/2)]`` uint8 (any
    strides: for NV12 pass ``uv[..., 0]`` and ``uv[..., 1]``); ``out`` is ``[T, h, w, 3]``
    (THWC) or ``[T, 3, h, w]`` (TCHW) of ``spec.dtype``, any strides. Returns ``out``.
    """
    y, u, v = _check_planes(y, u, v)
    _reference(y, u, v, _check_out(out, spec, *y.shape), spec, colour, chroma)
    return out


def _reference(y, u, v, out4, spec: FrameSpec, colour: Colour, chroma: str) -> None:
    """:func:`reference_convert` of checked ``[T, ...]`` planes into a checked ``out4``."""
    _, height, width = y.shape
    taps = taps_for(height, width, spec, colour, chroma, y.device)
    if sws_fixed_point(height, width, spec, chroma):
        q = _fixed_point_rgb(y, u, v, taps, colour)
    else:
        lum = _resample(y.float(), taps.luma_y, taps.luma_x)
        cb = _resample(u.float(), taps.chroma_y, taps.chroma_x) - 128.0
        cr = _resample(v.float(), taps.chroma_y, taps.chroma_x) - 128.0
        ys, yo, cs, rv, gu, gv, bu = colour.rgb_coefficients()
        lum = (lum - yo) * ys
        cb = cb * cs
        cr = cr * cs
        rgb = torch.stack((lum + rv * cr, lum + gu * cb + gv * cr, lum + bu * cb), dim=1)
        q = torch.floor(rgb.clamp(0.0, 255.0) + 0.5)  # [T, 3, h, w]
    if spec.dtype == "uint8":
        res = q.to(torch.uint8)
    else:
        # A gather from the CPU-computed levels, not arithmetic here: CUDA's ``x / 255``
        # multiplies by a reciprocal (1 ulp off for 126 of the 256 levels).
        lut = spec.levels().to(q.device).flatten()
        chan = torch.arange(3, device=q.device)[None, :, None, None] * 256
        res = lut[q.to(torch.int64) + chan].to(spec.torch_dtype)
    if spec.layout == "THWC":
        res = res.permute(0, 2, 3, 1)
    out4.copy_(res)


# --- dispatch ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when ``triton`` imports (the kernel still needs CUDA or TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install raising anything else
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def convert(
    y: torch.Tensor,
    u: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    spec: FrameSpec,
    colour: Colour,
    *,
    chroma: str = "full",
    impl: str = "auto",
) -> torch.Tensor:
    """Convert ``T`` frames of YUV 4:2:0 planes into ``out`` (see :func:`reference_convert`).

    ``impl``: ``"triton"`` (the fused kernel: CUDA tensors, or CPU tensors under
    ``TRITON_INTERPRET=1``), ``"torch"`` (the reference), or ``"auto"`` (Triton when the
    tensors are on CUDA and Triton imports, else torch).
    """
    y3, u3, v3 = _check_planes(y, u, v)
    convert_checked(y3, u3, v3, _check_out(out, spec, *y3.shape), spec, colour, chroma, impl)
    return out


def convert_checked(y, u, v, out, spec: FrameSpec, colour: Colour, chroma: str, impl: str) -> None:
    """:func:`convert` of uint8 planes ``[T, H, W]`` (torch tensors) into an ``out`` of
    ``[T, ...]`` that the caller checked (:meth:`FrameSpec.check`; the GPU reader checks
    each window once)."""
    if impl == "auto":
        impl = "triton" if (y.is_cuda and triton_available()) else "torch"
    if impl == "torch":
        return _reference(y, u, v, out, spec, colour, chroma)
    if impl != "triton":
        raise ValueError(f"impl must be auto, triton or torch, got {impl!r}")
    if not y.is_cuda and not _interpreting():
        raise RuntimeError("the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1)")
    from treadle.gpu.kernel import launch

    _, height, width = y.shape
    taps = taps_for(height, width, spec, colour, chroma, y.device)
    launch(y, u, v, out, spec, colour, taps, sws_fixed_point(height, width, spec, chroma))


def nv12_convert(
    y: torch.Tensor,
    uv: torch.Tensor,
    out: torch.Tensor,
    spec: FrameSpec,
    colour: Colour,
    *,
    chroma: str = "full",
    impl: str = "auto",
) -> torch.Tensor:
    """NV12 planes (``y [T,H,W]``, interleaved ``uv [T,H/2,W/2,2]``) into ``out``."""
    if uv.shape[-1] != 2:
        raise ValueError(f"uv must end in a dimension of 2 (interleaved), got {tuple(uv.shape)}")
    return convert(y, uv[..., 0], uv[..., 1], out, spec, colour, chroma=chroma, impl=impl)
