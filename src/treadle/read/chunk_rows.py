"""Rows of wide fixed-width columns read from the chunk store (:mod:`treadle.storage.chunkstore`).

Past the object cache's bound, a table's data files are not copied whole; a loader with
``lookahead`` (:mod:`treadle.read.lookahead`) fetches the chunks that the next steps' rows
need instead. Such a row is ``row_bytes`` at a known offset of its data file: the page layout
:mod:`treadle.read.fixed` maps (Lance's plain full-zip pages), read from the file's footer on
the object store without copying the file. :class:`ChunkedColumn` gives each row's byte range
and reads rows whose chunks are present; :class:`~treadle.read.fixed.FixedReader` takes the
others with Lance, as before.

A data file's footer (a ``HEAD`` and a ``GET`` of its last 64 KiB) is read when rows of that
file are first needed, not when the column is opened: a table of OXE's size has thousands of
data files, of which a rank's first steps read a few. Footers needed at once, of any
columns, are read concurrently (:func:`read_footers`, ``CONCURRENCY.footers_in_flight``; a
loader's lookahead asks for a round of steps' footers at once). ``treadle simulate`` counts them the same way
(:mod:`treadle.plan.simulate`).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle import fastpaths
from treadle.concurrency import CONCURRENCY, submit
from treadle.fork_locks import renew_lock_in_child
from treadle.storage.chunkstore import ChunkStore, ObjectChunks

if TYPE_CHECKING:
    from treadle.storage.store import Store
    from treadle.table.table import Table

__all__ = [
    "ChunkedColumn",
    "DataFile",
    "chunk_span",
    "chunked_column",
    "chunked_path",
    "read_footers",
]

Pages = tuple[np.ndarray, np.ndarray]  # one data file's pages: (first row, byte position)


@dataclass(frozen=True)
class DataFile:
    """One fragment's data file holding the column: its rows and where it is."""

    first_row: int  # of the table
    rows: int
    uri: str
    key: str  # relative to the table's store
    size: int  # bytes (0: not in the fragment's metadata; a HEAD when first read)
    column: int  # the column's index among the file's columns


