"""The frame size FFmpeg decodes an H.264 stream to, read from its SPSs, and the write-time
check that every frame of an episode decodes to the size its index records.

FFmpeg's H.264 decoder applies the SPS's frame cropping (:attr:`Sps.crop`, in luma
samples) with ``av_frame_apply_cropping`` and no ``AV_CODEC_FLAG_UNALIGNED``: a left crop
that would leave a plane's first sample off a 32-byte boundary is lowered until it does
not. For 8-bit 4:2:0, 4:2:2 and monochrome (decoded as 4:2:0) that is the left crop
rounded down to a multiple of 64 luma samples (the rule is on bytes, so 4:4:4 and
deeper samples keep finer crops: 32 for 8-bit 4:4:4 or 10-bit 4:2:0; FFmpeg fails on
any left crop of 4:4:4 above 8 bits). An SPS that crops 2 px on the left decodes 2 px
wider than the standard's picture, with those 2 columns on its left. treadle indexes what FFmpeg decodes (both
read paths decode with it, and so do PyAV, torchvision and LeRobot), so an episode reads
back as a plain PyAV decode of its file; :func:`treadle.video.remux.check_decodes`
confirms the rule on the first GOP of every container file it remuxes.

The rule assumes frame line sizes that are multiples of 32 bytes (FFmpeg's frame pools
on x86-64 and AArch64 builds); the first-GOP decode names any build where it differs.
"""

from __future__ import annotations

import numpy as np

from treadle.errors import VideoError
from treadle.video.image_decode import MAX_PIXELS
from treadle.video.nal import Sps, iter_sps_spans, parse_sps
from treadle.video.stream import EncodedStream


def _ctz(n: int) -> int:
    return (n & -n).bit_length() - 1


def decoded_size(sps: Sps) -> tuple[int, int]:
    """``(width, height)`` of the frames FFmpeg's H.264 decoder outputs for ``sps`` by
    default (see the module docstring). Raises :class:`ValueError` for a crop that
    leaves no picture or that FFmpeg fails to apply."""
    left, right, top, bottom = sps.crop
    if left + right >= sps.coded_width or top + bottom >= sps.coded_height:
        raise ValueError(
            f"its crop (left/right/top/bottom {left}/{right}/{top}/{bottom}) leaves no "
            f"picture of the coded {sps.coded_height}x{sps.coded_width}"
        )
    if left:
        step = 1 if sps.bit_depth <= 8 else 2  # bytes per sample
        # monochrome (0) decodes to 4:2:0 with flat chroma planes unless AV_CODEC_FLAG_GRAY
        shift = 0 if sps.chroma_format_idc == 3 else 1
        offsets = (left * step, (left >> shift) * step)  # each plane's first kept byte
        align = min(_ctz(o) for o in offsets if o)
        if _ctz(left) < align:  # 4:4:4 above 8 bits: av_frame_apply_cropping's AVERROR_BUG
            raise ValueError(
                f"FFmpeg's decoder fails on a left crop ({left}) of {sps.bit_depth}-bit 4:4:4"
            )
        if align < 5:
            left &= ~((1 << (5 + _ctz(left) - align)) - 1)
    return sps.coded_width - left - right, sps.coded_height - top - bottom


def describe_sps(sps: Sps) -> str:
    """The SPS geometry in words (for error messages)."""
    left, right, top, bottom = sps.crop
    return (
        f"coded {sps.coded_height}x{sps.coded_width}, cropped left/right/top/bottom "
        f"{left}/{right}/{top}/{bottom}"
    )


def sps_geometry(unit: bytes, where: str) -> tuple[tuple[int, int], Sps]:
    """``((width, height) FFmpeg decodes, parsed SPS)`` of one SPS unit, or :class:`VideoError`
    (also for a size over :data:`~treadle.video.image_decode.MAX_PIXELS`, before any decode)."""
    try:
        sps = parse_sps(unit)
        size = decoded_size(sps)
    except (ValueError, IndexError) as e:
        raise VideoError(f"{where}: unreadable H.264 SPS ({e})") from None
    check_pixels(size, where)
    return size, sps


def check_pixels(size: tuple[int, int], where: str) -> None:
    """:class:`VideoError` for a frame of ``size`` (width, height) over ``MAX_PIXELS``: a few
    bytes of stream can claim frames that every window would allocate in full."""
    width, height = size
    if width * height > MAX_PIXELS:
        raise VideoError(
            f"{where}: refused, its frames are {height}x{width} (HxW), more than "
            f"{MAX_PIXELS:,} pixels (a possible decompression bomb); scale the video down"
        )


def check_geometry(stream: EncodedStream, where: str) -> None:
    """Every SPS of ``stream`` decodes to the index's size, else :class:`VideoError`
    naming the first frame that would not (``where`` names table, episode and column).

    One regular-expression scan for SPS start codes over the stream (in C) and one SPS
    parse per distinct SPS (at most one per GOP); nothing is decoded.
    """
    idx = stream.index
    want = (int(idx.width), int(idx.height))
    dod = idx.display_of_decode
    starts = np.asarray(idx.offset)[dod]  # packet offsets in decode order: ascending
    seen: dict[bytes, tuple[tuple[int, int], Sps]] = {}
    data = stream.data
    for s, e in iter_sps_spans(data):
        unit = bytes(data[s:e])
        if unit not in seen:
            seen[unit] = sps_geometry(unit, where)
        got, sps = seen[unit]
        if got != want:
            d = max(int(np.searchsorted(starts, s, side="right")) - 1, 0)
            frame = int(dod[d]) if len(dod) else 0
            fix = (
                "an episode's frames must all have one size: split the video where its "
                f"size changes (at frame {frame}) or re-encode it to one size"
                if frame
                else "the index does not describe this stream: build it from the stream"
            )
            said = f"the episode's index says {want[1]}x{want[0]}"
            raise VideoError(
                f"{where}: frame {frame} decodes to {got[1]}x{got[0]} (HxW; its SPS: "
                f"{describe_sps(sps)}), but {said}; {fix}"
            )
