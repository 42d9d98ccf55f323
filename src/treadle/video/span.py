"""A span of frames out of a container file that holds many episodes one after the other.

:func:`span_value` is what an importer stores for one episode's camera: the span's packets
copied (:func:`cut_span`) or, where they do not stand alone, its decoded frames
(:func:`decode_span`); a file of its own is checked to have one frame per row.
:func:`cut_span` copies the span's H.264 packets into a small MP4 (bit-exact, no
re-encode) when they decode to exactly the source's frames on their own, and returns None
otherwise; :func:`decode_span` decodes the span's frames (the fallback, any codec).
Spans are ``count`` frames at ``start + k / fps``, matched within ``max(tol, 0.5 / fps)``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import av
import numpy as np

from treadle.errors import CorruptData
from treadle.video.media_open import open_media
from treadle.video.nal import (
    NAL_PPS,
    NAL_SPS,
    avcc_params,
    iter_length_prefixed,
    refreshes_gradually,
)
from treadle.video.values import VideoFile, VideoFrames

#: H.264 reorders at most 16 frames: a span's packets all come within this many frame
#: durations (decode order) after its last frame, and never further than 2 s.
_REORDER_FRAMES = 17


def span_value(
    data: bytes | str,
    span: tuple[float, float] | None,
    ts: np.ndarray,
    fps: float,
    tol: float,
    where: str,
) -> VideoFile | VideoFrames:
    """The video value of an episode's rows shown at ``ts`` (seconds from its start).

    ``span`` is the episode's ``[from, to)`` in a file that holds many episodes (LeRobot
    v3.0): its frames are the ones at ``from + ts`` (within ``max(tol, 0.5 / fps)``),
    their H.264 packets copied where they decode alike on their own (bit-exact), else
    decoded (re-encoded on write). ``span=None``: the file is the episode's own and must
    hold one frame per row. Too few or misplaced frames raise :class:`CorruptData`.
    """
    rows = len(ts)
    if span is None:
        n, _codec = count_frames(data, where)
        if n != rows:
            raise CorruptData(f"{where}: video has {n} frames for the episode's {rows} rows")
        return VideoFile(data, fps=fps)
    start = span[0] + float(ts[0])
    _check_span_end(span, ts, fps, tol, where)
    cut = cut_span(data, start, rows, fps, tol, where)
    if cut is not None:  # packets copied: H.264 stays bit-exact; the rate is the caller's
        return VideoFile(cut, fps=fps)
    return VideoFrames(decode_span(data, start, rows, fps, tol, where), fps=fps)


def _check_span_end(
    span: tuple[float, float], ts: np.ndarray, fps: float, tol: float, where: str
) -> None:
    """The episode's last row is shown within its video span, not in the next episode's
    (LeRobot's own loader would read that frame too, without a word)."""
    last = float(ts[-1])
    at = span[0] + last
    if at - span[1] > max(tol, 0.5 / fps):
        raise CorruptData(
            f"{where}: the episode's last row (row {len(ts) - 1} at {last:.4f}s) is "
            f"shown at {at:.4f}s, after the episode's video span ends (to_timestamp "
            f"{span[1]:.4f}s): its frames would be another episode's"
        )


def decode_span(
    data: bytes | str, start: float, count: int, fps: float, tol: float, where: str
) -> np.ndarray:
    """Decode the ``count`` frames at ``start + k/fps`` from a video (``uint8 [T, H, W, 3]``)."""
    half = max(tol, 0.5 / fps)
    want = start + np.arange(count) / fps
    back = 0.0
    while True:
        out = _decode_from(data, start, want, fps, half, back, where)
        if all(f is not None for f in out) or start - half - back <= 0:
            break
        # a keyframe whose pictures are clean only later (intra refresh): FFmpeg withholds
        # them, so the decode starts from a keyframe further back
        back = max(2 * back, 1.0)
    missing = [k for k, f in enumerate(out) if f is None]
    if missing:
        got = count - len(missing)
        raise CorruptData(
            f"{where}: video has {got} frames for the episode's {count} rows (no frame at "
            f"{want[missing[0]]:.4f}s for row {missing[0]})"
        )
    return np.stack(out)


def _decode_from(
    data: bytes | str,
    start: float,
    want: np.ndarray,
    fps: float,
    half: float,
    back: float,
    where: str,
) -> list[np.ndarray | None]:
    """The frames shown at ``want`` (None where none is), decoded from a keyframe shown at
    least ``back`` seconds before ``start``."""
    count = len(want)
    out: list[np.ndarray | None] = [None] * count
    try:
        with _open(data, where) as c:
            stream = c.streams.video[0]
            stream.thread_type = "AUTO"
            tb = float(stream.time_base)
            packets = _packets_from(c, stream, start - back, half, where)
            for frame in (f for p in packets for f in p.decode()):
                if frame.pts is None:
                    continue
                t = frame.pts * tb
                if t >= want[-1] + half:
                    break
                k = int(round((t - start) * fps))
                if 0 <= k < count and abs(t - want[k]) <= half and out[k] is None:
                    out[k] = frame.to_ndarray(format="rgb24")
    except av.error.FFmpegError as e:
        raise CorruptData(f"{where}: cannot decode video: {e}") from None
    return out


def _packets_from(c: Any, stream: Any, start: float, half: float, where: str) -> Iterator[Any]:
    """The stream's packets in decode order from a keyframe shown no later than ``start``.

    An MP4 seek goes by decode time: with B-frames it can land on a keyframe shown after
    ``start`` (the span then starts on that keyframe's leading pictures, which need the
    GOP before it, or on frames decoded before it). Then seek again 1, 2, 4... s earlier.
    From a keyframe shown at or before ``start`` every frame of the span comes after it
    in decode order and is not one of its leading pictures.
    """
    tb = float(stream.time_base)
    back = 0.0
    while True:
        target = start - half - back
        if target > 0 or back:
            _seek(c, stream, max(target, 0.0), tb, where)
        packets = c.demux(stream)
        first = next((p for p in packets if p.size), None)
        if first is None:
            return
        if target <= 0 or first.pts is None or first.pts * tb - half <= start:
            yield first
            yield from packets
            return
        back = max(2 * back, 1.0)


def cut_span(
    data: bytes | str, start: float, count: int, fps: float, tol: float, where: str
) -> bytes | None:
    """The H.264 packets of ``count`` frames at ``start + k/fps`` as a new MP4, or None.

    None (the caller then decodes the span) when the file is not H.264, when the span's
    first packet in decode order is not a keyframe, when frames of the span are leading
    pictures of that keyframe (open GOP: they reference the GOP before it), when a packet
    the copy would leave out between its first and last (decode order) and shown after
    the span is a reference picture (the span's last B-frames may predict from it: the
    next episode's keyframe or P-frame), or when the copied
    packets do not decode to the source's frames (see :func:`_same_pictures`).
    Raises :class:`CorruptData` when the file has fewer (or misplaced) frames than rows.
    """
    half = max(tol, 0.5 / fps)
    end = start + (count - 1) / fps + half
    horizon = end + max(2.0, _REORDER_FRAMES / fps)
    try:
        with _open(data, where) as c:
            stream = c.streams.video[0]
            if stream.codec_context.name != "h264":
                return None  # re-encoded either way: decoding the span is simpler
            tb = float(stream.time_base)
            seq = []  # the source's packets in decode order, from a keyframe
            for p in _packets_from(c, stream, start, half, where):
                if not p.size:
                    continue
                if p.pts is None:
                    return None  # cannot tell which frame it is: decode instead
                if p.dts is not None and p.dts * tb > horizon:
                    break
                seq.append(p)
            inside = [start - half <= p.pts * tb < end for p in seq]
            idx = [i for i, x in enumerate(inside) if x]
            if not idx:
                return _short(where, 0, count, start)
            first, last = idx[0], idx[-1]
            times = np.sort(np.array([seq[i].pts * tb for i in idx]))
            want = start + np.arange(count) / fps
            if len(times) != count or np.abs(times - want).max() > half:
                return _short(where, len(times), count, start)
            if not seq[first].is_keyframe or min(seq[i].pts for i in idx) < seq[first].pts:
                return None
            payloads = [bytes(seq[i]) for i in idx]
            params = _standalone_params(stream, payloads[0])
            if params is None:
                return None
            payloads[0] = _with_params(payloads[0], *params)
            gap = next((i for i in range(first, last) if not inside[i]), None)
            if gap is None:
                return _mux(stream, [seq[i] for i in idx], payloads)
            top = max(seq[i].pts for i in idx)
            after = (bytes(seq[i]) for i in range(gap, last) if not inside[i] and seq[i].pts > top)
            if any(_is_reference(b, params[0]) for b in after):
                return None  # a copied picture may predict from it: its decode would guess
            if not _same_pictures(stream, seq, inside, payloads, first, gap):
                return None
            return _mux(stream, [seq[i] for i in idx], payloads)
    except av.error.FFmpegError as e:
        raise CorruptData(f"{where}: cannot read video: {e}") from None


def _standalone_params(stream: Any, payload: bytes) -> tuple[int, list[bytes]] | None:
    """The stream's avcC parameters (length size, SPS/PPS units), or None when it has none
    or when ``payload`` (the span's keyframe) refreshes gradually (intra refresh: its first
    pictures need the packets before it)."""
    params = avcc_params(bytes(stream.codec_context.extradata or b""))
    if params is None or refreshes_gradually(list(iter_length_prefixed(payload, params[0]))):
        return None
    return params


def count_frames(data: bytes | str, where: str) -> tuple[int, str]:
    """Video frames (packets) in a file and its codec, without decoding."""
    try:
        with _open(data, where) as c:
            s = c.streams.video[0]
            n = sum(1 for p in c.demux(s) if p.size)
            return n, s.codec_context.name
    except av.error.FFmpegError as e:
        raise CorruptData(f"{where}: cannot read video: {e}") from None


def _open(data: bytes | str, where: str) -> Any:
    return open_media(data, where)


def _seek(c: Any, stream: Any, t: float, tb: float, where: str) -> None:
    try:
        c.seek(int(t / tb), stream=stream, backward=True)
    except OverflowError:
        raise CorruptData(f"{where}: span start {t:.4f}s is beyond any video") from None


def _short(where: str, got: int, count: int, start: float) -> None:
    raise CorruptData(
        f"{where}: video has {got} frames for the episode's {count} rows "
        f"(span starting at {start:.4f}s)"
    )


def _is_reference(payload: bytes, size: int) -> bool:
    """Whether an MP4 sample holds a reference picture (a slice with ``nal_ref_idc != 0``):
    one that later pictures may predict from. Left out of a copy, a picture that used it
    would decode from whatever the decoder puts in its place (memory contents: measured,
    the same copy decoded differently from run to run)."""
    return any(t in (1, 5) and unit[0] & 0x60 for t, unit in iter_length_prefixed(payload, size))


def _same_pictures(
    stream: Any, seq: list[Any], inside: list[bool], payloads: list[bytes], first: int, gap: int
) -> bool:
    """Whether the copied packets decode to the same pictures as the source's packets.

    ``seq[gap]`` is the first source packet (decode order) left out between the span's
    first and last packet: a frame of the next episode that the span's last B-frames may
    reference, or a leading picture of the first keyframe. Up to ``gap`` a decoder sees
    the same packets in both, so it outputs the same pictures; only packets after the gap
    can differ. Both sequences are decoded from ``k``, the last keyframe before the gap
    whose leading pictures (if any) are not in the span, to the span's last packet, and
    every picture of the span decoded there is compared, plane by plane. Starting at
    ``k`` is what the reader does too: a window is decoded from the keyframe before it.
    """
    keys = [i for i in range(first, gap) if seq[i].is_keyframe]
    k = keys.pop()
    while keys and any(inside[j] and seq[j].pts < seq[k].pts for j in range(k + 1, len(seq))):
        k = keys.pop()  # k's leading pictures are in the span: they need the GOP before k
    pos = {i: n for n, i in enumerate(i for i, x in enumerate(inside) if x)}
    last = max(pos)
    source = _decode(stream, [(bytes(seq[i]), seq[i].pts) for i in range(k, last + 1)])
    copied = _decode(
        stream, [(payloads[pos[i]], seq[i].pts) for i in range(k, last + 1) if inside[i]]
    )
    if source is None or copied is None:
        return False
    wanted = [seq[i].pts for i in range(k, last + 1) if inside[i]]
    return all(p in copied and p in source and copied[p] == source[p] for p in wanted)


def _decode(stream: Any, packets: list[tuple[bytes, int]]) -> dict[int, bytes] | None:
    """``{pts: picture bytes}`` from a fresh decoder fed ``packets``; None when it fails."""
    ctx: Any = av.CodecContext.create("h264", "r")
    ctx.extradata = stream.codec_context.extradata
    ctx.thread_count = 1
    out: dict[int, bytes] = {}
    try:
        for payload, pts in [*packets, (b"", None)]:
            pkt = None
            if payload:
                pkt = av.Packet(payload)
                pkt.pts = pts
            for f in ctx.decode(pkt):
                if f.pts is not None:
                    out[int(f.pts)] = f.to_ndarray().tobytes()  # native planes, cropped
    except (av.error.FFmpegError, ValueError):
        return None  # undecodable, or a pixel format without an array view: do not copy
    return out


def _with_params(payload: bytes, size: int, units: list[bytes]) -> bytes:
    """``payload`` (length-prefixed NALs) with the stream's SPS/PPS in front when it lacks them.

    An MP4 keeps SPS/PPS in its header; ``h264_mp4toannexb`` puts them in band only before
    an IDR, so a span that starts on an open-GOP keyframe (non-IDR I) needs them here.
    """
    types = {t for t, _ in iter_length_prefixed(payload, size)}
    if {NAL_SPS, NAL_PPS} <= types:
        return payload
    return b"".join(len(u).to_bytes(size, "big") + u for u in units) + payload


def _mux(stream: Any, packets: list[Any], payloads: list[bytes]) -> bytes:
    base = min(p.pts for p in packets)
    out_buf = io.BytesIO()
    with av.open(out_buf, "w", format="mp4") as out:
        ostream = out.add_stream_from_template(stream)
        for p, payload in zip(packets, payloads):
            q = av.Packet(payload)
            q.pts = p.pts - base
            q.dts = None if p.dts is None else p.dts - base
            q.duration = p.duration
            q.time_base = p.time_base
            q.is_keyframe = p.is_keyframe
            q.stream = ostream
            out.mux(q)
    return out_buf.getvalue()
