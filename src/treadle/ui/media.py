"""An episode's stored H.264 as an MP4, remuxed on the fly (codec copy, never re-encoded).

The stored stream holds Annex-B packets in decode order with SPS/PPS in band; the MP4
muxer (FFmpeg's ``mp4`` through PyAV) turns them into length-prefixed samples with an
``avcC`` header built from the first SPS/PPS. Presentation time is the display index over
the episode's fps (frame ``i`` shows at ``i / fps``, B-frames or not), decode time the
decode position less the reordering delay (negative at the start, which MP4 allows);
``faststart`` puts the index first so a browser plays while it loads. Also: one decoded
frame as PNG (the frame under the cursor: RGB, grey, or 16-bit grey) and HTTP byte ranges over the bytes.
"""

from __future__ import annotations

import os
import re
import tempfile
import zlib
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import av
import numpy as np

from treadle import layout
from treadle.errors import CorruptData, NotFound, UnsafeInput
from treadle.storage.store import RangeRequest
from treadle.video.nal import NAL_PPS, NAL_SPS, iter_nal_units

if TYPE_CHECKING:
    from treadle.storage import Store
    from treadle.table.table import Table

_PACKET_FIELDS = ["stream", "offset", "size", "key", "decode", "width", "height", "fps"]


@dataclass(frozen=True)
class EpisodeVideo:
    """The packets of one episode's video column, in display order."""

    key: str
    offset: np.ndarray
    size: np.ndarray
    keyframe: np.ndarray
    decode: np.ndarray
    width: int
    height: int
    fps: float


def episode_video(table: Table, column: str, start: int, length: int) -> EpisodeVideo:
    """Read the index rows of frames ``start .. start+length`` of ``column`` (one take)."""
    if column not in table.video_columns:
        raise NotFound(f"table {table.name!r} has no video column {column!r}")
    rows = table.take(np.arange(start, start + length, dtype=np.int64), [column])
    values = rows.column(column).combine_chunks()
    arr = {f: values.field(f).to_numpy(zero_copy_only=False) for f in _PACKET_FIELDS}
    keys = set(arr["stream"].tolist())
    if len(keys) != 1:
        raise CorruptData(
            f"table {table.name!r} column {column!r}: the episode at row {start} spans "
            f"{len(keys)} streams; one episode's frames must come from one stream"
        )
    return EpisodeVideo(
        key=layout.under(table.project.prefix, keys.pop()),
        offset=arr["offset"].astype(np.int64),
        size=arr["size"].astype(np.int64),
        keyframe=arr["key"].astype(bool),
        decode=arr["decode"].astype(np.int64),
        width=int(arr["width"][0]),
        height=int(arr["height"][0]),
        fps=float(arr["fps"][0]),
    )


def check_video_size(video: EpisodeVideo, most: int, where: str) -> None:
    """:class:`~treadle.errors.UnsafeInput` naming ``where`` when the stored bytes an
    episode's MP4 is made of (read whole, then kept whole) are over ``most``."""
    span = int((video.offset + video.size).max() - video.offset.min()) if len(video.size) else 0
    if span > most:
        raise UnsafeInput(
            f"{where}: its stored video is {span:,} bytes; the viewer plays at most {most:,} "
            "per episode (its video cache): step through it with the frame under the cursor"
        )


def _packets(store: Store, video: EpisodeVideo) -> list[bytes]:
    """The episode's packets in decode order (one ranged read of their byte span)."""
    start, end = int(video.offset.min()), int((video.offset + video.size).max())
    data = store.get_ranges([RangeRequest(video.key, start, end)])[0]
    order = np.argsort(video.decode, kind="stable")
    return [bytes(data[o - start : o - start + s]) for o, s in
            zip(video.offset[order].tolist(), video.size[order].tolist())]  # fmt: skip


