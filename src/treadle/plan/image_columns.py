"""``td.Video`` over a binary column of encoded images: what the plan checks before step 0.

The plan reads the column's first value (row 0, or its first image when row 0 is null, as
before a latched ROS camera's message): its signature must be JPEG, PNG or WebP
and its header gives the size every frame has when nothing resizes (and whether the
column is 16-bit). The sizes recorded at write time (:mod:`treadle.table.image_sizes`)
say whether the column holds more than one: without ``size=(H, W)`` that is a
:class:`~treadle.errors.PlanError` naming both sizes and an episode with each. Columns
written before sizes were recorded are checked per frame when read
(:func:`~treadle.video.image_decode.decode_frame`).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from treadle.errors import CorruptData, PlanError
from treadle.table.image_sizes import is_binary, recorded_images
from treadle.video.frame_spec import RAW16, FrameSpec
from treadle.video.image_decode import ImageHeader, image_header, signature

if TYPE_CHECKING:
    from treadle.plan.windows import Video
    from treadle.table.table import Table

# per Lance dataset opened (a version read: a purge's, not the pinned number, which then
# reads other rows) and column. Not by (URI, version): a project deleted and made again at
# its root, or one URL on two servers, has other images at the same URI and version
_headers: weakref.WeakKeyDictionary[Any, dict[str, ImageHeader]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@dataclass(frozen=True)
class ImageColumn:
    """An image column as one component reads it: its first image's header, and the frame
    spec its frames are decoded to (``uint16`` for a 16-bit column read as ``uint8``)."""

    first: ImageHeader
    frame: FrameSpec


def is_image_candidate(field: pa.Field) -> bool:
    """A binary column, which ``td.Video`` may read as images."""
    return is_binary(field.type)


def first_header(table: Table, column: str) -> ImageHeader:
    """The header of the column's first value; :class:`PlanError` naming the column when it
    is not a JPEG/PNG/WebP image."""
    dataset = table.dataset
    with _lock:
        hit = _headers.get(dataset, {}).get(column)
    if hit is not None:
        return hit
    where = f"column {column!r} of table {table.name!r}"
    if table.num_moments == 0:
        raise PlanError(f"{where}: the table is empty, there is no first image to read")
    try:  # not table.take: a purged row 0 (blanked: null) would raise td.Purged
        value = dataset.take([0], columns=[column]).column(column)[0]
    except (OSError, pa.ArrowException) as e:
        raise table.read_error(e, f"reading row 0 of {table!r}") from None
    if not value.is_valid:  # a camera that starts later (a latched ROS topic): its first image
        query = {"columns": [column], "filter": f"{_quoted(column)} IS NOT NULL", "limit": 1}
        found = dataset.scanner(**query).to_table().column(column)
        value = found[0] if len(found) else value
    data = value.as_buffer() if value.is_valid else None
    if data is None or signature(data) is None:
        what = "null" if data is None else repr(bytes(data[:8]))
        raise PlanError(
            f"td.Video over {where}: its first value ({what}...) is not a JPEG, PNG or WebP "
            "image; td.Video reads video columns and binary columns of encoded images"
        )
    try:
        head = image_header(data, f"{where}, row 0")
    except CorruptData as e:
        raise PlanError(f"td.Video over {e}") from None
    with _lock:
        _headers.setdefault(dataset, {})[column] = head
    return head


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def image_column(table: Table, column: str, spec: Video, where: str) -> ImageColumn:
    """Check ``spec`` against the image column and say how it is read; :class:`PlanError`
    naming ``where`` and the column for a column of several sizes read without a resize,
    a 16-bit column read with 3 channels or normalised."""
    first = first_header(table, column)
    name = f"{where}: column {column!r} of table {table.name!r}"
    if first.depth16 and spec.channels != 1:
        raise PlanError(
            f"{name} holds 16-bit images (depth), which are never converted to RGB: give "
            "td.Video(..., channels=1)"
        )
    if first.depth16 and (spec.mean is not None or spec.std is not None):
        raise PlanError(f"{name} holds 16-bit images: mean/std are for 8-bit RGB frames")
    recorded = recorded_images(table.schema).get(column) or {}
    sizes = recorded.get("sizes") or []
    if spec.size is None and (len(sizes) > 1 or recorded.get("more")):
        (w1, h1, e1), (w2, h2, e2) = sizes[0], sizes[1]
        raise PlanError(
            f"{name} holds images of more than one size: {w1}x{h1} (episode {e1!r}) and "
            f"{w2}x{h2} (episode {e2!r}); give td.Video a size=(H, W) to resize them to one"
        )
    frame = spec.frame
    if first.depth16 and frame.dtype == "uint8":
        frame = dataclasses.replace(frame, dtype=RAW16)
    return ImageColumn(first, frame)


def check_video_column(table: Table, column: str, spec: Video, where: str) -> None:
    """Plan-time check of a ``td.Video`` window: a video column with 3 channels, or a
    binary column of images (:func:`image_column`); anything else a :class:`PlanError`."""
    field = table.schema.field(column)
    if column in table.video_columns:
        if spec.channels != 3:
            raise PlanError(
                f"{where}: video column {column!r} of table {table.name!r} is RGB: "
                "channels=1 is for image columns (grey, 16-bit depth)"
            )
        if spec.size is not None and (spec.size[0] % 2 or spec.size[1] % 2):
            raise PlanError(
                f"{where}: video column {column!r} of table {table.name!r} resizes through "
                f"YUV 4:2:0, which needs an even size=(H, W), got {spec.size}"
            )
        return
    if not is_image_candidate(field):
        raise PlanError(
            f"{where}: td.Video window on column {column!r}, which is not a video column of "
            f"table {table.name!r} (video columns: {sorted(table.video_columns)}) nor a "
            "binary column of images; use td.Rows"
        )
    image_column(table, column, spec, where)
