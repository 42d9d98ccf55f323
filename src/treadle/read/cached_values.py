"""Binary columns (encoded images) read from their Lance data files (a local table's own,
or copies in the local object cache of a table on an object store) instead of a Lance take
per batch.

A take of a batch's image rows from an object store costs about one GET per row (random
rows share no page) and, on the loader's machine, the CPU of every request: issue 44's
image bench measured ~0.9 GET per sample and ~30% more CPU per frame than local disk. Lance
data files never change once written, so, as :mod:`treadle.read.fixed` does for wide
fixed-width columns, :class:`CachedValues` copies the files of a column into the object
cache (:mod:`treadle.storage.filecache`, bounded; node-shared, so worker processes copy
each file once) and takes rows from the local copies. Local files and copies alike are
read by :class:`~treadle.read.file_values.FileValues` (a ``pread`` per value: ~10x less CPU
than Lance's take) where every page is in Lance's plain full-zip layout; else copies are read with Lance's file reader, and a local table with a Lance take. It
applies when every fragment holds the column in one data file and has no deletions, the
files fit the cache, and the first and last row of each file equal a Lance take of the
table; else it says why (the ``image reads`` / ``cached reads`` fast paths) and the caller
takes rows from the table. Rows of a purged episode raise :class:`~treadle.errors.Purged`,
as the take does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle import fastpaths
from treadle.errors import TreadleError
from treadle.read.file_values import FileValues, open_values
from treadle.read.local_copies import LocalCopies, data_file, over_cache_bound

if TYPE_CHECKING:
    from treadle.table.table import Table

__all__ = ["CachedValues"]


_TAKE = "take"  # a fragment whose rows are taken with Lance (its pages are not plain)


@dataclass(frozen=True)
class _Files:
    """A column's data files (local, or copies): fragment ``i`` holds rows
    ``starts[i]:starts[i + 1]``, read by its :class:`FileValues`, Lance file reader, or
    (:data:`_TAKE`) a Lance take of the table. A local table's readers are opened by
    ``opener`` when a row of their fragment is first read (a table of many fragments opens
    none at its first batch)."""

    starts: np.ndarray
    readers: list[Any]  # FileValues, lance.file.LanceFileReader, _TAKE, or None: not yet
    locks: list[threading.Lock]  # a file reader serves one call at a time (else "borrowed")
    opener: Callable[[int], Any] | None = None  # fragment -> its reader (local tables)
    lance_take: Callable[[np.ndarray], list[Any]] | None = None  # table rows -> values

    def take(self, rows: np.ndarray, column: str) -> list[Any]:
        """The values at ``rows`` (distinct, ascending), in that order."""
        frag = np.searchsorted(self.starts, rows, side="right") - 1
        out: list[Any] = []
        for i in np.unique(frag).tolist():
            mine = rows[frag == i]
            reader = self.reader(i)
            if reader is _TAKE:
                out += self.lance_take(mine)  # type: ignore[misc]
            elif isinstance(reader, FileValues):
                out += reader.take(mine - self.starts[i])
            else:
                with self.locks[i]:
                    got = reader.take_rows((mine - self.starts[i]).tolist()).to_table()
                out += got.column(column).to_pylist()
        return out

    def reader(self, i: int) -> Any:
        """Fragment ``i``'s reader, opened now if it was not."""
        got = self.readers[i]
        if got is None and self.opener is not None:
            with self.locks[i]:
                if self.readers[i] is None:
                    self.readers[i] = self.opener(i)
                got = self.readers[i]
        return got


