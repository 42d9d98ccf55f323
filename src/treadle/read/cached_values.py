"""Binary columns (encoded images) of a table on an object store, read from copies of their
data files in the local object cache instead of a Lance take per batch.

A take of a batch's image rows from an object store costs about one GET per row (random
rows share no page) and, on the loader's machine, the CPU of every request: issue 44's
image bench measured ~0.9 GET per sample and ~30% more CPU per frame than local disk. Lance
data files never change once written, so, as :mod:`treadle.read.fixed` does for wide
fixed-width columns, :class:`CachedValues` copies the files of a column into the object
cache (:mod:`treadle.storage.filecache`, bounded; node-shared, so worker processes copy
each file once) and takes rows from the local copies with Lance's file reader. It applies
when every fragment holds the column in one data file and has no deletions, the files fit
the cache, and the first and last row of each file equal a Lance take of the table; else
it says why (the ``cached reads`` fast path) and the caller takes rows from the table.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle import fastpaths
from treadle.errors import TreadleError
from treadle.read.local_copies import LocalCopies, data_file, over_cache_bound

if TYPE_CHECKING:
    from treadle.table.table import Table

__all__ = ["CachedValues"]


@dataclass(frozen=True)
class _Files:
    """A column's local copies: fragment ``i`` holds rows ``starts[i]:starts[i + 1]``."""

    starts: np.ndarray
    readers: list[Any]  # lance.file.LanceFileReader of each fragment's copy
    locks: list[threading.Lock]  # a file reader serves one call at a time (else "borrowed")

    def take(self, rows: np.ndarray, column: str) -> list[Any]:
        """The values at ``rows`` (distinct, ascending), in that order."""
        frag = np.searchsorted(self.starts, rows, side="right") - 1
        out: list[Any] = []
        for i in np.unique(frag):
            local = rows[frag == i] - self.starts[i]
            with self.locks[int(i)]:
                got = self.readers[int(i)].take_rows(local.tolist()).to_table()
            out += got.column(column).to_pylist()
        return out


class CachedValues:
    """Takes binary columns of tables on object stores from local copies (safe to share
    between threads). ``copy_objects=False``: never copy (a reader of a few rows)."""

    def __init__(self, copy_objects: bool = True):
        self.copy_objects = copy_objects
        self._files: dict[tuple[str, int, str], _Files | None] = {}
        self._copies = LocalCopies()
        self._lock = threading.RLock()  # held while a column's files are copied

    def close(self) -> None:
        with self._lock:
            copies, self._copies, self._files = self._copies, LocalCopies(), {}
        copies.close()

    def take(self, table: Table, rows: np.ndarray, column: str) -> list[Any] | None:
        """``column``'s values at ``rows`` (distinct, ascending) from the local copies, or
        None where they are not used (a local table, or a reason given once)."""
        if table.project.store.is_local or not self.copy_objects:
            return None
        key = (table.uri, table.version, column)
        with self._lock:
            if key not in self._files:
                self._files[key] = self._open(table, column)
            files = self._files[key]
        return None if files is None else files.take(np.asarray(rows, np.int64), column)

    def _open(self, table: Table, column: str) -> _Files | None:
        why = ""
        try:
            files = self._copy(table, column)
            if isinstance(files, str):
                why, files = files, None
            elif not _agrees(table, column, files):
                why, files = "copied rows differ from a Lance take", None
        except (TreadleError, OSError, ValueError, RuntimeError) as e:
            why, files = f"{type(e).__name__}: {e}", None
        if why:
            fastpaths.off("cached reads", f"table {table.name!r} column {column!r}: {why}")
        return files

    def _copy(self, table: Table, column: str) -> _Files | str:
        """The column's data files copied (or found) in the object cache, or why not."""
        from lance.file import LanceFileReader

        ds = table.dataset
        field_id = ds.lance_schema.field(column).id()
        frags = ds.get_fragments()
        files = [data_file(f.metadata, field_id) for f in frags]
        if any(df is None for df in files):
            return "a fragment has deleted rows or the column over several files"
        why = over_cache_bound(sum(int(getattr(df, "file_size_bytes", 0) or 0) for df in files))
        if why:
            return why
        readers, starts = [], [0]
        for frag, df in zip(frags, files):
            path, why = self._copies.path(table, ds, df)
            if path is None:
                return why
            readers.append(LanceFileReader(path, columns=[column]))
            starts.append(starts[-1] + int(frag.metadata.physical_rows))
        if starts[-1] != table.num_moments:
            return "the fragments' rows do not add up to the table's"
        locks = [threading.Lock() for _ in readers]
        return _Files(np.asarray(starts[:-1], np.int64), readers, locks)


def _agrees(table: Table, column: str, files: _Files) -> bool:
    """Whether the first and last row of every file equal what Lance's take returns."""
    ends = np.append(files.starts[1:], table.num_moments) - 1
    probe = np.unique(np.concatenate([files.starts, ends]))
    want = table.take(probe, [column]).column(column).to_pylist()
    return files.take(probe, column) == want
