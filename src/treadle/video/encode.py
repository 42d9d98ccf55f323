"""Encode raw frames, or remux/re-encode container files, into an :class:`EncodedStream`.

Output: H.264 Annex-B, yuv420p, SPS/PPS before every keyframe. Our own encodes are
tagged BT.601 limited range and use a fixed keyframe interval, closed GOPs and no
B-frames; remuxed H.264 keeps whatever the file had (B-frames, open GOPs, its colour
tags) and the index records it exactly, colour tags included
(:mod:`treadle.video.colour_tags`; the remux itself is :mod:`treadle.video.remux`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import Any

import av
import numpy as np
from av.video.frame import PictureType
from av.video.reformatter import VideoReformatter

from treadle.concurrency import CONCURRENCY
from treadle.errors import VideoError
from treadle.video.colour_tags import check_matrix, sws_color_range, sws_colorspace
from treadle.video.frame_grid import grid_deviation
from treadle.video.geometry import check_pixels
from treadle.video.media_open import open_media
from treadle.video.remux import NotRemuxable, check_decodes, container_fps, remux_h264
from treadle.video.stream import (
    COLOUR_TAGS,
    EncodedStream,
    Packet,
    StreamMeta,
    frame_rate,
    index_packets,
)
from treadle.video.values import VideoFile, VideoFrames, check_encoder, check_fps, check_frames
from treadle.video.x264 import x264_params


def encode_value(value: VideoFrames | VideoFile | EncodedStream) -> EncodedStream:
    """Turn a video column value into an :class:`EncodedStream` (the table writer's entry point)."""
    if isinstance(value, EncodedStream):
        return value
    if isinstance(value, VideoFrames):
        return encode_frames(
            value.frames, fps=value.fps, gop=value.gop, crf=value.crf, preset=value.preset
        )
    if isinstance(value, VideoFile):
        return from_container(
            value.source, fps=value.fps, gop=value.gop, crf=value.crf, preset=value.preset
        )
    raise VideoError(
        f"a video column takes td.VideoFrames or td.VideoFile, got {type(value).__name__}"
    )


def encode_frames(
    frames: np.ndarray,
    fps: float = 30.0,
    gop: int = 30,
    crf: int = 23,
    preset: str = "medium",
) -> EncodedStream:
    """Encode RGB ``uint8 [T, H, W, 3]`` frames to H.264 (see module docstring)."""
    frames = check_frames(frames)
    fps = check_fps(fps)
    gop, crf, preset = check_encoder(gop, crf, preset)
    t, h, w, _ = frames.shape
    reformatter = VideoReformatter()

    def yuv() -> Iterator[av.VideoFrame]:
        for i in range(t):
            rgb = av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[i]), format="rgb24")
            yield reformatter.reformat(
                rgb,
                format="yuv420p",
                dst_colorspace="ITU601",
                dst_color_range="MPEG",
                interpolation="BILINEAR",
                threads=1,
            )

    return _encode_yuv(yuv(), width=w, height=h, fps=fps, gop=gop, crf=crf, preset=preset)


def _encode_yuv(
    frames: Iterable[av.VideoFrame],
    *,
    width: int,
    height: int,
    fps: float,
    gop: int,
    crf: int,
    preset: str,
) -> EncodedStream:
    rate = frame_rate(fps)
    ctx: Any = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.framerate = rate
    ctx.time_base = 1 / rate
    ctx.gop_size = gop
    ctx.max_b_frames = 0
    for name, value in COLOUR_TAGS.items():
        setattr(ctx, name, value)
    # a fixed slice-thread count and no AVX-512: the same bytes every time (video/x264.py)
    ctx.thread_type, ctx.thread_count = "SLICE", CONCURRENCY.encode_threads
    params = (
        f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0:open-gop=0:repeat-headers=1:annexb=1"
        + x264_params()
    )
    ctx.options = {"crf": str(crf), "preset": preset, "x264-params": params}
    packets: list[Packet] = []
    n = 0
    try:
        for frame in frames:
            frame.pts = n
            frame.time_base = ctx.time_base  # else PyAV rescales pts from the source's base
            frame.pict_type = PictureType.NONE  # a decoded I picture would force an IDR
            n += 1
            packets.extend((bytes(p), p.pts, p.dts, p.is_keyframe) for p in ctx.encode(frame))
        packets.extend((bytes(p), p.pts, p.dts, p.is_keyframe) for p in ctx.encode(None))
    except av.FFmpegError as e:
        raise VideoError(f"H.264 encode failed: {e}") from None
    if len(packets) != n:
        raise VideoError(f"encoder produced {len(packets)} packets for {n} frames")
    meta = StreamMeta(
        codec="h264",
        width=width,
        height=height,
        fps=float(fps),
        pix_fmt="yuv420p",
        num_frames=n,
        time_base=1 / rate,
        **COLOUR_TAGS,
    )
    return index_packets(packets, meta, where="encoded stream")


