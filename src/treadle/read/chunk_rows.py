"""Rows of wide fixed-width columns read from the chunk store (:mod:`treadle.storage.chunkstore`).

Past the object cache's bound, a table's data files are not copied whole; a loader with
``lookahead`` (:mod:`treadle.read.lookahead`) fetches the chunks that the next steps' rows
need instead. Such a row is ``row_bytes`` at a known offset of its data file: the page layout
:mod:`treadle.read.fixed` maps (Lance's plain full-zip pages), read from the file's footer on
the object store without copying the file. :class:`ChunkedColumn` gives each row's byte range
and reads rows whose chunks are present; :class:`~treadle.read.fixed.FixedReader` takes the
others with Lance, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle import fastpaths
from treadle.storage.chunkstore import ChunkStore, ObjectChunks

if TYPE_CHECKING:
    from treadle.table.table import Table

__all__ = ["ChunkedColumn", "chunked_column", "chunked_path"]


@dataclass
class ChunkedColumn:
    """Where each row of one column of a pinned table lies: pages of consecutive rows."""

    starts: np.ndarray  # first row of each page
    objects: list[ObjectChunks]  # the data file of each page
    positions: np.ndarray  # byte offset of each page in its data file
    dtype: np.dtype
    shape: tuple[int, ...]
    store: Any  # the table's Store
    chunks: ChunkStore

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def ranges(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: its page and the byte offset of the row in that page's data file."""
        page = np.searchsorted(self.starts, rows, side="right") - 1
        return page, self.positions[page] + (rows - self.starts[page]) * self.row_bytes

    def chunk_ids(self, rows: np.ndarray) -> dict[int, np.ndarray]:
        """Per page's data file (index into :attr:`objects`), the distinct chunks ``rows``
        touch."""
        page, start = self.ranges(np.unique(rows))
        size = self.chunks.chunk_bytes
        out: dict[int, list[np.ndarray]] = {}
        for p in np.unique(page).tolist():
            s = start[page == p]
            first, last = s // size, (s + self.row_bytes - 1) // size
            out.setdefault(p, []).append(np.concatenate([first, last]))
        return {p: np.unique(np.concatenate(v)) for p, v in out.items()}

    def read_or_take(self, rows: np.ndarray, take: Callable[[np.ndarray], np.ndarray]
                     ) -> np.ndarray:  # fmt: skip
        """Values of ``rows``: from present chunks, the others by ``take`` (a Lance take)."""
        out, found = self.read(rows)
        self.chunks.stats.rows_read += int(found.sum())
        if not found.all():
            missing = np.flatnonzero(~found)
            out[missing] = take(rows[missing])
            self.chunks.stats.rows_taken += len(missing)
        return out

    def read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(values [rows, *shape], found)``: rows whose chunks are present are filled and
        marked found; the others are left for a Lance take."""
        out = np.empty((len(rows), *self.shape), self.dtype)
        found = np.zeros(len(rows), bool)
        page, start = self.ranges(rows)
        n = self.row_bytes
        for i in range(len(rows)):
            got = self.chunks.read(self.objects[page[i]], int(start[i]), int(start[i]) + n)
            if got is not None:
                out[i] = np.frombuffer(got, self.dtype).reshape(self.shape)
                found[i] = True
        return out, found


def chunked_column(table: Table, f: pa.Field, dtype: np.dtype, shape: tuple[int, ...],
                   chunks: ChunkStore, layout: tuple[Callable[..., Any], ...]
                   ) -> ChunkedColumn | str:  # fmt: skip
    """The pages of column ``f`` of ``table`` (on an object store), from each data file's
    footer; or why its rows cannot be read from chunks. ``layout``: the fixed reader's
    ``(data file of a fragment, span of a page)``, so both read Lance's layout alike."""
    from lance.file import LanceFileReader

    _data_file, page_span = layout

    store = table.project.store
    ds = table.dataset
    field_id = ds.lance_schema.field(f.name).id()
    starts, objects, positions, at = [], [], [], 0
    size = math.prod(shape)
    for frag in ds.get_fragments():
        df = _data_file(frag.metadata, field_id)
        if df is None:
            return "a fragment has deleted rows or the column over several files"
        uri = f"{table.uri}/data/{df.path}"
        key = store.relative_key(uri)
        nbytes = int(getattr(df, "file_size_bytes", 0) or store.size(key))
        column = list(df.column_indices)[list(df.fields).index(field_id)]
        try:
            meta = LanceFileReader(uri, storage_options=store.lance_options).metadata()
        except (OSError, ValueError, RuntimeError) as e:
            return f"a data file's footer could not be read ({type(e).__name__}: {e})"
        obj = chunks.object(store, key, nbytes)
        for page in meta.columns[column].pages:
            span = page_span(page, dtype, size)
            if span is None or span[0] + span[1] * size * dtype.itemsize > nbytes:
                return "a page is not in Lance's plain full-zip layout"
            starts.append(at)
            objects.append(obj)
            positions.append(span[0])
            at += span[1]
    if at != table.num_moments:
        return "the data files' pages miss rows"
    return ChunkedColumn(np.asarray(starts, np.int64), objects, np.asarray(positions, np.int64),
                         dtype, shape, store, chunks)  # fmt: skip


def chunked_path(table: Table, f: pa.Field, dtype: np.dtype, shape: tuple[int, ...],
                 chunks: ChunkStore, layout: tuple[Callable[..., Any], ...], room: int
                 ) -> ChunkedColumn | None:  # fmt: skip
    """The column of :class:`~treadle.read.fixed.FixedReader`'s ``"chunked"`` path, or
    None: the column fits the reader's ``room`` for resident columns (it is read whole,
    once), or its rows cannot be read from chunks (the ``chunk cache`` fast path is off and
    says why)."""
    if table.num_moments * math.prod(shape) * dtype.itemsize <= room:
        return None
    got = chunked_column(table, f, dtype, shape, chunks, layout)
    if isinstance(got, str):
        fastpaths.off("chunk cache", f"table {table.name!r} column {f.name!r}: {got}")
        return None
    return got
