"""Convert a decoded frame to rgb24 straight into the batch, with PyAV's own libswscale.

PyAV's ``VideoReformatter.reformat`` allocates a new frame per call, which is then
copied into the batch; :class:`DirectScaler` instead calls the bundled libswscale
(``av.libs``, loaded with ctypes) with a cached ``SwsContext`` and the batch slice as
the destination. It covers only what was checked to give the same bytes as
``reformat``: no resize, ``yuv420p`` (``yuvj420p`` when the stream is full range), a
C-contiguous ``uint8 [H, W, 3]`` destination, ``W`` a multiple of 16 (swscale's SIMD
rgb24 writer stores 16 pixels at a time and would write past a narrower row).

Each new configuration is also checked once at run time: its first frame is converted
both ways, into a guarded buffer; unless the bytes are the same and nothing was written
past the frame, the configuration stays on ``reformat``. Anything else (other formats,
resizes, libswscale not found) returns ``False`` and the caller uses ``reformat``.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

import numpy as np

_P = ctypes.c_void_p
_I = ctypes.c_int
_SWS_BILINEAR = 2  # flags; only the unscaled path is used, where it selects nothing else
_SWS_CS_DEFAULT = 5
_GUARD = 256


def _load() -> tuple[Any, dict[str, int]] | None:
    """libswscale and the pixel-format codes of the copy bundled with PyAV, or ``None``."""
    import av

    libs = os.path.join(os.path.dirname(os.path.dirname(av.__file__)), "av.libs")
    sws_so = glob.glob(os.path.join(libs, "libswscale*.so*"))
    util_so = glob.glob(os.path.join(libs, "libavutil*.so*"))
    if len(sws_so) != 1 or len(util_so) != 1:
        return None
    try:
        sws, util = ctypes.CDLL(sws_so[0]), ctypes.CDLL(util_so[0])
        sws.sws_getCachedContext.restype = _P
        sws.sws_getCachedContext.argtypes = [_P, _I, _I, _I, _I, _I, _I, _I, _P, _P, _P]
        sws.sws_getCoefficients.restype = _P
        sws.sws_getCoefficients.argtypes = [_I]
        sws.sws_setColorspaceDetails.argtypes = [_P, _P, _I, _P, _I, _I, _I, _I]
        sws.sws_scale.argtypes = [_P, _P, _P, _I, _I, _P, _P]
        sws.sws_freeContext.argtypes = [_P]
        util.av_get_pix_fmt.argtypes = [ctypes.c_char_p]
        fmts = {n: util.av_get_pix_fmt(n.encode()) for n in ("yuv420p", "yuvj420p", "rgb24")}
    except (OSError, AttributeError):
        return None
    if min(fmts.values()) < 0:
        return None
    return sws, fmts


_LIB: Any = None


def _lib() -> tuple[Any, dict[str, int]] | None:
    global _LIB
    if _LIB is None:
        _LIB = _load() or False
    return _LIB or None


class DirectScaler:
    """A cached libswscale context converting frames into batch slices (one per thread)."""

    def __init__(self) -> None:
        self._ctx: Any = None
        self._key: tuple[Any, ...] | None = None
        self._ok: dict[tuple[Any, ...], bool] = {}
        self._src = (_P * 4)()
        self._src_stride = (_I * 4)()
        self._dst = (_P * 4)()
        self._dst_stride = (_I * 4)()

    def __del__(self) -> None:
        lib = _LIB
        if lib and self._ctx:
            lib[0].sws_freeContext(self._ctx)

    def convert(self, frame: Any, out: np.ndarray, scaler: dict[str, Any], reference: Any) -> bool:
        """Write ``frame`` as rgb24 into ``out`` (``[H, W, 3]``) with ``reformat`` arguments
        ``scaler``; ``False`` (``out`` untouched) where this path does not cover it.
        ``reference`` is the ``VideoReformatter`` the first frame is checked against."""
        h, w = scaler["height"], scaler["width"]
        fmt = frame.format.name
        full = scaler["src_color_range"] == 2
        key = (fmt, w, h, frame.width, frame.height, scaler["src_colorspace"], full)
        ok = self._ok.get(key)
        if ok is None:
            ok = self._ok[key] = self._check(frame, key, scaler, reference)
        if not ok or out.shape != (h, w, 3) or not out.flags.c_contiguous:
            return False
        if key != self._key and not self._configure(key):
            return False
        self._run(frame, key, out.ctypes.data)
        return True

    def _covered(self, key: tuple[Any, ...]) -> bool:
        fmt, w, h, fw, fh, _, full = key
        plain = fmt == "yuv420p" or (fmt == "yuvj420p" and full)
        return _lib() is not None and plain and (w, h) == (fw, fh) and w % 16 == 0

    def _check(self, frame: Any, key: tuple[Any, ...], scaler: dict[str, Any], ref: Any) -> bool:
        if not self._covered(key) or not self._configure(key):
            return False
        n = key[1] * key[2] * 3
        buf = np.full(n + _GUARD, 0xA5, dtype=np.uint8)
        self._run(frame, key, buf.ctypes.data)
        expect = ref.reformat(frame, **scaler).to_ndarray()
        return bool((buf[n:] == 0xA5).all() and np.array_equal(buf[:n], expect.reshape(-1)))

    def _configure(self, key: tuple[Any, ...]) -> bool:
        sws, fmts = _lib()  # type: ignore[misc]
        fmt, w, h, _, _, colorspace, full = key
        ctx = sws.sws_getCachedContext(
            self._ctx, w, h, fmts[fmt], w, h, fmts["rgb24"], _SWS_BILINEAR, None, None, None
        )
        if not ctx:
            self._ctx = self._key = None
            return False
        self._ctx = ctx
        inv, table = sws.sws_getCoefficients(colorspace), sws.sws_getCoefficients(_SWS_CS_DEFAULT)
        if sws.sws_setColorspaceDetails(ctx, inv, int(full), table, 1, 0, 1 << 16, 1 << 16) < 0:
            self._key = None
            return False
        self._key = key
        return True

    def _run(self, frame: Any, key: tuple[Any, ...], dst: int) -> None:
        src, stride = self._src, self._src_stride
        for i, plane in enumerate(frame.planes):
            src[i], stride[i] = plane.buffer_ptr, plane.line_size
        self._dst[0], self._dst_stride[0] = dst, key[1] * 3
        _lib()[0].sws_scale(self._ctx, src, stride, 0, key[4], self._dst, self._dst_stride)  # type: ignore[index]
