"""The fused Triton kernel: YUV 4:2:0 planes -> RGB, resize, layout, dtype, norm, one pass.

Imported lazily by :func:`treadle.gpu.yuv_to_tensor.convert` (Triton is optional). Runs on
CUDA tensors, or on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before this module is imported), which is how the CPU test suite runs it.

Each program writes ``BLOCK`` output pixels of one frame: for each pixel it gathers the
luma taps (``KLY x KLX``) and chroma taps (``KCY x KCX``) from the tap tables built by
:func:`treadle.gpu.yuv_to_tensor.filter_taps`, applies the matrix, rounds to uint8 and
either stores that or its float value looked up in ``FrameSpec.levels()`` (``q / 255``, then
``(x - mean) / std``, the CPU path's values) in the output dtype. Planes and output are addressed through strides, so a pitched NVDEC surface, NV12's interleaved chroma
and a slice of the batch tensor all work without copies.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

import torch
import triton
import triton.language as tl

from treadle.fork_locks import renew_lock_in_child
from treadle.gpu.yuv_colour import Colour


@triton.jit
def _to_bf16(x):
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _luma(
    yb, sy_h, sy_w, ly_idx, ly_w, lx_idx, lx_w, oy, ox, mask,
    KLY: tl.constexpr, KLX: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The luma taps' weighted sum at output pixels (oy, ox) of one frame."""
    lum = tl.zeros([BLOCK], dtype=tl.float32)
    for a in tl.static_range(KLY):
        iy = tl.load(ly_idx + oy * KLY + a, mask=mask, other=0).to(tl.int64)
        wy = tl.load(ly_w + oy * KLY + a, mask=mask, other=0.0)
        row = tl.zeros([BLOCK], dtype=tl.float32)
        for b in tl.static_range(KLX):
            ix = tl.load(lx_idx + ox * KLX + b, mask=mask, other=0).to(tl.int64)
            wx = tl.load(lx_w + ox * KLX + b, mask=mask, other=0.0)
            p = tl.load(yb + iy * sy_h + ix * sy_w, mask=mask, other=0).to(tl.float32)
            row += wx * p
        lum += wy * row
    return lum


