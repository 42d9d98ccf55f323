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

import threading
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


@dataclass(frozen=True)
class _Files:
    """A column's data files (local, or copies): fragment ``i`` holds rows
    ``starts[i]:starts[i + 1]``, read by its :class:`FileValues` or Lance file reader."""

    starts: np.ndarray
    readers: list[Any]  # FileValues, or lance.file.LanceFileReader, of each fragment's file
    locks: list[threading.Lock]  # a file reader serves one call at a time (else "borrowed")

    def take(self, rows: np.ndarray, column: str) -> list[Any]:
        """The values at ``rows`` (distinct, ascending), in that order."""
        frag = np.searchsorted(self.starts, rows, side="right") - 1
        out: list[Any] = []
        for i in np.unique(frag):
            local = rows[frag == i] - self.starts[i]
            reader = self.readers[int(i)]
            if isinstance(reader, FileValues):
                out += reader.take(local)
                continue
            with self.locks[int(i)]:
                got = reader.take_rows(local.tolist()).to_table()
            out += got.column(column).to_pylist()
        return out

    def close(self) -> None:
        _close(self.readers)


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
            files, self._files = self._files, {}
            copies, self._copies = self._copies, LocalCopies()
        for f in files.values():
            if f is not None:
                f.close()
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
        if rows.size and (rows[0] < 0 or rows[-1] >= table.num_moments):
            raise IndexError(f"row ids out of range for table {table.name!r} with "
                             f"{table.num_moments} moments")  # fmt: skip
        table.check_not_purged(rows)
        return files.take(rows, column)

    def _open(self, table: Table, column: str, local: bool) -> _Files | None:
        why = ""
        try:
            files = self._read(table, column, local)
            if isinstance(files, str):
                why, files = files, None
            elif not _agrees(table, column, files):
                files.close()
                why, files = "rows read from its files differ from a Lance take", None
        except (TreadleError, OSError, ValueError, RuntimeError) as e:
            why, files = f"{type(e).__name__}: {e}", None
        if why:
            path = "image reads" if local else "cached reads"
            fastpaths.off(path, f"table {table.name!r} column {column!r}: {why}")
        return files

    def _read(self, table: Table, column: str, local: bool) -> _Files | str:
        """The column's data files (on an object store: copied, or found, in the object
        cache) with a reader each, or why not."""
        from lance.file import LanceFileReader

        ds = table.dataset
        field_id = ds.lance_schema.field(column).id()
        frags = ds.get_fragments()
        files = [data_file(f.metadata, field_id) for f in frags]
        if any(df is None for df in files):
            return "a fragment has deleted rows or the column over several files"
        nbytes = sum(int(getattr(df, "file_size_bytes", 0) or 0) for df in files)
        why = "" if local else over_cache_bound(nbytes)
        readers: list[Any] = []
        starts = [0]
        for frag, df in zip(frags, files):
            path, why = (None, why) if why else self._copies.path(table, ds, df)
            rows = int(frag.metadata.physical_rows)
            got = None if path is None else open_values(path, df, field_id, rows)
            if path is None or (local and isinstance(got, str)):
                _close(readers)
                return why or (got if isinstance(got, str) else "a data file is missing")
            readers.append(got if isinstance(got, FileValues)
                           else LanceFileReader(path, columns=[column]))  # fmt: skip
            starts.append(starts[-1] + rows)
        if starts[-1] != table.num_moments:
            _close(readers)
            return "the fragments' rows do not add up to the table's"
        locks = [threading.Lock() for _ in readers]
        return _Files(np.asarray(starts[:-1], np.int64), readers, locks)


def _close(readers: list[Any]) -> None:
    for r in readers:
        if isinstance(r, FileValues):
            r.close()


def _agrees(table: Table, column: str, files: _Files) -> bool:
    """Whether the first and last row of every file equal what Lance's take returns."""
    ends = np.append(files.starts[1:], table.num_moments) - 1
    probe = np.unique(np.concatenate([files.starts, ends]))
    want = table.dataset.take(probe, columns=[column]).column(column).to_pylist()
    return files.take(probe, column) == want