class CachedValues:
    """Takes binary columns of tables from their data files (safe to share between
    threads). ``copy_objects=False``: never copy an object store's files (a reader of a few
    rows); a local table's files are read in place either way."""

    def __init__(self, copy_objects: bool = True):
        self.copy_objects = copy_objects
        self._files: dict[tuple[str, int, str], _Files | None] = {}
        self._copies = LocalCopies()
        self._lock = threading.RLock()  # held while a column's files are copied

    def close(self) -> None:
        with self._lock:
            self._files = {}
            copies, self._copies = self._copies, LocalCopies()
        copies.close()

    def take(self, table: Table, rows: np.ndarray, column: str) -> list[Any] | None:
        """``column``'s values at ``rows`` (distinct, ascending) from the data files, or
        None where they are not read so (a reason given once)."""
        local = table.project.store.is_local
        if not local and not self.copy_objects:
            return None
        key = (table.uri, table.version, column)
        files = self._files.get(key, False)
        if files is False:
            with self._lock:
                if key not in self._files:
                    self._files[key] = self._open(table, column, local)
                files = self._files[key]
        if files is None:
            return None
        rows = np.asarray(rows, np.int64)
        table.check_rows(rows)  # as Table.take does
        table.check_not_purged(rows)
        return files.take(rows, column)

    def _open(self, table: Table, column: str, local: bool) -> _Files | None:
        why = ""
        try:
            files = self._read(table, column, local)
            if isinstance(files, str):
                why, files = files, None
            elif not local and not _agrees(table, column, files, files.starts):
                why, files = "rows read from its files differ from a Lance take", None
        except (TreadleError, OSError, ValueError, RuntimeError) as e:
            why, files = f"{type(e).__name__}: {e}", None
        if why:
            path = "image reads" if local else "cached reads"
            fastpaths.off(path, f"table {table.name!r} column {column!r}: {why}")
        return files

    def _read(self, table: Table, column: str, local: bool) -> _Files | str:
        """The column's data files with a reader each (local: opened on first use; on an
        object store: copied, or found, in the object cache now), or why not."""
        from lance.file import LanceFileReader

        ds = table.dataset
        field_id = ds.lance_schema.field(column).id()
        frags = ds.get_fragments()
        files = [data_file(f.metadata, field_id) for f in frags]
        if any(df is None for df in files):
            return "a fragment has deleted rows or the column over several files"
        rows = [int(f.metadata.physical_rows) for f in frags]
        starts = np.cumsum([0, *rows])
        if starts[-1] != table.num_moments:
            return "the fragments' rows do not add up to the table's"
        locks = [threading.Lock() for _ in frags]
        if local:

            def opener(i: int) -> Any:
                return _local_reader(table, column, ds, files[i], field_id, rows[i], starts[i])

            def lance_take(r: np.ndarray) -> list[Any]:
                return ds.take(r, columns=[column]).column(column).to_pylist()

            return _Files(starts[:-1], [None] * len(frags), locks, opener, lance_take)
        why = over_cache_bound(sum(int(getattr(df, "file_size_bytes", 0) or 0) for df in files))
        if why:
            return why
        readers: list[Any] = []
        for df, n in zip(files, rows):
            path, why = self._copies.path(table, ds, df)
            if path is None:
                return why or "a data file is missing"
            got = open_values(path, df, field_id, n)
            readers.append(got if isinstance(got, FileValues)
                           else LanceFileReader(path, columns=[column]))  # fmt: skip
        return _Files(starts[:-1], readers, locks)


def _local_reader(table: Table, column: str, ds: Any, df: Any, field_id: int, rows: int,
                  start: int) -> Any:  # fmt: skip
    """A local fragment's :class:`FileValues`, or :data:`_TAKE` (its pages are not plain,
    or its first and last row differ from a Lance take: the fast path says why)."""
    path = os.path.join(ds.uri, "data", df.path)
    try:
        got = open_values(path, df, field_id, rows) if os.path.isfile(path) else "no file"
    except OSError as e:
        got = f"{type(e).__name__}: {e}"
    if not isinstance(got, str):
        one = _Files(np.zeros(1, np.int64), [got], [threading.Lock()])
        if not _agrees(table, column, one, np.array([start]), rows):
            got = "rows read from its file differ from a Lance take"
    if isinstance(got, str):
        fastpaths.off("image reads", f"table {table.name!r} column {column!r}: {got}")
        return _TAKE
    return got


def _agrees(table: Table, column: str, files: _Files, starts: np.ndarray,
            last: int | None = None) -> bool:  # fmt: skip
    """Whether the first and last row of every file (table rows from ``starts``; ``last``:
    the rows of one file) equal what Lance's take returns."""
    ends = np.append(starts[1:], table.num_moments) - 1 if last is None else starts + last - 1
    probe = np.unique(np.concatenate([starts, ends]))
    want = table.dataset.take(probe, columns=[column]).column(column).to_pylist()
    return files.take(probe - starts[0], column) == want
