"""Cameras stored as their own encoded images (JPEG, PNG, WebP; one per moment) in the viewer.

A binary column is a camera when its writes recorded image sizes
(:mod:`treadle.table.image_sizes`) or its first value is a JPEG, PNG or WebP (a column
written before sizes were recorded): what ``td.Video`` decodes. A frame is the stored
bytes' decode by Pillow, the loader's reference decoder
(:func:`~treadle.video.image_decode.decode_frame`): ``uint8 [H, W, 3]`` RGB for an 8-bit
image (grey, palette and RGBA converted as Pillow does), ``uint16 [H, W, 1]`` for a 16-bit
PNG (depth), each at its own size. One frame reads one row; an image over
:data:`MAX_VIEW_PIXELS` is refused before any pixel is decoded.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.errors import NotFound, PlanError, UnsafeInput
from treadle.plan.image_columns import first_header
from treadle.table.image_sizes import is_binary, recorded_images
from treadle.video.frame_spec import FrameSpec
from treadle.video.image_decode import decode_frame, image_header

MAX_VIEW_PIXELS = 1 << 24
"""Pixels (width x height) of the largest image the viewer decodes (16.7 M: 4096 x 4096,
a 50 MB RGB frame); a larger one is refused, naming its size."""


@dataclass(frozen=True)
class ImageCamera:
    """A binary column of encoded images: its format (``"JPEG"``), its size as recorded
    (``"224x224"``, ``"several sizes"``, or the first image's) and whether it is 16-bit."""

    column: str
    format: str
    size: str
    depth16: bool

    @property
    def label(self) -> str:
        """``"jpeg 224x224"``, ``"png 640x480 16-bit"``."""
        return f"{self.format.lower()} {self.size}" + (" 16-bit" if self.depth16 else "")


# per Lance dataset opened (a purge writes a new version in place of a pinned one), not by
# (URI, version): a project deleted and made again at its root has other images there
_found: weakref.WeakKeyDictionary[Any, dict[str, ImageCamera]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def image_cameras(tab: Any) -> dict[str, ImageCamera]:
    """The table's binary columns of images, in schema order (reads row 0 of a binary
    column whose writes recorded nothing; kept per Lance version read, which never changes)."""
    key = tab.dataset
    with _lock:
        hit = _found.get(key)
    if hit is None:
        hit = _find_cameras(tab)
        with _lock:
            _found[key] = hit
    return dict(hit)


def _find_cameras(tab: Any) -> dict[str, ImageCamera]:
    recorded = recorded_images(tab.schema)
    out = {}
    for f in tab.schema:
        if not is_binary(f.type):
            continue
        try:
            first = first_header(tab, f.name)
        except PlanError:  # row 0 null, or not an image
            first = None
        rec = recorded.get(f.name)
        if first is None and rec is None:
            continue
        sizes = (rec or {}).get("sizes") or []
        if len(sizes) > 1 or (rec or {}).get("more"):
            size = "several sizes"
        elif sizes:
            size = f"{sizes[0][0]}x{sizes[0][1]}"
        else:
            size = f"{first.width}x{first.height}" if first else "?"
        fmt = str((rec or {}).get("format") or (first.format if first else "image"))
        out[f.name] = ImageCamera(f.name, fmt, size, bool(first and first.depth16))
    return out


def image_frame(tab: Any, column: str, start: int, length: int, frame: int) -> np.ndarray:
    """Frame ``frame`` of ``column`` in the episode at rows ``start..start+length``: the
    stored image decoded by Pillow (``uint8 [H, W, 3]``, or ``uint16 [H, W, 1]`` for a
    16-bit PNG). NotFound for a column that is no camera, a frame out of range or a null
    image; :class:`~treadle.errors.UnsafeInput` for an image over :data:`MAX_VIEW_PIXELS`."""
    if column not in image_cameras(tab):
        raise NotFound(f"table {tab.name!r} has no video or image column {column!r}")
    if not 0 <= frame < length:
        raise NotFound(f"episode has frames 0..{length - 1}, not frame {frame}")
    row = start + frame
    value = tab.take(np.array([row], np.int64), [column]).column(column)[0]
    where = f"table {tab.name!r} v{tab.version}, column {column!r}, row {row}"
    if not value.is_valid:
        raise NotFound(f"{where}: frame {frame} holds no image (null)")
    data = value.as_buffer()
    head = image_header(data, where)  # CorruptData for what Pillow cannot open
    if head.width * head.height > MAX_VIEW_PIXELS:
        raise UnsafeInput(f"{where}: a {head.width}x{head.height} image; the viewer decodes "
                          f"at most {MAX_VIEW_PIXELS:,} pixels")  # fmt: skip
    return decode_frame(data, FrameSpec(), head, where)  # each image at its own size


def stretched(frame: np.ndarray) -> np.ndarray:
    """A 16-bit frame as 8-bit grey for the eye: its min..max mapped linearly to 0..255
    (an 8-bit frame unchanged)."""
    if frame.dtype != np.uint16:
        return frame
    lo, hi = int(frame.min()), int(frame.max())
    if hi == lo:
        return np.zeros(frame.shape, np.uint8)
    scaled = (frame.astype(np.float64) - lo) * (255.0 / (hi - lo))
    return np.floor(scaled + 0.5).astype(np.uint8)
