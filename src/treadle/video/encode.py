"""Encode raw frames, or remux/re-encode container files, into an :class:`EncodedStream`.

Output: H.264 Annex-B, yuv420p, SPS/PPS before every keyframe. Our own encodes are
tagged BT.601 limited range and use a fixed keyframe interval, closed GOPs and no
B-frames; remuxed H.264 keeps whatever the file had (B-frames, open GOPs, its colour
tags) and the index records it exactly, colour tags included
(:mod:`treadle.video.colour`).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import zlib
from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import Any

import av
import numpy as np
from av.video.frame import PictureType
from av.video.reformatter import VideoReformatter

from treadle.errors import VideoError
from treadle.video.colour import (
    check_matrix,
    describe,
    stream_tags,
    sws_color_range,
    sws_colorspace,
)
from treadle.video.nal import NAL_PPS, NAL_SPS, nal_units, parse_sps
from treadle.video.stream import COLOUR_TAGS, EncodedStream, StreamIndex, StreamMeta
from treadle.video.values import VideoFile, VideoFrames, check_encoder, check_fps, check_frames

_Packet = tuple[bytes, int | None, int | None, bool]  # (bytes, pts, dts, key)


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


ENCODE_THREADS = 1
"""libx264 threads per encode (one, so an encode is a function of its frames alone)."""


def _rate(fps: float) -> Fraction:
    return Fraction(fps).limit_denominator(1001)


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
    rate = _rate(fps)
    ctx: Any = av.CodecContext.create("libx264", "w")
    # One x264 thread: with frame threads (FFmpeg's "auto", or a fixed 2) the same frames
    # encoded on a busy machine gave other bytes (another media key) 1 time in 10-15, and
    # x264's output depends on its thread count, so "auto" also differs between machines.
    # Imports encode episodes in parallel instead.
    ctx.thread_count = ENCODE_THREADS
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.framerate = rate
    ctx.time_base = 1 / rate
    ctx.gop_size = gop
    ctx.max_b_frames = 0
    for name, value in COLOUR_TAGS.items():
        setattr(ctx, name, value)
    params = (
        f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0:open-gop=0:repeat-headers=1:annexb=1"
    )
    ctx.options = {"crf": str(crf), "preset": preset, "x264-params": params}
    packets: list[_Packet] = []
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
    return _build(packets, meta, where="encoded stream")


def _build(packets: list[_Packet], meta: StreamMeta, where: str) -> EncodedStream:
    """Concatenate packets (decode order) and index them in display order."""
    n = len(packets)
    if n == 0:
        raise VideoError(f"{where}: no video frames")
    pts = np.empty(n, dtype=np.int64)
    for i, (_, p, d, _) in enumerate(packets):
        if p is None:
            if d is None:
                raise VideoError(f"{where}: packet {i} has no timestamp")
            p = d
        pts[i] = p
    if len(np.unique(pts)) != n:
        raise VideoError(f"{where}: packets share a presentation timestamp")
    sizes = np.fromiter((len(b) for b, *_ in packets), dtype=np.int64, count=n)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    keys = np.fromiter((k for *_, k in packets), dtype=bool, count=n)
    crcs = np.fromiter((zlib.crc32(b) for b, *_ in packets), dtype=np.uint32, count=n)
    if not keys[0]:
        raise VideoError(f"{where}: the first packet is not a keyframe")
    order = np.argsort(pts, kind="stable")  # display index -> decode position
    index = StreamIndex(
        offset=offsets[order],
        size=sizes[order].astype(np.int32),
        key=keys[order],
        pts=pts[order],
        decode=order.astype(np.int32),
        crc=crcs[order],
        width=meta.width,
        height=meta.height,
        fps=meta.fps,
        codec=meta.codec,
        colorspace=meta.colorspace,
        color_range=meta.color_range,
    )
    index.display_of_decode  # noqa: B018 (validates)
    return EncodedStream(data=b"".join(b for b, *_ in packets), index=index, meta=meta)


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
    hides decoded frames (then it is re-encoded like other codecs). Other codecs are decoded and
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
                result = _remux_h264(container, stream, label, fps)
            except _TrimmedByEditList:
                container.close()
                container = _open(source, label)
                stream = container.streams.video[0]
            else:
                _check_decodes(result, label)
                return result
        if codec is None:
            raise VideoError(f"video {label}: unknown codec")
        return _reencode(container, stream, label, fps=fps, gop=gop, crf=crf, preset=preset)
    except av.FFmpegError as e:
        raise VideoError(f"cannot read video {label}: {e}") from None
    finally:
        container.close()


class _TrimmedByEditList(Exception):
    """The file's edit list hides some packets: its presented frames are not its packets."""