def chunk_span(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Every integer of each ``[first[i], last[i]]``, one after the other."""
    count = last - first + 1
    at = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(first, count) + at


class ChunkedColumn:
    """Where each row of one column of a pinned table lies: per data file, pages of
    consecutive rows, each file's read from its footer when its rows are first needed."""

    def __init__(self, where: str, files: list[DataFile], dtype: np.dtype,
                 shape: tuple[int, ...], store: Store, chunks: ChunkStore,
                 page_span: Callable[..., Any]) -> None:  # fmt: skip
        self.where, self.files = where, files  # where: "table 't' column 'c'"
        self.file_starts = np.asarray([f.first_row for f in files], np.int64)
        self.dtype, self.shape, self.store, self.chunks = dtype, shape, store, chunks
        self._page_span = page_span
        self._pages: dict[int, Pages | None] = {}  # None: its rows are taken with Lance
        self.objects: dict[int, ObjectChunks] = {}  # per data file read: its chunks

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def resolve(self, files: Iterable[int]) -> None:
        """Read the footers of data files ``files`` not read yet, several at once."""
        read_footers([(self, files)])

    def files_of(self, rows: np.ndarray) -> np.ndarray:
        """The data files (indices into :attr:`files`) holding ``rows``."""
        return np.unique(np.searchsorted(self.file_starts, rows, side="right") - 1)

    def _footer(self, i: int) -> Any:
        """Data file ``i``'s footer (Lance's file metadata), or why it could not be read."""
        from lance.file import LanceFileReader

        try:
            uri, options = self.files[i].uri, self.store.lance_options
            return LanceFileReader(uri, storage_options=options).metadata()
        except (OSError, ValueError, RuntimeError) as e:
            return f"its footer could not be read ({type(e).__name__}: {e})"

    def _read_pages(self, i: int, meta: Any = None) -> Pages | str:
        """Data file ``i``'s pages from its footer (``meta``: read already, by another
        column of the file), its chunks' object made; or why its rows cannot be read from
        chunks."""
        df = self.files[i]
        size = df.size or int(self.store.size(df.key))
        meta = self._footer(i) if meta is None else meta
        if isinstance(meta, str):
            return meta
        starts, positions, at = [], [], df.first_row
        n = math.prod(self.shape)
        for page in meta.columns[df.column].pages:
            span = self._page_span(page, self.dtype, n)
            if span is None or span[0] + span[1] * n * self.dtype.itemsize > size:
                return "a page is not in Lance's plain full-zip layout"
            starts.append(at)
            positions.append(span[0])
            at += span[1]
        if at != df.first_row + df.rows:
            return "its pages miss rows"
        try:
            self.objects[i] = self.chunks.object(self.store, df.key, size)
        except OSError as e:  # a full disk: read as without the cache
            return f"its chunk files could not be made ({e})"
        return np.asarray(starts, np.int64), np.asarray(positions, np.int64)

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: its data file (-1 where its rows are taken) and the row's byte offset in
        it; the footers of the files not read yet are read first."""
        rows = np.asarray(rows, np.int64)
        file = np.searchsorted(self.file_starts, rows, side="right") - 1
        offset = np.zeros(len(rows), np.int64)
        files = np.unique(file).tolist()
        self.resolve(files)
        for i in files:
            sel = file == i
            pages = self._pages[i]
            if pages is None:
                file[sel] = -1
                continue
            starts, positions = pages
            page = np.searchsorted(starts, rows[sel], side="right") - 1
            offset[sel] = positions[page] + (rows[sel] - starts[page]) * self.row_bytes
        return file, offset

    def chunk_ids(self, rows: np.ndarray) -> dict[int, np.ndarray]:
        """Per data file (key of :attr:`objects`), the distinct chunks ``rows`` touch: every
        chunk of each row, from its first byte's to its last's."""
        rows = np.unique(rows)
        owners = np.zeros(len(rows), np.int64)  # one group
        return {f: ids for f, (_, ids) in self.owned_chunk_ids(rows, owners).items()}

    def owned_chunk_ids(self, rows: np.ndarray, owners: np.ndarray
                        ) -> dict[int, tuple[np.ndarray, np.ndarray]]:  # fmt: skip
        """:meth:`chunk_ids` of rows owned by groups (``owners[i]``, non-negative: the step
        of row ``i``): per data file, ``(owner, chunk id)`` of each distinct pair, sorted."""
        rows, owners = np.asarray(rows, np.int64), np.asarray(owners, np.int64)
        file, start = self.locate(rows)
        kept = file >= 0
        if not kept.any():
            return {}
        file, start, owners = file[kept], start[kept], owners[kept]
        size = self.chunks.chunk_bytes
        first, last = start // size, (start + self.row_bytes - 1) // size
        span = last - first + 1
        ids = chunk_span(first, last)
        per_file, width = int(ids.max()) + 1, len(self.files)
        key = np.unique((np.repeat(owners, span) * width + np.repeat(file, span)) * per_file + ids)
        who, rest = np.divmod(key, width * per_file)
        where, ids = np.divmod(rest, per_file)
        out = {}
        for f in np.unique(where).tolist():
            sel = where == f
            out[f] = (who[sel], ids[sel])
        return out

    def pages(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every page of the column: (first row, data file, byte position); reads every
        footer not read yet (``treadle simulate --pages``); a file whose rows are taken has
        none."""
        self.resolve(range(len(self.files)))
        starts, files, positions = [], [], []
        for i in range(len(self.files)):
            got = self._pages[i]
            if got is not None:
                starts.append(got[0])
                files.append(np.full(len(got[0]), i, np.int64))
                positions.append(got[1])
        if not starts:
            return (np.empty(0, np.int64),) * 3
        return np.concatenate(starts), np.concatenate(files), np.concatenate(positions)

    def read_present(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(values, missing)``: the values of ``rows`` from present chunks, and the
        positions in ``rows`` of the others (counted as taken: the caller takes them)."""
        out, found = self.read(rows)
        missing = np.flatnonzero(~found)
        self.chunks.stats.rows_read += len(rows) - len(missing)
        self.chunks.stats.rows_taken += len(missing)
        return out, missing

    def read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(values [rows, *shape], found)``: rows whose chunks are present are filled and
        marked found; the others are left for a Lance take."""
        out = np.empty((len(rows), *self.shape), self.dtype)
        found = np.zeros(len(rows), bool)
        file, start = self.locate(rows)
        raw = out.view(np.uint8).reshape(len(rows), self.row_bytes)  # each row's bytes
        for f in np.unique(file[file >= 0]).tolist():
            at = np.flatnonzero(file == f)
            found[at] = self.objects[f].copy_rows(start[at], raw, at)
        return out, found


_FOOTERS = threading.Lock()  # one read of each footer, whichever thread asks first
renew_lock_in_child(sys.modules[__name__], "_FOOTERS")


def _footer(t: tuple[ChunkedColumn, int]) -> Any:
    return t[0]._footer(t[1])


def read_footers(wanted: Iterable[tuple[ChunkedColumn, Iterable[int]]]) -> None:
    """Read the footers of the data files ``(column, file indices)`` not read yet, of every
    column at once (``CONCURRENCY.footers_in_flight``): a step's rows of many tables wait
    for one round trip of footers, not one per table."""
    asked = [(col, [int(i) for i in files]) for col, files in wanted]
    if all(i in col._pages for col, files in asked for i in files):
        return
    with _FOOTERS:
        todo = sorted({(id(col), i): (col, i) for col, files in asked for i in files
                       if i not in col._pages}.values(), key=lambda t: (id(t[0]), t[1]))  # fmt: skip
        if not todo:  # another thread read them meanwhile
            return
        # a footer once per data file, whichever of its columns ask (each file's first asker)
        files = {col.files[i].uri: (col, i) for col, i in reversed(todo)}
        first = list(files.values())
        if len(first) == 1:
            metas = [first[0][0]._footer(first[0][1])]
        else:
            width = min(len(first), CONCURRENCY.footers_in_flight)
            with ThreadPoolExecutor(width, thread_name_prefix="treadle-footer") as pool:
                # submit: a training thread outliving the main one still reads them
                metas = [f.result() for f in [submit(pool, _footer, t) for t in first]]
        meta = dict(zip(files, metas))
        got = [col._read_pages(i, meta[col.files[i].uri]) for col, i in todo]
        for (col, i), pages in zip(todo, got):
            if isinstance(pages, str):
                fastpaths.off("chunk cache", f"{col.where}, data file {col.files[i].key!r}: "
                              f"{pages} (its rows are taken)")  # fmt: skip
                col._pages[i] = None
            else:
                col._pages[i] = pages


def chunked_column(table: Table, f: pa.Field, dtype: np.dtype, shape: tuple[int, ...],
                   chunks: ChunkStore, layout: tuple[Callable[..., Any], ...]
                   ) -> ChunkedColumn | str:  # fmt: skip
    """Column ``f`` of ``table`` (on an object store) over its data files, from the
    fragments' metadata (no footer is read yet); or why its rows cannot be read from chunks.
    ``layout``: the fixed reader's ``(data file of a fragment, span of a page)``, so both
    read Lance's layout alike."""
    data_file, page_span = layout
    store = table.project.store
    ds = table.dataset
    field_id = ds.lance_schema.field(f.name).id()
    files, at = [], 0
    for frag in ds.get_fragments():
        df = data_file(frag.metadata, field_id)
        if df is None:
            return "a fragment has deleted rows or the column over several files"
        uri = f"{table.uri}/data/{df.path}"
        rows = int(frag.metadata.physical_rows)
        column = list(df.column_indices)[list(df.fields).index(field_id)]
        size = int(getattr(df, "file_size_bytes", 0) or 0)
        files.append(DataFile(at, rows, uri, store.relative_key(uri), size, column))
        at += rows
    if at != table.num_moments:
        return "the data files' rows are not the table's"
    where = f"table {table.name!r} column {f.name!r}"
    return ChunkedColumn(where, files, dtype, shape, store, chunks, page_span)


def chunked_path(table: Table, f: pa.Field, dtype: np.dtype, shape: tuple[int, ...],
                 chunks: ChunkStore, layout: tuple[Callable[..., Any], ...]
                 ) -> ChunkedColumn | None:  # fmt: skip
    """The column of :class:`~treadle.read.fixed.FixedReader`'s ``"chunked"`` path (a wide
    column past the object cache, read by a loader with ``lookahead``), or None: its rows
    cannot be read from chunks (the ``chunk cache`` fast path is off and says why). A wide
    column is never read whole into a reader's room for resident columns here, whatever its
    size: the chunk cache's bound, not memory, then holds what the steps read (issue 48's case
    held a 147 MB image column of a table eight times the cache in memory)."""
    got = chunked_column(table, f, dtype, shape, chunks, layout)
    if isinstance(got, str):
        fastpaths.off("chunk cache", f"table {table.name!r} column {f.name!r}: {got}")
        return None
    return got
