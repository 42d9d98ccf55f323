"""Statistics of binary columns of images (cameras, pixel units): Pillow's RGB frames of
sampled rows, each decoded at its own size, counted per channel as video frames are."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from treadle.errors import PlanError
from treadle.plan.image_columns import first_header
from treadle.video.frame_spec import FrameSpec
from treadle.video.image_decode import decode_frame, image_header

if TYPE_CHECKING:
    from treadle.table.table import Table


def first_is_image(table: Table, column: str) -> bool:
    """Whether ``column``'s first value is an 8-bit JPEG/PNG/WebP (a camera to count)."""
    try:
        return not first_header(table, column).depth16  # 16-bit depth: no uint8 histogram
    except PlanError:
        return False


def image_histogram(table: Table, column: str, pick: np.ndarray) -> np.ndarray:
    """``[3, 256]`` counts of the RGB frames (Pillow's) of the images at rows ``pick``, each
    decoded at its own size."""
    hist = np.zeros((3, 256), np.int64)
    for i in range(0, len(pick), 256):
        rows = pick[i : i + 256]
        for r, v in zip(rows.tolist(), table.take(rows, [column]).column(column).to_pylist()):
            where = f"table {table.name!r}, column {column!r}, row {r}"
            head = image_header(v, where) if v is not None else None
            if head is None or head.depth16:
                raise PlanError(f"{where}: {'null' if head is None else 'a 16-bit image'}, "
                                "no RGB statistics")  # fmt: skip
            px = decode_frame(v, FrameSpec(), head, where).reshape(-1, 3)
            hist += np.stack([np.bincount(px[:, ch], minlength=256) for ch in range(3)])
    return hist