def _extradata(packets: list[bytes]) -> bytes:
    """Annex-B SPS + PPS of the first packet that has them (the muxer builds avcC from it)."""
    for p in packets:
        units = dict.fromkeys(u for t, u in iter_nal_units(p) if t in (NAL_SPS, NAL_PPS))
        if any(u[0] & 0x1F == NAL_SPS for u in units) and any(
            u[0] & 0x1F == NAL_PPS for u in units
        ):
            return b"".join(b"\x00\x00\x00\x01" + u for u in units)
    raise CorruptData("the episode's stream has no SPS/PPS: it cannot be played")


def to_mp4(store: Store, video: EpisodeVideo) -> bytes:
    """The episode as a faststart MP4 of the stored packets (no decode, no encode)."""
    packets = _packets(store, video)
    display = np.empty(len(packets), np.int64)
    order = np.argsort(video.decode, kind="stable")
    display[np.arange(len(order))] = order  # decode position -> display index
    delay = int(max(0, (np.arange(len(order)) - display).max())) if len(order) else 0
    with tempfile.TemporaryDirectory(prefix="treadle-ui-") as tmp:
        path = os.path.join(tmp, "episode.mp4")  # faststart rewrites the file: not a BytesIO
        _mux(path, packets, video, display, delay)
        with open(path, "rb") as f:
            return f.read()


def _mux(path: str, packets: list[bytes], video: EpisodeVideo, display: Any, delay: int) -> None:
    rate = Fraction(video.fps).limit_denominator(1001000)
    with av.open(path, "w", format="mp4", options={"movflags": "faststart"}) as out:
        stream = out.add_stream("h264", rate=rate)
        stream.width, stream.height = video.width, video.height
        stream.codec_context.extradata = _extradata(packets)
        stream.time_base = tick = 1 / rate
        for d, payload in enumerate(packets):
            pkt = av.Packet(payload)
            pkt.stream = stream
            pkt.time_base = tick
            pkt.pts, pkt.dts = int(display[d]), d - delay
            pkt.duration = 1
            pkt.is_keyframe = bool(video.keyframe[display[d]])
            out.mux(pkt)


_RANGE = re.compile(r"\s*bytes\s*=\s*([0-9]*)\s*-\s*([0-9]*)\s*", re.IGNORECASE)


def byte_range(header: str | None, total: int) -> tuple[int, int] | None:
    """``(start, end)`` (end exclusive) of a ``Range: bytes=a-b`` header, None for the whole.

    Raises ValueError for a range that cannot be served or is not one range of decimal
    digits (``bytes=1_0-20`` and ``bytes=+1-2`` are no ranges; the caller answers 416).
    """
    if not header:
        return None
    found = _RANGE.fullmatch(header)
    if not found or not any(found.groups()):
        raise ValueError(header)
    first, last = found.groups()
    if first == "":
        start, end = max(0, total - int(last)), total
    else:
        start = int(first)
        end = min(total, int(last) + 1) if last else total
    if start >= total or start >= end:
        raise ValueError(header)
    return start, end


def png(frame: np.ndarray) -> bytes:
    """A lossless PNG (zlib, no image library) of a frame: ``[H, W, 3]`` uint8 (RGB),
    ``[H, W, 1]`` uint8 (grey) or ``[H, W, 1]`` uint16 (16-bit grey: depth)."""
    h, w, c = frame.shape
    if c not in (1, 3) or frame.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"png: a [H, W, 1 or 3] uint8 or uint16 frame, got {frame.shape} "
                         f"{frame.dtype}")  # fmt: skip
    bits = 16 if frame.dtype == np.uint16 else 8
    rows = np.ascontiguousarray(frame, ">u2" if bits == 16 else np.uint8).reshape(h, -1)
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rows.view(np.uint8)], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    colour = 2 if c == 3 else 0  # truecolour, greyscale
    head = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([bits, colour, 0, 0, 0])
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(raw, 6))
            + chunk(b"IEND", b""))  # fmt: skip
