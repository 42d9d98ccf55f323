"""H.264 container files remuxed to treadle's Annex-B stream, bit-exact.

:func:`remux_h264` runs ``h264_mp4toannexb`` over the file's packets (SPS/PPS put in
band before every keyframe that lacks them), takes the stream's colour tags from its SPS
(else the container's), numbers a raw elementary stream's packets by decoding it once,
and indexes the packets (:func:`treadle.video.stream.index_packets`) at the size FFmpeg
decodes its first SPS to (:mod:`treadle.video.geometry`: not always the container's).
:func:`check_decodes` decodes every packet at write time and checks the frames' size,
that none is damaged (a truncated or corrupted picture FFmpeg conceals) and that each
packet gives one picture.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import Any

import av

from treadle.errors import VideoError
from treadle.video.colour_tags import check_matrix, describe, stream_tags
from treadle.video.frame_grid import grid_deviation
from treadle.video.geometry import sps_geometry
from treadle.video.nal import (
    NAL_PPS,
    NAL_SPS,
    avcc_params,
    is_b_slice,
    nal_units,
    parse_sps,
    refreshes_gradually,
)
from treadle.video.stream import EncodedStream, Packet, StreamMeta, frame_rate, index_packets


class NotRemuxable(Exception):
    """The file's packets cannot be stored as they are: it is re-encoded instead."""


class TrimmedByEditList(NotRemuxable):
    """The file's edit list hides some packets: its presented frames are not its packets."""


class LeadingFrames(NotRemuxable):
    """Pictures shown before the first keyframe are decoded after it (an open GOP's I picture
    the file was cut at): they reference pictures the file does not have, and FFmpeg drops
    them, so the packets are not the presented frames."""


class GradualRefresh(NotRemuxable):
    """A keyframe is a recovery point whose pictures are clean only some frames after it
    (intra refresh): a window read from it would get no picture for its first frames."""


def container_fps(stream: Any) -> float:
    """A container stream's frame rate: its average, else the codec's own (an H.264 SPS's
    timing), else the guessed or base rate (else 30). A one-frame MPEG-TS has no average,
    and FFmpeg guesses its field rate (60 for 30 fps): it set the table's fps to that."""
    cc = stream.codec_context
    own = cc.framerate if cc is not None else None
    for rate in (stream.average_rate, own, stream.guessed_rate, stream.base_rate):
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


def remux_h264(container: Any, stream: Any, label: str, fps: float | None) -> EncodedStream:
    try:
        bsf = av.BitStreamFilterContext("h264_mp4toannexb", in_stream=stream)
    except (av.FFmpegError, ValueError) as e:
        raise VideoError(f"video {label}: cannot start h264_mp4toannexb: {e}") from None
    packets: list[Packet] = []
    params: dict[int, bytes] = {}  # latest SPS (7) / PPS (8) units seen
    all_sps: dict[bytes, None] = {}  # every SPS unit, first seen first
    b_slices = False
    damaged: int | None = None  # the first packet the demuxer flags corrupt
    params.update(_extradata_params(stream))

    def take(pkts: Iterable[Any]) -> None:
        nonlocal b_slices
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
                    all_sps.setdefault(u)
            b_slices = b_slices or is_b_slice(units)
            key = bool(q.is_keyframe)
            if key and refreshes_gradually(units):
                raise GradualRefresh
            if key and not {NAL_SPS, NAL_PPS} <= types:
                if {NAL_SPS, NAL_PPS} - params.keys():
                    raise VideoError(f"video {label}: keyframe without SPS/PPS")
                b = b"".join(b"\x00\x00\x00\x01" + params[t] for t in (NAL_SPS, NAL_PPS)) + b
                all_sps.setdefault(params[NAL_SPS])
            packets.append((b, q.pts, q.dts, key))

    for pkt in container.demux(stream):
        if pkt.size == 0:
            continue
        if pkt.is_corrupt and damaged is None:  # a piece lost (a TS packet, a cut-off file)
            damaged = len(packets)
        if pkt.is_discard:
            # One index row per stored packet cannot hide frames that are decoded but
            # not shown, so such files are re-encoded to exactly their presented frames
            # (and so are gradual-refresh streams: the index has no recovery counts).
            raise TrimmedByEditList
        take(bsf.filter(pkt))
    take(bsf.filter(None))
    if _shown_before_first(packets):
        raise LeadingFrames
    meta = _stream_meta(stream, len(packets), list(all_sps), fps, label)
    out = _indexed(packets, meta, label, own_rate=fps is not None, b_slices=b_slices)
    if damaged is not None:  # after the index's checks, whose errors say more
        raise VideoError(
            f"video {label}: its packet {damaged} (decode order) is damaged (the demuxer "
            "flags it corrupt: a piece of the file is missing); cut the file before it, or "
            "re-encode what plays"
        )
    return out


