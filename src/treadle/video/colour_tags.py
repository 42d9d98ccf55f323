"""Colour of a stored stream: which YUV->RGB matrix and range each window is converted with.

Two tags decide the conversion, as FFmpeg enum values (what PyAV reports on frames):
``colorspace`` (AVColorSpace, the matrix) and ``color_range`` (AVColorRange). They are
**recorded per episode in the video index** (fields ``colorspace`` / ``color_range``)
when the episode is written, and both read paths (the CPU path's swscale and the GPU
kernel) convert every window with its own stream's tags:

- streams treadle encodes: BT.601 limited (:data:`treadle.video.stream.COLOUR_TAGS`);
- remuxed H.264 (``td.VideoFile``, importers): what a fresh decode of the source file
  reports, i.e. the SPS VUI's matrix when the SPS has a colour description, else the
  container's tag (MP4 ``colr``, MKV colour elements); the SPS's range flag when it has
  a video signal type, else the container's range.

**Untagged streams** (no colour description, no container tag) are converted as **BT.601** (Kr=0.299, Kb=0.114); an
unspecified range is **limited** (Y 16..235, Cb/Cr 16..240). This is FFmpeg's own default,
so an untagged stream reads as ``av.open(file)`` + ``to_ndarray(format="rgb24")`` gives it.
A matrix that is not a BT.601-style Kr/Kb matrix at all (YCgCo, ICtCp, chroma-derived)
is refused when the stream is stored (:func:`check_matrix`), never read with BT.601.

The decoder's frame tags are never trusted across streams: a reused h264 context keeps
the previous stream's colorspace/range (and pixel format ``yuvj420p``) on frames of a
stream whose SPS has no colour description (FACTS.md), so the CPU decoder also sets a
reused context's colour to the new stream's tags when the stream changes
(:class:`treadle.video.cpu_decode.Decoder`).

**Episodes written before colour was recorded** (no ``colorspace`` field in the index,
or null) take their tags from the SPS of the window's first keyframe at read time
(every stored keyframe carries its SPS): exactly what a fresh decode of the stored
stream reports, so they read as they did when read alone. A tag that only the source
*container* carried was not stored and reads as the default.
"""

from __future__ import annotations

from typing import Any

from treadle.errors import CorruptData, VideoError
from treadle.video.nal import Sps, first_sps

#: AVColorSpace / AVColorRange codes used here.
MATRIX_BT709, MATRIX_UNSPECIFIED, MATRIX_BT601 = 1, 2, 6
RANGE_UNSPECIFIED, RANGE_LIMITED, RANGE_FULL = 0, 1, 2

# AVColorSpace -> swscale's name; anything else (unspecified included) is BT.601.
_SWS_MATRIX = {1: "ITU709", 4: "FCC", 7: "SMPTE240M", 9: "BT2020", 10: "BT2020"}

Tags = tuple[int, int]  # (colorspace, color_range)


#: AVColorSpace codes whose YUV is not a Kr/Kb matrix of the kind swscale and the GPU
#: kernel convert (YCgCo 8, SMPTE ST 2085 11, chroma-derived 12/13, ICtCp 14, later
#: ones): converting them as BT.601 would give other colours, so they are refused.
_REFUSED = {8: "YCgCo", 11: "SMPTE ST 2085", 12: "chroma-derived NCL", 13: "chroma-derived CL"}
_REFUSED_FROM = 14  # ICtCp and every later code


def check_matrix(colorspace: int, where: str) -> None:
    """:class:`VideoError` naming ``where`` for a matrix no read path converts."""
    cs = int(colorspace)
    if cs in _REFUSED or cs >= _REFUSED_FROM:
        name = _REFUSED.get(cs, "ICtCp" if cs == _REFUSED_FROM else f"code {cs}")
        raise VideoError(
            f"{where}: its colour matrix is {name} (AVColorSpace {cs}), which treadle does not "
            "convert to RGB (BT.601, BT.709, BT.2020, SMPTE 240M, FCC and untagged streams are); "
            "re-encode it with one of those"
        )


def sws_colorspace(colorspace: int) -> str:
    """swscale's matrix name for an AVColorSpace code (BT.601 when untagged or unknown)."""
    return _SWS_MATRIX.get(int(colorspace), "ITU601")


def sws_color_range(color_range: int) -> str:
    """``JPEG`` (full) for AVCOL_RANGE_JPEG, else ``MPEG`` (limited; unspecified included)."""
    return "JPEG" if int(color_range) == RANGE_FULL else "MPEG"


def stream_tags(sps: Sps | None, colorspace: int = 2, color_range: int = 0) -> Tags:
    """The tags a fresh decode reports: the SPS's where it has them, else the container's.

    ``colorspace`` / ``color_range`` are the container's (demuxer codec parameters);
    without them, unspecified.
    """
    cs, rng = int(colorspace), int(color_range)
    if sps is not None:
        if sps.matrix is not None:
            cs = sps.matrix
        if sps.full_range is not None:
            rng = RANGE_FULL if sps.full_range else RANGE_LIMITED
    return cs, rng


def sps_tags(data: bytes | memoryview, where: str = "video") -> Tags:
    """Tags from the first SPS of Annex-B ``data`` (unspecified when it has none)."""
    try:
        return stream_tags(first_sps(data))
    except (ValueError, IndexError) as e:
        raise CorruptData(f"{where}: unreadable H.264 sequence parameter set ({e})") from None


def window_tags(index: Any, data: bytes | memoryview, where: str = "video") -> Tags:
    """The tags to convert a window with: the index's, else (older episodes) its SPS's."""
    if index.colorspace is not None and index.color_range is not None:
        return int(index.colorspace), int(index.color_range)
    return sps_tags(data, where)


def describe(tags: Tags) -> str:
    """``"BT.709 limited"``-style text for messages."""
    names = {"ITU709": "BT.709", "ITU601": "BT.601", "SMPTE240M": "SMPTE 240M"}
    m = sws_colorspace(tags[0])
    return f"{names.get(m, m)} {'full' if tags[1] == RANGE_FULL else 'limited'} range"
