"""What a write records of its own rows in a table's schema metadata, taken together.

Three records travel with every Lance version: the image sizes of image columns
(:mod:`~treadle.table.image_sizes`), the columns a write put a null in
(:mod:`~treadle.table.null_columns`) and the video columns whose frames are not shown on
the fps grid (:mod:`~treadle.table.off_grid`). Where rows written apart meet (a distributed
import's processes, a transaction rebased on a newer version, a merge of two branches),
both sides' records are kept (:func:`merge_records`); schemas staged apart are compared
without them (:func:`without_records`). A fourth record joins here, once.
"""

from __future__ import annotations

import pyarrow as pa

from treadle.table.image_sizes import merge_images, without_images
from treadle.table.null_columns import NULLS_KEY, merge_nulls
from treadle.table.off_grid import OFF_GRID_KEY, merge_off_grid

__all__ = ["merge_records", "without_records"]


def merge_records(schema: pa.Schema, other: pa.Schema) -> pa.Schema:
    """``schema`` keeping what ``other`` recorded of its rows too (every record)."""
    return merge_off_grid(merge_nulls(merge_images(schema, other), other), other)


def without_records(schema: pa.Schema) -> pa.Schema:
    """``schema`` without any record of its rows (to compare schemas staged apart)."""
    schema = without_images(schema)  # the image fields' hints too
    meta = dict(schema.metadata or {})
    if not {NULLS_KEY, OFF_GRID_KEY} & meta.keys():
        return schema
    meta = {k: v for k, v in meta.items() if k not in (NULLS_KEY, OFF_GRID_KEY)}
    return schema.with_metadata(meta) if meta else schema.remove_metadata()