def _open(source: str | os.PathLike[str] | bytes, label: str) -> Any:
    try:
        return av.open(io.BytesIO(source) if isinstance(source, bytes) else os.fspath(source))
    except (av.FFmpegError, OSError, ValueError) as e:
        raise VideoError(f"cannot open video {label}: {e}") from None


def _fps(stream: Any) -> float:
    for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        if rate:
            f = float(rate)
            if math.isfinite(f) and f > 0:
                return f
    return 30.0


def _meta(stream: Any, num_frames: int, fps: float) -> StreamMeta:
    cc = stream.codec_context
    return StreamMeta(
        codec="h264",
        width=int(cc.width),
        height=int(cc.height),
        fps=fps,
        pix_fmt=str(cc.pix_fmt),
        colorspace=int(cc.colorspace),
        color_primaries=int(cc.color_primaries),
        color_trc=int(cc.color_trc),
        color_range=int(cc.color_range),
        num_frames=num_frames,
        time_base=Fraction(stream.time_base) if stream.time_base else Fraction(1, 90000),
    )


def _remux_h264(container: Any, stream: Any, label: str, fps: float | None) -> EncodedStream:
    try:
        bsf = av.BitStreamFilterContext("h264_mp4toannexb", in_stream=stream)
    except (av.FFmpegError, ValueError) as e:
        raise VideoError(f"video {label}: cannot start h264_mp4toannexb: {e}") from None
    packets: list[_Packet] = []
    params: dict[int, bytes] = {}  # latest SPS (7) / PPS (8) units seen
    all_sps: set[bytes] = set()

    def take(pkts: Iterable[Any]) -> None:
        for q in pkts:
            b = bytes(q)
            if not b:
                continue
            units = nal_units(b)
            types = {t for t, _ in units}
            for t, u in units:
                if t in (NAL_SPS, NAL_PPS):
                    params[t] = u
                if t == NAL_SPS:
                    all_sps.add(u)
            key = bool(q.is_keyframe)
            if key and not {NAL_SPS, NAL_PPS} <= types:
                if {NAL_SPS, NAL_PPS} - params.keys():
                    raise VideoError(f"video {label}: keyframe without SPS/PPS")
                b = b"".join(b"\x00\x00\x00\x01" + params[t] for t in (NAL_SPS, NAL_PPS)) + b
            packets.append((b, q.pts, q.dts, key))

    for pkt in container.demux(stream):
        if pkt.size == 0:
            continue
        if pkt.is_discard:
            # One index row per stored packet cannot hide frames that are decoded but
            # not shown, so such files are re-encoded to exactly their presented frames.
            raise _TrimmedByEditList
        take(bsf.filter(pkt))
    take(bsf.filter(None))
    meta = _meta(stream, len(packets), fps or _fps(stream))
    meta = dataclasses.replace(meta, **_remux_colour(meta, all_sps, label))
    if packets and any(p is None for _, p, _, _ in packets):
        # A raw elementary stream has no timestamps: the decoder's output order is the
        # display order, so number the packets in decode order and decode once.
        packets = _timestamps_by_decoding(packets, label)
        meta = dataclasses.replace(meta, time_base=1 / _rate(meta.fps))
    return _build(packets, meta, where=f"video {label}")


