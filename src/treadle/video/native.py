"""Decode a window with FFmpeg's own send/receive calls, each wanted frame converted
straight into the batch: no PyAV ``Packet`` or ``VideoFrame`` object per packet or frame.

:class:`NativeLoop` feeds the window's packets, pointing into the fetched bytes (FFmpeg
copies a packet it does not own into a padded buffer of its own, so the bytes that follow
a packet are never read), to the ``AVCodecContext`` of the decoder's PyAV context, and
receives every frame into one reused ``AVFrame``. It does what PyAV's
``CodecContext.decode`` does (an invalid-data error after a packet's first frame ends
that packet's frames; any other error is raised), and converts with the
:class:`~treadle.video.sws.DirectScaler` configurations already checked against
``reformat`` on PyAV frames. A frame of any other configuration raises :class:`Fallback`
before anything of it is written: the caller flushes the context and decodes the window
through PyAV, which checks the new configuration on its first frame.

Where the extension is built, the calls for a whole window are made by one C function
(:mod:`treadle.video.window_loop`), without the GIL; the Python loop below makes the same
calls one ctypes call at a time (where it is not built), and both give the same bytes.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np

from treadle.video import ffmpeg, window_loop
from treadle.video.outputs import WindowOutputs
from treadle.video.sws import DirectScaler
from treadle.video.window_plan import WindowPlan

AVERROR_INVALIDDATA = -0x41444E49


class Fallback(Exception):
    """A frame whose conversion this loop does not cover (not yet checked, or refused)."""


class NativeError(Exception):
    """An FFmpeg call failed: its return code, the call, the packet's display index."""

    def __init__(self, text: str, frame: int):
        super().__init__(text)
        self.frame = frame


class _Target(NamedTuple):
    """Where a window's frames go: the output array (its address, bytes per position), the
    position of each frame, and the conversion into it."""

    out: np.ndarray
    dst0: int
    step: int
    outputs: WindowOutputs
    scaler: dict[str, Any]
    direct: DirectScaler