# -- containers ------------------------------------------------------------------------


def from_container(
    source: str | os.PathLike[str] | bytes,
    *,
    fps: float | None = None,
    gop: int = 30,
    crf: int = 23,
    preset: str = "medium",
) -> EncodedStream:
    """Read the first video stream of a container file (path or bytes).

    H.264 is remuxed to Annex-B with ``h264_mp4toannexb`` (bit-exact, no re-encode; SPS/PPS
    are inserted before any keyframe that lacks them), except when the file's edit list
    hides decoded frames, its keyframes refresh gradually (intra refresh: clean only some
    frames later) or its first keyframe has pictures shown before it (an open GOP cut at its
    I picture); then it is re-encoded like other codecs. Other codecs are decoded and
    re-encoded to H.264 (``gop``/``crf``/``preset``; timestamps become ``0..N-1`` at the
    stream's average rate). A raw Annex-B ``.h264`` file (no timestamps) is indexed by one
    decode pass. ``fps`` overrides the container's rate (raw streams have none; FFmpeg
    guesses 25). Anything FFmpeg cannot open or decode raises :class:`VideoError`.
    """
    gop, crf, preset = check_encoder(gop, crf, preset)
    fps = None if fps is None else check_fps(fps)
    label = f"<{len(source)} bytes>" if isinstance(source, bytes) else repr(os.fspath(source))
    container = _open(source, label)
    try:
        streams = container.streams.video
        if not streams:
            raise VideoError(f"video {label} has no video stream")
        stream = streams[0]
        codec = stream.codec_context.name if stream.codec_context else None
        if codec == "h264":
            try:
                result = remux_h264(container, stream, label, fps)
            except NotRemuxable:
                container.close()
                container = _open(source, label)
                stream = container.streams.video[0]
            else:
                check_decodes(result, label)
                return result
        if codec is None:
            raise VideoError(f"video {label}: unknown codec")
        return _reencode(container, stream, label, fps=fps, gop=gop, crf=crf, preset=preset)
    except av.FFmpegError as e:
        raise VideoError(f"cannot read video {label}: {e}") from None
    finally:
        container.close()


def _open(source: str | os.PathLike[str] | bytes, label: str) -> Any:
    try:
        return open_media(source, label)
    except (av.FFmpegError, OSError, ValueError) as e:
        raise VideoError(f"cannot open video {label}: {e}") from None


