"""Fixed-width columns of a pinned table at row positions, without a Lance ``take`` per batch.

A Lance ``take`` of 64 random rows costs 1-4 ms (``bench/take_paths.py``), a numpy gather of
the same bytes from the page cache ~0.1 ms. :class:`FixedReader` gives the values
:meth:`Table.take <treadle.table.Table.take>` + :func:`~treadle.table.tensors.to_numpy` give
(same dtype, shape and values, rows in any order, duplicates allowed) by one of these paths,
chosen once per (table version, column) (and **chunked**, :mod:`treadle.read.chunk_rows`):

- **mapped**: every page of the column, in every data file of the pinned version, is a Lance
  2.1+ ``FullZipLayout`` of flat fixed-width values (no repetition/definition levels, no
  compression: Lance's layout for rows of 256 bytes and more, e.g. images) and the fragments
  have no deletions. The files are a local root's, or on an object store their copies in
  the local object cache (:mod:`treadle.storage.filecache`, bounded; when a file does not
  fit, the ``cached reads`` fast path is off and says why). Each page is then an
  ``[rows, *shape]`` array at a byte offset that the file's own column metadata gives; the
  files are memory-mapped read-only. Data files are immutable and named by the pinned
  version's fragment list, so no other version's bytes are read. Each page's first and last
  row are checked against a Lance ``take`` once; else the next path (deletions: compact()).
- **resident**: the whole column of the version, read once with Lance and kept as one numpy
  array while it fits the reader's byte budget (narrow columns: actions, states, scalars,
  which Lance stores in compressed mini-blocks). A column holding a null anywhere is not
  kept (so the error stays the current one: raised when a batch reads a null row).
- **take**: ``Table.take`` + ``to_numpy``, the current reader's path."""

from __future__ import annotations

import contextlib
import math
import mmap
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle import fastpaths
from treadle.errors import CorruptData
from treadle.read.chunk_rows import chunked_path
from treadle.read.local_copies import LocalCopies, data_file, over_cache_bound
from treadle.read.resident import whole_column
from treadle.table.tensors import batch_kind, tensor_shape, to_numpy

if TYPE_CHECKING:
    from treadle.storage.chunkstore import ChunkStore
    from treadle.table.table import Table

__all__ = ["RESIDENT_BYTES", "FixedReader", "fixed_width"]

RESIDENT_BYTES = 256 << 20
"""Default budget of a :class:`FixedReader` for columns it keeps in memory."""

# One page of flat fixed-size lists in Lance's full-zip layout, all rows valid (2.1, 2.2).
# Anything else (nulls, compression, nested lists, other layouts) does not match.
_FULL_ZIP = re.compile(
    r"PageLayout \{ layout: Some\( FullZipLayout\( FullZipLayout \{ bits_rep: 0, bits_def: 0, "
    r"num_items: (\d+), num_visible_items: (\d+), value_compression: Some\( CompressiveEncoding"
    r" \{ compression: Some\( FixedSizeList\( FixedSizeList \{ items_per_value: (\d+), "
    r"has_validity: false, values: Some\( CompressiveEncoding \{ compression: Some\( Flat\( "
    r"Flat \{ bits_per_value: (\d+), data: None, \}, \), \), \}, \), \}, \), \), \}, \), "
    r"layers: \[ RepdefAllValidItem, \], details: Some\( BitsPerValue\( (\d+), \), \), \}, \), "
    r"\), \}"
)


_FILE_VERSIONS = {(2, 1), (2, 2)}  # the Lance file versions whose full-zip layout is known
#: Lance stores rows of this many bytes and more in its full-zip layout: a local column this
#: wide that does not map says that Lance's layout changed (the path is off, and says so)
FULL_ZIP_ROW_BYTES = 256


def fixed_width(f: pa.Field) -> bool:
    """Whether a batch holds this column as a fixed-width numpy array (numbers, tensors)."""
    try:
        return batch_kind(f) in ("tensor", "scalar")
    except CorruptData:
        return False


