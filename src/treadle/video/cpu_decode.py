"""Decode a fetched window on the CPU, and apply its :class:`FrameSpec`.

Stages, each a plain function: :func:`decode_window` (bare H.264 codec context, packets
cut from the bytes by the index, warm-up frames dropped, outputs matched by pts, RGB
conversion and resize in one ``sws_scale_frame`` per frame, with the stream's own colour
tags, :func:`treadle.video.colour_tags.window_tags`; through FFmpeg's own calls,
:class:`~treadle.video.native.NativeLoop`, where every frame's conversion was checked
against PyAV's, else through PyAV's packets and frames), :func:`finish_window` (layout
and float normalisation, vectorised over the whole window); :func:`decode_fetched` runs
both for one :class:`~treadle.video.fetch.FetchedWindow` (fetched and verified by
:mod:`treadle.video.fetch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import av
import numpy as np
from av.video.format import VideoFormat
from av.video.reformatter import ColorRange, Colorspace, Interpolation, VideoReformatter

from treadle.errors import CorruptData, VideoError
from treadle.fastpaths import reasons as fast_path_reasons
from treadle.video import ffmpeg, window_loop
from treadle.video.colour_tags import Tags, sws_color_range, sws_colorspace, window_tags
from treadle.video.encode import probe_stream
from treadle.video.fetch import FetchedWindow
from treadle.video.frame_spec import FrameSpec
from treadle.video.native import Fallback, NativeError, NativeLoop
from treadle.video.outputs import WindowOutputs
from treadle.video.sws import DirectScaler
from treadle.video.window_plan import WindowPlan

if TYPE_CHECKING:
    import torch

#: Scaler used for ``Video(size=...)``: bilinear (FFmpeg's ``SWS_BILINEAR``), rounding as sws does.
RESIZE_INTERPOLATION = "BILINEAR"


class Decoder:
    """One H.264 decoder context and one scaler, reused window after window (one per thread).

    A reused context keeps the previous stream's colour tags and pixel format
    (``yuvj420p`` after a full-range stream) on frames of a stream whose SPS has no
    colour description, and swscale honours the pixel format's range whatever range it
    is told. So when the stream changes, the context's colour is set to the new stream's
    tags, as FFmpeg's demuxer primes a context with a container's tags: a single-threaded
    context takes them in place; a frame-threaded one keeps its state in its worker
    threads' copies, so it is replaced unless the tags are the same as the last stream's
    (a fresh context costs ~1.5 ms at 224x224, its first frame's buffer allocations).
    Frames it covers are converted straight into the batch (:class:`DirectScaler`);
    windows whose frames it covers are decoded by :class:`NativeLoop` on the same context.
    """

    def __init__(self, threads: int = 1):
        self.threads = threads
        self._ctx: Any = None
        self._stream: object = None
        self._tags: Tags | None = None
        self.reformatter = VideoReformatter()
        self.direct = DirectScaler()
        self._api = ffmpeg.api()
        self.native = (
            NativeLoop(self._api, window_loop.load())
            if self._api and self.direct.available
            else None
        )
        self.pointer = 0  # the context's AVCodecContext (for the native loop)

    def context(self, stream: object = None, tags: Tags | None = None) -> Any:
        """The context for a window of ``stream`` (any identity, e.g. its object key;
        ``None``: unknown) whose colour tags are ``tags`` (``None``: unspecified)."""
        tags = tags or (2, 0)
        if self._ctx is not None and (stream is None or stream != self._stream):
            if self.threads == 1:
                self._ctx.colorspace, self._ctx.color_range = tags
            elif tags != self._tags:
                self._ctx = None
        if self._ctx is None:
            ctx: Any = av.CodecContext.create("h264", "r")
            ctx.thread_count = self.threads
            ctx.thread_type = "FRAME" if self.threads != 1 else "SLICE"
            # Stricter bitstream checks, but no "explode": open-GOP leading frames before
            # the first keyframe of a window reference missing pictures by design (they are
            # warm-up and dropped), and "explode" would turn them into errors.
            ctx.options = {"err_detect": "crccheck+bitstream+buffer"}
            ctx.colorspace, ctx.color_range = tags
            ctx.open(strict=False)
            self._ctx = ctx
            self.pointer = self._api.pointer(ctx) if self._api is not None else 0
        self._stream, self._tags = stream, tags
        return self._ctx

    def reset(self) -> None:
        """Drop the context (after an error its state is unknown)."""
        self._ctx = None
        self.pointer = 0

    def can_run_native(self, out: np.ndarray, scaler: dict[str, Any]) -> bool:
        """Whether a window into ``out`` may try the native loop (its checks still apply)."""
        return (
            self.native is not None
            and bool(self.pointer)
            and not self.direct.refuses(scaler)
            and scaler["width"] % 16 == 0
            and out.dtype == np.uint8
            and out.flags.c_contiguous
            and out.flags.writeable
            and out.ctypes.data % 16 == 0
        )


_RGB24 = VideoFormat("rgb24")


def scaler_args(size: tuple[int, int], tags: Tags) -> dict[str, Any]:
    """``reformat`` arguments to rgb24 at ``size`` for a stream of ``tags``, as numbers and
    a format object: PyAV then skips its per-call name lookups (the same conversion)."""
    interpolation: Any = RESIZE_INTERPOLATION
    if isinstance(interpolation, str):
        interpolation = Interpolation[interpolation].value
    return {
        "height": size[0],
        "width": size[1],
        "format": _RGB24,
        "threads": 1,
        "src_colorspace": Colorspace[sws_colorspace(tags[0])].value,
        "src_color_range": ColorRange[sws_color_range(tags[1])].value,
        "interpolation": interpolation,
    }


def direct_conversion_unavailable() -> str | None:
    """Why frames do not convert straight into the batch (:class:`DirectScaler`), or
    ``None``: decodes :func:`~treadle.video.encode.probe_stream` and converts its first
    frame into an aligned 64x64 buffer (the probe of :func:`treadle.info`)."""
    direct = DirectScaler()
    if not direct.available:
        return fast_path_reasons().get("direct conversion") or "no swscale context"
    ctx: Any = av.CodecContext.create("h264", "r")
    frames = [f for p in ctx.parse(probe_stream()) for f in ctx.decode(p)] + ctx.decode(None)
    raw = np.empty(64 * 64 * 3 + 64, np.uint8)
    at = -raw.ctypes.data % 64
    out = raw[at : at + 64 * 64 * 3].reshape(64, 64, 3)
    if not direct.convert(frames[0], out, scaler_args((64, 64), (2, 0)), VideoReformatter()):
        return fast_path_reasons().get("direct conversion") or "a 64x64 frame was refused"
    return None


def decode_window(
    decoder: Decoder,
    data: bytes,
    plan: WindowPlan,
    size: tuple[int, int],
    frames_out: np.ndarray,
    where: str,
    tags: Tags,
    stream: object = None,
    source: tuple[int, int] | None = None,
) -> int:
    """Decode ``plan``'s packets from ``data`` into ``frames_out`` (uint8 ``[T, H, W, 3]``).

    ``size`` is the output (height, width); ``tags`` the stream's (colorspace,
    color_range) to convert with; ``stream`` identifies the stream (see
    :meth:`Decoder.context`); ``source``: the (height, width) the episode's index gives:
    a wanted frame of another size is :class:`CorruptData` (it would be resized silently).
    Returns the number of packets decoded.
    """
    need = (len(plan.wanted), size[0], size[1], 3)
    if frames_out.shape != need:  # the native loop writes frames at this shape's strides
        raise VideoError(f"{where}: frames_out is {frames_out.shape}, the window needs {need}")
    _check_packets(plan, len(data), where)
    ctx = decoder.context(stream, tags)
    scaler = scaler_args(size, tags)
    if decoder.can_run_native(frames_out, scaler):
        if _decode_native(decoder, data, plan, scaler, frames_out, where, source):
            return plan.num_packets
        ctx.flush_buffers()  # and decode it again through PyAV (which checks the frames)
    return _decode_pyav(decoder, ctx, data, plan, scaler, frames_out, where, source)


def _check_packets(plan: WindowPlan, n: int, where: str) -> None:
    """Raise :class:`CorruptData` unless every packet is a non-empty range of the window's
    ``n`` bytes (an index's sizes are not trusted: the native loop hands FFmpeg pointers)."""
    off, size = plan.rel_offset, plan.size
    bad = np.flatnonzero((size <= 0) | (off < 0) | (off + size > n))
    if len(bad):
        k = int(bad[0])
        raise CorruptData(
            f"{where} frame {int(plan.frames[k])}: video index: its packet (window offset "
            f"{int(off[k])}, {int(size[k])} bytes) is empty or outside the window's bytes"
        )


def _decode_native(
    decoder: Decoder,
    data: bytes,
    plan: WindowPlan,
    scaler: dict[str, Any],
    frames_out: np.ndarray,
    where: str,
    source: tuple[int, int] | None,
) -> bool:
    """:func:`decode_window` through :class:`NativeLoop`; ``False``: it fell back (nothing
    raised, the context is mid-window)."""
    outputs = WindowOutputs(plan, where, source)
    loop: Any = decoder.native
    try:
        loop.run(decoder.pointer, data, plan, outputs, frames_out, scaler, decoder.direct)
    except Fallback:
        return False
    except NativeError as e:
        decoder.reset()
        at = f" frame {e.frame}" if e.frame >= 0 else ""
        raise CorruptData(f"{where}{at}: video does not decode ({e})") from None
    except BaseException:
        decoder.reset()
        raise
    outputs.check_complete()
    return True


def _decode_pyav(
    decoder: Decoder,
    ctx: Any,
    data: bytes,
    plan: WindowPlan,
    scaler: dict[str, Any],
    frames_out: np.ndarray,
    where: str,
    source: tuple[int, int] | None,
) -> int:
    """:func:`decode_window` through PyAV's packets and frames."""
    outputs = WindowOutputs(plan, where, source)
    rf, direct = decoder.reformatter, decoder.direct

    def take(frames: list[Any]) -> None:
        for frame in frames:
            js = outputs.take(frame.pts)
            if js is None:
                continue  # warm-up
            outputs.check_size(js, frame.width, frame.height)
            if not direct.convert(frame, frames_out[js[0]], scaler, rf):
                frames_out[js[0]] = rf.reformat(frame, **scaler).to_ndarray()
            outputs.copy_repeats(frames_out, js)

    current = -1
    view = memoryview(data)
    try:
        for k, (o, s, p) in enumerate(
            zip(plan.rel_offset.tolist(), plan.size.tolist(), plan.pts.tolist())
        ):
            current = int(plan.frames[k])
            pkt = av.Packet(view[o : o + s])
            pkt.pts = p
            take(ctx.decode(pkt))
        current = -1
        take(ctx.decode(None))
        ctx.flush_buffers()
    except (av.FFmpegError, ValueError) as e:
        decoder.reset()
        at = f" frame {current}" if current >= 0 else ""
        raise CorruptData(f"{where}{at}: video does not decode ({e})") from None
    except BaseException:
        decoder.reset()
        raise
    outputs.check_complete()
    return plan.num_packets


def finish_window(frames_u8: np.ndarray, spec: Any, out: np.ndarray | torch.Tensor) -> None:
    """Write decoded ``uint8 [T, H, W, 3]`` frames into ``out`` with ``spec``'s layout/dtype.

    ``spec``: a :class:`FrameSpec` or a ``td.Video``. Float output is ``x / 255`` in
    float32, then ``(x - mean) / std`` per channel when given (:meth:`FrameSpec.normalise_`).
    """
    import torch  # only float and TCHW outputs get here: workers of uint8 video need none

    spec = FrameSpec.of(spec)
    src = torch.from_numpy(frames_u8)
    dst = out if isinstance(out, torch.Tensor) else torch.from_numpy(out)
    if spec.layout == "TCHW":
        src = src.permute(0, 3, 1, 2)
    spec.store_(src, dst, 1 if spec.layout == "TCHW" else 3)


def decode_fetched(decoder: Decoder, window: FetchedWindow, out: Any) -> Any:
    """Decode a fetched, verified window into ``out`` (checked by the caller, host memory)."""
    req, plan, data, where = window.request, window.plan, window.data, window.where
    spec = window.frame
    t = len(plan.wanted)
    size = spec.size_for(req.index.height, req.index.width)
    direct = spec.layout == "THWC" and spec.dtype == "uint8"
    if direct:
        frames = out if isinstance(out, np.ndarray) else out.numpy()  # or a CPU tensor
    else:
        frames = np.empty((t, size[0], size[1], 3), dtype=np.uint8)
    tags = window_tags(req.index, data, where)
    source = (req.index.height, req.index.width)
    decode_window(decoder, data, plan, size, frames, where, tags, req.key, source)
    if not direct:
        finish_window(frames, spec, out)
    return out