def _shown_before_first(packets: list[Packet]) -> bool:
    """Whether a packet is shown before the first one (decode order), by their times."""
    times = [p for _, p, _, _ in packets]
    if not times or times[0] is None:
        return False
    return any(t is not None and t < times[0] for t in times)


def _stream_meta(
    stream: Any, n: int, all_sps: list[bytes], fps: float | None, label: str
) -> StreamMeta:
    meta = _meta(stream, n, fps or container_fps(stream))
    meta = dataclasses.replace(meta, **_remux_colour(meta, set(all_sps), label))
    if all_sps:  # the size FFmpeg decodes to (a left crop may be kept), not the container's
        (width, height), _ = sps_geometry(all_sps[0], f"video {label}")
        meta = dataclasses.replace(meta, width=width, height=height)
    return meta


def _indexed(
    packets: list[Packet], meta: StreamMeta, label: str, *, own_rate: bool, b_slices: bool
) -> EncodedStream:
    """The packets (decode order) indexed in the order the decoder shows them."""
    if packets and any(p is None for _, p, _, _ in packets):
        # A raw elementary stream has no timestamps: the decoder's output order is the
        # display order, so number the packets in decode order and decode once.
        rank = _display_ranks(packets, label)
        packets = [(b, rank[d], d, k) for d, (b, _, _, k) in enumerate(packets)]
        meta = dataclasses.replace(meta, time_base=1 / frame_rate(meta.fps))
        return index_packets(packets, meta, where=f"video {label}")  # on its grid
    if b_slices and _stamped_in_decode_order(packets):
        packets = _shown_in_decoded_order(packets, label)
    out = index_packets(packets, meta, where=f"video {label}")
    dev = grid_deviation(out.index.pts, meta.time_base, meta.fps, own_rate=own_rate)
    return dataclasses.replace(out, meta=dataclasses.replace(meta, grid_deviation_s=dev))


def _extradata_params(stream: Any) -> dict[int, bytes]:
    """The SPS and PPS of the stream's global header (an avcC record, or Annex-B units as
    NUT keeps them): what a keyframe that carries none decodes with. ``h264_mp4toannexb``
    puts them before IDR pictures only, so a file that starts at an open GOP's I picture
    (cut with ``-c copy`` at a keyframe) has none in band before its first keyframe."""
    extra = bytes(stream.codec_context.extradata or b"") if stream.codec_context else b""
    record = avcc_params(extra)
    units = [u for u in record[1]] if record else [u for _, u in nal_units(extra)]
    out: dict[int, bytes] = {}
    for unit in units:
        t = unit[0] & 0x1F
        if t in (NAL_SPS, NAL_PPS):
            out.setdefault(t, unit)
    return out


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


def _stamped_in_decode_order(packets: list[Packet]) -> bool:
    """Whether the packets' times increase in decode order (no picture reordered)."""
    pts = [p for _, p, _, _ in packets]
    return all(a is not None and b is not None and a < b for a, b in zip(pts, pts[1:]))


