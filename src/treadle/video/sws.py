"""Convert a decoded frame to rgb24 straight into the batch, with PyAV's own libswscale.

PyAV's ``VideoReformatter.reformat`` allocates a new frame per call, which is then
copied into the batch; :class:`DirectScaler` makes the same ``sws_scale_frame`` call
(:mod:`treadle.video.ffmpeg`) with the batch slice as the destination frame. It sets
the two frames' properties as ``reformat`` does: the destination takes the source's
properties (``av_frame_copy_props``), the source's colorspace and range become the
stream's tags, both frames' transfer and primaries are unspecified, and the
destination's colorspace is the source's own read as a swscale colorspace.

It covers a C-contiguous ``uint8 [H, W, 3]`` destination whose rows are a multiple of
16 bytes (``W`` a multiple of 16) at a 16-byte aligned address (``reformat``'s own
frames are that aligned; swscale's SIMD writers store 16 bytes at a time), at any
source size (resizes included). Each configuration (source format, sizes, colour
properties, the destination's address modulo 64) is checked once per thread: its first
frame is converted both ways, into a guarded buffer at the same alignment; unless the
bytes are the same and nothing was written past the frame, it stays on ``reformat``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from treadle import fastpaths
from treadle.video import ffmpeg

_GUARD = 256
_UNSPECIFIED = 2  # AVCOL_TRC_UNSPECIFIED == AVCOL_PRI_UNSPECIFIED
#: swscale colorspace (SWS_CS_*) -> AVColorSpace, as PyAV's reformat maps them
_SWS_TO_AVCOL = {1: 1, 4: 4, 5: 6, 7: 7, 9: 9}

Key = tuple[int, ...]


class DirectScaler:
    """One ``SwsContext`` and one destination ``AVFrame``, converting frames into batch
    slices (one per thread)."""

    def __init__(self) -> None:
        self.api = ffmpeg.api()
        self._ok: dict[Key, bool] = {}
        self._refused: set[Key] = set()  # outputs (see _output) of a configuration refused
        self._sws = self._dst = 0
        self._dst_view: Any = None
        self._rgb24 = self._flags = -1
        if self.api is None:
            why = ffmpeg.unavailable()
            if why is not None:
                fastpaths.off("direct conversion", f"no checked FFmpeg API: {why}")
        else:
            why = self._open(self.api)
            if why is not None:
                fastpaths.off("direct conversion", why)

    def _open(self, api: ffmpeg.Api) -> str | None:
        sws = api.sws.sws_alloc_context()
        if not sws:
            return "sws_alloc_context failed"
        ffmpeg.free_with(self, api.sws.sws_free_context, sws)
        dst = api.util.av_frame_alloc()
        if not dst:
            return "av_frame_alloc failed"
        # the destination's data is the batch's: unref never frees it (it has no buf)
        ffmpeg.free_with(self, api.util.av_frame_free, dst)
        if api.util.av_opt_set_int(sws, b"threads", 1, 0) < 0:
            return "swscale refuses its threads option"
        self._sws, self._dst = sws, dst
        self._dst_view = api.FrameView.from_address(self._dst)
        self._rgb24 = api.pix_fmt(b"rgb24")
        return None

    @property
    def available(self) -> bool:
        return bool(self._sws)

    def key(self, src: Any, dst: int, scaler: dict[str, Any]) -> Key:
        """The configuration of converting the frame viewed by ``src`` (a ``FrameView``)
        into memory at ``dst`` with ``reformat`` arguments ``scaler``."""
        return (
            src.format,
            src.width,
            src.height,
            src.colorspace,
            src.color_range,
            scaler["width"],
            scaler["height"],
            scaler["src_colorspace"],
            scaler["src_color_range"],
            scaler["interpolation"],
            dst % 64,
        )

    @staticmethod
    def _output(scaler: dict[str, Any]) -> Key:
        s = scaler
        return (
            s["width"],
            s["height"],
            s["src_colorspace"],
            s["src_color_range"],
            s["interpolation"],
        )

    def refuses(self, scaler: dict[str, Any]) -> bool:
        """Whether a configuration converting to ``scaler``'s output was refused by its check
        (frames of it will most likely be refused again: callers need not try)."""
        return self._output(scaler) in self._refused

    def verdict(self, key: Key) -> bool | None:
        """Whether ``key`` was checked and gives ``reformat``'s bytes (``None``: unchecked)."""
        return self._ok.get(key)

    def convert(self, frame: Any, out: np.ndarray, scaler: dict[str, Any], reference: Any) -> bool:
        """Write PyAV ``frame`` as rgb24 into ``out`` (``[H, W, 3]``) with ``reformat``
        arguments ``scaler``; ``False`` (``out`` untouched) where this path does not cover
        it. ``reference`` is the ``VideoReformatter`` a first frame is checked against."""
        api = self.api
        if api is None or not self._sws:
            return False
        h, w = scaler["height"], scaler["width"]
        if out.shape != (h, w, 3) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            return False
        if not out.flags.writeable:  # written through its pointer
            return False
        src = api.pointer(frame)
        view = api.FrameView.from_address(src)
        dst = out.ctypes.data
        key = self.key(view, dst, scaler)
        ok = self._ok.get(key)
        if ok is None:
            ok = self._ok[key] = self._check(frame, src, view, key, scaler, reference)
            if not ok:
                self._refused.add(self._output(scaler))
        if not ok:
            return False
        return self.scale(src, view, dst, scaler) >= 0

    def _covered(self, key: Key, scaler: dict[str, Any]) -> bool:
        w = scaler["width"]
        return w % 16 == 0 and key[-1] % 16 == 0

    def _check(
        self, frame: Any, src: int, view: Any, key: Key, scaler: dict[str, Any], ref: Any
    ) -> bool:
        if not self._covered(key, scaler):
            return False
        expect = ref.reformat(frame, **scaler).to_ndarray()
        n = scaler["width"] * scaler["height"] * 3
        raw = np.full(n + _GUARD + 64, 0xA5, dtype=np.uint8)
        at = (key[-1] - raw.ctypes.data) % 64  # the destination's alignment, modulo 64
        buf = raw[at : at + n + _GUARD]
        same = self.scale(src, view, buf.ctypes.data, scaler) >= 0
        same = same and bool(
            (buf[n:] == 0xA5).all() and np.array_equal(buf[:n], expect.reshape(-1))
        )
        if not same:
            fastpaths.off(
                "direct conversion",
                f"converting a {view.width}x{view.height} frame (pixel format {view.format}) to "
                f"{scaler['width']}x{scaler['height']} rgb24 did not give reformat's bytes; "
                "that configuration converts through reformat",
            )
        return same

    @property
    def rgb24(self) -> int:
        return self._rgb24

    def c_objects(self) -> tuple[int, int]:
        """The destination ``AVFrame`` and the ``SwsContext`` (for the compiled loop)."""
        return self._dst, self._sws

    def c_tables(
        self, scaler: dict[str, Any], size_ok: Callable[[int, int], bool], most: int
    ) -> tuple[list[tuple[Key, int]], int, int] | None:
        """What :meth:`scale` decides per frame, as tables for the compiled loop: the checked
        source configurations (format, width, height, colorspace, color_range) converting
        to ``scaler``'s output whose size passes ``size_ok``, each with a bit mask of the
        destination addresses mod 64 it was checked at (the first ``most``: a frame of any
        other falls back to PyAV's path, which is exact); the range and colorspace set on a
        source frame (0 / -1: left as they are). ``None`` when swscale's flags do not set."""
        out = self._output(scaler)
        masks: dict[Key, int] = {}
        for key, ok in self._ok.items():
            if ok and key[5:10] == out and size_ok(key[1], key[2]):
                masks[key[:5]] = masks.get(key[:5], 0) | (1 << key[10])
        if not self._set_flags(scaler["interpolation"]):
            return None
        space = _SWS_TO_AVCOL.get(scaler["src_colorspace"], -1)
        return list(masks.items())[:most], scaler["src_color_range"], space

    @staticmethod
    def own_colorspace_table() -> list[int]:
        """A frame's colorspace -> the destination's (``-1``: left as copied)."""
        return [_SWS_TO_AVCOL.get(c, -1) for c in range(32)]

    def _set_flags(self, interpolation: int) -> bool:
        if interpolation != self._flags:
            assert self.api is not None
            if self.api.util.av_opt_set_int(self._sws, b"sws_flags", interpolation, 0) < 0:
                return False
            self._flags = interpolation
        return True

    def scale(self, src: int, view: Any, dst: int, scaler: dict[str, Any]) -> int:
        """``sws_scale_frame`` of the ``AVFrame`` at ``src`` (``view`` over it) into rgb24
        rows at ``dst``, frame properties set as ``reformat`` sets them (the source's
        are changed: it is about to be released); FFmpeg's return code."""
        api, d = self.api, self._dst_view
        assert api is not None
        api.frame_unref(self._dst)
        api.copy_props(self._dst, src)
        own = _SWS_TO_AVCOL.get(view.colorspace)
        view.color_trc = view.color_primaries = _UNSPECIFIED
        if scaler["src_color_range"]:
            view.color_range = scaler["src_color_range"]
        spc = _SWS_TO_AVCOL.get(scaler["src_colorspace"])
        if spc is not None:
            view.colorspace = spc
        w = scaler["width"]
        d.format, d.width, d.height = self._rgb24, w, scaler["height"]
        d.data0, d.linesize0 = dst, w * 3
        d.color_trc = d.color_primaries = _UNSPECIFIED
        if own is not None:
            d.colorspace = own
        if not self._set_flags(scaler["interpolation"]):
            return -1
        return api.scale_frame(self._sws, self._dst, src)
