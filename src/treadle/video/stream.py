"""An encoded H.264 stream and its per-frame index.

The stream bytes hold packets (access units) in **decode order**, Annex-B framed,
with SPS/PPS in-band before every keyframe, so any byte range that starts at a
keyframe decodes on its own. The index has one entry per frame in **display
order**: entry ``i`` describes the packet that decodes to display frame ``i``
(:func:`index_packets` builds both from packets in decode order).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np

from treadle import layout
from treadle.errors import VideoError

#: Colour tags of streams treadle encodes: BT.601 (SMPTE 170M) matrix, primaries and
#: transfer, limited ("tv"/MPEG) range, i.e. Kr=0.299, Kb=0.114, Y in 16..235 and Cb/Cr in
#: 16..240: R = 1.164(Y-16) + 1.596(Cr-128), G = 1.164(Y-16) - 0.392(Cb-128) - 0.813(Cr-128),
#: B = 1.164(Y-16) + 2.017(Cb-128). Other streams keep their own tags, recorded in the
#: index; both read paths convert each window with its stream's tags
#: (:mod:`treadle.video.colour_tags`, which also documents the default for untagged streams).
COLOUR_TAGS = {"colorspace": 6, "color_primaries": 6, "color_trc": 6, "color_range": 1}


@dataclass(frozen=True)
class StreamMeta:
    """Per-stream facts: codec, size, rate, pixel format, colour tags (FFmpeg enum values)
    and how far the frames' times are off the constant-rate grid at ``fps``."""

    codec: str
    width: int
    height: int
    fps: float
    pix_fmt: str
    colorspace: int
    color_primaries: int
    color_trc: int
    color_range: int
    num_frames: int
    time_base: Fraction
    #: seconds the frame times are off the ``fps`` grid (:mod:`treadle.video.frame_grid`)
    grid_deviation_s: float = 0.0


@dataclass(frozen=True, eq=False)
class StreamIndex:
    """Per-frame index of one stream, all arrays in display order (length = frames).

    ``offset``/``size``: the frame's packet in the stream bytes; ``key``: the packet starts
    a GOP (decodable alone); ``pts``: presentation timestamp (strictly increasing);
    ``decode``: the packet's position in decode order; ``crc``: ``zlib.crc32`` of the
    packet bytes, or ``None`` when not recorded (then corruption is caught only by the
    decoder). ``colorspace`` / ``color_range``: the stream's colour tags (FFmpeg
    AVColorSpace / AVColorRange codes, see :mod:`treadle.video.colour_tags`), ``None`` for
    episodes written before treadle recorded them (then the window's SPS decides).
    """

    offset: np.ndarray  # int64 (int32 when every value fits, as read from a table)
    size: np.ndarray  # int32
    key: np.ndarray  # bool
    pts: np.ndarray  # int64 (likewise)
    decode: np.ndarray  # int32
    crc: np.ndarray | None  # uint32
    width: int
    height: int
    fps: float
    codec: str = "h264"
    colorspace: int | None = None
    color_range: int | None = None

    def __post_init__(self) -> None:
        n = len(self.offset)
        arrays = [self.size, self.key, self.pts, self.decode]
        if self.crc is not None:
            arrays.append(self.crc)
        if any(len(a) != n for a in arrays):
            raise VideoError("video index arrays have different lengths")
        if n == 0:
            raise VideoError("video index is empty")

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def num_frames(self) -> int:
        return len(self.offset)

    @cached_property
    def extent(self) -> int:
        """Bytes of the stream its packets span (the end of its last packet)."""
        if len(self.offset) == 0:
            return 0
        return int((np.asarray(self.offset, np.int64) + np.asarray(self.size, np.int64)).max())

    @cached_property
    def display_of_decode(self) -> np.ndarray:
        """``display_of_decode[d]`` = display index of the packet at decode position ``d``."""
        n = len(self)
        dec = np.asarray(self.decode, dtype=np.int64)
        if dec.min() < 0 or dec.max() >= n:
            raise VideoError("video index: decode positions out of range")
        out = np.full(n, -1, dtype=np.int32)  # n < 2**31: half the bytes a reader holds
        out[dec] = np.arange(n, dtype=np.int32)
        if (out < 0).any():
            raise VideoError("video index: decode positions are not a permutation")
        if not self.key[out[0]]:
            raise VideoError("video index: the first packet in decode order is not a keyframe")
        if n > 1 and not (np.diff(self.pts) > 0).all():
            raise VideoError("video index: pts are not strictly increasing in display order")
        return out

    @cached_property
    def key_decode_positions(self) -> np.ndarray:
        """Sorted decode positions of the keyframes."""
        self.display_of_decode  # noqa: B018 (validates)
        return np.sort(np.asarray(self.decode[self.key], dtype=np.int64))


@dataclass(frozen=True, eq=False)
class EncodedStream:
    """Annex-B H.264 bytes (packets in decode order), their index and stream metadata."""

    data: bytes
    index: StreamIndex
    meta: StreamMeta

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def media_key(self, table: str) -> str:
        """Project-relative object key for this stream: ``media/<table>/<sha256>.h264``."""
        return layout.media_key(table, self.sha256)

    @property
    def num_frames(self) -> int:
        return self.index.num_frames


#: One packet of a stream being built: (bytes, pts, dts, keyframe).
Packet = tuple[bytes, int | None, int | None, bool]


def frame_rate(fps: float) -> Fraction:
    """``fps`` as a fraction (NTSC rates exactly: 30000/1001)."""
    return Fraction(fps).limit_denominator(1001)


def _check_keyframes_follow(pts: np.ndarray, keys: np.ndarray, where: str) -> None:
    """Every packet decoded before a keyframe is shown before it (``pts``, ``keys`` in
    decode order), else :class:`VideoError`: display order by timestamps would interleave
    the pictures of two recordings joined in one file (concatenated ``.ts`` files whose
    timestamps restart), where a decoder shows one after the other."""
    at = np.flatnonzero(keys)[1:]
    if not len(at):
        return
    before = np.maximum.accumulate(pts)[at - 1]
    back = at[before >= pts[at]]
    if len(back):
        d = int(back[0])
        raise VideoError(
            f"{where}: timestamps go back at the keyframe {d} packets in (decode order): it "
            f"is shown at {int(pts[d])}, before packets decoded ahead of it (up to "
            f"{int(before[at == d][0])}); the file joins recordings whose timestamps restart "
            "(concatenated .ts files?): split it there, or remux it with continuous timestamps"
        )


def index_packets(packets: list[Packet], meta: StreamMeta, where: str) -> EncodedStream:
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
    _check_keyframes_follow(pts, keys, where)
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