def _shown_in_decoded_order(packets: list[Packet], label: str) -> list[Packet]:
    """``packets`` with their times handed out again in the order the decoder shows them.

    A stream with B slices whose times never go back in decode order is stamped in decode
    order (AVI stores no presentation times: FFmpeg stamps its packets as they come), and
    sorting by those times would show every reordered picture at another's place. The
    decoder's output order decides, once, at write; the times stay the file's own (the
    k-th smallest for the k-th picture shown), so its frame rate is measured as before.
    """
    rank = _display_ranks(packets, label)
    times = sorted(int(p) for _, p, _, _ in packets if p is not None)
    return [(b, times[rank[d]], dts, k) for d, (b, _, dts, k) in enumerate(packets)]


def _display_ranks(packets: list[Packet], label: str) -> list[int]:
    """Each packet's (decode order) place in the decoder's output order: one decode pass."""
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
            f"video {label}: H.264 whose order is found by decoding (no presentation times, "
            f"or times in decode order) decodes to {len(shown)} pictures for {len(packets)} "
            "packets"
        )
    rank = [0] * len(packets)
    for i, d in enumerate(shown):
        rank[d] = i
    return rank


def check_decodes(stream: EncodedStream, label: str) -> None:
    """Decode every packet at write time: catches undecodable input, checks that frames
    have the index's size (the SPS reading of :mod:`treadle.video.geometry` against
    FFmpeg's decoder), that none is damaged (FFmpeg conceals a truncated or corrupted
    picture, grey or smeared, and flags it corrupt: a recording cut off, bytes lost or
    changed mid-stream, which a remux stores as they are) and that each packet gives one
    picture (a decoder that drops a damaged one says nothing else)."""
    idx = stream.index
    rank = {int(p): i for i, p in enumerate(idx.pts.tolist())}
    keys = idx.key_decode_positions
    # the first GOP's frames: a later SPS's size change is check_geometry's to name
    first = int(idx.display_of_decode[int(keys[1])]) if len(keys) > 1 else len(idx)
    n = 0
    for f in _decoded(stream, label):
        at: Any = rank.get(f.pts, "?")
        if (at == "?" or at < first) and (f.width, f.height) != (idx.width, idx.height):
            raise VideoError(
                f"video {label}: frame {at} decodes to {f.height}x{f.width} "
                f"(HxW) but treadle reads {idx.height}x{idx.width} from its SPS; re-encode "
                "the file (and report this FFmpeg build: its cropping differs)"
            )
        if f.is_corrupt:
            raise VideoError(
                f"video {label}: frame {at} of {len(idx)} is damaged (FFmpeg "
                "conceals it and flags it corrupt; a truncated file, a recording cut off, bytes "
                "lost mid-stream?): cut the file before it, or re-encode what plays"
            )
        n += 1
    if n == 0:
        raise VideoError(f"video {label}: H.264 stream decodes to no frames")
    if n != len(idx):
        raise VideoError(
            f"video {label}: its {len(idx)} packets decode to {n} pictures (FFmpeg drops a "
            "damaged picture it cannot conceal); re-encode what plays"
        )


def _decoded(stream: EncodedStream, label: str) -> Iterator[Any]:
    """Every frame of the stream, its packets fed in decode order."""
    idx = stream.index
    dod = idx.display_of_decode
    ctx: Any = av.CodecContext.create("h264", "r")
    try:
        for d in range(len(idx)):
            i = int(dod[d])
            o = int(idx.offset[i])
            pkt = av.Packet(stream.data[o : o + int(idx.size[i])])
            pkt.pts = int(idx.pts[i])
            yield from ctx.decode(pkt)
        yield from ctx.decode(None)
    except av.FFmpegError as e:
        raise VideoError(f"video {label}: H.264 stream does not decode: {e}") from None