@triton.jit
def _chroma(
    ub, su_h, su_w, vb, sv_h, sv_w, cy_idx, cy_w, cx_idx, cx_w, oy, ox, mask,
    KCY: tl.constexpr, KCX: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """(cb, cr): both chroma planes' weighted sums, sharing each tap's loads."""
    cb = tl.zeros([BLOCK], dtype=tl.float32)
    cr = tl.zeros([BLOCK], dtype=tl.float32)
    for a in tl.static_range(KCY):
        iy = tl.load(cy_idx + oy * KCY + a, mask=mask, other=0).to(tl.int64)
        wy = tl.load(cy_w + oy * KCY + a, mask=mask, other=0.0)
        row_u = tl.zeros([BLOCK], dtype=tl.float32)
        row_v = tl.zeros([BLOCK], dtype=tl.float32)
        for b in tl.static_range(KCX):
            ix = tl.load(cx_idx + ox * KCX + b, mask=mask, other=0).to(tl.int64)
            wx = tl.load(cx_w + ox * KCX + b, mask=mask, other=0.0)
            pu = tl.load(ub + iy * su_h + ix * su_w, mask=mask, other=0).to(tl.float32)
            pv = tl.load(vb + iy * sv_h + ix * sv_w, mask=mask, other=0).to(tl.float32)
            row_u += wx * pu
            row_v += wx * pv
        cb += wy * row_u
        cr += wy * row_v
    return cb, cr


@triton.jit
def _rgb(
    lum, cb, cr, ys, yo, cs, rv, gu, gv, bu, fy, fy_o, fvr, fub, fug, fvg,
    SWS_FIXED: tl.constexpr,
):  # fmt: skip
    """Integer-valued float32 (r, g, b) in 0..255: the matrix (``Colour.rgb_coefficients``),
    or swscale's fixed-point converter (``Colour.sws_fixed_coefficients``)."""
    if SWS_FIXED:
        # swscale's unscaled converter (see Colour.sws_fixed_coefficients): taps are
        # single nearest samples with weight 1, so the sums are exact integers.
        yi = (lum.to(tl.int32) * 8 - fy_o) * fy >> 16
        ui = cb.to(tl.int32) * 8 - 1024
        vi = cr.to(tl.int32) * 8 - 1024
        r = tl.minimum(tl.maximum(yi + (vi * fvr >> 16), 0), 255).to(tl.float32)
        g = yi + ((ui * fug >> 16) + (vi * fvg >> 16))
        g = tl.minimum(tl.maximum(g, 0), 255).to(tl.float32)
        bl = tl.minimum(tl.maximum(yi + (ui * fub >> 16), 0), 255).to(tl.float32)
    else:
        lum = (lum - yo) * ys
        cb = (cb - 128.0) * cs
        cr = (cr - 128.0) * cs
        r = lum + rv * cr
        g = lum + gu * cb + gv * cr
        bl = lum + bu * cb
        r = tl.floor(tl.minimum(tl.maximum(r, 0.0), 255.0) + 0.5)
        g = tl.floor(tl.minimum(tl.maximum(g, 0.0), 255.0) + 0.5)
        bl = tl.floor(tl.minimum(tl.maximum(bl, 0.0), 255.0) + 0.5)
    return r, g, bl


@triton.jit
def _store(
    ob, so_c, out_ptr, r, g, bl, lut_ptr, mask,
    OUT_UINT8: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    """Store the pixels' channels ``so_c`` apart: uint8 ``q``, or ``lut[c, q]`` (float32
    ``[3, 256]``) per channel in the output's float dtype."""
    if OUT_UINT8:
        tl.store(ob, r.to(tl.uint8), mask=mask)
        tl.store(ob + so_c, g.to(tl.uint8), mask=mask)
        tl.store(ob + 2 * so_c, bl.to(tl.uint8), mask=mask)
    else:
        # A lookup, not arithmetic: the compiled kernel may contract or approximate a
        # division, the table holds the CPU path's exact values.
        r = tl.load(lut_ptr + r.to(tl.int32), mask=mask, other=0.0)
        g = tl.load(lut_ptr + 256 + g.to(tl.int32), mask=mask, other=0.0)
        bl = tl.load(lut_ptr + 512 + bl.to(tl.int32), mask=mask, other=0.0)
        if OUT_BF16:
            # Round to nearest even by hand: the interpreter truncates in .to(bfloat16).
            tl.store(ob, _to_bf16(r), mask=mask)
            tl.store(ob + so_c, _to_bf16(g), mask=mask)
            tl.store(ob + 2 * so_c, _to_bf16(bl), mask=mask)
        else:
            ty = out_ptr.dtype.element_ty
            tl.store(ob, r.to(ty), mask=mask)
            tl.store(ob + so_c, g.to(ty), mask=mask)
            tl.store(ob + 2 * so_c, bl.to(ty), mask=mask)


# fmt: off
@triton.jit
def _yuv420_kernel(
    y_ptr, u_ptr, v_ptr, out_ptr,
    ly_idx, ly_w, lx_idx, lx_w, cy_idx, cy_w, cx_idx, cx_w,
    sy_t, sy_h, sy_w, su_t, su_h, su_w, sv_t, sv_h, sv_w,
    so_t, so_h, so_w, so_c, h, w,
    ys, yo, cs, rv, gu, gv, bu,
    lut_ptr,
    fy, fy_o, fvr, fub, fug, fvg,
    KLY: tl.constexpr, KLX: tl.constexpr, KCY: tl.constexpr, KCX: tl.constexpr,
    OUT_UINT8: tl.constexpr, OUT_BF16: tl.constexpr, SWS_FIXED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # fmt: on
    pid = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < h * w
    oy = offs // w
    ox = offs % w
    yb = y_ptr + t * sy_t
    lum = _luma(yb, sy_h, sy_w, ly_idx, ly_w, lx_idx, lx_w, oy, ox, mask, KLY, KLX, BLOCK)
    ub = u_ptr + t * su_t
    vb = v_ptr + t * sv_t
    cb, cr = _chroma(
        ub, su_h, su_w, vb, sv_h, sv_w, cy_idx, cy_w, cx_idx, cx_w, oy, ox, mask,
        KCY, KCX, BLOCK,
    )  # fmt: skip
    r, g, bl = _rgb(
        lum, cb, cr, ys, yo, cs, rv, gu, gv, bu, fy, fy_o, fvr, fub, fug, fvg, SWS_FIXED
    )  # fmt: skip
    ob = out_ptr + t * so_t + oy.to(tl.int64) * so_h + ox.to(tl.int64) * so_w
    _store(ob, so_c, out_ptr, r, g, bl, lut_ptr, mask, OUT_UINT8, OUT_BF16)


_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# The interpreter patches triton.language globally while a kernel runs: one at a time.
_interpreter_lock = threading.Lock()


renew_lock_in_child(sys.modules[__name__], "_interpreter_lock")


def _block() -> int:
    # The interpreter runs each program as numpy ops: big blocks mean few programs.
    return 4096 if _INTERPRET else 256


def launch(y, u, v, out, spec, colour: Colour, taps, fixed: bool = False) -> None:
    """Launch the kernel for ``T`` frames (``y/u/v [T,...]``, ``out [T,...]``, validated).

    ``fixed``: reproduce swscale's unscaled fixed-point converter (native size, nearest
    chroma taps; see :func:`treadle.gpu.yuv_to_tensor.sws_fixed_point`).
    """
    t, _, _ = y.shape
    if spec.layout == "THWC":
        _, h, w, _ = out.shape
        so_t, so_h, so_w, so_c = out.stride()
    else:
        _, _, h, w = out.shape
        so_t, so_c, so_h, so_w = out.stride()
    lut = spec.levels().to(out.device).contiguous()
    block = _block()
    grid = (triton.cdiv(h * w, block), t)
    args = (
        y,
        u,
        v,
        out,
        *taps.luma_y,
        *taps.luma_x,
        *taps.chroma_y,
        *taps.chroma_x,
        *y.stride(),
        *u.stride(),
        *v.stride(),
        so_t,
        so_h,
        so_w,
        so_c,
        h,
        w,
        *colour.rgb_coefficients(),
        lut,
        *colour.sws_fixed_coefficients(),
    )
    consts = dict(
        KLY=taps.luma_y[0].shape[1],
        KLX=taps.luma_x[0].shape[1],
        KCY=taps.chroma_y[0].shape[1],
        KCX=taps.chroma_x[0].shape[1],
        OUT_UINT8=out.dtype == torch.uint8,
        OUT_BF16=out.dtype == torch.bfloat16,
        SWS_FIXED=fixed,
        BLOCK=block,
    )
    with _interpreter_lock if _INTERPRET else contextlib.nullcontext():
        _yuv420_kernel[grid](*args, **consts)
