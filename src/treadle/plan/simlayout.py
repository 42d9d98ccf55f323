"""Where a table's rows lie in its objects, for ``treadle simulate`` (:mod:`treadle.plan.simulate`).

A table is read through the chunk cache column by column: each chunked column is a list of
**pages** of consecutive rows, each at a byte offset of one object (a Lance data file), of
``row_bytes`` a row. A row's bytes ``[p + (row - first) * row_bytes, + row_bytes)`` touch
chunks ``k`` of its object (bytes ``[k C, (k+1) C)``), as the loader's
:mod:`treadle.read.chunk_rows` maps them. :meth:`TableBytes.of` lays out a table without
reading it: one column of all its bytes per row (:func:`treadle.plan.shuffle.row_bytes`),
objects of consecutive rows (its fragments, or a stand-in's ``rows_per_object``) from byte 0;
:func:`treadle.read.simpages.page_layout` gives a Lance table's true pages (footers read).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.shuffle import row_bytes

if TYPE_CHECKING:
    from treadle.plan.windows import Windows
    from treadle.table.table import Table

__all__ = ["CHUNK_BITS", "FOOTER_BYTES", "Pages", "TableBytes", "window_rows"]

CHUNK_BITS = 28
"""A chunk id is ``object << CHUNK_BITS | chunk index``."""
FOOTER_BYTES = 64 << 10
"""Lance reads a data file's footer as its last 64 KiB, after a ``HEAD`` for its size."""


@dataclass
class Pages:
    """One chunked column: per page its first row, object (of the table) and byte offset;
    ``column``: its name ("": all of a row's columns, :meth:`TableBytes.of`)."""

    starts: np.ndarray
    objects: np.ndarray
    positions: np.ndarray
    row_bytes: int
    column: str = ""


@dataclass
class TableBytes:
    """One table's chunked columns over its objects (ids from ``first_object`` on)."""

    name: str
    rows: int
    columns: list[Pages]
    object_bytes: np.ndarray  # size of each object
    first_object: int
    manifest_bytes: int = 0  # its manifest's size, where known (a GET and a HEAD)
    keys: list[str] = field(default_factory=list)  # each object's key, where known

    @classmethod
    def of(cls, table: Table, first_object: int) -> TableBytes:
        """Objects of consecutive rows from byte 0, all of a row's bytes in one column."""
        per = getattr(table, "rows_per_object", None)
        n = int(table.num_moments)
        if per is not None:
            counts = np.full(-(-max(n, 1) // int(per)), int(per), np.int64)
            counts[-1] = max(n, 1) - int(per) * (len(counts) - 1)
        else:
            counts = np.asarray([int(f.count_rows()) for f in table.dataset.get_fragments()])
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        rb = row_bytes(table)
        zeros = np.zeros(len(starts), np.int64)
        pages = Pages(starts, np.arange(len(starts), dtype=np.int64), zeros, rb)
        return cls(table.name, n, [pages], counts.astype(np.int64) * rb, first_object)

    @property
    def num_objects(self) -> int:
        return len(self.object_bytes)

    def chunks(self, rows: np.ndarray, chunk: int, columns: list[Pages] | None = None
               ) -> np.ndarray:  # fmt: skip
        """Distinct chunk ids the rows' bytes touch, in every chunked column (or ``columns``)."""
        rows = np.unique(np.clip(rows, 0, max(self.rows - 1, 0)))
        parts = []
        for col in self.columns if columns is None else columns:
            page = np.searchsorted(col.starts, rows, side="right") - 1
            start = col.positions[page] + (rows - col.starts[page]) * col.row_bytes
            first, last = start // chunk, (start + col.row_bytes - 1) // chunk
            count = last - first + 1
            ids = (col.objects[page] + self.first_object).astype(np.int64) << CHUNK_BITS
            base = np.repeat(ids + first, count)
            parts.append(base + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
        return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def window_rows(table: Table, windows: Windows | None, column: str, moments: np.ndarray
                ) -> np.ndarray:  # fmt: skip
    """The rows a reader reads of ``column`` for ``moments``, as
    :func:`treadle.read.chunk_needs.chunked_rows` takes them: offset 0 without windows; with
    windows, a column's own window's offsets (none: a column they do not name is not read),
    a padded window's rows clamped to the moment's episode. ``column`` "" (all of a row's
    columns, :meth:`TableBytes.of`): every window's offsets and 0."""
    specs: list[Any] = [None]  # None: offset 0
    if windows is not None and windows.specs:  # only the columns they name are read
        named = [s for c, s in windows.specs if column in ("", c)]
        specs = [*named, None] if column == "" else named
    parts = [np.empty(0, np.int64)]
    for spec in specs:
        if spec is not None and spec.offsets is None:
            raise PlanError("window offsets in seconds are not converted to frames yet")
        offsets = np.asarray([0] if spec is None else spec.offsets, np.int64)
        rows = moments[:, None] + offsets[None, :]
        if spec is not None and spec.pad:
            episodes = table.episodes()
            starts = np.asarray(episodes.starts, np.int64)
            e = np.searchsorted(starts, moments, side="right") - 1
            last = starts[e] + np.asarray(episodes.lengths, np.int64)[e] - 1
            rows = np.clip(rows, starts[e][:, None], last[:, None])
        parts.append(rows.reshape(-1))
    return np.concatenate(parts)
