"""Decode a planned window from its fetched bytes, and apply the ``Video`` transform.

Stages, each a plain function: :func:`verify_window` (crc32 per packet),
:func:`decode_window` (bare H.264 codec context, packets cut from the bytes by the
index, warm-up frames dropped, outputs matched by pts, RGB conversion and resize in one
``sws_scale`` per frame, with the stream's own colour tags,
:func:`treadle.video.colour.window_tags`), :func:`finish_window` (layout and float
normalisation, vectorised over the whole window).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import torch
from av.video.reformatter import VideoReformatter

from treadle.errors import CorruptData, VideoError
from treadle.plan.windows import Video
from treadle.video.colour import Tags, sws_color_range, sws_colorspace
from treadle.video.stream import StreamIndex
from treadle.video.window import WindowPlan

#: Scaler used for ``Video(size=...)``: bilinear (FFmpeg's ``SWS_BILINEAR``), rounding as sws does.
RESIZE_INTERPOLATION = "BILINEAR"

_NUMPY_DTYPES = {"uint8": np.uint8, "float32": np.float32, "float16": np.float16}
_TORCH_DTYPES = {
    "uint8": torch.uint8,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def where_text(where: tuple[str, str, str] | str | None) -> str:
    if where is None:
        return "video"
    if isinstance(where, str):
        return where
    table, episode, column = where
    return f"table {table!r} episode {episode!r} column {column!r}"


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
    """

    def __init__(self, threads: int = 1):
        self.threads = threads
        self._ctx: Any = None
        self._stream: object = None
        self._tags: Tags | None = None
        self.reformatter = VideoReformatter()

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
            self._ctx = ctx
        self._stream, self._tags = stream, tags
        return self._ctx

    def reset(self) -> None:
        """Drop the context (after an error its state is unknown)."""
        self._ctx = None


def output_shape(index: StreamIndex, spec: Video, t: int) -> tuple[int, ...]:
    h, w = spec.size if spec.size else (index.height, index.width)
    return (t, h, w, 3) if spec.layout == "THWC" else (t, 3, h, w)


def allocate(index: StreamIndex, spec: Video, t: int) -> np.ndarray | torch.Tensor:
    """A fresh output for a window: numpy, or a torch tensor for ``bfloat16``."""
    shape = output_shape(index, spec, t)
    if spec.dtype == "bfloat16":
        return torch.empty(shape, dtype=torch.bfloat16)
    return np.empty(shape, dtype=_NUMPY_DTYPES[spec.dtype])


def check_out(out: Any, index: StreamIndex, spec: Video, t: int, where: str) -> None:
    shape = output_shape(index, spec, t)
    if isinstance(out, torch.Tensor):
        ok = out.dtype == _TORCH_DTYPES[spec.dtype] and out.device.type == "cpu"
    elif isinstance(out, np.ndarray):
        ok = spec.dtype in _NUMPY_DTYPES and out.dtype == _NUMPY_DTYPES[spec.dtype]
    else:
        raise VideoError(f"{where}: out must be a numpy array or a CPU torch tensor")
    if not ok or tuple(out.shape) != shape:
        raise VideoError(
            f"{where}: out is {tuple(out.shape)} {out.dtype}, the window needs {shape} {spec.dtype}"
        )


def verify_window(
    data: bytes, plan: WindowPlan, index: StreamIndex, where: str, episode_frames: int
) -> None:
    """Check the fetched range's length and every packet's crc32 against the index."""
    if len(data) != plan.nbytes:
        cut = np.flatnonzero(plan.rel_offset + plan.size > len(data))
        frame = int(plan.frames[cut[0]]) if len(cut) else int(plan.frames[-1])
        raise CorruptData(
            f"{where} frame {frame}: stream is truncated (read {len(data)} bytes of the "
            f"{plan.nbytes} the window needs)"
        )
    if index.crc is None:
        return
    view = memoryview(data)
    crc = index.crc
    for i, o, s in zip(plan.frames.tolist(), plan.rel_offset.tolist(), plan.size.tolist()):
        if zlib.crc32(view[o : o + s]) != int(crc[i]):
            raise CorruptData(
                f"{where} frame {i} (of {episode_frames}): packet checksum mismatch "
                "(stored video bytes are corrupt)"
            )


def decode_window(
    decoder: Decoder,
    data: bytes,
    plan: WindowPlan,
    size: tuple[int, int],
    frames_out: np.ndarray,
    where: str,
    tags: Tags,
    stream: object = None,
) -> int:
    """Decode ``plan``'s packets from ``data`` into ``frames_out`` (uint8 ``[T, H, W, 3]``).

    ``size`` is the output (height, width); ``tags`` the stream's (colorspace,
    color_range) to convert with; ``stream`` identifies the stream (see
    :meth:`Decoder.context`). Returns the number of packets decoded.
    """
    slots: dict[int, list[int]] = {}
    for j, p in enumerate(plan.wanted_pts.tolist()):
        slots.setdefault(p, []).append(j)
    h, w = size
    ctx = decoder.context(stream, tags)
    rf = decoder.reformatter
    src_colorspace, src_color_range = sws_colorspace(tags[0]), sws_color_range(tags[1])
    view = memoryview(data)

    def take(frames: list[Any]) -> None:
        for frame in frames:
            js = slots.pop(frame.pts, None)
            if js is None:
                continue  # warm-up frame (before the window in decode or display order)
            rgb = rf.reformat(
                frame,
                width=w,
                height=h,
                format="rgb24",
                src_colorspace=src_colorspace,
                src_color_range=src_color_range,
                interpolation=RESIZE_INTERPOLATION,
                threads=1,
            )
            arr = np.from_dlpack(rgb.planes[0])
            for j in js:
                frames_out[j] = arr

    current = -1
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
    if slots:
        missing = sorted(int(plan.wanted[j]) for js in slots.values() for j in js)
        raise CorruptData(
            f"{where} frame {missing[0]}: decoder produced no picture for frame(s) {missing[:8]}"
        )
    return plan.num_packets


def finish_window(frames_u8: np.ndarray, spec: Video, out: np.ndarray | torch.Tensor) -> None:
    """Write decoded ``uint8 [T, H, W, 3]`` frames into ``out`` with ``spec``'s layout/dtype.

    Float output is ``x / 255``, then ``(x - mean) / std`` per channel when given,
    computed in float32 as ``x * (1 / (255 * std)) - mean / std``.
    """
    src = torch.from_numpy(frames_u8)
    dst = out if isinstance(out, torch.Tensor) else torch.from_numpy(out)
    if spec.layout == "TCHW":
        src = src.permute(0, 3, 1, 2)
    if spec.dtype == "uint8":
        dst.copy_(src)
        return
    mean = torch.tensor(spec.mean or (0.0, 0.0, 0.0), dtype=torch.float64)
    std = torch.tensor(spec.std or (1.0, 1.0, 1.0), dtype=torch.float64)
    scale = (1.0 / (255.0 * std)).to(torch.float32)
    shift = (-mean / std).to(torch.float32)
    if spec.layout == "TCHW":
        scale, shift = scale.view(3, 1, 1), shift.view(3, 1, 1)
    if dst.dtype == torch.float32:
        dst.copy_(src)
        dst.mul_(scale).add_(shift)
    else:
        tmp = src.to(torch.float32)
        tmp.mul_(scale).add_(shift)
        dst.copy_(tmp)


@dataclass
class WindowResult:
    """What one window cost: bytes read and packets decoded."""

    nbytes: int
    packets: int
    frames: int