def _reencode(
    container: Any,
    stream: Any,
    label: str,
    *,
    fps: float | None,
    gop: int,
    crf: int,
    preset: str,
) -> EncodedStream:
    frames = _decoded(container, stream, label)
    first = next(frames, None)
    if first is None:
        raise VideoError(f"video {label}: no frames decoded")
    # the size FFmpeg decodes to (a left crop it keeps included), not the container's
    width, height = int(first.width), int(first.height)
    check_pixels((width, height), f"video {label}")
    if width < 2 or height < 2 or width % 2 or height % 2:
        raise VideoError(
            f"video {label}: frame size {height}x{width} (HxW) must be even to re-encode to H.264"
        )
    reformatter = VideoReformatter()

    def yuv() -> Iterator[tuple[int | None, av.VideoFrame]]:
        for n, frame in enumerate(itertools.chain([first], frames)):
            if (frame.width, frame.height) != (width, height):
                raise VideoError(
                    f"video {label}: frame {n} decodes to {frame.height}x{frame.width} (HxW), "
                    f"frame 0 to {height}x{width}: an episode's frames must all have one "
                    f"size; split the video at frame {n} or re-encode it to one size"
                )
            check_matrix(frame.colorspace, f"video {label}")
            yield (
                frame.pts,
                reformatter.reformat(
                    frame,
                    format="yuv420p",
                    # a fresh decode of the file: its frames carry the file's own tags
                    src_colorspace=sws_colorspace(frame.colorspace),
                    src_color_range=sws_color_range(frame.color_range),
                    dst_colorspace="ITU601",
                    dst_color_range="MPEG",
                    interpolation="BILINEAR",
                    threads=1,
                ),
            )

    ticks: list[int] = []  # the source frames' times: re-encoding puts them on the grid
    base = first.time_base or stream.time_base  # before the encoder retimes the frames
    rate = fps or container_fps(stream)
    out = _encode_yuv(
        _timed(yuv(), ticks), width=width, height=height, fps=rate, gop=gop, crf=crf, preset=preset
    )
    dev = 0.0
    if len(ticks) == out.num_frames and base:
        dev = grid_deviation(np.array(ticks), Fraction(base), rate, own_rate=fps is not None)
    return dataclasses.replace(out, meta=dataclasses.replace(out.meta, grid_deviation_s=dev))


def _timed(
    frames: Iterator[tuple[int | None, av.VideoFrame]], ticks: list[int]
) -> Iterator[av.VideoFrame]:
    """``frames`` without their source timestamps, which go to ``ticks`` (none if unknown)."""
    for pts, frame in frames:
        if pts is not None:
            ticks.append(int(pts))
        yield frame


#: Decoders told to fail on damage they would skip silently (see :func:`_decoded`).
_EXPLODE = frozenset({"hevc"})


def _decoded(container: Any, stream: Any, label: str) -> Iterator[av.VideoFrame]:
    """The stream's presented frames, FFmpeg's errors as :class:`VideoError`, and so is a
    packet the demuxer flags corrupt or a frame the decoder does (a truncated file's last
    picture, concealed grey or smeared, would be encoded as if it were the recording), and
    an HEVC picture whose slices do not decode (FFmpeg's decoder drops it unflagged)."""
    n = 0
    if stream.codec_context is not None and stream.codec_context.name in _EXPLODE:
        # FFmpeg's HEVC decoder skips a picture whose slice data is damaged (and those that
        # reference it) without flagging anything: the episode would lose frames mid-stream
        stream.codec_context.options = {"err_detect": "explode"}
    try:
        for packet in container.demux(stream):
            if packet.is_corrupt:
                raise VideoError(
                    f"video {label}: a packet read after {n} frames decoded is damaged (the "
                    "demuxer flags it corrupt: a truncated file, a piece of it missing?)"
                )
            for frame in packet.decode():
                if frame.is_corrupt:
                    raise VideoError(
                        f"video {label}: frame {n} is damaged (FFmpeg conceals it and flags it "
                        "corrupt: a truncated file, a recording cut off?); cut the file before "
                        "it, or re-encode what plays"
                    )
                n += 1
                yield frame
    except av.FFmpegError as e:
        name = stream.codec_context.name if stream.codec_context else "video"
        raise VideoError(f"video {label}: cannot decode {name}: {e}") from None


def probe_stream() -> bytes:
    """A tiny H.264 Annex-B stream (2 frames of 64x64, grey levels 0 and 80), encoded with
    the bundled libx264: what the fast-path probes (:func:`treadle.info`, NVDEC's) decode."""
    ctx: Any = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = 64, 64, "yuv420p"
    ctx.time_base = Fraction(1, 30)
    ctx.options = {"x264-params": "annexb=1:repeat-headers=1:bframes=0"}
    out = b""
    for i in range(2):
        f = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 80 * i, np.uint8), format="rgb24")
        f = f.reformat(format="yuv420p")
        f.pts = i
        out += b"".join(bytes(p) for p in ctx.encode(f))
    return out + b"".join(bytes(p) for p in ctx.encode(None))