class NativeLoop:
    """One ``AVPacket`` and one ``AVFrame``, reused window after window (one per thread).

    ``compiled``: the C loop making the same calls (:mod:`treadle.video.window_loop`),
    ``None`` to make them from Python (where the extension was not built)."""

    def __init__(self, api: ffmpeg.Api, compiled: window_loop.CompiledLoop | None = None):
        self.api = api
        self.compiled = compiled
        self._window = window_loop.WindowStruct()
        self._window.own_colorspace[:] = DirectScaler.own_colorspace_table()  # a constant
        self._pkt = api.codec.av_packet_alloc()
        self._frame = api.util.av_frame_alloc()
        if not self._pkt or not self._frame:
            raise MemoryError("av_packet_alloc / av_frame_alloc failed")
        ffmpeg.free_with(self, api.codec.av_packet_free, self._pkt)
        ffmpeg.free_with(self, api.util.av_frame_free, self._frame)
        self._pv = api.PacketView.from_address(self._pkt)
        self._fv = api.FrameView.from_address(self._frame)

    def run(
        self,
        ctx: int,
        data: Any,
        plan: WindowPlan,
        outputs: WindowOutputs,
        out: np.ndarray,
        scaler: dict[str, Any],
        direct: DirectScaler,
    ) -> None:
        """Decode ``plan``'s packets of ``data`` on the context at ``ctx`` into ``out``
        (C-contiguous uint8 ``[T, H, W, 3]``), each output frame where ``outputs`` puts
        it. A wanted frame not of the index's size falls back (PyAV's path names it).
        Raises :class:`Fallback` or :class:`NativeError`; the context is then mid-window
        (the caller flushes or drops it)."""
        src = np.frombuffer(data, np.uint8)  # any buffer; held while FFmpeg reads it
        step = out[0].nbytes if len(out) else 0
        target = _Target(out, out.ctypes.data, step, outputs, scaler, direct)
        if self.compiled is not None:
            self._run_compiled(self.compiled, ctx, src, plan, target)
            return
        base, pv = src.ctypes.data, self._pv
        send = self.api.send_packet
        current = -1
        for k, o, s, p in zip(plan.frames.tolist(), plan.rel_offset.tolist(),
                              plan.size.tolist(), plan.pts.tolist()):  # fmt: skip
            current = k
            pv.data, pv.size, pv.pts = base + o, s, p
            r = send(ctx, self._pkt)
            if r < 0:
                raise NativeError(self._text(r, "avcodec_send_packet"), current)
            self._receive(ctx, target, current)
        r = send(ctx, None)
        if r < 0:
            raise NativeError(self._text(r, "avcodec_send_packet"), -1)
        self._receive(ctx, target, -1)
        self.api.flush_buffers(ctx)

    def _run_compiled(
        self,
        loop: window_loop.CompiledLoop,
        ctx: int,
        src: np.ndarray,
        plan: WindowPlan,
        target: _Target,
    ) -> None:
        """:meth:`run` in one C call (no GIL held while it decodes)."""
        out, _, step, outputs, scaler, direct = target
        w = self._window
        tables = direct.c_tables(scaler, outputs.size_ok, window_loop.MAX_CONFIGS)
        if tables is None:
            raise Fallback("swscale flags not set")
        configs, src_range, src_space = tables
        if not configs:
            raise Fallback("no configuration checked yet")
        packets = [np.ascontiguousarray(a, np.int64) for a in (
            plan.rel_offset, plan.size, plan.pts, plan.frames)]  # fmt: skip
        uniq, slot = window_loop.wanted_tables(plan.wanted_pts)
        taken = np.zeros(len(uniq), np.uint8)
        w.ctx, w.pkt, w.frame = ctx, self._pkt, self._frame
        w.dst, w.sws = direct.c_objects()
        w.base, w.n_packets = src.ctypes.data, len(packets[0])
        w.offset, w.size, w.pts, w.display = (a.ctypes.data for a in packets)
        w.n_wanted, w.wanted_pts, w.wanted_slot = len(uniq), uniq.ctypes.data, slot.ctypes.data
        w.taken, w.out, w.step = taken.ctypes.data, target.dst0, step
        w.out_width, w.out_height, w.rgb24 = scaler["width"], scaler["height"], direct.rgb24
        w.src_color_range, w.src_colorspace = src_range, src_space
        w.n_configs = len(configs)
        for i, (key, mask) in enumerate(configs):
            w.configs[i] = window_loop.ConfigStruct(*key, 0, mask)
        r = loop.run(loop.api_ref, ctypes.byref(w))
        if r == window_loop.FALLBACK:
            raise Fallback("frame configuration not covered")
        if r != window_loop.OK:
            call = window_loop.CALLS[w.error_call]
            raise NativeError(self._text(w.error, call), w.error_frame)
        for p in uniq[taken.astype(bool)].tolist():
            js = outputs.take(p)
            if js is not None:
                outputs.copy_repeats(out, js)

    def _receive(self, ctx: int, target: _Target, current: int) -> None:
        out, dst0, step, outputs, scaler, direct = target
        api, frame, fv = self.api, self._frame, self._fv
        recv, unref = api.receive_frame, api.frame_unref
        got = 0
        while True:
            r = recv(ctx, frame)
            if r == ffmpeg.EAGAIN or r == ffmpeg.EOF:
                return
            if r < 0:
                if r == AVERROR_INVALIDDATA and got:
                    return  # as PyAV: the frames of this packet so far stand
                raise NativeError(self._text(r, "avcodec_receive_frame"), current)
            got += 1
            js = outputs.take(fv.pts)
            if js is None:
                unref(frame)
                continue  # warm-up
            dst = dst0 + js[0] * step
            odd = not outputs.size_ok(fv.width, fv.height)
            if odd or direct.verdict(direct.key(fv, dst, scaler)) is not True:
                unref(frame)
                raise Fallback("frame configuration not covered")
            r = direct.scale(frame, fv, dst, scaler)
            unref(frame)
            if r < 0:
                raise NativeError(self._text(r, "sws_scale_frame"), current)
            outputs.copy_repeats(out, js)

    def _text(self, code: int, call: str) -> str:
        return f"{self.api.error_text(code)} ({call})"
