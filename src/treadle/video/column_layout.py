"""Arrow layout of a video column: one struct per frame (display order).

Fields (see docs/ARCHITECTURE.md): ``stream`` (project-relative media key), ``offset``,
``size`` (the frame's packet in the stream object), ``key``, ``pts``, ``decode``
(decode-order position), ``crc`` (``zlib.crc32`` of the packet), ``width``,
``height``, ``fps``, ``codec``, ``colorspace`` and ``color_range`` (the stream's colour
tags, :mod:`treadle.video.colour_tags`; absent in tables written before treadle recorded
them). The table writer tags the column's field ``{"treadle:kind": "video"}``
(:func:`treadle.table.tensors.is_video`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from treadle.errors import VideoError
from treadle.video.colour_tags import describe, sps_tags
from treadle.video.stream import EncodedStream, StreamIndex

COLOUR_FIELDS = ("colorspace", "color_range")


def video_struct_type() -> pa.StructType:
    """The arrow type of a video column."""
    return pa.struct(
        [
            pa.field("stream", pa.string(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("size", pa.int32(), nullable=False),
            pa.field("key", pa.bool_(), nullable=False),
            pa.field("pts", pa.int64(), nullable=False),
            pa.field("decode", pa.int32(), nullable=False),
            pa.field("crc", pa.uint32()),
            pa.field("width", pa.int32(), nullable=False),
            pa.field("height", pa.int32(), nullable=False),
            pa.field("fps", pa.float64(), nullable=False),
            pa.field("codec", pa.string(), nullable=False),
            pa.field("colorspace", pa.int32()),
            pa.field("color_range", pa.int32()),
        ]
    )


def _legacy_struct_type() -> pa.StructType:
    """The video column type of tables written before colour tags were recorded."""
    return pa.struct([f for f in video_struct_type() if f.name not in COLOUR_FIELDS])


def records_colour(struct: pa.DataType) -> bool:
    """Whether a video column of this arrow type records colour tags (tables written
    before treadle did have no ``colorspace`` / ``color_range`` fields)."""
    return all(struct.get_field_index(f) >= 0 for f in COLOUR_FIELDS)


def index_to_arrow(
    stream_key: str,
    stream: EncodedStream | StreamIndex,
    like: pa.DataType | None = None,
    where: str = "video",
) -> pa.StructArray:
    """One struct per frame, display order, for the episode's rows of a video column.

    ``like`` is the column's type in an existing table: when that table predates colour
    tags, the rows leave them out (the read path then takes them from the stream's SPS),
    and a stream whose recorded tags its SPS does not carry (a container-only tag)
    raises :class:`VideoError` rather than read back with other colours.
    """
    idx = stream.index if isinstance(stream, EncodedStream) else stream
    n = len(idx)
    crc = (
        pa.nulls(n, pa.uint32())
        if idx.crc is None
        else pa.array(np.asarray(idx.crc, np.uint32), pa.uint32())
    )
    struct = video_struct_type()
    if like is not None and like == _legacy_struct_type():
        struct = like
    colour = [
        pa.nulls(n, pa.int32()) if v is None else pa.array(np.full(n, v, np.int32), pa.int32())
        for v in (idx.colorspace, idx.color_range)
    ]
    if not records_colour(struct):
        _check_legacy(stream, stream_key, where)
        colour = []
    return pa.StructArray.from_arrays(
        [
            pa.array([stream_key] * n, pa.string()),
            pa.array(np.asarray(idx.offset, np.int64), pa.int64()),
            pa.array(np.asarray(idx.size, np.int32), pa.int32()),
            pa.array(np.asarray(idx.key, bool), pa.bool_()),
            pa.array(np.asarray(idx.pts, np.int64), pa.int64()),
            pa.array(np.asarray(idx.decode, np.int32), pa.int32()),
            crc,
            pa.array(np.full(n, idx.width, np.int32), pa.int32()),
            pa.array(np.full(n, idx.height, np.int32), pa.int32()),
            pa.array(np.full(n, idx.fps, np.float64), pa.float64()),
            pa.array([idx.codec] * n, pa.string()),
            *colour,
        ],
        fields=list(struct),
    )


def _check_legacy(stream: EncodedStream | StreamIndex, key: str, where: str) -> None:
    idx = stream.index if isinstance(stream, EncodedStream) else stream
    if idx.colorspace is None or idx.color_range is None:
        return
    tags = (idx.colorspace, idx.color_range)
    if not isinstance(stream, EncodedStream):
        raise VideoError(
            f"{where}: the table's video column predates colour tags; pass the EncodedStream "
            f"of {key!r} so its SPS can be checked"
        )
    got = sps_tags(stream.data[: int(idx.size[idx.display_of_decode[0]])], where)
    if describe(got) != describe(tags):
        raise VideoError(
            f"{where}: the table's video column was written before treadle recorded colour "
            f"tags, and stream {key!r} is {describe(tags)} by its container only (its SPS "
            f"says {describe(got)}): it would read back with the wrong colours; write it "
            "to a new table"
        )


def index_from_arrow(array: pa.StructArray | pa.ChunkedArray) -> tuple[str, StreamIndex]:
    """``(stream_key, StreamIndex)`` from one episode's rows of a video column.

    The rows must be the whole episode, in frame order (all of one stream). A null
    ``crc`` anywhere turns checksum verification off for the episode.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not pa.types.is_struct(array.type):
        raise VideoError(f"video column must be a struct array, got {array.type}")
    if len(array) == 0:
        raise VideoError("video index has no rows")
    if array.null_count:
        raise VideoError("video column has null rows (a frame without a stream entry)")

    def col(name: str) -> pa.Array:
        try:
            return array.field(name)
        except KeyError:
            raise VideoError(f"video column lacks field {name!r}") from None

    streams = col("stream")
    first = streams[0].as_py()
    if pc.count_distinct(streams).as_py() != 1:
        raise VideoError("video index rows span more than one stream (pass one episode)")
    crc_col = col("crc")
    crc = None if crc_col.null_count else crc_col
    codec = col("codec")[0].as_py()
    tags = [None, None]
    if records_colour(array.type):
        for k, name in enumerate(COLOUR_FIELDS):
            c = array.field(name)
            tags[k] = None if c.null_count else int(c[0].as_py())
    return first, StreamIndex(
        offset=_compact(col("offset"), np.int64),
        size=_compact(col("size"), np.int32),
        key=_compact(col("key"), np.bool_),
        pts=_compact(col("pts"), np.int64),
        decode=_compact(col("decode"), np.int32),
        crc=None if crc is None else _compact(crc, np.uint32),
        width=int(col("width")[0].as_py()),
        height=int(col("height")[0].as_py()),
        fps=float(col("fps")[0].as_py()),
        codec=str(codec),
        colorspace=tags[0],
        color_range=tags[1],
    )


def _compact(arr: pa.Array, dtype: type) -> np.ndarray:
    """``arr`` as an array that owns its memory (no view keeps the Arrow buffers of the
    rows it came from alive), int64 narrowed to int32 when every value fits: the
    index a reader holds costs ~25 bytes per frame, not the Arrow column's ~200."""
    a = arr.to_numpy(zero_copy_only=False)
    if dtype is np.int64 and len(a) and _I32.min <= a.min() and a.max() <= _I32.max:
        dtype = np.int32
    return np.array(a, dtype=dtype, copy=True)


_I32 = np.iinfo(np.int32)
