"""Local copies of a pinned table's Lance data files, for readers that read a file's bytes
themselves (:mod:`treadle.read.fixed` maps its pages, :mod:`treadle.read.cached_values`
reads it with Lance's file reader).

On local disk a data file is its own copy. On an object store it is copied into the node's
object cache (:mod:`treadle.storage.filecache`, bounded, shared by the node's processes)
and held (never evicted) while a reader may read it: :class:`LocalCopies` holds each copy
once and lets them all go on :meth:`LocalCopies.close`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from treadle.errors import TreadleError
from treadle.storage.filecache import CachedFile, file_cache

if TYPE_CHECKING:
    from treadle.table.table import Table

__all__ = ["LocalCopies", "data_file", "over_cache_bound"]


def data_file(meta: Any, field_id: int) -> Any:
    """The one data file of a fragment that holds the field, or None where a reader cannot
    read it alone (deletions, a column over files, a file of another dataset's base)."""
    if meta.deletion_file is not None or getattr(meta, "num_deletions", 0):
        return None
    files = [df for df in meta.files if field_id in list(df.fields)]
    if len(files) != 1 or getattr(files[0], "base_id", None) is not None:
        return None
    return files[0]


def over_cache_bound(nbytes: int) -> str:
    """Why data files of ``nbytes`` bytes together cannot be copied into the object cache
    ("" when they fit)."""
    cache = file_cache()
    if isinstance(cache, str):
        return cache
    if nbytes > cache.max_bytes:
        return (f"its data files ({nbytes:,} bytes) are larger than the object cache's bound "
                f"({cache.max_bytes:,} bytes, TREADLE_CACHE_BYTES)")  # fmt: skip
    return ""


class LocalCopies:
    """The copies of data files one reader holds (callers serialise calls)."""

    def __init__(self) -> None:
        self._copies: dict[str, CachedFile] = {}

    def path(self, table: Table, ds: Any, df: Any) -> tuple[str | None, str]:
        """``(path, "")``: the local path of data file ``df`` of ``table`` (dataset ``ds``;
        on an object store: its copy in the object cache, fetched now); ``(None, why)``
        when there is none."""
        store = table.project.store
        if store.is_local:
            path = os.path.join(ds.uri, "data", df.path)
            return (path, "") if os.path.isfile(path) else (None, "")
        cache = file_cache()
        if isinstance(cache, str):
            return None, cache
        try:
            key = store.relative_key(f"{table.uri}/data/{df.path}")
            size = int(getattr(df, "file_size_bytes", 0) or store.size(key))
            got = cache.open(store, key, size)
        except (TreadleError, OSError) as e:  # the take that runs instead raises it there
            return None, f"copying a data file into the object cache failed ({e})"
        if isinstance(got, str):
            return None, got
        path = str(got.path)
        if path in self._copies:
            got.close()
        else:  # held (never evicted) while this reader may read it: one per file
            self._copies[path] = got
        return path, ""

    def held(self) -> set[str]:
        """The paths of the copies held now."""
        return set(self._copies)

    def release(self, paths: Iterable[str]) -> None:
        """Let these copies go: the object cache may evict them again."""
        for path in paths:
            self._copies.pop(path).close()

    def close(self) -> None:
        """Let every copy go."""
        self.release(self.held())