@dataclass
class _Column:
    """How one column of one table version is read."""

    path: str  # "mapped", "resident", "chunked" or "take"
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    parts: list[np.ndarray] = field(default_factory=list)  # [rows, *shape] per segment
    chunked: Any = None  # "chunked": a ChunkedColumn (rows from the chunk store)


class FixedReader:
    """Reads fixed-width columns of pinned :class:`~treadle.table.Table` s at row positions.

    Safe to share between threads. ``resident_bytes`` bounds what it keeps in memory
    (mapped pages are the page cache's, not counted). ``copy_objects``: on an object store,
    map wide columns from copies of their data files in the object cache (False: never
    copy, for a reader of a few rows). :meth:`close` unmaps the files and lets the copies go.
    """

    def __init__(self, resident_bytes: int = RESIDENT_BYTES, *, copy_objects: bool = True,
                 chunks: ChunkStore | None = None):  # fmt: skip
        self.resident_bytes = int(resident_bytes)
        self.chunks = chunks  # files past the object cache: rows from its chunks (lookahead)
        self.copy_objects = copy_objects
        self._held = 0
        self._columns: dict[tuple[str, int, str], _Column] = {}
        self._tables: weakref.WeakKeyDictionary[Any, dict[str, _Column]]
        self._tables = weakref.WeakKeyDictionary()
        self._maps: dict[str, mmap.mmap] = {}
        self._copies = LocalCopies()  # object-cache copies this reader holds
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._columns.clear()
            self._tables.clear()
            self._held = 0
            maps, self._maps = self._maps, {}
            copies, self._copies = self._copies, LocalCopies()
        for m in maps.values():
            with contextlib.suppress(BufferError):  # an array handed out still views it:
                m.close()  # the GC unmaps it
        copies.close()

    def chunked(self, table: Table, column: str) -> Any:
        return self._column(table, column).chunked  # its ChunkedColumn (read.chunk_rows)

    def path(self, table: Table, column: str) -> str:
        """``"mapped"``, ``"resident"``, ``"chunked"`` or ``"take"``: how ``column`` is read."""
        return self._column(table, column).path

    def read(self, table: Table, rows: np.ndarray | list[int], columns: list[str]
             ) -> dict[str, np.ndarray]:  # fmt: skip
        """``{column: values[rows]}``, as ``to_numpy(table.take(rows, [column]))`` gives them.
        Every column must be :func:`fixed_width`; rows out of range are an ``IndexError``."""
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        table.check_rows(idx)
        out: dict[str, np.ndarray] = {}
        takes: dict[bytes, tuple[np.ndarray, list[str]]] = {}  # positions -> their columns
        for c in columns:
            col = self._column(table, c)
            if col.path == "take":
                at = np.arange(idx.size)
            elif col.chunked is not None:  # from present chunks; the others taken
                out[c], at = col.chunked.read_present(idx)
            else:
                out[c] = _gather(col, idx)
                continue
            if at.size or c not in out:  # (a take of no rows: the column's empty values)
                takes.setdefault(at.tobytes(), (at, []))[1].append(c)
        # one Lance take per set of rows, of all the columns that lack them: its requests
        # run together, rather than one take after the other per column
        for at, cols in takes.values():
            got = _take(table, idx[at], cols)
            for c in cols:
                if c in out:
                    out[c][at] = got[c]
                else:
                    out[c] = got[c]
        return {c: out[c] for c in columns}

    # -- choosing a path ----------------------------------------------------------------
    def _column(self, table: Table, column: str) -> _Column:
        hit = self._tables.get(table, {}).get(column)  # per batch: no lock, no key to build
        if hit is not None:
            return hit
        with self._lock:
            key = (table.uri, table.version, column)
            hit = self._columns.get(key)
            if hit is None:
                hit = self._columns[key] = self._plan(table, column)
            self._tables.setdefault(table, {})[column] = hit
        return hit

    def _plan(self, table: Table, column: str) -> _Column:
        f = table.schema.field(column)  # KeyError for an unknown column, as take's NotFound
        if not fixed_width(f):
            raise TypeError(
                f"column {column!r} of table {table.name!r} is {f.type}, not a fixed-width column"
            )
        mapped = self._mapped(table, f)
        if mapped is not None:
            return mapped
        shape = tensor_shape(f) or ()
        leaf = f.type
        while pa.types.is_fixed_size_list(leaf):
            leaf = leaf.value_type
        nbytes = table.num_moments * math.prod(shape) * max(1, leaf.bit_width // 8)
        if self._held + nbytes > self.resident_bytes:
            return _Column("take")
        try:
            values = self._whole(table, column, f, nbytes)
        except CorruptData:  # a null somewhere: only a batch that reads it may fail
            return _Column("take")
        self._held += values.nbytes
        return _Column("resident", np.zeros(1, np.int64), [values])

    def _whole(self, table: Table, column: str, f: pa.Field, nbytes: int) -> np.ndarray:
        return whole_column(table, column, f)  # the resident path's read (a planner's: none)

    def _mapped(self, table: Table, f: pa.Field) -> _Column | None:
        """The mapped path of this column, or None when one of its assumptions fails."""
        shape = tensor_shape(f)
        if shape is None or not pa.types.is_fixed_size_list(f.type):
            return None
        vt = f.type.value_type
        if not (pa.types.is_integer(vt) or pa.types.is_floating(vt)):
            return None
        dtype = np.dtype(vt.to_pandas_dtype()).newbyteorder("<")
        wide = f.type.list_size * dtype.itemsize >= FULL_ZIP_ROW_BYTES
        store = table.project.store
        if not store.is_local and not (wide and self.copy_objects):  # read it as before
            return None
        ds = table.dataset
        field_id = ds.lance_schema.field(f.name).id()
        frags = ds.get_fragments()
        held = self._copies.held()
        col = None
        if store.is_local or not self._too_big(table, frags, field_id):
            col = self._map_fragments(table, ds, frags, f, field_id, dtype, shape, wide)
        elif self.chunks is not None:
            got = chunked_path(table, f, dtype, shape, self.chunks, (data_file, page_span))
            return None if got is None else _Column("chunked", chunked=got)
        if col is None:
            self._copies.release(self._copies.held() - held)  # copied in vain
        return col

    def _too_big(self, table: Table, frags: list[Any], field_id: int) -> bool:
        """Whether the column's data files would not fit the object cache together (then
        none is copied; the fast path says why)."""
        total = sum(int(getattr(df, "file_size_bytes", 0) or 0)
                    for frag in frags for df in frag.metadata.files if field_id in list(df.fields))  # fmt: skip
        why = over_cache_bound(total)
        if why:
            fastpaths.off("cached reads", f"table {table.name!r}: {why}")
        return bool(why)

    def _map_fragments(self, table: Table, ds: Any, frags: list[Any], f: pa.Field,
                       field_id: int, dtype: np.dtype, shape: tuple[int, ...], wide: bool
                       ) -> _Column | None:  # fmt: skip
        starts, parts, at = [], [], 0
        for frag in frags:
            df = data_file(frag.metadata, field_id)
            version = None if df is None else (df.file_major_version, df.file_minor_version)
            if version is not None and version not in _FILE_VERSIONS:  # before any copy
                if wide:
                    fastpaths.off("fixed-width reads", f"column {f.name!r}: Lance file version "
                                  f"{version[0]}.{version[1]} is not one whose layout is known")  # fmt: skip
                return None
            if df is None and wide:
                fastpaths.off("fixed-width reads", f"table {table.name!r} column {f.name!r}: a "
                              "fragment has deleted rows or the column over several files; "
                              "table.compact() rewrites them")  # fmt: skip
            path, why = (None, "") if df is None else self._copies.path(table, ds, df)
            if path is None:
                if why:
                    fastpaths.off("cached reads", f"table {table.name!r}: {why}")
                return None
            segs = self._fragment_pages(df, path, frag.metadata, field_id, dtype, f.type.list_size)
            if isinstance(segs, str):
                if segs and wide:
                    fastpaths.off("fixed-width reads", f"column {f.name!r}: {segs}")
                return None
            for seg in segs:
                starts.append(at)
                parts.append(seg.reshape((len(seg), *shape)))
                at += len(seg)
        if not parts or at != table.num_moments:
            return None
        col = _Column("mapped", np.asarray(starts, np.int64), parts)
        if _agrees(table, f, col):
            return col
        fastpaths.off("fixed-width reads", f"column {f.name!r}: mapped pages differ from take")
        return None

    def _fragment_pages(
        self, df: Any, path: str, meta: Any, field_id: int, dtype: np.dtype, size: int
    ) -> list[np.ndarray] | str:
        """Per page, the ``[rows, size]`` values of this field in data file ``df`` of this
        fragment (a known Lance file version) at local ``path``; else why not: a reason
        where Lance's file layout is not the one this reader knows."""
        from lance.file import LanceFileReader

        where = list(df.fields).index(field_id)
        column = list(df.column_indices)[where]
        try:
            fmeta = LanceFileReader(path).metadata()
        except (OSError, ValueError, RuntimeError) as e:  # Lance's errors: IOError, ValueError
            return f"a data file's metadata could not be read ({type(e).__name__}: {e})"
        if fmeta.num_rows != meta.physical_rows or column >= len(fmeta.columns):
            return "a data file's metadata does not match its fragment"
        buf = self._map(path)
        pages, rows = [], 0
        for page in fmeta.columns[column].pages:
            arr = _page_values(page, buf, dtype, size)
            if arr is None:
                return "a page is not in Lance's plain full-zip layout"
            pages.append(arr)
            rows += len(arr)
        return pages if rows == meta.physical_rows else "a data file's pages miss rows"

    def _map(self, path: str) -> mmap.mmap:
        m = self._maps.get(path)
        if m is None:
            with open(path, "rb") as fh:
                m = self._maps[path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return m


def _page_values(page: Any, buf: mmap.mmap, dtype: np.dtype, size: int) -> np.ndarray | None:
    """A page's ``[rows, size]`` values viewed in the mapped file, if it is plain full-zip."""
    span = page_span(page, dtype, size)
    if span is None or span[0] + span[1] * size * dtype.itemsize > len(buf):
        return None
    flat = np.frombuffer(buf, dtype=dtype, count=span[1] * size, offset=span[0])
    return flat.reshape(span[1], size)


def page_span(page: Any, dtype: np.dtype, size: int) -> tuple[int, int] | None:
    """``(byte position, rows)`` of a page of ``size`` values per row in its data file, if
    it is plain full-zip (else None)."""
    m = _FULL_ZIP.fullmatch(" ".join(page.encoding.split()))
    if m is None or len(page.buffers) != 1:
        return None
    items, visible, per, bits, row_bits = (int(g) for g in m.groups())
    row_bytes = size * dtype.itemsize
    if items != visible or per != size or bits != 8 * dtype.itemsize or row_bits != 8 * row_bytes:
        return None
    b = page.buffers[0]
    return (int(b.position), items) if b.size == items * row_bytes else None


def _agrees(table: Table, f: pa.Field, col: _Column) -> bool:
    """Whether the first and last row of every segment equal what Lance's take returns."""
    ends = np.append(col.starts[1:], table.num_moments) - 1
    probe = np.unique(np.concatenate([col.starts, ends]))
    want = _take(table, probe, [f.name])[f.name]
    got = _gather(col, probe)
    return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def _gather(col: _Column, idx: np.ndarray) -> np.ndarray:
    if len(col.parts) == 1:
        return col.parts[0][idx]
    seg = np.searchsorted(col.starts, idx, side="right") - 1
    first = col.parts[0]
    out = np.empty((len(idx), *first.shape[1:]), first.dtype)
    for s in np.unique(seg):
        at = np.flatnonzero(seg == s)
        out[at] = col.parts[int(s)][idx[at] - col.starts[s]]
    return out


def _take(table: Table, idx: np.ndarray, columns: list[str]) -> dict[str, np.ndarray]:
    """The current reader's path: one Lance take of the distinct rows, then numpy."""
    uniq, inverse = np.unique(idx, return_inverse=True)
    got = table.take(uniq, columns)
    where = f"table {table.name!r}"
    return {
        c: to_numpy(got.column(c), got.schema.field(c), where)[inverse.reshape(-1)] for c in columns
    }