def _remux_colour(meta: StreamMeta, sps_units: set[bytes], label: str) -> dict[str, int]:
    """The remuxed stream's colour tags: its SPS's, else the container's (``meta``).

    Every SPS of the stream must give the same conversion (one index entry per episode).
    """
    tags = set()
    for unit in sps_units:
        try:
            sps = parse_sps(unit)
        except (ValueError, IndexError) as e:
            raise VideoError(f"video {label}: unreadable H.264 SPS ({e})") from None
        tags.add(stream_tags(sps, meta.colorspace, meta.color_range))
    for cs, _ in tags or {(meta.colorspace, meta.color_range)}:
        check_matrix(cs, f"video {label}")
    if not tags:
        return {}
    if len({describe(t) for t in tags}) > 1:
        raise VideoError(
            f"video {label}: its SPSs change colour mid-stream "
            f"({sorted(describe(t) for t in tags)}); split the file or re-encode it"
        )
    cs, rng = min(tags)
    return {"colorspace": cs, "color_range": rng}


def _timestamps_by_decoding(packets: list[_Packet], label: str) -> list[_Packet]:
    ctx: Any = av.CodecContext.create("h264", "r")
    shown: list[int] = []
    try:
        for d, (b, _, _, _) in enumerate(packets):
            pkt = av.Packet(b)
            pkt.pts = d
            shown.extend(int(f.pts) for f in ctx.decode(pkt))
        shown.extend(int(f.pts) for f in ctx.decode(None))
    except av.FFmpegError as e:
        raise VideoError(f"video {label}: H.264 stream does not decode: {e}") from None
    if sorted(shown) != list(range(len(packets))):
        raise VideoError(
            f"video {label}: raw H.264 without timestamps decodes to {len(shown)} pictures "
            f"for {len(packets)} packets"
        )
    rank = {d: i for i, d in enumerate(shown)}
    return [(b, rank[d], d, k) for d, (b, _, _, k) in enumerate(packets)]


def _check_decodes(stream: EncodedStream, label: str) -> None:
    """Decode the first GOP: catches undecodable input at write time, cheaply."""
    idx = stream.index
    keys = idx.key_decode_positions
    end = int(keys[1]) if len(keys) > 1 else len(idx)
    ctx: Any = av.CodecContext.create("h264", "r")
    dod = idx.display_of_decode
    got = 0
    try:
        for d in range(end):
            i = int(dod[d])
            o = int(idx.offset[i])
            pkt = av.Packet(stream.data[o : o + int(idx.size[i])])
            pkt.pts = int(idx.pts[i])
            got += len(ctx.decode(pkt))
        got += len(ctx.decode(None))
    except av.FFmpegError as e:
        raise VideoError(f"video {label}: H.264 stream does not decode: {e}") from None
    if got == 0:
        raise VideoError(f"video {label}: H.264 stream decodes to no frames")


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
    cc = stream.codec_context
    width, height = int(cc.width), int(cc.height)
    if width < 2 or height < 2 or width % 2 or height % 2:
        raise VideoError(
            f"video {label}: frame size {height}x{width} (HxW) must be even to re-encode to H.264"
        )
    reformatter = VideoReformatter()

    def yuv() -> Iterator[av.VideoFrame]:
        try:
            for frame in container.decode(stream):
                check_matrix(frame.colorspace, f"video {label}")
                yield reformatter.reformat(
                    frame,
                    width=width,  # a mid-stream size change is scaled to the first size
                    height=height,
                    format="yuv420p",
                    # a fresh decode of the file: its frames carry the file's own tags
                    src_colorspace=sws_colorspace(frame.colorspace),
                    src_color_range=sws_color_range(frame.color_range),
                    dst_colorspace="ITU601",
                    dst_color_range="MPEG",
                    interpolation="BILINEAR",
                    threads=1,
                )
        except av.FFmpegError as e:
            raise VideoError(f"video {label}: cannot decode {cc.name}: {e}") from None

    out = _encode_yuv(
        yuv(), width=width, height=height, fps=fps or _fps(stream), gop=gop, crf=crf, preset=preset
    )
    if out.num_frames == 0:
        raise VideoError(f"video {label}: no frames decoded")
    return out
